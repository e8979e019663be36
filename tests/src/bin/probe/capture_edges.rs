//! Question 32: what `cuda.h` leaves open about captures, where the simulator
//! (`cuda_sim::conservative`, graphs) takes a reading: when a captured copy from pageable host
//! memory reads its source (at the capture or at each launch), what destroying a stream in the
//! middle of its capture does, whether a graph with memory nodes can be instantiated twice, and
//! whether a capturing stream may wait for an event recorded outside any capture.
//!
//! Every capture here is in relaxed mode, so that one a driver leaves behind cannot prohibit
//! the later questions' allocations.

use cuda_mem_sys::types::{CUdeviceptr, CUstream, CUstreamCaptureMode};
use cuda_mem_sys::{cu_call, driver};

use crate::capture::{end_described, short};
use crate::owned::{DeviceAllocation, OwnedEvent, OwnedStream, free_async};
use crate::raw::{Call, alloc_async, capture_status, code, memset_async, read_bytes, stream_wait_event};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "capture-edges",
    question: "A captured cuMemcpyHtoDAsync from pageable memory that is changed after the capture: what does a \
               launch copy? cuStreamDestroy of a stream during its capture (after a captured memset): its result and \
               the stream's capture status after? A second cuGraphInstantiate of a graph with alloc and free nodes \
               while the first exists? cuStreamWaitEvent on a capturing stream for an event recorded outside any \
               capture: its result, the capture's status and the graph's nodes?",
    run,
    child: None,
};

/// The bytes each copy and memset covers.
const SIZE: usize = 4096;

/// What the pageable source holds when the copy is captured, and after.
const AT_CAPTURE: u8 = 0x11;
const AFTER_CAPTURE: u8 = 0x22;

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let pageable = pageable_source(details)?;
    let destroyed = destroy_during_capture(details)?;
    let twice = instantiate_twice(details)?;
    let outside = wait_for_event_outside(details)?;
    Ok(format!(
        "pageable copy: {pageable}; stream destroyed while capturing: {destroyed}; second instantiation: {twice}; \
         wait for an event recorded outside: {outside}"
    ))
}

/// A captured pageable-to-device copy whose source changes between the capture and the launch.
fn pageable_source(details: &mut Details) -> Result<String, Error> {
    let device = DeviceAllocation::new(SIZE)?;
    let mut source = vec![AT_CAPTURE; SIZE];
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(RELAXED).map_err(|e| format!("beginning the capture: {e}"))?;
    let captured = copy_h_to_d_async(device.ptr(), &source, stream.raw());
    details.put("pageable.captured_copy", code(&captured));
    let (ended, graph) = stream.end_capture();
    details.put("pageable.end", code(&ended));
    if let Err(e) = captured.and(ended) {
        return Ok(format!("the capture {}", short(&crate::raw::error_code(e))));
    }
    source.fill(AFTER_CAPTURE);
    let exec = graph.instantiate().map_err(|e| format!("instantiating: {e}"))?;
    exec.launch(stream.raw()).and_then(|()| stream.synchronize()).map_err(|e| format!("launching: {e}"))?;
    let bytes = read_bytes(device.ptr(), SIZE)?;
    let answer = match bytes.first().copied() {
        _ if bytes.iter().any(|&b| b != bytes[0]) => "a mix of both".to_string(),
        Some(AT_CAPTURE) => "the bytes at capture time".to_string(),
        Some(AFTER_CAPTURE) => "the bytes at launch time".to_string(),
        other => format!("{other:?} throughout"),
    };
    details.put("pageable.launch_copied", &answer);
    // Keep the source alive until the launch has run (it was synchronized above).
    drop(source);
    Ok(answer)
}

/// A stream destroyed with a memset captured: the destroy's result and the status after (ended
/// properly when the driver refused the destroy).
fn destroy_during_capture(details: &mut Details) -> Result<String, Error> {
    let device = DeviceAllocation::new(SIZE)?;
    let d = driver()?;
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer; 1 is CU_STREAM_NON_BLOCKING.
    unsafe { cu_call!(d, cuStreamCreate(&mut stream, 1)) }?;
    // SAFETY: the stream was created just now.
    let begun = unsafe { cu_call!(d, cuStreamBeginCapture_v2(stream, RELAXED)) };
    let memset = begun.and_then(|()| memset_async(device.ptr(), 0x33, SIZE, stream));
    details.put("destroy.memset", code(&memset));
    // SAFETY: destroys the stream created above; on success it is not used again.
    let destroyed = unsafe { cu_call!(d, cuStreamDestroy_v2(stream)) };
    details.put("destroy.result", code(&destroyed));
    if destroyed.is_ok() {
        return Ok("ok".to_string());
    }
    // The driver kept the stream: end its capture and destroy it now.
    let status = capture_status(stream);
    details.put("destroy.status_after", &status);
    let mut graph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer and the stream is alive.
    let ended = unsafe { cu_call!(d, cuStreamEndCapture(stream, &mut graph)) };
    if !graph.is_null() {
        // SAFETY: the graph the capture returned, destroyed once.
        crate::owned::note_cleanup("destroying a graph", unsafe { cu_call!(d, cuGraphDestroy(graph)) });
    }
    // SAFETY: the stream is destroyed once, its capture ended.
    crate::owned::note_cleanup("destroying a stream", unsafe { cu_call!(d, cuStreamDestroy_v2(stream)) });
    Ok(format!("{}, the capture then {status}, end {}", short(&code(&destroyed)), short(&code(&ended))))
}

/// A graph with an allocation and a free node instantiated twice.
fn instantiate_twice(details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(RELAXED).map_err(|e| format!("beginning the capture: {e}"))?;
    let allocated = alloc_async(SIZE, stream.raw());
    let freed = match &allocated {
        Ok(ptr) => free_async(*ptr, stream.raw()),
        Err(_) => Ok(()),
    };
    details.put("twice.captured_alloc", code(&allocated));
    details.put("twice.captured_free", code(&freed));
    let (ended, graph) = stream.end_capture();
    if let Err(e) = allocated.map(|_| ()).and(freed).and(ended) {
        return Ok(format!("the capture {}", short(&crate::raw::error_code(e))));
    }
    let first = graph.instantiate();
    details.put("twice.first", code(&first));
    let second = graph.instantiate();
    details.put("twice.second", code(&second));
    Ok(format!("first {}, second {}", short(&code(&first)), short(&code(&second))))
}

/// A capturing stream waiting for an event another stream recorded outside any capture.
fn wait_for_event_outside(details: &mut Details) -> Result<String, Error> {
    let device = DeviceAllocation::new(SIZE)?;
    let other = OwnedStream::new(false)?;
    let event = OwnedEvent::new()?;
    memset_async(device.ptr(), 0x44, SIZE, other.raw())?;
    event.record(other.raw())?;
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(RELAXED).map_err(|e| format!("beginning the capture: {e}"))?;
    let call = code(&stream_wait_event(stream.raw(), event.raw()));
    Ok(end_described("outside", &stream, &call, details))
}

fn copy_h_to_d_async(dst: CUdeviceptr, src: &[u8], stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: `src` is `src.len()` readable bytes, kept alive by the caller until the copy (and
    // any launch of a graph that captured it) has run; `dst` is an allocation of that size.
    unsafe { cu_call!(d, cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), stream)) }
}
