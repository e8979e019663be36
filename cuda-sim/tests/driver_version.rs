//! `CUDA_SIM_DRIVER_VERSION`: the simulator pretends to be an older driver, in what
//! `cuDriverGetVersion` reports and in what `cuGetProcAddress_v2` offers.

mod common;

use std::ffi::{CStr, c_int, c_void};

use common::{Driver, code, driver, in_child};
use cuda_mem_sys::types::{CUdriverProcAddressQueryResult as Q, CUresult};

const ENV: &str = "CUDA_SIM_DRIVER_VERSION";

/// `cuGetProcAddress_v2(name, version, legacy stream)`: (code, address, status).
fn proc_address(d: &Driver, name: &CStr, version: c_int) -> (CUresult, usize, Q) {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = Q(99);
    // SAFETY: the name is NUL-terminated and both out-pointers are valid.
    let result = unsafe { code!(d, cuGetProcAddress_v2(name.as_ptr(), &mut pfn, version, 0, &mut status)) };
    (result, pfn as usize, status)
}

/// The address `dlsym` gives for an exported symbol.
fn exported(d: &Driver, name: &'static CStr) -> usize {
    d.library_symbol(name).expect("exported") as usize
}

fn reported(d: &Driver) -> c_int {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    assert_eq!(unsafe { code!(d, cuDriverGetVersion(&mut version)) }, CUresult::CUDA_SUCCESS);
    version
}

const NOT_FOUND: (CUresult, usize, Q) = (CUresult::CUDA_ERROR_NOT_FOUND, 0, Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

#[test]
fn by_default_it_is_the_header_version_with_every_variant() {
    in_child!(&[], || {
        let d = driver();
        assert_eq!(reported(d), 13000);
        let v2 = exported(d, c"cuEventElapsedTime_v2");
        let v1 = exported(d, c"cuEventElapsedTime");
        assert_ne!(v1, v2);
        assert_eq!(
            proc_address(d, c"cuEventElapsedTime", 13000),
            (CUresult::CUDA_SUCCESS, v2, Q::CU_GET_PROC_ADDRESS_SUCCESS)
        );
        // The old variant is offered to a caller that asks for it.
        assert_eq!(
            proc_address(d, c"cuEventElapsedTime", 12000),
            (CUresult::CUDA_SUCCESS, v1, Q::CU_GET_PROC_ADDRESS_SUCCESS)
        );
        let (result, _, status) = proc_address(d, c"cuMemGetMemPool", 13000);
        assert_eq!((result, status), (CUresult::CUDA_SUCCESS, Q::CU_GET_PROC_ADDRESS_SUCCESS));
    });
}

#[test]
fn a_cuda_12_8_driver_has_no_cuda_13_functions_and_gives_its_own_variants() {
    in_child!(&[(ENV, "12080")], || {
        let d = driver();
        assert_eq!(reported(d), 12080);
        // Functions CUDA 13.0 added are absent, whatever version is asked for.
        assert_eq!(proc_address(d, c"cuMemGetMemPool", 13000), NOT_FOUND);
        assert_eq!(proc_address(d, c"cuMemPrefetchBatchAsync", 13000), NOT_FOUND);
        // cuMemcpyBatchAsync's 13.0 variant (the only one the simulator has) is absent too.
        assert_eq!(proc_address(d, c"cuMemcpyBatchAsync", 13000), NOT_FOUND);
        // 12.8's own variant is there, asked for at 12.8 or later.
        let v2 = exported(d, c"cuEventElapsedTime_v2");
        assert_eq!(
            proc_address(d, c"cuEventElapsedTime", 13000),
            (CUresult::CUDA_SUCCESS, v2, Q::CU_GET_PROC_ADDRESS_SUCCESS)
        );
        let (result, _, _) = proc_address(d, c"cuMemPoolCreate", 12080);
        assert_eq!(result, CUresult::CUDA_SUCCESS);
    });
}

#[test]
fn a_cuda_12_0_driver_gives_the_older_variant_of_a_newer_function() {
    in_child!(&[(ENV, "12000")], || {
        let d = driver();
        assert_eq!(reported(d), 12000);
        // Asked for 12.8's variant, a 12.0 driver gives the one it has: CUDA 2.0's.
        let v1 = exported(d, c"cuEventElapsedTime");
        assert_eq!(
            proc_address(d, c"cuEventElapsedTime", 12080),
            (CUresult::CUDA_SUCCESS, v1, Q::CU_GET_PROC_ADDRESS_SUCCESS)
        );
        // 12.2's cuMemAdvise_v2 is absent: asked for it, the driver gives CUDA 8.0's.
        assert_eq!(
            proc_address(d, c"cuMemAdvise", 12020),
            (CUresult::CUDA_SUCCESS, exported(d, c"cuMemAdvise"), Q::CU_GET_PROC_ADDRESS_SUCCESS)
        );
        // A variant older than any the driver has: found, but the version is not sufficient.
        assert_eq!(
            proc_address(d, c"cuMemPoolCreate", 11000),
            (CUresult::CUDA_ERROR_NOT_FOUND, 0, Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
    });
}

#[test]
fn before_cuda_12_0_get_proc_address_v2_finds_nothing_and_the_loader_uses_dlsym() {
    in_child!(&[(ENV, "11020")], || {
        let d = driver();
        assert_eq!(reported(d), 11020);
        // The loader does not hand out an entry point newer than the driver, this one included.
        assert!(matches!(d.cuGetProcAddress_v2(), Err(cuda_mem_sys::LoadError::VersionNotSufficient { .. })));
        // Called anyway (the simulator exports it), it finds nothing.
        let address = d.library_symbol(c"cuGetProcAddress_v2").expect("exported");
        // SAFETY: the simulator's `cuGetProcAddress_v2` has the signature of CUDA 12.0's.
        let get = unsafe {
            std::mem::transmute::<
                *const c_void,
                unsafe extern "C" fn(*const std::ffi::c_char, *mut *mut c_void, c_int, u64, *mut Q) -> CUresult,
            >(address)
        };
        for (name, version) in [(c"cuMemPoolCreate", 11020), (c"cuInit", 2000)] {
            let mut pfn: *mut c_void = std::ptr::null_mut();
            let mut status = Q(99);
            // SAFETY: the name is NUL-terminated and both out-pointers are valid.
            let result = unsafe { get(name.as_ptr(), &mut pfn, version, 0, &mut status) };
            assert_eq!((result, pfn as usize, status), NOT_FOUND, "{name:?}");
        }
        // The loader falls back to the exported name, as with a real 11.x driver.
        assert_eq!(d.cuMemPoolCreate().expect("found by dlsym") as usize, exported(d, c"cuMemPoolCreate"));
        assert_eq!(d.version().expect("the version"), 11020);
    });
}

#[test]
fn an_unreadable_version_makes_init_fail() {
    in_child!(&[(ENV, "12.8")], || {
        let d = driver();
        // SAFETY: cuInit takes no pointers.
        assert_eq!(unsafe { code!(d, cuInit(0)) }, CUresult::CUDA_ERROR_INVALID_VALUE);
        let mut version = 0;
        // SAFETY: `version` is a valid out-pointer.
        assert_eq!(unsafe { code!(d, cuDriverGetVersion(&mut version)) }, CUresult::CUDA_ERROR_INVALID_VALUE);
    });
}

#[test]
fn the_loader_refuses_a_variant_newer_than_the_driver_instead_of_taking_an_older_one() {
    in_child!(&[(ENV, "12000")], || {
        let d = driver();
        // Asked for 12.8's cuEventElapsedTime, a 12.0 driver would hand out 2.0's: the loader
        // says the driver is too old instead.
        match d.cuEventElapsedTime_v2() {
            Err(cuda_mem_sys::LoadError::VersionNotSufficient { required: 12080, driver: 12000, .. }) => {}
            other => panic!("expected VersionNotSufficient, got {:?}", other.map(|f| f as usize)),
        }
        match d.cuMemAdvise_v2() {
            Err(cuda_mem_sys::LoadError::VersionNotSufficient { required: 12020, driver: 12000, .. }) => {}
            other => panic!("expected VersionNotSufficient, got {:?}", other.map(|f| f as usize)),
        }
        // Found by dlsym too (the simulator exports it), and refused all the same.
        match d.cuMemGetMemPool() {
            Err(cuda_mem_sys::LoadError::VersionNotSufficient { required: 13000, driver: 12000, .. }) => {}
            other => panic!("expected VersionNotSufficient, got {:?}", other.map(|f| f as usize)),
        }
        // The old variant, declared by hand, is there.
        assert_eq!(d.cuEventElapsedTime_v1().expect("2.0's variant") as usize, exported(d, c"cuEventElapsedTime"));
    });
}

/// `cuGetProcAddress_v2(name, version, per-thread default stream)`: (code, address, status).
fn per_thread_proc_address(d: &Driver, name: &CStr, version: c_int) -> (CUresult, usize, Q) {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = Q(99);
    let per_thread = cuda_mem_sys::types::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.0;
    // SAFETY: the name is NUL-terminated and both out-pointers are valid.
    let result =
        unsafe { code!(d, cuGetProcAddress_v2(name.as_ptr(), &mut pfn, version, per_thread.into(), &mut status)) };
    (result, pfn as usize, status)
}

/// Context creation, context events, limits, cache preferences, `cuMemHostAlloc`, peer copies,
/// stream attachment and the location-based pools: each base name, the symbol `cuda.h` maps it
/// to, and the CUDA version of that variant.
const ADDED: [(&CStr, &CStr, c_int); 15] = [
    (c"cuCtxCreate", c"cuCtxCreate_v4", 12050),
    (c"cuCtxDestroy", c"cuCtxDestroy_v2", 4000),
    (c"cuCtxRecordEvent", c"cuCtxRecordEvent", 12050),
    (c"cuCtxWaitEvent", c"cuCtxWaitEvent", 12050),
    (c"cuCtxGetLimit", c"cuCtxGetLimit", 3010),
    (c"cuCtxSetLimit", c"cuCtxSetLimit", 3010),
    (c"cuCtxGetCacheConfig", c"cuCtxGetCacheConfig", 3020),
    (c"cuCtxSetCacheConfig", c"cuCtxSetCacheConfig", 3020),
    (c"cuMemHostAlloc", c"cuMemHostAlloc", 2020),
    (c"cuMemcpyPeer", c"cuMemcpyPeer", 4000),
    (c"cuMemcpyPeerAsync", c"cuMemcpyPeerAsync", 4000),
    (c"cuStreamAttachMemAsync", c"cuStreamAttachMemAsync", 6000),
    (c"cuMemGetDefaultMemPool", c"cuMemGetDefaultMemPool", 13000),
    (c"cuMemGetMemPool", c"cuMemGetMemPool", 13000),
    (c"cuMemSetMemPool", c"cuMemSetMemPool", 13000),
];

#[test]
fn the_context_peer_copy_and_location_pool_functions_resolve_as_their_variants() {
    in_child!(&[], || {
        let d = driver();
        for (base, symbol, version) in ADDED {
            let found = (CUresult::CUDA_SUCCESS, exported(d, symbol), Q::CU_GET_PROC_ADDRESS_SUCCESS);
            assert_eq!(proc_address(d, base, 13000), found, "{base:?}");
            assert_eq!(proc_address(d, base, version), found, "{base:?} at {version}");
            // The variant the simulator has is the one of `version`: no older ABI is offered.
            let (result, address, status) = proc_address(d, base, version - 10);
            assert_eq!((result, address), (CUresult::CUDA_ERROR_NOT_FOUND, 0), "{base:?} before {version}");
            assert_eq!(status, Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "{base:?} before {version}");
        }
        // Their per-thread-default-stream variants, where `cuda.h` has them (CUDA 7.0's).
        for (base, per_thread) in [
            (c"cuMemcpyPeer", c"cuMemcpyPeer_ptds"),
            (c"cuMemcpyPeerAsync", c"cuMemcpyPeerAsync_ptsz"),
            (c"cuStreamAttachMemAsync", c"cuStreamAttachMemAsync_ptsz"),
        ] {
            let found = (CUresult::CUDA_SUCCESS, exported(d, per_thread), Q::CU_GET_PROC_ADDRESS_SUCCESS);
            assert_eq!(per_thread_proc_address(d, base, 13000), found, "{base:?}");
            assert_ne!(exported(d, per_thread), exported(d, base));
        }
        // None for the others: the per-thread request gets the legacy one.
        let host_alloc = exported(d, c"cuMemHostAlloc");
        assert_eq!(per_thread_proc_address(d, c"cuMemHostAlloc", 13000).1, host_alloc);
    });
}

#[test]
fn older_drivers_lack_the_context_events_and_location_pools() {
    for version in ["12040", "12080"] {
        in_child!(&[(ENV, version)], || {
            let d = driver();
            let reported = reported(d);
            for (base, symbol, added) in ADDED {
                let answer = proc_address(d, base, 13000);
                if added > reported {
                    assert_eq!(answer, NOT_FOUND, "{base:?} on {reported}");
                } else {
                    assert_eq!(answer.1, exported(d, symbol), "{base:?} on {reported}");
                }
            }
        });
    }
}
