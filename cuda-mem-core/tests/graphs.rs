//! Every resource of this crate on a capturing stream, and `GraphMemoryResource`'s checks.
//!
//! Decided: the pools (device, pinned, managed; created or current) refuse to allocate on a
//! capturing stream (`Error::CapturingStream`: they would allocate outside the graph); so do
//! the resources without pools (`cuMemAlloc`, `cuMemAllocHost`), whose frees wait for the stream
//! (waiting for a capturing stream invalidates its capture), and a buffer of theirs freed on a
//! capturing stream is freed only once the capture's graphs are gone (a capture begun through
//! `Stream::begin_capture`) or not at all (a capture this crate cannot follow: refused, the
//! memory kept); the capture is never disturbed. Adaptors do what the resource under them does.
//! `GraphMemoryResource` is the one that allocates on a capturing stream, and only there.
//! Captures are relaxed: in global mode a real driver polices the calls other tests of this
//! binary make on other threads meanwhile.

mod common;

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUresult, CUstreamCaptureMode};
use cuda_mem_core::{
    CaptureMode, DeviceMemoryResource, Error, GraphMemoryResource, LegacyPinnedMemoryResource, LimitingAdaptor,
    ManagedMemoryResource, MemoryResource, MemoryResourceExt, PinnedMemoryResource, PoolResource, StatisticsAdaptor,
    Stream, SynchronousMemoryResource, TrackingAdaptor, take_drop_errors,
};
use cuda_sim::testing::{in_simulated_machine, live_objects_if_simulated};

/// The simulator's live allocations, where it counts them (`None` on a real driver).
fn allocations() -> Option<u64> {
    live_objects_if_simulated().map(|live| live.allocations)
}

/// Asserts that `result` is the refusal of a capturing stream.
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: cuda_mem_core::Result<T>, what: &str) {
    let error = result.expect_err(what);
    assert!(matches!(error, Error::CapturingStream), "{what}: {error}");
    assert!(error.to_string().contains("GraphMemoryResource"), "{error}");
}

#[test]
fn every_pool_and_legacy_resource_refuses_a_capturing_stream_without_disturbing_it() {
    let device = common::device();
    let stream = common::stream(device);
    let resources: Vec<(&str, Arc<dyn MemoryResource>)> = vec![
        ("device pool", DeviceMemoryResource::new(device, Default::default()).unwrap()),
        ("current device pool", DeviceMemoryResource::current(device).unwrap()),
        ("pinned pool", PinnedMemoryResource::new(Default::default()).unwrap()),
        ("current pinned pool", PinnedMemoryResource::current().unwrap()),
        ("managed pool", ManagedMemoryResource::new(Default::default()).unwrap()),
        ("cuMemAlloc", SynchronousMemoryResource::new(device)),
        ("cuMemAllocHost", LegacyPinnedMemoryResource::new(device)),
    ];
    let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
    for (what, resource) in &resources {
        assert_refused(resource.allocate(4096, &stream), what);
        // Adaptors over it refuse the same way, and count nothing.
        let counted = StatisticsAdaptor::new(Arc::clone(resource));
        assert_refused(counted.allocate(4096, &stream), what);
        assert_eq!(counted.statistics().current_bytes, 0, "{what}");
        let limited = LimitingAdaptor::new(Arc::clone(resource), 1 << 20);
        assert_refused(limited.allocate(4096, &stream), what);
        let tracked = TrackingAdaptor::new(Arc::clone(resource));
        assert_refused(tracked.allocate(4096, &stream), what);
        assert!(capture.is_active().unwrap(), "{what}: the capture was not disturbed");
    }
    drop(capture.end().expect("the capture ends intact"));
    for (what, resource) in &resources {
        assert!(resource.allocate(4096, &stream).is_ok(), "{what}: allocates once the capture is over");
    }
}

#[test]
fn legacy_buffers_freed_into_a_capture_of_this_crate_go_with_its_graph() {
    in_simulated_machine("legacy_buffers_freed_into_a_capture_of_this_crate_go_with_its_graph", &[], || {
        let device = common::device();
        let stream = common::stream(device);
        let baseline = allocations();
        let on_device = SynchronousMemoryResource::new(device).allocate(4096, &stream).unwrap();
        let on_host = LegacyPinnedMemoryResource::new(device).allocate(4096, &stream).unwrap();
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        drop((on_device, on_host));
        assert!(capture.is_active().unwrap(), "the frees did not wait for the capturing stream");
        assert!(take_drop_errors().is_empty(), "handed over, not refused");
        assert_eq!(allocations(), baseline.map(|n| n + 2), "kept while a graph may use them");
        let graph = capture.end().unwrap();
        assert_eq!(graph.kept_alive(), 2);
        assert_eq!(allocations(), baseline.map(|n| n + 2));
        drop(graph);
        assert_eq!(allocations(), baseline, "freed with the graph");
        assert!(take_drop_errors().is_empty());
    });
}

#[test]
fn legacy_buffers_freed_into_a_capture_of_other_code_are_kept() {
    in_simulated_machine("legacy_buffers_freed_into_a_capture_of_other_code_are_kept", &[], || {
        let device = common::device();
        let d = cuda_sim::testing::driver().unwrap();
        let stream = common::stream(device);
        let baseline = allocations();
        let buffer = SynchronousMemoryResource::new(device).allocate(4096, &stream).unwrap();
        let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a live stream handle and a valid capture mode.
        unsafe { cu_call!(d, cuStreamBeginCapture_v2(stream.shared_handle(), relaxed)) }.unwrap();
        drop(buffer);
        let errors = take_drop_errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(matches!(errors[0].error, Error::CapturingStream), "{:?}", errors[0]);
        let mut graph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; the stream captures.
        unsafe { cu_call!(d, cuStreamEndCapture(stream.handle(), &mut graph)) }.expect("the capture ends intact");
        // SAFETY: the graph was just captured and is destroyed once.
        unsafe { cu_call!(d, cuGraphDestroy(graph)) }.unwrap();
        assert_eq!(allocations(), baseline.map(|n| n + 1), "never freed under a capture");
    });
}

#[test]
fn graph_memory_is_interned_per_device_and_device_only() {
    let device = common::device();
    let a = GraphMemoryResource::new(device);
    let b = GraphMemoryResource::new(device);
    assert!(Arc::ptr_eq(&a, &b), "one per device in the process");
    assert_eq!(a.device(), device);
    assert!(a.is_device_accessible());
    assert!(!a.is_host_accessible());
    assert_eq!(MemoryResource::device(&*a), Some(device));
    assert!(!a.is_managed());
}

#[test]
fn graph_memory_refuses_a_stream_that_is_not_capturing() {
    let device = common::device();
    let stream = common::stream(device);
    let graph_memory = GraphMemoryResource::new(device);
    let error = graph_memory.allocate(4096, &stream).unwrap_err();
    assert!(matches!(error, Error::NotCapturing { invalidated: false }), "{error}");
    assert!(error.to_string().contains("begin a capture"), "{error}");
    // Through an adaptor too; a zero-byte buffer asks nothing of the resource.
    let counted = StatisticsAdaptor::new(Arc::clone(&graph_memory));
    assert!(matches!(counted.allocate(64, &stream), Err(Error::NotCapturing { .. })));
    assert!(graph_memory.allocate(0, &stream).unwrap().is_empty());
    // The legacy default stream cannot capture at all.
    let legacy = Stream::legacy_default(device);
    assert!(matches!(graph_memory.allocate(64, &legacy), Err(Error::NotCapturing { invalidated: false })));
    // An invalidated capture is not one to allocate in.
    let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
    assert!(stream.synchronize().is_err(), "waiting for a capturing stream invalidates it");
    let error = graph_memory.allocate(4096, &stream).unwrap_err();
    assert!(matches!(error, Error::NotCapturing { invalidated: true }), "{error}");
    assert!(error.to_string().contains("invalidated"), "{error}");
    let ended = capture.end().unwrap_err();
    assert_eq!(ended.cuda_code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
}

#[test]
fn graph_memory_refuses_a_stream_of_another_device() {
    in_simulated_machine("graph_memory_refuses_a_stream_of_another_device", &[("CUDA_SIM_DEVICES", "2")], || {
        let Some(devices) = common::devices(2) else { return };
        let stream = common::stream(devices[1]);
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        let error = GraphMemoryResource::new(devices[0]).allocate(64, &stream).unwrap_err();
        assert!(matches!(error, Error::StreamOfAnotherDevice { resource: 0, stream: 1 }), "{error}");
        assert!(capture.is_active().unwrap());
        drop(capture.end().unwrap());
    });
}

/// A pool buffer used by work captured on another stream and dropped during the capture, on
/// its own stream: the free goes to the capture (ordering it the usual way would draw its
/// stream into the capture, `STREAM_CAPTURE_UNJOINED` at the end, and free the memory under the
/// graph), and is done only once the graph and its executable graph are gone.
#[test]
fn a_buffer_used_in_another_streams_capture_is_freed_after_its_graphs() {
    let device = common::device();
    let (own, capturing) = (common::stream(device), common::stream(device));
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut output = pool.allocate(64, &capturing).unwrap();
    let mut buffer = pool.allocate(64, &own).unwrap();
    buffer.fill(cuda_mem_core::FillPattern::U32(0), &own).unwrap();
    own.synchronize().unwrap();
    let used = |pool: &DeviceMemoryResource| pool.usage().unwrap().used_bytes;
    let both = used(&pool);

    let capture = capturing.begin_capture(CaptureMode::Relaxed).unwrap();
    buffer.fill(cuda_mem_core::FillPattern::U32(0xC0FFEE), &capturing).unwrap();
    output.copy_from(&buffer, &capturing).unwrap();
    drop(buffer);
    assert!(capture.is_active().unwrap(), "the free neither waited for nor joined the capture");
    let graph = capture.end().expect("the freeing stream was not drawn into the capture");
    assert_eq!(graph.kept_alive(), 1, "the free went to the capture");
    let exec = graph.instantiate(Default::default()).unwrap();
    drop(graph);
    assert_eq!(used(&pool), both, "still allocated for the executable graph");
    // SAFETY: `output` lives on, unlent; the dropped buffer is the graph's to keep.
    unsafe { exec.launch(&capturing) }.unwrap();
    assert_eq!(output.to_vec::<u32>(&capturing).unwrap(), vec![0xC0FFEE; 16]);
    drop(exec);
    own.synchronize().unwrap();
    assert!(used(&pool) < both, "freed with the last graph");
    assert!(take_drop_errors().is_empty());
}

/// The same with a buffer that borrows its pool (`allocate_scoped`): it cannot outlive the
/// borrow, so it is not freed at all (refused, recorded) rather than under the graph.
#[test]
fn a_scoped_buffer_used_in_another_streams_capture_is_kept_not_freed_under_it() {
    let device = common::device();
    let (own, capturing) = (common::stream(device), common::stream(device));
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let buffer = {
        let mut buffer = pool.allocate_scoped(64, &own).unwrap();
        let capture = capturing.begin_capture(CaptureMode::Relaxed).unwrap();
        buffer.fill(cuda_mem_core::FillPattern::U32(1), &capturing).unwrap();
        let closed = buffer.close(None);
        let error = closed.expect_err("refused while the capture may use it");
        assert!(matches!(error.error(), Error::CapturingStream), "{}", error.error());
        let graph = capture.end().expect("the capture was not disturbed");
        drop(graph);
        error.into_parts().0
    };
    // The capture is over: the buffer closes the usual way.
    buffer.close(None).map_err(|e| e.into_parts().1).unwrap();
    own.synchronize().unwrap();
    assert_eq!(pool.usage().unwrap().used_bytes, 0);
}
