//! The caching resource on the simulator: reuse without driver calls, the cross-stream rule
//! under held streams, graph capture, out of memory, fault injection at every driver call, a
//! model of any sequence of allocations and frees, and the resources and adaptors around it.

mod common;

use std::sync::Arc;

use common::{Gate, OPEN_DELAY, hold};
use cuda_mem_core::{
    BlockUse, Buffer, CachingError, CachingOptions, CachingResource, CaptureMode, DeviceMemoryResource,
    DeviceMemoryResourceOptions, Error, FillPattern, LimitingAdaptor, ManagedMemoryResource, MemoryResource,
    PinnedMemoryResource, PoolResource, SharingError, SizeClass, StatisticsAdaptor, Stream, take_drop_errors,
};
use cuda_sim::testing::{count_calls, count_calls_if_simulated, in_simulated_machine, run_failing, simulator_only};
use proptest::prelude::*;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn cache_over(upstream: Arc<dyn MemoryResource>) -> Arc<CachingResource> {
    CachingResource::new(upstream, CachingOptions::default()).unwrap()
}

/// Options whose small segments are one 1 MiB block: a 1 MiB request takes a whole segment, so
/// which segment a request got says which block it got.
fn one_block_segments() -> CachingOptions {
    CachingOptions::default().small_segment(MIB)
}

#[test]
fn a_block_freed_on_its_stream_is_reused_there_without_a_driver_call() {
    in_simulated_machine("a_block_freed_on_its_stream_is_reused_there_without_a_driver_call", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let cache = cache_over(DeviceMemoryResource::new(device, Default::default()).unwrap());
        let first = cache.allocate(64 * KIB, &stream).unwrap();
        let address = first.ptr();
        drop(first);
        let (again, counts) = count_calls_if_simulated(|| {
            let again = cache.allocate(64 * KIB, &stream).unwrap();
            let address = again.ptr();
            drop(again);
            address
        });
        assert_eq!(again, address);
        counts.assert_total(0, "a cached pair makes no driver call");
        let stats = cache.statistics();
        assert_eq!((stats.small.segments.current, stats.large.segments.current), (1, 0));
        assert_eq!(stats.all.allocated_bytes.peak, 64 * KIB as u64);
    });
}

/// The state a thread used last stays named by that thread (so that its next pair finds it
/// without a shared write), but it lets go of its stream once `empty_cache` forgets it or the
/// cache is dropped: the stream is destroyed when its owner drops it, not when the thread
/// moves on.
#[test]
fn a_thread_that_used_a_stream_last_keeps_no_stream_alive() {
    in_simulated_machine("a_thread_that_used_a_stream_last_keeps_no_stream_alive", &[], || {
        if !simulator_only("a destroyed stream's handle is refused") {
            return;
        }
        let driver = cuda_sim::testing::driver().unwrap();
        let device = common::device();
        let destroyed = |handle| {
            // SAFETY: querying a handle is sound whether or not it still names a stream: the
            // simulator refuses one it does not know.
            unsafe { cuda_mem_core::sys::cu_call!(driver, cuStreamQuery(handle)) }.is_err()
        };
        for forget_by_emptying in [true, false] {
            let stream = common::stream(device);
            let handle = stream.handle();
            let cache = cache_over(DeviceMemoryResource::new(device, Default::default()).unwrap());
            drop(cache.allocate(4096, &stream).unwrap());
            if forget_by_emptying {
                assert_eq!(cache.empty_cache().unwrap(), 2 * MIB);
                assert!(cache.stream_statistics(&stream).is_none(), "forgotten");
            } else {
                drop(cache);
            }
            assert!(!destroyed(handle));
            drop(stream);
            assert!(destroyed(handle), "the thread's last state kept the stream alive");
        }
        assert!(take_drop_errors().is_empty());
    });
}

#[test]
fn empty_requests_never_reach_the_cache() {
    let device = common::device();
    let stream = common::stream(device);
    let counted = StatisticsAdaptor::new(DeviceMemoryResource::new(device, Default::default()).unwrap());
    let cache = cache_over(counted.clone());
    let empty = cache.allocate(0, &stream).unwrap();
    assert_eq!(empty.size(), 0);
    assert_eq!(cache.statistics().all.allocations.peak, 0);
    assert_eq!(counted.statistics().current_count, 1, "the notice goes on upstream, as an adaptor's does");
    drop(empty);
    assert_eq!(counted.statistics().current_count, 0);
}

/// A block freed on its stream while that stream's work on it is still queued (held behind a
/// gate) is not handed to another stream: that one gets other memory until the work is done,
/// and the block once it is.
#[test]
fn another_stream_gets_a_freed_block_only_once_the_work_on_it_is_done() {
    let device = common::device();
    let (a, b, c) = (common::stream(device), common::stream(device), common::stream(device));
    let cache =
        CachingResource::new(DeviceMemoryResource::new(device, Default::default()).unwrap(), one_block_segments())
            .unwrap();
    let mut x = cache.allocate(MIB, &a).unwrap();
    let x_address = x.ptr();
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, a.handle());
    x.fill(FillPattern::U8(1), &a).unwrap();
    drop(x);
    let on_b = cache.allocate(MIB, &b).unwrap();
    assert_ne!(on_b.ptr(), x_address, "handed to another stream while a's work on it was queued");
    assert!(!gate.is_open());
    gate.open();
    a.synchronize().unwrap();
    let on_c = cache.allocate(MIB, &c).unwrap();
    assert_eq!(on_c.ptr(), x_address, "once a's work is done, the block is anyone's");
    drop((on_b, on_c));
    assert!(take_drop_errors().is_empty());
}

/// A stream that takes a block of another stream's segment while that whole segment is free
/// and its last use done (a program's new stream, finding the old streams' memory) takes the
/// segment over: its frees of the segment's blocks are then same-stream frees, and its later
/// pairs make no driver call (no event recorded at each free and asked about at the next
/// allocation, the block going back to the old stream's bins each time).
#[test]
fn a_stream_takes_over_a_wholly_free_settled_segment_and_its_pairs_make_no_driver_call() {
    in_simulated_machine(
        "a_stream_takes_over_a_wholly_free_settled_segment_and_its_pairs_make_no_driver_call",
        &[],
        || {
            let device = common::device();
            let (a, b, c) = (common::stream(device), common::stream(device), common::stream(device));
            let cache = cache_over(DeviceMemoryResource::new(device, Default::default()).unwrap());
            drop(cache.allocate(64 * KIB, &a).unwrap());
            let a_segment = cache.snapshot()[0].address;
            // No complete event on a yet: c's request records one for later requests and grows.
            let on_c = cache.allocate(64 * KIB, &c).unwrap();
            assert!(on_c.ptr() < a_segment || on_c.ptr() >= a_segment + 2 * MIB as u64);
            drop(on_c);
            device.synchronize().unwrap();
            let first = cache.allocate(64 * KIB, &b).unwrap();
            assert_eq!(first.ptr(), a_segment, "a's block, its last use done");
            let owner = |address| cache.snapshot().into_iter().find(|s| s.address == address).unwrap().stream;
            assert!(owner(a_segment) == b, "the segment is b's now");
            drop(first);
            let (addresses, counts) = count_calls_if_simulated(|| {
                (0..100).map(|_| cache.allocate(64 * KIB, &b).unwrap().ptr()).collect::<Vec<_>>()
            });
            assert!(addresses.iter().all(|&address| address == a_segment), "{addresses:x?}");
            counts.assert_total(0, "pairs on the stream that took the segment over");
            let stats = cache.statistics();
            assert_eq!((stats.small.segments.current, stats.all.active_bytes.current), (2, 0));
            // The segment's new stream releases it; a's state is forgotten, having none left.
            assert_eq!(cache.empty_cache().unwrap(), 4 * MIB);
            assert!(take_drop_errors().is_empty());
        },
    );
}

/// A block freed on another stream than its segment's (here after work held on that stream) is
/// pending: not even its own stream takes it until the event recorded at the free completes.
#[test]
fn a_block_freed_on_another_stream_waits_for_that_streams_work() {
    let device = common::device();
    let (a, b) = (common::stream(device), common::stream(device));
    let cache =
        CachingResource::new(DeviceMemoryResource::new(device, Default::default()).unwrap(), one_block_segments())
            .unwrap();
    let mut x = cache.allocate(MIB, &a).unwrap();
    let x_address = x.ptr();
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, b.handle());
    x.set_deallocation_stream(&b);
    x.fill(FillPattern::U8(2), &b).unwrap();
    drop(x);
    let pending = cache.snapshot().into_iter().find(|segment| segment.address == x_address).unwrap();
    assert_eq!(pending.blocks[0].state, BlockUse::Pending);
    assert_eq!(cache.statistics().all.active_bytes.current, MIB as u64, "pending blocks are active");
    let y = cache.allocate(MIB, &a).unwrap();
    assert_ne!(y.ptr(), x_address, "reused before b's work on it was done");
    gate.open_after(OPEN_DELAY);
    b.synchronize().unwrap();
    let z = cache.allocate(MIB, &a).unwrap();
    assert_eq!(z.ptr(), x_address, "settled once b's work is done");
    drop((y, z));
    drop(cache);
    assert!(take_drop_errors().is_empty());
}

/// An allocation on a capturing stream is never served from the cache: over a pool it is
/// refused as the pool refuses it; a block a captured graph uses stays out of the cache while
/// the graph is replayed and other streams allocate.
#[test]
fn captures_never_receive_cached_blocks_and_replays_never_race_with_reuse() {
    let device = common::device();
    let (capturing, other) = (common::stream(device), common::stream(device));
    let cache = cache_over(DeviceMemoryResource::new(device, Default::default()).unwrap());
    drop(cache.allocate(64 * KIB, &capturing).unwrap());
    let mut used_in_graph = cache.allocate(64 * KIB, &other).unwrap();
    let graph_block = used_in_graph.ptr();
    let mut output = cache.allocate(64 * KIB, &capturing).unwrap();
    let before = cache.statistics();

    let capture = capturing.begin_capture(CaptureMode::Relaxed).unwrap();
    let refused = cache.allocate(64 * KIB, &capturing).unwrap_err();
    assert!(matches!(refused, Error::CapturingStream), "{refused}");
    used_in_graph.fill(FillPattern::U32(0xC0FFEE), &capturing).unwrap();
    output.copy_from(&used_in_graph, &capturing).unwrap();
    drop(used_in_graph);
    let graph = capture.end().unwrap();
    assert_eq!(cache.statistics().all.allocations, before.all.allocations, "nothing was handed to the capture");
    let exec = graph.instantiate(Default::default()).unwrap();
    drop(graph);
    let mut others = Vec::new();
    for _ in 0..4 {
        // SAFETY: `output` lives on; the dropped buffer is kept for the graph.
        unsafe { exec.launch(&capturing) }.unwrap();
        let taken = cache.allocate(64 * KIB, &other).unwrap();
        assert!(
            taken.ptr() + taken.size() as u64 <= graph_block || taken.ptr() >= graph_block + 64 * KIB as u64,
            "a block the graph uses was handed out while it replays"
        );
        others.push(taken);
    }
    assert_eq!(output.to_vec::<u32>(&capturing).unwrap(), vec![0xC0FFEE; 16 * 1024]);
    drop(exec);
    capturing.synchronize().unwrap();
    other.synchronize().unwrap();
    drop((others, output));
    assert!(take_drop_errors().is_empty());
}

/// Over graph memory, a capture's allocation passes through to the graph's own allocation and
/// its free too: counted as passed through, never cached.
#[test]
fn a_capture_over_graph_memory_passes_through() {
    let device = common::device();
    let stream = common::stream(device);
    let cache = cache_over(cuda_mem_core::GraphMemoryResource::new(device));
    let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
    let mut inside = cache.allocate(64 * KIB, &stream).unwrap();
    inside.fill(FillPattern::U8(3), &stream).unwrap();
    assert_eq!(cache.statistics().passed_through.current, 64 * KIB as u64);
    drop(inside);
    let graph = capture.end().unwrap();
    let stats = cache.statistics();
    assert_eq!((stats.passed_through.current, stats.all.reserved_bytes.peak), (0, 0));
    let exec = graph.instantiate(Default::default()).unwrap();
    // SAFETY: the graph allocates and frees its own memory.
    unsafe { exec.launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
}

#[test]
fn out_of_memory_releases_free_segments_retries_once_then_says_what_is_held() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().max_size(8 * MIB)).unwrap();
    let options = CachingOptions::default().large_segment(4 * MIB).large_own_segment(4 * MIB);
    let cache = CachingResource::new(pool, options).unwrap();
    let small: Vec<Buffer> = (0..4).map(|_| cache.allocate(MIB, &stream).unwrap()).collect();
    drop(small);
    assert_eq!(cache.statistics().small.reserved_bytes.current, 4 * MIB as u64, "two free segments cached");
    let large = cache.allocate(6 * MIB, &stream).unwrap();
    let stats = cache.statistics();
    assert_eq!((stats.retries, stats.out_of_memory), (1, 0));
    assert_eq!(stats.small.reserved_bytes.current, 0, "the free segments went back for it");
    let kept = cache.allocate(512, &stream).unwrap();
    let refused = cache.allocate(6 * MIB, &stream).unwrap_err();
    let Error::Caching(CachingError::OutOfMemory(held)) = &refused else { panic!("{refused}") };
    assert_eq!((held.requested, held.rounded), (6 * MIB, 6 * MIB));
    assert_eq!(held.allocated, 6 * MIB as u64 + 512);
    assert_eq!(held.reserved, 8 * MIB as u64);
    assert_eq!(held.cached, 2 * MIB as u64 - 512);
    assert_eq!(held.largest_free_block, 2 * MIB as u64 - 512);
    assert_eq!(refused.cuda_code(), Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    let stats = cache.statistics();
    assert_eq!((stats.retries, stats.out_of_memory), (1, 1), "no retry with nothing to release");
    drop((large, kept));
}

/// Device, pinned and managed pools under the cache, typed views of its buffers, adaptors over
/// it and under it: each works, and everything goes back upstream on drop.
#[test]
fn works_over_every_pool_kind_with_views_and_adaptors() {
    let device = common::device();
    let stream = common::stream(device);
    let pools: [Arc<dyn MemoryResource>; 3] = [
        DeviceMemoryResource::new(device, Default::default()).unwrap(),
        PinnedMemoryResource::current().unwrap(),
        ManagedMemoryResource::current(None).unwrap(),
    ];
    for pool in pools {
        let counted = StatisticsAdaptor::new(Arc::clone(&pool));
        let cache = cache_over(counted.clone());
        assert_eq!(cache.is_host_accessible(), pool.is_host_accessible());
        assert_eq!((cache.is_managed(), cache.device()), (pool.is_managed(), pool.device()));
        let limited = LimitingAdaptor::new(StatisticsAdaptor::new(cache.clone()), 4 * MIB);
        let mut buffer = limited.allocate(1000 * 4, &stream).unwrap();
        buffer.view_mut::<f32>().unwrap().slice_mut(500..).unwrap().fill(2.0, &stream).unwrap();
        buffer.view_mut::<f32>().unwrap().slice_mut(..500).unwrap().fill(1.0, &stream).unwrap();
        let values = buffer.to_vec::<f32>(&stream).unwrap();
        assert_eq!((values[499], values[500]), (1.0, 2.0));
        if pool.is_host_accessible() {
            assert_eq!(buffer.host_slice().unwrap()[..4], 1.0f32.to_ne_bytes());
        }
        assert!(buffer.memory_resource().unwrap().memory_pool().is_none(), "a block names no pool");
        let address = buffer.ptr();
        drop(buffer);
        assert_eq!(limited.allocate(4000, &stream).unwrap().ptr(), address);
        assert!(matches!(limited.allocate(5 * MIB, &stream), Err(Error::LimitExceeded { .. })));
        assert_eq!(counted.statistics().current_bytes, 2 * MIB as u64, "one small segment");
        drop((limited, cache));
        stream.synchronize().unwrap();
        assert_eq!(counted.statistics().current_bytes, 0, "every segment went back on drop");
    }
    assert!(take_drop_errors().is_empty());
}

/// A block is part of a segment the driver would export whole: its buffer is refused for
/// export, directly and through an adaptor, never exported as the segment.
#[test]
fn a_cached_block_is_refused_for_export() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let cache = cache_over(pool.clone());
    let counted = StatisticsAdaptor::new(cache.clone());
    let first = cache.allocate(4096, &stream).unwrap();
    let second = counted.allocate(4096, &stream).unwrap();
    for buffer in [&first, &second] {
        let refused = pool.pool().export_buffer(buffer).unwrap_err();
        assert!(
            matches!(refused, Error::Sharing(SharingError::CachedBlock { ptr, size: 4096 }) if ptr == buffer.ptr()),
            "{refused}"
        );
        assert!(buffer.memory_resource().unwrap().memory_pool().is_none());
    }
    assert!(cache.may_be_written_externally(), "still memory others may write");
    let own = pool.allocate(4096, &stream).unwrap();
    assert!(pool.pool().export_buffer(&own).is_ok(), "the pool's own buffers still export");
}

#[test]
fn threads_on_their_own_streams_share_the_cache() {
    const THREADS: usize = 4;
    let device = common::device();
    let counted = StatisticsAdaptor::new(DeviceMemoryResource::new(device, Default::default()).unwrap());
    let cache = cache_over(counted.clone());
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Emptying the cache meanwhile forgets the states of streams left without segments,
        // which allocations under way on them may hold.
        scope.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                cache.empty_cache().unwrap();
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let cache = &cache;
                scope.spawn(move || {
                    let stream = common::stream(device);
                    let mut held = Vec::new();
                    for round in 0..200 {
                        let size = 512 * (1 + (round * 7 + thread) % 64);
                        held.push(cache.allocate(size, &stream).unwrap());
                        if round % 3 == 0 {
                            held.swap_remove(round % held.len());
                        }
                    }
                    drop(held);
                    stream.synchronize().unwrap();
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(take_drop_errors().is_empty(), "every block was found again when freed");
    let stats = cache.statistics();
    assert_eq!(stats.all.allocated_bytes.current, 0);
    assert_eq!(stats.all.reserved_bytes.current, counted.statistics().current_bytes);
    let before = cache.snapshot();
    assert_eq!(
        cache.empty_cache().unwrap() as u64,
        stats.all.reserved_bytes.current,
        "{before:#?} {:#?}",
        cache.snapshot()
    );
    assert_eq!(counted.statistics().current_bytes, 0);
}

/// One run of the fault-injection scenario: two streams, a block freed after use on another
/// stream, a large block, reuse across streams, a trim and the drop. Errors are the point.
fn scenario(pool: &Arc<DeviceMemoryResource>, a: &Stream, b: &Stream) {
    let Ok(cache) = CachingResource::new(pool.clone(), CachingOptions::default()) else { return };
    let run = || -> cuda_mem_core::Result<()> {
        // Idle streams between the steps: every event the cache asks about is complete, so each
        // run makes the same calls.
        let idle = || a.synchronize().and_then(|()| b.synchronize());
        let mut x = cache.allocate(64 * KIB, a)?;
        x.fill(FillPattern::U8(1), b)?;
        drop(x);
        drop(cache.allocate(2 * MIB, b)?);
        idle()?;
        // a finds no large block of its own: an event on b for the next request, a segment now.
        let w = cache.allocate(3 * MIB, a)?;
        idle()?;
        // Too large for a's segment: b's, once the event shows b done with it (wholly free, the
        // segment becomes a's); freed on b, pending until an event shows b done with it.
        let mut v = cache.allocate(18 * MIB, a)?;
        v.set_deallocation_stream(b);
        drop((v, w));
        idle()?;
        cache.trim(0)?;
        let _kept = cache.allocate(4 * KIB, a)?;
        Ok(())
    };
    let _ = run();
    drop(cache);
}

#[test]
fn a_failure_at_any_driver_call_leaves_nothing_behind() {
    in_simulated_machine("a_failure_at_any_driver_call_leaves_nothing_behind", &[], || {
        if !simulator_only("fault injection") {
            return;
        }
        let driver = cuda_sim::testing::driver().unwrap();
        let device = common::device();
        let (a, b) = (common::stream(device), common::stream(device));
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let used = || {
            device.synchronize().unwrap();
            pool.usage().unwrap().used_bytes
        };
        scenario(&pool, &a, &b);
        let ((), calls) = count_calls(driver, || scenario(&pool, &a, &b)).unwrap();
        assert!(take_drop_errors().is_empty());
        assert_eq!(used(), 0);
        assert_eq!(calls.of("cuMemAllocFromPoolAsync"), 4, "{calls:?}");
        assert!(calls.of("cuEventRecord") >= 3 && calls.of("cuEventQuery") >= 2, "{calls:?}");
        let mut injected = 0;
        for injection in calls.injections() {
            let ((), fired) = run_failing(driver, injection, || scenario(&pool, &a, &b)).unwrap();
            assert!(fired, "{injection}: the scenario did not make that call");
            injected += 1;
            let errors = take_drop_errors();
            if injection.is_releasing() {
                assert!(used() == 0 || !errors.is_empty(), "{injection}: memory kept without a record");
            } else {
                assert_eq!(used(), 0, "{injection}: memory left behind ({errors:?})");
            }
        }
        assert!(injected > 5);
    });
}

#[derive(Debug, Clone)]
enum Op {
    Allocate { size: usize, stream: usize },
    Free { index: usize },
    FreeOn { index: usize, stream: usize },
    EmptyCache,
    Trim { keep: usize },
    ResetPeaks,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1 => Just(0usize), 6 => 1usize..=MIB + 4096, 2 => 1usize..24 * MIB];
    prop_oneof![
        6 => (size, 0usize..3).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        3 => any::<usize>().prop_map(|index| Op::Free { index }),
        2 => (any::<usize>(), 0usize..3).prop_map(|(index, stream)| Op::FreeOn { index, stream }),
        1 => Just(Op::EmptyCache),
        1 => (0usize..8 * MIB).prop_map(|keep| Op::Trim { keep }),
        1 => Just(Op::ResetPeaks),
    ]
}

/// The cache against a model of what it must hold: the live buffers, their requests and sizes.
fn check(
    cache: &CachingResource,
    upstream: &StatisticsAdaptor<DeviceMemoryResource>,
    live: &[Buffer],
    streams: &[Stream],
) {
    let segments = cache.snapshot();
    let stats = cache.statistics();
    let (mut reserved, mut allocated, mut requested, mut split, mut pending) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for segment in &segments {
        reserved += segment.size as u64;
        let mut at = segment.address;
        for block in &segment.blocks {
            assert_eq!(block.address, at, "blocks tile their segment");
            at += block.size as u64;
            match block.state {
                BlockUse::Allocated { requested: asked } => {
                    allocated += block.size as u64;
                    requested += asked as u64;
                    let buffer = live.iter().find(|b| b.ptr() == block.address).expect("a live buffer per block");
                    assert_eq!(buffer.size(), asked);
                    assert!(asked <= block.size);
                }
                BlockUse::Free if segment.blocks.len() > 1 => split += block.size as u64,
                BlockUse::Free => {}
                BlockUse::Pending => pending += block.size as u64,
            }
        }
        assert_eq!(at, segment.address + segment.size as u64, "splits and merges conserve bytes");
        assert!(segment.class == SizeClass::Small || segment.size > MIB);
    }
    let mut spans: Vec<(u64, u64)> =
        live.iter().filter(|b| b.size() > 0).map(|b| (b.ptr(), b.ptr() + b.size() as u64)).collect();
    spans.sort();
    assert!(spans.windows(2).all(|pair| pair[0].1 <= pair[1].0), "live blocks overlap: {spans:?}");
    for (start, end) in &spans {
        assert_eq!(
            segments.iter().filter(|s| s.address <= *start && *end <= s.address + s.size as u64).count(),
            1,
            "each live block lies in one segment"
        );
    }
    let all = stats.all;
    assert_eq!(
        (all.reserved_bytes.current, all.segments.current),
        (reserved, segments.len() as u64),
        "reserved as the segments say"
    );
    let empty = live.iter().filter(|b| b.size() == 0).count() as u64;
    let seen = upstream.statistics();
    assert_eq!((reserved, segments.len() as u64 + empty), (seen.current_bytes, seen.current_count), "upstream's view");
    assert_eq!(all.allocated_bytes.current, allocated);
    assert_eq!(all.requested_bytes.current, requested);
    assert_eq!(requested, live.iter().map(|b| b.size() as u64).sum::<u64>());
    assert_eq!(all.allocations.current, spans.len() as u64);
    assert_eq!(all.inactive_split_bytes.current, split);
    assert_eq!(all.active_bytes.current, allocated + pending);
    assert_eq!(stats.small.reserved_bytes.current + stats.large.reserved_bytes.current, reserved);
    assert!(all.allocated_bytes.peak >= allocated && all.reserved_bytes.peak >= reserved);
    // Each stream's share: the segments in its bins, its blocks; together, the whole.
    let shares: Vec<_> = streams.iter().filter_map(|stream| cache.stream_statistics(stream)).collect();
    let sum = |figure: fn(&cuda_mem_core::PoolStatistics) -> u64| shares.iter().map(|s| figure(&s.all)).sum::<u64>();
    assert_eq!(sum(|p| p.reserved_bytes.current), reserved, "the streams' segments are all the segments");
    assert_eq!(sum(|p| p.segments.current), segments.len() as u64);
    assert_eq!(sum(|p| p.allocated_bytes.current), allocated);
    assert_eq!(sum(|p| p.active_bytes.current), allocated + pending);
    for (stream, share) in streams.iter().filter_map(|stream| Some((stream, cache.stream_statistics(stream)?))) {
        let held: u64 = segments.iter().filter(|s| s.stream == *stream).map(|s| s.size as u64).sum();
        assert_eq!(share.all.reserved_bytes.current, held, "a stream's reserved bytes are its segments'");
        assert!(share.all.reserved_bytes.peak >= held);
        let classes = share.small.allocated_bytes.current + share.large.allocated_bytes.current;
        assert_eq!(share.all.allocated_bytes.current, classes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn the_cache_matches_a_model_of_any_sequence(ops in proptest::collection::vec(op(), 1..60)) {
        let device = common::device();
        let streams: Vec<Stream> = (0..3).map(|_| common::stream(device)).collect();
        let upstream = StatisticsAdaptor::new(DeviceMemoryResource::new(device, Default::default()).unwrap());
        let cache = cache_over(upstream.clone());
        let mut live: Vec<Buffer> = Vec::new();
        for op in ops {
            match op {
                Op::Allocate { size, stream } => live.push(cache.allocate(size, &streams[stream]).unwrap()),
                Op::Free { index } if !live.is_empty() => drop(live.swap_remove(index % live.len())),
                Op::FreeOn { index, stream } if !live.is_empty() => {
                    let mut buffer = live.swap_remove(index % live.len());
                    buffer.set_deallocation_stream(&streams[stream]);
                    drop(buffer);
                }
                Op::Free { .. } | Op::FreeOn { .. } => {}
                Op::EmptyCache => { cache.empty_cache().unwrap(); }
                Op::Trim { keep } => {
                    cache.trim(keep).unwrap();
                }
                Op::ResetPeaks => cache.reset_peaks(),
            }
            check(&cache, &upstream, &live, &streams);
        }
        drop(live);
        drop(cache);
        prop_assert_eq!(upstream.statistics().current_bytes, 0, "everything went back upstream on drop");
        prop_assert!(take_drop_errors().is_empty());
    }
}
