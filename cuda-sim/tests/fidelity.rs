//! Where the simulator was made to agree with what GPUs and cuda.core show (issue 14): zero-byte
//! pool allocations, copies through a host pool before access is granted, PCI bus ids, pool
//! handle values that come back (nvbug 5698116), refused address hints, and `cuMemFree` with
//! work pending. Each reading is listed in `cuda_sim::conservative`.

mod common;

use std::ffi::{CString, c_char, c_int};
use std::time::Instant;

use common::{
    DeviceBuffer, Gate, NULL_STREAM, Pinned, access, code, device_location, driver, htod, in_child,
    non_blocking_stream, set_access, sync, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUdevice_attribute, CUdeviceptr, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation,
    CUmemLocationType, CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUresult, CUstream,
};

const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const OK: CUresult = CUresult::CUDA_SUCCESS;
const MIB: usize = 1 << 20;

fn props(location: CUmemLocation, handle_types: CUmemAllocationHandleType) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: handle_types,
        location,
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: 0,
        usage: 0,
        reserved: [0; 54],
    }
}

fn device_pool_props(device: c_int) -> CUmemPoolProps {
    props(device_location(device), CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE)
}

fn host_location() -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 }
}

fn create_pool(props: &CUmemPoolProps) -> CUmemoryPool {
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `props` a valid properties struct.
    unsafe { cu_call!(driver(), cuMemPoolCreate(&mut pool, props)) }.unwrap();
    pool
}

fn destroy_pool(pool: CUmemoryPool) -> CUresult {
    // SAFETY: no pointers are dereferenced; unknown handles are rejected.
    unsafe { code!(driver(), cuMemPoolDestroy(pool)) }
}

fn alloc_from_pool(size: usize, pool: CUmemoryPool, s: CUstream) -> Result<CUdeviceptr, CUresult> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocFromPoolAsync(&mut ptr, size, pool, s)) } {
        OK => Ok(ptr),
        error => Err(error),
    }
}

fn free_async(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    // SAFETY: the simulator checks the pointer.
    unsafe { code!(driver(), cuMemFreeAsync(ptr, s)) }
}

fn used(pool: CUmemoryPool) -> u64 {
    let mut value = u64::MAX;
    // SAFETY: the attribute is a cuuint64_t.
    unsafe {
        cu_call!(
            driver(),
            cuMemPoolGetAttribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                std::ptr::from_mut(&mut value).cast()
            )
        )
    }
    .unwrap();
    value
}

#[test]
fn a_zero_byte_pool_allocation_succeeds_and_is_freed_as_any_other() {
    // cuda.core allocates 0 bytes from its pools through the driver and frees the pointer with
    // cuMemFreeAsync; its tests pass on GPUs.
    in_child!(&[], || {
        use_device(0);
        let s = non_blocking_stream();
        let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let none = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        for props in [props(device_location(0), none), props(device_location(0), posix), props(host_location(), none)] {
            let pool = create_pool(&props);
            let a = alloc_from_pool(0, pool, s).unwrap();
            let b = alloc_from_pool(0, pool, s).unwrap();
            assert!(a != 0 && b != 0 && a != b, "two distinct non-null pointers: {a:#x} {b:#x}");
            assert_eq!(used(pool), 0, "zero bytes in use");
            // It addresses no bytes: a one-byte copy out of it is refused (device memory), and
            // a one-byte memset into it too.
            let out = Pinned::new(1);
            // SAFETY: `out` is valid for one byte.
            let copied = unsafe { code!(driver(), cuMemcpyDtoHAsync_v2(out.ptr.cast(), a, 1, s)) };
            // SAFETY: the simulator checks the range.
            let set = unsafe { code!(driver(), cuMemsetD8Async(a, 1, 1, s)) };
            if props.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
                assert_eq!((copied, set), (INVALID, INVALID), "{props:?}");
            }
            sync(s);
            assert_eq!(free_async(a, s), OK);
            assert_eq!(free_async(a, s), INVALID, "freed twice");
            // SAFETY: the simulator checks the pointer.
            assert_eq!(unsafe { code!(driver(), cuMemFree_v2(b)) }, OK, "cuMemFree takes it too");
            sync(s);
            assert_eq!(destroy_pool(pool), OK);
        }
        // cuMemAllocAsync, from the device's current pool, the same.
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        assert_eq!(unsafe { code!(driver(), cuMemAllocAsync(&mut ptr, 0, s)) }, OK);
        assert_ne!(ptr, 0);
        assert_eq!(free_async(ptr, s), OK);
        sync(s);
    });
}

#[test]
fn a_destroyed_pool_waits_for_its_zero_byte_allocations() {
    in_child!(&[], || {
        use_device(0);
        let pool = create_pool(&device_pool_props(0));
        let p = alloc_from_pool(0, pool, NULL_STREAM).unwrap();
        assert_eq!(destroy_pool(pool), OK);
        // The allocation outlives its pool's handle, as any other does.
        assert_eq!(free_async(p, NULL_STREAM), OK);
        sync(NULL_STREAM);
    });
}

#[test]
fn a_host_pool_takes_copies_before_access_is_granted_but_not_memsets() {
    // cuda.core's PinnedMemoryResource grants no access and its tests copy into and out of its
    // memory on GPUs; an H100 refused a memset into it (CUDA_ERROR_INVALID_VALUE).
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        use_device(0);
        let s = non_blocking_stream();
        for type_ in [CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA] {
            let pool =
                create_pool(&props(CUmemLocation { type_, id: 0 }, CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE));
            assert_eq!(access(pool, 0), CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE);
            let p = alloc_from_pool(4096, pool, s).unwrap();
            let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
            let source = Pinned::new(4096);
            source.write(&data);
            // SAFETY: both ranges are 4096 live bytes.
            assert_eq!(unsafe { code!(driver(), cuMemcpyHtoDAsync_v2(p, source.ptr.cast(), 4096, s)) }, OK);
            let device_copy = DeviceBuffer::new(4096);
            // SAFETY: both ranges are 4096 live bytes.
            assert_eq!(unsafe { code!(driver(), cuMemcpyDtoDAsync_v2(device_copy.ptr, p, 4096, s)) }, OK);
            let out = Pinned::new(4096);
            // SAFETY: both ranges are 4096 live bytes.
            assert_eq!(unsafe { code!(driver(), cuMemcpyDtoHAsync_v2(out.ptr.cast(), p, 4096, s)) }, OK);
            sync(s);
            assert_eq!(out.read(), data, "{type_:?}");
            assert_eq!(device_copy.read(), data, "{type_:?}");
            // SAFETY: the range is live; the simulator refuses it.
            assert_eq!(unsafe { code!(driver(), cuMemsetD8Async(p, 1, 4096, s)) }, INVALID, "{type_:?}");
            assert_eq!(free_async(p, s), OK);
            sync(s);
            assert_eq!(destroy_pool(pool), OK);
        }
    });
}

fn bus_id(device: c_int, len: c_int) -> Result<String, CUresult> {
    let mut text = [0 as c_char; 32];
    // SAFETY: `text` has room for 32 bytes and `len` is at most that.
    match unsafe { code!(driver(), cuDeviceGetPCIBusId(text.as_mut_ptr(), len.min(32), device)) } {
        // SAFETY: the simulator NUL-terminates what it writes.
        OK => Ok(unsafe { std::ffi::CStr::from_ptr(text.as_ptr()) }.to_string_lossy().into_owned()),
        error => Err(error),
    }
}

fn by_bus_id(text: &str) -> Result<c_int, CUresult> {
    let text = CString::new(text).unwrap();
    let mut device: c_int = -1;
    // SAFETY: both pointers are valid.
    match unsafe { code!(driver(), cuDeviceGetByPCIBusId(&mut device, text.as_ptr())) } {
        OK => Ok(device),
        error => Err(error),
    }
}

fn attribute(attribute: CUdevice_attribute, device: c_int) -> c_int {
    let mut value = -1;
    // SAFETY: `value` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuDeviceGetAttribute(&mut value, attribute, device)) }.unwrap();
    value
}

#[test]
fn pci_bus_ids_follow_the_physical_devices_and_their_attributes() {
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_VISIBLE_DEVICES", "2,0")], || {
        use_device(0);
        use CUdevice_attribute as A;
        for (ordinal, expected) in [(0, "0000:03:00.0"), (1, "0000:01:00.0")] {
            assert_eq!(bus_id(ordinal, 13).as_deref(), Ok(expected));
            let from_attributes = format!(
                "{:04x}:{:02x}:{:02x}.0",
                attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, ordinal),
                attribute(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, ordinal),
                attribute(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, ordinal)
            );
            assert_eq!(from_attributes, expected);
            assert_eq!(by_bus_id(expected), Ok(ordinal));
        }
        // Every form cuda.h lists, either case.
        for form in ["0000:03:00.0", "0000:03:00", "03:00.0", "0:3:0.0", "00000000:03:00.0"] {
            assert_eq!(by_bus_id(form), Ok(0), "{form:?}");
        }
        assert_eq!(bus_id(0, 12), Err(INVALID), "room for 12 characters, NUL included");
        assert_eq!(bus_id(0, 0), Err(INVALID));
        assert_eq!(bus_id(0, -1), Err(INVALID));
        assert_eq!(bus_id(2, 13), Err(CUresult::CUDA_ERROR_INVALID_DEVICE), "only two devices visible");
        // SAFETY: a null buffer is refused.
        let null = unsafe { code!(driver(), cuDeviceGetPCIBusId(std::ptr::null_mut(), 13, 0)) };
        assert_eq!(null, INVALID);
        assert_eq!(by_bus_id("0000:02:00.0"), Err(CUresult::CUDA_ERROR_INVALID_DEVICE), "physical 1 is hidden");
        assert_eq!(by_bus_id("0000:03:01.0"), Err(CUresult::CUDA_ERROR_INVALID_DEVICE), "no such slot");
        for malformed in ["", "03", "0000:03", "0000:0g:00.0", "0000:03:00.", ":03:00.0", "0000:03:00.0:1", " 03:00.0"]
        {
            assert_eq!(by_bus_id(malformed), Err(INVALID), "{malformed:?}");
        }
        let mut device = -1;
        // SAFETY: a null string is refused.
        let null = unsafe { code!(driver(), cuDeviceGetByPCIBusId(&mut device, std::ptr::null())) };
        assert_eq!(null, INVALID);
    });
}

/// Makes a pool on device 0, grants device 1 read-write access, destroys it without revoking,
/// and makes the next pool on device 0: (whether its handle is the old one, device 1's access).
fn next_pool_after_destroying_one_with_access() -> (bool, CUmemAccess_flags) {
    use_device(0);
    let first = create_pool(&device_pool_props(0));
    assert_eq!(set_access(first, 1, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE), OK);
    assert_eq!(destroy_pool(first), OK);
    let next = create_pool(&device_pool_props(0));
    let result = (next == first, access(next, 1));
    assert_eq!(set_access(next, 1, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE), OK);
    assert_eq!(destroy_pool(next), OK);
    result
}

#[test]
fn pool_handles_are_unique_by_default_so_no_access_is_inherited() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        assert_eq!(
            next_pool_after_destroying_one_with_access(),
            (false, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE)
        );
    });
}

#[test]
fn a_recycled_pool_handle_brings_its_access_with_it() {
    // nvbug 5698116: "the driver may hand a recycled pool handle to a new pool with the previous
    // pool's peer-access state".
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_POOL_HANDLES", "recycle")], || {
        assert_eq!(
            next_pool_after_destroying_one_with_access(),
            (true, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        );
        // A destroyed pool whose allocation is still live is not gone: its handle stays its own.
        let first = create_pool(&device_pool_props(0));
        let p = alloc_from_pool(64, first, NULL_STREAM).unwrap();
        assert_eq!(destroy_pool(first), OK);
        let second = create_pool(&device_pool_props(0));
        assert_ne!(second, first);
        assert_eq!(free_async(p, NULL_STREAM), OK);
        sync(NULL_STREAM);
        // Now it is gone, and the next pool on the device (not on another) takes its value.
        use_device(1);
        let elsewhere = create_pool(&device_pool_props(1));
        assert_ne!(elsewhere, first);
        use_device(0);
        let third = create_pool(&device_pool_props(0));
        assert_eq!(third, first);
        for pool in [second, elsewhere, third] {
            assert_eq!(destroy_pool(pool), OK);
        }
    });
}

fn reserve(size: usize, hint: CUdeviceptr) -> CUdeviceptr {
    let mut base: CUdeviceptr = 0;
    // SAFETY: `base` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuMemAddressReserve(&mut base, size, 0, hint, 0)) }.unwrap();
    base
}

/// For each of `tries` reservations right after a fresh one: whether the hint was honoured.
fn hints_honoured(tries: usize) -> Vec<bool> {
    use_device(0);
    let size = 2 * MIB;
    (0..tries)
        .map(|_| {
            let first = reserve(size, 0);
            let hint = first + size as CUdeviceptr;
            let second = reserve(size, hint);
            // SAFETY: both are whole reservations with nothing mapped.
            unsafe {
                cu_call!(driver(), cuMemAddressFree(second, size)).unwrap();
                cu_call!(driver(), cuMemAddressFree(first, size)).unwrap();
            }
            second == hint
        })
        .collect()
}

#[test]
fn address_hints_are_honoured_unless_the_setting_refuses_them() {
    in_child!(&[], || assert_eq!(hints_honoured(4), [true; 4]));
    in_child!(&[("CUDA_SIM_ADDRESS_HINTS", "honour")], || assert_eq!(hints_honoured(4), [true; 4]));
    in_child!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-all")], || assert_eq!(hints_honoured(4), [false; 4]));
    // Every second call with a hint is refused; a call without one does not count.
    in_child!(&[("CUDA_SIM_ADDRESS_HINTS", "refuse-every-2")], || {
        assert_eq!(hints_honoured(4), [true, false, true, false]);
    });
}

#[test]
fn cu_mem_free_returns_without_waiting_for_work_on_the_memory() {
    // cuda.h: no implicit synchronization for stream-ordered memory; "may" for other memory,
    // which the simulator reads as "does not": the caller must have waited.
    in_child!(&[], || {
        use_device(0);
        let d = driver();
        let pool = create_pool(&device_pool_props(0));
        let s = non_blocking_stream();
        let plain = DeviceBuffer::with(&[7; 64]);
        let plain_ptr = plain.ptr;
        std::mem::forget(plain);
        let pooled = alloc_from_pool(64, pool, s).unwrap();
        htod(pooled, &[7; 64]);
        for ptr in [plain_ptr, pooled] {
            let (gate, _guard) = Gate::new();
            common::hold(gate, d, s);
            // SAFETY: 64 live bytes.
            unsafe { cu_call!(d, cuMemsetD8Async(ptr, 1, 64, s)) }.unwrap();
            gate.wait_entered(1);
            let started = Instant::now();
            // SAFETY: the simulator checks the pointer.
            assert_eq!(unsafe { code!(d, cuMemFree_v2(ptr)) }, OK);
            assert!(started.elapsed() < common::WATCHDOG);
            assert_eq!(common::query(s), CUresult::CUDA_ERROR_NOT_READY, "the memset is still pending");
            gate.open();
            sync(s);
            assert_eq!(dtoh_refused(ptr), INVALID, "freed");
        }
        assert_eq!(destroy_pool(pool), OK);
    });
}

fn dtoh_refused(ptr: CUdeviceptr) -> CUresult {
    let mut byte = 0u8;
    // SAFETY: one byte; the simulator checks the device pointer.
    unsafe { code!(driver(), cuMemcpyDtoH_v2(std::ptr::from_mut(&mut byte).cast(), ptr, 1)) }
}
