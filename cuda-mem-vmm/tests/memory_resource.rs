//! The resource as a `MemoryResource`: plain buffers through `MemoryResourceExt` (shared and
//! scoped) and through `Arc<dyn MemoryResource>`, each a chunk, a reservation and a mapping of
//! its own, holding data and giving everything back when freed; and virtual buffers passed where
//! a `Buffer` is expected through `as_buffer`.

mod common;

use std::sync::Arc;

use common::*;
use cuda_mem_core::{Buffer, FillPattern, MemoryResource, MemoryResourceExt, PinnedMemoryResource, Stream};
use cuda_mem_vmm::{LocationType, VirtualMemoryResource, VirtualMemoryResourceOptions};

/// The bytes of `buffer`, copied to pinned memory on `stream`.
fn bytes_of(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let mut host = PinnedMemoryResource::current().unwrap().allocate(buffer.size(), stream).unwrap();
    host.copy_from(buffer, stream).unwrap();
    host.host_slice().unwrap().to_vec()
}

#[test]
fn plain_buffers_come_through_the_trait_and_go_back() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();

        // Shared: exactly the size asked for, over one rounded-up chunk.
        let mut shared = MemoryResourceExt::allocate(&resource, 1000, &s).unwrap();
        assert_eq!(shared.size(), 1000);
        assert_eq!(shared.ptr() % G as u64, 0);
        assert_eq!(
            (shared.device(), shared.is_device_accessible(), shared.is_host_accessible()),
            (Some(d0), true, false)
        );
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)));
        shared.fill(FillPattern::U8(0x42), &s).unwrap();
        assert_eq!(bytes_of(&shared, &s), vec![0x42; 1000]);

        // Scoped: borrows the resource and the stream.
        {
            let mut scoped = resource.allocate_scoped(G + 4, &s).unwrap();
            assert_eq!(sim_live(), baseline.map(|b| plus(b, 2, 2, 2)));
            scoped.fill(FillPattern::U32(0x0102_0304), &s).unwrap();
            let mut back = PinnedMemoryResource::current().unwrap().allocate(4, &s).unwrap();
            // SAFETY: the first 4 bytes of `scoped`, which outlives the view's only use below.
            let head = unsafe { Buffer::from_raw(scoped.ptr(), 4, Some(d0), true, false, None) };
            back.copy_from(&head, &s).unwrap();
            assert_eq!(back.host_slice().unwrap(), 0x0102_0304u32.to_ne_bytes());
        }
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)), "the scoped buffer gave its memory back");

        // As any memory resource.
        let dynamic: Arc<dyn MemoryResource> = Arc::clone(&resource) as _;
        let mut through_dyn = dynamic.allocate(G, &s).unwrap();
        through_dyn.copy_from(&MemoryResourceExt::allocate(&resource, G, &s).unwrap(), &s).unwrap();
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 2, 2, 2)), "the copy's source went back at once");
        drop((shared, through_dyn, dynamic));
        assert_eq!(sim_live(), baseline, "everything went back");
        assert!(cuda_mem_core::take_drop_errors().is_empty());
    });
}

#[test]
fn host_located_memory_belongs_to_no_device() {
    let d0 = device(0);
    let s = stream(d0);
    let options = VirtualMemoryResourceOptions::default().location_type(LocationType::Host).handle_type(None);
    let resource = VirtualMemoryResource::new(d0, options).unwrap();
    assert_eq!(MemoryResource::device(&*resource), None);
    assert_eq!(resource.device(), d0, "the resource's own device stays the one it allocates for");
    let buffer = MemoryResourceExt::allocate(&resource, 64, &s).unwrap();
    assert_eq!(buffer.device(), None);
    assert!(!buffer.is_host_accessible(), "no access descriptor names the host");
}

#[test]
fn a_virtual_buffer_is_a_buffer_of_its_resource_where_one_is_expected() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let mut virtual_buffer = resource.allocate(G, Some(&s)).unwrap();
        virtual_buffer.fill(FillPattern::U8(9), &s).unwrap();
        let buffer: &Buffer = virtual_buffer.as_buffer();
        assert_eq!((buffer.ptr(), buffer.size()), (virtual_buffer.ptr(), virtual_buffer.size()));
        assert!(buffer.is_owning(), "the buffer is freed through the resource");
        assert_eq!(bytes_of(buffer, &s), vec![9; G]);
        // Copies in both directions, through the buffer and through the virtual buffer.
        let mut other = MemoryResourceExt::allocate(&resource, G, &s).unwrap();
        virtual_buffer.copy_to(&mut other, &s).unwrap();
        assert_eq!(bytes_of(&other, &s), vec![9; G]);
        other.fill(FillPattern::U8(5), &s).unwrap();
        virtual_buffer.copy_from(&other, &s).unwrap();
        assert_eq!(bytes_of(virtual_buffer.as_buffer(), &s), vec![5; G]);
        drop((virtual_buffer, other));
        assert_eq!(sim_live(), baseline);
    });
}
