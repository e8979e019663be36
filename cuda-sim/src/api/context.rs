//! Primary contexts, contexts `cuCtxCreate` makes, and the current-context stack.

use std::sync::Arc;

use cuda_mem_sys::types::{CUcontext, CUctxCreateParams, CUresult};

use crate::context::{self as ctx, Context};
use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::memory::{Kind, round_up};
use crate::pool::Observed;
use crate::state::{self, State};

/// The least and greatest stream priorities (`cuCtxGetStreamPriorityRange`), as on Hopper.
pub(crate) const PRIORITY_RANGE: (i32, i32) = (0, -5);

fn as_handle(ctx: CUcontext) -> usize {
    ctx as usize
}

fn as_context(handle: usize) -> CUcontext {
    handle as CUcontext
}

/// `cuDevicePrimaryCtxRetain`: activates the primary context on first retain.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn primary_retain(out: *mut CUcontext, device: i32) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    ensure(!out.is_null())?;
    let handle = match &state.primary[device] {
        Some(context) => context.handle,
        None => {
            let context = Context::start(device)?;
            let handle = context.handle;
            state.primary[device] = Some(Arc::clone(&context));
            state.contexts.insert(handle, context);
            handle
        }
    };
    state.primary_retains[device] += 1;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_context(handle)) }
}

/// `cuDevicePrimaryCtxRelease_v2`: the last release destroys the context.
pub(crate) fn primary_release(device: i32) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    match state.primary_retains[device] {
        0 => fail(CUresult::CUDA_ERROR_INVALID_CONTEXT),
        1 => {
            state.primary_retains[device] = 0;
            destroy_primary(&mut state, device);
            Ok(())
        }
        _ => {
            state.primary_retains[device] -= 1;
            Ok(())
        }
    }
}

/// `cuDevicePrimaryCtxReset_v2`: destroys the primary context whatever its retain count.
pub(crate) fn primary_reset(device: i32) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    // "Resetting the primary context does not release it": the retain count stays, so modules
    // that retained it may still release; the next retain makes a new context.
    destroy_primary(&mut state, device);
    state.primary_flags[device] = 0;
    Ok(())
}

/// Destroys a device's primary context (see [`destroy_context`]).
fn destroy_primary(state: &mut State, device: usize) {
    if let Some(context) = state.primary[device].take() {
        destroy_context(state, &context);
    }
}

/// Destroys a context: its streams, events and allocations go with it. Work already enqueued
/// still runs (it holds what it touches); its handles become invalid at once.
fn destroy_context(state: &mut State, context: &Context) {
    state.contexts.remove(&context.handle);
    // Its pending work still runs (it holds what it touches), and the device's later
    // synchronizations wait for it. Marked destroyed first, then its frees that ran but were
    // never observed are settled: the context's allocations are gone with it, and nothing can
    // observe it any more (its frees that run from now on settle as they run, see
    // `Pool::release_on`).
    let pending = context.retire();
    let device = context.device;
    state.orphaned_work[device].retain(|fence| !fence.is_reached());
    state.orphaned_work[device].extend(pending);
    state.observe(&[Observed::Context(context.handle)]);
    let streams: Vec<_> = state.streams.extract_if(|_, s| s.ctx == context.handle).map(|(_, s)| s).collect();
    for stream in &streams {
        super::stream::discard_capture(state, stream);
    }
    state.events.retain(|_, e| e.ctx != context.handle);
    for allocation in state.memory.free_context(context.handle) {
        match allocation.kind {
            Kind::Device => {
                let used = &mut state.devices[allocation.device].used;
                *used = used.saturating_sub(round_up(allocation.size as u64));
            }
            // A graph allocation mapped by a launch stops counting as used (its reserve stays, as
            // for any freed graph memory, until trimmed).
            Kind::Graph => state.graph_memory[allocation.device].forget(allocation.base),
            _ => {}
        }
    }
}

/// Every `CU_CTX_*` flag (`CU_CTX_FLAGS_MASK`): one scheduling flag (auto, spin, yield,
/// blocking sync) plus the other bits below 0x100.
fn check_context_flags(flags: u32) -> SimResult {
    ensure(flags & !0xff == 0 && matches!(flags & 0x07, 0 | 1 | 2 | 4))
}

/// Checks `cuCtxCreate`'s parameters: none, or an empty set. Execution affinity ("only
/// supported under Volta+ MPS") and CIG mode (no graphics API here; the device attributes say
/// so) are `CUDA_ERROR_NOT_SUPPORTED`; a negative count, a count without its array, and both
/// set at once ("undefined behavior") are `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `params` is null or valid for a read.
unsafe fn check_create_params(params: *const CUctxCreateParams) -> SimResult {
    if params.is_null() {
        return Ok(());
    }
    // SAFETY: non-null and valid for a read by the caller's contract.
    let params = unsafe { params.read_unaligned() };
    let affinity = params.numExecAffinityParams != 0;
    ensure(params.numExecAffinityParams >= 0)?;
    ensure(!affinity || !params.execAffinityParams.is_null())?;
    ensure(!affinity || params.cigParams.is_null())?;
    if affinity || !params.cigParams.is_null() {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// `cuCtxCreate_v4`: a new context on `device`, pushed on the calling thread's stack (it
/// supplants the current one, which a `cuCtxPopCurrent` restores).
///
/// # Safety
/// `out` is null or valid for a write; `params` is null or valid for a read.
pub(crate) unsafe fn create(
    out: *mut CUcontext,
    params: *const CUctxCreateParams,
    flags: u32,
    device: i32,
) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    ensure(!out.is_null())?;
    check_context_flags(flags)?;
    // SAFETY: forwarded from the caller.
    unsafe { check_create_params(params) }?;
    let context = Context::start_with(device, Some(flags))?;
    let handle = context.handle;
    state.contexts.insert(handle, context);
    ctx::push_current(handle);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_context(handle)) }
}

/// `cuCtxDestroy_v2`: a context `cuCtxCreate` made (a primary context, an unknown or destroyed
/// one, and null are `CUDA_ERROR_INVALID_CONTEXT`). Popped from the calling thread's stack if it
/// is current there; other threads it is current to get `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
pub(crate) fn destroy(context: CUcontext) -> SimResult {
    let mut state = state::lock()?;
    let context = live(&state, as_handle(context))?;
    if context.created_flags.is_none() {
        return fail(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    if ctx::current_handle() == Some(context.handle) {
        ctx::pop_current();
    }
    destroy_context(&mut state, &context);
    Ok(())
}

/// `cuDevicePrimaryCtxGetState`.
///
/// # Safety
/// `flags` and `active` are null or valid for a write.
pub(crate) unsafe fn primary_state(device: i32, flags: *mut u32, active: *mut i32) -> SimResult {
    let state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    ensure(!flags.is_null() && !active.is_null())?;
    // SAFETY: both checked non-null; valid by the caller's contract.
    unsafe {
        write_out(flags, state.primary_flags[device])?;
        write_out(active, i32::from(state.primary[device].is_some()))
    }
}

/// `cuDevicePrimaryCtxSetFlags_v2`: scheduling flags (one of auto, spin, yield, blocking sync)
/// plus the other `CU_CTX_*` bits below 0x100.
pub(crate) fn primary_set_flags(device: i32, flags: u32) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    check_context_flags(flags)?;
    state.primary_flags[device] = flags;
    Ok(())
}

fn live(state: &State, handle: usize) -> SimResult<Arc<Context>> {
    state.contexts.get(&handle).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// `cuCtxSetCurrent`: null unbinds.
pub(crate) fn set_current(context: CUcontext) -> SimResult {
    let state = state::lock()?;
    if context.is_null() {
        ctx::set_current(None);
        return Ok(());
    }
    let context = live(&state, as_handle(context))?;
    ctx::set_current(Some(context.handle));
    Ok(())
}

/// `cuCtxGetCurrent`: null when none is bound. It reads the calling thread's context stack only,
/// so it takes no lock (a destroyed context is still returned, as the driver returns it).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_current(out: *mut CUcontext) -> SimResult {
    state::ensure_initialized()?;
    let current = ctx::current_handle().map_or(std::ptr::null_mut(), as_context);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, current) }
}

/// `cuCtxPushCurrent_v2`.
pub(crate) fn push_current(context: CUcontext) -> SimResult {
    let state = state::lock()?;
    let context = live(&state, as_handle(context))?;
    ctx::push_current(context.handle);
    Ok(())
}

/// `cuCtxPopCurrent_v2`: `CUDA_ERROR_INVALID_CONTEXT` when the stack is empty.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn pop_current(out: *mut CUcontext) -> SimResult {
    let _state = state::lock()?;
    let popped = ctx::pop_current().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if out.is_null() {
        return Ok(());
    }
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_context(popped)) }
}

/// The context a call names, or the current one when it names none.
fn named_or_current(state: &State, context: CUcontext) -> SimResult<Arc<Context>> {
    if context.is_null() { ctx::current(state) } else { live(state, as_handle(context)) }
}

/// `cuCtxGetDevice` (current context) and `cuCtxGetDevice_v2` (a named one, or null).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_device(out: *mut i32, context: CUcontext) -> SimResult {
    let state = state::lock()?;
    let context = named_or_current(&state, context)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, context.device as i32) }
}

/// `cuCtxSynchronize` (current) and `cuCtxSynchronize_v2` (a named one, or null). While a
/// stream of the context captures, `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and every such
/// capture is invalidated (see [`crate::capture::admit_context_wait`]).
pub(crate) fn synchronize(context: CUcontext) -> SimResult {
    let (context, orphaned) = {
        let mut state = state::lock()?;
        let context = named_or_current(&state, context)?;
        let orphaned = state.pending_orphaned_work(context.device);
        (context, orphaned)
    };
    crate::capture::admit_context_wait(&context)?;
    context.synchronize();
    // And what destroyed contexts of the device left: the device's work too.
    for fence in orphaned {
        fence.wait();
    }
    // The work waited for may have faulted: its error is the synchronization's.
    context.fault.check()?;
    // Destroyed streams' work too: it completed before the context's.
    state::lock()?.release_pools_at_sync(&[Observed::Context(context.handle)]);
    Ok(())
}

/// `cuCtxGetStreamPriorityRange`.
///
/// # Safety
/// Each pointer is null (that value is not wanted) or valid for a write.
pub(crate) unsafe fn stream_priority_range(least: *mut i32, greatest: *mut i32) -> SimResult {
    let state = state::lock()?;
    ctx::current(&state)?;
    // SAFETY: each pointer is written only when non-null, as cuda.h allows.
    unsafe {
        if !least.is_null() {
            write_out(least, PRIORITY_RANGE.0)?;
        }
        if !greatest.is_null() {
            write_out(greatest, PRIORITY_RANGE.1)?;
        }
    }
    Ok(())
}
