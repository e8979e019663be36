//! Initialization, the driver version, error names, `cuGetProcAddress`, device enumeration and
//! attributes, and the `CUDA_SIM_*` configuration (each configuration in a child process).

mod common;

use std::ffi::{CStr, c_char, c_int, c_void};

use common::{NULL_STREAM, code, driver, in_child, init};
use cuda_mem_sys::types::{
    CUdevice_attribute, CUdriverProcAddressQueryResult, CUmemAllocationHandleType, CUresult, CUuuid,
};
use cuda_mem_sys::{Driver, cu_call};

fn device_count(d: &Driver) -> c_int {
    let mut count = -1;
    // SAFETY: `count` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGetCount(&mut count)) }.unwrap();
    count
}

#[test]
fn driver_version_is_13000_before_and_after_init() {
    in_child!(&[], || {
        let d = driver();
        let mut version = 0;
        // SAFETY: `version` is a valid out-pointer; cuDriverGetVersion needs no cuInit.
        unsafe { cu_call!(d, cuDriverGetVersion(&mut version)) }.unwrap();
        assert_eq!(version, 13000);
        // SAFETY: a null out-pointer is rejected, not written.
        let result = unsafe { code!(d, cuDriverGetVersion(std::ptr::null_mut())) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
        init();
        version = 0;
        // SAFETY: as above.
        unsafe { cu_call!(d, cuDriverGetVersion(&mut version)) }.unwrap();
        assert_eq!(version, 13000);
    });
}

#[test]
fn calls_before_init_return_not_initialized() {
    in_child!(&[], || {
        let d = driver();
        let not_init = CUresult::CUDA_ERROR_NOT_INITIALIZED;
        let (mut i, mut u, mut ptr, mut size): (c_int, u32, u64, usize) = (0, 0, 0, 0);
        let mut ctx = std::ptr::null_mut();
        let mut stream = std::ptr::null_mut();
        let mut event = std::ptr::null_mut();
        let mut host: *mut c_void = std::ptr::null_mut();
        let mut name = [0 as c_char; 32];
        let mut uuid = CUuuid::default();
        let byte = 0u8;
        // SAFETY: every pointer is a valid out-pointer or source for the call it is passed to.
        let codes = unsafe {
            [
                ("cuDeviceGetCount", code!(d, cuDeviceGetCount(&mut i))),
                ("cuDeviceGet", code!(d, cuDeviceGet(&mut i, 0))),
                ("cuDeviceGetName", code!(d, cuDeviceGetName(name.as_mut_ptr(), 32, 0))),
                ("cuDeviceGetUuid_v2", code!(d, cuDeviceGetUuid_v2(&mut uuid, 0))),
                ("cuDeviceTotalMem_v2", code!(d, cuDeviceTotalMem_v2(&mut size, 0))),
                (
                    "cuDeviceGetAttribute",
                    code!(d, cuDeviceGetAttribute(&mut i, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0)),
                ),
                ("cuDeviceCanAccessPeer", code!(d, cuDeviceCanAccessPeer(&mut i, 0, 0))),
                ("cuDevicePrimaryCtxRetain", code!(d, cuDevicePrimaryCtxRetain(&mut ctx, 0))),
                ("cuDevicePrimaryCtxRelease_v2", code!(d, cuDevicePrimaryCtxRelease_v2(0))),
                ("cuDevicePrimaryCtxReset_v2", code!(d, cuDevicePrimaryCtxReset_v2(0))),
                ("cuDevicePrimaryCtxGetState", code!(d, cuDevicePrimaryCtxGetState(0, &mut u, &mut i))),
                ("cuDevicePrimaryCtxSetFlags_v2", code!(d, cuDevicePrimaryCtxSetFlags_v2(0, 0))),
                ("cuCtxSetCurrent", code!(d, cuCtxSetCurrent(std::ptr::null_mut()))),
                ("cuCtxGetCurrent", code!(d, cuCtxGetCurrent(&mut ctx))),
                ("cuCtxPopCurrent_v2", code!(d, cuCtxPopCurrent_v2(&mut ctx))),
                ("cuCtxGetDevice", code!(d, cuCtxGetDevice(&mut i))),
                ("cuCtxSynchronize", code!(d, cuCtxSynchronize())),
                ("cuStreamCreate", code!(d, cuStreamCreate(&mut stream, 0))),
                ("cuStreamQuery", code!(d, cuStreamQuery(NULL_STREAM))),
                ("cuEventCreate", code!(d, cuEventCreate(&mut event, 0))),
                ("cuMemAlloc_v2", code!(d, cuMemAlloc_v2(&mut ptr, 16))),
                ("cuMemAllocHost_v2", code!(d, cuMemAllocHost_v2(&mut host, 16))),
                ("cuMemFree_v2", code!(d, cuMemFree_v2(0x1000))),
                ("cuMemGetInfo_v2", code!(d, cuMemGetInfo_v2(&mut size, &mut size))),
                ("cuMemcpyHtoD_v2", code!(d, cuMemcpyHtoD_v2(0x1000, std::ptr::from_ref(&byte).cast(), 1))),
                ("cuMemsetD8_v2", code!(d, cuMemsetD8_v2(0x1000, 0, 1))),
                (
                    "cuPointerGetAttribute",
                    code!(
                        d,
                        cuPointerGetAttribute(
                            std::ptr::from_mut(&mut u).cast(),
                            cuda_mem_sys::types::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                            0x1000
                        )
                    ),
                ),
            ]
        };
        for (function, code) in codes {
            assert_eq!(code, not_init, "{function} before cuInit");
        }
        // Error names and entry points need no cuInit.
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `text` is a valid out-pointer.
        unsafe { cu_call!(d, cuGetErrorName(CUresult::CUDA_ERROR_NOT_INITIALIZED, &mut text)) }.unwrap();
        // SAFETY: on success the driver wrote a static NUL-terminated string.
        let result = unsafe { CStr::from_ptr(text) }.to_str().unwrap();
        assert_eq!(result, "CUDA_ERROR_NOT_INITIALIZED");
        let mut pfn: *mut c_void = std::ptr::null_mut();
        // SAFETY: the symbol is NUL-terminated; `pfn` is a valid out-pointer; status is optional.
        unsafe { cu_call!(d, cuGetProcAddress_v2(c"cuInit".as_ptr(), &mut pfn, 13000, 0, std::ptr::null_mut())) }
            .unwrap();
        assert!(!pfn.is_null());

        // A failed cuInit leaves the driver uninitialized; a good one initializes it, and
        // cuInit may be called again.
        // SAFETY: no pointers.
        let result = unsafe { code!(d, cuInit(1)) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
        // SAFETY: `i` is a valid out-pointer.
        assert_eq!(unsafe { code!(d, cuDeviceGetCount(&mut i)) }, not_init);
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuInit(0)) }.unwrap();
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuInit(0)) }.unwrap();
        assert_eq!(device_count(d), 1);
    });
}

#[test]
fn init_rejects_nonzero_flags() {
    let d = init();
    for flags in [1, 2, 0x8000_0000] {
        // SAFETY: no pointers.
        let result = unsafe { code!(d, cuInit(flags)) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE, "flags {flags:#x}");
    }
}

/// Checks that `cuInit` fails with `expected` and leaves the driver uninitialised.
fn init_fails_with(expected: CUresult) -> &'static Driver {
    let d = driver();
    // SAFETY: no pointers.
    let result = unsafe { code!(d, cuInit(0)) };
    assert_eq!(result, expected);
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    let result = unsafe { code!(d, cuDeviceGetCount(&mut count)) };
    assert_eq!(result, CUresult::CUDA_ERROR_NOT_INITIALIZED);
    d
}

#[test]
fn a_bad_configuration_makes_init_fail() {
    let body = || {
        init_fails_with(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    in_child!(&[("CUDA_SIM_DEVICES", "0")], body);
    in_child!(&[("CUDA_SIM_DEVICES", "65")], body);
    in_child!(&[("CUDA_SIM_DEVICES", "two")], body);
    in_child!(&[("CUDA_SIM_MEMORY", "lots")], body);
    in_child!(&[("CUDA_SIM_MEMORY", "0")], body);
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_PEER_ACCESS", "0-2")], body);
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_PEER_ACCESS", "1-1")], body);
}

fn error_text(d: &Driver, code: CUresult, name: bool) -> (CUresult, *const c_char) {
    let mut text: *const c_char = c"sentinel".as_ptr();
    // SAFETY: `text` is a valid out-pointer.
    let result = unsafe {
        if name { code!(d, cuGetErrorName(code, &mut text)) } else { code!(d, cuGetErrorString(code, &mut text)) }
    };
    (result, text)
}

#[test]
fn error_names_and_strings() {
    let d = driver();
    for &(value, name, description) in cuda_mem_sys::error_table::ERROR_TABLE {
        let (result, text) = error_text(d, CUresult(value), true);
        assert_eq!(result, CUresult::CUDA_SUCCESS, "cuGetErrorName({value})");
        // SAFETY: on success the driver wrote a static NUL-terminated string.
        assert_eq!(unsafe { CStr::from_ptr(text) }, name);
        let (result, text) = error_text(d, CUresult(value), false);
        assert_eq!(result, CUresult::CUDA_SUCCESS, "cuGetErrorString({value})");
        // SAFETY: as above.
        let text = unsafe { CStr::from_ptr(text) };
        assert_eq!(text, description);
        assert!(!text.is_empty());
    }
    for unknown in [CUresult(12_345), CUresult(u32::MAX), CUresult(9_999)] {
        for name in [true, false] {
            let (result, text) = error_text(d, unknown, name);
            assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE, "code {}", unknown.0);
            assert!(text.is_null(), "an unknown code writes null");
        }
    }
    // SAFETY: a null out-pointer is rejected.
    let null_out = unsafe { code!(d, cuGetErrorName(CUresult::CUDA_SUCCESS, std::ptr::null_mut())) };
    assert_eq!(null_out, CUresult::CUDA_ERROR_INVALID_VALUE);
    // SAFETY: as above.
    let null_out = unsafe { code!(d, cuGetErrorString(CUresult::CUDA_SUCCESS, std::ptr::null_mut())) };
    assert_eq!(null_out, CUresult::CUDA_ERROR_INVALID_VALUE);
}

/// The simulator library, opened with `dlopen` to read symbols directly.
fn library() -> libloading::Library {
    let path = cuda_sim::testing::library_path().expect("libcuda_sim.so is built");
    // SAFETY: the simulator's initializers are sound to run at any time.
    unsafe { libloading::Library::new(path) }.expect("the simulator loads")
}

/// `dlsym` of an exported symbol, as an address.
fn symbol(library: &libloading::Library, name: &CStr) -> usize {
    // SAFETY: only the address is read.
    let address = unsafe { library.get::<*const c_void>(name.to_bytes_with_nul()) }.expect("exported");
    *address as usize
}

/// `cuGetProcAddress_v2` through `d`: (code, address, status).
fn proc_address(
    d: &Driver,
    name: &CStr,
    version: c_int,
    flags: u64,
) -> (CUresult, usize, CUdriverProcAddressQueryResult) {
    let mut pfn: *mut c_void = c"junk".as_ptr().cast_mut().cast();
    let mut status = CUdriverProcAddressQueryResult(99);
    // SAFETY: the name is NUL-terminated and both out-pointers are valid.
    let result = unsafe { code!(d, cuGetProcAddress_v2(name.as_ptr(), &mut pfn, version, flags, &mut status)) };
    (result, pfn as usize, status)
}

#[test]
fn get_proc_address_selects_the_variant_by_version_and_stream_flag() {
    use CUdriverProcAddressQueryResult as Q;
    let d = driver();
    let lib = library();
    let success = (CUresult::CUDA_SUCCESS, Q::CU_GET_PROC_ADDRESS_SUCCESS);
    let found = |name: &CStr, version, flags| {
        let (result, address, status) = proc_address(d, name, version, flags);
        assert_eq!((result, status), success, "{name:?} at {version} with flags {flags}");
        address
    };

    // Version selection: the highest variant not above the version asked for.
    assert_eq!(found(c"cuCtxSynchronize", 13000, 0), symbol(&lib, c"cuCtxSynchronize_v2"));
    assert_eq!(found(c"cuCtxSynchronize", 12090, 0), symbol(&lib, c"cuCtxSynchronize"));
    assert_eq!(found(c"cuCtxSynchronize", 2000, 0), symbol(&lib, c"cuCtxSynchronize"));
    assert_eq!(found(c"cuCtxGetDevice", 13000, 0), symbol(&lib, c"cuCtxGetDevice_v2"));
    assert_eq!(found(c"cuCtxGetDevice", 12000, 0), symbol(&lib, c"cuCtxGetDevice"));
    assert_eq!(found(c"cuMemAlloc", 13000, 0), symbol(&lib, c"cuMemAlloc_v2"));
    assert_eq!(found(c"cuMemAlloc", 3020, 0), symbol(&lib, c"cuMemAlloc_v2"));
    assert_eq!(found(c"cuEventElapsedTime", 12080, 0), symbol(&lib, c"cuEventElapsedTime_v2"));
    assert_eq!(found(c"cuGetProcAddress", 12000, 0), symbol(&lib, c"cuGetProcAddress_v2"));

    // The stream flag: 1 (legacy) and 0 (default) give the legacy variant, 2 the per-thread one.
    let legacy = symbol(&lib, c"cuMemcpyHtoD_v2");
    let per_thread = symbol(&lib, c"cuMemcpyHtoD_v2_ptds");
    assert_ne!(legacy, per_thread);
    assert_eq!(found(c"cuMemcpyHtoD", 13000, 0), legacy);
    assert_eq!(found(c"cuMemcpyHtoD", 13000, 1), legacy);
    assert_eq!(found(c"cuMemcpyHtoD", 13000, 2), per_thread);
    assert_eq!(found(c"cuStreamQuery", 13000, 2), symbol(&lib, c"cuStreamQuery_ptsz"));
    assert_eq!(found(c"cuLaunchHostFunc", 13000, 2), symbol(&lib, c"cuLaunchHostFunc_ptsz"));
    assert_eq!(found(c"cuMemsetD32Async", 13000, 2), symbol(&lib, c"cuMemsetD32Async_ptsz"));
    // Below the version the per-thread variant appeared in (7000), the legacy one is returned.
    assert_eq!(found(c"cuMemcpyHtoD", 6050, 2), legacy);
    // Functions without a per-thread variant give the same entry point for either flag.
    assert_eq!(found(c"cuMemAlloc", 13000, 2), found(c"cuMemAlloc", 13000, 1));
    // And the loader in cuda-mem-sys resolves to the same addresses.
    assert_eq!(d.cuMemcpyHtoD_v2().unwrap() as usize, legacy);
    assert_eq!(common::per_thread_driver().cuMemcpyHtoD_v2().unwrap() as usize, per_thread);

    // Older ABIs the simulator does not implement, or none: "version not sufficient", null entry
    // point.
    // (`cuEventElapsedTime` at 12000 is CUDA 2.0's variant, and `cuMemAdvise` at 12000 CUDA
    // 8.0's, which it implements: see `driver_version.rs` and `managed_ops.rs`; before 8.0 there
    // was no `cuMemAdvise`.)
    for (name, version) in [(c"cuMemAlloc", 3010), (c"cuMemAdvise", 7050), (c"cuDevicePrimaryCtxRelease", 10000)] {
        let (result, address, status) = proc_address(d, name, version, 0);
        assert_eq!(result, CUresult::CUDA_ERROR_NOT_FOUND, "{name:?} at {version}");
        assert_eq!(status, Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "{name:?} at {version}");
        assert_eq!(address, 0, "{name:?} at {version}");
    }

    // Unknown symbols, and versioned names (which are not base names).
    for name in [c"cuNoSuchFunction", c"cuMemAlloc_v2", c"", c"cuGraphCreate"] {
        let (result, address, status) = proc_address(d, name, 13000, 0);
        assert_eq!(result, CUresult::CUDA_ERROR_NOT_FOUND, "{name:?}");
        assert_eq!(status, Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "{name:?}");
        assert_eq!(address, 0, "{name:?}");
    }
}

#[test]
fn get_proc_address_rejects_bad_arguments() {
    let d = driver();
    // Unknown flag bits, and both stream flags at once.
    for flags in [3, 4, 8, 1 << 40] {
        let (result, _, _) = proc_address(d, c"cuMemAlloc", 13000, flags);
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE, "flags {flags:#x}");
    }
    for version in [0, -1] {
        let (result, _, _) = proc_address(d, c"cuMemAlloc", version, 0);
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE, "version {version}");
    }
    let mut pfn: *mut c_void = std::ptr::null_mut();
    // SAFETY: null symbol and null pfn are rejected before any read or write.
    unsafe {
        let null_symbol = code!(d, cuGetProcAddress_v2(std::ptr::null(), &mut pfn, 13000, 0, std::ptr::null_mut()));
        assert_eq!(null_symbol, CUresult::CUDA_ERROR_INVALID_VALUE);
        let null_pfn =
            code!(d, cuGetProcAddress_v2(c"cuInit".as_ptr(), std::ptr::null_mut(), 13000, 0, std::ptr::null_mut()));
        assert_eq!(null_pfn, CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn the_old_get_proc_address_answers_without_a_status() {
    type GetProcAddress = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
    let lib = library();
    // SAFETY: `cuGetProcAddress` (CUDA 11.3) has this signature.
    let get = unsafe { lib.get::<GetProcAddress>(b"cuGetProcAddress\0") }.expect("exported");
    let mut pfn: *mut c_void = std::ptr::null_mut();
    // SAFETY: the name is NUL-terminated; `pfn` is a valid out-pointer.
    let result = unsafe { get(c"cuMemAlloc".as_ptr(), &mut pfn, 13000, 0) };
    assert_eq!(result, CUresult::CUDA_SUCCESS);
    assert_eq!(pfn as usize, symbol(&lib, c"cuMemAlloc_v2"));
    // SAFETY: as above.
    let result = unsafe { get(c"cuNoSuchFunction".as_ptr(), &mut pfn, 13000, 0) };
    assert_eq!(result, CUresult::CUDA_ERROR_NOT_FOUND);
    assert!(pfn.is_null());
}

#[test]
fn one_device_by_default() {
    in_child!(&[], || {
        let d = init();
        assert_eq!(device_count(d), 1);
        let mut bytes = 0;
        // SAFETY: `bytes` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceTotalMem_v2(&mut bytes, 0)) }.unwrap();
        assert_eq!(bytes, 8 << 30, "CUDA_SIM_MEMORY defaults to 8 GiB");
        let mut can = -1;
        // SAFETY: `can` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceCanAccessPeer(&mut can, 0, 0)) }.unwrap();
        assert_eq!(can, 0, "a device is not its own peer");
    });
}

#[test]
fn device_get_checks_the_ordinal() {
    let d = init();
    let count = device_count(d);
    assert!(count >= 1);
    for ordinal in 0..count {
        let mut device = -1;
        // SAFETY: `device` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGet(&mut device, ordinal)) }.unwrap();
        assert_eq!(device, ordinal);
    }
    for ordinal in [count, count + 1, -1, c_int::MIN] {
        let mut device = -7;
        // SAFETY: `device` is a valid out-pointer.
        let result = unsafe { code!(d, cuDeviceGet(&mut device, ordinal)) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    // SAFETY: null out-pointers are rejected.
    unsafe {
        assert_eq!(code!(d, cuDeviceGet(std::ptr::null_mut(), 0)), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(code!(d, cuDeviceGetCount(std::ptr::null_mut())), CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}

fn name_with(d: &Driver, len: c_int, device: c_int) -> (CUresult, [u8; 64]) {
    let mut buffer = [0x7fu8; 64];
    // SAFETY: the buffer has 64 bytes, and every `len` passed is at most 64.
    let result = unsafe { code!(d, cuDeviceGetName(buffer.as_mut_ptr().cast(), len, device)) };
    (result, buffer)
}

#[test]
fn device_name_is_nul_terminated_and_truncated_to_len() {
    let d = init();
    let (result, buffer) = name_with(d, 64, 0);
    assert_eq!(result, CUresult::CUDA_SUCCESS);
    let full = CStr::from_bytes_until_nul(&buffer).expect("NUL-terminated").to_bytes().to_vec();
    assert!(!full.is_empty() && full.len() < 63, "{full:?}");
    assert!(String::from_utf8(full.clone()).is_ok());

    for len in [1, 2, 5, full.len() as c_int, full.len() as c_int + 1] {
        let (result, buffer) = name_with(d, len, 0);
        assert_eq!(result, CUresult::CUDA_SUCCESS, "len {len}");
        let len = len as usize;
        let kept = (len - 1).min(full.len());
        assert_eq!(&buffer[..kept], &full[..kept], "len {len}");
        assert_eq!(buffer[kept], 0, "NUL after {kept} bytes for len {len}");
        assert!(buffer[kept + 1..].iter().all(|&b| b == 0x7f), "nothing written past len {len}");
    }
    for len in [0, -1] {
        let (result, buffer) = name_with(d, len, 0);
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE, "len {len}");
        assert!(buffer.iter().all(|&b| b == 0x7f), "nothing written for len {len}");
    }
    let (result, _) = name_with(d, 64, device_count(d));
    assert_eq!(result, CUresult::CUDA_ERROR_INVALID_DEVICE);
    // SAFETY: a null name is rejected.
    let null_name = unsafe { code!(d, cuDeviceGetName(std::ptr::null_mut(), 64, 0)) };
    assert_eq!(null_name, CUresult::CUDA_ERROR_INVALID_VALUE);
}

fn uuid(d: &Driver, device: c_int) -> [u8; 16] {
    let mut uuid = CUuuid::default();
    // SAFETY: `uuid` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGetUuid_v2(&mut uuid, device)) }.unwrap();
    uuid.bytes.map(|b| b as u8)
}

#[test]
fn three_devices_have_distinct_stable_names_and_uuids() {
    in_child!(&[("CUDA_SIM_DEVICES", "3")], || {
        let d = init();
        assert_eq!(device_count(d), 3);
        let uuids: Vec<[u8; 16]> = (0..3).map(|i| uuid(d, i)).collect();
        for (i, u) in uuids.iter().enumerate() {
            assert_eq!(*u, uuid(d, i as c_int), "stable across calls");
            assert_ne!(*u, [0; 16]);
            for other in &uuids[i + 1..] {
                assert_ne!(u, other, "distinct per device");
            }
        }
        let names: Vec<[u8; 64]> = (0..3).map(|i| name_with(d, 64, i).1).collect();
        assert_ne!(names[0], names[1]);
        assert_ne!(names[1], names[2]);
        let mut out = CUuuid::default();
        // SAFETY: `out` is a valid out-pointer; null is rejected.
        unsafe {
            assert_eq!(code!(d, cuDeviceGetUuid_v2(&mut out, 3)), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(code!(d, cuDeviceGetUuid_v2(&mut out, -1)), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(code!(d, cuDeviceGetUuid_v2(std::ptr::null_mut(), 0)), CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // Every device reports the configured (default) memory.
        for device in 0..3 {
            let mut bytes = 0;
            // SAFETY: `bytes` is a valid out-pointer.
            unsafe { cu_call!(d, cuDeviceTotalMem_v2(&mut bytes, device)) }.unwrap();
            assert_eq!(bytes, 8 << 30);
        }
    });
}

fn attribute(d: &Driver, attribute: CUdevice_attribute, device: c_int) -> Result<c_int, CUresult> {
    let mut value = -12_345;
    // SAFETY: `value` is a valid out-pointer.
    match unsafe { code!(d, cuDeviceGetAttribute(&mut value, attribute, device)) } {
        CUresult::CUDA_SUCCESS => Ok(value),
        error => Err(error),
    }
}

#[test]
fn device_attributes() {
    use CUdevice_attribute as A;
    let d = init();
    let expected = [
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as c_int,
        ),
        (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
        (A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1),
        // Attributes the simulator does not model read as 0, "capability absent".
        (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_INTEGRATED, 0),
    ];
    for (attr, value) in expected {
        assert_eq!(attribute(d, attr, 0), Ok(value), "attribute {}", attr.0);
    }
    // Every attribute cuda.h defines has a value.
    for raw in 1..A::CU_DEVICE_ATTRIBUTE_MAX.0 {
        assert!(attribute(d, A(raw), 0).is_ok(), "attribute {raw}");
    }
    for raw in [0, A::CU_DEVICE_ATTRIBUTE_MAX.0, 100_000, u32::MAX] {
        assert_eq!(attribute(d, A(raw), 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "attribute {raw}");
    }
    let bad_device = device_count(d);
    assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, bad_device), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
    assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, -1), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
    // SAFETY: a null out-pointer is rejected.
    let null_out = unsafe { code!(d, cuDeviceGetAttribute(std::ptr::null_mut(), A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0)) };
    assert_eq!(null_out, CUresult::CUDA_ERROR_INVALID_VALUE);
}

/// The peer matrix `cuDeviceCanAccessPeer` reports for `n` devices.
fn peer_matrix(d: &Driver, n: c_int) -> Vec<Vec<c_int>> {
    (0..n)
        .map(|a| {
            (0..n)
                .map(|b| {
                    let mut can = -1;
                    // SAFETY: `can` is a valid out-pointer.
                    unsafe { cu_call!(d, cuDeviceCanAccessPeer(&mut can, a, b)) }.unwrap();
                    can
                })
                .collect()
        })
        .collect()
}

#[test]
fn peer_access_all_by_default_with_two_devices() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let d = init();
        assert_eq!(device_count(d), 2);
        assert_eq!(peer_matrix(d, 2), [[0, 1], [1, 0]]);
        // PCI bus ids differ per device.
        use CUdevice_attribute as A;
        assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), Ok(2));
        let mut can = -1;
        // SAFETY: `can` is a valid out-pointer.
        unsafe {
            assert_eq!(code!(d, cuDeviceCanAccessPeer(&mut can, 0, 2)), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(code!(d, cuDeviceCanAccessPeer(&mut can, -1, 0)), CUresult::CUDA_ERROR_INVALID_DEVICE);
            assert_eq!(code!(d, cuDeviceCanAccessPeer(std::ptr::null_mut(), 0, 1)), CUresult::CUDA_ERROR_INVALID_VALUE);
        }
    });
}

#[test]
fn peer_access_all_with_three_devices() {
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_SIM_PEER_ACCESS", "all")], || {
        let d = init();
        assert_eq!(peer_matrix(d, 3), [[0, 1, 1], [1, 0, 1], [1, 1, 0]]);
    });
}

#[test]
fn peer_access_none() {
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_SIM_PEER_ACCESS", "none")], || {
        let d = init();
        assert_eq!(peer_matrix(d, 3), [[0, 0, 0], [0, 0, 0], [0, 0, 0]]);
    });
}

#[test]
fn peer_access_listed_pairs_are_symmetric() {
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_SIM_PEER_ACCESS", "0-1")], || {
        let d = init();
        assert_eq!(peer_matrix(d, 3), [[0, 1, 0], [1, 0, 0], [0, 0, 0]]);
    });
    in_child!(&[("CUDA_SIM_DEVICES", "4"), ("CUDA_SIM_PEER_ACCESS", "0-1, 3-2")], || {
        let d = init();
        assert_eq!(peer_matrix(d, 4), [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]);
    });
}

#[test]
fn configured_memory_is_the_total_memory() {
    let body = |expected: usize| {
        move || {
            let d = init();
            for device in 0..device_count(d) {
                let mut bytes = 0;
                // SAFETY: `bytes` is a valid out-pointer.
                unsafe { cu_call!(d, cuDeviceTotalMem_v2(&mut bytes, device)) }.unwrap();
                assert_eq!(bytes, expected);
            }
            let mut bytes = 0;
            // SAFETY: `bytes` is a valid out-pointer; null is rejected.
            unsafe {
                assert_eq!(code!(d, cuDeviceTotalMem_v2(&mut bytes, 7)), CUresult::CUDA_ERROR_INVALID_DEVICE);
                assert_eq!(code!(d, cuDeviceTotalMem_v2(std::ptr::null_mut(), 0)), CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            common::use_device(0);
            let (mut free, mut total) = (0, 0);
            // SAFETY: both are valid out-pointers.
            unsafe { cu_call!(d, cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
            assert_eq!(total, expected);
            assert_eq!(free, expected, "nothing allocated yet");
        }
    };
    in_child!(&[("CUDA_SIM_MEMORY", "64M")], body(64 << 20));
    in_child!(&[("CUDA_SIM_MEMORY", "1G"), ("CUDA_SIM_DEVICES", "2")], body(1 << 30));
    in_child!(&[("CUDA_SIM_MEMORY", "3k")], body(3 << 10));
    in_child!(&[("CUDA_SIM_MEMORY", "1048576")], body(1 << 20));
}

fn name(d: &Driver, device: c_int) -> String {
    let (result, buffer) = name_with(d, 64, device);
    assert_eq!(result, CUresult::CUDA_SUCCESS);
    CStr::from_bytes_until_nul(&buffer).unwrap().to_str().unwrap().to_owned()
}

#[test]
fn visible_devices_renumber_and_identity_follows_the_physical_device() {
    use CUdevice_attribute as A;
    // The machine's devices, as a process that sees them all in order reports them.
    in_child!(&[("CUDA_SIM_DEVICES", "3")], || {
        let d = init();
        assert_eq!(name(d, 2), "cuda-sim Simulated GPU 2");
        assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 2), Ok(3));
    });
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_VISIBLE_DEVICES", "2,0")], || {
        let d = init();
        assert_eq!(device_count(d), 2);
        assert_eq!([name(d, 0), name(d, 1)], ["cuda-sim Simulated GPU 2", "cuda-sim Simulated GPU 0"]);
        assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0), Ok(3));
        assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), Ok(1));
        assert_ne!(uuid(d, 0), uuid(d, 1));
        assert_eq!(attribute(d, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 2), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        // Each ordinal has its own primary context, pools and memory.
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        unsafe { cu_call!(d, cuDevicePrimaryCtxRetain(&mut ctx, 1)) }.unwrap();
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuDevicePrimaryCtxRelease_v2(1)) }.unwrap();
    });
    // An invalid entry hides itself and what follows it (here an index past the last device).
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_VISIBLE_DEVICES", "1,3,0")], || {
        let d = init();
        assert_eq!(device_count(d), 1);
        assert_eq!(name(d, 0), "cuda-sim Simulated GPU 1");
    });
}

#[test]
fn peer_access_links_physical_devices() {
    // Physical devices 0 and 2 are linked; this process sees them as its devices 2 and 0.
    in_child!(&[("CUDA_SIM_DEVICES", "3"), ("CUDA_SIM_PEER_ACCESS", "0-2"), ("CUDA_VISIBLE_DEVICES", "2,1,0")], || {
        let d = init();
        assert_eq!(peer_matrix(d, 3), [[0, 0, 1], [0, 0, 0], [1, 0, 0]]);
    });
    in_child!(&[("CUDA_SIM_DEVICES", "4"), ("CUDA_SIM_PEER_ACCESS", "1-3"), ("CUDA_VISIBLE_DEVICES", "3,1")], || {
        let d = init();
        assert_eq!(peer_matrix(d, 2), [[0, 1], [1, 0]]);
    });
}

#[test]
fn init_fails_with_no_device_when_none_is_visible() {
    let body = || {
        let d = init_fails_with(CUresult::CUDA_ERROR_NO_DEVICE);
        let mut version = 0;
        // SAFETY: `version` is a valid out-pointer.
        unsafe { cu_call!(d, cuDriverGetVersion(&mut version)) }.unwrap();
    };
    in_child!(&[("CUDA_VISIBLE_DEVICES", "")], body);
    in_child!(&[("CUDA_VISIBLE_DEVICES", "-1")], body);
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", "2,0")], body);
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", "GPU-not-a-uuid")], body);
}
