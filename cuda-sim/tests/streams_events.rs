//! Streams (creation, flags, priorities, properties, destruction, queries), events (flags,
//! recording, queries, synchronization, elapsed time), host functions, handles of the wrong
//! kind, and the calls that invalidate a graph capture (in child processes: a context-wide
//! synchronization or a use of the legacy stream elsewhere in the process would invalidate
//! them, as on a GPU). The streams held by gates here are non-blocking, so other tests of the process that use
//! the legacy stream never wait for them.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use common::{
    Gate, NULL_STREAM, OPEN_DELAY, Pinned, STREAM_LEGACY, STREAM_PER_THREAD, WATCHDOG, blocking_stream, code, driver,
    event, event_query, in_child, memset_async, non_blocking_stream, query, record, sync, use_device,
};
use cuda_mem_sys::types::{
    CUcontext, CUdeviceptr, CUevent, CUevent_flags, CUgraph, CUresult, CUstream, CUstream_flags, CUstreamCaptureMode,
    CUstreamCaptureStatus,
};
use cuda_mem_sys::{Driver, cu_call};

fn create(flags: c_uint, priority: Option<c_int>) -> Result<CUstream, CUresult> {
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer.
    let result = unsafe {
        match priority {
            None => code!(driver(), cuStreamCreate(&mut s, flags)),
            Some(p) => code!(driver(), cuStreamCreateWithPriority(&mut s, flags, p)),
        }
    };
    if result == CUresult::CUDA_SUCCESS { Ok(s) } else { Err(result) }
}

fn destroy(s: CUstream) -> CUresult {
    // SAFETY: no pointers are dereferenced; unknown handles are rejected.
    unsafe { code!(driver(), cuStreamDestroy_v2(s)) }
}

/// (flags, priority, device, context, capture status) of a stream.
fn properties(s: CUstream) -> (c_uint, c_int, c_int, CUcontext, CUstreamCaptureStatus) {
    let d = driver();
    let (mut flags, mut priority, mut device) = (99, 99, 99);
    let mut ctx: CUcontext = std::ptr::null_mut();
    let mut status = CUstreamCaptureStatus(99);
    // SAFETY: every pointer is a valid out-pointer.
    unsafe {
        cu_call!(d, cuStreamGetFlags(s, &mut flags)).unwrap();
        cu_call!(d, cuStreamGetPriority(s, &mut priority)).unwrap();
        cu_call!(d, cuStreamGetDevice(s, &mut device)).unwrap();
        cu_call!(d, cuStreamGetCtx(s, &mut ctx)).unwrap();
        cu_call!(d, cuStreamIsCapturing(s, &mut status)).unwrap();
    }
    (flags, priority, device, ctx, status)
}

const NONE: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
const NON_BLOCKING: c_uint = CUstream_flags::CU_STREAM_NON_BLOCKING.0;

#[test]
fn stream_creation_flags_and_priorities() {
    let ctx = use_device(0);
    let s = create(0, None).unwrap();
    assert_eq!(properties(s), (0, 0, 0, ctx, NONE));
    let s = create(NON_BLOCKING, None).unwrap();
    assert_eq!(properties(s), (NON_BLOCKING, 0, 0, ctx, NONE));
    // Priorities outside [greatest, least] = [-5, 0] are clamped.
    for (asked, got) in
        [(0, 0), (-1, -1), (-5, -5), (-6, -5), (-100, -5), (1, 0), (7, 0), (c_int::MIN, -5), (c_int::MAX, 0)]
    {
        let s = create(NON_BLOCKING, Some(asked)).unwrap();
        assert_eq!(properties(s), (NON_BLOCKING, got, 0, ctx, NONE), "priority {asked}");
        assert_eq!(destroy(s), CUresult::CUDA_SUCCESS);
    }
    for flags in [2, 3, 4, 0x8000_0000] {
        assert_eq!(create(flags, None), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "flags {flags:#x}");
        assert_eq!(create(flags, Some(0)), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "flags {flags:#x}");
    }
    // SAFETY: null out-pointers are rejected.
    unsafe {
        let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
        assert_eq!(code!(driver(), cuStreamCreate(std::ptr::null_mut(), 0)), invalid);
        assert_eq!(code!(driver(), cuStreamCreateWithPriority(std::ptr::null_mut(), 0, 0)), invalid);
        assert_eq!(code!(driver(), cuStreamGetFlags(s, std::ptr::null_mut())), invalid);
        assert_eq!(code!(driver(), cuStreamGetPriority(s, std::ptr::null_mut())), invalid);
        assert_eq!(code!(driver(), cuStreamGetDevice(s, std::ptr::null_mut())), invalid);
        assert_eq!(code!(driver(), cuStreamGetCtx(s, std::ptr::null_mut())), invalid);
        assert_eq!(code!(driver(), cuStreamIsCapturing(s, std::ptr::null_mut())), invalid);
    }
    // The default streams: the current context's, blocking flags, priority 0.
    for s in [NULL_STREAM, STREAM_LEGACY, STREAM_PER_THREAD] {
        assert_eq!(properties(s), (0, 0, 0, ctx, NONE), "stream {s:?}");
        assert_eq!(query(s), CUresult::CUDA_SUCCESS);
        sync(s);
    }
}

#[test]
fn stream_destruction() {
    use_device(0);
    let s = create(0, None).unwrap();
    assert_eq!(destroy(s), CUresult::CUDA_SUCCESS);
    assert_eq!(destroy(s), CUresult::CUDA_ERROR_INVALID_HANDLE, "destroying twice");
    for default in [NULL_STREAM, STREAM_LEGACY, STREAM_PER_THREAD] {
        assert_eq!(destroy(default), CUresult::CUDA_ERROR_INVALID_HANDLE, "destroying default stream {default:?}");
    }
    assert_eq!(destroy(0xdead_0000 as CUstream), CUresult::CUDA_ERROR_INVALID_HANDLE);
    // A destroyed stream is an invalid handle everywhere.
    let d = driver();
    let pinned = Pinned::new(4);
    let e = event(CUevent_flags::CU_EVENT_DEFAULT);
    let mut flags = 0;
    let invalid = CUresult::CUDA_ERROR_INVALID_HANDLE;
    assert_eq!(query(s), invalid);
    // SAFETY: every pointer is valid for its call.
    unsafe {
        assert_eq!(code!(d, cuStreamSynchronize(s)), invalid);
        assert_eq!(code!(d, cuStreamGetFlags(s, &mut flags)), invalid);
        assert_eq!(code!(d, cuStreamWaitEvent(s, e, 0)), invalid);
        assert_eq!(code!(d, cuEventRecord(e, s)), invalid);
        assert_eq!(code!(d, cuMemsetD8Async(pinned.dptr(), 1, 4, s)), invalid);
        assert_eq!(code!(d, cuMemcpyAsync(pinned.dptr(), pinned.dptr(), 4, s)), invalid);
        assert_eq!(code!(d, cuLaunchHostFunc(s, Some(common::wait_for_gate), std::ptr::null_mut())), invalid);
    }
    assert_eq!(pinned.read(), [0; 4]);
}

#[test]
fn destroying_a_stream_lets_its_pending_work_finish() {
    use_device(0);
    let d = driver();
    let pinned = Pinned::new(8);
    let s = non_blocking_stream();
    let e = event(CUevent_flags::CU_EVENT_DEFAULT);
    let (gate, _guard) = Gate::new();
    common::hold(gate, d, s);
    memset_async(pinned.dptr(), 5, 8, s);
    record(e, s);
    let watchdog = gate.watchdog(WATCHDOG);
    assert_eq!(destroy(s), CUresult::CUDA_SUCCESS);
    assert!(!gate.is_open(), "cuStreamDestroy waited for the stream's work (watchdog fired: {watchdog:?})");
    assert_eq!(pinned.read(), [0; 8]);
    gate.open();
    // SAFETY: no pointers.
    unsafe { cu_call!(d, cuEventSynchronize(e)) }.unwrap();
    assert_eq!(pinned.read(), [5; 8], "work enqueued before cuStreamDestroy still completes");
}

#[test]
fn stream_query_is_not_ready_while_work_is_pending() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let pinned = Pinned::new(16);
    assert_eq!(query(s), CUresult::CUDA_SUCCESS, "an empty stream is idle");
    let (gate, _guard) = Gate::new();
    common::hold(gate, d, s);
    memset_async(pinned.dptr(), 9, 16, s);
    for _ in 0..3 {
        assert_eq!(query(s), CUresult::CUDA_ERROR_NOT_READY);
    }
    gate.wait_entered(1);
    assert_eq!(query(s), CUresult::CUDA_ERROR_NOT_READY);
    assert_eq!(pinned.read(), [0; 16]);
    gate.open();
    sync(s);
    assert_eq!(query(s), CUresult::CUDA_SUCCESS);
    assert_eq!(pinned.read(), [9; 16]);
}

#[test]
fn stream_synchronize_waits_for_the_stream() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let pinned = Pinned::new(16);
    let (gate, _guard) = Gate::new();
    common::hold(gate, d, s);
    memset_async(pinned.dptr(), 3, 16, s);
    gate.open_after(OPEN_DELAY);
    sync(s);
    assert!(gate.is_open());
    assert_eq!(pinned.read(), [3; 16], "cuStreamSynchronize returned before the memset ran");
}

fn create_event(flags: c_uint) -> Result<CUevent, CUresult> {
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer.
    match unsafe { code!(driver(), cuEventCreate(&mut e, flags)) } {
        CUresult::CUDA_SUCCESS => Ok(e),
        error => Err(error),
    }
}

fn elapsed(start: CUevent, end: CUevent) -> Result<f32, CUresult> {
    let mut ms = f32::NAN;
    // SAFETY: `ms` is a valid out-pointer.
    match unsafe { code!(driver(), cuEventElapsedTime_v2(&mut ms, start, end)) } {
        CUresult::CUDA_SUCCESS => Ok(ms),
        error => Err(error),
    }
}

#[test]
fn event_creation_flags() {
    use CUevent_flags as F;
    use_device(0);
    let (blocking, no_timing, ipc) =
        (F::CU_EVENT_BLOCKING_SYNC.0, F::CU_EVENT_DISABLE_TIMING.0, F::CU_EVENT_INTERPROCESS.0);
    for flags in [0, blocking, no_timing, blocking | no_timing, ipc | no_timing, ipc | no_timing | blocking] {
        let e = create_event(flags).unwrap_or_else(|code| panic!("flags {flags:#x}: {code:?}"));
        assert_eq!(event_query(e), CUresult::CUDA_SUCCESS, "a new event is complete");
    }
    // CU_EVENT_INTERPROCESS needs CU_EVENT_DISABLE_TIMING; unknown bits are invalid.
    for flags in [ipc, ipc | blocking, 0x8, 0x100, 0x8000_0000] {
        assert_eq!(create_event(flags), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "flags {flags:#x}");
    }
    // SAFETY: a null out-pointer is rejected.
    let null_out = unsafe { code!(driver(), cuEventCreate(std::ptr::null_mut(), 0)) };
    assert_eq!(null_out, CUresult::CUDA_ERROR_INVALID_VALUE);
}

#[test]
fn event_record_query_synchronize_and_elapsed_time() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let (start, end) = (event(CUevent_flags::CU_EVENT_DEFAULT), event(CUevent_flags::CU_EVENT_BLOCKING_SYNC));
    // Never recorded: complete, synchronize returns at once, but no time to measure.
    assert_eq!(event_query(start), CUresult::CUDA_SUCCESS);
    // SAFETY: no pointers.
    unsafe { cu_call!(d, cuEventSynchronize(start)) }.unwrap();
    assert_eq!(elapsed(start, end), Err(CUresult::CUDA_ERROR_INVALID_HANDLE), "never recorded");

    let pinned = Pinned::new(1 << 16);
    record(start, s);
    sync(s);
    assert_eq!(elapsed(start, end), Err(CUresult::CUDA_ERROR_INVALID_HANDLE), "end never recorded");
    assert_eq!(elapsed(end, start), Err(CUresult::CUDA_ERROR_INVALID_HANDLE), "start never recorded");
    memset_async(pinned.dptr(), 1, 1 << 16, s);
    record(end, s);
    // SAFETY: no pointers.
    unsafe { cu_call!(d, cuEventSynchronize(end)) }.unwrap();
    assert_eq!(event_query(start), CUresult::CUDA_SUCCESS);
    assert_eq!(event_query(end), CUresult::CUDA_SUCCESS);
    assert_eq!(pinned.read()[(1 << 16) - 1], 1, "the work before the event is done");
    let ms = elapsed(start, end).unwrap();
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");
    assert_eq!(elapsed(start, start), Ok(0.0));
    // SAFETY: a null out-pointer is rejected.
    let null_out = unsafe { code!(d, cuEventElapsedTime_v2(std::ptr::null_mut(), start, end)) };
    assert_eq!(null_out, CUresult::CUDA_ERROR_INVALID_VALUE);

    // Events can be recorded on the default streams too.
    for default in [NULL_STREAM, STREAM_LEGACY, STREAM_PER_THREAD] {
        record(end, default);
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuEventSynchronize(end)) }.unwrap();
        assert_eq!(event_query(end), CUresult::CUDA_SUCCESS);
    }

    // Timing disabled: recorded or not, elapsed time is an invalid handle.
    let untimed = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
    record(untimed, s);
    sync(s);
    assert_eq!(elapsed(start, untimed), Err(CUresult::CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(elapsed(untimed, end), Err(CUresult::CUDA_ERROR_INVALID_HANDLE));

    // A recording still pending: NOT_READY, for the query and for elapsed time.
    let (gate, _guard) = Gate::new();
    common::hold(gate, d, s);
    record(end, s);
    assert_eq!(event_query(end), CUresult::CUDA_ERROR_NOT_READY);
    assert_eq!(elapsed(start, end), Err(CUresult::CUDA_ERROR_NOT_READY));
    assert_eq!(elapsed(end, start), Err(CUresult::CUDA_ERROR_NOT_READY));
    gate.open();
    // SAFETY: no pointers.
    unsafe { cu_call!(d, cuEventSynchronize(end)) }.unwrap();
    assert_eq!(event_query(end), CUresult::CUDA_SUCCESS);
    assert!(elapsed(start, end).unwrap() >= ms);

    // Destruction.
    // SAFETY: no pointers are dereferenced; unknown handles are rejected.
    unsafe {
        cu_call!(d, cuEventDestroy_v2(end)).unwrap();
        assert_eq!(code!(d, cuEventDestroy_v2(end)), CUresult::CUDA_ERROR_INVALID_HANDLE, "destroying twice");
        assert_eq!(code!(d, cuEventSynchronize(end)), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(code!(d, cuEventRecord(end, s)), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(code!(d, cuStreamWaitEvent(s, end, 0)), CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    assert_eq!(event_query(end), CUresult::CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(elapsed(start, end), Err(CUresult::CUDA_ERROR_INVALID_HANDLE));
}

#[test]
fn event_synchronize_waits_for_the_recording() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let pinned = Pinned::new(8);
    let e = event(CUevent_flags::CU_EVENT_BLOCKING_SYNC);
    let (gate, _guard) = Gate::new();
    common::hold(gate, d, s);
    memset_async(pinned.dptr(), 4, 8, s);
    record(e, s);
    gate.open_after(OPEN_DELAY);
    // SAFETY: no pointers.
    unsafe { cu_call!(d, cuEventSynchronize(e)) }.unwrap();
    assert_eq!(pinned.read(), [4; 8], "cuEventSynchronize returned before the work before the event ran");
}

#[test]
fn handles_of_one_kind_are_rejected_as_another() {
    let ctx = use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let e = event(CUevent_flags::CU_EVENT_DEFAULT);
    let (as_event, as_stream) = (s as usize as CUevent, e as usize as CUstream);
    let invalid = CUresult::CUDA_ERROR_INVALID_HANDLE;
    let mut ms = 0.0;
    let mut flags = 0;
    // SAFETY: every pointer is a valid out-pointer; the handles are only looked up.
    unsafe {
        assert_eq!(code!(d, cuEventQuery(as_event)), invalid);
        assert_eq!(code!(d, cuEventSynchronize(as_event)), invalid);
        assert_eq!(code!(d, cuEventRecord(as_event, s)), invalid);
        assert_eq!(code!(d, cuEventRecord(as_event, NULL_STREAM)), invalid);
        assert_eq!(code!(d, cuStreamWaitEvent(s, as_event, 0)), invalid);
        assert_eq!(code!(d, cuEventElapsedTime_v2(&mut ms, as_event, e)), invalid);
        assert_eq!(code!(d, cuEventDestroy_v2(as_event)), invalid);
        assert_eq!(code!(d, cuStreamQuery(as_stream)), invalid);
        assert_eq!(code!(d, cuStreamSynchronize(as_stream)), invalid);
        assert_eq!(code!(d, cuStreamGetFlags(as_stream, &mut flags)), invalid);
        assert_eq!(code!(d, cuEventRecord(e, as_stream)), invalid);
        assert_eq!(code!(d, cuStreamDestroy_v2(as_stream)), invalid);
        assert_eq!(code!(d, cuStreamQuery(ctx as usize as CUstream)), invalid);
        assert_eq!(code!(d, cuEventQuery(ctx as usize as CUevent)), invalid);
        assert_eq!(code!(d, cuEventQuery(std::ptr::null_mut())), invalid);
    }
    // Both are still alive and usable.
    record(e, s);
    sync(s);
    assert_eq!(event_query(e), CUresult::CUDA_SUCCESS);
}

#[test]
fn stream_wait_event_flags_and_unrecorded_events() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let e = event(CUevent_flags::CU_EVENT_DEFAULT);
    // SAFETY: no pointers.
    unsafe {
        assert_eq!(code!(d, cuStreamWaitEvent(s, e, 2)), CUresult::CUDA_ERROR_INVALID_VALUE);
        // `CU_EVENT_WAIT_EXTERNAL` "is invalid outside of stream capture".
        assert_eq!(code!(d, cuStreamWaitEvent(s, e, 1)), CUresult::CUDA_ERROR_INVALID_VALUE);
        cu_call!(d, cuStreamWaitEvent(s, e, 0)).unwrap();
        cu_call!(d, cuStreamWaitEvent(NULL_STREAM, e, 0)).unwrap();
    }
    // Waiting for a never-recorded event waits for nothing.
    let pinned = Pinned::new(4);
    memset_async(pinned.dptr(), 6, 4, s);
    sync(s);
    assert_eq!(pinned.read(), [6; 4]);
}

#[test]
fn recording_an_event_on_a_stream_of_another_context_is_invalid() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let d = driver();
        let c0 = use_device(0);
        let e0 = event(CUevent_flags::CU_EVENT_DEFAULT);
        let s0 = non_blocking_stream();
        let c1 = use_device(1);
        let s1 = non_blocking_stream();
        let (ctx, device) = (properties(s1).3, properties(s1).2);
        assert_eq!((ctx, device), (c1, 1));
        assert_eq!(properties(s0).3, c0, "a stream's context is its own, not the current one");
        // SAFETY: no pointers.
        unsafe {
            assert_eq!(code!(d, cuEventRecord(e0, s1)), CUresult::CUDA_ERROR_INVALID_HANDLE);
            assert_eq!(code!(d, cuEventRecord(e0, NULL_STREAM)), CUresult::CUDA_ERROR_INVALID_HANDLE);
            // A stream of another context is fine while a different one is current.
            cu_call!(d, cuEventRecord(e0, s0)).unwrap();
        }
        // Waiting on an event of another context is allowed, and orders the streams.
        let pinned = Pinned::new(2);
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, s0);
        memset_async(pinned.dptr(), 1, 2, s0);
        record(e0, s0);
        common::wait_event(s1, e0);
        memset_async(pinned.dptr() + 1, 2, 1, s1);
        assert_eq!(query(s1), CUresult::CUDA_ERROR_NOT_READY);
        assert_eq!(pinned.read(), [0, 0]);
        gate.open();
        sync(s1);
        assert_eq!(pinned.read(), [1, 2], "device 1's stream ran after device 0's event");
    });
}

/// What [`note_byte`] reads and where it writes.
struct Notes {
    byte: *const u8,
    seen: Mutex<Vec<u8>>,
}

extern "C" fn note_byte(data: *mut c_void) {
    // SAFETY: the test passes a leaked `Notes`.
    let notes = unsafe { &*data.cast::<Notes>() };
    // SAFETY: `byte` is pinned memory that outlives the stream's work.
    let value = unsafe { notes.byte.read_volatile() };
    notes.seen.lock().unwrap().push(value);
}

#[test]
fn host_functions_run_in_stream_order() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let pinned = Pinned::new(1);
    let notes: &'static Notes = Box::leak(Box::new(Notes { byte: pinned.ptr, seen: Mutex::new(Vec::new()) }));
    let data = std::ptr::from_ref(notes).cast_mut().cast::<c_void>();
    for i in 1..=20 {
        memset_async(pinned.dptr(), i, 1, s);
        // SAFETY: `note_byte` takes a leaked `Notes`.
        unsafe { cu_call!(d, cuLaunchHostFunc(s, Some(note_byte), data)) }.unwrap();
    }
    sync(s);
    assert_eq!(*notes.seen.lock().unwrap(), (1..=20).collect::<Vec<u8>>());
    // On the legacy stream too.
    notes.seen.lock().unwrap().clear();
    memset_async(pinned.dptr(), 42, 1, NULL_STREAM);
    // SAFETY: as above.
    unsafe { cu_call!(d, cuLaunchHostFunc(NULL_STREAM, Some(note_byte), data)) }.unwrap();
    sync(NULL_STREAM);
    assert_eq!(*notes.seen.lock().unwrap(), [42]);
}

/// What [`call_the_driver`] calls and the codes it got.
struct Inside {
    driver: &'static Driver,
    codes: Mutex<Vec<(&'static str, CUresult)>>,
}

extern "C" fn call_the_driver(data: *mut c_void) {
    // SAFETY: the test passes a leaked `Inside`.
    let inside = unsafe { &*data.cast::<Inside>() };
    let d = inside.driver;
    let (mut count, mut version, mut ptr) = (0, 0, 0);
    // SAFETY: every pointer is a valid out-pointer.
    let codes = unsafe {
        [
            ("cuDeviceGetCount", code!(d, cuDeviceGetCount(&mut count))),
            ("cuDriverGetVersion", code!(d, cuDriverGetVersion(&mut version))),
            ("cuMemAlloc_v2", code!(d, cuMemAlloc_v2(&mut ptr, 16))),
            ("cuStreamQuery", code!(d, cuStreamQuery(NULL_STREAM))),
            ("cuCtxSynchronize", code!(d, cuCtxSynchronize())),
        ]
    };
    inside.codes.lock().unwrap().extend(codes);
}

#[test]
fn driver_calls_from_a_host_function_are_not_permitted() {
    use_device(0);
    let d = driver();
    // Resolve every entry point on this thread first.
    let _ = (d.cuDeviceGetCount(), d.cuDriverGetVersion(), d.cuMemAlloc_v2(), d.cuStreamQuery(), d.cuCtxSynchronize());
    let inside: &'static Inside = Box::leak(Box::new(Inside { driver: d, codes: Mutex::new(Vec::new()) }));
    let s = non_blocking_stream();
    let data = std::ptr::from_ref(inside).cast_mut().cast::<c_void>();
    // SAFETY: `call_the_driver` takes a leaked `Inside`.
    unsafe { cu_call!(d, cuLaunchHostFunc(s, Some(call_the_driver), data)) }.unwrap();
    sync(s);
    let codes = inside.codes.lock().unwrap().clone();
    assert_eq!(codes.len(), 5);
    for (function, code) in codes {
        assert_eq!(code, CUresult::CUDA_ERROR_NOT_PERMITTED, "{function} from a host function");
    }
    // The stream and this thread are unaffected.
    assert_eq!(query(s), CUresult::CUDA_SUCCESS);
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGetCount(&mut count)) }.unwrap();
    assert!(count >= 1);
}

#[test]
fn launch_host_func_needs_a_function() {
    use_device(0);
    let s = non_blocking_stream();
    // SAFETY: a null function is rejected before anything runs.
    let result = unsafe { code!(driver(), cuLaunchHostFunc(s, None, std::ptr::null_mut())) };
    assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(query(s), CUresult::CUDA_SUCCESS, "nothing was enqueued");
}

const ACTIVE: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
const INVALIDATED: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED;
const UNSUPPORTED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
const CAPTURE_INVALIDATED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
const IMPLICIT: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;

/// A driver call on one argument, with its name for the assertion messages.
type NamedCall<T> = (&'static str, fn(T) -> CUresult);

fn capture_status(s: CUstream) -> Result<CUstreamCaptureStatus, CUresult> {
    let mut status = CUstreamCaptureStatus(99);
    // SAFETY: `status` is a valid out-pointer.
    match unsafe { code!(driver(), cuStreamIsCapturing(s, &mut status)) } {
        CUresult::CUDA_SUCCESS => Ok(status),
        error => Err(error),
    }
}

/// Begins a capture in global mode (the default, and the strictest).
fn begin_capture(s: CUstream) {
    let global = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuStreamBeginCapture_v2(s, global)) }.unwrap();
}

/// Ends a capture: the code, and the graph written (a non-null marker if none was written).
fn end_capture(s: CUstream) -> (CUresult, CUgraph) {
    let mut graph = 0x5eed as CUgraph;
    // SAFETY: `graph` is a valid out-pointer.
    let code = unsafe { code!(driver(), cuStreamEndCapture(s, &mut graph)) };
    (code, graph)
}

/// Ends a capture that must still be valid, and destroys its graph.
fn end_valid_capture(s: CUstream) {
    let (code, graph) = end_capture(s);
    assert_eq!(code, CUresult::CUDA_SUCCESS);
    // SAFETY: a graph cuStreamEndCapture returned, destroyed once.
    unsafe { cu_call!(driver(), cuGraphDestroy(graph)) }.unwrap();
}

/// Ends a capture that was invalidated: the error, a NULL graph, and the stream not capturing.
#[track_caller]
fn end_invalidated_capture(s: CUstream) {
    let (code, graph) = end_capture(s);
    assert_eq!((code, graph), (CAPTURE_INVALIDATED, std::ptr::null_mut()), "cuStreamEndCapture");
    assert_eq!(capture_status(s), Ok(NONE), "the stream is out of capture");
}

fn memset_code(dst: CUdeviceptr, value: u8, len: usize, s: CUstream) -> CUresult {
    // SAFETY: no host pointers; the range is checked by the driver.
    unsafe { code!(driver(), cuMemsetD8Async(dst, value, len, s)) }
}

fn sync_code(s: CUstream) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuStreamSynchronize(s)) }
}

fn event_sync_code(e: CUevent) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuEventSynchronize(e)) }
}

fn ctx_sync_code() -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuCtxSynchronize()) }
}

fn alloc_async_code(len: usize, s: CUstream) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocAsync(&mut ptr, len, s)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn free_async_code(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    // SAFETY: no host pointers.
    unsafe { code!(driver(), cuMemFreeAsync(ptr, s)) }
}

/// cuda.h's programming model: synchronizing or querying a capturing stream is not permitted
/// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and invalidates the capture; the stream then
/// refuses work until the capture is ended, which returns no graph.
#[test]
fn synchronizing_or_querying_a_capturing_stream_invalidates_the_capture() {
    in_child!(&[], || {
        use_device(0);
        let waits: [NamedCall<CUstream>; 2] = [("cuStreamSynchronize", sync_code), ("cuStreamQuery", query)];
        for flags in [0, NON_BLOCKING] {
            for (call, wait) in waits {
                let s = create(flags, None).unwrap();
                let pinned = Pinned::new(16);
                let held = alloc_async_code(64, s).unwrap();
                begin_capture(s);
                memset_async(pinned.dptr(), 9, 16, s);
                assert_eq!(wait(s), UNSUPPORTED, "{call}");
                assert_eq!(capture_status(s), Ok(INVALIDATED), "{call} invalidated the capture");
                assert_eq!(wait(s), CAPTURE_INVALIDATED, "{call} again");
                // Work on the stream is refused, and refused work has no effect.
                assert_eq!(memset_code(pinned.dptr(), 1, 16, s), CAPTURE_INVALIDATED);
                let e = event(CUevent_flags::CU_EVENT_DEFAULT);
                // SAFETY: no pointers.
                assert_eq!(unsafe { code!(driver(), cuEventRecord(e, s)) }, CAPTURE_INVALIDATED);
                assert_eq!(alloc_async_code(64, s), Err(CAPTURE_INVALIDATED));
                assert_eq!(free_async_code(held, s), CAPTURE_INVALIDATED);
                // SAFETY: no pointers.
                let begin = unsafe {
                    code!(driver(), cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL))
                };
                assert_eq!(begin, CUresult::CUDA_ERROR_ILLEGAL_STATE, "the invalidated capture is not over");
                end_invalidated_capture(s);
                // The stream works again; the captured memset never ran, the refused free did
                // not happen.
                assert_eq!(free_async_code(held, s), CUresult::CUDA_SUCCESS);
                sync(s);
                assert_eq!(pinned.read(), [0; 16], "{call}: the discarded work never ran");
                memset_async(pinned.dptr(), 3, 16, s);
                sync(s);
                assert_eq!(pinned.read(), [3; 16]);
                assert_eq!(destroy(s), CUresult::CUDA_SUCCESS);
            }
        }
    });
}

/// `CUDA_ERROR_CAPTURED_EVENT`: "the operation is not permitted on an event which was last
/// recorded in a capturing stream". Querying or waiting for one invalidates its capture.
#[test]
fn querying_or_waiting_for_an_event_recorded_in_a_capture_invalidates_it() {
    in_child!(&[], || {
        use_device(0);
        let captured = CUresult::CUDA_ERROR_CAPTURED_EVENT;
        let waits: [NamedCall<CUevent>; 2] = [("cuEventQuery", event_query), ("cuEventSynchronize", event_sync_code)];
        for (call, wait) in waits {
            let s = non_blocking_stream();
            let e = event(CUevent_flags::CU_EVENT_DEFAULT);
            record(e, s);
            sync(s);
            begin_capture(s);
            record(e, s);
            assert_eq!(wait(e), captured, "{call}");
            assert_eq!(capture_status(s), Ok(INVALIDATED), "{call} invalidated the capture");
            end_invalidated_capture(s);
            assert_eq!(wait(e), captured, "{call}: still last recorded in a capture");
            record(e, s);
            sync(s);
            assert_eq!(wait(e), CUresult::CUDA_SUCCESS, "{call}: recorded outside a capture again");
        }
        // An event of an earlier capture is refused but leaves a later capture alone.
        let s = non_blocking_stream();
        let e = event(CUevent_flags::CU_EVENT_DEFAULT);
        begin_capture(s);
        record(e, s);
        end_valid_capture(s);
        begin_capture(s);
        assert_eq!(event_query(e), captured);
        assert_eq!(capture_status(s), Ok(ACTIVE), "another capture sequence");
        end_valid_capture(s);
    });
}

/// `cuEventElapsedTime` asks what `cuEventQuery` asks of both events (`cuda.h`: not ready when
/// "::cuEventQuery() would return ::CUDA_ERROR_NOT_READY on at least one of the events"), so an
/// event last recorded in a capture is refused as there, and its capture invalidated, rather than
/// timed by its earlier recording.
#[test]
fn elapsed_time_refuses_an_event_recorded_in_a_capture() {
    in_child!(&[], || {
        use_device(0);
        let captured = CUresult::CUDA_ERROR_CAPTURED_EVENT;
        let s = non_blocking_stream();
        let (start, end) = (event(CUevent_flags::CU_EVENT_DEFAULT), event(CUevent_flags::CU_EVENT_DEFAULT));
        record(start, s);
        record(end, s);
        sync(s);
        assert!(elapsed(start, end).is_ok(), "both recorded and complete");
        begin_capture(s);
        record(end, s);
        assert_eq!(elapsed(start, end), Err(captured), "the end event was last recorded in the capture");
        assert_eq!(capture_status(s), Ok(INVALIDATED), "the call invalidated the capture");
        end_invalidated_capture(s);
        assert_eq!(elapsed(end, start), Err(captured), "as the start event, after the capture ended");
        record(end, s);
        sync(s);
        assert!(elapsed(start, end).is_ok(), "recorded outside a capture again");
    });
}

/// As `cuda.h` documents for `cuCtxRecordEvent` and `cuCtxWaitEvent`: a context-wide operation
/// while a stream of the context captures is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and
/// invalidates every such capture.
#[test]
fn synchronizing_a_context_with_a_capturing_stream_invalidates_every_capture() {
    in_child!(&[], || {
        use_device(0);
        let (a, b, idle) = (non_blocking_stream(), blocking_stream(), non_blocking_stream());
        // Allocated first: `cuMemAllocHost` is prohibited during a global-mode capture.
        let pinned = Pinned::new(16);
        begin_capture(a);
        begin_capture(b);
        memset_async(pinned.dptr(), 5, 16, idle);
        assert_eq!(ctx_sync_code(), UNSUPPORTED);
        assert_eq!((capture_status(a), capture_status(b)), (Ok(INVALIDATED), Ok(INVALIDATED)));
        assert_eq!(capture_status(idle), Ok(NONE));
        end_invalidated_capture(a);
        end_invalidated_capture(b);
        assert_eq!(ctx_sync_code(), CUresult::CUDA_SUCCESS);
        assert_eq!(pinned.read(), [5; 16], "work on other streams was not disturbed");
    });
}

/// `cuda.h`, `cuStreamIsCapturing`: "When a blocking stream is capturing, the legacy stream is in
/// an unusable state until the blocking stream capture is terminated"; asking it for its status
/// is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` and invalidates nothing. Using it (work, waits,
/// queries, synchronous copies) is the same error and invalidates the blocking captures.
#[test]
fn the_legacy_stream_is_unusable_while_a_blocking_stream_captures() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(16);
        // A non-blocking capture does not involve the legacy stream.
        let free_standing = non_blocking_stream();
        begin_capture(free_standing);
        memset_async(pinned.dptr(), 1, 16, NULL_STREAM);
        sync(NULL_STREAM);
        assert_eq!(capture_status(NULL_STREAM), Ok(NONE));
        end_valid_capture(free_standing);

        let blocking = blocking_stream();
        begin_capture(blocking);
        assert_eq!(capture_status(NULL_STREAM), Err(IMPLICIT));
        assert_eq!(capture_status(STREAM_LEGACY), Err(IMPLICIT));
        assert_eq!(capture_status(blocking), Ok(ACTIVE), "asking invalidates nothing");
        let uses: [NamedCall<CUdeviceptr>; 4] = [
            ("cuMemsetD8Async", |dst| memset_code(dst, 2, 16, NULL_STREAM)),
            ("cuStreamSynchronize", |_| sync_code(STREAM_LEGACY)),
            ("cuStreamQuery", |_| query(NULL_STREAM)),
            ("cuMemcpyHtoD", |dst| {
                let bytes = [4u8; 16];
                // SAFETY: `bytes` is valid for 16 bytes during this synchronous copy.
                unsafe { code!(driver(), cuMemcpyHtoD_v2(dst, bytes.as_ptr().cast(), 16)) }
            }),
        ];
        for (call, use_legacy) in uses {
            if capture_status(blocking) == Ok(NONE) {
                begin_capture(blocking);
            }
            assert_eq!(use_legacy(pinned.dptr()), IMPLICIT, "{call}");
            assert_eq!(capture_status(blocking), Ok(INVALIDATED), "{call} invalidated the capture");
            assert_eq!(use_legacy(pinned.dptr()), IMPLICIT, "{call}: unusable until the capture ends");
            end_invalidated_capture(blocking);
        }
        assert_eq!(pinned.read(), [1; 16], "nothing the legacy stream refused ran");
        memset_async(pinned.dptr(), 6, 16, NULL_STREAM);
        sync(NULL_STREAM);
        assert_eq!(pinned.read(), [6; 16], "usable again once the capture ended");
    });
}

#[test]
fn calls_are_counted_by_function_and_any_one_of_them_can_be_failed() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let per_thread = common::per_thread_driver();
        let s = non_blocking_stream();
        // SAFETY: a live stream and the calling thread's per-thread default stream.
        let both = || unsafe { (code!(d, cuStreamQuery(s)), code!(per_thread, cuStreamQuery(NULL_STREAM))) };
        let (codes, calls) = cuda_sim::testing::count_calls(d, both).unwrap();
        assert_eq!(codes, (CUresult::CUDA_SUCCESS, CUresult::CUDA_SUCCESS));
        // The per-thread variant counts under the plain name; the simulator's controls not at all.
        assert_eq!(calls.iter().collect::<Vec<_>>(), [("cuStreamQuery", 2)]);
        let injections: Vec<_> = calls.injections().map(|i| i.to_string()).collect();
        assert_eq!(injections, ["call 1 of cuStreamQuery failing", "call 2 of cuStreamQuery failing"]);

        let second = cuda_sim::testing::Injection { function: "cuStreamQuery", nth: 2 };
        let (codes, fired) = cuda_sim::testing::run_failing(d, second, both).unwrap();
        assert_eq!(codes, (CUresult::CUDA_SUCCESS, CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(fired);
        // A failure armed beyond the calls made does not fire, says so, and stays armed.
        let third = cuda_sim::testing::Injection { function: "cuStreamQuery", nth: 3 };
        let (codes, fired) = cuda_sim::testing::run_failing(d, third, both).unwrap();
        assert_eq!(codes, (CUresult::CUDA_SUCCESS, CUresult::CUDA_SUCCESS));
        assert!(!fired);
        assert_eq!(query(s), CUresult::CUDA_ERROR_OUT_OF_MEMORY, "the third call");
    });
}
