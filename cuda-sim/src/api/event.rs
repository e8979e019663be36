//! Events: creation, recording, queries, synchronization, elapsed time.

use std::sync::atomic::Ordering;

use cuda_mem_sys::types::{CUevent, CUevent_flags, CUipcEventHandle, CUresult, CUstream};

use super::DefaultStream;
use super::stream::resolve_for_work;
use crate::context as ctx;
use crate::error::{SimResult, ensure, write_out};
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
