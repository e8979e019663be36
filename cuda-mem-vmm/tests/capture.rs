//! Stream capture: a virtual buffer dropped while its stream captures neither synchronizes that
//! stream (which would invalidate the capture on a GPU) nor unmaps memory the capture may use;
//! its release is deferred until the capture has ended, and happens at the next safe point
//! (`release_deferred`, the next allocation, the resource's drop). `close` refuses a capturing
//! stream and gives the buffer back. The same holds for plain buffers of the resource.
//!
//! Those captures are begun through the raw handle, which this crate cannot follow: the ranges
//! wait in the process-wide list. A capture begun through `Stream::begin_capture` takes the
//! range instead: it stays mapped as long as the graph (and every executable graph made from
//! it) lives, past the end of the capture and every safe point.

mod common;

use common::*;
use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUstreamCaptureMode, CUstreamCaptureStatus};
use cuda_mem_core::{CaptureMode, DropError, FillPattern, MemoryResourceExt, Stream, take_drop_errors};
use cuda_mem_vmm::{CloseError, VirtualMemoryResource, VmmError, release_deferred};
use cuda_sim::testing::LiveObjects;

/// Starts capturing `stream`, in relaxed mode (global mode would also police the calls other
/// threads make meanwhile).
fn begin_capture(stream: &Stream) {
    let d = cuda_sim::testing::driver().expect("the test driver loads");
    let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream handle (shared: captured through FFI, see `Stream::handle`) and a valid
    // capture mode.
    unsafe { cu_call!(d, cuStreamBeginCapture_v2(stream.shared_handle(), relaxed)) }.expect("the capture begins");
}

/// The capture status of `stream`, as the driver reports it.
fn capture_status(stream: &Stream) -> CUstreamCaptureStatus {
    let d = cuda_sim::testing::driver().expect("the test driver loads");
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer; a live stream handle.
    unsafe { cu_call!(d, cuStreamIsCapturing(stream.handle(), &mut status)) }.expect("the status is read");
    status
}

/// Ends the capture of `stream`, which must succeed (it fails for an invalidated capture), and
/// destroys the graph.
fn end_capture(stream: &Stream) {
    let d = cuda_sim::testing::driver().expect("the test driver loads");
    let mut graph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer; a live stream handle.
    unsafe { cu_call!(d, cuStreamEndCapture(stream.handle(), &mut graph)) }.expect("the capture ends intact");
    // SAFETY: the graph was just captured and is destroyed once.
    unsafe { cu_call!(d, cuGraphDestroy(graph)) }.expect("the graph is destroyed");
}

/// Asserts that no recorded error comes from synchronizing a stream, and that one says a release
/// was deferred.
#[track_caller]
fn assert_deferred_without_synchronizing(errors: &[DropError]) {
    let texts: Vec<String> = errors.iter().map(|e| e.error.to_string()).collect();
    assert!(!texts.iter().any(|t| t.contains("cuStreamSynchronize")), "a capturing stream was synchronized: {texts:?}");
    assert!(texts.iter().any(|t| t.contains("is deferred") && t.contains("capturing")), "recorded: {texts:?}");
}

const ACTIVE: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;

#[test]
fn a_buffer_dropped_during_a_capture_stays_mapped_until_the_capture_ends() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let _ = take_drop_errors();
        let mut buffer = resource.allocate(G, &s).unwrap();
        let grown = buffer.grow(2 * G).unwrap();
        begin_capture(&s);
        // The captured graph writes the memory: it must stay mapped while the graph may run.
        buffer.fill(FillPattern::U8(1), &s).unwrap();
        drop((buffer, grown));
        // (a) The capture was not disturbed: no synchronize on it, and it is still active.
        assert_deferred_without_synchronizing(&take_drop_errors());
        assert_eq!(capture_status(&s), ACTIVE);
        // (b) Nothing was unmapped, and a safe point during the capture keeps it so.
        let mapped = baseline.map(|b| plus(b, 2, 2, 2));
        assert_eq!(sim_live(), mapped, "both chunks stay mapped while the capture may use them");
        assert_eq!(release_deferred(), 2, "still capturing: both ranges are kept");
        assert_eq!(sim_live(), mapped);
        assert_eq!(capture_status(&s), ACTIVE, "the safe point did not synchronize the capturing stream");
        end_capture(&s);
        // Then released, at the next safe point.
        assert_eq!(release_deferred(), 0);
        assert_eq!(sim_live(), baseline, "released once the capture ended");
        assert!(take_drop_errors().is_empty());
    });
}

#[test]
fn the_next_allocation_and_the_resource_drop_release_deferred_memory() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let buffer = resource.allocate(G, &s).unwrap();
        begin_capture(&s);
        drop(buffer);
        end_capture(&s);
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)), "no safe point yet");
        // The next allocation releases it first.
        let next = resource.allocate(G, &s).unwrap();
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)), "the deferred range went, the new one came");
        begin_capture(&s);
        drop(next);
        end_capture(&s);
        // Dropping the resource releases it too.
        drop(resource);
        assert_eq!(sim_live(), baseline);
        assert_eq!(release_deferred(), 0);
        assert_deferred_without_synchronizing(&take_drop_errors());
    });
}

#[test]
fn close_refuses_a_capturing_stream_and_gives_the_buffer_back() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let other = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let buffer = resource.allocate(G, &s).unwrap();
        let bytes = pattern(7, 4096);
        write(&buffer, 0, &bytes, &s);

        begin_capture(&s);
        let Err(CloseError { error, buffer: Some(buffer) }) = buffer.close(None) else {
            panic!("closing on the capturing stream must be refused, with the buffer given back");
        };
        let buffer = *buffer;
        assert!(matches!(error, VmmError::CapturingStream), "{error:?}");
        assert_mentions(&error.to_string(), &["capturing stream", "once the capture has ended"]);
        assert_eq!(capture_status(&s), ACTIVE);
        end_capture(&s);

        // Closing on another stream that captures is refused too, and leaves the buffer's own
        // stream as it was.
        begin_capture(&other);
        let Err(CloseError { error, buffer: Some(buffer) }) = buffer.close(Some(&other)) else {
            panic!("closing on a capturing stream must be refused");
        };
        let buffer = *buffer;
        assert!(matches!(error, VmmError::CapturingStream), "{error:?}");
        assert_eq!(buffer.deallocation_stream(), Some(&s));
        end_capture(&other);

        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)));
        assert_eq!(read(&buffer, 0, 4096, &s), bytes, "the buffer given back still holds its bytes");
        buffer.close(Some(&other)).unwrap();
        assert_eq!(sim_live(), baseline, "closed once no capture is going on");
    });
}

#[test]
fn a_plain_buffer_of_the_resource_freed_during_a_capture_waits_for_its_end() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let _ = take_drop_errors();
        let mut dropped = MemoryResourceExt::allocate(&resource, 1000, &s).unwrap();
        let closed = resource.allocate_scoped(G + 1, &s).unwrap();
        begin_capture(&s);
        dropped.fill(FillPattern::U8(3), &s).unwrap();
        drop(dropped);
        // The release is handed to the resource (deferred), not refused: the buffer is gone and
        // the deferral is recorded, so nothing can free the range a second time.
        closed.close(None).unwrap();
        let errors = take_drop_errors();
        assert_eq!(errors.iter().filter(|e| e.error.to_string().contains("is deferred")).count(), 2, "{errors:?}");
        assert_deferred_without_synchronizing(&errors);
        assert_eq!(capture_status(&s), ACTIVE);
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 2, 2, 2)));
        end_capture(&s);
        assert_eq!(release_deferred(), 0);
        assert_eq!(sim_live(), baseline);
    });
}

#[test]
fn a_buffer_dropped_during_a_capture_of_this_crate_stays_mapped_while_its_graph_lives() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let _ = take_drop_errors();
        let mut buffer = resource.allocate(G, &s).unwrap();
        let plain = MemoryResourceExt::allocate(&resource, 1000, &s).unwrap();
        let capture = s.begin_capture(CaptureMode::Relaxed).unwrap();
        buffer.fill(FillPattern::U8(1), &s).unwrap();
        drop((buffer, plain));
        // Handed to the capture: not deferred, nothing recorded, the capture undisturbed.
        assert!(take_drop_errors().is_empty(), "handed to the capture, not deferred");
        assert!(capture.is_active().unwrap());
        let mapped = baseline.map(|b| plus(b, 2, 2, 2));
        assert_eq!(sim_live(), mapped);
        let graph = capture.end().unwrap();
        assert_eq!(graph.kept_alive(), 2);
        // Past the capture's end and every safe point, while the graph may still be launched.
        assert_eq!(release_deferred(), 0, "nothing in the process-wide list");
        let other = resource.allocate(G, &s).unwrap();
        drop(other);
        let with_graph = mapped.map(|m| LiveObjects { graphs: m.graphs + 1, ..m });
        assert_eq!(sim_live(), with_graph, "still mapped: the graph may still use it");
        drop(graph);
        assert_eq!(sim_live(), baseline, "unmapped with the graph");
        assert!(take_drop_errors().is_empty());
    });
}

/// A virtual buffer used by work captured on another stream, then dropped (or closed on its own
/// stream) during the capture: its release goes to that capture, so the freeing stream is not
/// drawn into it, the capture ends cleanly, and the memory stays mapped for the graph's launch.
#[test]
fn a_buffer_used_in_another_streams_capture_stays_mapped_for_its_graph() {
    machine!(&[], || {
        let d0 = device(0);
        let (own, capturing) = (stream(d0), stream(d0));
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let _ = take_drop_errors();
        let mut dropped = resource.allocate(G, &own).unwrap();
        let mut closed = resource.allocate(G, &own).unwrap();
        let mut output = resource.allocate(G, &capturing).unwrap();
        let capture = capturing.begin_capture(CaptureMode::Relaxed).unwrap();
        dropped.fill(FillPattern::U8(7), &capturing).unwrap();
        closed.fill(FillPattern::U8(7), &capturing).unwrap();
        output.copy_from(dropped.as_buffer(), &capturing).unwrap();
        drop(dropped);
        closed.close(Some(&own)).map_err(|e| e.error).expect("its own stream does not capture");
        assert!(take_drop_errors().is_empty(), "handed to the capture, not deferred");
        assert!(capture.is_active().unwrap(), "the capture undisturbed");
        let graph = capture.end().expect("the freeing stream was not drawn into the capture");
        assert_eq!(graph.kept_alive(), 2);
        assert_eq!(release_deferred(), 0);
        let exec = graph.instantiate(Default::default()).unwrap();
        drop(graph);
        // SAFETY: `output` lives on; the two released buffers are the graph's to keep.
        unsafe { exec.launch(&capturing) }.unwrap();
        assert!(
            output.as_buffer().to_vec::<u8>(&capturing).unwrap().iter().all(|&b| b == 7),
            "the graph ran on mapped memory"
        );
        drop((exec, output));
        own.synchronize().unwrap();
        assert_eq!(release_deferred(), 0);
        assert_eq!(sim_live(), baseline, "unmapped with the last graph");
        assert!(take_drop_errors().is_empty());
    });
}
