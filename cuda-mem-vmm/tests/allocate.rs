//! Allocation and release on device, host and host-NUMA locations, zero sizes, and peers on a
//! simulated two-device machine.

mod common;

use common::*;
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{Access, Device, Error, FillPattern, Location};
use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError};

/// Allocates with `options`, checks rounding, placement, live objects, a round trip at both
/// ends, and that dropping gives everything back.
fn allocate_round_trip_and_release(options: VirtualMemoryResourceOptions) {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, options.clone()).unwrap();
    let g = resource.granularity();
    let expected_device = options.location.is_none().then_some(d0);
    let baseline = vmm_live();
    for (asked, rounded) in [(1, g), (g, g), (g + 1, 2 * g), (3 * g - 7, 3 * g)] {
        let buffer = resource.allocate(asked, &s).unwrap();
        assert_eq!(buffer.size(), rounded, "{asked} bytes");
        assert_eq!(buffer.mapped_size(), rounded);
        assert_eq!(buffer.chunk_count(), 1, "one chunk per allocation");
        assert_eq!(buffer.ptr() % g as u64, 0);
        assert_eq!(buffer.device(), expected_device);
        assert!(!buffer.is_imported());
        let owner = buffer.as_buffer().memory_resource().expect("the buffer is owned by a resource");
        assert!(std::ptr::addr_eq(owner, std::sync::Arc::as_ptr(&resource)), "and that is the virtual memory resource");
        assert!(std::sync::Arc::ptr_eq(buffer.resource(), &resource));
        assert_eq!(vmm_live(), plus(baseline, 1, 1, 1), "one reservation, mapping and physical allocation");
        let head = pattern(1, 4096);
        let tail = pattern(2, 4096);
        write(&buffer, 0, &head, &s);
        write(&buffer, rounded - 4096, &tail, &s);
        assert_eq!(read(&buffer, 0, 4096, &s), head);
        assert_eq!(read(&buffer, rounded - 4096, 4096, &s), tail);
        drop(buffer);
        assert_eq!(vmm_live(), baseline, "dropping the buffer gives everything back");
    }
    // On the device's default stream.
    let mut buffer = resource.allocate(1, &resource.device().default_stream()).unwrap();
    buffer.fill(FillPattern::U32(0xDEAD_BEEF), &s).unwrap();
    assert_eq!(read(&buffer, g - 8, 8, &s), [0xDEAD_BEEFu32.to_ne_bytes(), 0xDEAD_BEEFu32.to_ne_bytes()].concat());
    drop(buffer);
    assert_eq!(vmm_live(), baseline);
}

#[test]
fn device_memory_round_trip_and_release() {
    machine!(&[], || {
        if cuda_sim::testing::simulator_only("live-object counts") {
            allocate_round_trip_and_release(VirtualMemoryResourceOptions::default());
            allocate_round_trip_and_release(VirtualMemoryResourceOptions::default().handle_type(None));
        }
    });
}

#[test]
fn host_memory_round_trip_and_release() {
    machine!(&[], || {
        if cuda_sim::testing::simulator_only("live-object counts") {
            allocate_round_trip_and_release(
                VirtualMemoryResourceOptions::default().location(Location::Host).handle_type(None),
            );
        }
    });
}

#[test]
fn host_numa_memory_round_trip_and_release() {
    machine!(&[], || {
        if cuda_sim::testing::simulator_only("live-object counts") {
            allocate_round_trip_and_release(
                VirtualMemoryResourceOptions::default()
                    .location(Location::HostNuma(device(0).host_numa_node().unwrap())),
            );
        }
    });
}

#[test]
fn several_buffers_are_independent_and_released_in_any_order() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("live-object counts") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        let mut buffers: Vec<_> = (0..4).map(|i| resource.allocate((i + 1) * G, &s).unwrap()).collect();
        assert_eq!(vmm_live(), plus(baseline, 4, 4, 4));
        for (i, buffer) in buffers.iter().enumerate() {
            fill(buffer, 0, buffer.size(), i as u8 + 1, &s);
        }
        for (i, buffer) in buffers.iter().enumerate() {
            let all = read(buffer, 0, buffer.size(), &s);
            assert!(all.iter().all(|&b| b == i as u8 + 1), "buffer {i} kept its own bytes");
        }
        buffers.remove(1);
        buffers.remove(2);
        assert_eq!(vmm_live(), plus(baseline, 2, 2, 2));
        assert!(read(&buffers[1], 0, 3 * G, &s).iter().all(|&b| b == 3));
        buffers.clear();
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn zero_size_gives_an_empty_buffer_without_a_driver_call() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection and live-object counts") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = vmm_live();
        // Any VMM call would now fail: none is made.
        for function in [c"cuMemCreate", c"cuMemAddressReserve", c"cuMemMap", c"cuMemSetAccess"] {
            inject(function, 1);
        }
        let mut empty = resource.allocate(0, &s).unwrap();
        assert!(empty.is_empty());
        assert_eq!((empty.ptr(), empty.size(), empty.mapped_size(), empty.chunk_count()), (0, 0, 0, 0));
        assert_eq!(vmm_live(), baseline);
        empty.fill(FillPattern::U8(1), &s).unwrap();
        let on_default = resource.allocate(0, &resource.device().default_stream()).unwrap();
        assert!(on_default.is_empty());
        // Growing an empty buffer to nothing stays empty, still without a call.
        assert!(empty.grow(0).unwrap().is_empty());
        // Exporting it gives no handles; importing that gives an empty buffer.
        let descriptor = empty.export().unwrap();
        assert!(descriptor.handles.is_empty() && descriptor.chunk_sizes.is_empty());
        assert_eq!(descriptor.size, 0);
        assert!(resource.import(descriptor, &s).unwrap().is_empty());
        drop((empty, on_default));
        assert_eq!(vmm_live(), baseline);
        // The armed failures are all still there: the first real allocation meets them one
        // step at a time, each undone.
        for step in ["cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess"] {
            let error = resource.allocate(1, &s).unwrap_err();
            assert_mentions(&error.to_string(), &[step, "CUDA_ERROR_OUT_OF_MEMORY"]);
            assert_eq!(vmm_live(), baseline);
        }
        let buffer = resource.allocate(1, &s).unwrap();
        assert_eq!(buffer.size(), G);
    });
}

#[test]
fn an_empty_buffer_grows_into_a_new_allocation() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let empty = resource.allocate(0, &s).unwrap();
        let grown = empty.grow(G + 1).unwrap();
        assert_eq!((grown.size(), grown.chunk_count()), (2 * G, 1));
        assert_ne!(grown.ptr(), 0);
        write(&grown, 2 * G - 3, &[7, 8, 9], &s);
        assert_eq!(read(&grown, 2 * G - 3, 3, &s), [7, 8, 9]);
    });
}

fn two_devices() -> Option<(Device, Device)> {
    let d0 = device(0);
    let d1 = try_device(1)?;
    d0.set_current().unwrap();
    Some((d0, d1))
}

#[test]
fn peers_get_access_and_others_do_not() {
    machine!(&[("CUDA_SIM_DEVICES", "2")], || {
        let Some((d0, d1)) = two_devices() else { return };
        if !d1.can_access_peer(d0).unwrap() {
            cuda_sim::testing::skip("device 1 cannot access device 0");
            return;
        }
        let s0 = stream(d0);
        let s1 = stream(d1);
        let bytes = pattern(3, 8192);

        // With device 1 as a peer: it reads and writes, the owner sees its writes.
        let shared = VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().peers([d1])).unwrap();
        let buffer = shared.allocate(2 * G, &s0).unwrap();
        write(&buffer, G - 4096, &bytes, &s0);
        assert_eq!(read(&buffer, G - 4096, 8192, &s1), bytes, "device 1's stream copies from it");
        write(&buffer, 0, &[42; 64], &s1);
        assert_eq!(read(&buffer, 0, 64, &s0), [42; 64]);

        // Without peers: device 1's copies fail, the owner's work.
        let private = VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default()).unwrap();
        let buffer = private.allocate(G, &s0).unwrap();
        write(&buffer, 0, &bytes, &s0);
        // (Hardware faults, asynchronously, where the simulator refuses the copy at the call.)
        let checks_denials = cuda_sim::testing::simulator_only("copies without access");
        if checks_denials {
            let error = try_read(&buffer, 0, 8192, &s1).unwrap_err();
            assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "{error}");
            let error = try_write(&buffer, 0, &[1], &s1).unwrap_err();
            assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "{error}");
        }
        assert_eq!(read(&buffer, 0, 8192, &s0), bytes);

        // Read-only peers read but do not write.
        let options = VirtualMemoryResourceOptions::default().peers([d1]).peer_access(Access::Read);
        let read_only = VirtualMemoryResource::new(d0, options).unwrap();
        let buffer = read_only.allocate(G, &s0).unwrap();
        write(&buffer, 0, &bytes, &s0);
        assert_eq!(read(&buffer, 0, 8192, &s1), bytes);
        if checks_denials {
            assert!(try_write(&buffer, 0, &[1], &s1).is_err());
        }
        assert_eq!(read(&buffer, 0, 1, &s0), [bytes[0]]);

        // Peers listed with no access: the same as none listed.
        let options = VirtualMemoryResourceOptions::default().peers([d1]).peer_access(Access::None);
        let listed_without_access = VirtualMemoryResource::new(d0, options).unwrap();
        let buffer = listed_without_access.allocate(G, &s0).unwrap();
        write(&buffer, 0, &bytes, &s0);
        if checks_denials {
            assert!(try_read(&buffer, 0, 16, &s1).is_err());
        }
    });
}

#[test]
fn a_peer_that_cannot_reach_the_memory_fails_cleanly() {
    machine!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_PEER_ACCESS", "none")], || {
        if !cuda_sim::testing::simulator_only("a machine without peer access, and live-object counts") {
            return;
        }
        let Some((d0, d1)) = two_devices() else { return };
        assert!(!d1.can_access_peer(d0).unwrap());
        let s0 = stream(d0);
        // The resource is valid (peer capability is the driver's to judge, at allocation).
        let resource = VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default().peers([d1])).unwrap();
        let baseline = vmm_live();
        let error = resource.allocate(G, &s0).unwrap_err();
        assert!(matches!(error, VmmError::Core(Error::Cuda(_))), "{error:?}");
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_DEVICE), "{error}");
        assert_mentions(&error.to_string(), &["cuMemSetAccess"]);
        assert_eq!(vmm_live(), baseline, "the mapping, reservation and physical memory were undone");
        // Without the peer, the same device allocates fine.
        let alone = VirtualMemoryResource::new(d0, VirtualMemoryResourceOptions::default()).unwrap();
        let buffer = alone.allocate(G, &s0).unwrap();
        write(&buffer, 0, &[5; 5], &s0);
        assert_eq!(read(&buffer, 0, 5, &s0), [5; 5]);
        drop(buffer);
        assert_eq!(vmm_live(), baseline);
    });
}
