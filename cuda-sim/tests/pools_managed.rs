//! Memory pools and stream-ordered allocation, managed memory, host registration and graph
//! capture. Pool accounting is process-wide, so those tests run in child processes.

mod common;

use std::ffi::{c_int, c_void};

use common::{
    DeviceBuffer, Gate, NULL_STREAM, Pinned, access, code, device_location, driver, dtoh, event, event_query, htod,
    in_child, init, memset_async, non_blocking_stream, query, record, set_access, sync, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUdeviceptr, CUevent, CUevent_flags, CUgraph, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationType,
    CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUmemorytype,
    CUpointer_attribute, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
};

const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const MIB: usize = 1 << 20;

fn pool_props(device: c_int, max_size: usize) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(device),
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: max_size,
        usage: 0,
        reserved: [0; 54],
    }
}

fn create_pool(props: &CUmemPoolProps) -> Result<CUmemoryPool, CUresult> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `props` a valid properties struct.
    match unsafe { code!(driver(), cuMemPoolCreate(&mut pool, props)) } {
        CUresult::CUDA_SUCCESS => Ok(pool),
        error => Err(error),
    }
}

fn destroy_pool(pool: CUmemoryPool) -> CUresult {
    // SAFETY: no pointers are dereferenced; unknown handles are rejected.
    unsafe { code!(driver(), cuMemPoolDestroy(pool)) }
}

fn device_pool(device: c_int, current: bool) -> Result<CUmemoryPool, CUresult> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer.
    let result = unsafe {
        if current {
            code!(driver(), cuDeviceGetMemPool(&mut pool, device))
        } else {
            code!(driver(), cuDeviceGetDefaultMemPool(&mut pool, device))
        }
    };
    if result == CUresult::CUDA_SUCCESS { Ok(pool) } else { Err(result) }
}

fn set_device_pool(device: c_int, pool: CUmemoryPool) -> CUresult {
    // SAFETY: no pointers are dereferenced.
    unsafe { code!(driver(), cuDeviceSetMemPool(device, pool)) }
}

/// A `cuuint64_t` pool attribute.
fn pool_attribute(pool: CUmemoryPool, attribute: CUmemPool_attribute) -> u64 {
    let mut value = u64::MAX;
    // SAFETY: `value` has the attribute's type (cuuint64_t).
    unsafe { cu_call!(driver(), cuMemPoolGetAttribute(pool, attribute, std::ptr::from_mut(&mut value).cast())) }
        .unwrap();
    value
}

fn set_pool_attribute(pool: CUmemoryPool, attribute: CUmemPool_attribute, mut value: u64) -> CUresult {
    // SAFETY: `value` has the attribute's type (cuuint64_t).
    unsafe { code!(driver(), cuMemPoolSetAttribute(pool, attribute, std::ptr::from_mut(&mut value).cast())) }
}

fn alloc_async(len: usize, s: CUstream) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocAsync(&mut ptr, len, s)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn alloc_from_pool(len: usize, pool: CUmemoryPool, s: CUstream) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocFromPoolAsync(&mut ptr, len, pool, s)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn free_async(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    // SAFETY: no host pointers.
    unsafe { code!(driver(), cuMemFreeAsync(ptr, s)) }
}

fn mem_free() -> usize {
    let (mut free, mut total) = (0, 0);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(driver(), cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
    free
}

fn pointer_attribute<T: Copy>(attr: CUpointer_attribute, ptr: CUdeviceptr, init: T) -> Result<T, CUresult> {
    let mut value = init;
    // SAFETY: `value` has the type cuda.h documents for `attr`.
    match unsafe { code!(driver(), cuPointerGetAttribute(std::ptr::from_mut(&mut value).cast(), attr, ptr)) } {
        CUresult::CUDA_SUCCESS => Ok(value),
        error => Err(error),
    }
}

#[test]
fn default_created_and_current_pools() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        init();
        let default0 = device_pool(0, false).unwrap();
        let default1 = device_pool(1, false).unwrap();
        assert!(!default0.is_null());
        assert_ne!(default0, default1);
        assert_eq!(device_pool(0, true), Ok(default0), "the default pool is current at first");
        assert_eq!(device_pool(2, false), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(device_pool(-1, true), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        // SAFETY: null out-pointers are rejected.
        unsafe {
            assert_eq!(code!(driver(), cuDeviceGetDefaultMemPool(std::ptr::null_mut(), 0)), INVALID);
            assert_eq!(code!(driver(), cuDeviceGetMemPool(std::ptr::null_mut(), 0)), INVALID);
        }
        assert_eq!(destroy_pool(default0), INVALID, "a default pool cannot be destroyed");

        let pool = create_pool(&pool_props(0, 0)).unwrap();
        assert_ne!(pool, default0);
        assert_eq!(set_device_pool(0, pool), CUresult::CUDA_SUCCESS);
        assert_eq!(device_pool(0, true), Ok(pool));
        assert_eq!(device_pool(0, false), Ok(default0));
        let mut location = device_location(0);
        let mut current: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: both pointers are valid.
        unsafe {
            cu_call!(
                driver(),
                cuMemGetMemPool(&mut current, &mut location, CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED)
            )
        }
        .unwrap();
        assert_eq!(current, pool, "cuMemGetMemPool names the current pool");
        assert_eq!(set_device_pool(1, pool), INVALID, "a pool of device 0 for device 1");
        assert_eq!(destroy_pool(pool), CUresult::CUDA_SUCCESS);
        assert_eq!(device_pool(0, true), Ok(default0), "destroying the current pool reverts to the default");
        assert_eq!(destroy_pool(pool), INVALID, "destroying twice");
        assert_eq!(set_device_pool(0, pool), INVALID, "a destroyed pool");

        // Bad properties.
        let mut props = pool_props(0, 0);
        props.reserved[3] = 1;
        assert_eq!(create_pool(&props), Err(INVALID), "reserved bytes must be 0");
        assert_eq!(create_pool(&pool_props(2, 0)), Err(INVALID), "no device 2");
        let mut props = pool_props(0, 0);
        props.allocType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_INVALID;
        assert_eq!(create_pool(&props), Err(INVALID));
        // SAFETY: null pointers are rejected.
        unsafe {
            let mut out: CUmemoryPool = std::ptr::null_mut();
            assert_eq!(code!(driver(), cuMemPoolCreate(&mut out, std::ptr::null())), INVALID);
            assert_eq!(code!(driver(), cuMemPoolCreate(std::ptr::null_mut(), &pool_props(0, 0))), INVALID);
        }
    });
}

/// `cuda.h` (`cuMemPoolCreate`): "Pools created with the type ::CU_MEM_LOCATION_TYPE_HOST are not
/// IPC capable and ::CUmemPoolProps::handleTypes must be 0, any other values will result in
/// ::CUDA_ERROR_INVALID_VALUE". A managed pool with a handle type, which `cuda.h` does not
/// address, stays unsupported.
#[test]
fn host_pools_take_no_handle_type() {
    in_child!(&[], || {
        use_device(0);
        let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let fabric = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        let at = |type_, handle_types| CUmemPoolProps {
            handleTypes: handle_types,
            location: CUmemLocation { type_, id: 0 },
            ..pool_props(0, 0)
        };
        for handle_types in [posix, fabric] {
            let props = at(CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, handle_types);
            assert_eq!(create_pool(&props), Err(INVALID), "host pool, {handle_types:?}");
            let managed = CUmemPoolProps { allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED, ..props };
            assert_eq!(create_pool(&managed), Err(INVALID), "managed host pool, {handle_types:?}");
        }
        let managed = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
            ..at(CUmemLocationType::CU_MEM_LOCATION_TYPE_NONE, posix)
        };
        assert_eq!(create_pool(&managed), Err(CUresult::CUDA_ERROR_NOT_SUPPORTED), "managed pool");
        // Without a handle type, and a host NUMA pool with one, are fine.
        let none = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        for props in [
            at(CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, none),
            at(CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, posix),
        ] {
            let pool = create_pool(&props).unwrap();
            assert_eq!(destroy_pool(pool), CUresult::CUDA_SUCCESS);
        }
    });
}

#[test]
fn stream_ordered_allocation_and_pool_accounting() {
    use CUmemPool_attribute as A;
    in_child!(&[("CUDA_SIM_MEMORY", "64M")], || {
        use_device(0);
        let total = 64 * MIB;
        let pool = device_pool(0, false).unwrap();
        let s = non_blocking_stream();
        assert_eq!(mem_free(), total);

        let p = alloc_async(1000, s).unwrap();
        assert!(mem_free() < total, "the pool reserved device memory");
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 1000);
        let reserved = pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        assert!(reserved >= 1000);
        assert_eq!(mem_free(), total - reserved as usize, "reserved pool memory is used device memory");
        // The allocation is ordinary device memory of the pool.
        assert_eq!(
            pointer_attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p, 0u32),
            Ok(CUmemorytype::CU_MEMORYTYPE_DEVICE.0)
        );
        assert_eq!(
            pointer_attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p + 10, 0usize),
            Ok(pool as usize)
        );
        let out = Pinned::new(1000);
        memset_async(p, 0x3c, 1000, s);
        // SAFETY: `out` is valid for 1000 bytes until the stream is synchronized.
        unsafe { cu_call!(driver(), cuMemcpyDtoHAsync_v2(out.ptr.cast(), p, 1000, s)) }.unwrap();
        assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
        assert_eq!(free_async(p, s), INVALID, "freeing twice");
        sync(s);
        assert_eq!(out.read(), vec![0x3c; 1000], "the allocation was usable in stream order");
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH), 1000);
        // The release threshold is 0 by default: synchronizing gave the memory back.
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
        assert_eq!(mem_free(), total);

        // With a high threshold the pool keeps its memory until trimmed.
        assert_eq!(set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX), CUresult::CUDA_SUCCESS);
        let p = alloc_async(3 * MIB, s).unwrap();
        assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
        sync(s);
        let kept = pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        assert!(kept >= 3 * MIB as u64);
        assert_eq!(mem_free(), total - kept as usize);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemPoolTrimTo(pool, 0)) }.unwrap();
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
        assert_eq!(mem_free(), total);

        // High-water marks reset to the current value, and only with 0.
        assert!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >= kept);
        assert_eq!(set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 5), INVALID);
        assert_eq!(set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0);
        assert_eq!(set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0);
        assert_eq!(set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0), INVALID, "read-only");
        // The reuse flags are ints.
        let reuse = A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC;
        let mut flag: c_int = 7;
        // SAFETY: `flag` is an int, the attribute's type.
        unsafe {
            cu_call!(driver(), cuMemPoolGetAttribute(pool, reuse, std::ptr::from_mut(&mut flag).cast())).unwrap();
            assert_eq!(flag, 1);
            flag = 0;
            cu_call!(driver(), cuMemPoolSetAttribute(pool, reuse, std::ptr::from_mut(&mut flag).cast())).unwrap();
            flag = 7;
            cu_call!(driver(), cuMemPoolGetAttribute(pool, reuse, std::ptr::from_mut(&mut flag).cast())).unwrap();
        }
        assert_eq!(flag, 0);

        // Errors: null out-pointer, memory not from a pool (0 bytes succeeds: see fidelity.rs).
        // SAFETY: a null out-pointer is rejected.
        let result = unsafe { code!(driver(), cuMemAllocAsync(std::ptr::null_mut(), 8, s)) };
        assert_eq!(result, INVALID);
        let plain = DeviceBuffer::new(16);
        assert_eq!(free_async(plain.ptr, s), INVALID, "cuMemFreeAsync of cuMemAlloc memory");
        assert_eq!(free_async(0, s), INVALID);
    });
}

#[test]
fn pool_limits_and_exhaustion() {
    use CUmemPool_attribute as A;
    in_child!(&[("CUDA_SIM_MEMORY", "8M")], || {
        use_device(0);
        let total = 8 * MIB;
        let s = non_blocking_stream();
        // A pool's maxSize bounds it.
        let small = create_pool(&pool_props(0, 4 * MIB)).unwrap();
        assert_eq!(alloc_from_pool(5 * MIB, small, s), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let p = alloc_from_pool(3 * MIB, small, s).unwrap();
        assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(destroy_pool(small), CUresult::CUDA_SUCCESS);
        assert_eq!(alloc_from_pool(MIB, small, s), Err(INVALID), "a destroyed pool");
        assert_eq!(mem_free(), total, "a destroyed pool gives its memory back");

        // The device's memory bounds the default pool; a failed allocation takes nothing, even
        // when the pool already holds memory it keeps.
        let pool = device_pool(0, false).unwrap();
        assert_eq!(set_pool_attribute(pool, A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX), CUresult::CUDA_SUCCESS);
        let p = alloc_async(MIB, s).unwrap();
        assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
        sync(s);
        let kept = pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) as usize;
        assert!(kept > 0);
        assert_eq!(mem_free(), total - kept);
        assert_eq!(alloc_async(total + 1, s), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let kept_after = pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) as usize;
        assert_eq!(
            mem_free(),
            total - kept_after,
            "device memory and pool reservation disagree after a failed allocation"
        );
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemPoolTrimTo(pool, 0)) }.unwrap();
        assert_eq!(mem_free(), total, "after trimming an idle pool, all device memory is free");
        let all = DeviceBuffer::new(total);
        drop(all);
    });
}

/// cuda.h (cuMemPoolDestroy): "If any pointers obtained from this pool haven't been freed or the
/// pool has free operations that haven't completed when cuMemPoolDestroy is invoked, the
/// function will return immediately and the resources associated with the pool will be released
/// automatically once there are no more outstanding allocations."
#[test]
fn a_pool_destroyed_before_its_last_free_gives_its_memory_back_once_the_free_is_done() {
    in_child!(&[], || {
        use_device(0);
        let start = mem_free();
        let s = non_blocking_stream();

        // The last free still waits on the stream when the pool is destroyed.
        let pool = create_pool(&pool_props(0, 0)).unwrap();
        let p = alloc_from_pool(MIB, pool, s).unwrap();
        sync(s);
        assert!(mem_free() < start, "the pool holds device memory");
        let (gate, _guard) = Gate::new();
        common::hold(gate, driver(), s);
        gate.wait_entered(1);
        assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
        assert_eq!(destroy_pool(pool), CUresult::CUDA_SUCCESS);
        gate.open();
        sync(s);
        assert_eq!(mem_free(), start, "the reserve returns to the device once the free has run");

        // The last allocation freed at once (cuMemFree) after the pool was destroyed.
        let pool = create_pool(&pool_props(0, 0)).unwrap();
        let p = alloc_from_pool(MIB, pool, s).unwrap();
        sync(s);
        assert_eq!(destroy_pool(pool), CUresult::CUDA_SUCCESS);
        assert!(mem_free() < start, "its allocation is still live");
        // SAFETY: no host pointers.
        unsafe { cu_call!(driver(), cuMemFree_v2(p)) }.unwrap();
        assert_eq!(mem_free(), start, "the reserve returns to the device with the last allocation");
    });
}

/// cuda.h (cuMemPoolTrimTo): "Allocations that have been asynchronously freed but whose
/// completion has not been observed on the host (eg. by a synchronize) can count as
/// outstanding." A free the stream has run keeps its memory from a trim until the host
/// synchronizes with that stream (another stream's synchronization does not count), by each
/// way of observing it: the stream, an event recorded after the free, the context, a query.
#[test]
fn a_trim_keeps_what_was_freed_until_the_host_has_seen_the_free() {
    in_child!(&[], || {
        use CUmemPool_attribute as A;
        use_device(0);
        let (s, other) = (non_blocking_stream(), non_blocking_stream());
        let pool = create_pool(&pool_props(0, 0)).unwrap();
        let reserved = || pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        // SAFETY: a live pool.
        let trim = || unsafe { cu_call!(driver(), cuMemPoolTrimTo(pool, 0)) }.unwrap();
        let e = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let observers: [(&str, &dyn Fn()); 4] = [
            ("cuStreamSynchronize", &|| sync(s)),
            ("cuStreamQuery", &|| assert_eq!(query(s), CUresult::CUDA_SUCCESS)),
            ("cuEventSynchronize", &|| {
                record(e, s);
                // SAFETY: a live event.
                unsafe { cu_call!(driver(), cuEventSynchronize(e)) }.unwrap();
            }),
            // SAFETY: the current context.
            ("cuCtxSynchronize", &|| unsafe { cu_call!(driver(), cuCtxSynchronize()) }.unwrap()),
        ];
        for (observer, observe) in observers {
            let p = alloc_from_pool(4 * MIB, pool, s).unwrap();
            assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
            // The free has run (nothing was ahead of it), unseen by the host.
            assert_eq!(pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
            trim();
            assert_eq!(reserved(), 4 * MIB as u64, "{observer}: trimmed before the host saw the free");
            sync(other);
            trim();
            assert_eq!(reserved(), 4 * MIB as u64, "{observer}: another stream's synchronization saw it");
            observe();
            trim();
            assert_eq!(reserved(), 0, "{observer}: kept after the host saw the free");
        }
        // A destroyed stream's frees are seen by synchronizing its context.
        let gone = non_blocking_stream();
        let p = alloc_from_pool(4 * MIB, pool, gone).unwrap();
        assert_eq!(free_async(p, gone), CUresult::CUDA_SUCCESS);
        // SAFETY: a stream of this test's, not used again.
        unsafe { cu_call!(driver(), cuStreamDestroy_v2(gone)) }.unwrap();
        trim();
        assert_eq!(reserved(), 4 * MIB as u64, "trimmed before the host saw the free");
        // SAFETY: the current context.
        unsafe { cu_call!(driver(), cuCtxSynchronize()) }.unwrap();
        trim();
        assert_eq!(reserved(), 0, "the destroyed stream's free was not seen by the context's synchronization");
    });
}

/// Waiting for an event shows the host its stream's frees up to the recording and none that the
/// stream ran after it: a free enqueued after the recording keeps its memory from a trim until
/// something observes the stream that far (cuda.h, cuMemPoolTrimTo: unobserved frees "can
/// count as outstanding"). Also after more recordings than the simulator keeps counts for.
#[test]
fn an_event_observes_the_frees_before_its_recording_only() {
    in_child!(&[], || {
        use CUmemPool_attribute as A;
        use_device(0);
        let s = non_blocking_stream();
        let pool = create_pool(&pool_props(0, 0)).unwrap();
        let reserved = || pool_attribute(pool, A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        // SAFETY: a live pool.
        let trim = || unsafe { cu_call!(driver(), cuMemPoolTrimTo(pool, 0)) }.unwrap();
        let (before, after) =
            (event(CUevent_flags::CU_EVENT_DISABLE_TIMING), event(CUevent_flags::CU_EVENT_DISABLE_TIMING));
        let waits: [(&str, &dyn Fn(CUevent)); 2] = [
            // SAFETY: live events.
            ("cuEventSynchronize", &|e| unsafe { cu_call!(driver(), cuEventSynchronize(e)) }.unwrap()),
            // The later recording may not have run yet when the frees have (it runs after the
            // second): queried until done. `NOT_READY` observes nothing, so only the answer that
            // the recording is done is the observation looked at.
            ("cuEventQuery", &|e| loop {
                match event_query(e) {
                    CUresult::CUDA_ERROR_NOT_READY => std::thread::yield_now(),
                    done => break assert_eq!(done, CUresult::CUDA_SUCCESS),
                }
            }),
        ];
        for (wait, observe) in waits {
            let (a, b) = (alloc_from_pool(4 * MIB, pool, s).unwrap(), alloc_from_pool(4 * MIB, pool, s).unwrap());
            assert_eq!(free_async(a, s), CUresult::CUDA_SUCCESS);
            record(before, s);
            assert_eq!(free_async(b, s), CUresult::CUDA_SUCCESS);
            record(after, s);
            // The frees run, unseen by the host (the second behind the first recording, on the
            // stream's worker): reading the pool's attributes observes no stream.
            let used = || pool_attribute(pool, A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while used() != 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(used(), 0, "{wait}: the frees did not run");
            observe(before);
            trim();
            assert_eq!(reserved(), 4 * MIB as u64, "{wait}: the free after the recording was taken as seen");
            observe(after);
            trim();
            assert_eq!(reserved(), 0, "{wait}: the free before the later recording was kept");
        }
        // Twenty frees, each followed by a recording of its own event: the first event observes
        // nothing after the first free; the last observes them all.
        let events: Vec<CUevent> = (0..20).map(|_| event(CUevent_flags::CU_EVENT_DISABLE_TIMING)).collect();
        let allocations: Vec<_> = events.iter().map(|_| alloc_from_pool(2 * MIB, pool, s).unwrap()).collect();
        for (&p, &e) in allocations.iter().zip(&events) {
            assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
            record(e, s);
        }
        // SAFETY: a live event.
        unsafe { cu_call!(driver(), cuEventSynchronize(events[0])) }.unwrap();
        trim();
        assert!(reserved() >= 38 * MIB as u64, "the frees after the first recording were taken as seen");
        // SAFETY: a live event.
        unsafe { cu_call!(driver(), cuEventSynchronize(events[19])) }.unwrap();
        trim();
        assert_eq!(reserved(), 0, "the last recording did not observe every free before it");
    });
}

/// Every attribute of a pool, in `CUmemPool_attribute` order (the reuse flags as 0 or 1).
fn all_attributes(pool: CUmemoryPool) -> Vec<u64> {
    use CUmemPool_attribute as A;
    let flags = [
        A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
        A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
        A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
    ];
    let mut values: Vec<u64> = flags
        .into_iter()
        .map(|attribute| {
            let mut flag: c_int = 7;
            // SAFETY: `flag` is an int, the attribute's type.
            unsafe { cu_call!(driver(), cuMemPoolGetAttribute(pool, attribute, std::ptr::from_mut(&mut flag).cast())) }
                .unwrap();
            flag as u64
        })
        .collect();
    values.extend(
        [
            A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            A::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        ]
        .into_iter()
        .map(|attribute| pool_attribute(pool, attribute)),
    );
    values
}

/// A device pool, a host-NUMA pool and a shareable (POSIX fd) device pool, each with its
/// memory accessible from device 0.
fn pools_of_each_kind() -> [(&'static str, CUmemoryPool); 3] {
    let host = CUmemPoolProps {
        location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: 0 },
        ..pool_props(0, 0)
    };
    let host = create_pool(&host).unwrap();
    let readwrite = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    assert_eq!(set_access(host, 0, readwrite), CUresult::CUDA_SUCCESS);
    let shareable = CUmemPoolProps {
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        ..pool_props(0, 0)
    };
    [
        ("device", create_pool(&pool_props(0, 0)).unwrap()),
        ("host", host),
        ("shareable", create_pool(&shareable).unwrap()),
    ]
}

/// A size whose rounding or accounting does not fit in 64 bits is more memory than any pool
/// has: `CUDA_ERROR_OUT_OF_MEMORY`, with the pool and the device left as they were (it was a
/// panic, or with overflow unchecked a pool reporting 0 bytes in use).
#[test]
fn pool_allocations_whose_size_overflows_are_out_of_memory_and_change_nothing() {
    in_child!(&[("CUDA_SIM_MEMORY", "64M")], || {
        use_device(0);
        let s = non_blocking_stream();
        for (kind, pool) in pools_of_each_kind() {
            let live = alloc_from_pool(100, pool, s).unwrap();
            let before = (all_attributes(pool), mem_free());
            for size in [usize::MAX, usize::MAX - 99, usize::MAX - 100, usize::MAX - (2 << 20), usize::MAX / 2 + 1] {
                let result = alloc_from_pool(size, pool, s);
                assert_eq!(result, Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{kind} pool, {size} bytes");
                assert_eq!((all_attributes(pool), mem_free()), before, "{kind} pool, after {size} bytes");
            }
            // The pool still works, and still counts the live allocation.
            let more = alloc_from_pool(4096, pool, s).unwrap();
            assert_eq!(pool_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4196);
            for p in [live, more] {
                assert_eq!(free_async(p, s), CUresult::CUDA_SUCCESS);
            }
            sync(s);
            assert_eq!(pool_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0, "{kind}");
        }
    });
}

/// A failed allocation leaves every attribute of the pool as it was, the high-water marks
/// included (they were raised to the size asked for, about 1 TiB here, which a GPU never
/// does), whether the pool's limit, the device's memory or the host refused it.
#[test]
fn a_failed_pool_allocation_leaves_every_attribute_as_it_was() {
    in_child!(&[("CUDA_SIM_MEMORY", "64M")], || {
        use_device(0);
        let s = non_blocking_stream();
        let limited = create_pool(&pool_props(0, 8 * MIB)).unwrap();
        let mut pools = pools_of_each_kind().to_vec();
        pools.push(("limited", limited));
        for (kind, pool) in pools {
            let live = alloc_from_pool(MIB, pool, s).unwrap();
            let before = (all_attributes(pool), mem_free());
            // Past the pool's limit, past the device's memory, past the host's address space.
            let sizes: &[usize] = match kind {
                "limited" => &[9 * MIB, 65 * MIB, 1 << 40],
                "host" => &[1 << 50],
                _ => &[65 * MIB, 1 << 40],
            };
            for &size in sizes {
                let result = alloc_from_pool(size, pool, s);
                assert_eq!(result, Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{kind} pool, {size} bytes");
                assert_eq!((all_attributes(pool), mem_free()), before, "{kind} pool, after {size} bytes");
            }
            assert_eq!(free_async(live, s), CUresult::CUDA_SUCCESS);
            sync(s);
        }
    });
}

/// `cuda.h`, `cuMemFree`: "Frees the memory space pointed to by dptr, which must have been
/// returned by a previous call to one of the following memory allocation APIs - cuMemAlloc(),
/// cuMemAllocPitch(), cuMemAllocManaged(), cuMemAllocAsync(), cuMemAllocFromPoolAsync()".
#[test]
fn mem_free_accepts_stream_ordered_allocations() {
    in_child!(&[], || {
        use_device(0);
        let s = non_blocking_stream();
        let p = alloc_async(4096, s).unwrap();
        sync(s);
        // SAFETY: no host pointers.
        let result = unsafe { code!(driver(), cuMemFree_v2(p)) };
        assert_eq!(result, CUresult::CUDA_SUCCESS, "cuMemFree of cuMemAllocAsync memory");
        assert_eq!(free_async(p, s), INVALID, "it is gone");
    });
}

#[test]
fn a_host_pool_is_the_host_cpus_until_a_device_is_given_access() {
    // cuda.h: host pools' "default accessibility will be from the host CPU"; on an H100 a memset
    // into such memory before access is set is CUDA_ERROR_INVALID_VALUE.
    use CUmemAccess_flags as F;
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        use_device(0);
        for type_ in [CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA] {
            let props = CUmemPoolProps { location: CUmemLocation { type_, id: 0 }, ..pool_props(0, 0) };
            let pool = create_pool(&props).unwrap();
            assert_eq!(
                (access(pool, 0), access(pool, 1)),
                (F::CU_MEM_ACCESS_FLAGS_PROT_NONE, F::CU_MEM_ACCESS_FLAGS_PROT_NONE)
            );
            let p = alloc_from_pool(4096, pool, NULL_STREAM).unwrap();
            // SAFETY: `p` is a live allocation of 4096 bytes.
            let refused = unsafe { code!(driver(), cuMemsetD8Async(p, 1, 4096, NULL_STREAM)) };
            assert_eq!(refused, CUresult::CUDA_ERROR_INVALID_VALUE, "{type_:?}: no access yet");
            assert_eq!(set_access(pool, 0, F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUresult::CUDA_SUCCESS);
            assert_eq!(
                (access(pool, 0), access(pool, 1)),
                (F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE, F::CU_MEM_ACCESS_FLAGS_PROT_NONE)
            );
            memset_async(p, 1, 4096, NULL_STREAM);
            sync(NULL_STREAM);
            assert_eq!(dtoh(p, 4), [1; 4]);
            assert_eq!(free_async(p, NULL_STREAM), CUresult::CUDA_SUCCESS);
            sync(NULL_STREAM);
            assert_eq!(destroy_pool(pool), CUresult::CUDA_SUCCESS);
        }
    });
}

#[test]
fn pool_access_from_other_devices() {
    use CUmemAccess_flags as F;
    let body = |peers: bool| {
        move || {
            let c0 = use_device(0);
            let pool = create_pool(&pool_props(0, 0)).unwrap();
            let s0 = non_blocking_stream();
            let p = alloc_from_pool(64, pool, s0).unwrap();
            memset_async(p, 0x11, 64, s0);
            sync(s0);
            assert_eq!(access(pool, 0), F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "the owner");
            assert_eq!(access(pool, 1), F::CU_MEM_ACCESS_FLAGS_PROT_NONE, "no access by default");
            assert_eq!(set_access(pool, 0, F::CU_MEM_ACCESS_FLAGS_PROT_READ), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(set_access(pool, 2, F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUresult::CUDA_ERROR_INVALID_DEVICE);

            use_device(1);
            let s1 = non_blocking_stream();
            let out = Pinned::new(64);
            // SAFETY: `out` is valid for 64 bytes until the stream is synchronized.
            let read = || unsafe { code!(driver(), cuMemcpyDtoHAsync_v2(out.ptr.cast(), p, 64, s1)) };
            assert_eq!(read(), INVALID, "device 1 reads device 0's pool memory without access");
            let granted = set_access(pool, 1, F::CU_MEM_ACCESS_FLAGS_PROT_READ);
            if !peers {
                assert_eq!(granted, CUresult::CUDA_ERROR_INVALID_DEVICE, "no peer access, no pool access");
                return;
            }
            assert_eq!(granted, CUresult::CUDA_SUCCESS);
            assert_eq!(access(pool, 1), F::CU_MEM_ACCESS_FLAGS_PROT_READ);
            assert_eq!(read(), CUresult::CUDA_SUCCESS);
            sync(s1);
            assert_eq!(out.read(), vec![0x11; 64]);
            // Read access does not allow writes.
            assert_eq!(common::query(s1), CUresult::CUDA_SUCCESS);
            // SAFETY: no host pointers.
            let write = unsafe { code!(driver(), cuMemsetD8Async(p, 0, 64, s1)) };
            assert_eq!(write, INVALID, "device 1 writes with read-only access");
            assert_eq!(set_access(pool, 1, F::CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUresult::CUDA_SUCCESS);
            // SAFETY: no host pointers.
            unsafe { cu_call!(driver(), cuMemsetD8Async(p, 0x22, 64, s1)) }.unwrap();
            sync(s1);
            // SAFETY: `c0` is live.
            unsafe { cu_call!(driver(), cuCtxSetCurrent(c0)) }.unwrap();
            assert_eq!(dtoh(p, 64), vec![0x22; 64]);
        }
    };
    in_child!(&[("CUDA_SIM_DEVICES", "2")], body(true));
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_PEER_ACCESS", "none")], body(false));
}

fn alloc_managed(len: usize, flags: u32) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocManaged(&mut ptr, len, flags)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

#[test]
fn managed_memory_is_accessible_from_host_and_device() {
    use CUpointer_attribute as A;
    use_device(0);
    let p = alloc_managed(256, 1).unwrap();
    // SAFETY: managed memory is host-accessible for 256 bytes, and no stream uses it yet.
    unsafe { (p as *mut u8).write_bytes(0x5e, 256) };
    assert_eq!(dtoh(p, 256), vec![0x5e; 256]);
    htod(p + 128, &[1; 128]);
    sync(NULL_STREAM);
    // SAFETY: as above; the copy has completed.
    assert_eq!(unsafe { (p as *const u8).add(200).read_volatile() }, 1);
    assert_eq!(pointer_attribute(A::CU_POINTER_ATTRIBUTE_IS_MANAGED, p, false), Ok(true));
    assert_eq!(pointer_attribute(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 1, 0usize), Ok(256));
    assert_eq!(
        pointer_attribute(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p, 0u32),
        Ok(CUmemorytype::CU_MEMORYTYPE_DEVICE.0)
    );
    assert_eq!(pointer_attribute(A::CU_POINTER_ATTRIBUTE_HOST_POINTER, p, 0u64), Ok(p));
    // SAFETY: no host pointers.
    unsafe {
        cu_call!(driver(), cuMemFree_v2(p)).unwrap();
        assert_eq!(code!(driver(), cuMemFree_v2(p)), INVALID);
    }
    // Exactly one of CU_MEM_ATTACH_GLOBAL (1) and CU_MEM_ATTACH_HOST (2); not zero bytes.
    for flags in [0, 3, 4] {
        assert_eq!(alloc_managed(16, flags), Err(INVALID), "flags {flags}");
    }
    assert_eq!(alloc_managed(0, 1), Err(INVALID));
    let host = alloc_managed(16, 2).unwrap();
    // SAFETY: no host pointers.
    unsafe { cu_call!(driver(), cuMemFree_v2(host)) }.unwrap();
}

fn register(ptr: *mut c_void, len: usize, flags: u32) -> CUresult {
    // SAFETY: callers pass memory valid for `len` bytes, or arguments the driver rejects.
    unsafe { code!(driver(), cuMemHostRegister_v2(ptr, len, flags)) }
}

fn unregister(ptr: *mut c_void) -> CUresult {
    // SAFETY: only registered memory is unregistered; other pointers are rejected unread.
    unsafe { code!(driver(), cuMemHostUnregister(ptr)) }
}

#[test]
fn host_registration() {
    use CUpointer_attribute as A;
    use_device(0);
    let mut memory = vec![0u8; 8192];
    let ptr = memory.as_mut_ptr().cast::<c_void>();
    assert_eq!(register(ptr, 8192, 0), CUresult::CUDA_SUCCESS);
    assert_eq!(
        pointer_attribute(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr as CUdeviceptr + 100, 0u32),
        Ok(CUmemorytype::CU_MEMORYTYPE_HOST.0)
    );
    assert_eq!(register(ptr, 8192, 0), CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    // SAFETY: `ptr + 4096` lies inside `memory`.
    let inside = unsafe { ptr.cast::<u8>().add(4096) }.cast::<c_void>();
    assert_eq!(register(inside, 16, 0), CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    // Registered memory works in copies like pinned memory.
    let buffer = DeviceBuffer::with(&[7; 64]);
    // SAFETY: `ptr` is valid for 64 bytes; the copy returns when done.
    unsafe { cu_call!(driver(), cuMemcpyDtoH_v2(ptr, buffer.ptr, 64)) }.unwrap();
    assert_eq!(memory[..64], [7; 64]);
    assert_eq!(unregister(inside), CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_eq!(unregister(ptr), CUresult::CUDA_SUCCESS);
    assert_eq!(unregister(ptr), CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    assert_eq!(
        pointer_attribute(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr as CUdeviceptr, 0u32),
        Err(INVALID),
        "no longer known"
    );
    // Bad arguments.
    assert_eq!(register(ptr, 8192, 0x10), INVALID, "unknown flag");
    assert_eq!(register(ptr, 0, 0), INVALID, "zero bytes");
    assert_eq!(register(std::ptr::null_mut(), 16, 0), INVALID, "null");
    assert_eq!(register(buffer.ptr as *mut c_void, 16, 0), INVALID, "device memory");
    let pinned = Pinned::new(16);
    assert_eq!(
        register(pinned.ptr.cast(), 16, 0),
        CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        "pinned memory"
    );
    drop(memory);
}

fn capturing(s: CUstream) -> CUstreamCaptureStatus {
    let mut status = CUstreamCaptureStatus(99);
    // SAFETY: `status` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamIsCapturing(s, &mut status)) }.unwrap();
    status
}

fn begin_capture(s: CUstream, mode: CUstreamCaptureMode) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuStreamBeginCapture_v2(s, mode)) }
}

fn end_capture(s: CUstream) -> Result<CUgraph, CUresult> {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer.
    match unsafe { code!(driver(), cuStreamEndCapture(s, &mut graph)) } {
        CUresult::CUDA_SUCCESS => Ok(graph),
        error => Err(error),
    }
}

#[test]
fn graph_capture_records_work_without_running_it() {
    use CUstreamCaptureMode as M;
    use CUstreamCaptureStatus as S;
    use_device(0);
    let s = non_blocking_stream();
    let pinned = Pinned::new(16);
    assert_eq!(capturing(s), S::CU_STREAM_CAPTURE_STATUS_NONE);
    assert_eq!(begin_capture(s, M::CU_STREAM_CAPTURE_MODE_RELAXED), CUresult::CUDA_SUCCESS);
    assert_eq!(capturing(s), S::CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_eq!(begin_capture(s, M::CU_STREAM_CAPTURE_MODE_RELAXED), CUresult::CUDA_ERROR_ILLEGAL_STATE);
    memset_async(pinned.dptr(), 9, 16, s);
    // An allocation from an explicit device pool is an allocation node owned by the graph, as
    // `cuda.h` notes ("the memory pool's properties are used to set the node's creation
    // parameters"): the pool lends nothing. One from a pool a node cannot describe (shareable:
    // "IPC is not supported") is refused without invalidating the capture. One from the current
    // pool is an allocation node too (see graphs.rs).
    let pool = device_pool(0, false).unwrap();
    let used_before = pool_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    assert!(alloc_from_pool(64, pool, s).is_ok());
    assert_eq!(pool_attribute(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT), used_before);
    let shareable = create_pool(&CUmemPoolProps {
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        ..pool_props(0, 0)
    })
    .unwrap();
    assert_eq!(alloc_from_pool(64, shareable, s), Err(CUresult::CUDA_ERROR_NOT_SUPPORTED));
    assert!(alloc_async(64, s).is_ok());
    assert_eq!(capturing(s), S::CU_STREAM_CAPTURE_STATUS_ACTIVE);
    let graph = end_capture(s).unwrap();
    assert!(!graph.is_null());
    assert_eq!(capturing(s), S::CU_STREAM_CAPTURE_STATUS_NONE);
    sync(s);
    assert_eq!(query(s), CUresult::CUDA_SUCCESS);
    assert_eq!(pinned.read(), [0; 16], "captured work is not run");
    // SAFETY: `graph` came from cuStreamEndCapture and is destroyed once; then it is unknown.
    unsafe {
        cu_call!(driver(), cuGraphDestroy(graph)).unwrap();
        assert_eq!(code!(driver(), cuGraphDestroy(graph)), INVALID);
    }
    // The stream works normally again.
    memset_async(pinned.dptr(), 3, 16, s);
    sync(s);
    assert_eq!(pinned.read(), [3; 16]);

    assert_eq!(end_capture(s), Err(CUresult::CUDA_ERROR_ILLEGAL_STATE), "not capturing");
    assert_eq!(
        begin_capture(NULL_STREAM, M::CU_STREAM_CAPTURE_MODE_GLOBAL),
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        "the legacy stream cannot capture"
    );
    assert_eq!(begin_capture(s, CUstreamCaptureMode(7)), INVALID);
    // SAFETY: a null out-pointer is accepted (cuda.core's graph builder passes one: see
    // graphs.rs); the stream is not capturing.
    let result = unsafe { code!(driver(), cuStreamEndCapture(s, std::ptr::null_mut())) };
    assert_eq!(result, CUresult::CUDA_ERROR_ILLEGAL_STATE);
}
