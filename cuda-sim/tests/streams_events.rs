//! Streams (creation, flags, priorities, properties, destruction, queries), events (flags,
//! recording, queries, synchronization, elapsed time), host functions, and handles of the wrong
//! kind. The streams held by gates here are non-blocking, so other tests of the process that use
//! the legacy stream never wait for them.

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use common::{
    Gate, NULL_STREAM, OPEN_DELAY, Pinned, STREAM_LEGACY, STREAM_PER_THREAD, WATCHDOG, code, driver, event,
    event_query, in_child, memset_async, non_blocking_stream, query, record, sync, use_device,
};
use cuda_sys::types::{CUcontext, CUevent, CUevent_flags, CUresult, CUstream, CUstream_flags, CUstreamCaptureStatus};
use cuda_sys::{Driver, cu_call};

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
    gate.hold(d, s);
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
    gate.hold(d, s);
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
    gate.hold(d, s);
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
    gate.hold(d, s);
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
    gate.hold(d, s);
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
        cu_call!(d, cuStreamWaitEvent(s, e, 1)).unwrap();
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
        gate.hold(d, s0);
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
