//! Events: creation, recording, queries, synchronization, elapsed time.

use std::sync::atomic::Ordering;

use cuda_mem_sys::types::{CUcontext, CUevent, CUevent_flags, CUipcEventHandle, CUresult, CUstream};

use super::DefaultStream;
use super::stream::resolve_for_work;
use crate::context as ctx;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::event::Event;
use crate::ipc_event::SharedProgress;
use crate::pool::Observed;
use crate::state;

/// `cuEventCreate`: `CU_EVENT_INTERPROCESS` needs `CU_EVENT_DISABLE_TIMING`, as documented; such
/// an event keeps its progress where other processes can map it (see [`crate::ipc_event`]).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn create(out: *mut CUevent, flags: u32) -> SimResult {
    let known = CUevent_flags::CU_EVENT_BLOCKING_SYNC.0
        | CUevent_flags::CU_EVENT_DISABLE_TIMING.0
        | CUevent_flags::CU_EVENT_INTERPROCESS.0;
    ensure(flags & !known == 0 && !out.is_null())?;
    if flags & CUevent_flags::CU_EVENT_INTERPROCESS.0 != 0 {
        ensure(flags & CUevent_flags::CU_EVENT_DISABLE_TIMING.0 != 0)?;
    }
    let interprocess = flags & CUevent_flags::CU_EVENT_INTERPROCESS.0 != 0;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let shared = if interprocess { Some(SharedProgress::create()?) } else { None };
    let event = Event::new(context.handle, flags, shared);
    let handle = event.handle;
    state.events.insert(handle, event);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle as CUevent) }
}

fn find(event: CUevent) -> crate::error::SimResult<std::sync::Arc<Event>> {
    state::lock()?.events.get(&(event as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// The sticky error of the context `event` was created in, once its work faulted: the calls on
/// an event report it as the calls on the context's streams do (`cuda.h` says of each that it
/// "may also return error codes from previous, asynchronous launches"). An event whose context
/// is gone has none.
fn context_fault(event: &Event) -> SimResult {
    match state::lock()?.contexts.get(&event.ctx) {
        Some(context) => context.fault.check(),
        None => Ok(()),
    }
}

/// `cuEventRecord`: the event and the stream must belong to the same context. Recorded on a
/// capturing stream, it becomes a captured event (see [`refuse_captured`]).
pub(crate) fn record(event: CUevent, stream: CUstream, mode: DefaultStream) -> SimResult {
    let state = state::lock()?;
    let event = state.events.get(&(event as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    drop(state);
    if context.handle != event.ctx {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    if stream.capture.active_id().is_some()
        && stream.capture.record_node(crate::graph::Node::Record(std::sync::Arc::clone(&event))).is_ok()
    {
        // Captured into the graph: each launch records the event anew; until then its
        // completion state is left alone rather than waiting for a launch that may never come.
        // Where it stands in the capture is what a stream waiting for it joins or follows.
        if let Some(point) = stream.capture.point(&stream) {
            event.record_captured(point);
        }
        return Ok(());
    }
    let generation = event.begin_record();
    let (handle, marks) = (stream.handle, std::sync::Arc::clone(&stream.marks));
    context.submit(
        &stream,
        Box::new(move || {
            // In the stream's order: the frees that ran before noted a mark up to this one.
            let mark = marks.fetch_add(1, Ordering::AcqRel);
            event.complete(generation, Some((handle, mark)));
        }),
    );
    Ok(())
}

/// Refuses to query or wait for an event last recorded in a capture: its work never runs
/// outside the graph. `CUDA_ERROR_CAPTURED_EVENT` ("the operation is not permitted on an event
/// which was last recorded in a capturing stream"), and the capture it was recorded in is
/// invalidated if it is still active.
fn refuse_captured(event: &Event) -> SimResult {
    let Some(point) = event.captured_in() else {
        return Ok(());
    };
    if let Some(stream) = point.stream.upgrade() {
        stream.capture.invalidate(Some(point.sequence));
    }
    Err(CUresult::CUDA_ERROR_CAPTURED_EVENT)
}

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until the latest recording completes.
pub(crate) fn query(event: CUevent) -> SimResult {
    let event = find(event)?;
    context_fault(&event)?;
    refuse_captured(&event)?;
    if !event.is_complete() {
        return Err(CUresult::CUDA_ERROR_NOT_READY);
    }
    // The host has seen the recording's stream get this far.
    state::lock()?.observe(&observed_by(&event));
    Ok(())
}

/// The progress waiting for `event` shows the host: its latest recording's stream up to the
/// recording, where `cuEventRecord` in this process made it.
fn observed_by(event: &Event) -> Vec<Observed> {
    event.observes().map(|(stream, mark)| Observed::StreamUpTo { stream, mark }).into_iter().collect()
}

/// `cuEventSynchronize`.
pub(crate) fn synchronize(event: CUevent) -> SimResult {
    let event = find(event)?;
    context_fault(&event)?;
    refuse_captured(&event)?;
    event.synchronize();
    // The work the wait covered may have faulted.
    context_fault(&event)?;
    state::lock()?.release_pools_at_sync(&observed_by(&event));
    Ok(())
}

/// `cuEventDestroy_v2`: a pending recording still completes for streams waiting on it. Once the
/// event's context faulted, the event is destroyed all the same and the sticky error returned
/// (see `conservative`).
pub(crate) fn destroy(event: CUevent) -> SimResult {
    let removed = state::lock()?.events.remove(&(event as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    context_fault(&removed)
}

/// `cuEventElapsedTime_v2`. It asks what `cuEventQuery` asks of each event (`cuda.h`: not ready
/// when "::cuEventQuery() would return ::CUDA_ERROR_NOT_READY on at least one of the events"), so
/// an event last recorded in a capture is refused as there (see [`refuse_captured`]).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn elapsed_time(out: *mut f32, start: CUevent, end: CUevent) -> SimResult {
    let (start, end) = (find(start)?, find(end)?);
    context_fault(&start)?;
    context_fault(&end)?;
    refuse_captured(&start)?;
    refuse_captured(&end)?;
    let ms = Event::elapsed_ms(&start, &end)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, ms) }
}

/// `cuIpcGetEventHandle`: the handle of an event created with `CU_EVENT_INTERPROCESS` (and so
/// `CU_EVENT_DISABLE_TIMING`); any other event is `CUDA_ERROR_INVALID_HANDLE`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn ipc_get_handle(out: *mut CUipcEventHandle, event: CUevent) -> SimResult {
    ensure(!out.is_null())?;
    let event = find(event)?;
    let shared = event.shared.as_ref().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let reserved = shared.handle().map(|byte| byte as std::ffi::c_char);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, CUipcEventHandle { reserved }) }
}

/// `cuIpcOpenEventHandle`: an event of the current context sharing the exporter's progress,
/// behaving like one created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`. A handle that
/// names no live event of another process is `CUDA_ERROR_INVALID_VALUE` (one from this process
/// too: see `conservative`).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn ipc_open_handle(out: *mut CUevent, handle: CUipcEventHandle) -> SimResult {
    ensure(!out.is_null())?;
    let data = handle.reserved.map(|byte| byte as u8);
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let shared = SharedProgress::open(&data)?;
    let flags = CUevent_flags::CU_EVENT_INTERPROCESS.0 | CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    let event = Event::new(context.handle, flags, Some(shared));
    let handle = event.handle;
    state.events.insert(handle, event);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle as CUevent) }
}

/// The live context a handle names: null, unknown and destroyed handles are
/// `CUDA_ERROR_INVALID_CONTEXT` (see `conservative`); a context whose work faulted, its sticky
/// error.
fn named_context(state: &state::State, context: CUcontext) -> SimResult<std::sync::Arc<crate::context::Context>> {
    let context = state.contexts.get(&(context as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    context.fault.check()?;
    Ok(context)
}

/// `cuCtxRecordEvent`: the event captures all the work enqueued so far on every stream of the
/// context, and completes once that is done. The event must be the context's
/// (`CUDA_ERROR_INVALID_HANDLE`); while a stream of the context captures, every such capture is
/// invalidated and the call is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub(crate) fn record_context(context: CUcontext, event: CUevent) -> SimResult {
    let state = state::lock()?;
    let context = named_context(&state, context)?;
    let event = state.events.get(&(event as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    drop(state);
    if event.ctx != context.handle {
        return fail(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    crate::capture::admit_context_wait(&context)?;
    let fences = context.pending_tails();
    let generation = event.begin_record();
    if fences.is_empty() {
        event.complete(generation, None);
        return Ok(());
    }
    // Completed by a thread of its own once the work captured is done: no stream of the
    // context may wait for another to complete it.
    let waiter = std::thread::Builder::new().name("cuda-sim-ctx-event".into()).spawn(move || {
        for fence in &fences {
            fence.wait();
        }
        event.complete(generation, None);
    });
    waiter.map(drop).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

/// `cuCtxWaitEvent`: all work submitted to the context from now on waits for the event's latest
/// recording (the event may be of any context). An event recorded in a capture under way
/// invalidates that capture, and a stream of the context capturing invalidates every such
/// capture: both are `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub(crate) fn wait_context(context: CUcontext, event: CUevent) -> SimResult {
    let state = state::lock()?;
    let context = named_context(&state, context)?;
    let event = state.events.get(&(event as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    drop(state);
    if let Some(point) = event.captured_in()
        && point.is_under_way()
    {
        if let Some(stream) = point.stream.upgrade() {
            stream.capture.invalidate(Some(point.sequence));
        }
        return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    crate::capture::admit_context_wait(&context)?;
    if let Some(generation) = event.latest() {
        context.wait_for_event(event, generation);
    }
    Ok(())
}
