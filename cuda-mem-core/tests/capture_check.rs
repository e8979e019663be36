//! The capture check of every allocation, elided where the stream's capture is known: a pool
//! (or a resource without one) refuses a capturing stream on every path, asking the driver
//! (`cuStreamIsCapturing`) only where this crate cannot know.
//!
//! Each test runs in a process of its own (`in_simulated_machine`): the simulator counts the
//! calls of every thread, and the counts here are of one thread's allocations. On a real driver,
//! which counts nothing, the refusals are checked and the counts are not.

mod common;

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUresult, CUstream, CUstreamCaptureMode};
use cuda_mem_core::{
    CaptureMode, CaptureState, DeviceMemoryResource, Error, MemoryResourceExt, Stream, StreamOptions,
    SynchronousMemoryResource,
};
use cuda_sim::testing::{CountedIfSimulated, count_calls_if_simulated, driver, in_simulated_machine};

/// The capture query, whose calls are counted.
const QUERY: &str = "cuStreamIsCapturing";

/// Allocates and frees 256 bytes from `pool` on `stream`, as `Buffer` and as `ScopedBuffer`:
/// the outcome of the first allocation (both the same), and the driver calls made.
fn allocate_both(pool: &Arc<DeviceMemoryResource>, stream: &Stream) -> (cuda_mem_core::Result<()>, CountedIfSimulated) {
    count_calls_if_simulated(|| {
        let owned = pool.allocate(256, stream).map(drop);
        let scoped = pool.allocate_scoped(256, stream).map(drop);
        assert_eq!(owned.is_ok(), scoped.is_ok(), "Buffer and ScopedBuffer agree: {owned:?} {scoped:?}");
        owned
    })
}

/// Asserts that `outcome` is the refusal of a capturing stream.
#[track_caller]
fn assert_refused(outcome: cuda_mem_core::Result<()>, what: &str) {
    let error = outcome.expect_err(what);
    assert!(matches!(error, Error::CapturingStream), "{what}: {error}");
}

/// Begins a relaxed capture on `handle` through FFI, as code outside this crate would.
fn begin_raw_capture(handle: CUstream) {
    let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream handle of this test and a valid mode.
    unsafe { cu_call!(driver().unwrap(), cuStreamBeginCapture_v2(handle, relaxed)) }.unwrap();
}

/// Ends the capture begun by [`begin_raw_capture`] and destroys its graph.
fn end_raw_capture(handle: CUstream) {
    let d = driver().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the stream captures.
    unsafe { cu_call!(d, cuStreamEndCapture(handle, &mut graph)) }.expect("the capture ends intact");
    // SAFETY: the graph was just captured and is destroyed once.
    unsafe { cu_call!(d, cuGraphDestroy(graph)) }.unwrap();
}

/// A pool, its first allocation on `stream` made (what is retained once per process).
fn pool(stream: &Stream) -> Arc<DeviceMemoryResource> {
    let pool = DeviceMemoryResource::new(stream.device(), Default::default()).unwrap();
    drop(pool.allocate(256, stream).unwrap());
    drop(Stream::legacy_default(stream.device()).synchronize());
    pool
}

#[test]
fn streams_of_this_crate_allocate_and_refuse_without_asking_the_driver() {
    in_simulated_machine("streams_of_this_crate_allocate_and_refuse_without_asking_the_driver", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let pool = pool(&stream);
        let (outcome, counts) = allocate_both(&pool, &stream);
        outcome.unwrap();
        counts.assert_calls(QUERY, 0, "known not to capture");
        counts.assert_calls("cuMemAllocFromPoolAsync", 2, "");
        // The resource without a pool too (its synchronous free asks the driver: it waits for
        // the stream anyway).
        let (allocated, counts) =
            count_calls_if_simulated(|| SynchronousMemoryResource::new(device).allocate(256, &stream));
        drop(allocated.unwrap());
        counts.assert_calls(QUERY, 0, "");

        // A capture begun through a clone: every clone refuses at once, in every mode.
        let clone = stream.clone();
        for mode in [CaptureMode::Relaxed, CaptureMode::ThreadLocal, CaptureMode::Global] {
            let capture = clone.begin_capture(mode).unwrap();
            let (outcome, counts) = allocate_both(&pool, &stream);
            assert_refused(outcome, "a clone's capture");
            counts.assert_calls(QUERY, 0, "");
            counts.assert_calls("cuMemAllocFromPoolAsync", 0, "refused before the allocation");
            let (refused, counts) =
                count_calls_if_simulated(|| SynchronousMemoryResource::new(device).allocate(256, &clone));
            assert!(matches!(refused, Err(Error::CapturingStream)), "{refused:?}");
            counts.assert_total(0, "refused before any driver call");
            assert!(capture.is_active().unwrap(), "{mode:?}: the capture was not disturbed");
            drop(capture.end().unwrap());
            let (outcome, counts) = allocate_both(&pool, &stream);
            outcome.unwrap();
            counts.assert_calls(QUERY, 0, "known again once it ended");
        }
    });
}

#[test]
fn an_invalidated_capture_is_refused_until_it_ends() {
    in_simulated_machine("an_invalidated_capture_is_refused_until_it_ends", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let pool = pool(&stream);
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        // Waiting for a capturing stream invalidates its capture; the driver still counts it as
        // capturing until it ends.
        assert!(stream.synchronize().is_err());
        assert!(!capture.is_active().unwrap() && stream.is_capturing().unwrap());
        let (outcome, counts) = allocate_both(&pool, &stream);
        assert_refused(outcome, "an invalidated capture");
        counts.assert_calls(QUERY, 0, "");
        let ended = capture.end().unwrap_err();
        assert_eq!(ended.cuda_code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), "{ended}");
        assert_eq!(stream.capture_state(), CaptureState::NotCapturing, "the driver ended it");
        let (outcome, counts) = allocate_both(&pool, &stream);
        outcome.unwrap();
        counts.assert_calls(QUERY, 0, "");
    });
}

#[test]
fn streams_from_raw_handles_are_asked_and_refused_when_captured_by_other_code() {
    in_simulated_machine("streams_from_raw_handles_are_asked_and_refused_when_captured_by_other_code", &[], || {
        let device = common::device();
        let owned = common::stream(device);
        let pool = pool(&owned);
        // SAFETY: `owned` outlives the wrapper.
        let raw = unsafe { Stream::from_raw(owned.handle(), device) };
        let (outcome, counts) = allocate_both(&pool, &raw);
        outcome.unwrap();
        counts.assert_calls(QUERY, 2, "unknown: asked on every allocation");
        begin_raw_capture(raw.handle());
        let (outcome, counts) = allocate_both(&pool, &raw);
        assert_refused(outcome, "a raw stream captured through FFI");
        counts.assert_calls(QUERY, 2, "");
        // A raw stream waits for its capture's events: our stream joining them is asked too.
        let event = raw.record_event().unwrap();
        let joined = common::stream(device);
        joined.wait(&event).unwrap();
        assert_eq!(joined.capture_state(), CaptureState::Unknown);
        // The driver follows the join: asked, it says the stream captures, and the allocation is
        // refused.
        let (outcome, counts) = allocate_both(&pool, &joined);
        assert_refused(outcome, "a stream that joined a capture through a raw stream's event");
        counts.assert_calls(QUERY, 2, "joined a capture it cannot follow: asked on each allocation");
        // The joined stream rejoins the origin, or the capture cannot end.
        raw.wait(&joined.record_event().unwrap()).unwrap();
        end_raw_capture(raw.handle());
        let (outcome, counts) = allocate_both(&pool, &raw);
        outcome.unwrap();
        counts.assert_calls(QUERY, 2, "still unknown: other code may capture it again");
    });
}

#[test]
fn a_shared_handle_makes_the_capture_unknown_for_good() {
    in_simulated_machine("a_shared_handle_makes_the_capture_unknown_for_good", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let pool = pool(&stream);
        let clone = stream.clone();
        let handle = clone.shared_handle();
        assert_eq!(stream.capture_state(), CaptureState::Unknown, "shared by the clones");
        begin_raw_capture(handle);
        let (outcome, counts) = allocate_both(&pool, &stream);
        assert_refused(outcome, "a capture begun through the shared handle");
        counts.assert_calls(QUERY, 2, "");
        end_raw_capture(handle);
        let (outcome, counts) = allocate_both(&pool, &stream);
        outcome.unwrap();
        counts.assert_calls(QUERY, 2, "never known again");
        // A capture of this crate's on it is known while under way, unknown after.
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        assert_refused(allocate_both(&pool, &stream).0, "a capture of this crate's");
        drop(capture.end().unwrap());
        assert_eq!(stream.capture_state(), CaptureState::Unknown);
    });
}

#[test]
fn waiting_for_an_event_of_a_capture_makes_the_driver_decide_until_it_says_no_capture() {
    in_simulated_machine(
        "waiting_for_an_event_of_a_capture_makes_the_driver_decide_until_it_says_no_capture",
        &[],
        || {
            let device = common::device();
            let origin = common::stream(device);
            let joined = common::stream(device);
            let pool = pool(&joined);
            let capture = origin.begin_capture(CaptureMode::Relaxed).unwrap();
            let fork = origin.record_event().unwrap();
            joined.wait(&fork).unwrap();
            // The driver follows the join: asked, it says the stream captures.
            assert_eq!(joined.capture_state(), CaptureState::Unknown, "joined a capture it cannot follow");
            let (outcome, counts) = allocate_both(&pool, &joined);
            assert_refused(outcome, "a stream that joined a capture");
            counts.assert_calls(QUERY, 2, "asked on each allocation while joined");
            assert_eq!(joined.capture_state(), CaptureState::Unknown, "a capture begun elsewhere is not kept");
            // It rejoins the origin, or the capture cannot end; once it ended, the driver is
            // asked again and says "not capturing".
            origin.wait(&joined.record_event().unwrap()).unwrap();
            drop(capture.end().unwrap());
            let (outcome, counts) = allocate_both(&pool, &joined);
            outcome.unwrap();
            counts.assert_calls(QUERY, 1, "asked once, then known not to capture");
            assert_eq!(joined.capture_state(), CaptureState::NotCapturing);
            let capture = origin.begin_capture(CaptureMode::Relaxed).unwrap();
            let fork = origin.record_event().unwrap();
            joined.wait(&fork).unwrap();
            if cuda_sim::testing::simulator_only("failing the capture query") {
                // The driver's answer is what decides, so a failure of the query is what the
                // allocation returns, and the state stays unknown.
                cuda_sim::testing::inject_failure(driver().unwrap(), c"cuStreamIsCapturing", 1).unwrap();
                let failed = pool.allocate(256, &joined).unwrap_err();
                assert_eq!(failed.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "asked the driver: {failed}");
                assert_eq!(joined.capture_state(), CaptureState::Unknown, "no answer, still unknown");
            }
            origin.wait(&joined.record_event().unwrap()).unwrap();
            drop(capture.end().unwrap());
            joined.wait(&fork).unwrap();
            assert_eq!(joined.capture_state(), CaptureState::Unknown, "an event of a capture, ended or not");
            // An event recorded on a stream whose capture is unknown is as good as one of a
            // capture.
            let unknown = Stream::per_thread_default(device);
            let event = unknown.record_event().unwrap();
            drop(pool.allocate(256, &joined).unwrap());
            assert_eq!(joined.capture_state(), CaptureState::NotCapturing, "confirmed by the driver");
            joined.wait(&event).unwrap();
            assert_eq!(joined.capture_state(), CaptureState::Unknown);
            let (_, counts) = allocate_both(&pool, &joined);
            counts.assert_calls(QUERY, 1, "asked once, then known");
            // An event recorded outside any capture leaves the state known.
            let plain = origin.record_event().unwrap();
            joined.wait(&plain).unwrap();
            assert_eq!(joined.capture_state(), CaptureState::NotCapturing);
        },
    );
}

#[test]
fn the_per_thread_default_stream_is_always_asked() {
    in_simulated_machine("the_per_thread_default_stream_is_always_asked", &[], || {
        let device = common::device();
        let stream = Stream::per_thread_default(device);
        let pool = pool(&stream);
        for _ in 0..2 {
            let (outcome, counts) = allocate_both(&pool, &stream);
            outcome.unwrap();
            counts.assert_calls(QUERY, 2, "other code may capture it");
        }
        assert_eq!(stream.capture_state(), CaptureState::Unknown, "never known");
        if !cuda_sim::testing::simulator_only("failing the capture query") {
            return;
        }
        // The driver's answer decides.
        cuda_sim::testing::inject_failure(driver().unwrap(), c"cuStreamIsCapturing", 1).unwrap();
        let failed = pool.allocate(256, &stream).unwrap_err();
        assert_eq!(failed.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{failed}");
    });
}

#[test]
fn the_legacy_stream_is_asked_while_a_blocking_stream_captures() {
    in_simulated_machine("the_legacy_stream_is_asked_while_a_blocking_stream_captures", &[], || {
        let device = common::device();
        let legacy = Stream::legacy_default(device);
        let pool = pool(&legacy);
        assert_eq!(legacy.capture_state(), CaptureState::NotCapturing, "it cannot capture");
        let blocking = Stream::new(device, StreamOptions::default()).unwrap();
        let capture = blocking.begin_capture(CaptureMode::Relaxed).unwrap();
        // Using the legacy stream would join the capture implicitly: the query is refused
        // without harm where the allocation would invalidate the capture.
        let refused = pool.allocate(256, &legacy).unwrap_err();
        assert_eq!(refused.cuda_code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), "{refused}");
        assert!(capture.is_active().unwrap(), "the capture was not disturbed");
        drop(capture.end().unwrap());
        let (outcome, counts) = allocate_both(&pool, &legacy);
        outcome.unwrap();
        counts.assert_calls(QUERY, 2, "");
    });
}

#[test]
fn a_global_capture_on_another_stream_leaves_pool_allocation_alone() {
    in_simulated_machine("a_global_capture_on_another_stream_leaves_pool_allocation_alone", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let pool = pool(&stream);
        let other = common::stream(device);
        let capture = other.begin_capture(CaptureMode::Global).unwrap();
        // `cuMemAllocFromPoolAsync` is stream-ordered, not one of the calls a global capture
        // prohibits on other streams and threads: the driver, asked, would say "not capturing"
        // of this stream too.
        let (outcome, counts) = allocate_both(&pool, &stream);
        outcome.unwrap();
        counts.assert_calls(QUERY, 0, "");
        assert!(!stream.is_capturing().unwrap());
        std::thread::scope(|scope| {
            scope.spawn(|| {
                device.set_current().unwrap();
                assert!(pool.allocate(256, &stream).is_ok(), "nor on another thread");
            });
        });
        assert!(capture.is_active().unwrap(), "the capture was not disturbed");
        drop(capture.end().unwrap());
    });
}
