//! Question 31: the edges of single calls where `cuda.h` is silent and the simulator
//! (`cuda_sim::conservative`) takes the strict reading: a null pointer to `cuMemFree` and
//! `cuMemFreeHost`, a zero-byte `cuMemAllocHost`, a misaligned `cuMemsetD16`/`D32`,
//! `cuMemFreeAsync` of `cuMemAlloc` memory, a zero-length memset and copy at an allocation's
//! one-past-the-end pointer, a pool allocation of `SIZE_MAX` bytes, a managed pool with a
//! shareable handle type, and how many bytes a boolean pointer attribute writes. Then the calls
//! added with the simulator's newer functions: `cuCtxRecordEvent` with a null context, the
//! current context's limits (`cuCtxGetLimit`), `cuStreamAttachMemAsync` where the simulator
//! refuses it (a single-stream attach on the legacy stream, non-managed memory, part of a managed
//! allocation), and the location-based pool functions for a device ordinal the machine lacks.
//! Last, two things the simulator reads from the documentation's silence: whether pool memory
//! freed on an idle stream is taken again at once by the next allocation on that stream (the
//! same address on a GPU, maybe; the same reserve on both, as the simulator never hands out an
//! address twice), and whether a thread with no current context may make the calls the
//! simulator says need none (event synchronize and destroy, `cuMemFree`), and `cuEventQuery`,
//! which it answers so too.
//!
//! Each is asked with memory that stays valid whatever the driver answers, so no answer can
//! fault the context the later questions use. Not asked, for that reason: a destroyed
//! default stream, a primary context released without a retain, and a copy direction that
//! names device memory as host memory (questions 33, `context-edges`, and 38, `unsafe-edges`,
//! ask them in child processes).

use std::ffi::{c_int, c_void};

use cuda_mem_sys::types::{
    CUcontext, CUdeviceptr, CUevent, CUlimit, CUmemAllocationType, CUmemAttach_flags, CUmemPool_attribute,
    CUmemPoolProps, CUmemoryPool, CUpointer_attribute, CUstream,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::capture::short;
use crate::owned::{
    DeviceAllocation, ManagedAllocation, OwnedEvent, OwnedPool, OwnedStream, PoolAllocation, alloc_from_pool,
    free_async,
};
use crate::raw::{
    Call, LEGACY, POSIX_FD, code, device_location, driver_version, error_code, event_synchronize, managed_unsupported,
    pool_attribute, pool_props, stream_synchronize,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "call-edges",
    question: "cuMemFree(0); cuMemFreeHost(NULL); cuMemAllocHost of 0 bytes; cuMemsetD16 at an odd address and \
               cuMemsetD32 at one not a multiple of 4; cuMemFreeAsync of cuMemAlloc memory; a zero-length cuMemsetD8 \
               and cuMemcpyDtoD at an allocation's one-past-the-end pointer; cuMemAllocFromPoolAsync of SIZE_MAX \
               bytes; cuMemPoolCreate of a managed pool with a POSIX fd handle type; how many bytes \
               cuPointerGetAttribute(IS_MANAGED) writes; cuCtxRecordEvent(NULL, event); cuCtxGetLimit of the stack, \
               printf FIFO and malloc heap sizes, the pending launch count, the L2 fetch granularity and the device \
               runtime's sync depth; cuStreamAttachMemAsync with CU_MEM_ATTACH_SINGLE on CU_STREAM_LEGACY, of \
               cuMemAlloc memory, and of part of a managed allocation; cuMemGetMemPool and cuMemGetDefaultMemPool of \
               a device ordinal the machine lacks; a pool allocation right after a cuMemFreeAsync on an idle stream \
               (the pool's reserve then?); cuEventQuery, cuEventSynchronize, cuEventDestroy and \
               cuMemFree on a thread with no current context: what does each return?",
    run,
    child: None,
};

/// The size of the allocations the calls are made at (one 2 MiB granule, so that its end is a
/// granule's end on a GPU too).
const SIZE: usize = 2 << 20;

/// The CUDA version whose pool properties can ask for managed memory.
const MANAGED_POOL_VERSION: u32 = 13000;
/// The CUDA version that brought `cuCtxRecordEvent`.
const CONTEXT_EVENT_VERSION: u32 = 12050;
/// The CUDA version that brought `cuMemGetMemPool` (and `cuMemGetDefaultMemPool`).
const LOCATION_POOLS_VERSION: u32 = 13000;

/// How far past the last device the ordinal asked about lies.
const ABSENT_DEVICE_OFFSET: c_int = 7;

/// One MiB, the unit the pool's reserve is reported in.
const MIB: usize = 1 << 20;

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let absent = setup.devices + ABSENT_DEVICE_OFFSET;
    details.put("absent device ordinal", absent);
    let mut phrases = Vec::new();
    // A key ending in a colon introduces a description rather than a code.
    let mut ask = |key: &str, outcome: String| {
        details.put(key.trim_end_matches(':'), &outcome);
        phrases.push(format!("{key} {}", short(&outcome)));
    };
    ask("cuMemFree(0)", code(&free(0)));
    ask("cuMemFreeHost(NULL)", code(&free_host(std::ptr::null_mut())));
    ask("cuMemAllocHost(0)", zero_byte_host_allocation());
    let memory = DeviceAllocation::new(SIZE)?;
    ask("cuMemsetD16(odd)", code(&memset_d16(memory.ptr() + 1, 0x1234, 8)));
    ask("cuMemsetD32(ptr+2)", code(&memset_d32(memory.ptr() + 2, 0x1234_5678, 4)));
    let end = memory.ptr() + SIZE as CUdeviceptr;
    ask("cuMemsetD8(end, 0 bytes)", code(&memset_d8(end, 0)));
    ask("cuMemcpyDtoD(end, 0 bytes)", code(&copy_d_to_d(end, memory.ptr(), 0)));
    ask("cuPointerGetAttribute(IS_MANAGED) writes", boolean_attribute_width(memory.ptr()));
    drop(memory);
    ask("cuMemFreeAsync(cuMemAlloc memory)", free_async_of_plain_allocation()?);
    ask("cuMemAllocFromPoolAsync(SIZE_MAX)", size_max_pool_allocation()?);
    ask("managed pool with POSIX fd handles", managed_shareable_pool()?);
    ask("cuCtxRecordEvent(NULL)", null_context_event()?);
    ask("cuCtxGetLimit:", limits());
    for (key, outcome) in attach_edges()? {
        ask(key, outcome);
    }
    for (key, outcome) in absent_device_pools(absent)? {
        ask(key, outcome);
    }
    ask("allocation after a free on an idle stream:", idle_free_then_allocate()?);
    ask("with no current context:", without_current_context()?);
    Ok(phrases.join("; "))
}

fn free(ptr: CUdeviceptr) -> Call {
    let d = driver()?;
    // SAFETY: `ptr` is 0 or an allocation the caller gives up, freed once.
    unsafe { cu_call!(d, cuMemFree_v2(ptr)) }
}

fn free_host(ptr: *mut c_void) -> Call {
    let d = driver()?;
    // SAFETY: `ptr` is NULL or pinned memory the caller gives up, freed once.
    unsafe { cu_call!(d, cuMemFreeHost(ptr)) }
}

fn memset_d16(ptr: CUdeviceptr, value: u16, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: the `count` elements from `ptr` lie inside an allocation the caller holds.
    unsafe { cu_call!(d, cuMemsetD16_v2(ptr, value, count)) }
}

fn memset_d32(ptr: CUdeviceptr, value: u32, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: as in `memset_d16`.
    unsafe { cu_call!(d, cuMemsetD32_v2(ptr, value, count)) }
}

fn memset_d8(ptr: CUdeviceptr, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: `count` is 0 here: no byte is written.
    unsafe { cu_call!(d, cuMemsetD8_v2(ptr, 0, count)) }
}

fn copy_d_to_d(dst: CUdeviceptr, src: CUdeviceptr, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: `count` is 0 here: no byte is read or written.
    unsafe { cu_call!(d, cuMemcpyDtoD_v2(dst, src, count)) }
}

/// `cuMemAllocHost` of 0 bytes: its result, whether the pointer is null, and its free's.
fn zero_byte_host_allocation() -> String {
    let allocate = || -> Result<*mut c_void, CudaError> {
        let d = driver()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAllocHost_v2(&mut ptr, 0)) }?;
        Ok(ptr)
    };
    match allocate() {
        Err(e) => crate::raw::error_code(e),
        Ok(ptr) if ptr.is_null() => "CUDA_SUCCESS with NULL".to_string(),
        Ok(ptr) => format!("CUDA_SUCCESS with a pointer (cuMemFreeHost {})", code(&free_host(ptr))),
    }
}

/// Writes the boolean attribute `IS_MANAGED` of `ptr` into eight bytes of `0xFF` and counts
/// those it changed (the attribute is false for `cuMemAlloc` memory, so each written byte is 0).
fn boolean_attribute_width(ptr: CUdeviceptr) -> String {
    let mut out = [0xFF_u8; 8];
    let mut read = || -> Call {
        let d = driver()?;
        let attribute = CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED;
        // SAFETY: `out` is eight writable bytes, more than any attribute of this kind takes.
        unsafe { cu_call!(d, cuPointerGetAttribute(out.as_mut_ptr().cast(), attribute, ptr)) }
    };
    match read() {
        Err(e) => crate::raw::error_code(e),
        Ok(()) => format!("{} byte(s)", out.iter().filter(|&&b| b != 0xFF).count()),
    }
}

/// `cuMemFreeAsync` of `cuMemAlloc` memory; a driver that accepts it has freed the memory, so
/// it is not freed again.
fn free_async_of_plain_allocation() -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let memory = DeviceAllocation::new(SIZE)?;
    let outcome = free_async(memory.ptr(), stream.raw()).and_then(|()| stream.synchronize());
    if outcome.is_ok() {
        std::mem::forget(memory);
    }
    Ok(code(&outcome))
}

/// `cuMemAllocFromPoolAsync` of `SIZE_MAX` bytes from a new device pool.
fn size_max_pool_allocation() -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let outcome = alloc_from_pool(pool.raw(), usize::MAX, stream.raw());
    if let Ok(ptr) = outcome {
        crate::owned::note_cleanup("freeing a SIZE_MAX pool allocation", free_async(ptr, stream.raw()));
    }
    Ok(code(&outcome))
}

/// `cuMemPoolCreate` of a managed pool on device 0 shareable by POSIX file descriptor.
fn managed_shareable_pool() -> Result<String, Error> {
    let version = driver_version()?;
    if version < MANAGED_POOL_VERSION {
        return Ok(not_applicable(version, "managed pools"));
    }
    let props = CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
        handleTypes: POSIX_FD,
        ..pool_props(device_location(0), false, 0)
    };
    let d = driver()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `props` a valid description.
    let created = unsafe { cu_call!(d, cuMemPoolCreate(&mut pool, &props)) };
    if created.is_ok() {
        // SAFETY: the pool was created just now and is destroyed once.
        let destroyed = unsafe { cu_call!(d, cuMemPoolDestroy(pool)) };
        crate::owned::note_cleanup("destroying a managed shareable pool", destroyed);
    }
    Ok(code(&created))
}

/// The answer where the driver's CUDA `version` lacks `what`.
fn not_applicable(version: u32, what: &str) -> String {
    format!("not applicable: CUDA {}.{} has no {what}", version / 1000, (version % 1000) / 10)
}

/// `cuCtxRecordEvent` with a null context and an event of the current one (a recording that
/// succeeds is waited for before the event goes).
fn null_context_event() -> Result<String, Error> {
    let version = driver_version()?;
    if version < CONTEXT_EVENT_VERSION {
        return Ok(not_applicable(version, "cuCtxRecordEvent"));
    }
    let event = OwnedEvent::new()?;
    let d = driver()?;
    let context: CUcontext = std::ptr::null_mut();
    // SAFETY: a null context handle (what the driver makes of it is the question) and an event
    // of the current context, alive while `event` is.
    let recorded = unsafe { cu_call!(d, cuCtxRecordEvent(context, event.raw())) };
    if recorded.is_ok() {
        crate::owned::note_cleanup("waiting for a context event", event_synchronize(event.raw()));
    }
    Ok(code(&recorded))
}

/// The current context's limits, by name: each value, or the code that refused it.
fn limits() -> String {
    use CUlimit as L;
    let limits = [
        ("stack", L::CU_LIMIT_STACK_SIZE),
        ("printf FIFO", L::CU_LIMIT_PRINTF_FIFO_SIZE),
        ("malloc heap", L::CU_LIMIT_MALLOC_HEAP_SIZE),
        ("pending launches", L::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT),
        ("L2 fetch granularity", L::CU_LIMIT_MAX_L2_FETCH_GRANULARITY),
        ("sync depth", L::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH),
    ];
    let read = |limit: CUlimit| -> Result<usize, CudaError> {
        let d = driver()?;
        let mut value = 0usize;
        // SAFETY: `value` is a valid out-pointer for the `size_t` the call writes.
        unsafe { cu_call!(d, cuCtxGetLimit(&mut value, limit)) }?;
        Ok(value)
    };
    let values: Vec<String> = limits
        .iter()
        .map(|(name, limit)| match read(*limit) {
            Ok(value) => format!("{name} {value}"),
            Err(e) => format!("{name} {}", short(&error_code(e))),
        })
        .collect();
    values.join(", ")
}

/// `cuStreamAttachMemAsync` with `CU_MEM_ATTACH_SINGLE` where the simulator refuses it: a
/// managed allocation on the legacy stream, `cuMemAlloc` memory on a created stream, and the
/// first half of a managed allocation on a created stream.
fn attach_edges() -> Result<Vec<(&'static str, String)>, Error> {
    if let Some(reason) = managed_unsupported()? {
        return Ok(vec![("cuStreamAttachMemAsync", reason)]);
    }
    let managed = ManagedAllocation::new(SIZE)?;
    let plain = DeviceAllocation::new(SIZE)?;
    let stream = OwnedStream::new(false)?;
    Ok(vec![
        ("cuStreamAttachMemAsync(SINGLE, legacy stream)", attach_single(LEGACY, managed.ptr(), 0)),
        ("cuStreamAttachMemAsync(cuMemAlloc memory)", attach_single(stream.raw(), plain.ptr(), 0)),
        ("cuStreamAttachMemAsync(half a managed allocation)", attach_single(stream.raw(), managed.ptr(), SIZE / 2)),
    ])
}

/// `cuStreamAttachMemAsync(stream, ptr, length, CU_MEM_ATTACH_SINGLE)`, and the stream
/// synchronized after an attach that succeeded.
fn attach_single(stream: CUstream, ptr: CUdeviceptr, length: usize) -> String {
    let attach = || -> Call {
        let d = driver()?;
        let single = CUmemAttach_flags::CU_MEM_ATTACH_SINGLE.0;
        // SAFETY: the stream is alive (or a special handle) and `ptr` an allocation the caller
        // holds; the driver only associates it.
        unsafe { cu_call!(d, cuStreamAttachMemAsync(stream, ptr, length, single)) }
    };
    match attach().map(|()| stream_synchronize(stream)) {
        Err(e) => error_code(e),
        Ok(Ok(())) => "CUDA_SUCCESS".to_string(),
        Ok(Err(e)) => format!("CUDA_SUCCESS, then cuStreamSynchronize {}", error_code(e)),
    }
}

/// `cuMemGetMemPool` and `cuMemGetDefaultMemPool` of pinned memory on device `ordinal`, which
/// the machine lacks.
fn absent_device_pools(ordinal: c_int) -> Result<Vec<(&'static str, String)>, Error> {
    let version = driver_version()?;
    if version < LOCATION_POOLS_VERSION {
        return Ok(vec![("cuMemGetMemPool", not_applicable(version, "location-based pool functions"))]);
    }
    let pool_at = |default: bool| -> Result<CUmemoryPool, CudaError> {
        let d = driver()?;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        let mut location = device_location(ordinal);
        let pinned = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        if default {
            // SAFETY: `pool` is a valid out-pointer and `location` valid for the call.
            unsafe { cu_call!(d, cuMemGetDefaultMemPool(&mut pool, &mut location, pinned)) }?;
        } else {
            // SAFETY: as above.
            unsafe { cu_call!(d, cuMemGetMemPool(&mut pool, &mut location, pinned)) }?;
        }
        // A pool given is a device's own, never destroyed by its user.
        Ok(pool)
    };
    Ok(vec![
        ("cuMemGetMemPool(absent device)", code(&pool_at(false))),
        ("cuMemGetDefaultMemPool(absent device)", code(&pool_at(true))),
    ])
}

/// From a new pool, one 2 MiB granule on a non-blocking stream, synchronized, freed in stream
/// order, and (with nothing synchronized) a granule again on the same stream: the pool's reserve
/// then (one granule when the freed memory was taken again). Not its address: the simulator never
/// hands out an address twice, where a GPU may, so only the reserve can agree.
fn idle_free_then_allocate() -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let mut first = PoolAllocation::new(pool.raw(), SIZE, &stream)?;
    stream.synchronize()?;
    first.free()?;
    let second = PoolAllocation::new(pool.raw(), SIZE, &stream)?;
    let reserved = pool_attribute(pool.raw(), CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        .map_or_else(error_code, |bytes| format!("{} MiB", bytes / MIB as u64));
    drop(second);
    stream.synchronize()?;
    Ok(format!("the pool's reserve then {reserved}"))
}

/// On a thread of its own, which has no current context: `cuEventQuery` and
/// `cuEventSynchronize` of an event recorded (and complete) on the main thread, `cuEventDestroy`
/// of another event, and `cuMemFree` of `cuMemAlloc` memory, both made on the main thread.
fn without_current_context() -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let recorded = OwnedEvent::new()?;
    recorded.record(stream.raw())?;
    stream.synchronize()?;
    let other = OwnedEvent::new()?;
    let memory = DeviceAllocation::new(SIZE)?;
    let handles = (recorded.raw() as usize, other.raw() as usize, memory.ptr());
    let (current, calls) = std::thread::scope(|scope| scope.spawn(move || on_bare_thread(handles)).join())
        .map_err(|_| "the thread with no current context panicked")?;
    // What the thread released is the driver's no longer.
    if calls[2].1.is_ok() {
        std::mem::forget(other);
    }
    if calls[3].1.is_ok() {
        std::mem::forget(memory);
    }
    let outcomes: Vec<String> = calls.iter().map(|(name, call)| format!("{name} {}", short(&code(call)))).collect();
    let outcomes = outcomes.join(", ");
    Ok(match current {
        Ok(true) => outcomes,
        Ok(false) => format!("(the thread found a context current) {outcomes}"),
        Err(e) => format!("(cuCtxGetCurrent {}) {outcomes}", short(&error_code(e))),
    })
}

/// The calls [`without_current_context`] makes on its thread: whether no context was current
/// there, and each call's outcome, in order (query, synchronize, destroy, free).
fn on_bare_thread(
    (recorded, other, memory): (usize, usize, CUdeviceptr),
) -> (Result<bool, CudaError>, [(&'static str, Call); 4]) {
    let (recorded, other) = (recorded as CUevent, other as CUevent);
    let bare = (|| {
        let d = driver()?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer.
        unsafe { cu_call!(d, cuCtxGetCurrent(&mut context)) }?;
        Ok(context.is_null())
    })();
    let query = || -> Call {
        let d = driver()?;
        // SAFETY: the event is alive: the main thread holds it until this thread has ended.
        unsafe { cu_call!(d, cuEventQuery(recorded)) }
    };
    let destroy = || -> Call {
        let d = driver()?;
        // SAFETY: the main thread gives the event up when this succeeds, and destroys it itself
        // when it does not.
        unsafe { cu_call!(d, cuEventDestroy_v2(other)) }
    };
    let free = || -> Call {
        let d = driver()?;
        // SAFETY: as for the event: the memory is freed here or by the main thread, once.
        unsafe { cu_call!(d, cuMemFree_v2(memory)) }
    };
    let calls = [
        ("cuEventQuery", query()),
        ("cuEventSynchronize", event_synchronize(recorded)),
        ("cuEventDestroy", destroy()),
        ("cuMemFree", free()),
    ];
    (bare, calls)
}
