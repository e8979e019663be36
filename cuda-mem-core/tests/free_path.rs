//! The free of a buffer: one used only on the stream it is freed on makes the two driver calls
//! of a raw pair and nothing else (no event, no wait); one used on another stream still orders
//! its free after that stream's work.
//!
//! Each test runs in a process of its own (`in_simulated_machine`): the simulator counts the
//! calls of every thread, and the counts here are of one thread's buffers. On a real driver,
//! which counts nothing, the order of the free is checked and the counts are not.

mod common;

use std::sync::Arc;

use common::{Gate, OPEN_DELAY, hold};
use cuda_mem_core::{
    DeviceMemoryResource, FillPattern, MemoryResourceExt, PoolResource, ScopedBuffer, Stream, take_drop_errors,
};
use cuda_sim::testing::{CountedIfSimulated, count_calls_if_simulated, in_simulated_machine};

/// Pairs timed per kind of buffer.
const PAIRS: u32 = 8;

/// A pool, its first allocation on `stream` made (what is retained once per process).
fn pool(stream: &Stream) -> Arc<DeviceMemoryResource> {
    let pool = DeviceMemoryResource::new(stream.device(), Default::default()).unwrap();
    drop(pool.allocate(256, stream).unwrap());
    stream.synchronize().unwrap();
    pool
}

/// Asserts that `counts` are `pairs` allocations and frees from a pool and nothing else.
#[track_caller]
fn assert_only_pairs(counts: &CountedIfSimulated, pairs: u32, what: &str) {
    counts.assert_calls("cuMemAllocFromPoolAsync", pairs, what);
    counts.assert_calls("cuMemFreeAsync", pairs, what);
    counts.assert_total(2 * pairs, &format!("{what}: nothing but the pairs"));
}

#[test]
fn a_buffer_used_only_on_its_own_stream_makes_just_the_two_driver_calls() {
    in_simulated_machine("a_buffer_used_only_on_its_own_stream_makes_just_the_two_driver_calls", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let pool = pool(&stream);
        let (_, counts) = count_calls_if_simulated(|| {
            for _ in 0..PAIRS {
                drop(pool.allocate(4096, &stream).unwrap());
            }
        });
        assert_only_pairs(&counts, PAIRS, "Buffer");
        let (_, counts) = count_calls_if_simulated(|| {
            for _ in 0..PAIRS {
                drop(pool.allocate_scoped(4096, &stream).unwrap());
            }
        });
        assert_only_pairs(&counts, PAIRS, "ScopedBuffer");
        // Work on its own stream (and a clone of it, the same stream) orders nothing either:
        // the stream's own order puts the free after it.
        let clone = stream.clone();
        let (_, counts) = count_calls_if_simulated(|| {
            let mut buffer = pool.allocate(4096, &stream).unwrap();
            buffer.fill(FillPattern::U8(7), &stream).unwrap();
            buffer.fill(FillPattern::U8(8), &clone).unwrap();
            buffer.close(None).unwrap();
        });
        counts.assert_calls("cuMemsetD8Async", 2, "");
        counts.assert_total(4, "the pair and the two fills, no event");
        stream.synchronize().unwrap();
        assert!(take_drop_errors().is_empty());
    });
}

/// Allocates with `allocate` on `home`, uses the buffer on `other` behind a gate, drops it, and
/// checks that the free (on `home`) waited for `other`'s work, through one event recorded on
/// `other` and waited for by `home`.
fn free_follows_other_stream<'a>(
    home: &'a Stream,
    other: &Stream,
    allocate: impl FnOnce() -> ScopedBuffer<'a>,
    what: &str,
) {
    let mut buffer = allocate();
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, other.handle());
    buffer.fill(FillPattern::U32(0xfeed), other).unwrap();
    let (_, counts) = count_calls_if_simulated(|| drop(buffer));
    counts.assert_calls("cuEventRecord", 1, &format!("{what}: an event on the other stream"));
    counts.assert_calls("cuStreamWaitEvent", 1, &format!("{what}: waited for by the free's stream"));
    counts.assert_calls("cuMemFreeAsync", 1, what);
    gate.open_after(OPEN_DELAY);
    // The free went to `home` after `other`'s work: `home` is done only once the gate opened.
    home.synchronize().unwrap();
    assert!(gate.is_open(), "{what}: the memory was freed before the other stream's work on it");
    other.synchronize().unwrap();
    assert!(take_drop_errors().is_empty());
}

#[test]
fn a_buffer_used_on_a_second_stream_frees_after_that_streams_work() {
    in_simulated_machine("a_buffer_used_on_a_second_stream_frees_after_that_streams_work", &[], || {
        let device = common::device();
        let (home, other) = (common::stream(device), common::stream(device));
        let pool = pool(&home);
        free_follows_other_stream(&home, &other, || pool.allocate(4096, &home).unwrap(), "Buffer");
        free_follows_other_stream(&home, &other, || pool.allocate_scoped(4096, &home).unwrap(), "ScopedBuffer");
        assert_eq!(pool.usage().unwrap().live_allocations, 0);
    });
}
