//! Typed views of virtual buffers: Rust data in through `view_mut`, out through
//! `as_buffer().view()`, on device and host memory, and across growth.

mod common;

use common::*;
use cuda_mem_core::{Error, Location, ViewError};
use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError};

fn round_trip(options: VirtualMemoryResourceOptions) {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, options).unwrap();
    let data: Vec<f64> = (0..1000).map(|i| f64::from(i) * 1.25).collect();
    let mut buffer = resource.allocate(data.len() * 8, &s).unwrap();
    // Rounded up to the allocation granularity: the data fills the start.
    let len = buffer.size() / 8;
    assert!(len >= data.len());
    buffer.view_mut::<f64>().unwrap().slice_mut(..1000).unwrap().copy_from_slice(&data, &s).unwrap();
    assert_eq!(buffer.as_buffer().to_vec::<f64>(&s).unwrap()[..1000], data);
    assert!(matches!(buffer.view_mut::<f64>().unwrap().copy_from_slice(&data, &s), Err(Error::SizeMismatch { .. })));
    let middle = buffer.as_buffer().view::<f64>().unwrap().slice(100..200).unwrap().to_vec(&s).unwrap();
    assert_eq!(middle, data[100..200]);
    buffer.view_mut::<u16>().unwrap().slice_mut(..4).unwrap().fill(0xBEEF, &s).unwrap();
    assert_eq!(buffer.as_buffer().to_vec::<u16>(&s).unwrap()[..5], [0xBEEF, 0xBEEF, 0xBEEF, 0xBEEF, 0]);
    let refused = buffer.view_mut::<[u8; 3]>();
    assert!(
        matches!(refused, Err(VmmError::Core(Error::View(ViewError::Size { element_size: 3, .. })))),
        "{refused:?}"
    );

    // A grown buffer covers the old bytes: they read back through its view.
    let grown = buffer.grow(buffer.size() * 2).unwrap();
    let view = grown.as_buffer().view::<f64>().unwrap();
    assert_eq!(view.len(), 2 * len);
    assert_eq!(view.slice(4..1000).unwrap().to_vec(&s).unwrap(), data[4..]);
}

#[test]
fn device_memory_views_round_trip() {
    machine!(&[], || round_trip(VirtualMemoryResourceOptions::default()));
}

#[test]
fn host_memory_views_round_trip() {
    machine!(&[], || round_trip(VirtualMemoryResourceOptions::default().location(Location::Host).handle_type(None)));
}
