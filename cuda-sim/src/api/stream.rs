//! Streams: creation, queries, synchronization, waits on events, host functions.

use std::ffi::c_void;
use std::sync::Arc;

use cuda_mem_sys::types::{
    CUcontext, CUevent, CUgraph, CUgraphNodeType, CUhostFn, CUresult, CUstream, CUstream_flags, CUstreamCaptureMode,
    CUstreamCaptureStatus,
};

use super::DefaultStream;
use super::context::PRIORITY_RANGE;
use crate::capture::{self, Ended};
use crate::context::{self as ctx, Context};
use crate::error::{SimResult, ensure, fail, write_out};
use crate::pool::Observed;
use crate::state::{self, State};
use crate::stream::{Stream, StreamKind};

/// `CU_STREAM_LEGACY`.
const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD: usize = 0x2;

/// Whether a stream handle names the legacy default stream (`CU_STREAM_LEGACY`, or 0 for a
/// function with legacy default-stream semantics).
pub(crate) fn names_legacy(stream: CUstream, mode: DefaultStream) -> bool {
    let handle = stream as usize;
    handle == STREAM_LEGACY || (handle == 0 && mode == DefaultStream::Legacy)
}

/// The context and stream a stream handle names. Handle 0 means the default stream `mode`
/// selects; the special handles and handle 0 need a current context.
pub(crate) fn resolve(state: &State, stream: CUstream, mode: DefaultStream) -> SimResult<(Arc<Context>, Arc<Stream>)> {
    let handle = stream as usize;
    let per_thread = match (handle, mode) {
        (0, DefaultStream::Legacy) | (STREAM_LEGACY, _) => false,
        (0, DefaultStream::PerThread) | (STREAM_PER_THREAD, _) => true,
        _ => {
            let stream = state.streams.get(&handle).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            let context = state.contexts.get(&stream.ctx).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            context.fault.check()?;
            return Ok((context, stream));
        }
    };
    let context = ctx::current(state)?;
    let stream = if per_thread { ctx::per_thread_stream(&context)? } else { Arc::clone(&context.legacy) };
    Ok((context, stream))
}

/// [`resolve`], for a call that enqueues work on the stream: refused when the stream's capture
/// was invalidated, or on the legacy stream while a blocking stream captures (see
/// [`capture::admit_work`]).
pub(crate) fn resolve_for_work(
    state: &State,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult<(Arc<Context>, Arc<Stream>)> {
    let (context, stream) = resolve(state, stream, mode)?;
    capture::admit_work(&context, &stream)?;
    Ok((context, stream))
}

/// `cuStreamCreate` / `cuStreamCreateWithPriority`: flags are `CU_STREAM_DEFAULT` or
/// `CU_STREAM_NON_BLOCKING`; the priority is clamped to the device's range, as documented.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn create(out: *mut CUstream, flags: u32, priority: i32) -> SimResult {
    ensure(flags & !CUstream_flags::CU_STREAM_NON_BLOCKING.0 == 0 && !out.is_null())?;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let priority = priority.clamp(PRIORITY_RANGE.1, PRIORITY_RANGE.0);
    let stream = Stream::start(context.handle, context.device, flags, priority, StreamKind::Created)?;
    context.register(&stream);
    let handle = stream.handle;
    state.streams.insert(handle, stream);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle as CUstream) }
}

/// `cuStreamDestroy_v2`: only created streams can be destroyed; work already enqueued still
/// completes. A capture under way ends with it (see [`discard_capture`]).
pub(crate) fn destroy(stream: CUstream) -> SimResult {
    let mut state = state::lock()?;
    let stream = state.streams.remove(&(stream as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    discard_capture(&mut state, &stream);
    Ok(())
}

/// Ends the capture under way on `stream` (being destroyed), if any, without a graph: its work
/// is discarded, the user object references its graph was given are released, and its graph
/// allocations' addresses stop being live (see `conservative`).
pub(crate) fn discard_capture(state: &mut State, stream: &Stream) {
    let Some((graph, nodes, allocs)) = stream.capture.abandon() else {
        return;
    };
    drop(nodes);
    for alloc in &allocs {
        state.memory.unmap_graph(alloc.base);
    }
    state.graph_user_objects.remove(&graph);
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while work is pending. Querying a capturing stream
/// invalidates its capture (see [`capture::admit_wait`]).
pub(crate) fn query(stream: CUstream, mode: DefaultStream) -> SimResult {
    let (context, stream) = resolve(&*state::lock()?, stream, mode)?;
    capture::admit_wait(&context, &stream)?;
    if !stream.queue.is_idle() {
        return fail(CUresult::CUDA_ERROR_NOT_READY);
    }
    // Work that completed may have faulted.
    context.fault.check()?;
    // The host has seen the stream's work complete, its frees included.
    state::lock()?.observe(&[Observed::Stream(stream.handle)]);
    Ok(())
}

/// `cuStreamSynchronize`: waits for everything enqueued before it (for the legacy stream, that
/// includes earlier work on blocking streams, which its implicit waits order before it). On a
/// capturing stream it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the capture
/// (see [`capture::admit_wait`]).
pub(crate) fn synchronize(stream: CUstream, mode: DefaultStream) -> SimResult {
    let (context, stream) = resolve(&*state::lock()?, stream, mode)?;
    capture::admit_wait(&context, &stream)?;
    context.wait_as_if_submitted(&stream);
    // The work waited for may have faulted: its error is the synchronization's.
    context.fault.check()?;
    state::lock()?.release_pools_at_sync(&[Observed::Stream(stream.handle)]);
    Ok(())
}

/// `cuStreamBeginCapture_v2`: only created streams can capture (the default streams answer
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); a second begin is `CUDA_ERROR_ILLEGAL_STATE`.
pub(crate) fn begin_capture(stream: CUstream, capture_mode: CUstreamCaptureMode, mode: DefaultStream) -> SimResult {
    ensure(capture_mode.0 <= CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0)?;
    let (_, stream) = resolve(&*state::lock()?, stream, mode)?;
    if stream.kind != StreamKind::Created {
        return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let id = stream.capture.begin(capture_mode).ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
    capture::note_begun(id, capture_mode, &stream);
    Ok(())
}

/// `cuThreadExchangeStreamCaptureMode`: swaps the calling thread's capture interaction mode
/// (see [`capture`]); an unknown mode is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `mode` is null or valid for a read and a write.
pub(crate) unsafe fn exchange_capture_mode(mode: *mut CUstreamCaptureMode) -> SimResult {
    ensure(!mode.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let wanted = unsafe { mode.read_unaligned() };
    ensure(wanted.0 <= CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0)?;
    let previous = capture::exchange_thread_mode(wanted);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(mode, previous) }
}

/// `cuStreamEndCapture`: returns the captured graph; `CUDA_ERROR_ILLEGAL_STATE` when the stream
/// was not capturing, `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` on a stream that joined another's
/// capture, `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (the capture goes on) from a thread other
/// than the one that began it in a mode other than relaxed. An invalidated capture ends too, with
/// a NULL graph ("if capture was invalidated, … a NULL graph will be returned") and
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`; one with a joined stream that did not rejoin, with a
/// NULL graph and `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` (see `capture`).
/// `out` may be NULL: the graph is then kept for whoever took its handle from
/// `cuStreamGetCaptureInfo` (as cuda.core's graph builder does; see `conservative`). The
/// addresses of the capture's graph allocations stop being live: launches map them.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn end_capture(stream: CUstream, out: *mut CUgraph, mode: DefaultStream) -> SimResult {
    let mut state = state::lock()?;
    let (_, stream) = resolve(&state, stream, mode)?;
    let ended = stream.capture.end()?;
    let (graph, allocs, failure) = match ended {
        Ended::Graph { handle, nodes, listed, allocs } => (Ok((handle, nodes, listed)), allocs, CUresult::CUDA_SUCCESS),
        Ended::Invalidated(handle, allocs) => (Err(handle), allocs, CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        Ended::Unjoined(handle, allocs) => (Err(handle), allocs, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
    };
    for alloc in &allocs {
        state.memory.unmap_graph(alloc.base);
    }
    let handle = match graph {
        Ok((handle, nodes, listed)) => {
            state.graphs.insert(handle, crate::graph::Body::new(nodes, listed));
            handle
        }
        Err(discarded) => {
            // The graph is gone: the user object references it was given go with it.
            state.graph_user_objects.remove(&discarded);
            0
        }
    };
    if !out.is_null() {
        // SAFETY: forwarded from the caller.
        unsafe { write_out(out, handle as CUgraph) }?;
    }
    if handle == 0 { fail(failure) } else { Ok(()) }
}

/// `cuStreamGetFlags`, `cuStreamGetPriority`, `cuStreamGetDevice`, `cuStreamGetCtx`: one of the
/// stream's properties.
pub(crate) enum Property {
    /// `CU_STREAM_*` flags.
    Flags(*mut u32),
    /// Priority.
    Priority(*mut i32),
    /// Device ordinal.
    Device(*mut i32),
    /// Context.
    Context(*mut CUcontext),
}

/// Reads one stream property.
///
/// # Safety
/// The pointer inside `property` is null or valid for a write.
pub(crate) unsafe fn get(stream: CUstream, mode: DefaultStream, property: Property) -> SimResult {
    let (context, stream) = resolve(&*state::lock()?, stream, mode)?;
    // SAFETY: forwarded from the caller.
    unsafe {
        match property {
            Property::Flags(out) => write_out(out, stream.flags),
            Property::Priority(out) => write_out(out, stream.priority),
            Property::Device(out) => write_out(out, stream.device as i32),
            Property::Context(out) => write_out(out, context.handle as CUcontext),
        }
    }
}

/// `cuStreamWaitEvent`: later work on `stream` waits for the event's latest recording (an event
/// never recorded is complete, so the wait is empty). The event may belong to any context. An
/// event last recorded in an active capture makes the stream join that capture (see `capture`);
/// `CUDA_ERROR_STREAM_CAPTURE_MERGE` from a stream capturing another sequence.
/// `CU_EVENT_WAIT_EXTERNAL` outside a capture is `CUDA_ERROR_INVALID_VALUE` ("invalid when used
/// outside of capture").
pub(crate) fn wait_event(stream: CUstream, event: CUevent, flags: u32, mode: DefaultStream) -> SimResult {
    ensure(flags & !CU_EVENT_WAIT_EXTERNAL == 0)?;
    let state = state::lock()?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    let event = state.events.get(&(event as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    drop(state);
    // `CU_EVENT_WAIT_EXTERNAL` "is invalid when used outside of capture".
    ensure(flags & CU_EVENT_WAIT_EXTERNAL == 0 || stream.capture.is_under_way())?;
    // An event recorded in a capture: the stream joins it, or follows the work before it there.
    // The default streams cannot capture, so they cannot join one either: the legacy stream's
    // wait is the implicit dependency `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` names, the per-thread
    // stream's is refused as its capture is (see `conservative`).
    if let Some(point) = event.captured_in() {
        if point.is_under_way() && !stream.capture.is_under_way() {
            match stream.kind {
                StreamKind::Legacy => return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
                StreamKind::PerThread => return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
                StreamKind::Created => {}
            }
        }
        stream.capture.wait_for_point(&point)?;
    }
    if let Some(generation) = event.latest() {
        // Captured, a wait node (see `conservative`).
        context.submit_as(&stream, Box::new(move || event.wait_for(generation)), WAIT_EVENT);
    }
    Ok(())
}

/// `CU_EVENT_WAIT_EXTERNAL`, the one flag `cuStreamWaitEvent` takes.
const CU_EVENT_WAIT_EXTERNAL: u32 = cuda_mem_sys::types::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL.0;

/// The node type of a captured wait for an event recorded outside the capture.
const WAIT_EVENT: CUgraphNodeType = CUgraphNodeType::CU_GRAPH_NODE_TYPE_WAIT_EVENT;

/// `cuStreamIsCapturing`: active between `cuStreamBeginCapture` and `cuStreamEndCapture`, or
/// invalidated; on the legacy stream while a blocking stream captures,
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (nothing is invalidated).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn is_capturing(stream: CUstream, out: *mut CUstreamCaptureStatus, mode: DefaultStream) -> SimResult {
    let (context, stream) = resolve(&*state::lock()?, stream, mode)?;
    capture::refuse_legacy_status(&context, &stream)?;
    let status = stream.capture.status();
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, status) }
}

/// The user data of a host function, handed to the stream's worker thread.
struct UserData(*mut c_void);
// SAFETY: cuLaunchHostFunc's contract is that the driver calls the function with this pointer on
// a thread of its own; the caller guarantees the pointee is usable there.
unsafe impl Send for UserData {}

/// `cuLaunchHostFunc`: runs `function(user_data)` in stream order, on the stream's worker. The
/// function must not call the driver; if it does, those calls fail with
/// `CUDA_ERROR_NOT_PERMITTED`.
pub(crate) fn launch_host_func(
    stream: CUstream,
    function: CUhostFn,
    user_data: *mut c_void,
    mode: DefaultStream,
) -> SimResult {
    let function = function.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let (context, stream) = resolve_for_work(&*state::lock()?, stream, mode)?;
    let data = UserData(user_data);
    context.submit_as(
        &stream,
        Box::new(move || {
            let data = &data;
            // SAFETY: the caller of cuLaunchHostFunc provided a function that accepts this
            // pointer; calling it on a driver thread is the documented contract.
            super::as_host_function(|| unsafe { function(data.0) });
        }),
        CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST,
    );
    Ok(())
}
