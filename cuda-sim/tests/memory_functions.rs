//! Pinned allocations with flags (`cuMemHostAlloc`), copies between devices (`cuMemcpyPeer`,
//! `cuMemcpyPeerAsync`), managed memory's stream association (`cuStreamAttachMemAsync`) and the
//! location-based pool functions of CUDA 13 (`cuMemGetDefaultMemPool`, `cuMemGetMemPool`,
//! `cuMemSetMemPool`): what each does, and the errors `cuda.h` documents.

mod common;

use std::ffi::{c_int, c_uint, c_void};

use common::{
    DeviceBuffer, Gate, NULL_STREAM, STREAM_LEGACY, STREAM_PER_THREAD, code, current, device_location, driver, dtoh,
    htod, in_child, init, non_blocking_stream, per_thread_driver, sync, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUcontext, CUdeviceptr, CUmemAllocationHandleType, CUmemAllocationType, CUmemAttach_flags, CUmemLocation,
    CUmemLocationType, CUmemPoolProps, CUmemoryPool, CUmemorytype, CUpointer_attribute, CUresult, CUstream,
    CUstreamCaptureMode, CUstreamCaptureStatus,
};

const INVALID_VALUE: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const PINNED: CUmemAllocationType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
const MANAGED: CUmemAllocationType = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED;

fn host_alloc(len: usize, flags: c_uint) -> Result<*mut c_void, CUresult> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemHostAlloc(&mut ptr, len, flags)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn free_host(ptr: *mut c_void) -> CUresult {
    // SAFETY: the simulator checks the pointer before freeing anything.
    unsafe { code!(driver(), cuMemFreeHost(ptr)) }
}

fn pointer_attribute<T: Copy>(attribute: CUpointer_attribute, ptr: CUdeviceptr, mut value: T) -> T {
    // SAFETY: `value` has the attribute's documented type.
    unsafe { cu_call!(driver(), cuPointerGetAttribute((&raw mut value).cast(), attribute, ptr)) }.unwrap();
    value
}

#[test]
fn host_alloc_gives_pinned_memory_with_every_flag() {
    let ctx = use_device(0);
    for flags in 0..8 {
        let ptr = host_alloc(4096, flags).unwrap_or_else(|e| panic!("flags {flags:#x}: {e:?}"));
        // Host memory, written and read in place, and a device pointer equal to it.
        // SAFETY: 4096 bytes of host memory just allocated.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0x5a, 4096) };
        let address = ptr as CUdeviceptr;
        let memory_type = pointer_attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address, 0u32);
        assert_eq!(memory_type, CUmemorytype::CU_MEMORYTYPE_HOST.0, "flags {flags:#x}");
        let device_pointer = pointer_attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, address, 0u64);
        assert_eq!(device_pointer, address);
        let host_pointer =
            pointer_attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER, address, std::ptr::null_mut());
        assert_eq!(host_pointer, ptr);
        let context = pointer_attribute(CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT, address, 0 as CUcontext);
        assert_eq!(context, ctx);
        let device = DeviceBuffer::new(4096);
        // SAFETY: both ranges are 4096 live bytes; the copy from pinned memory is done on return.
        unsafe { cu_call!(driver(), cuMemcpyHtoD_v2(device.ptr, ptr, 4096)) }.unwrap();
        assert!(device.read().iter().all(|&b| b == 0x5a));
        assert_eq!(free_host(ptr), CUresult::CUDA_SUCCESS);
        assert_eq!(free_host(ptr), INVALID_VALUE, "freed twice");
    }
}

#[test]
fn host_alloc_refuses_what_cuda_h_refuses() {
    in_child!(&[], || {
        assert_eq!(host_alloc(64, 0), Err(CUresult::CUDA_ERROR_NOT_INITIALIZED));
        init();
        assert_eq!(host_alloc(64, 0), Err(CUresult::CUDA_ERROR_INVALID_CONTEXT), "no current context");
        use_device(0);
        assert_eq!(host_alloc(64, 0x8), Err(INVALID_VALUE), "an unknown flag");
        assert_eq!(host_alloc(0, 0), Err(INVALID_VALUE), "0 bytes, as cuMemAllocHost");
        // SAFETY: a null out-pointer is refused before any write.
        assert_eq!(unsafe { code!(driver(), cuMemHostAlloc(std::ptr::null_mut(), 64, 0)) }, INVALID_VALUE);
        // Freed by cuMemFreeHost only.
        let ptr = host_alloc(64, 0x1).unwrap();
        // SAFETY: no host pointers; a host address is refused.
        assert_eq!(unsafe { code!(driver(), cuMemFree_v2(ptr as CUdeviceptr)) }, INVALID_VALUE);
        assert_eq!(free_host(ptr), CUresult::CUDA_SUCCESS);
    });
}

fn pool_props(location: CUmemLocation, kind: CUmemAllocationType) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: kind,
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location,
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: 0,
        usage: 0,
        reserved: [0; 54],
    }
}

fn create_pool(location: CUmemLocation, kind: CUmemAllocationType) -> CUmemoryPool {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and the properties are valid.
    unsafe { cu_call!(driver(), cuMemPoolCreate(&mut pool, &pool_props(location, kind))) }.unwrap();
    pool
}

fn pool_alloc(pool: CUmemoryPool, len: usize, s: CUstream) -> CUdeviceptr {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuMemAllocFromPoolAsync(&mut ptr, len, pool, s)) }.unwrap();
    ptr
}

fn default_pool(device: c_int) -> CUmemoryPool {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuDeviceGetDefaultMemPool(&mut pool, device)) }.unwrap();
    pool
}

fn peer_async(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    len: usize,
    s: CUstream,
) -> CUresult {
    // SAFETY: no host pointers; the ranges are checked by the simulator.
    unsafe { code!(driver(), cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, len, s)) }
}

fn peer(dst: CUdeviceptr, dst_ctx: CUcontext, src: CUdeviceptr, src_ctx: CUcontext, len: usize) -> CUresult {
    // SAFETY: as above.
    unsafe { code!(driver(), cuMemcpyPeer(dst, dst_ctx, src, src_ctx, len)) }
}

#[test]
fn peer_copies_move_memory_between_devices_each_side_reached_by_its_own_context() {
    // Without peer access between the devices: a peer copy needs none.
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_PEER_ACCESS", "none")], || {
        let ctx1 = use_device(1);
        let s1 = non_blocking_stream();
        let on1 = pool_alloc(default_pool(1), 4096, s1);
        let plain1 = DeviceBuffer::with(&[1; 4096]);
        sync(s1);
        let ctx0 = use_device(0);
        let s0 = non_blocking_stream();
        let on0 = pool_alloc(default_pool(0), 4096, s0);
        htod(on0, &[9; 4096]);
        sync(NULL_STREAM);
        // Pool memory of each device, no access granted: each side through its own context.
        assert_eq!(peer_async(on1, ctx1, on0, ctx0, 4096, s0), CUresult::CUDA_SUCCESS);
        sync(s0);
        use_device(1);
        assert_eq!(dtoh(on1, 4096), [9; 4096]);
        use_device(0);
        assert_eq!(peer(on0, ctx0, plain1.ptr, ctx1, 4096), CUresult::CUDA_SUCCESS, "synchronous, cuMemAlloc memory");
        sync(NULL_STREAM);
        assert_eq!(dtoh(on0, 4096), [1; 4096]);
        // The same copy as cuMemcpyAsync is reached by the stream's device, which has no access.
        // SAFETY: no host pointers.
        assert_eq!(unsafe { code!(driver(), cuMemcpyDtoDAsync_v2(on1, on0, 4096, s0)) }, INVALID_VALUE);
        // Pool memory named with another device's context is reached by that device: refused.
        assert_eq!(peer_async(on1, ctx0, on0, ctx0, 4096, s0), INVALID_VALUE);
        assert_eq!(peer_async(on1, ctx1, on0, ctx1, 4096, s0), INVALID_VALUE);
        // The per-thread default stream, through the `_ptsz` variant.
        // SAFETY: no host pointers.
        let per_thread =
            unsafe { code!(per_thread_driver(), cuMemcpyPeerAsync(on1, ctx1, on0, ctx0, 4096, NULL_STREAM)) };
        assert_eq!(per_thread, CUresult::CUDA_SUCCESS);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuStreamSynchronize(STREAM_PER_THREAD)) }.unwrap();
        // SAFETY: both pointers are live pool allocations freed once.
        unsafe {
            cu_call!(driver(), cuMemFreeAsync(on0, s0)).unwrap();
            cu_call!(driver(), cuMemFreeAsync(on1, s0)).unwrap();
        }
        sync(s0);
    });
}

#[test]
fn peer_copies_refuse_what_cuda_h_refuses() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let ctx1 = use_device(1);
        let b1 = DeviceBuffer::new(64);
        let ctx0 = use_device(0);
        let b0 = DeviceBuffer::new(64);
        let null = std::ptr::null_mut();
        let invalid_context = CUresult::CUDA_ERROR_INVALID_CONTEXT;
        assert_eq!(peer(b0.ptr, null, b1.ptr, ctx1, 64), invalid_context, "a null context");
        assert_eq!(peer_async(b0.ptr, ctx0, b1.ptr, 0x1234 as CUcontext, 64, NULL_STREAM), invalid_context);
        assert_eq!(peer_async(b0.ptr, ctx0, b1.ptr, ctx1, 128, NULL_STREAM), INVALID_VALUE, "past the end");
        let host = [0u8; 64];
        assert_eq!(peer(b0.ptr, ctx0, host.as_ptr() as CUdeviceptr, ctx1, 64), INVALID_VALUE, "host memory");
        let bogus = 0x10 as CUstream;
        assert_eq!(peer_async(b0.ptr, ctx0, b1.ptr, ctx1, 64, bogus), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(peer_async(b0.ptr, ctx0, b1.ptr, ctx1, 0, STREAM_LEGACY), CUresult::CUDA_SUCCESS, "0 bytes");
        let mut created: CUcontext = null;
        // SAFETY: valid out-pointer, no parameters.
        unsafe { cu_call!(driver(), cuCtxCreate_v4(&mut created, null.cast(), 0, 1)) }.unwrap();
        // SAFETY: a context made here, destroyed once.
        unsafe { cu_call!(driver(), cuCtxDestroy_v2(created)) }.unwrap();
        assert_eq!(peer(b0.ptr, ctx0, b1.ptr, created, 64), invalid_context, "a destroyed context");
        assert_eq!(current(), ctx0);
    });
}

fn attach(s: CUstream, ptr: CUdeviceptr, len: usize, flags: CUmemAttach_flags) -> CUresult {
    // SAFETY: no host pointers are dereferenced.
    unsafe { code!(driver(), cuStreamAttachMemAsync(s, ptr, len, flags.0)) }
}

#[test]
fn managed_memory_attaches_whole_to_a_stream() {
    in_child!(&[], || {
        use CUmemAttach_flags as F;
        use_device(0);
        let mut managed: CUdeviceptr = 0;
        // SAFETY: `managed` is a valid out-pointer.
        unsafe { cu_call!(driver(), cuMemAllocManaged(&mut managed, 8192, F::CU_MEM_ATTACH_GLOBAL.0)) }.unwrap();
        let s = non_blocking_stream();
        for flags in [F::CU_MEM_ATTACH_GLOBAL, F::CU_MEM_ATTACH_HOST, F::CU_MEM_ATTACH_SINGLE] {
            assert_eq!(attach(s, managed, 0, flags), CUresult::CUDA_SUCCESS, "{flags:?}, length 0");
            assert_eq!(attach(s, managed, 8192, flags), CUresult::CUDA_SUCCESS, "{flags:?}, its size");
        }
        assert_eq!(attach(NULL_STREAM, managed, 0, F::CU_MEM_ATTACH_GLOBAL), CUresult::CUDA_SUCCESS);
        // Refused: a part of the allocation, flags that are not one of CUmemAttach_flags,
        // attaching singly to a default stream, memory that is not managed.
        assert_eq!(attach(s, managed, 4096, F::CU_MEM_ATTACH_GLOBAL), INVALID_VALUE, "part of it");
        assert_eq!(attach(s, managed + 4096, 0, F::CU_MEM_ATTACH_GLOBAL), INVALID_VALUE, "from inside it");
        assert_eq!(attach(s, managed, 0, CUmemAttach_flags(3)), INVALID_VALUE);
        assert_eq!(attach(s, managed, 0, CUmemAttach_flags(0)), INVALID_VALUE);
        assert_eq!(attach(NULL_STREAM, managed, 0, F::CU_MEM_ATTACH_SINGLE), INVALID_VALUE, "the NULL stream");
        assert_eq!(attach(STREAM_PER_THREAD, managed, 0, F::CU_MEM_ATTACH_SINGLE), INVALID_VALUE);
        let device = DeviceBuffer::new(4096);
        assert_eq!(attach(s, device.ptr, 0, F::CU_MEM_ATTACH_GLOBAL), INVALID_VALUE, "device memory");
        let pageable = vec![0u8; 4096];
        let address = pageable.as_ptr() as CUdeviceptr;
        assert_eq!(attach(s, address, 4096, F::CU_MEM_ATTACH_GLOBAL), CUresult::CUDA_ERROR_NOT_SUPPORTED, "pageable");
        assert_eq!(attach(s, address, 0, F::CU_MEM_ATTACH_GLOBAL), INVALID_VALUE, "pageable, no length");
        assert_eq!(attach(0x10 as CUstream, managed, 0, F::CU_MEM_ATTACH_GLOBAL), CUresult::CUDA_ERROR_INVALID_HANDLE);
        // The `_ptsz` variant's NULL is the per-thread stream, a default stream too.
        // SAFETY: no host pointers.
        let single = unsafe {
            code!(per_thread_driver(), cuStreamAttachMemAsync(NULL_STREAM, managed, 0, F::CU_MEM_ATTACH_SINGLE.0))
        };
        assert_eq!(single, INVALID_VALUE);
        // On a capturing stream: refused, and the capture is invalidated.
        let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: a live stream.
        unsafe { cu_call!(driver(), cuStreamBeginCapture_v2(s, relaxed)) }.unwrap();
        assert_eq!(attach(s, managed, 0, F::CU_MEM_ATTACH_HOST), CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        let mut status = CUstreamCaptureStatus(99);
        // SAFETY: valid out-pointer.
        unsafe { cu_call!(driver(), cuStreamIsCapturing(s, &mut status)) }.unwrap();
        assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        let mut graph = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the invalidated capture gives no graph.
        let ended = unsafe { code!(driver(), cuStreamEndCapture(s, &mut graph)) };
        assert_eq!(ended, CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        // SAFETY: the managed allocation, freed once.
        unsafe { cu_call!(driver(), cuMemFree_v2(managed)) }.unwrap();
        assert_eq!(attach(s, managed, 0, F::CU_MEM_ATTACH_GLOBAL), INVALID_VALUE, "freed");
    });
}

/// `cuMemGetDefaultMemPool` (`default`) or `cuMemGetMemPool`: the pool, or the error.
fn location_pool(
    default: bool,
    mut location: CUmemLocation,
    kind: CUmemAllocationType,
) -> Result<CUmemoryPool, CUresult> {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: both pointers are valid.
    let result = unsafe {
        if default {
            code!(driver(), cuMemGetDefaultMemPool(&mut pool, &mut location, kind))
        } else {
            code!(driver(), cuMemGetMemPool(&mut pool, &mut location, kind))
        }
    };
    if result == CUresult::CUDA_SUCCESS { Ok(pool) } else { Err(result) }
}

/// The default pool of a location and kind.
fn default_of(location: CUmemLocation, kind: CUmemAllocationType) -> Result<CUmemoryPool, CUresult> {
    location_pool(true, location, kind)
}

/// The current pool of a location and kind.
fn current_of(location: CUmemLocation, kind: CUmemAllocationType) -> Result<CUmemoryPool, CUresult> {
    location_pool(false, location, kind)
}

fn set_pool(mut location: CUmemLocation, kind: CUmemAllocationType, pool: CUmemoryPool) -> CUresult {
    // SAFETY: `location` is valid.
    unsafe { code!(driver(), cuMemSetMemPool(&mut location, kind, pool)) }
}

fn location(type_: CUmemLocationType, id: c_int) -> CUmemLocation {
    CUmemLocation { type_, id }
}

#[test]
fn each_location_has_a_default_pool_and_a_current_one() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        use CUmemLocationType as T;
        init();
        let (host, numa, none) = (
            location(T::CU_MEM_LOCATION_TYPE_HOST, 0),
            location(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 0),
            location(T::CU_MEM_LOCATION_TYPE_NONE, 0),
        );
        // A device's pinned memory: its default pool, as cuDeviceGetDefaultMemPool gives it.
        assert_eq!(default_of(device_location(1), PINNED), Ok(default_pool(1)));
        assert_eq!(current_of(device_location(1), PINNED), Ok(default_pool(1)));
        // Other locations and kinds: one default pool each, the current one until another is set.
        let host_default = default_of(host, PINNED).unwrap();
        let managed_default = default_of(none, MANAGED).unwrap();
        assert!(!host_default.is_null() && host_default != managed_default);
        assert_eq!(default_of(host, PINNED), Ok(host_default), "the same one again");
        assert_eq!(current_of(host, PINNED), Ok(host_default));
        let numa_default = default_of(numa, PINNED).unwrap();
        assert_ne!(numa_default, host_default);
        // SAFETY: no pointers are dereferenced; a default pool cannot be destroyed.
        assert_eq!(unsafe { code!(driver(), cuMemPoolDestroy(host_default)) }, INVALID_VALUE);

        use_device(0);
        let mine = create_pool(host, PINNED);
        assert_eq!(set_pool(host, PINNED, mine), CUresult::CUDA_SUCCESS);
        assert_eq!(current_of(host, PINNED), Ok(mine));
        assert_eq!(default_of(host, PINNED), Ok(host_default), "the default stays");
        assert_eq!(current_of(numa, PINNED), Ok(numa_default), "another location's is its own");
        // The pool must be of that location and kind.
        assert_eq!(set_pool(numa, PINNED, mine), INVALID_VALUE);
        assert_eq!(set_pool(none, MANAGED, mine), INVALID_VALUE);
        assert_eq!(set_pool(device_location(0), PINNED, mine), INVALID_VALUE);
        // A device's pinned memory: cuDeviceSetMemPool's equivalent.
        let on1 = create_pool(device_location(1), PINNED);
        assert_eq!(set_pool(device_location(0), PINNED, on1), INVALID_VALUE, "another device's pool");
        assert_eq!(set_pool(device_location(1), PINNED, on1), CUresult::CUDA_SUCCESS);
        let mut current: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        unsafe { cu_call!(driver(), cuDeviceGetMemPool(&mut current, 1)) }.unwrap();
        assert_eq!(current, on1);
        // Destroying a current pool makes the location's default current again.
        // SAFETY: pools made here, destroyed once.
        unsafe {
            cu_call!(driver(), cuMemPoolDestroy(mine)).unwrap();
            cu_call!(driver(), cuMemPoolDestroy(on1)).unwrap();
        }
        assert_eq!(current_of(host, PINNED), Ok(host_default));
        assert_eq!(current_of(device_location(1), PINNED), Ok(default_pool(1)));
        assert_eq!(set_pool(host, PINNED, mine), INVALID_VALUE, "a destroyed pool");
    });
}

#[test]
fn location_pools_refuse_what_cuda_h_refuses() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        use CUmemLocationType as T;
        assert_eq!(default_of(device_location(0), PINNED), Err(CUresult::CUDA_ERROR_NOT_INITIALIZED));
        init();
        let invalid = Err(INVALID_VALUE);
        for default in [true, false] {
            let pool = |location, kind| location_pool(default, location, kind);
            assert_eq!(pool(location(T::CU_MEM_LOCATION_TYPE_NONE, 0), PINNED), invalid, "no location, pinned");
            assert_eq!(pool(location(T::CU_MEM_LOCATION_TYPE_INVALID, 0), PINNED), invalid);
            assert_eq!(pool(location(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 7), PINNED), invalid, "no NUMA node 7");
            assert_eq!(pool(device_location(0), CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_INVALID), invalid);
            // Only cuMemGetDefaultMemPool documents CUDA_ERROR_INVALID_DEVICE.
            let absent = if default { Err(CUresult::CUDA_ERROR_INVALID_DEVICE) } else { invalid };
            assert_eq!(pool(device_location(2), PINNED), absent, "no device 2");
        }
        let mut location = device_location(0);
        // SAFETY: null pointers are refused before any access.
        unsafe {
            assert_eq!(
                code!(driver(), cuMemGetDefaultMemPool(std::ptr::null_mut(), &mut location, PINNED)),
                INVALID_VALUE
            );
            let mut pool: CUmemoryPool = std::ptr::null_mut();
            assert_eq!(code!(driver(), cuMemGetDefaultMemPool(&mut pool, std::ptr::null_mut(), PINNED)), INVALID_VALUE);
            assert_eq!(code!(driver(), cuMemGetMemPool(&mut pool, std::ptr::null_mut(), PINNED)), INVALID_VALUE);
            assert_eq!(code!(driver(), cuMemSetMemPool(std::ptr::null_mut(), PINNED, default_pool(0))), INVALID_VALUE);
        }
        assert_eq!(set_pool(device_location(0), PINNED, 0x10 as CUmemoryPool), INVALID_VALUE, "not a pool");
        assert_eq!(set_pool(device_location(0), MANAGED, default_pool(0)), INVALID_VALUE, "not a managed pool");
    });
}

#[test]
fn a_peer_copy_runs_in_stream_order() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let ctx1 = use_device(1);
        let b1 = DeviceBuffer::new(64);
        let ctx0 = use_device(0);
        let b0 = DeviceBuffer::with(&[3; 64]);
        let s = non_blocking_stream();
        let (gate, _open) = Gate::new();
        common::hold(gate, driver(), s);
        common::memset_async(b0.ptr, 4, 64, s);
        assert_eq!(peer_async(b1.ptr, ctx1, b0.ptr, ctx0, 64, s), CUresult::CUDA_SUCCESS);
        gate.open();
        sync(s);
        use_device(1);
        assert_eq!(b1.read(), [4; 64], "the copy ran after the memset before it");
        drop(b1);
        use_device(0);
    });
}
