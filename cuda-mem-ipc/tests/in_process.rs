//! The whole flow in one process (the receiving side imports what the same process exported):
//! resources, buffers, the registry, the duplicate-import cache, and the errors on bad input.

mod common;

use common::{pair, setup};
use std::sync::Arc;

use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, LimitingAdaptor, MemoryResourceExt,
    PinnedMemoryResource, PinnedMemoryResourceOptions, PoolKind, StatisticsAdaptor, Stream, StreamOptions,
};
use cuda_mem_ipc::{
    BufferDescriptor, IpcError, MessageLimit, Received, Unshareable, allocation_handle, buffer_descriptor, lookup,
    registry,
};

#[test]
fn buffers_travel_with_their_resource_and_share_memory() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let mut buffer = dmr.allocate(4096, &stream).unwrap();
    buffer.fill(FillPattern::U8(0x11), &stream).unwrap();
    stream.synchronize().unwrap();
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer]).unwrap();
    let Received::Resource(mapped) = rx.recv(&stream).unwrap() else { panic!("the resource comes first") };
    let Received::Buffers(mut received) = rx.recv(&stream).unwrap() else { panic!("then the buffers") };
    assert_eq!(received.len(), 1);
    assert_eq!(mapped.uuid(), allocation_handle(dmr.as_ref()).unwrap().uuid());
    let imported = &mut received[0];
    assert_eq!(imported.size(), 4096);
    assert_ne!(imported.ptr(), buffer.ptr());
    // A received buffer's resource names its pool, the imported one, as the exporter's does.
    let imported_pool = imported.memory_resource().unwrap().memory_pool().expect("the imported pool");
    assert_eq!(imported_pool.handle(), cuda_mem_core::MemoryResource::memory_pool(&*mapped).unwrap().handle());
    assert!(imported_pool.is_imported());
    let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let mut check = host.allocate(4096, &stream).unwrap();
    check.copy_from(imported, &stream).unwrap();
    assert!(check.host_slice().unwrap().iter().all(|&b| b == 0x11));
    imported.fill(FillPattern::U8(0x22), &stream).unwrap();
    stream.synchronize().unwrap();
    check.copy_from(&buffer, &stream).unwrap();
    assert!(check.host_slice().unwrap().iter().all(|&b| b == 0x22));
    // Re-export of the imported buffer gives the same descriptor.
    assert_eq!(buffer_descriptor(imported).unwrap(), buffer_descriptor(&buffer).unwrap());
    // A memory snapshot lists the imported pool, and what it was imported as.
    let snapshot = cuda_mem_core::snapshot::take_snapshot();
    let listed = snapshot.resource(cuda_mem_core::history::ResourceId::of(&*mapped)).expect("the imported pool");
    assert_eq!(listed.kind, cuda_mem_core::snapshot::ResourceKind::ImportedPool);
    assert!(listed.name.contains(&mapped.uuid().to_string()), "{}", listed.name);
    assert!(listed.used_bytes >= 4096, "the driver's figures, every process's: {listed:?}");
    // The mapped resource cannot allocate.
    let err = mapped.allocate(16, &stream).unwrap_err();
    assert!(matches!(err, cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::ImportedPoolAllocation)), "{err}");
    assert!(err.to_string().contains("allocate in the exporting process and send the buffer"), "{err}");
}

#[test]
fn a_resource_sent_twice_is_the_one_received_first() {
    let (device, stream) = setup();
    let pinned = PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .unwrap();
    let (tx, rx) = pair();
    tx.send_resource(pinned.as_ref()).unwrap();
    tx.send_resource(pinned.as_ref()).unwrap();
    let Received::Resource(first) = rx.recv(&stream).unwrap() else { panic!() };
    let Received::Resource(second) = rx.recv(&stream).unwrap() else { panic!() };
    assert!(Arc::ptr_eq(&first, &second));
    assert!(registry().get(first.uuid()).is_ok());
    // A lookup of the right kind finds it; of the wrong kind, a clear error.
    assert!(lookup(first.uuid(), PoolKind::Pinned).is_ok());
    let err = lookup(first.uuid(), PoolKind::Device(device)).unwrap_err();
    assert!(matches!(err, IpcError::WrongResourceKind { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("is a pinned host memory pool, but this operation needs a device memory pool on device 0"),
        "{err}"
    );
    let uuid = first.uuid();
    drop((first, second));
    assert!(registry().get(uuid).is_ok(), "the receiving channel keeps what it received");
    assert!(rx.release_resource(uuid).is_some_and(|released| released.uuid() == uuid));
    assert!(rx.resource(uuid).is_none());
    assert!(matches!(registry().get(uuid), Err(IpcError::UnknownResource(_))), "gone once released");
}

#[test]
fn duplicate_imports_share_one_mapping_freed_by_the_last_holder() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = dmr.allocate(1 << 16, &stream).unwrap();
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer, &buffer]).unwrap();
    let imports = rx.recv_buffers(&stream).unwrap();
    assert_eq!(imports[0].ptr(), imports[1].ptr());
    let ptr = imports[0].ptr();
    assert_eq!(cuda_mem_core::import_holders(ptr), 2);
    let mut imports = imports.into_iter();
    drop(imports.next());
    assert_eq!(cuda_mem_core::import_holders(ptr), 1);
    drop(imports.next());
    assert_eq!(cuda_mem_core::import_holders(ptr), 0);
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}

#[test]
fn released_holders_leave_one_event_per_stream_for_the_last() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let mut buffer = dmr.allocate(1 << 16, &stream).unwrap();
    buffer.fill(FillPattern::U8(0x5a), &stream).unwrap();
    stream.synchronize().unwrap();
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer]).unwrap();
    let Received::Resource(mapped) = rx.recv(&stream).unwrap() else { panic!() };
    let Received::Buffers(mut held) = rx.recv(&stream).unwrap() else { panic!() };
    let held = held.remove(0);
    let descriptor = buffer_descriptor(&buffer).unwrap();
    let ptr = held.ptr();
    let streams: Vec<Stream> =
        (0..3).map(|_| Stream::new(device, StreamOptions::default().non_blocking()).unwrap()).collect();
    // Many duplicate imports let go on three streams: three events, not one per release.
    let mut last_fill: Option<&Stream> = None;
    for round in 0..100 {
        for s in &streams {
            let mut again = mapped.import_buffer(&descriptor, s).unwrap();
            if round % 10 == 0 {
                // Every import is the same memory: each fill waits for the one before it (on
                // another stream), as two writers of one buffer must (ThreadSanitizer saw the
                // unordered fills race in the simulator).
                if let Some(previous) = last_fill {
                    s.wait(&previous.record_event().unwrap()).unwrap();
                }
                again.fill(FillPattern::U8(0x5a), s).unwrap();
                last_fill = Some(s);
            }
            drop(again);
            assert!(cuda_mem_core::import_pending_waits(ptr) <= streams.len());
        }
    }
    assert_eq!(cuda_mem_core::import_holders(ptr), 1);
    // Once their work has completed, the next release on another stream drops them.
    for s in &streams {
        s.synchronize().unwrap();
    }
    drop(mapped.import_buffer(&descriptor, &stream).unwrap());
    assert_eq!(cuda_mem_core::import_pending_waits(ptr), 1);
    drop(held);
    assert_eq!((cuda_mem_core::import_holders(ptr), cuda_mem_core::import_pending_waits(ptr)), (0, 0));
    stream.synchronize().unwrap();
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}

#[test]
fn bad_descriptors_are_refused_and_leave_nothing_mapped() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let other = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = dmr.allocate(1000, &stream).unwrap();
    let (tx, rx) = pair();
    tx.send_resource(dmr.as_ref()).unwrap();
    tx.send_resource(other.as_ref()).unwrap();
    let Received::Resource(mapped) = rx.recv(&stream).unwrap() else { panic!() };
    let Received::Resource(other_mapped) = rx.recv(&stream).unwrap() else { panic!() };
    let good = buffer_descriptor(&buffer).unwrap();

    // A claimed size beyond the mapped allocation.
    let oversize = BufferDescriptor { size: 1 << 30, ..good };
    let err = mapped.import_buffer(&oversize, &stream).unwrap_err();
    assert!(
        matches!(err, IpcError::MisdescribedBuffer { resource, claimed: 1_073_741_824, mapped: m }
            if resource == mapped.uuid() && (1000..1 << 30).contains(&m)),
        "{err}"
    );
    assert!(err.to_string().contains("the peer sent a bad size"), "{err}");
    // The wrong mapped resource.
    let err = other_mapped.import_buffer(&good, &stream).unwrap_err();
    assert!(matches!(err, IpcError::WrongResource { .. }), "{err}");
    // Truncated bytes.
    let encoded = good.encode();
    assert!(BufferDescriptor::decode(&encoded[..encoded.len() - 1]).is_err());
    // A buffer whose resource was never received.
    let unsent = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let orphan = buffer_descriptor(&unsent.allocate(64, &stream).unwrap()).unwrap();
    assert!(matches!(registry().get(orphan.resource), Err(IpcError::UnknownResource(_))));
    // After all that, nothing is left mapped and a good import works.
    let imported = mapped.import_buffer(&good, &stream).unwrap();
    assert_eq!(cuda_mem_core::import_holders(imported.ptr()), 1);
}

#[test]
fn pools_that_are_not_ipc_enabled_cannot_be_shared() {
    let (device, stream) = setup();
    let plain = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
    let err = allocation_handle(plain.as_ref()).unwrap_err();
    assert!(matches!(err, IpcError::NotIpcEnabled(Unshareable::PoolWithoutHandleType)), "{err}");
    let buffer = plain.allocate(64, &stream).unwrap();
    let err = buffer_descriptor(&buffer).unwrap_err();
    assert!(matches!(err, IpcError::NotIpcEnabled(Unshareable::PoolWithoutHandleType)), "{err}");
    let (tx, _rx) = pair();
    assert!(tx.send_buffers(&[&buffer]).is_err());
}

/// A block of a caching resource is part of a larger segment of its IPC-enabled pool: it is
/// refused by name, never described (or sent) as the pool's allocation it lies in.
#[test]
fn blocks_of_a_caching_resource_are_refused_not_sent_as_their_segment() {
    let (device, stream) = setup();
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let cache = cuda_mem_core::CachingResource::new(pool.clone(), Default::default()).unwrap();
    let counted = StatisticsAdaptor::new(cache.clone());
    let direct = cache.allocate(4096, &stream).unwrap();
    let adapted = counted.allocate(4096, &stream).unwrap();
    for buffer in [&direct, &adapted] {
        let err = buffer_descriptor(buffer).unwrap_err();
        assert!(
            matches!(
                err,
                IpcError::Core(cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::CachedBlock { ptr, size: 4096 }))
                    if ptr == buffer.ptr()
            ),
            "{err}"
        );
        let (tx, _rx) = pair();
        assert!(tx.send_buffers(&[buffer]).is_err());
    }
    assert!(matches!(allocation_handle(cache.as_ref()), Err(IpcError::NotIpcEnabled(Unshareable::NotAPool))));
}

#[test]
fn scoped_buffers_travel_like_shared_ones() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let shared = dmr.allocate(4096, &stream).unwrap();
    let mut scoped = dmr.allocate_scoped(4096, &stream).unwrap();
    scoped.fill(FillPattern::U8(0x5c), &stream).unwrap();
    stream.synchronize().unwrap();
    let (tx, rx) = pair();
    // One message with both kinds: the resource goes first, once.
    tx.send_buffers(&[&shared, &scoped]).unwrap();
    let Received::Resource(mapped) = rx.recv(&stream).unwrap() else { panic!("the resource comes first") };
    let Received::Buffers(received) = rx.recv(&stream).unwrap() else { panic!("then the buffers") };
    assert_eq!(mapped.uuid(), allocation_handle(dmr.as_ref()).unwrap().uuid());
    assert_eq!(received.len(), 2);
    assert_eq!(buffer_descriptor(&received[1]).unwrap(), buffer_descriptor(&scoped).unwrap());
    let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let mut check = host.allocate(4096, &stream).unwrap();
    check.copy_from(&received[1], &stream).unwrap();
    assert!(check.host_slice().unwrap().iter().all(|&b| b == 0x5c));
}

/// A pool behind adaptors is shared as the bare pool is: the same allocation handle, and its
/// buffers travel and share memory; the adaptors count this process's allocations only.
#[test]
fn buffers_of_an_adapted_pool_travel_like_the_pools_own() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let counted = StatisticsAdaptor::new(Arc::clone(&dmr));
    let adapted = LimitingAdaptor::new(Arc::clone(&counted), 1 << 20);
    let mut buffer = adapted.allocate(4096, &stream).unwrap();
    buffer.fill(FillPattern::U8(0x3d), &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(allocation_handle(&*adapted).unwrap().uuid(), allocation_handle(dmr.as_ref()).unwrap().uuid());
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer]).unwrap();
    let Received::Resource(mapped) = rx.recv(&stream).unwrap() else { panic!("the resource comes first") };
    let Received::Buffers(received) = rx.recv(&stream).unwrap() else { panic!("then the buffers") };
    assert_eq!(mapped.uuid(), allocation_handle(dmr.as_ref()).unwrap().uuid());
    assert_eq!(buffer_descriptor(&received[0]).unwrap(), buffer_descriptor(&buffer).unwrap());
    let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let mut check = host.allocate(4096, &stream).unwrap();
    check.copy_from(&received[0], &stream).unwrap();
    assert!(check.host_slice().unwrap().iter().all(|&b| b == 0x3d));
    assert_eq!(counted.statistics().current_bytes, 4096, "the import is not this side's allocation");
    drop((received, buffer));
    assert_eq!((counted.statistics().current_bytes, adapted.in_use()), (0, 0));
}

#[test]
fn more_buffers_than_a_message_carries_is_the_callers_limit_not_the_peers_fault() {
    let (device, stream) = setup();
    let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = dmr.allocate(64, &stream).unwrap();
    let (tx, rx) = pair();
    // The same buffer many times: the count is refused before anything is looked at.
    let too_many = vec![&buffer; cuda_mem_ipc::MAX_BUFFERS_PER_MESSAGE + 1];
    let err = tx.send_buffers(&too_many).unwrap_err();
    assert!(
        matches!(err, IpcError::MessageTooLarge { what: MessageLimit::Buffers, actual: 65_537, limit: 65_536 }),
        "{err}"
    );
    assert!(err.to_string().contains("nothing was sent, split the data over several messages"), "{err}");
    // Nothing was sent: the channel carries the next message as usual.
    tx.send_data(b"next").unwrap();
    assert!(matches!(rx.recv(&stream).unwrap(), Received::Data(bytes) if bytes == b"next"));
}

#[test]
fn a_failed_pool_import_keeps_the_drivers_code() {
    cuda_sim::testing::in_simulated_machine("a_failed_pool_import_keeps_the_drivers_code", &[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (device, stream) = setup();
        let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let (tx, rx) = pair();
        tx.send_resource(dmr.as_ref()).unwrap();
        let driver = cuda_sim::testing::driver().unwrap();
        cuda_sim::testing::inject_failure(driver, c"cuMemPoolImportFromShareableHandle", 1).unwrap();
        let err = rx.recv(&stream).unwrap_err();
        assert_eq!(err.cuda_code(), Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{err}");
        assert!(matches!(&err, IpcError::Core(core) if core.cuda_code() == err.cuda_code()), "{err:?}");
    });
}

#[test]
fn a_lookup_expects_the_kind_of_memory_and_its_device() {
    let name = "a_lookup_expects_the_kind_of_memory_and_its_device";
    cuda_sim::testing::in_simulated_machine(name, &[("CUDA_SIM_DEVICES", "2")], || {
        let (device, stream) = setup();
        if Device::count().unwrap() < 2 {
            return cuda_sim::testing::skip("needs two devices");
        }
        let other = Device::new(1).unwrap();
        let dmr = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let (tx, rx) = pair();
        tx.send_resource(dmr.as_ref()).unwrap();
        let Received::Resource(mapped) = rx.recv(&stream).unwrap() else { panic!("a resource") };
        assert_eq!(mapped.kind(), PoolKind::Device(device));
        assert!(Arc::ptr_eq(&lookup(mapped.uuid(), PoolKind::Device(device)).unwrap(), &mapped));
        for wrong in [PoolKind::Device(other), PoolKind::Pinned, PoolKind::Managed] {
            let err = lookup(mapped.uuid(), wrong).unwrap_err();
            assert!(
                matches!(err, IpcError::WrongResourceKind { expected, found, .. }
                    if expected == wrong && found == PoolKind::Device(device)),
                "{err:?}"
            );
            assert!(err.to_string().contains(&format!("needs a {wrong}")), "{err}");
        }
    });
}
