//! Contexts `cuCtxCreate` makes and `cuCtxDestroy` ends, what is recorded of and waited for by
//! a whole context (`cuCtxRecordEvent`, `cuCtxWaitEvent`), and a context's limits and cache
//! preference (`cuCtxGetLimit`/`cuCtxSetLimit`, `cuCtxGetCacheConfig`/`cuCtxSetCacheConfig`):
//! each as `cuda.h` documents it, with its errors.

mod common;

use std::ffi::{c_int, c_void};

use common::{
    DeviceBuffer, Gate, NULL_STREAM, code, current, driver, event, event_query, hold, in_child, init, memset_async,
    non_blocking_stream, on_fresh_thread, query, record, sync, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUcontext, CUctxCigParam, CUctxCreateParams, CUevent, CUevent_flags, CUexecAffinityParam, CUfunc_cache, CUlimit,
    CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
};

const INVALID_VALUE: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const INVALID_CONTEXT: CUresult = CUresult::CUDA_ERROR_INVALID_CONTEXT;
const INVALID_HANDLE: CUresult = CUresult::CUDA_ERROR_INVALID_HANDLE;
const UNSUPPORTED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;

/// `cuCtxCreate_v4(&ctx, params, flags, device)`.
fn create_with(params: *mut CUctxCreateParams, flags: u32, device: c_int) -> Result<CUcontext, CUresult> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; `params` is null or points to a live value.
    match unsafe { code!(driver(), cuCtxCreate_v4(&mut ctx, params, flags, device)) } {
        CUresult::CUDA_SUCCESS => Ok(ctx),
        error => Err(error),
    }
}

fn create(device: c_int) -> CUcontext {
    create_with(std::ptr::null_mut(), 0, device).expect("cuCtxCreate_v4")
}

fn destroy(ctx: CUcontext) -> CUresult {
    // SAFETY: no pointers are dereferenced; unknown handles are refused.
    unsafe { code!(driver(), cuCtxDestroy_v2(ctx)) }
}

fn ctx_device() -> Result<c_int, CUresult> {
    let mut device = -1;
    // SAFETY: `device` is a valid out-pointer.
    match unsafe { code!(driver(), cuCtxGetDevice(&mut device)) } {
        CUresult::CUDA_SUCCESS => Ok(device),
        error => Err(error),
    }
}

fn pop() -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuCtxPopCurrent_v2(&mut ctx)) }.unwrap();
    ctx
}

fn free_memory() -> usize {
    let (mut free, mut total) = (0, 0);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(driver(), cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
    free
}

fn record_context(ctx: CUcontext, e: CUevent) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuCtxRecordEvent(ctx, e)) }
}

fn wait_context(ctx: CUcontext, e: CUevent) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuCtxWaitEvent(ctx, e)) }
}

fn get_limit(limit: CUlimit) -> Result<usize, CUresult> {
    let mut value = usize::MAX;
    // SAFETY: `value` is a valid out-pointer.
    match unsafe { code!(driver(), cuCtxGetLimit(&mut value, limit)) } {
        CUresult::CUDA_SUCCESS => Ok(value),
        error => Err(error),
    }
}

fn set_limit(limit: CUlimit, value: usize) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuCtxSetLimit(limit, value)) }
}

fn cache_config() -> Result<CUfunc_cache, CUresult> {
    let mut config = CUfunc_cache(99);
    // SAFETY: `config` is a valid out-pointer.
    match unsafe { code!(driver(), cuCtxGetCacheConfig(&mut config)) } {
        CUresult::CUDA_SUCCESS => Ok(config),
        error => Err(error),
    }
}

fn set_cache_config(config: CUfunc_cache) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuCtxSetCacheConfig(config)) }
}

fn begin_capture(s: CUstream) {
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream of the test's.
    unsafe { cu_call!(driver(), cuStreamBeginCapture_v2(s, mode)) }.unwrap();
}

fn capture_status(s: CUstream) -> CUstreamCaptureStatus {
    let mut status = CUstreamCaptureStatus(99);
    // SAFETY: `status` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamIsCapturing(s, &mut status)) }.unwrap();
    status
}

/// Ends `s`'s capture, whatever became of it, and destroys the graph if there is one.
fn end_capture(s: CUstream) -> CUresult {
    let mut graph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer.
    let result = unsafe { code!(driver(), cuStreamEndCapture(s, &mut graph)) };
    if !graph.is_null() {
        // SAFETY: the graph the capture made, destroyed once.
        unsafe { cu_call!(driver(), cuGraphDestroy(graph)) }.unwrap();
    }
    result
}

#[test]
fn a_created_context_is_current_until_popped_and_its_own() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let primary = use_device(0);
        let created = create(1);
        assert!(!created.is_null() && created != primary);
        assert_eq!(current(), created, "current after creation");
        assert_eq!(ctx_device(), Ok(1));
        assert_ne!(create(1), created, "another context of the same device");
        assert_eq!(destroy(current()), CUresult::CUDA_SUCCESS, "the second one, popped by its destroy");
        assert_eq!(current(), created);
        // Popping it restores the context it supplanted.
        assert_eq!(pop(), created);
        assert_eq!(current(), primary);
        assert_eq!(destroy(created), CUresult::CUDA_SUCCESS, "not current: destroyed all the same");
        assert_eq!(current(), primary, "a context not current is not popped");
        assert_eq!(destroy(created), INVALID_CONTEXT, "destroyed twice");
        // SAFETY: no pointers; a destroyed handle is refused.
        assert_eq!(unsafe { code!(driver(), cuCtxSetCurrent(created)) }, INVALID_CONTEXT);
    });
}

#[test]
fn destroying_a_created_context_takes_its_memory_streams_and_events() {
    in_child!(&[], || {
        let primary = use_device(0);
        let before = free_memory();
        let created = create(0);
        let buffer = DeviceBuffer::new(1 << 20);
        let (mut host, mut pinned) = (std::ptr::null_mut::<c_void>(), std::ptr::null_mut::<c_void>());
        // SAFETY: valid out-pointers.
        unsafe { cu_call!(driver(), cuMemAllocHost_v2(&mut host, 64)) }.unwrap();
        // SAFETY: as above.
        unsafe { cu_call!(driver(), cuMemHostAlloc(&mut pinned, 64, 0x1)) }.unwrap();
        let s = non_blocking_stream();
        let e = event(CUevent_flags::CU_EVENT_DEFAULT);
        assert!(free_memory() < before, "the allocation counts");
        // Made current on another thread too, which then finds it destroyed.
        let (gate, _open) = Gate::new();
        let handle = created as usize;
        let other = std::thread::spawn(move || {
            let created = handle as CUcontext;
            // SAFETY: a live context.
            unsafe { cu_call!(driver(), cuCtxSetCurrent(created)) }.unwrap();
            gate.wait();
            ctx_device()
        });
        gate.wait_entered(1);
        assert_eq!(destroy(created), CUresult::CUDA_SUCCESS);
        gate.open();
        assert_eq!(other.join().unwrap(), Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED));
        assert_eq!(current(), primary, "popped from this thread's stack");
        assert_eq!(free_memory(), before, "its memory went with it");
        // SAFETY: no pointers are dereferenced; gone handles and addresses are refused.
        unsafe {
            assert_eq!(code!(driver(), cuMemFree_v2(buffer.ptr)), INVALID_VALUE);
            assert_eq!(code!(driver(), cuMemFreeHost(host)), INVALID_VALUE);
            assert_eq!(code!(driver(), cuMemFreeHost(pinned)), INVALID_VALUE);
            assert_eq!(code!(driver(), cuStreamDestroy_v2(s)), INVALID_HANDLE);
            assert_eq!(code!(driver(), cuEventDestroy_v2(e)), INVALID_HANDLE);
        }
    });
}

#[test]
fn context_creation_and_destruction_refuse_what_cuda_h_refuses() {
    in_child!(&[], || {
        let d = driver();
        // SAFETY: valid out-pointer, null parameters.
        let before_init = unsafe { code!(d, cuCtxCreate_v4(&mut std::ptr::null_mut(), std::ptr::null_mut(), 0, 0)) };
        assert_eq!(before_init, CUresult::CUDA_ERROR_NOT_INITIALIZED);
        let primary = use_device(0);
        assert_eq!(create_with(std::ptr::null_mut(), 0, 1), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(create_with(std::ptr::null_mut(), 0, -1), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        // SAFETY: a null out-pointer is refused before any write.
        let null_out = unsafe { code!(d, cuCtxCreate_v4(std::ptr::null_mut(), std::ptr::null_mut(), 0, 0)) };
        assert_eq!(null_out, INVALID_VALUE);
        assert_eq!(create_with(std::ptr::null_mut(), 0x100, 0), Err(INVALID_VALUE), "a flag past CU_CTX_FLAGS_MASK");
        assert_eq!(create_with(std::ptr::null_mut(), 0x3, 0), Err(INVALID_VALUE), "two scheduling flags");
        // SAFETY: plain C structs, for which all-zero bytes are valid values.
        let (mut affinity, mut cig): (CUexecAffinityParam, CUctxCigParam) = unsafe { std::mem::zeroed() };
        let params = |affinity: *mut CUexecAffinityParam, count: c_int, cig: *mut CUctxCigParam| {
            let mut params =
                CUctxCreateParams { execAffinityParams: affinity, numExecAffinityParams: count, cigParams: cig };
            create_with(&mut params, 0, 0)
        };
        let (none, no_cig) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(params(&mut affinity, 1, no_cig), Err(CUresult::CUDA_ERROR_NOT_SUPPORTED), "affinity needs MPS");
        assert_eq!(params(none, 0, &mut cig), Err(CUresult::CUDA_ERROR_NOT_SUPPORTED), "no CIG");
        assert_eq!(params(none, 1, no_cig), Err(INVALID_VALUE), "a count without its array");
        assert_eq!(params(&mut affinity, -1, no_cig), Err(INVALID_VALUE));
        assert_eq!(params(&mut affinity, 1, &mut cig), Err(INVALID_VALUE), "both at once");
        let empty = params(none, 0, no_cig).expect("empty parameters");
        assert_eq!(destroy(empty), CUresult::CUDA_SUCCESS);
        assert_eq!(current(), primary, "nothing else was made current");
        // A primary context is not cuCtxDestroy's, nor is null.
        assert_eq!(destroy(primary), INVALID_CONTEXT);
        assert_eq!(destroy(std::ptr::null_mut()), INVALID_CONTEXT);
        assert_eq!(ctx_device(), Ok(0), "the primary context lives on");
    });
}

#[test]
fn a_created_context_with_sync_memops_waits_for_its_device_to_device_copies() {
    in_child!(&[], || {
        init();
        let created = create_with(std::ptr::null_mut(), 0x80, 0).unwrap();
        let (src, dst) = (DeviceBuffer::with(&[7; 64]), DeviceBuffer::new(64));
        let (gate, _open) = Gate::new();
        hold(gate, driver(), NULL_STREAM);
        gate.open_after(common::OPEN_DELAY);
        // SAFETY: both ranges are live device memory of 64 bytes.
        unsafe { cu_call!(driver(), cuMemcpyDtoD_v2(dst.ptr, src.ptr, 64)) }.unwrap();
        assert!(gate.is_open(), "CU_CTX_SYNC_MEMOPS: the copy returned only once done");
        drop((src, dst));
        assert_eq!(destroy(created), CUresult::CUDA_SUCCESS);
    });
}

#[test]
fn a_context_event_captures_the_work_of_every_stream_of_the_context() {
    let ctx = use_device(0);
    let (s1, s2) = (non_blocking_stream(), non_blocking_stream());
    let e = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
    assert_eq!(record_context(ctx, e), CUresult::CUDA_SUCCESS);
    assert_eq!(event_query(e), CUresult::CUDA_SUCCESS, "nothing pending: complete at once");
    let (gate, _open) = Gate::new();
    hold(gate, driver(), s2);
    let buffer = DeviceBuffer::new(4096);
    memset_async(buffer.ptr, 1, 4096, s1);
    sync(s1);
    assert_eq!(record_context(ctx, e), CUresult::CUDA_SUCCESS);
    // Work enqueued after the recording is not part of it.
    let (later, _open_later) = Gate::new();
    hold(later, driver(), s1);
    assert_eq!(event_query(e), CUresult::CUDA_ERROR_NOT_READY, "s2 is held");
    gate.open();
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuEventSynchronize(e)) }.unwrap();
    assert_eq!(query(s1), CUresult::CUDA_ERROR_NOT_READY, "s1's later work is not waited for");
    later.open();
    sync(s1);
}

#[test]
fn a_context_event_is_refused_what_cuda_h_refuses() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let ctx0 = use_device(0);
        let theirs = event(CUevent_flags::CU_EVENT_DEFAULT);
        let ctx1 = use_device(1);
        let mine = event(CUevent_flags::CU_EVENT_DEFAULT);
        assert_eq!(record_context(ctx1, theirs), INVALID_HANDLE, "an event of another context");
        assert_eq!(record_context(ctx0, mine), INVALID_HANDLE);
        assert_eq!(record_context(ctx1, std::ptr::null_mut()), INVALID_HANDLE);
        assert_eq!(record_context(std::ptr::null_mut(), mine), INVALID_CONTEXT);
        let created = create(1);
        assert_eq!(destroy(created), CUresult::CUDA_SUCCESS);
        assert_eq!(record_context(created, mine), INVALID_CONTEXT, "a destroyed context");
        assert_eq!(wait_context(created, mine), INVALID_CONTEXT);
        assert_eq!(wait_context(std::ptr::null_mut(), mine), INVALID_CONTEXT);
        assert_eq!(wait_context(ctx1, std::ptr::null_mut()), INVALID_HANDLE);
        // A stream of the context capturing: every such capture is invalidated.
        let s = non_blocking_stream();
        begin_capture(s);
        assert_eq!(record_context(ctx1, mine), UNSUPPORTED);
        assert_eq!(capture_status(s), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        assert_eq!(end_capture(s), CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        begin_capture(s);
        assert_eq!(wait_context(ctx1, theirs), UNSUPPORTED);
        assert_eq!(capture_status(s), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        assert_eq!(end_capture(s), CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        // An event recorded in a capture under way: that capture is invalidated.
        begin_capture(s);
        record(mine, s);
        assert_eq!(wait_context(ctx0, mine), UNSUPPORTED);
        assert_eq!(capture_status(s), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        assert_eq!(end_capture(s), CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    });
}

#[test]
fn after_a_context_waits_for_an_event_all_its_new_work_waits_for_it() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let ctx1 = use_device(1);
        let held = non_blocking_stream();
        let e = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let (gate, _open) = Gate::new();
        hold(gate, driver(), held);
        record(e, held);
        let ctx0 = use_device(0);
        let before = non_blocking_stream();
        let buffer = DeviceBuffer::new(64);
        assert_eq!(wait_context(ctx0, e), CUresult::CUDA_SUCCESS, "an event of another device's context");
        memset_async(buffer.ptr, 1, 64, before);
        let after = non_blocking_stream();
        memset_async(buffer.ptr, 2, 64, after);
        assert_eq!(query(before), CUresult::CUDA_ERROR_NOT_READY, "a stream made before the wait");
        assert_eq!(query(after), CUresult::CUDA_ERROR_NOT_READY, "a stream made after it");
        assert_eq!(query(NULL_STREAM), CUresult::CUDA_SUCCESS, "nothing submitted there");
        gate.open();
        sync(before);
        sync(after);
        // Once the event completed, new work no longer waits.
        let (again, _open_again) = Gate::new();
        hold(again, driver(), held);
        memset_async(buffer.ptr, 3, 64, before);
        sync(before);
        again.open();
        assert_eq!(use_device(1), ctx1);
        sync(held);
    });
}

#[test]
fn limits_are_each_contexts_own_and_refused_where_cuda_h_says() {
    in_child!(&[], || {
        assert_eq!(get_limit(CUlimit::CU_LIMIT_STACK_SIZE), Err(CUresult::CUDA_ERROR_NOT_INITIALIZED));
        init();
        assert_eq!(get_limit(CUlimit::CU_LIMIT_STACK_SIZE), Err(INVALID_CONTEXT), "no current context");
        assert_eq!(set_limit(CUlimit::CU_LIMIT_STACK_SIZE, 4096), INVALID_CONTEXT);
        use_device(0);
        assert_eq!(get_limit(CUlimit::CU_LIMIT_STACK_SIZE), Ok(1024));
        assert_eq!(get_limit(CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE), Ok(8 << 20));
        assert_eq!(get_limit(CUlimit::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT), Ok(2048));
        assert_eq!(set_limit(CUlimit::CU_LIMIT_STACK_SIZE, 4096), CUresult::CUDA_SUCCESS);
        assert_eq!(set_limit(CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 1000), CUresult::CUDA_SUCCESS);
        assert_eq!(get_limit(CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY), Ok(128), "clamped to 128 bytes");
        assert_eq!(set_limit(CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 1 << 20), CUresult::CUDA_SUCCESS);
        assert_eq!(get_limit(CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE), Ok(0), "no persisting L2 here");
        let unsupported = CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT;
        assert_eq!(set_limit(CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4), unsupported, "compute capability 9.0");
        assert_eq!(get_limit(CUlimit::CU_LIMIT_CIG_ENABLED), Ok(0));
        assert_eq!(set_limit(CUlimit::CU_LIMIT_CIG_ENABLED, 1), INVALID_VALUE, "only queried");
        assert_eq!(get_limit(CUlimit::CU_LIMIT_MAX), Err(INVALID_VALUE));
        assert_eq!(set_limit(CUlimit(77), 1), INVALID_VALUE);
        // SAFETY: a null out-pointer is refused before any write.
        let null = unsafe { code!(driver(), cuCtxGetLimit(std::ptr::null_mut(), CUlimit::CU_LIMIT_STACK_SIZE)) };
        assert_eq!(null, INVALID_VALUE);
        // Another context has its own.
        let created = create(0);
        assert_eq!(get_limit(CUlimit::CU_LIMIT_STACK_SIZE), Ok(1024));
        assert_eq!(destroy(created), CUresult::CUDA_SUCCESS);
        assert_eq!(get_limit(CUlimit::CU_LIMIT_STACK_SIZE), Ok(4096));
    });
}

#[test]
fn the_cache_preference_is_kept_per_context() {
    let none = CUfunc_cache::CU_FUNC_CACHE_PREFER_NONE;
    assert_eq!(
        on_fresh_thread(|| {
            init();
            cache_config()
        }),
        Err(INVALID_CONTEXT)
    );
    assert_eq!(on_fresh_thread(move || set_cache_config(none)), INVALID_CONTEXT);
    let primary = use_device(0);
    let created = create(0);
    assert_eq!(cache_config(), Ok(none), "the default");
    assert_eq!(set_cache_config(CUfunc_cache::CU_FUNC_CACHE_PREFER_L1), CUresult::CUDA_SUCCESS);
    assert_eq!(cache_config(), Ok(CUfunc_cache::CU_FUNC_CACHE_PREFER_L1));
    assert_eq!(set_cache_config(CUfunc_cache(4)), INVALID_VALUE);
    assert_eq!(cache_config(), Ok(CUfunc_cache::CU_FUNC_CACHE_PREFER_L1), "unchanged by a refusal");
    // SAFETY: a null out-pointer is refused before any write.
    assert_eq!(unsafe { code!(driver(), cuCtxGetCacheConfig(std::ptr::null_mut())) }, INVALID_VALUE);
    assert_eq!(destroy(created), CUresult::CUDA_SUCCESS);
    assert_eq!(current(), primary);
    assert_eq!(cache_config(), Ok(none), "the primary context's is its own");
}
