//! Asynchronous stream ordering, shown deterministically: a host function blocked on a [`Gate`]
//! holds a stream, and the test checks what has and has not happened before it opens the gate.
//! Calls that must not wait run under a watchdog (the test fails if the watchdog had to open the
//! gate); calls that must wait race an opener (the test fails if the effect is missing when they
//! return). Each test runs in a child process, so that no other test's work shares its streams.

mod common;

use std::ffi::c_void;
use std::time::Duration;

use common::{
    DeviceBuffer, Gate, NULL_STREAM, OPEN_DELAY, Pinned, STREAM_LEGACY, STREAM_PER_THREAD, WATCHDOG, blocking_stream,
    code, driver, dtoh, event, event_query, in_child, memset_async, non_blocking_stream, per_thread_driver, query,
    record, sync, use_device, wait_event,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUdeviceptr, CUevent_flags, CUresult, CUstream};

const NOT_READY: CUresult = CUresult::CUDA_ERROR_NOT_READY;
const SUCCESS: CUresult = CUresult::CUDA_SUCCESS;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// Reads device memory through a fresh non-blocking stream, which waits for nothing else: what
/// the memory holds *now*, in stream order of that stream only.
fn peek(src: CUdeviceptr, len: usize) -> Vec<u8> {
    let s = non_blocking_stream();
    let pinned = Pinned::new(len);
    // SAFETY: `pinned` is valid for `len` bytes until the stream is synchronized.
    unsafe { cu_call!(driver(), cuMemcpyDtoHAsync_v2(pinned.ptr.cast(), src, len, s)) }.unwrap();
    sync(s);
    pinned.read()
}

#[test]
fn an_async_copy_behind_a_blocked_host_function_waits_for_it() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let n = 4096;
        let src = DeviceBuffer::with(&pattern(n, 1));
        for s in [non_blocking_stream(), blocking_stream()] {
            let pinned = Pinned::new(n);
            let done = event(CUevent_flags::CU_EVENT_DEFAULT);
            let (gate, _guard) = Gate::new();
            common::hold(gate, d, s);
            // SAFETY: `pinned` is valid for `n` bytes until the stream is synchronized.
            unsafe { cu_call!(d, cuMemcpyDtoHAsync_v2(pinned.ptr.cast(), src.ptr, n, s)) }.unwrap();
            record(done, s);
            gate.wait_entered(1);
            for _ in 0..3 {
                assert_eq!(query(s), NOT_READY);
                assert_eq!(event_query(done), NOT_READY);
                assert_eq!(pinned.read(), vec![0; n], "the copy ran before the host function returned");
            }
            gate.open();
            sync(s);
            assert_eq!(pinned.read(), pattern(n, 1));
            assert_eq!(query(s), SUCCESS);
            assert_eq!(event_query(done), SUCCESS);
        }
    });
}

#[test]
fn stream_wait_event_orders_a_stream_after_another() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let (a, b) = (non_blocking_stream(), non_blocking_stream());
        let (first, second) = (Pinned::new(64), Pinned::new(64));
        let e = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, a);
        memset_async(first.dptr(), 7, 64, a);
        record(e, a);
        wait_event(b, e);
        // B copies what A wrote: had it not waited, it would copy zeros.
        // SAFETY: both pinned buffers are valid for 64 bytes until the streams are synchronized.
        unsafe { cu_call!(d, cuMemcpyAsync(second.dptr(), first.dptr(), 64, b)) }.unwrap();
        gate.wait_entered(1);
        assert_eq!(query(b), NOT_READY);
        assert_eq!(event_query(e), NOT_READY);
        assert_eq!(second.read(), [0; 64]);
        gate.open();
        sync(b);
        assert_eq!(second.read(), [7; 64], "B ran before A's event");
        assert_eq!(event_query(e), SUCCESS);
    });
}

#[test]
fn a_wait_is_for_the_recording_current_when_it_was_enqueued() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let (a, b, c) = (non_blocking_stream(), non_blocking_stream(), non_blocking_stream());
        let pinned = Pinned::new(2);
        let e = event(CUevent_flags::CU_EVENT_DEFAULT);

        // Recorded on A (held by gate 1), waited for by B, then recorded again on C (held by
        // gate 2): B waits for the first recording only.
        let (gate1, _guard1) = Gate::new();
        let (gate2, _guard2) = Gate::new();
        common::hold(gate1, d, a);
        record(e, a);
        wait_event(b, e);
        memset_async(pinned.dptr(), 1, 1, b);
        common::hold(gate2, d, c);
        record(e, c);
        assert_eq!(query(b), NOT_READY);
        gate1.open();
        let watchdog = gate2.watchdog(WATCHDOG);
        sync(b);
        assert!(!gate2.is_open(), "B waited for a later recording (watchdog fired: {watchdog:?})");
        assert_eq!(pinned.read()[0], 1);
        assert_eq!(event_query(e), NOT_READY, "the latest recording is still pending");
        gate2.open();
        sync(c);
        assert_eq!(event_query(e), SUCCESS);

        // A wait enqueued before the event is ever recorded waits for nothing, even if the
        // event is recorded (behind a held stream) right after.
        let fresh = event(CUevent_flags::CU_EVENT_DEFAULT);
        let (gate3, _guard3) = Gate::new();
        wait_event(b, fresh);
        memset_async(pinned.dptr() + 1, 2, 1, b);
        common::hold(gate3, d, a);
        record(fresh, a);
        let watchdog = gate3.watchdog(WATCHDOG);
        sync(b);
        assert!(!gate3.is_open(), "B waited for a recording made after its wait (watchdog fired: {watchdog:?})");
        assert_eq!(pinned.read(), [1, 2]);
    });
}

#[test]
fn the_legacy_stream_waits_for_blocking_streams_but_non_blocking_streams_do_not() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let pinned = Pinned::new(6);
        let at = |i: u64| pinned.dptr() + i;
        let blocking = blocking_stream();
        let non_blocking = non_blocking_stream();
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, blocking);
        memset_async(at(0), 5, 1, blocking);
        gate.wait_entered(1);

        // Legacy work waits for the blocking stream's earlier work: it writes 1 after the 5.
        memset_async(at(0), 1, 1, NULL_STREAM);
        memset_async(at(1), 1, 1, STREAM_LEGACY);
        // Work on blocking streams waits for earlier legacy work: the per-thread default stream
        // and a second created stream.
        memset_async(at(3), 3, 1, STREAM_PER_THREAD);
        let later = blocking_stream();
        memset_async(at(4), 4, 1, later);
        // A non-blocking stream waits for none of it.
        let watchdog = gate.watchdog(WATCHDOG);
        memset_async(at(2), 2, 1, non_blocking);
        sync(non_blocking);
        memset_async(at(5), 6, 1, non_blocking);
        sync(non_blocking);
        assert!(!gate.is_open(), "the non-blocking stream waited (watchdog fired: {watchdog:?})");
        assert_eq!(pinned.read(), [0, 0, 2, 0, 0, 6]);
        for s in [NULL_STREAM, STREAM_LEGACY, STREAM_PER_THREAD, later, blocking] {
            assert_eq!(query(s), NOT_READY, "stream {s:?}");
        }
        assert_eq!(query(non_blocking), SUCCESS);

        gate.open();
        sync(NULL_STREAM);
        assert_eq!(pinned.read()[..2], [1, 1], "legacy work ran after the blocking stream's");
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuCtxSynchronize()) }.unwrap();
        assert_eq!(pinned.read(), [1, 1, 2, 3, 4, 6]);
    });
}

#[test]
fn blocking_streams_wait_for_earlier_legacy_work() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let pinned = Pinned::new(3);
        let (blocking, non_blocking) = (blocking_stream(), non_blocking_stream());
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, NULL_STREAM);
        memset_async(pinned.dptr(), 1, 1, NULL_STREAM);
        gate.wait_entered(1);
        // The blocking stream copies what the legacy stream wrote; had it not waited, zero.
        // SAFETY: the pinned buffer is valid for 3 bytes until the streams are synchronized.
        unsafe { cu_call!(d, cuMemcpyAsync(pinned.dptr() + 1, pinned.dptr(), 1, blocking)) }.unwrap();
        let watchdog = gate.watchdog(WATCHDOG);
        memset_async(pinned.dptr() + 2, 2, 1, non_blocking);
        sync(non_blocking);
        assert!(!gate.is_open(), "the non-blocking stream waited for the legacy stream ({watchdog:?})");
        assert_eq!(query(blocking), NOT_READY);
        assert_eq!(pinned.read(), [0, 0, 2]);
        gate.open();
        sync(blocking);
        assert_eq!(pinned.read(), [1, 1, 2]);
    });
}

#[test]
fn synchronizing_an_idle_stream_keeps_the_implicit_waits_of_the_legacy_stream() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let pinned = Pinned::new(2);
        let (blocking, non_blocking) = (blocking_stream(), non_blocking_stream());
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, NULL_STREAM);
        memset_async(pinned.dptr(), 7, 1, NULL_STREAM);
        gate.wait_entered(1);
        // An idle non-blocking stream does not wait for the legacy stream.
        let watchdog = gate.watchdog(WATCHDOG);
        sync(non_blocking);
        assert!(!gate.is_open(), "the non-blocking stream waited ({watchdog:?})");
        // An idle blocking stream has nothing of its own, but synchronizing it waits for the
        // legacy stream's pending work, as work submitted to it would.
        gate.open_after(Duration::from_millis(50));
        sync(blocking);
        assert_eq!(pinned.read(), [7, 0]);
        // And the legacy stream, idle now, waits for a blocking stream's pending work.
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, blocking);
        memset_async(pinned.dptr() + 1, 9, 1, blocking);
        gate.wait_entered(1);
        gate.open_after(Duration::from_millis(50));
        sync(NULL_STREAM);
        assert_eq!(pinned.read(), [7, 9]);
    });
}

#[test]
fn synchronous_device_copies_and_memsets_return_before_they_complete() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let n = 256;
        let (a, b) = (DeviceBuffer::with(&pattern(n, 1)), DeviceBuffer::with(&pattern(n, 2)));
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, NULL_STREAM);
        gate.wait_entered(1);
        let watchdog = gate.watchdog(WATCHDOG);
        // SAFETY: no host pointers.
        unsafe {
            cu_call!(d, cuMemcpyDtoD_v2(b.ptr, a.ptr, n)).unwrap();
            cu_call!(d, cuMemcpy(b.ptr + 8, a.ptr + 100, 8)).unwrap();
            cu_call!(d, cuMemsetD8_v2(a.ptr, 0xaa, 4)).unwrap();
            cu_call!(d, cuMemsetD16_v2(a.ptr + 4, 0xbbbb, 2)).unwrap();
            cu_call!(d, cuMemsetD32_v2(a.ptr + 8, 0xcccc_cccc, 1)).unwrap();
        }
        assert!(!gate.is_open(), "a synchronous device-side call waited for the stream ({watchdog:?})");
        assert_eq!(query(NULL_STREAM), NOT_READY);
        // Nothing has run yet: the memory still holds what it held.
        assert_eq!(peek(b.ptr, n), pattern(n, 2));
        assert_eq!(peek(a.ptr, n), pattern(n, 1));
        gate.open();
        // A synchronous copy to host memory waits for the stream, so it sees all of it.
        let mut expected_b = pattern(n, 1);
        expected_b[8..16].copy_from_slice(&pattern(n, 1)[100..108]);
        assert_eq!(dtoh(b.ptr, n), expected_b);
        let mut expected_a = pattern(n, 1);
        expected_a[..12].copy_from_slice(&[0xaa, 0xaa, 0xaa, 0xaa, 0xbb, 0xbb, 0xbb, 0xbb, 0xcc, 0xcc, 0xcc, 0xcc]);
        assert_eq!(dtoh(a.ptr, n), expected_a);
    });
}

#[test]
fn synchronous_copies_involving_host_memory_return_when_done() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let n = 64;
        let a = DeviceBuffer::with(&pattern(n, 1));
        // Pinned source: returns when the copy is done.
        let pinned = Pinned::new(n);
        pinned.write(&pattern(n, 9));
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, NULL_STREAM);
        gate.wait_entered(1);
        gate.open_after(OPEN_DELAY);
        // SAFETY: `pinned` is valid for `n` bytes.
        unsafe { cu_call!(d, cuMemcpyHtoD_v2(a.ptr, pinned.ptr.cast(), n)) }.unwrap();
        assert!(gate.is_open());
        assert_eq!(peek(a.ptr, n), pattern(n, 9), "cuMemcpyHtoD from pinned memory returned before it was done");

        // Device to pinned, and to pageable: return when done.
        for pageable in [false, true] {
            let (gate, _guard) = Gate::new();
            common::hold(gate, d, NULL_STREAM);
            gate.wait_entered(1);
            memset_async(a.ptr, 0x42, n, NULL_STREAM);
            gate.open_after(OPEN_DELAY);
            let out = if pageable {
                let mut out = vec![0u8; n];
                // SAFETY: `out` is valid for `n` bytes.
                unsafe { cu_call!(d, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), a.ptr, n)) }.unwrap();
                out
            } else {
                let out = Pinned::new(n);
                // SAFETY: `out` is valid for `n` bytes.
                unsafe { cu_call!(d, cuMemcpyDtoH_v2(out.ptr.cast(), a.ptr, n)) }.unwrap();
                out.read()
            };
            assert_eq!(out, vec![0x42; n], "cuMemcpyDtoH (pageable: {pageable}) returned before it was done");
        }
    });
}

#[test]
fn async_copies_stage_pageable_sources_and_wait_for_pageable_destinations() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let n = 128;
        let a = DeviceBuffer::with(&[0; 128]);
        let s = non_blocking_stream();

        // Host to device from pageable memory: the source is staged at the call, so changing it
        // afterwards changes nothing, and the call does not wait for the stream.
        let mut source = pattern(n, 3);
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, s);
        let watchdog = gate.watchdog(WATCHDOG);
        // SAFETY: `source` is valid for `n` bytes during the call, which stages it.
        unsafe { cu_call!(d, cuMemcpyHtoDAsync_v2(a.ptr, source.as_ptr().cast(), n, s)) }.unwrap();
        assert!(!gate.is_open(), "cuMemcpyHtoDAsync from pageable memory waited ({watchdog:?})");
        source.fill(0xff);
        gate.open();
        sync(s);
        assert_eq!(dtoh(a.ptr, n), pattern(n, 3));

        // Device to pageable memory: the call returns when the copy is done.
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, s);
        gate.open_after(OPEN_DELAY);
        let mut out = vec![0u8; n];
        // SAFETY: `out` is valid for `n` bytes until the copy completes (before the call returns).
        unsafe { cu_call!(d, cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), a.ptr, n, s)) }.unwrap();
        assert_eq!(out, pattern(n, 3), "cuMemcpyDtoHAsync to pageable memory returned before it was done");

        // Device to pinned memory: returns at once.
        let pinned = Pinned::new(n);
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, s);
        let watchdog = gate.watchdog(WATCHDOG);
        // SAFETY: `pinned` is valid for `n` bytes until the stream is synchronized.
        unsafe { cu_call!(d, cuMemcpyDtoHAsync_v2(pinned.ptr.cast(), a.ptr, n, s)) }.unwrap();
        assert!(!gate.is_open(), "cuMemcpyDtoHAsync to pinned memory waited ({watchdog:?})");
        assert_eq!(pinned.read(), vec![0; n]);
        gate.open();
        sync(s);
        assert_eq!(pinned.read(), pattern(n, 3));
    });
}

#[test]
fn per_thread_default_streams_are_separate_queues() {
    in_child!(&[], || {
        let ctx = use_device(0) as usize;
        let (legacy, threaded) = (driver(), per_thread_driver());
        let pinned = Pinned::new(4);
        let at = |i: u64| pinned.dptr() + i;
        let (gate, _guard) = Gate::new();
        // Hold this thread's per-thread default stream (handle 0 in the _ptsz functions).
        common::hold(gate, threaded, NULL_STREAM);
        gate.wait_entered(1);
        // SAFETY: no pointers.
        unsafe {
            assert_eq!(code!(threaded, cuStreamQuery(NULL_STREAM)), NOT_READY);
            assert_eq!(code!(legacy, cuStreamQuery(STREAM_PER_THREAD)), NOT_READY, "the same queue by its handle");
            assert_eq!(code!(threaded, cuStreamQuery(STREAM_PER_THREAD)), NOT_READY);
            assert_eq!(code!(legacy, cuStreamQuery(NULL_STREAM)), SUCCESS, "the legacy stream is another queue");
            assert_eq!(code!(threaded, cuStreamQuery(STREAM_LEGACY)), SUCCESS);
        }
        // Another thread's per-thread stream is yet another queue, and runs now.
        let watchdog = gate.watchdog(WATCHDOG);
        let address = at(0);
        common::on_fresh_thread(move || {
            // SAFETY: `ctx` is the live primary context.
            unsafe { cu_call!(driver(), cuCtxSetCurrent(ctx as cuda_mem_sys::types::CUcontext)) }.unwrap();
            let threaded = per_thread_driver();
            // SAFETY: no pointers; the pinned memory outlives the synchronized work.
            unsafe {
                assert_eq!(code!(threaded, cuStreamQuery(NULL_STREAM)), SUCCESS);
                cu_call!(threaded, cuMemsetD8Async(address, 1, 1, NULL_STREAM)).unwrap();
                cu_call!(threaded, cuStreamSynchronize(NULL_STREAM)).unwrap();
            }
        });
        assert!(!gate.is_open(), "another thread's per-thread stream waited ({watchdog:?})");
        assert_eq!(pinned.read(), [1, 0, 0, 0]);

        // Work on this thread's per-thread stream queues behind the gate; legacy work waits for
        // it (the per-thread stream is a blocking stream).
        // SAFETY: no host pointers.
        unsafe {
            cu_call!(threaded, cuMemsetD8Async(at(1), 2, 1, NULL_STREAM)).unwrap();
            cu_call!(legacy, cuMemsetD8Async(at(2), 3, 1, NULL_STREAM)).unwrap();
            assert_eq!(code!(legacy, cuStreamQuery(NULL_STREAM)), NOT_READY);
        }
        assert_eq!(pinned.read(), [1, 0, 0, 0]);
        gate.open();
        // SAFETY: no pointers.
        unsafe {
            cu_call!(threaded, cuStreamSynchronize(NULL_STREAM)).unwrap();
            cu_call!(legacy, cuStreamSynchronize(NULL_STREAM)).unwrap();
        }
        assert_eq!(pinned.read(), [1, 2, 3, 0]);
    });
}

extern "C" fn count_call(data: *mut c_void) {
    // SAFETY: the test passes a pointer to a live `AtomicU32`.
    let counter = unsafe { &*data.cast::<std::sync::atomic::AtomicU32>() };
    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Every per-thread (`_ptds`/`_ptsz`) export, with handle 0 meaning the per-thread stream.
#[test]
fn per_thread_variants_work_on_the_per_thread_stream() {
    in_child!(&[], || {
        let ctx = use_device(0);
        let t = per_thread_driver();
        let n = 64;
        let src = pattern(n, 5);
        let (a, b) = (DeviceBuffer::new(n), DeviceBuffer::new(n));
        let pinned = Pinned::new(n);
        let mut out = vec![0u8; n];
        let e = event(CUevent_flags::CU_EVENT_DEFAULT);
        static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let s: CUstream = NULL_STREAM;
        // SAFETY: every host buffer is valid for `n` bytes until the stream is synchronized.
        unsafe {
            cu_call!(t, cuMemcpyHtoD_v2(a.ptr, src.as_ptr().cast(), n)).unwrap();
            cu_call!(t, cuMemcpyDtoD_v2(b.ptr, a.ptr, n)).unwrap();
            cu_call!(t, cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), b.ptr, n)).unwrap();
            assert_eq!(out, src);
            cu_call!(t, cuMemsetD8_v2(a.ptr, 1, n)).unwrap();
            cu_call!(t, cuMemsetD16_v2(a.ptr, 0x0202, 4)).unwrap();
            cu_call!(t, cuMemsetD32_v2(a.ptr, 0x0303_0303, 1)).unwrap();
            cu_call!(t, cuMemcpy(out.as_mut_ptr() as CUdeviceptr, a.ptr, n)).unwrap();
            assert_eq!(out[..10], [3, 3, 3, 3, 2, 2, 2, 2, 1, 1]);
            cu_call!(t, cuMemsetD8Async(a.ptr, 4, n, s)).unwrap();
            cu_call!(t, cuMemsetD16Async(a.ptr, 0x0505, 4, s)).unwrap();
            cu_call!(t, cuMemsetD32Async(a.ptr, 0x0606_0606, 1, s)).unwrap();
            cu_call!(t, cuMemcpyAsync(b.ptr, a.ptr, n, s)).unwrap();
            cu_call!(t, cuMemcpyDtoDAsync_v2(a.ptr, b.ptr, n, s)).unwrap();
            cu_call!(t, cuMemcpyDtoHAsync_v2(pinned.ptr.cast(), a.ptr, n, s)).unwrap();
            cu_call!(t, cuMemcpyHtoDAsync_v2(b.ptr, src.as_ptr().cast(), n, s)).unwrap();
            cu_call!(t, cuEventRecord(e, s)).unwrap();
            cu_call!(t, cuStreamWaitEvent(s, e, 0)).unwrap();
            let counter = std::ptr::from_ref(&CALLS).cast_mut().cast::<c_void>();
            cu_call!(t, cuLaunchHostFunc(s, Some(count_call), counter)).unwrap();
            cu_call!(t, cuStreamSynchronize(s)).unwrap();
            assert_eq!(code!(t, cuStreamQuery(s)), SUCCESS);
        }
        let mut expected = vec![4u8; n];
        expected[..8].copy_from_slice(&[6, 6, 6, 6, 5, 5, 5, 5]);
        assert_eq!(pinned.read(), expected);
        assert_eq!(dtoh(b.ptr, n), src);
        assert_eq!(CALLS.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(event_query(e), SUCCESS);
        let (mut flags, mut priority, mut device) = (9, 9, 9);
        let mut stream_ctx = std::ptr::null_mut();
        let mut status = cuda_mem_sys::types::CUstreamCaptureStatus(9);
        // SAFETY: every pointer is a valid out-pointer.
        unsafe {
            cu_call!(t, cuStreamGetFlags(s, &mut flags)).unwrap();
            cu_call!(t, cuStreamGetPriority(s, &mut priority)).unwrap();
            cu_call!(t, cuStreamGetDevice(s, &mut device)).unwrap();
            cu_call!(t, cuStreamGetCtx(s, &mut stream_ctx)).unwrap();
            cu_call!(t, cuStreamIsCapturing(s, &mut status)).unwrap();
        }
        assert_eq!((flags, priority, device, stream_ctx), (0, 0, 0, ctx));
        assert_eq!(status, cuda_mem_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
    });
}

/// The default pool's `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` on device 0.
fn used_in_default_pool() -> u64 {
    let d = driver();
    let mut pool: cuda_mem_sys::types::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; device 0 exists.
    unsafe { cu_call!(d, cuDeviceGetDefaultMemPool(&mut pool, 0)) }.unwrap();
    let mut used = 0u64;
    // SAFETY: `used` is the `cuuint64_t` this attribute is.
    unsafe {
        cu_call!(
            d,
            cuMemPoolGetAttribute(
                pool,
                cuda_mem_sys::types::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                std::ptr::from_mut(&mut used).cast::<c_void>()
            )
        )
    }
    .unwrap();
    used
}

#[test]
fn a_pool_free_waits_for_pending_work_and_takes_effect_at_once_on_an_idle_stream() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let s = non_blocking_stream();
        let alloc = || {
            let mut ptr: CUdeviceptr = 0;
            // SAFETY: `ptr` is a valid out-pointer.
            unsafe { cu_call!(d, cuMemAllocAsync(&mut ptr, 1 << 20, s)) }.unwrap();
            ptr
        };
        let ptr = alloc();
        assert_eq!(used_in_default_pool(), 1 << 20);
        // Behind pending work, the free waits its turn.
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, s);
        // SAFETY: `ptr` is a live allocation of this stream, freed once.
        unsafe { cu_call!(d, cuMemFreeAsync(ptr, s)) }.unwrap();
        gate.wait_entered(1);
        for _ in 0..3 {
            assert_eq!(used_in_default_pool(), 1 << 20, "the free overtook the host function");
        }
        gate.open();
        sync(s);
        assert_eq!(used_in_default_pool(), 0);
        // On an idle stream it is done when the call returns, with no synchronization.
        let ptr = alloc();
        // SAFETY: as above.
        unsafe { cu_call!(d, cuMemFreeAsync(ptr, s)) }.unwrap();
        assert_eq!(used_in_default_pool(), 0);
        assert_eq!(query(s), SUCCESS);
    });
}
