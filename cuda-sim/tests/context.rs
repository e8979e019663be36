//! Primary contexts (retain counts, state, flags, release and reset), the current-context stack,
//! and what needs a current context. Tests that change a primary context's life run in a child
//! process, where no other test shares it.

mod common;

use std::ffi::{c_int, c_uint, c_void};

use common::{
    DeviceBuffer, Gate, NULL_STREAM, OPEN_DELAY, Pinned, STREAM_LEGACY, STREAM_PER_THREAD, code, current, driver,
    in_child, init, non_blocking_stream, on_fresh_thread, retain, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUcontext, CUctx_flags, CUevent, CUresult, CUstream};

/// `cuDevicePrimaryCtxGetState`: (flags, active).
fn state(device: c_int) -> (c_uint, c_int) {
    let (mut flags, mut active) = (c_uint::MAX, -1);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(driver(), cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)) }.unwrap();
    (flags, active)
}

fn release(device: c_int) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuDevicePrimaryCtxRelease_v2(device)) }
}

fn reset(device: c_int) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuDevicePrimaryCtxReset_v2(device)) }
}

fn set_flags(device: c_int, flags: c_uint) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuDevicePrimaryCtxSetFlags_v2(device, flags)) }
}

fn set_current(ctx: CUcontext) -> CUresult {
    // SAFETY: no pointers are dereferenced; an unknown handle is rejected.
    unsafe { code!(driver(), cuCtxSetCurrent(ctx)) }
}

fn push(ctx: CUcontext) -> CUresult {
    // SAFETY: as above.
    unsafe { code!(driver(), cuCtxPushCurrent_v2(ctx)) }
}

fn pop() -> Result<CUcontext, CUresult> {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    match unsafe { code!(driver(), cuCtxPopCurrent_v2(&mut ctx)) } {
        CUresult::CUDA_SUCCESS => Ok(ctx),
        error => Err(error),
    }
}

fn ctx_device(ctx: Option<CUcontext>) -> Result<c_int, CUresult> {
    let mut device = -1;
    // SAFETY: `device` is a valid out-pointer.
    let result = unsafe {
        match ctx {
            None => code!(driver(), cuCtxGetDevice(&mut device)),
            Some(ctx) => code!(driver(), cuCtxGetDevice_v2(&mut device, ctx)),
        }
    };
    if result == CUresult::CUDA_SUCCESS { Ok(device) } else { Err(result) }
}

fn alloc_code() -> CUresult {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    unsafe { code!(driver(), cuMemAlloc_v2(&mut ptr, 64)) }
}

/// A handle value no context has.
const BOGUS_CONTEXT: CUcontext = 0xdead_0000 as CUcontext;

#[test]
fn primary_context_retain_counts_and_state() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        init();
        assert_eq!(state(0), (0, 0), "inactive before the first retain");
        let c = retain(0);
        assert_eq!(state(0).1, 1);
        assert_eq!(retain(0), c, "retaining again gives the same context");
        assert_eq!(state(1), (0, 0), "device 1 is untouched");
        let c1 = retain(1);
        assert_ne!(c1, c);
        assert!(current().is_null(), "retaining does not make a context current");

        assert_eq!(release(0), CUresult::CUDA_SUCCESS);
        assert_eq!(state(0).1, 1, "one retain is left");
        assert_eq!(release(0), CUresult::CUDA_SUCCESS);
        assert_eq!(state(0).1, 0, "the last release deactivates it");
        assert_eq!(release(0), CUresult::CUDA_ERROR_INVALID_CONTEXT, "release without a retain");
        assert_eq!(state(1).1, 1, "device 1 is still retained");
        assert_eq!(release(1), CUresult::CUDA_SUCCESS);
        assert_eq!(release(1), CUresult::CUDA_ERROR_INVALID_CONTEXT);

        let again = retain(0);
        assert_ne!(again, c, "a released context comes back with a new handle");
        assert_eq!(state(0).1, 1);
        assert_eq!(release(0), CUresult::CUDA_SUCCESS);

        let d = driver();
        let mut ctx: CUcontext = std::ptr::null_mut();
        let (mut flags, mut active) = (0, 0);
        // SAFETY: every pointer is a valid out-pointer or null, which is rejected.
        unsafe {
            for device in [2, -1] {
                let invalid = CUresult::CUDA_ERROR_INVALID_DEVICE;
                assert_eq!(code!(d, cuDevicePrimaryCtxRetain(&mut ctx, device)), invalid);
                assert_eq!(code!(d, cuDevicePrimaryCtxRelease_v2(device)), invalid);
                assert_eq!(code!(d, cuDevicePrimaryCtxReset_v2(device)), invalid);
                assert_eq!(code!(d, cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)), invalid);
                assert_eq!(code!(d, cuDevicePrimaryCtxSetFlags_v2(device, 0)), invalid);
            }
            let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
            assert_eq!(code!(d, cuDevicePrimaryCtxRetain(std::ptr::null_mut(), 0)), invalid);
            assert_eq!(code!(d, cuDevicePrimaryCtxGetState(0, std::ptr::null_mut(), &mut active)), invalid);
            assert_eq!(code!(d, cuDevicePrimaryCtxGetState(0, &mut flags, std::ptr::null_mut())), invalid);
        }
        assert_eq!(state(0).1, 0, "a failed retain retains nothing");
    });
}

#[test]
fn a_context_released_to_zero_is_destroyed_for_the_thread_that_has_it_current() {
    in_child!(&[("CUDA_SIM_MEMORY", "1M")], || {
        let d = driver();
        let old = use_device(0);
        let buffer = DeviceBuffer::new(4096);
        let stream = non_blocking_stream();
        let event = common::event(cuda_mem_sys::types::CUevent_flags::CU_EVENT_DEFAULT);
        assert_eq!(release(0), CUresult::CUDA_SUCCESS);
        assert_eq!(state(0).1, 0);

        let destroyed = CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED;
        assert_eq!(alloc_code(), destroyed);
        assert_eq!(ctx_device(None), Err(destroyed));
        let (mut free, mut total) = (0, 0);
        let mut new_stream: CUstream = std::ptr::null_mut();
        let mut new_event: CUevent = std::ptr::null_mut();
        // SAFETY: every pointer is a valid out-pointer.
        unsafe {
            assert_eq!(code!(d, cuMemGetInfo_v2(&mut free, &mut total)), destroyed);
            assert_eq!(code!(d, cuStreamCreate(&mut new_stream, 0)), destroyed);
            assert_eq!(code!(d, cuEventCreate(&mut new_event, 0)), destroyed);
            assert_eq!(code!(d, cuCtxSynchronize()), destroyed);
            assert_eq!(code!(d, cuStreamSynchronize(NULL_STREAM)), destroyed);
            assert_eq!(code!(d, cuMemsetD8_v2(buffer.ptr, 0, 1)), CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
        }
        // Its streams, events and allocations went with it.
        assert_eq!(common::query(stream), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(common::event_query(event), CUresult::CUDA_ERROR_INVALID_HANDLE);
        // SAFETY: no host pointers.
        let result = unsafe { code!(d, cuMemFree_v2(buffer.ptr)) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
        // The stale handle cannot be made current again.
        assert_eq!(set_current(old), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(push(old), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(ctx_device(Some(old)), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));

        // Retaining again makes a new context with a new handle, and nothing allocated.
        let new = retain(0);
        assert_ne!(new, old);
        assert_eq!(set_current(new), CUresult::CUDA_SUCCESS);
        // SAFETY: both are valid out-pointers.
        unsafe { cu_call!(d, cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
        assert_eq!((free, total), (1 << 20, 1 << 20), "the released context's memory was returned");
        assert_eq!(alloc_code(), CUresult::CUDA_SUCCESS);
        std::mem::forget(buffer);
    });
}

#[test]
fn reset_destroys_the_context_and_everything_in_it() {
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_MEMORY", "1M")], || {
        let d = driver();
        let old = use_device(0);
        let buffer = DeviceBuffer::new(100_000);
        let pinned = Pinned::new(64);
        let stream = non_blocking_stream();
        let event = common::event(cuda_mem_sys::types::CUevent_flags::CU_EVENT_DEFAULT);
        assert_eq!(set_flags(0, CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC.0), CUresult::CUDA_SUCCESS);
        assert_eq!(state(0), (CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC.0, 1));

        assert_eq!(reset(0), CUresult::CUDA_SUCCESS);
        assert_eq!(state(0), (0, 0), "inactive, flags reset");
        assert_eq!(alloc_code(), CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
        assert_eq!(common::query(stream), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(common::event_query(event), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(set_current(old), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        // SAFETY: no host pointers are dereferenced.
        unsafe {
            assert_eq!(code!(d, cuMemFree_v2(buffer.ptr)), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(code!(d, cuMemFreeHost(pinned.ptr.cast())), CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        std::mem::forget((buffer, pinned));

        // Resetting a device whose primary context is not active is harmless.
        assert_eq!(reset(1), CUresult::CUDA_SUCCESS);
        assert_eq!(reset(0), CUresult::CUDA_SUCCESS);

        let new = retain(0);
        assert_ne!(new, old);
        assert_eq!(set_current(new), CUresult::CUDA_SUCCESS);
        let (mut free, mut total) = (0, 0);
        // SAFETY: both are valid out-pointers.
        unsafe { cu_call!(d, cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
        assert_eq!(free, total, "the reset context's memory was returned");
    });
}

/// `cuda.h`, `cuDevicePrimaryCtxReset`: "it is safe for other modules to call
/// cuDevicePrimaryCtxRelease() even after resetting the device. Resetting the primary context
/// does not release it, an application that has retained the primary context should
/// explicitly release its usage."
#[test]
fn release_after_reset_is_allowed() {
    in_child!(&[], || {
        init();
        retain(0);
        assert_eq!(reset(0), CUresult::CUDA_SUCCESS);
        assert_eq!(release(0), CUresult::CUDA_SUCCESS, "the retain made before the reset is still outstanding");
    });
}

#[test]
fn primary_context_flags() {
    use CUctx_flags as F;
    in_child!(&[], || {
        init();
        let valid = [
            F::CU_CTX_SCHED_AUTO.0,
            F::CU_CTX_SCHED_SPIN.0,
            F::CU_CTX_SCHED_YIELD.0,
            F::CU_CTX_SCHED_BLOCKING_SYNC.0,
            F::CU_CTX_SCHED_BLOCKING_SYNC.0 | F::CU_CTX_LMEM_RESIZE_TO_MAX.0,
            F::CU_CTX_SCHED_SPIN.0 | F::CU_CTX_MAP_HOST.0,
        ];
        for flags in valid {
            assert_eq!(set_flags(0, flags), CUresult::CUDA_SUCCESS, "flags {flags:#x}");
            assert_eq!(state(0), (flags, 0), "flags {flags:#x} read back, still inactive");
        }
        // Flags can change while the context is active.
        retain(0);
        assert_eq!(set_flags(0, F::CU_CTX_SCHED_YIELD.0), CUresult::CUDA_SUCCESS);
        assert_eq!(state(0), (F::CU_CTX_SCHED_YIELD.0, 1));
        // Two scheduling policies at once, and bits outside CU_CTX_FLAGS_MASK, are invalid.
        for flags in [3, 5, 6, 7, 0x100, 0x8000_0000] {
            assert_eq!(set_flags(0, flags), CUresult::CUDA_ERROR_INVALID_VALUE, "flags {flags:#x}");
        }
        assert_eq!(state(0), (F::CU_CTX_SCHED_YIELD.0, 1), "a rejected call changes nothing");
    });
}

#[test]
fn current_context_stack() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        init();
        let (c0, c1) = (retain(0), retain(1));
        assert!(current().is_null());
        assert_eq!(pop(), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT), "popping an empty stack");
        assert_eq!(ctx_device(None), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));

        assert_eq!(push(c0), CUresult::CUDA_SUCCESS);
        assert_eq!(push(c1), CUresult::CUDA_SUCCESS);
        assert_eq!(current(), c1);
        assert_eq!(ctx_device(None), Ok(1));
        assert_eq!(ctx_device(Some(std::ptr::null_mut())), Ok(1), "_v2 with null means the current one");
        assert_eq!(ctx_device(Some(c0)), Ok(0), "_v2 names a context that is not current");
        assert_eq!(pop(), Ok(c1));
        assert_eq!(current(), c0);
        assert_eq!(ctx_device(None), Ok(0));
        // cuCtxSetCurrent replaces the top of the stack.
        assert_eq!(set_current(c1), CUresult::CUDA_SUCCESS);
        assert_eq!(current(), c1);
        assert_eq!(pop(), Ok(c1));
        assert!(current().is_null(), "c0 was replaced, not pushed under");
        // On an empty stack it pushes; null unbinds.
        assert_eq!(set_current(c0), CUresult::CUDA_SUCCESS);
        assert_eq!(current(), c0);
        assert_eq!(set_current(std::ptr::null_mut()), CUresult::CUDA_SUCCESS);
        assert!(current().is_null());
        assert_eq!(pop(), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        // Pushing the same context twice needs two pops; a null out-pointer is allowed.
        assert_eq!(push(c0), CUresult::CUDA_SUCCESS);
        assert_eq!(push(c0), CUresult::CUDA_SUCCESS);
        // SAFETY: cuCtxPopCurrent accepts a null out-pointer.
        let result = unsafe { code!(driver(), cuCtxPopCurrent_v2(std::ptr::null_mut())) };
        assert_eq!(result, CUresult::CUDA_SUCCESS);
        assert_eq!(current(), c0);
        assert_eq!(pop(), Ok(c0));
        assert!(current().is_null());

        // Handles that are not contexts.
        assert_eq!(push(BOGUS_CONTEXT), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(push(std::ptr::null_mut()), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(set_current(BOGUS_CONTEXT), CUresult::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(ctx_device(Some(BOGUS_CONTEXT)), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT));
        assert!(current().is_null(), "failed calls change nothing");

        // The stack is per thread.
        assert_eq!(push(c1), CUresult::CUDA_SUCCESS);
        assert!(on_fresh_thread(|| current().is_null()));
        assert_eq!(current(), c1);
        // SAFETY: null out-pointers are rejected.
        unsafe {
            assert_eq!(code!(driver(), cuCtxGetCurrent(std::ptr::null_mut())), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(code!(driver(), cuCtxGetDevice(std::ptr::null_mut())), CUresult::CUDA_ERROR_INVALID_VALUE);
        }
    });
}

#[test]
fn calls_that_need_a_context_fail_without_one() {
    // A context and objects made on a thread that has one.
    let ctx = use_device(0) as usize;
    let buffer = DeviceBuffer::new(64);
    let event = common::event(cuda_mem_sys::types::CUevent_flags::CU_EVENT_DEFAULT) as usize;
    let ptr = buffer.ptr;
    let results = on_fresh_thread(move || {
        let d = driver();
        let invalid = CUresult::CUDA_ERROR_INVALID_CONTEXT;
        let (mut out, mut size, mut size2, mut device): (u64, usize, usize, c_int) = (0, 0, 0, 0);
        let (mut least, mut greatest) = (0, 0);
        let mut host: *mut c_void = std::ptr::null_mut();
        let mut stream: CUstream = std::ptr::null_mut();
        let mut new_event: CUevent = std::ptr::null_mut();
        let byte = [0u8; 4];
        let mut status = cuda_mem_sys::types::CUstreamCaptureStatus(7);
        // SAFETY: every pointer is a valid out-pointer or source for its call.
        let codes = unsafe {
            vec![
                ("cuMemAlloc_v2", code!(d, cuMemAlloc_v2(&mut out, 64))),
                ("cuMemAllocHost_v2", code!(d, cuMemAllocHost_v2(&mut host, 64))),
                ("cuMemGetInfo_v2", code!(d, cuMemGetInfo_v2(&mut size, &mut size2))),
                ("cuMemGetAddressRange_v2", code!(d, cuMemGetAddressRange_v2(&mut out, &mut size, ptr))),
                ("cuStreamCreate", code!(d, cuStreamCreate(&mut stream, 0))),
                ("cuStreamCreateWithPriority", code!(d, cuStreamCreateWithPriority(&mut stream, 0, 0))),
                ("cuEventCreate", code!(d, cuEventCreate(&mut new_event, 0))),
                ("cuCtxSynchronize", code!(d, cuCtxSynchronize())),
                ("cuCtxSynchronize_v2", code!(d, cuCtxSynchronize_v2(std::ptr::null_mut()))),
                ("cuCtxGetDevice", code!(d, cuCtxGetDevice(&mut device))),
                ("cuCtxGetStreamPriorityRange", code!(d, cuCtxGetStreamPriorityRange(&mut least, &mut greatest))),
                ("cuStreamQuery(0)", code!(d, cuStreamQuery(NULL_STREAM))),
                ("cuStreamQuery(LEGACY)", code!(d, cuStreamQuery(STREAM_LEGACY))),
                ("cuStreamQuery(PER_THREAD)", code!(d, cuStreamQuery(STREAM_PER_THREAD))),
                ("cuStreamSynchronize(0)", code!(d, cuStreamSynchronize(NULL_STREAM))),
                ("cuStreamIsCapturing(0)", code!(d, cuStreamIsCapturing(NULL_STREAM, &mut status))),
                ("cuStreamWaitEvent(0)", code!(d, cuStreamWaitEvent(NULL_STREAM, event as CUevent, 0))),
                ("cuEventRecord(0)", code!(d, cuEventRecord(event as CUevent, NULL_STREAM))),
                (
                    "cuLaunchHostFunc(0)",
                    code!(d, cuLaunchHostFunc(NULL_STREAM, Some(common::wait_for_gate), std::ptr::null_mut())),
                ),
                ("cuMemcpyHtoD_v2", code!(d, cuMemcpyHtoD_v2(ptr, byte.as_ptr().cast(), 4))),
                ("cuMemcpyHtoDAsync_v2(0)", code!(d, cuMemcpyHtoDAsync_v2(ptr, byte.as_ptr().cast(), 4, NULL_STREAM))),
                ("cuMemsetD8_v2", code!(d, cuMemsetD8_v2(ptr, 0, 4))),
                ("cuMemsetD32Async(0)", code!(d, cuMemsetD32Async(ptr, 0, 1, NULL_STREAM))),
                ("cuStreamQuery_ptsz(0)", code!(common::per_thread_driver(), cuStreamQuery(NULL_STREAM))),
            ]
        };
        let named = codes.into_iter().filter(|(_, code)| *code != invalid).collect::<Vec<_>>();
        // A named context works from any thread.
        let named_device = ctx_device(Some(ctx as CUcontext));
        (named, named_device)
    });
    assert_eq!(results.0, vec![], "these calls did not return CUDA_ERROR_INVALID_CONTEXT without a context");
    assert_eq!(results.1, Ok(0));
}

#[test]
fn get_device_synchronize_and_priority_range() {
    let ctx = use_device(0);
    let d = driver();
    assert_eq!(ctx_device(None), Ok(0));
    assert_eq!(ctx_device(Some(ctx)), Ok(0));
    // SAFETY: no pointers are dereferenced; unknown handles are rejected.
    unsafe {
        cu_call!(d, cuCtxSynchronize()).unwrap();
        cu_call!(d, cuCtxSynchronize_v2(ctx)).unwrap();
        cu_call!(d, cuCtxSynchronize_v2(std::ptr::null_mut())).unwrap();
        assert_eq!(code!(d, cuCtxSynchronize_v2(BOGUS_CONTEXT)), CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    let (mut least, mut greatest) = (7, 7);
    // SAFETY: both are valid out-pointers, or null (which cuda.h allows).
    unsafe {
        cu_call!(d, cuCtxGetStreamPriorityRange(&mut least, &mut greatest)).unwrap();
        cu_call!(d, cuCtxGetStreamPriorityRange(std::ptr::null_mut(), std::ptr::null_mut())).unwrap();
    }
    assert_eq!((least, greatest), (0, -5));
}

#[test]
fn context_synchronize_waits_for_every_stream_of_the_context() {
    in_child!(&[], || {
        let ctx = use_device(0);
        let d = driver();
        for named in [false, true] {
            let (gate, _guard) = Gate::new();
            let pinned = Pinned::new(3);
            let streams = [non_blocking_stream(), common::blocking_stream()];
            for (i, &s) in streams.iter().enumerate() {
                common::hold(gate, d, s);
                common::memset_async(pinned.dptr() + i as u64, 1 + i as u8, 1, s);
            }
            common::hold(gate, d, STREAM_LEGACY);
            common::memset_async(pinned.dptr() + 2, 3, 1, NULL_STREAM);
            // The legacy stream's host function waits for the blocking stream before it starts.
            gate.wait_entered(2);
            assert_eq!(pinned.read(), [0, 0, 0], "every stream is held");
            gate.open_after(OPEN_DELAY);
            // SAFETY: no pointers.
            unsafe { if named { cu_call!(d, cuCtxSynchronize_v2(ctx)) } else { cu_call!(d, cuCtxSynchronize()) } }
                .unwrap();
            assert_eq!(pinned.read(), [1, 2, 3], "cuCtxSynchronize returned before the work was done");
        }
    });
}

/// `CU_CTX_SYNC_MEMOPS` (cuda.h, `cuDevicePrimaryCtxSetFlags`): "Ensures that synchronous memory
/// operations initiated on this context will always synchronize."
#[test]
fn sync_memops_makes_synchronous_memsets_synchronous() {
    in_child!(&[], || {
        init();
        assert_eq!(set_flags(0, CUctx_flags::CU_CTX_SYNC_MEMOPS.0), CUresult::CUDA_SUCCESS);
        use_device(0);
        let d = driver();
        let buffer = DeviceBuffer::new(16);
        let (gate, _guard) = Gate::new();
        common::hold(gate, d, NULL_STREAM);
        gate.wait_entered(1);
        gate.open_after(OPEN_DELAY);
        // SAFETY: no host pointers.
        unsafe { cu_call!(d, cuMemsetD8_v2(buffer.ptr, 0xab, 16)) }.unwrap();
        assert!(gate.is_open(), "with CU_CTX_SYNC_MEMOPS, cuMemsetD8 returned before it had run");
        assert_eq!(buffer.read(), [0xab; 16]);
    });
}

/// `cuCtxSynchronize` waits for all of the context's work, also the work a thread left on its
/// per-thread default stream before it exited, and the work of a stream destroyed with work
/// pending (`cuStreamDestroy`: its work still completes): the device has not finished those
/// tasks, whether or not their stream still has a handle.
#[test]
fn context_synchronize_waits_for_exited_threads_and_destroyed_streams() {
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let pinned = std::sync::Arc::new(Pinned::new(2));
        let (gate, _guard) = Gate::new();
        let on_thread = std::sync::Arc::clone(&pinned);
        std::thread::spawn(move || {
            use_device(0);
            common::hold(gate, driver(), STREAM_PER_THREAD);
            common::memset_async(on_thread.dptr(), 1, 1, STREAM_PER_THREAD);
        })
        .join()
        .unwrap();
        let stream = non_blocking_stream();
        common::hold(gate, d, stream);
        common::memset_async(pinned.dptr() + 1, 2, 1, stream);
        // SAFETY: a live stream of this thread's context, not used again.
        unsafe { cu_call!(d, cuStreamDestroy_v2(stream)) }.unwrap();
        gate.wait_entered(2);
        assert_eq!(pinned.read(), [0, 0], "both streams are held");
        gate.open_after(OPEN_DELAY);
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuCtxSynchronize()) }.unwrap();
        assert_eq!(pinned.read(), [1, 2], "cuCtxSynchronize returned before the exited thread's work was done");
    });
}

/// Free device memory (`cuMemGetInfo`) in the current context.
fn free_memory() -> usize {
    let (mut free, mut total) = (0, 0);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(driver(), cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
    free
}

/// How the primary context is destroyed while a stream-ordered free on its default pool is
/// pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Destroy {
    /// The last `cuDevicePrimaryCtxRelease`.
    Release,
    /// `cuDevicePrimaryCtxReset`.
    Reset,
}

/// `cuda.h`, `cuDevicePrimaryCtxReset`: "Destroy all allocations and reset all state on the
/// primary context". A context destroyed (reset, or released for the last time) while a
/// `cuMemFreeAsync` on its default pool is pending (its stream held) or has run but was never
/// synchronized gives that memory back: after a new retain, `cuCtxSynchronize` and
/// `cuMemPoolTrimTo(pool, 0)`, the device's free memory is what it was before the allocation.
#[test]
fn a_destroyed_context_gives_back_the_memory_of_its_pending_frees() {
    in_child!(&[], || {
        let d = driver();
        for (how, held) in [(Destroy::Release, true), (Destroy::Reset, true), (Destroy::Release, false)] {
            let case = format!("{how:?}, the free {}", if held { "pending" } else { "run, not synchronized" });
            use_device(0);
            let mut pool: cuda_mem_sys::types::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            unsafe { cu_call!(d, cuDeviceGetDefaultMemPool(&mut pool, 0)) }.unwrap();
            // SAFETY: no pointers.
            unsafe { cu_call!(d, cuMemPoolTrimTo(pool, 0)) }.unwrap();
            let initial = free_memory();
            let stream = non_blocking_stream();
            let mut ptr = 0;
            // SAFETY: a valid out-pointer.
            unsafe { cu_call!(d, cuMemAllocAsync(&mut ptr, 2 << 20, stream)) }.unwrap();
            common::sync(stream);
            assert_eq!(free_memory(), initial - (2 << 20), "{case}: the pool reserved 2 MiB");
            let (gate, _guard) = Gate::new();
            if held {
                common::hold(gate, d, stream);
            }
            // SAFETY: a live allocation of the pool, freed once.
            unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream)) }.unwrap();
            match how {
                Destroy::Release => assert_eq!(release(0), CUresult::CUDA_SUCCESS, "{case}"),
                Destroy::Reset => {
                    assert_eq!(reset(0), CUresult::CUDA_SUCCESS, "{case}");
                    assert_eq!(release(0), CUresult::CUDA_SUCCESS, "{case}: the retain made before the reset");
                }
            }
            gate.open();
            assert_eq!(set_current(retain(0)), CUresult::CUDA_SUCCESS, "{case}");
            // SAFETY: no pointers.
            unsafe { cu_call!(d, cuCtxSynchronize()) }.unwrap();
            // SAFETY: the default pool outlives the context.
            unsafe { cu_call!(d, cuMemPoolTrimTo(pool, 0)) }.unwrap();
            assert_eq!(free_memory(), initial, "{case}: the destroyed context's freed memory stays reserved");
            assert_eq!(release(0), CUresult::CUDA_SUCCESS, "{case}");
        }
    });
}
