//! Pool resources: current and owned pools, attributes, thresholds, limits, capture refusal.

mod common;

use cuda_mem_core::{
    Access, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Error, FillPattern, Location, ManagedError,
    ManagedMemoryResource, ManagedMemoryResourceOptions, MemoryResource, NumaNode, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PoolKind, PoolResource, ReusePolicy, SharingError,
};
use cuda_mem_sys::types::CUresult;

#[test]
fn the_current_pool_keeps_memory_between_allocations() {
    let device = common::device();
    let dmr = DeviceMemoryResource::current(device).unwrap();
    assert!(!dmr.pool().is_owned());
    assert_eq!(dmr.pool().release_threshold().unwrap(), u64::MAX);
    // Two wrappers of the same pool see the same pool.
    let again = DeviceMemoryResource::current(device).unwrap();
    assert_eq!(dmr.pool().handle(), again.pool().handle());
}

#[test]
fn a_user_threshold_on_the_current_pool_is_kept() {
    // In a process of its own: the current pool is shared process-wide.
    cuda_sim::testing::in_simulated_machine("a_user_threshold_on_the_current_pool_is_kept", &[], || {
        let device = common::device();
        let first = DeviceMemoryResource::current(device).unwrap();
        first.pool().set_release_threshold(1 << 20).unwrap();
        let second = DeviceMemoryResource::current(device).unwrap();
        assert_eq!(second.pool().release_threshold().unwrap(), 1 << 20);
        first.pool().set_release_threshold(u64::MAX).unwrap();
    });
}

#[test]
fn attributes_follow_allocations_and_peaks_reset() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
    let pool = dmr.pool();
    assert!(pool.is_owned());
    let before = pool.attributes().unwrap();
    assert_eq!((before.used_mem_current, before.reserved_mem_current), (0, 0));
    assert!(before.reuse_follow_event_dependencies);
    let a = dmr.allocate(1000, &stream).unwrap();
    let b = dmr.allocate(3000, &stream).unwrap();
    let during = pool.attributes().unwrap();
    assert!(during.used_mem_current >= 4000, "{during:?}");
    assert!(during.reserved_mem_current >= during.used_mem_current);
    drop(a);
    drop(b);
    stream.synchronize().unwrap();
    let after = pool.attributes().unwrap();
    assert_eq!(after.used_mem_current, 0);
    assert_eq!(after.used_mem_high, during.used_mem_high);
    // With the default threshold of 0, synchronizing returned the memory.
    assert_eq!(after.reserved_mem_current, 0);
    pool.reset_peak_usage().unwrap();
    let reset = pool.attributes().unwrap();
    assert_eq!((reset.used_mem_high, reset.reserved_mem_high), (0, 0));
}

#[test]
fn release_threshold_and_trim() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let pool = dmr.pool();
    pool.set_release_threshold(u64::MAX).unwrap();
    assert_eq!(pool.release_threshold().unwrap(), u64::MAX);
    drop(dmr.allocate(8 << 20, &stream).unwrap());
    stream.synchronize().unwrap();
    let cached = pool.attributes().unwrap().reserved_mem_current;
    assert!(cached >= 8 << 20, "kept at the threshold: {cached}");
    pool.trim_to(0).unwrap();
    assert_eq!(pool.attributes().unwrap().reserved_mem_current, 0);
}

#[test]
fn reuse_policies_can_be_changed() {
    let device = common::device();
    let dmr = DeviceMemoryResource::new(device, Default::default()).unwrap();
    dmr.pool().set_reuse(ReusePolicy::AllowOpportunistic, false).unwrap();
    let attributes = dmr.pool().attributes().unwrap();
    assert!(!attributes.reuse_allow_opportunistic);
    assert!(attributes.reuse_allow_internal_dependencies);
}

#[test]
fn max_size_is_enforced() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().max_size(4 << 20)).unwrap();
    let _fits = dmr.allocate(2 << 20, &stream).unwrap();
    let err = dmr.allocate(64 << 20, &stream).unwrap_err();
    assert_eq!(err.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{err}");
    assert!(err.to_string().contains("cuMemAllocFromPoolAsync"), "{err}");
}

#[test]
fn a_capturing_stream_is_refused() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::current(device).unwrap();
    let d = cuda_mem_core::driver().unwrap();
    // Relaxed mode: in global mode the real driver refuses, and invalidates the capture over,
    // calls such as `cuMemPoolCreate` that other tests of this binary make on other threads
    // meanwhile (seen on an H100).
    let relaxed = cuda_mem_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // Captured through FFI: the handle for that is the shared one (see `Stream::handle`).
    let handle = stream.shared_handle();
    // SAFETY: a live stream handle and a valid capture mode.
    unsafe { cuda_mem_sys::cu_call!(d, cuStreamBeginCapture_v2(handle, relaxed)) }.unwrap();
    assert!(stream.is_capturing().unwrap());
    let err = dmr.allocate(64, &stream).unwrap_err();
    assert!(matches!(err, Error::CapturingStream), "{err}");
    assert!(err.to_string().contains("allocate before capture begins"), "{err}");
    let mut graph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer; the stream is capturing.
    unsafe { cuda_mem_sys::cu_call!(d, cuStreamEndCapture(stream.handle(), &mut graph)) }.unwrap();
    // SAFETY: the graph was just captured and is destroyed once.
    unsafe { cuda_mem_sys::cu_call!(d, cuGraphDestroy(graph)) }.unwrap();
    assert!(dmr.allocate(64, &stream).is_ok());
}

#[test]
fn pinned_pools_are_host_accessible() {
    let device = common::device();
    let stream = common::stream(device);
    let current = PinnedMemoryResource::current().unwrap();
    let mut a = current.allocate(4096, &stream).unwrap();
    a.fill(FillPattern::U32(0x0102_0304), &stream).unwrap();
    assert_eq!(&a.host_slice().unwrap()[..4], &0x0102_0304u32.to_ne_bytes());
    let near = PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .unwrap();
    assert_eq!(near.numa_node(), device.properties().unwrap().host_numa_node);
    assert!(near.is_ipc_enabled());
    let b = near.allocate(100, &stream).unwrap();
    assert!(b.is_host_accessible() && b.is_device_accessible() && b.device().is_none());
    // A host pool is the host CPU's until access is set: both resources gave it to every device.
    for pool in [current.pool(), near.pool()] {
        for d in Device::all().unwrap() {
            assert_eq!(pool.access(d).unwrap(), Access::ReadWrite, "{d}");
        }
    }
}

#[test]
fn ipc_pinned_pools_need_a_numa_location() {
    common::device();
    let err = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default().ipc_enabled(true)).unwrap_err();
    assert!(matches!(err, Error::NumaLocationRequired), "{err}");
    assert!(err.to_string().contains("use numa_node(NumaNode(n))"), "{err}");
}

#[test]
fn managed_pools_are_host_and_device_accessible() {
    let device = common::device();
    let stream = common::stream(device);
    for preferred in [None, Some(Location::Device(device)), Some(Location::Host), Some(Location::HostNuma(NumaNode(0)))]
    {
        let mmr =
            ManagedMemoryResource::new(ManagedMemoryResourceOptions::default().preferred_location(preferred)).unwrap();
        assert_eq!(mmr.preferred_location(), preferred);
        assert_eq!(mmr.device(), preferred.and_then(|p| if let Location::Device(d) = p { Some(d) } else { None }));
        let mut buffer = mmr.allocate(256, &stream).unwrap();
        buffer.fill(FillPattern::U8(9), &stream).unwrap();
        assert!(buffer.host_slice().unwrap().iter().all(|&b| b == 9));
        assert_eq!(buffer.resource().map(|r| r.is_managed()), Some(true));
    }
    let current = ManagedMemoryResource::current(None).unwrap();
    assert!(!current.pool().is_owned());
    assert_eq!(
        ManagedMemoryResource::current(Some(Location::Host)).unwrap().preferred_location(),
        Some(Location::Host)
    );
}

#[test]
fn managed_pools_refuse_the_calling_threads_numa_node_before_the_driver() {
    common::device();
    let options = ManagedMemoryResourceOptions::default().preferred_location(Some(Location::HostNumaCurrent));
    // The driver would refuse it with CUDA_ERROR_INVALID_VALUE; this error is the library's own.
    for err in [
        ManagedMemoryResource::new(options).unwrap_err(),
        ManagedMemoryResource::current(Some(Location::HostNumaCurrent)).unwrap_err(),
    ] {
        assert!(
            matches!(err, Error::Managed(ManagedError::PoolLocation { location: Location::HostNumaCurrent })),
            "{err}"
        );
        assert!(err.to_string().contains("use Location::HostNuma(node)"), "{err}");
    }
}

#[test]
fn each_pool_knows_what_memory_it_holds() {
    let device = common::device();
    let kinds = [
        DeviceMemoryResource::current(device).unwrap().pool().kind(),
        DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap().pool().kind(),
        PinnedMemoryResource::current().unwrap().pool().kind(),
        PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap().pool().kind(),
        ManagedMemoryResource::current(None).unwrap().pool().kind(),
        // Preferring a device does not make managed memory that device's.
        ManagedMemoryResource::new(
            ManagedMemoryResourceOptions::default().preferred_location(Some(Location::Device(device))),
        )
        .unwrap()
        .pool()
        .kind(),
    ];
    use PoolKind::{Device as OnDevice, Managed, Pinned};
    assert_eq!(kinds, [OnDevice(device), OnDevice(device), Pinned, Pinned, Managed, Managed]);
    assert_eq!(kinds.map(PoolKind::device), [Some(device), Some(device), None, None, None, None]);
    assert_eq!(kinds[0].to_string(), format!("device memory pool on {device}"));
    assert_eq!(kinds[2].to_string(), "pinned host memory pool");
    assert_eq!(kinds[4].to_string(), "managed memory pool");
}

#[test]
fn ipc_enabled_device_pools() {
    let device = common::device();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    assert!(dmr.is_ipc_enabled());
}

#[test]
fn shareable_pools_export_one_handle_and_imports_cannot_allocate() {
    use std::os::fd::AsRawFd;
    let device = common::device();
    let stream = common::stream(device);
    let plain = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
    let err = plain.pool().shareable_handle().unwrap_err();
    assert!(matches!(err, Error::Sharing(SharingError::PoolNotIpcEnabled)), "{err}");

    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let first = dmr.pool().shareable_handle().unwrap();
    let second = dmr.pool().shareable_handle().unwrap();
    assert_eq!(first.fd().as_raw_fd(), second.fd().as_raw_fd(), "asking again gives the same handle");
    assert_eq!(first.id(), second.id());

    let mut buffer = dmr.allocate(8192, &stream).unwrap();
    buffer.fill(FillPattern::U8(0x42), &stream).unwrap();
    stream.synchronize().unwrap();
    let data = dmr.pool().export_pointer(buffer.ptr()).unwrap();

    // Import in this same process (another process would receive the fd over a socket).
    let imported = cuda_mem_core::MemoryPool::import(first.try_clone_fd().unwrap(), first.id()).unwrap();
    assert!(imported.is_imported() && imported.is_shareable());
    assert_eq!(imported.owner(), Some(device), "the driver says where the pool lives");
    assert_eq!(imported.shareable_handle().unwrap().id(), first.id());
    let mapped = imported.import_allocation(&data, 8192, &stream).unwrap();
    assert_ne!(mapped, buffer.ptr());
    assert!(cuda_mem_core::mapped_range_size(mapped).unwrap() >= 8192);
    assert_eq!(imported.export_pointer(mapped).unwrap(), data, "an import passes on the data it came with");
    // SAFETY: the mapping was just imported, is not used afterwards, and is released once.
    unsafe { imported.release_import(mapped, &stream) }.unwrap();
    stream.synchronize().unwrap();
}

/// The pool's features on each pool resource itself, as cuda.core has them (`mr.attributes`,
/// …), with no trait import: each agrees with the same feature reached through `pool()`.
#[test]
fn pool_features_are_on_the_resource() {
    let device = common::device();
    let stream = common::stream(device);
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let pinned = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let managed = ManagedMemoryResource::new(ManagedMemoryResourceOptions::default()).unwrap();
    macro_rules! check {
        ($resource:expr, ipc: $ipc:expr) => {{
            let resource = &$resource;
            assert_eq!(resource.handle(), resource.pool().handle());
            assert!(resource.is_owned());
            assert_eq!(resource.is_ipc_enabled(), $ipc);
            resource.set_release_threshold(1 << 20).unwrap();
            assert_eq!(resource.release_threshold().unwrap(), 1 << 20);
            assert_eq!(resource.pool().release_threshold().unwrap(), 1 << 20);
            resource.set_reuse(ReusePolicy::AllowOpportunistic, false).unwrap();
            assert!(!resource.attributes().unwrap().reuse_allow_opportunistic);
            let buffer = resource.allocate(4096, &stream).unwrap(); // inherent: no import
            stream.synchronize().unwrap();
            assert!(resource.attributes().unwrap().used_mem_current >= 4096);
            drop(buffer);
            stream.synchronize().unwrap();
            resource.reset_peak_usage().unwrap();
            assert_eq!(resource.attributes().unwrap().used_mem_high, 0);
            resource.trim_to(0).unwrap();
            assert_eq!(resource.attributes().unwrap().reserved_mem_current, 0);
            assert_eq!(resource.access(device).unwrap(), resource.pool().access(device).unwrap());
        }};
    }
    check!(dmr, ipc: true);
    check!(pinned, ipc: false);
    check!(managed, ipc: false);
    assert!(!DeviceMemoryResource::current(device).unwrap().is_owned());

    // Peer access of a device pool, on the resource: the owner is never a peer of its own pool.
    assert!(dmr.peer_accessible_by().unwrap().is_empty());
    dmr.add_peer(device).unwrap();
    dmr.set_peer_accessible_by([device]).unwrap();
    assert!(dmr.peer_accessible_by().unwrap().is_empty());
    dmr.remove_peer(device).unwrap();
    assert_eq!(dmr.access(device).unwrap(), Access::ReadWrite);
}
