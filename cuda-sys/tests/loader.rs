//! The loader against the simulator: opening by path, lazy resolution, typed errors.

use std::ffi::{CStr, c_char};

use cuda_mem_sys::types::{CUdriverProcAddressQueryResult, CUresult};
use cuda_mem_sys::{CudaError, Driver, DriverOptions, LoadError, StreamMode, cu_call};

fn sim_path() -> std::path::PathBuf {
    cuda_sim::testing::library_path().expect("libcuda_sim.so is built beside the test binary")
}

fn open() -> Driver {
    // SAFETY: the simulator implements every driver function it exports with cuda.h's signature.
    unsafe { Driver::open(sim_path()) }.expect("the simulator opens as a driver")
}

#[test]
fn opens_from_a_path_and_reports_its_version() {
    let driver = open();
    assert_eq!(driver.path(), sim_path());
    let version = driver.version().unwrap();
    assert_eq!(version, 13000);
}

#[test]
fn a_library_that_is_not_a_driver_is_refused() {
    // libm is on every Linux machine and exports nothing of the driver's.
    // SAFETY: libm exports no driver function, so none can be called through the result, and
    // its initialisers are the C library's.
    let err = unsafe { Driver::open("libm.so.6") }.unwrap_err();
    assert!(matches!(err, LoadError::NotADriver { .. }), "{err:?}");
    assert!(err.to_string().contains("is not a CUDA driver"), "{err}");
}

#[test]
fn a_missing_library_is_a_load_error_naming_the_path() {
    // SAFETY: there is no library at that path: nothing is loaded.
    let err = unsafe { Driver::open("/nonexistent/libcuda.so.1") }.unwrap_err();
    assert!(matches!(err, LoadError::Library { .. }));
    assert!(err.to_string().contains("/nonexistent/libcuda.so.1"), "{err}");
}

#[test]
fn a_library_load_error_keeps_the_loader_error_as_its_source() {
    use std::error::Error as _;
    // SAFETY: there is no library at that path: nothing is loaded.
    let err = unsafe { Driver::open("/nonexistent/libcuda.so.1") }.unwrap_err();
    let LoadError::Library { path, source } = &err else { panic!("expected LoadError::Library, got {err:?}") };
    assert_eq!(path, std::path::Path::new("/nonexistent/libcuda.so.1"));
    assert!(matches!(source, libloading::Error::DlOpen { .. }), "{source:?}");
    let chained = err.source().and_then(|s| s.downcast_ref::<libloading::Error>());
    assert!(chained.is_some(), "the loader's error is the source");
    // The message: the path, then what the dynamic loader said (`dlerror`, the source of
    // libloading's "dlopen failed").
    let said = source.source().map(ToString::to_string).unwrap_or_default();
    assert!(said.contains("/nonexistent/libcuda.so.1"), "{said}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("cannot load the CUDA driver from /nonexistent/libcuda.so.1: {said}; ")),
        "{text}"
    );
    // And how to proceed: the driver, or a library named by CUDA_MEM_DRIVER (the simulator).
    assert!(text.contains("install the NVIDIA driver, or set CUDA_MEM_DRIVER"), "{text}");
    assert!(text.contains("cargo build -p cuda-sim"), "{text}");
    // Through `CudaError` and the chain, the loader's error is still reachable.
    let cuda = CudaError::from(err);
    let mut chain: Option<&(dyn std::error::Error + 'static)> = Some(&cuda);
    let mut found = false;
    while let Some(e) = chain {
        found |= e.is::<libloading::Error>();
        chain = e.source();
    }
    assert!(found, "{cuda:?}");
}

#[test]
fn functions_resolve_lazily_and_a_missing_one_is_a_typed_error() {
    let driver = open();
    // The simulator does not implement graphs; opening the driver did not need them.
    let err = driver.cuGraphCreate().unwrap_err();
    match &err {
        LoadError::SymbolNotFound { symbol, version, .. } => {
            assert_eq!(*symbol, "cuGraphCreate");
            assert_eq!(*version, Some(10000));
        }
        other => panic!("expected SymbolNotFound, got {other:?}"),
    }
    assert!(err.to_string().contains("does not provide cuGraphCreate"));
    // Resolution is cached: a second lookup gives the same answer.
    assert!(driver.cuGraphCreate().is_err());
    // And functions it has resolve, to the same address each time.
    let a = driver.cuMemAlloc_v2().unwrap() as usize;
    let b = driver.cuMemAlloc_v2().unwrap() as usize;
    assert_eq!(a, b);
}

#[test]
fn a_call_through_a_missing_symbol_is_a_cuda_error() {
    let driver = open();
    let mut graph = std::ptr::null_mut();
    // SAFETY: the call never happens: resolution fails first.
    let err = unsafe { cu_call!(&driver, cuGraphCreate(&mut graph, 0)) }.unwrap_err();
    assert!(matches!(err, CudaError::Load(LoadError::SymbolNotFound { .. })));
    assert_eq!(err.code(), None);
}

#[test]
fn driver_errors_carry_function_code_name_and_description() {
    let driver = open();
    // SAFETY: cuInit takes no pointers.
    unsafe { cu_call!(&driver, cuInit(0)) }.unwrap();
    // SAFETY: cuInit takes no pointers; 7 is an invalid flag value.
    let err = unsafe { cu_call!(&driver, cuInit(7)) }.unwrap_err();
    assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
    let CudaError::Driver(e) = &err else { panic!("{err:?}") };
    assert_eq!(e.function, "cuInit");
    assert_eq!(e.name, "CUDA_ERROR_INVALID_VALUE");
    assert!(!e.description.is_empty());
    assert!(err.to_string().starts_with("cuInit failed with CUDA_ERROR_INVALID_VALUE (1)"), "{err}");
}

#[test]
fn error_names_come_from_the_driver() {
    let driver = open();
    let name = driver.cuGetErrorName().unwrap();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: `text` is a valid out-pointer.
    let found = unsafe { name(CUresult::CUDA_ERROR_OUT_OF_MEMORY, &mut text) };
    assert_eq!(found, CUresult::CUDA_SUCCESS);
    // SAFETY: the driver returned a static NUL-terminated string.
    let text_str = unsafe { CStr::from_ptr(text) };
    assert_eq!(text_str.to_str().unwrap(), "CUDA_ERROR_OUT_OF_MEMORY");
    // SAFETY: as above.
    let missing = unsafe { name(CUresult(987_654), &mut text) };
    assert_eq!(missing, CUresult::CUDA_ERROR_INVALID_VALUE);
    assert!(text.is_null());
    // An unknown code still makes a readable error, named from the header's table or as unknown.
    let err = driver.check("cuFoo", CUresult(987_654)).unwrap_err();
    assert_eq!(err.name, "CUDA_ERROR_UNKNOWN_CODE");
}

#[test]
fn get_proc_address_selects_by_version_and_stream_mode() {
    let driver = open();
    let get = driver.cuGetProcAddress_v2().unwrap();
    let lookup = |name: &CStr, version: i32, flags: u64| {
        let mut pfn = std::ptr::null_mut();
        let mut status = CUdriverProcAddressQueryResult(99);
        // SAFETY: all pointers are valid for the call.
        let code = unsafe { get(name.as_ptr(), &mut pfn, version, flags, &mut status) };
        (code, pfn as usize, status)
    };
    let (code, legacy, status) = lookup(c"cuMemcpyHtoD", 13000, 1);
    assert_eq!((code, status), (CUresult::CUDA_SUCCESS, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS));
    let (_, per_thread, _) = lookup(c"cuMemcpyHtoD", 13000, 2);
    assert_ne!(legacy, per_thread, "the per-thread flag selects the _ptds variant");
    assert_eq!(legacy, driver.cuMemcpyHtoD_v2().unwrap() as usize);
    // Functions without a per-thread variant answer the legacy one for either flag.
    assert_eq!(lookup(c"cuMemAlloc", 13000, 2).1, lookup(c"cuMemAlloc", 13000, 1).1);
    // An ABI older than any the simulator implements is "version not sufficient".
    let (code, pfn, status) = lookup(c"cuMemAlloc", 3000, 1);
    assert_eq!(code, CUresult::CUDA_ERROR_NOT_FOUND);
    assert_eq!(pfn, 0);
    assert_eq!(status, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    let (code, _, status) = lookup(c"cuNoSuchFunction", 13000, 0);
    assert_eq!(code, CUresult::CUDA_ERROR_NOT_FOUND);
    assert_eq!(status, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    assert_eq!(lookup(c"cuMemAlloc", 13000, 8).0, CUresult::CUDA_ERROR_INVALID_VALUE);
}

#[test]
fn per_thread_mode_resolves_the_per_thread_variants() {
    let legacy = open();
    // SAFETY: the simulator implements every driver function it exports, per-thread variants
    // included, with cuda.h's signature.
    let threaded =
        unsafe { Driver::open_with(sim_path(), DriverOptions::default().with_stream_mode(StreamMode::PerThread)) }
            .unwrap();
    assert_ne!(legacy.cuStreamSynchronize().unwrap() as usize, threaded.cuStreamSynchronize().unwrap() as usize);
    assert_eq!(legacy.cuInit().unwrap() as usize, threaded.cuInit().unwrap() as usize);
}
