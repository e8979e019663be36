//! Elastic memory on the simulator: groups that sleep (discarding or offloading) and wake at the
//! same addresses with their contents, the device's free memory following; what is refused
//! (access while asleep, sleep while accessed, capturing streams); on-demand pages mapped and
//! unmapped with typed out-of-memory failures; and a failure injected at every driver call of
//! sleeping, waking, mapping and unmapping: an error, everything as it was, and nothing left
//! behind once dropped.

// Runs of mapped pages are ranges: a one-run list is meant.
#![allow(clippy::single_range_in_vec_init)]

mod common;

use std::sync::Arc;

use common::*;
use cuda_mem_core::{Device, Stream, take_drop_errors};
use cuda_mem_vmm::{
    Discarded, ElasticBuffer, ElasticGroup, ElasticMemory, OnDemandRange, Release, VirtualMemoryResource, VmmError,
};
use cuda_sim::testing::{count_calls, run_failing};

const MIB: usize = 1 << 20;

fn free_memory(device: Device) -> usize {
    device.memory_info().unwrap().free
}

fn put(buffer: &mut ElasticBuffer, bytes: &[u8], s: &Stream) {
    buffer
        .access_mut()
        .unwrap()
        .view_mut::<u8>()
        .unwrap()
        .slice_mut(..bytes.len())
        .unwrap()
        .copy_from_slice(bytes, s)
        .unwrap();
}

fn get(buffer: &ElasticBuffer, len: usize, s: &Stream) -> Vec<u8> {
    buffer.access().unwrap().view::<u8>().unwrap().slice(..len).unwrap().to_vec(s).unwrap()
}

fn setup() -> (Device, Stream, Arc<VirtualMemoryResource>) {
    let d = device(0);
    let s = stream(d);
    let resource = VirtualMemoryResource::new(d, Default::default()).unwrap();
    (d, s, resource)
}

#[test]
fn offloaded_weights_come_back_at_the_same_addresses_and_discarded_memory_zeroed() {
    machine!(&[], || {
        let (d, s, resource) = setup();
        let weights = ElasticGroup::new(&resource, "weights");
        let kv = ElasticGroup::new(&resource, "kv-cache");
        let mut w: Vec<ElasticBuffer> = (0..3).map(|i| weights.allocate((i + 1) * 4 * MIB, &s).unwrap()).collect();
        let mut cache = kv.allocate(8 * MIB, &s).unwrap();
        for (i, buffer) in w.iter_mut().enumerate() {
            put(buffer, &pattern(i as u8, 1 << 16), &s);
        }
        put(&mut cache, &pattern(9, 4096), &s);
        let addresses: Vec<_> = w.iter().map(ElasticBuffer::ptr).chain([cache.ptr()]).collect();
        let live = sim_live();
        let free = free_memory(d);

        let slept = weights.sleep(Release::Offload, &s).unwrap();
        assert_eq!((slept.buffers, slept.released_bytes, slept.offloaded_bytes), (3, 24 * MIB, 24 * MIB));
        let discarded = kv.sleep(Release::Discard, &s).unwrap();
        assert_eq!((discarded.released_bytes, discarded.offloaded_bytes), (8 * MIB, 0));
        assert_eq!(free_memory(d), free + 32 * MIB, "the device has the memory back");
        assert_eq!(weights.asleep(), Some(Release::Offload));
        let stats = weights.statistics();
        assert_eq!((stats.mapped_bytes, stats.reserved_bytes, stats.offloaded_bytes), (0, 24 * MIB, 24 * MIB));
        assert_eq!(
            sim_live().map(|l| (l.mappings, l.physical_allocations, l.reservations)),
            live.map(|l| (l.mappings - 4, l.physical_allocations - 4, l.reservations)),
            "unmapped and released, still reserved"
        );
        assert!(matches!(w[0].access(), Err(VmmError::Asleep { tag }) if tag == "weights"));
        // The snapshot shows the memory given back: three reservations, nothing mapped.
        let snapshot = cuda_mem_core::snapshot::take_snapshot();
        let ours = snapshot.resource(cuda_mem_core::history::ResourceId::of(&*weights)).unwrap();
        assert!(ours.name.contains("\"weights\", asleep (offload)"), "{}", ours.name);
        assert_eq!((ours.reserved_bytes, ours.live_allocations, ours.segments.len()), (0, 3, 3));
        assert!(ours.segments.iter().all(|segment| segment.blocks.is_empty() && segment.reserved.is_some()));
        assert!(matches!(weights.allocate(MIB, &s), Err(VmmError::Asleep { .. })));
        assert_eq!(weights.sleep(Release::Discard, &s).unwrap(), Default::default(), "asleep already: nothing");

        let woken = weights.wake(Discarded::Unspecified, &s).unwrap();
        assert_eq!((woken.buffers, woken.mapped_bytes, woken.restored_bytes), (3, 24 * MIB, 24 * MIB));
        let zeroed = kv.wake(Discarded::Zeroed, &s).unwrap();
        assert_eq!(zeroed.zeroed_bytes, 8 * MIB);
        assert_eq!(w.iter().map(ElasticBuffer::ptr).chain([cache.ptr()]).collect::<Vec<_>>(), addresses);
        for (i, buffer) in w.iter().enumerate() {
            assert_bytes(&get(buffer, 1 << 16, &s), &pattern(i as u8, 1 << 16), "offloaded contents");
        }
        assert!(get(&cache, 4096, &s).iter().all(|&b| b == 0), "discarded, zeroed");
        assert_eq!(free_memory(d), free);
        assert_eq!(weights.statistics().offloaded_bytes, 0, "the pinned copies went");
        assert_eq!((weights.statistics().sleeps, weights.statistics().wakes), (1, 1));
        drop((w, cache));
        assert_eq!(
            sim_live().map(|l| l.reservations),
            live.map(|l| l.reservations - 4),
            "dropped: the addresses freed"
        );
    });
}

#[test]
fn work_queued_on_a_buffers_stream_lands_before_the_offload() {
    machine!(&[], || {
        let (_, s, resource) = setup();
        let other = stream(device(0));
        let group = ElasticGroup::new(&resource, "weights");
        let mut buffer = group.allocate(16 * MIB, &other).unwrap();
        // Enqueued on the buffer's own stream, not waited for: the sleep orders after it.
        buffer.access_mut().unwrap().fill(cuda_mem_core::FillPattern::U8(0x5a), &other).unwrap();
        group.sleep(Release::Offload, &s).unwrap();
        group.wake(Discarded::Unspecified, &s).unwrap();
        s.synchronize().unwrap();
        assert!(get(&buffer, 16 * MIB, &s).iter().all(|&b| b == 0x5a));
    });
}

#[test]
fn what_is_refused_leaves_the_group_as_it_was() {
    machine!(&[], || {
        let (_, s, resource) = setup();
        let group = ElasticGroup::new(&resource, "weights");
        let mut buffer = group.allocate(MIB, &s).unwrap();
        put(&mut buffer, &pattern(3, 4096), &s);
        {
            let _reading = buffer.access().unwrap();
            assert!(matches!(
                group.sleep(Release::Discard, &s),
                Err(VmmError::InUse { memory: ElasticMemory::Group { tag } }) if tag == "weights"
            ));
        }
        let capturing = stream(device(0));
        let capture = capturing.begin_capture(cuda_mem_core::CaptureMode::Relaxed).unwrap();
        assert!(matches!(group.sleep(Release::Offload, &capturing), Err(VmmError::CapturingStream)));
        drop(capture.end().unwrap());
        assert_eq!(group.asleep(), None);
        assert_bytes(&get(&buffer, 4096, &s), &pattern(3, 4096), "untouched");
    });
}

/// The simulated device holds 64 MiB: pages past it are refused by type, with nothing of the
/// attempt mapped; unmapping gives every byte back.
#[test]
fn on_demand_pages_map_until_memory_runs_out_and_unmapping_gives_it_all_back() {
    machine!(&[("CUDA_SIM_MEMORY", "64M")], || {
        if !cuda_sim::testing::simulator_only("a device of 64 MiB") {
            return;
        }
        let (d, s, resource) = setup();
        let range = OnDemandRange::new(&resource, 1 << 30, 4 * MIB, &s).unwrap();
        assert_eq!((range.page_size(), range.page_count(), range.size()), (4 * MIB, 256, 1 << 30));
        let free = free_memory(d);
        assert_eq!(range.map(0..4).unwrap(), 4);
        assert_eq!(range.map(2..6).unwrap(), 2, "mapped pages are left as they are");
        range.access(0, 24 * MIB).unwrap().view_mut::<u8>().unwrap().fill(7, &s).unwrap();
        assert!(matches!(range.access(24 * MIB, 1), Err(VmmError::NotMapped { page: 6, .. })));
        assert!(matches!(range.map(250..257), Err(VmmError::PagesOutOfRange { end: 257, count: 256, .. })));
        let before = range.mapped_pages();
        let Err(VmmError::PhysicalMemoryExhausted { requested, mapped, .. }) = range.map(6..100) else {
            panic!("more than the device holds")
        };
        assert_eq!((requested, mapped), (94 * 4 * MIB, 24 * MIB));
        assert_eq!(range.mapped_pages(), before, "nothing of the attempt stays mapped");
        assert_eq!(free_memory(d), free - 24 * MIB);
        let stats = range.statistics();
        assert_eq!((stats.mapped_pages, stats.failed_maps, stats.pages_mapped), (6, 1, 6));
        assert_eq!(range.unmap(0..3, &s).unwrap(), 12 * MIB);
        assert_eq!(range.mapped_pages(), [3..6]);
        assert_eq!(range.unmap(0..256, &s).unwrap(), 12 * MIB);
        assert_eq!(free_memory(d), free, "all of it back");
        assert_eq!(range.statistics().peak_mapped_bytes, 24 * MIB);
        range.map(10..12).unwrap();
        let snapshot = cuda_mem_core::snapshot::take_snapshot();
        let ours = snapshot.resource(cuda_mem_core::history::ResourceId::of(&*range)).unwrap();
        assert_eq!(ours.segments[0].blocks.len(), 1, "one run of pages");
        assert_eq!(
            (ours.segments[0].blocks[0].address, ours.reserved_bytes),
            (range.ptr() + 40 * MIB as u64, 8 * MIB as u64)
        );
    });
}

/// Which elastic path a fault is injected into.
#[derive(Debug, Clone, Copy)]
enum Path {
    SleepOffload,
    SleepDiscard,
    WakeOffloaded,
    WakeZeroed,
    MapPages,
    UnmapPages,
}

/// What a path works on: two groups' buffers (one asleep, offloaded, one discarded, when the
/// path wakes) and an on-demand range with two pages mapped.
struct Setup {
    s: Stream,
    group: Arc<ElasticGroup>,
    buffers: Vec<ElasticBuffer>,
    range: Arc<OnDemandRange>,
}

fn prepare(resource: &Arc<VirtualMemoryResource>, path: Path) -> Setup {
    let s = stream(device(0));
    let group = ElasticGroup::new(resource, "group");
    let mut buffers: Vec<_> = (0..2).map(|i| group.allocate((i + 1) * 2 * MIB, &s).unwrap()).collect();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        put(buffer, &pattern(i as u8 + 1, 4096), &s);
    }
    match path {
        Path::WakeOffloaded => drop(group.sleep(Release::Offload, &s).unwrap()),
        Path::WakeZeroed => drop(group.sleep(Release::Discard, &s).unwrap()),
        _ => {}
    }
    let range = OnDemandRange::new(resource, 64 * MIB, 2 * MIB, &s).unwrap();
    range.map(0..2).unwrap();
    s.synchronize().unwrap();
    Setup { s, group, buffers, range }
}

fn run_path(path: Path, setup: &Setup) -> cuda_mem_vmm::Result<()> {
    let s = &setup.s;
    match path {
        Path::SleepOffload => setup.group.sleep(Release::Offload, s).map(drop),
        Path::SleepDiscard => setup.group.sleep(Release::Discard, s).map(drop),
        Path::WakeOffloaded => setup.group.wake(Discarded::Unspecified, s).map(drop),
        Path::WakeZeroed => setup.group.wake(Discarded::Zeroed, s).map(drop),
        Path::MapPages => setup.range.map(1..5).map(drop),
        Path::UnmapPages => setup.range.unmap(0..2, s).map(drop),
    }
}

/// After a failed path: the group or range is as it was before it, and its contents too (an
/// offloaded group's come back with a wake).
fn as_before(path: Path, setup: &Setup) {
    check_contents(path, setup, false);
}

/// After a path that succeeded (a failed call it could do without, or a release it recorded):
/// what the path does is done, contents and all.
fn as_after(path: Path, setup: &Setup) {
    check_contents(path, setup, true);
}

/// The group (awake again with a zeroing wake where it sleeps) holds what it should, or the
/// range maps what it should, once `path` was (`done`) or was not.
fn check_contents(path: Path, setup: &Setup, done: bool) {
    let s = &setup.s;
    let sleeps = matches!(path, Path::SleepOffload | Path::SleepDiscard);
    let wakes = matches!(path, Path::WakeOffloaded | Path::WakeZeroed);
    if sleeps || wakes {
        assert_eq!(setup.group.asleep().is_some(), sleeps == done, "{path:?}, done: {done}");
        if setup.group.asleep().is_some() {
            assert_eq!(setup.group.statistics().mapped_bytes, 0, "{path:?}: nothing half-mapped");
            setup.group.wake(Discarded::Zeroed, s).unwrap();
        }
        let lost = match path {
            Path::SleepDiscard => done,
            Path::WakeZeroed => true,
            _ => false,
        };
        for (i, buffer) in setup.buffers.iter().enumerate() {
            let expected = if lost { vec![0; 4096] } else { pattern(i as u8 + 1, 4096) };
            assert_bytes(&get(buffer, 4096, s), &expected, &format!("{path:?}, done: {done}: contents"));
        }
        return;
    }
    let mapped: &[std::ops::Range<usize>] = match (path, done) {
        (Path::MapPages, true) => &[0..5],
        (Path::UnmapPages, true) => &[],
        _ => &[0..2],
    };
    assert_eq!(setup.range.mapped_pages(), mapped, "{path:?}, done: {done}");
}

#[test]
fn a_failure_at_every_driver_call_of_sleep_wake_map_and_unmap_is_undone() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (_, _, resource) = setup();
        // Made once (and its access set) on first use: made before counting.
        cuda_mem_core::PinnedMemoryResource::current().unwrap();
        let driver = cuda_sim::testing::driver().unwrap();
        let mut baseline = vmm_live();
        let mut injected = 0;
        for path in [
            Path::SleepOffload,
            Path::SleepDiscard,
            Path::WakeOffloaded,
            Path::WakeZeroed,
            Path::MapPages,
            Path::UnmapPages,
        ] {
            let clean = prepare(&resource, path);
            let (result, calls) = count_calls(driver, || run_path(path, &clean)).unwrap();
            result.unwrap_or_else(|e| panic!("{path:?} without failures: {e}"));
            drop(clean);
            assert!(take_drop_errors().is_empty());
            assert_eq!(vmm_live(), baseline, "{path:?}: nothing left behind");
            assert!(calls.total() > 0);
            for injection in calls.injections() {
                let setup = prepare(&resource, path);
                let (result, fired) = run_failing(driver, injection, || run_path(path, &setup)).unwrap();
                let case = format!("{path:?}, {injection}");
                assert!(fired, "{case}: the path did not make that call");
                let errors = take_drop_errors();
                match result {
                    Err(error) => {
                        assert!(
                            injection.is_releasing() || errors.is_empty(),
                            "{case}: {error}, and recorded {errors:?}"
                        );
                        as_before(path, &setup);
                    }
                    // A call the path does without (binding a context it has), or a release it
                    // records (memory going back, pinned copies freed): done all the same.
                    Ok(()) => as_after(path, &setup),
                }
                drop(setup);
                let refused_release = take_drop_errors().iter().any(|e| {
                    ["cuMemRelease", "cuMemUnmap", "cuMemAddressFree"].iter().any(|f| e.error.to_string().contains(f))
                }) || ["cuMemRelease", "cuMemUnmap", "cuMemAddressFree"]
                    .contains(&injection.function);
                if refused_release {
                    // What the driver would not let go of stays (recorded): the new baseline.
                    baseline = vmm_live();
                } else {
                    assert_eq!(vmm_live(), baseline, "{case}: nothing left behind");
                }
                injected += 1;
            }
        }
        assert!(injected >= 50, "only {injected} failures were injected");
    });
}
