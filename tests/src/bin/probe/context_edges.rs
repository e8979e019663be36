//! Question 33: the primary context's edges, asked in a child process because they destroy the
//! context the process uses. The simulator (`cuda_sim::conservative`) refuses destroying a
//! default stream (`CUDA_ERROR_INVALID_HANDLE`) and a release without a retain
//! (`CUDA_ERROR_INVALID_CONTEXT`), gives a primary context retained again after its last
//! release a new handle, and gives back the memory of stream-ordered frees that were still
//! pending when the context went (`cuda.h`: a reset "destroys all allocations"). What does a
//! driver do?
//!
//! The child frees a 64 MiB default-pool allocation in stream order behind a held stream
//! ([`Gate`], which lets go by itself after a second), releases the context (its only retain)
//! while that free is pending, releases once more, retains again, and compares the device's
//! free memory (`cuMemGetInfo`) with what it was before the allocation, after a synchronize and
//! a trim of the default pool.
//!
//! Then the created contexts' edges (`cuCtxCreate_v4`), where the simulator refuses execution
//! affinity (`CUDA_ERROR_NOT_SUPPORTED`: "only supported under Volta+ MPS"), an event recorded
//! on a stream of another context (`CUDA_ERROR_INVALID_HANDLE`, as `cuCtxRecordEvent` documents
//! for its context) and `cuCtxDestroy` of a primary context (`CUDA_ERROR_INVALID_CONTEXT`): the
//! child creates a context with one SM-count affinity parameter (destroyed if made), creates one
//! with no parameters, creates an event in it, pops it, records that event on a stream of the
//! primary context, destroys the created context, and last calls `cuCtxDestroy` on the primary
//! context's handle (a driver that destroys it leaves the child's own release to fail, which is
//! only noted).

use std::time::{Duration, Instant};

use cuda_mem_sys::types::{
    CUcontext, CUctxCreateParams, CUdevice, CUdeviceptr, CUexecAffinityParam, CUexecAffinityParam_st__bindgen_ty_1,
    CUexecAffinitySmCount, CUexecAffinityType, CUmemoryPool, CUstream,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::capture::short;
use crate::child::{self, Input};
use crate::gate::Gate;
use crate::owned::{OwnedEvent, OwnedStream, free_async};
use crate::raw::{Call, LEGACY, PER_THREAD, alloc_async, code, memory_info};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "context-edges",
    question: "In a process holding one retain of device 0's primary context: cuStreamDestroy of CU_STREAM_LEGACY \
               and of CU_STREAM_PER_THREAD; cuDevicePrimaryCtxRelease (the last) while a stream-ordered free is \
               pending (does it wait?), then once more without a retain; the handle cuDevicePrimaryCtxRetain then \
               gives (the old value or a new one); the device's free memory after a synchronize and a trim, \
               against before the allocation; cuCtxCreate_v4 with one execution-affinity parameter (1 SM); \
               cuEventRecord of a created context's event on a stream of the primary context; cuCtxDestroy of the \
               primary context",
    run,
    child: Some(child_side),
};

/// The allocation whose free is pending when the context goes.
const SIZE: usize = 64 << 20;
/// How long the gate holds the stream at most.
const GATE_LIMIT: Duration = Duration::from_secs(1);
const MIB: i128 = 1 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let observed = child::ask(QUESTION.name, b"", &[])?;
    let get = |key: &str| short(observed.get(key).unwrap_or("not reached")).to_string();
    let answer = format!(
        "destroy legacy {}, per-thread {}; last release with a free pending {} ({}); release again {}; retain again \
         {} ({}); free memory after {}",
        get("destroy_legacy"),
        get("destroy_per_thread"),
        get("release"),
        observed.get("release_waited").unwrap_or("?"),
        get("release_again"),
        get("retain_again"),
        observed.get("handle").unwrap_or("?"),
        observed.get("memory_after").unwrap_or("not reached"),
    );
    let across = match observed.get("create_plain") {
        Some("CUDA_SUCCESS") | None => get("record_across"),
        Some(created) => format!("not asked (cuCtxCreate_v4 {})", short(created)),
    };
    let answer = format!(
        "{answer}; cuCtxCreate_v4 with an SM-count affinity {}; a created context's event recorded on the primary's \
         stream {across}; cuCtxDestroy of the primary {}",
        get("create_affinity"),
        get("destroy_primary"),
    );
    details.absorb("child", observed);
    Ok(answer)
}

/// The child: its primary context is retained once, current on this thread.
fn child_side(_input: &Input, details: &mut Details) -> Result<(), Error> {
    details.put("destroy_legacy", code(&destroy_stream(LEGACY)));
    details.put("destroy_per_thread", code(&destroy_stream(PER_THREAD)));
    let d = driver()?;
    let device = current_device()?;
    let (before, _) = memory_info()?;
    // The stream and the allocation go with the context: neither is released here.
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer; 1 is CU_STREAM_NON_BLOCKING.
    unsafe { cu_call!(d, cuStreamCreate(&mut stream, 1)) }?;
    let ptr: CUdeviceptr = alloc_async(SIZE, stream)?;
    // SAFETY: the stream was created above.
    unsafe { cu_call!(d, cuStreamSynchronize(stream)) }?;
    let gate = Gate::hold(stream, GATE_LIMIT)?;
    details.put("free_async", code(&free_async(ptr, stream)));
    let old = current_context()?;
    let start = Instant::now();
    details.put("release", code(&release(device)));
    let waited = if start.elapsed() >= GATE_LIMIT.mul_f32(0.9) { "waited for the stream" } else { "at once" };
    details.put("release_waited", waited);
    drop(gate);
    details.put("release_again", code(&release(device)));
    let retained = retain(device);
    details.put("retain_again", code(&retained));
    let Ok(new) = retained else { return Ok(()) };
    details.put("handle", if new == old { "the old value" } else { "a new value" });
    // SAFETY: `new` is retained (the child's context guard releases it at the end).
    unsafe { cu_call!(d, cuCtxSetCurrent(new)) }?;
    // SAFETY: no arguments.
    unsafe { cu_call!(d, cuCtxSynchronize()) }?;
    details.put("trim", code(&trim_default_pool(device)));
    let (after, _) = memory_info()?;
    let lower = before as i128 - after as i128;
    details.put("memory_lower_mib", lower / MIB);
    let memory = if lower.abs() < MIB {
        "as before".to_string()
    } else if lower > 0 {
        format!("{} MiB lower", lower / MIB)
    } else {
        format!("{} MiB higher", -lower / MIB)
    };
    details.put("memory_after", memory);
    created_context_edges(device, new, details)
}

/// The child's last steps, with `primary` current: a context created with an execution-affinity
/// parameter, an event of a created context recorded on a stream of the primary one, and
/// `cuCtxDestroy` of the primary context.
fn created_context_edges(device: CUdevice, primary: CUcontext, details: &mut Details) -> Result<(), Error> {
    let affinity = create_context(device, true);
    details.put("create_affinity", code(&affinity));
    if let Ok(created) = affinity {
        details.put("create_affinity.destroy", code(&destroy_context(created)));
        set_current(primary)?;
    }
    let created = create_context(device, false);
    details.put("create_plain", code(&created));
    if let Ok(created) = created {
        // Made current by its creation: the event is the created context's.
        let event = OwnedEvent::new();
        details.put("created_event", code(&event));
        let mut popped: CUcontext = std::ptr::null_mut();
        let d = driver()?;
        // SAFETY: `popped` is a valid out-pointer; the created context is on this thread's stack.
        let pop = unsafe { cu_call!(d, cuCtxPopCurrent_v2(&mut popped)) };
        details.put("pop", code(&pop));
        set_current(primary)?;
        if let Ok(event) = event {
            let stream = OwnedStream::new(false)?;
            details.put("record_across", code(&event.record(stream.raw())));
            drop((stream, event));
        }
        details.put("destroy_created", code(&destroy_context(created)));
    }
    details.put("destroy_primary", code(&destroy_context(primary)));
    Ok(())
}

/// `cuCtxCreate_v4` on `device`: with one execution-affinity parameter (1 SM), or with no
/// parameters. The context is current on return.
fn create_context(device: CUdevice, affinity: bool) -> Result<CUcontext, CudaError> {
    let d = driver()?;
    let mut sm_count = CUexecAffinityParam {
        type_: CUexecAffinityType::CU_EXEC_AFFINITY_TYPE_SM_COUNT,
        param: CUexecAffinityParam_st__bindgen_ty_1 { smCount: CUexecAffinitySmCount { val: 1 } },
    };
    let mut params = CUctxCreateParams {
        execAffinityParams: &raw mut sm_count,
        numExecAffinityParams: 1,
        cigParams: std::ptr::null_mut(),
    };
    let params: *mut CUctxCreateParams = if affinity { &raw mut params } else { std::ptr::null_mut() };
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer; `params` is null or points to parameters (and
    // their one affinity entry) alive for the call; `device` came from the driver.
    unsafe { cu_call!(d, cuCtxCreate_v4(&mut context, params, 0, device)) }?;
    Ok(context)
}

/// `cuCtxDestroy_v2` of any context handle (a primary context's included: the question).
fn destroy_context(context: CUcontext) -> Call {
    let d = driver()?;
    // SAFETY: the handle came from the driver; a context this child created is not used after.
    unsafe { cu_call!(d, cuCtxDestroy_v2(context)) }
}

fn set_current(context: CUcontext) -> Call {
    let d = driver()?;
    // SAFETY: the context is retained (the primary) or created by this child, alive.
    unsafe { cu_call!(d, cuCtxSetCurrent(context)) }
}

fn destroy_stream(stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: a special stream handle, which the driver either refuses or ignores.
    unsafe { cu_call!(d, cuStreamDestroy_v2(stream)) }
}

fn current_context() -> Result<CUcontext, CudaError> {
    let d = driver()?;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetCurrent(&mut context)) }?;
    Ok(context)
}

fn current_device() -> Result<CUdevice, CudaError> {
    let d = driver()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetDevice(&mut device)) }?;
    Ok(device)
}

fn release(device: CUdevice) -> Call {
    let d = driver()?;
    // SAFETY: releases a retain of the device's primary context (this process's only one, or
    // none: the question asks what the driver says then).
    unsafe { cu_call!(d, cuDevicePrimaryCtxRelease_v2(device)) }
}

fn retain(device: CUdevice) -> Result<CUcontext, CudaError> {
    let d = driver()?;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer; `device` came from the driver.
    unsafe { cu_call!(d, cuDevicePrimaryCtxRetain(&mut context, device)) }?;
    Ok(context)
}

/// `cuMemPoolTrimTo(0)` of the device's default pool.
fn trim_default_pool(device: CUdevice) -> Call {
    let d = driver()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; `device` came from the driver.
    unsafe { cu_call!(d, cuDeviceGetDefaultMemPool(&mut pool, device)) }?;
    // SAFETY: the default pool lives as long as the device.
    unsafe { cu_call!(d, cuMemPoolTrimTo(pool, 0)) }
}
