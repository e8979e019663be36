//! A caching resource with expandable segments over the virtual memory resource: segments that
//! grow in place (their blocks keep their addresses and contents), free ends unmapped by
//! `trim`, sizes that change every step held in little more than they use, out of memory
//! answered by unmapping other streams' free memory, fault injection at every driver call, and
//! a model of any sequence of allocations and frees.

mod common;

use std::sync::Arc;

use common::{G, machine, sim_live, vmm_live};
use cuda_mem_core::{
    BlockUse, Buffer, CachingError, CachingOptions, CachingResource, DeviceMemoryResource, Error, FillPattern,
    PinnedMemoryResource, SizeClass, Stream, sys::types::CUresult, take_drop_errors,
};
use cuda_mem_vmm::VirtualMemoryResource;
use cuda_sim::testing::{count_calls, run_failing, simulator_only};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn expandable(reservation: usize) -> Arc<CachingResource> {
    let device = common::device(0);
    let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
    CachingResource::with_expandable_segments(vmm, CachingOptions::default().expandable_reservation(reservation))
        .unwrap()
}

/// The bytes of `buffer`, read through a pinned staging buffer.
fn contents(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let mut staging = PinnedMemoryResource::current().unwrap().allocate(buffer.size(), stream).unwrap();
    staging.copy_from(buffer, stream).unwrap();
    stream.synchronize().unwrap();
    staging.host_slice().unwrap().to_vec()
}

/// The one segment of `class`: its base, mapped size and reservation.
fn only_segment(cache: &CachingResource, class: SizeClass) -> (u64, usize, Option<usize>) {
    let segments: Vec<_> = cache.snapshot().into_iter().filter(|segment| segment.class == class).collect();
    assert_eq!(segments.len(), 1, "{segments:#?}");
    (segments[0].address, segments[0].size, segments[0].expandable_reservation)
}

/// Each request that no free block serves grows the stream's segment at its end by what it
/// lacks, in 2 MiB steps: one segment, earlier blocks where they were with their bytes, a chunk
/// mapped per growth. `trim` unmaps the chunks of the free end (not one a live block reaches
/// into), and `empty_cache` lets go of the whole range.
#[test]
fn a_segment_grows_in_place_and_trim_unmaps_its_free_end() {
    machine!(&[], || {
        let cache = expandable(64 * MIB);
        let before = sim_live();
        assert!(cache.has_expandable_segments());
        let stream = common::stream(common::device(0));
        let mut a = cache.allocate(3 * MIB, &stream).unwrap();
        a.fill(FillPattern::U8(0xa5), &stream).unwrap();
        let (base, mapped, reserved) = only_segment(&cache, SizeClass::Large);
        assert_eq!((a.ptr(), mapped, reserved), (base, 4 * MIB, Some(64 * MIB)));
        let b = cache.allocate(5 * MIB, &stream).unwrap();
        assert_eq!(b.ptr(), base + 3 * MIB as u64, "right after a: the free 1 MiB and 4 MiB more");
        let c = cache.allocate(12 * MIB, &stream).unwrap();
        assert_eq!(c.ptr(), base + 8 * MIB as u64);
        assert_eq!(only_segment(&cache, SizeClass::Large), (base, 20 * MIB, Some(64 * MIB)), "grown, not moved");
        assert!(contents(&a, &stream).iter().all(|&byte| byte == 0xa5), "a's bytes stay through the growths");
        let stats = cache.statistics();
        assert_eq!((stats.large.segments.current, stats.large.reserved_bytes.current), (1, 20 * MIB as u64));
        assert_eq!(
            sim_live(),
            before.map(|before| common::plus(before, 1, 3, 3)),
            "one reservation, a chunk per growth"
        );

        drop(c);
        assert_eq!(cache.trim(0).unwrap(), 12 * MIB, "the last chunk, all of it free");
        assert_eq!(only_segment(&cache, SizeClass::Large).1, 8 * MIB);
        drop(b);
        // Free from 3 MiB on: the 4 MiB chunk at 4 MiB goes, the first one (a is in it) stays.
        assert_eq!(cache.trim(0).unwrap(), 4 * MIB);
        assert_eq!(only_segment(&cache, SizeClass::Large).1, 4 * MIB);
        assert_eq!(cache.statistics().large.reserved_bytes.current, 4 * MIB as u64);
        let again = cache.allocate(6 * MIB, &stream).unwrap();
        assert_eq!(again.ptr(), base + 3 * MIB as u64, "it grows again where it shrank");
        drop((a, again));
        assert_eq!(cache.empty_cache().unwrap(), 10 * MIB);
        assert!(cache.snapshot().is_empty());
        assert_eq!(sim_live(), before, "the range is let go of");
        assert!(take_drop_errors().is_empty());
    });
}

/// The same allocations every step, their sizes changing from step to step (as a serving
/// batch's do): the expandable cache holds little more than the step's peak, where segments of
/// fixed size keep the ones too small for the next step's requests.
#[test]
fn sizes_that_change_every_step_are_held_in_little_more_than_they_use() {
    let device = common::device(0);
    let stream = common::stream(device);
    let fixed =
        CachingResource::new(DeviceMemoryResource::new(device, Default::default()).unwrap(), Default::default())
            .unwrap();
    let grown = expandable(1 << 30);
    for cache in [&fixed, &grown] {
        for step in 0..24usize {
            // A growing context: activations of changing sizes, some small blocks among them.
            let sizes = [3 * MIB + step * 700 * 1024, 512 * 1024, 7 * MIB + step * 300 * 1024, 64 * 1024, 11 * MIB];
            let live: Vec<Buffer> = sizes.iter().map(|&size| cache.allocate(size, &stream).unwrap()).collect();
            drop(live);
        }
    }
    let ratio = |cache: &CachingResource| {
        let all = cache.statistics().all;
        all.reserved_bytes.peak as f64 / all.allocated_bytes.peak as f64
    };
    assert!(ratio(&grown) <= 1.10, "expandable: reserved/allocated {}", ratio(&grown));
    assert!(ratio(&grown) < ratio(&fixed), "expandable {} against fixed {}", ratio(&grown), ratio(&fixed));
    assert_eq!(grown.statistics().large.segments.current, 1);
    drop((fixed, grown));
    assert!(take_drop_errors().is_empty());
}

/// By default one expandable segment per stream serves every size; with a small pool, small
/// requests get a segment of their own, as PyTorch's.
#[test]
fn small_requests_share_the_segment_unless_a_small_pool_is_asked_for() {
    let device = common::device(0);
    let stream = common::stream(device);
    let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
    let options = CachingOptions::default().expandable_reservation(64 * MIB);
    let shared = CachingResource::with_expandable_segments(vmm.clone(), options).unwrap();
    let split = CachingResource::with_expandable_segments(vmm, options.expandable_small_pool(true)).unwrap();
    for cache in [&shared, &split] {
        let large = cache.allocate(3 * MIB, &stream).unwrap();
        let small = cache.allocate(4096, &stream).unwrap();
        let segments = cache.snapshot();
        if cache.options().has_expandable_small_pool() {
            assert_eq!(segments.len(), 2);
            assert_eq!(cache.statistics().small.allocated_bytes.current, 4096);
        } else {
            assert_eq!(segments.len(), 1);
            assert_eq!(small.ptr(), large.ptr() + 3 * MIB as u64, "the small block follows the large one");
            assert_eq!(cache.statistics().small.segments.current, 0);
        }
        drop((large, small));
    }
    assert!(take_drop_errors().is_empty());
}

/// A stream whose growth the device has no memory for gets it once the other streams' free
/// memory is unmapped (a retry); with nothing left to unmap, the error says what is held and
/// carries the driver's out-of-memory code.
#[test]
fn out_of_memory_unmaps_free_memory_retries_once_then_says_what_is_held() {
    machine!(&[("CUDA_SIM_MEMORY", "64M")], || {
        if !simulator_only("a device of 64 MiB") {
            return;
        }
        let device = common::device(0);
        let (a, b) = (common::stream(device), common::stream(device));
        let cache = expandable(64 * MIB);
        drop(cache.allocate(40 * MIB, &a).unwrap());
        let on_b = cache.allocate(40 * MIB, &b).unwrap();
        let stats = cache.statistics();
        assert_eq!((stats.retries, stats.out_of_memory), (1, 0));
        assert_eq!(stats.all.reserved_bytes.current, 40 * MIB as u64, "a's segment went for it");
        assert_eq!(cache.stream_statistics(&a).map_or(0, |a| a.all.reserved_bytes.current), 0, "a holds nothing");
        let kept = cache.allocate(512, &b).unwrap();
        assert_eq!(kept.ptr(), on_b.ptr() + 40 * MIB as u64, "b's segment grew for it");
        let refused = cache.allocate(30 * MIB, &b).unwrap_err();
        let Error::Caching(CachingError::OutOfMemory(held)) = &refused else { panic!("{refused}") };
        assert_eq!(held.requested, 30 * MIB);
        assert_eq!(held.allocated, 40 * MIB as u64 + 512);
        assert_eq!(refused.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let stats = cache.statistics();
        assert_eq!((stats.retries, stats.out_of_memory), (1, 1), "no retry with nothing to unmap");
        drop((on_b, kept));
        assert!(take_drop_errors().is_empty());
    });
}

/// One run of the fault-injection scenario: a segment made and grown, a block freed on another
/// stream, a second stream's segment, a trim of a free end, and the drop.
fn scenario(vmm: &Arc<VirtualMemoryResource>, a: &Stream, b: &Stream) {
    let options = CachingOptions::default().expandable_reservation(32 * MIB);
    let Ok(cache) = CachingResource::with_expandable_segments(vmm.clone(), options) else { return };
    let run = || -> cuda_mem_core::Result<()> {
        let idle = || a.synchronize().and_then(|()| b.synchronize());
        let x = cache.allocate(3 * MIB, a)?;
        let mut y = cache.allocate(6 * MIB, a)?;
        y.fill(FillPattern::U8(1), b)?;
        y.set_deallocation_stream(b);
        drop(y);
        let _z = cache.allocate(64 * 1024, b)?;
        idle()?;
        let w = cache.allocate(12 * MIB, a)?;
        drop(w);
        cache.trim(0)?;
        drop(x);
        Ok(())
    };
    let _ = run();
    drop(cache);
}

#[test]
fn a_failure_at_any_driver_call_leaves_nothing_behind() {
    machine!(&[], || {
        if !simulator_only("fault injection") {
            return;
        }
        let driver = cuda_sim::testing::driver().unwrap();
        let device = common::device(0);
        let (a, b) = (common::stream(device), common::stream(device));
        let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
        let before = vmm_live();
        scenario(&vmm, &a, &b);
        assert_eq!(vmm_live(), before);
        let ((), calls) = count_calls(driver, || scenario(&vmm, &a, &b)).unwrap();
        assert!(take_drop_errors().is_empty());
        assert_eq!((calls.of("cuMemAddressReserve"), calls.of("cuMemCreate")), (2, 4), "{calls:?}");
        let (mut injected, mut base) = (0, before);
        for injection in calls.injections() {
            let ((), fired) = run_failing(driver, injection, || scenario(&vmm, &a, &b)).unwrap();
            assert!(fired, "{injection}: the scenario did not make that call");
            injected += 1;
            let errors = take_drop_errors();
            // A release that could not wait for its stream was deferred (and recorded): it goes
            // at the next safe point, here.
            cuda_mem_vmm::release_deferred();
            let now = vmm_live();
            if injection.is_releasing() {
                // A failed unmap or free keeps what it could not let go of, recorded; the next
                // run starts from there.
                assert!(now == base || !errors.is_empty(), "{injection}: memory kept without a record");
                base = now;
            } else {
                assert_eq!(now, base, "{injection}: memory left behind ({errors:?})");
            }
        }
        assert!(injected > 10);
    });
}

#[derive(Debug, Clone)]
enum Op {
    Allocate { size: usize, stream: usize },
    Free { index: usize },
    FreeOn { index: usize, stream: usize },
    EmptyCache,
    Trim { keep: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1 => Just(0usize), 5 => 1usize..=MIB + 4096, 3 => 1usize..24 * MIB];
    prop_oneof![
        6 => (size, 0usize..3).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        3 => any::<usize>().prop_map(|index| Op::Free { index }),
        2 => (any::<usize>(), 0usize..3).prop_map(|(index, stream)| Op::FreeOn { index, stream }),
        1 => Just(Op::EmptyCache),
        1 => (0usize..8 * MIB).prop_map(|keep| Op::Trim { keep }),
    ]
}

/// The cache against what it must hold: blocks tile the mapped part of their segments, live
/// blocks never overlap and each lies in one segment, the figures match the snapshot.
fn check(cache: &CachingResource, live: &[Buffer]) {
    let segments = cache.snapshot();
    let stats = cache.statistics();
    let (mut reserved, mut allocated) = (0u64, 0u64);
    for segment in &segments {
        let reservation = segment.expandable_reservation.expect("every segment is expandable");
        assert!(segment.size <= reservation && segment.size.is_multiple_of(G), "{segment:?}");
        reserved += segment.size as u64;
        let mut at = segment.address;
        for block in &segment.blocks {
            assert_eq!(block.address, at, "blocks tile their segment");
            at += block.size as u64;
            if let BlockUse::Allocated { requested } = block.state {
                allocated += block.size as u64;
                let buffer = live.iter().find(|b| b.ptr() == block.address).expect("a live buffer per block");
                assert_eq!(buffer.size(), requested);
            }
        }
        assert_eq!(at, segment.address + segment.size as u64, "growths and shrinks conserve bytes");
    }
    let mut spans: Vec<(u64, u64)> =
        live.iter().filter(|b| b.size() > 0).map(|b| (b.ptr(), b.ptr() + b.size() as u64)).collect();
    spans.sort();
    assert!(spans.windows(2).all(|pair| pair[0].1 <= pair[1].0), "live blocks overlap: {spans:?}");
    for (start, end) in &spans {
        let holding = segments.iter().filter(|s| s.address <= *start && *end <= s.address + s.size as u64).count();
        assert_eq!(holding, 1, "each live block lies in one segment");
    }
    assert_eq!((stats.all.reserved_bytes.current, stats.all.segments.current), (reserved, segments.len() as u64));
    assert_eq!(stats.all.allocated_bytes.current, allocated);
}

/// Any sequence of allocations and frees on three streams, with trims and `empty_cache`: the
/// cache stays consistent, and every range is let go of on drop.
#[test]
fn the_expandable_cache_matches_a_model_of_any_sequence() {
    machine!(&[], || {
        let device = common::device(0);
        let streams: Vec<Stream> = (0..3).map(|_| common::stream(device)).collect();
        let config = proptest::test_runner::Config { cases: 24, failure_persistence: None, ..Default::default() };
        let mut runner = proptest::test_runner::TestRunner::new(config);
        let ran = runner.run(&proptest::collection::vec(op(), 1..50), |ops| {
            let before = sim_live();
            let cache = expandable(48 * MIB);
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
                    Op::EmptyCache => {
                        cache.empty_cache().unwrap();
                    }
                    Op::Trim { keep } => {
                        cache.trim(keep).unwrap();
                    }
                }
                check(&cache, &live);
            }
            drop(live);
            drop(cache);
            prop_assert_eq!(sim_live(), before, "every range let go of on drop");
            prop_assert!(take_drop_errors().is_empty());
            Ok(())
        });
        if let Err(failure) = ran {
            panic!("{failure}");
        }
    });
}

/// A memory snapshot shows the cache's blocks and, below it, the virtual memory resource's
/// expandable range (what it maps of what it reserved) and its plain buffers.
#[test]
fn a_snapshot_shows_the_cache_over_the_virtual_memory_resource() {
    use cuda_mem_core::MemoryResourceExt;
    use cuda_mem_core::history::ResourceId;
    use cuda_mem_core::snapshot::{ResourceKind, take_snapshot};
    let device = common::device(0);
    let stream = common::stream(device);
    let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
    let options = CachingOptions::default().expandable_reservation(64 * MIB);
    let cache = CachingResource::with_expandable_segments(vmm.clone(), options).unwrap();
    let block = cache.allocate(3 * MIB, &stream).unwrap();
    let plain = MemoryResourceExt::allocate(&vmm, MIB, &stream).unwrap();
    let snapshot = take_snapshot();
    let cached = snapshot.resource(ResourceId::of(&*cache)).expect("the cache");
    assert_eq!(cached.upstream, Some(ResourceId::of(&*vmm).0));
    assert_eq!(cached.segments[0].reserved, Some(64 * MIB as u64));
    let virtual_memory = snapshot.resource(ResourceId::of(&*vmm)).expect("the virtual memory resource");
    assert_eq!(virtual_memory.kind, ResourceKind::VirtualMemory);
    let reserved: Vec<_> = virtual_memory.segments.iter().map(|s| (s.address, s.size, s.reserved)).collect();
    assert!(reserved.contains(&(cached.segments[0].address, 4 * MIB as u64, Some(64 * MIB as u64))), "{reserved:x?}");
    assert!(reserved.contains(&(plain.ptr(), G as u64, None)), "{reserved:x?}");
    assert_eq!(virtual_memory.used_bytes, (4 * MIB + MIB) as u64);
    drop((block, plain));
}
