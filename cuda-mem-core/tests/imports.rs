//! Importing pools and allocations another process exported (here the process imports its own
//! pool, which the simulator allows): where an imported pool's memory lives (the driver's word),
//! one owner per pool handle whatever the driver answers a second import with, and the counting
//! of allocation imports, which the driver does not do.

mod common;

use std::sync::Arc;

use cuda_mem_core::{
    Access, Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, EXPORT_DATA_LEN, Error, FillPattern,
    ForeignMemory, MemoryPool, MemoryResource, PinnedMemoryResource, PinnedMemoryResourceOptions, PoolKind,
    PoolResource, SharingError, Stream, SynchronousMemoryResource, import_holders, import_pending_waits,
};
use cuda_sim::testing::{in_simulated_machine, inject_failure, live_objects_if_simulated};

/// An IPC-enabled device pool and a buffer of it, with the buffer's export data.
fn exported(device: Device, stream: &Stream) -> (Arc<DeviceMemoryResource>, Buffer, [u8; EXPORT_DATA_LEN]) {
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = pool.allocate(8192, stream).unwrap();
    let data = pool.pool().export_pointer(buffer.ptr()).unwrap();
    (pool, buffer, data)
}

/// `pool` imported again, as another process would import it.
fn import(pool: &MemoryPool) -> cuda_mem_core::Result<MemoryPool> {
    let handle = pool.shareable_handle().unwrap();
    MemoryPool::import(handle.try_clone_fd().unwrap(), handle.id())
}

/// The simulator's live allocations (`None` on a real driver, which does not count them).
fn live_allocations() -> Option<u64> {
    live_objects_if_simulated().map(|live| live.allocations)
}

/// The simulator's live pools (`None` on a real driver).
fn live_pools() -> Option<u64> {
    live_objects_if_simulated().map(|live| live.pools)
}

#[test]
fn an_imported_pool_lives_where_the_driver_says() {
    let device = common::device();
    let stream = common::stream(device);
    let (pool, _buffer, _) = exported(device, &stream);
    let imported = import(pool.pool()).unwrap();
    assert!(imported.is_imported() && imported.is_owned());
    assert_eq!(imported.owner(), Some(device));
    assert_eq!(imported.kind(), PoolKind::Device(device));

    let pinned = PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .unwrap();
    let imported = import(pinned.pool()).unwrap();
    assert_eq!(imported.owner(), None, "host memory");
    assert_eq!(imported.kind(), PoolKind::Pinned);
    for device in Device::all().unwrap() {
        assert_eq!(imported.access(device).unwrap(), Access::ReadWrite, "given to {device}, as a created one is");
    }
}

#[test]
fn imports_are_counted_and_the_last_release_unmaps() {
    let device = common::device();
    let (a, b) = (common::stream(device), common::stream(device));
    let (pool, _buffer, data) = exported(device, &a);
    let imported = import(pool.pool()).unwrap();

    let first = imported.import_allocation(&data, 8192, &a).unwrap();
    let second = imported.import_allocation(&data, 4096, &b).unwrap();
    assert_eq!(first, second, "one mapping");
    assert_eq!(import_holders(first), 2);
    // A size beyond the mapping is refused and adds no holder.
    let error = imported.import_allocation(&data, 1 << 20, &a).unwrap_err();
    assert!(matches!(error, Error::SizeMismatch { expected, actual: 1_048_576, .. } if expected >= 8192), "{error}");
    assert_eq!(import_holders(first), 2);

    // SAFETY: each share is given back once, and nothing uses the memory afterwards.
    unsafe { imported.release_import(second, &b) }.unwrap();
    assert_eq!((import_holders(first), import_pending_waits(first)), (1, 1), "the last release waits for b");
    // SAFETY: as above.
    unsafe { imported.release_import(first, &a) }.unwrap();
    assert_eq!((import_holders(first), import_pending_waits(first)), (0, 0), "unmapped");
    // A share given back twice is refused, not a second unmap.
    // SAFETY: refused before any driver call (the pointer is no longer an import).
    let error = unsafe { imported.release_import(first, &a) }.unwrap_err();
    assert!(matches!(error, Error::Sharing(SharingError::NotAnImport { ptr }) if ptr == first), "{error}");
    assert!(error.to_string().contains("not an allocation this process imported through this pool"), "{error}");
    a.synchronize().unwrap();
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}

/// `data` changed where the simulator does not look when it maps it (the size it records: the
/// mapping is found by pool and offset), its checksum made again: export data that differs from
/// the genuine bytes yet names the same allocation, as a peer could send (the format is the
/// simulator's, `cuda_sim::shared`: the FNV-1a of the first 56 bytes in the last 8).
fn forged(data: &[u8; EXPORT_DATA_LEN]) -> [u8; EXPORT_DATA_LEN] {
    let mut forged = *data;
    let size = u64::from_le_bytes(forged[32..40].try_into().unwrap());
    forged[32..40].copy_from_slice(&(size - 1).to_le_bytes());
    let check =
        forged[..56].iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    forged[56..].copy_from_slice(&check.to_le_bytes());
    forged
}

// In a process of its own: the live allocations it counts are the whole process's, which the
// tests beside it change while they run.
#[test]
fn other_export_data_the_driver_maps_onto_a_held_import_shares_it() {
    if !cuda_sim::testing::simulator_only("export data forged in the simulator's format") {
        return;
    }
    in_simulated_machine("other_export_data_the_driver_maps_onto_a_held_import_shares_it", &[], forged_import_shares);
}

fn forged_import_shares() {
    let device = common::device();
    let stream = common::stream(device);
    let (pool, mut buffer, data) = exported(device, &stream);
    buffer.fill(FillPattern::U8(0x5a), &stream).unwrap();
    let imported = import(pool.pool()).unwrap();
    let allocations = live_allocations();
    let genuine = imported.import_allocation(&data, 8192, &stream).unwrap();
    let other = forged(&data);
    assert_ne!(other, data);
    // The driver maps it onto the held import: one more holder of it, not a second entry.
    let forged_import = imported.import_allocation(&other, 4096, &stream).unwrap();
    assert_eq!(forged_import, genuine);
    assert_eq!(import_holders(genuine), 2);
    // The held mapping's size still bounds what may be claimed.
    let error = imported.import_allocation(&other, 1 << 20, &stream).unwrap_err();
    assert!(matches!(error, Error::SizeMismatch { actual: 1_048_576, .. }), "{error}");
    assert_eq!(import_holders(genuine), 2);
    // Giving the forged share back leaves the genuine holder's mapping in place.
    // SAFETY: one share, given back once; nothing used it.
    unsafe { imported.release_import(forged_import, &stream) }.unwrap();
    assert_eq!(import_holders(genuine), 1);
    assert_eq!(live_allocations(), allocations.map(|n| n + 1), "still mapped");
    // SAFETY: 8192 bytes mapped at `genuine` while its share is held, read on `stream` only.
    let view = unsafe { Buffer::from_raw(genuine, 8192, ForeignMemory::device_memory(device)) };
    assert_eq!(view.to_vec::<u8>(&stream).unwrap(), vec![0x5a; 8192], "the genuine mapping still reads");
    drop(view);
    // SAFETY: the last share.
    unsafe { imported.release_import(genuine, &stream) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(import_holders(genuine), 0);
    assert_eq!(live_allocations(), allocations, "unmapped once, by the last holder");
}

#[test]
fn only_an_imported_pool_maps_exported_allocations() {
    let device = common::device();
    let stream = common::stream(device);
    let (pool, _buffer, data) = exported(device, &stream);
    let error = pool.pool().import_allocation(&data, 8192, &stream).unwrap_err();
    assert!(matches!(error, Error::Sharing(SharingError::PoolNotImported)), "{error}");
}

/// Two holders, then the bookkeeping of a release fails at `function`: the share is given back
/// all the same (the stream synchronized instead), and the last release unmaps.
fn release_despite_a_failure_at(function: &std::ffi::CStr, holders: usize) {
    if !cuda_sim::testing::simulator_only("failing the bookkeeping of a release") {
        return;
    }
    let device = common::device();
    let (a, b) = (common::stream(device), common::stream(device));
    let (pool, _buffer, data) = exported(device, &a);
    let imported = import(pool.pool()).unwrap();
    let allocations = live_allocations();
    let ptrs: Vec<_> = (0..holders).map(|_| imported.import_allocation(&data, 8192, &a).unwrap()).collect();
    let ptr = ptrs[0];
    assert_eq!(live_allocations(), allocations.map(|n| n + 1), "one mapping");
    for &held in &ptrs[2..] {
        // SAFETY: one share, given back once.
        unsafe { imported.release_import(held, &b) }.unwrap();
    }
    inject_failure(cuda_sim::testing::driver().unwrap(), function, 1).unwrap();
    // SAFETY: as above.
    unsafe { imported.release_import(ptr, &b) }.unwrap();
    assert_eq!(import_holders(ptr), 1, "the share was given back");
    assert_eq!(import_pending_waits(ptr), 0, "b was synchronized instead of noted");
    // SAFETY: the last share.
    unsafe { imported.release_import(ptr, &a) }.unwrap();
    a.synchronize().unwrap();
    assert_eq!(import_holders(ptr), 0);
    assert_eq!(live_allocations(), allocations, "unmapped: nothing left behind");
}

#[test]
fn a_release_whose_event_cannot_be_created_still_gives_back_its_share() {
    in_simulated_machine("a_release_whose_event_cannot_be_created_still_gives_back_its_share", &[], || {
        release_despite_a_failure_at(c"cuEventCreate", 2);
    });
}

#[test]
fn a_release_whose_event_cannot_be_recorded_still_gives_back_its_share() {
    in_simulated_machine("a_release_whose_event_cannot_be_recorded_still_gives_back_its_share", &[], || {
        // A new event for the stream, then the one kept for it recorded again.
        release_despite_a_failure_at(c"cuEventRecord", 2);
        release_despite_a_failure_at(c"cuEventRecord", 3);
    });
}

/// Importing a pool this process has imported already: with a handle of its own, a second pool;
/// with the first import's handle, refused, and the first import intact.
fn import_twice(same_handle: bool) {
    // On a real driver the answer to a second import is the driver's own (the GPU probe
    // pool-import-twice reports it): the invariants are checked, not the simulator's model.
    let same_handle = cuda_sim::testing::on_simulator().then_some(same_handle);
    let device = common::device();
    let stream = common::stream(device);
    let (pool, _buffer, data) = exported(device, &stream);
    let pools = live_pools();
    let first = import(pool.pool()).unwrap();
    match import(pool.pool()) {
        Ok(second) => {
            assert_ne!(same_handle, Some(true));
            assert_ne!(second.handle(), first.handle());
        }
        Err(Error::Sharing(SharingError::PoolAlreadyOwned { handle })) => {
            assert_ne!(same_handle, Some(false));
            assert_eq!(handle, first.handle() as usize);
        }
        Err(error) => panic!("{error}"),
    }
    let ptr = first.import_allocation(&data, 8192, &stream).unwrap();
    // SAFETY: the one share, given back once.
    unsafe { first.release_import(ptr, &stream) }.unwrap();
    drop(first);
    assert_eq!(live_pools(), pools, "every import destroyed once");
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}

#[test]
fn a_second_import_with_a_handle_of_its_own_is_a_pool_of_its_own() {
    in_simulated_machine("a_second_import_with_a_handle_of_its_own_is_a_pool_of_its_own", &[], || import_twice(false));
}

#[test]
fn a_second_import_answered_with_the_first_handle_is_refused() {
    in_simulated_machine(
        "a_second_import_answered_with_the_first_handle_is_refused",
        &[("CUDA_SIM_POOL_IMPORT", "same-handle")],
        || import_twice(true),
    );
}

#[test]
fn memory_pool_finds_the_pool_behind_a_resource() {
    let device = common::device();
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
    let resource: Arc<dyn MemoryResource> = pool.clone();
    let found = resource.memory_pool().unwrap();
    assert_eq!(found.handle(), PoolResource::pool(pool.as_ref()).handle());
    let pinned: Arc<dyn MemoryResource> = PinnedMemoryResource::current().unwrap();
    assert!(pinned.memory_pool().is_some());
    let plain: Arc<dyn MemoryResource> = SynchronousMemoryResource::new(device);
    assert!(plain.memory_pool().is_none(), "not a pool resource");
}

/// With the memory history recording, a buffer's export and an allocation's import are
/// recorded, each named by its pool's handle.
#[test]
fn exports_and_imports_are_recorded_in_the_history() {
    in_simulated_machine("exports_and_imports_are_recorded_in_the_history", &[], || {
        use cuda_mem_core::history::{self, HistoryOptions, MemoryEventKind, ResourceId};
        let _serial = history::tests_serial();
        let device = common::device();
        let stream = common::stream(device);
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let buffer = pool.allocate_scoped(8192, &stream).unwrap();
        let imported = import(pool.pool()).unwrap();
        history::start_recording(HistoryOptions::default());
        let data = pool.pool().export_buffer(&buffer).unwrap();
        let ptr = imported.import_allocation(&data, 8192, &stream).unwrap();
        history::stop_recording();
        let handle = |pool: &MemoryPool| ResourceId(pool.handle() as usize as u64);
        // The recording is the process's: on a real driver (and the GPU bundle's hidden
        // simulator) this body runs in the test process, beside other tests that import, so
        // only this test's two pools are looked at.
        let ours = [handle(pool.pool()), handle(&imported)];
        let events: Vec<_> = history::history()
            .events
            .into_iter()
            .filter(|e| matches!(e.kind, MemoryEventKind::Export | MemoryEventKind::Import))
            .filter(|e| ours.contains(&e.resource))
            .map(|e| (e.kind, e.address, e.size, e.resource))
            .collect();
        assert_eq!(
            events,
            [
                (MemoryEventKind::Export, buffer.ptr(), 8192, handle(pool.pool())),
                (MemoryEventKind::Import, ptr, 8192, handle(&imported)),
            ]
        );
        // SAFETY: imported above and unused.
        unsafe { imported.release_import(ptr, &stream) }.unwrap();
    });
}
