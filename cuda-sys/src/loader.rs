//! Opening a driver library and resolving its entry points lazily, one symbol at a time.
//!
//! Resolution of a function, on its first use:
//! 1. through `cuGetProcAddress_v2(base name, ABI version, stream flag)`, where the version is the
//!    one `cudaTypedefs.h` gives the variant `cuda.h` declares: the driver then returns exactly
//!    that variant (a newer driver does not "upgrade" it to a signature we were not built for);
//! 2. otherwise (a driver older than CUDA 12.0, which has no `cuGetProcAddress_v2`, or a symbol
//!    it does not know) through `dlsym` of the versioned name `cuda.h` maps to (`cuMemAlloc_v2`),
//!    which pins the ABI by name.
//!
//! The result, found or not, is cached per symbol, so later calls cost one atomic load.
//!
//! # Which version each symbol is asked for
//!
//! The version passed to `cuGetProcAddress_v2` is an ABI choice, not a wish for the newest: it
//! is the CUDA version whose `PFN_<name>_v<version>` typedef in `cudaTypedefs.h` matches the
//! signature we call it with, recorded per symbol in the generated table (the fourth field of
//! each entry of `generated/functions.rs`, [`SymbolInfo::version`]). Asking for it:
//! - gets exactly that variant from any newer driver (asking for the driver's own version would
//!   hand a CUDA 14 driver's `cuMemAdvise_v3`, say, to code built for the 12.2 signature);
//! - gets "version not sufficient" from a driver that only has an older variant, which
//!   [`LoadError::VersionNotSufficient`] reports with both versions;
//! - gets "symbol not found" from a driver that predates the function;
//! - is never made of a driver older than that version: such a driver answers with the newest
//!   variant not above the version asked for, an older signature (a CUDA 12.0 driver asked for
//!   `cuMemAdvise` at 12020 gives CUDA 8.0's, which takes a device ordinal where `_v2` takes a
//!   `CUmemLocation`), so the loader compares the driver's version (`cuDriverGetVersion`, asked
//!   once) with the variant's first and reports [`LoadError::VersionNotSufficient`] without
//!   asking. The same holds for `dlsym`: a driver never exports a variant newer than itself.
//!
//! So the version asked for is the one the signature was introduced with: `cuMemAlloc_v2` is
//! asked for at 3020, `cuMemPoolCreate` at 11020, `cuMemAdvise_v2` and `cuMemPrefetchAsync_v2`
//! at 12020 (their CUDA 8.0 forms took a device ordinal where these take a `CUmemLocation`),
//! `cuEventElapsedTime_v2` at 12080, `cuMemcpyBatchAsync_v2` and `cuMemGetMemPool` at 13000.
//! Where `cuda-mem` can use an older variant on older drivers (the same job, an older
//! signature), that variant is declared by hand with its own version in [`crate::older`]
//! (`cuEventElapsedTime` at 2000, `cuMemAdvise` and `cuMemPrefetchAsync` at 8000, `cuDeviceGetUuid`
//! at 9020) and the caller picks one by the driver's version.

use std::ffi::{CStr, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{CudaError, DriverError, LoadError};
use crate::types::{CUdriverProcAddress_flags, CUdriverProcAddressQueryResult, CUresult, cuuint64_t};

/// The environment variable naming the driver library to load instead of [`DEFAULT_LIBRARY`].
pub const DRIVER_ENV: &str = "CUDA_MEM_DRIVER";

/// The library [`driver()`] opens when [`DRIVER_ENV`] is unset: on Linux (and other Unix
/// systems) the driver's runtime soname, `libcuda.so.1`, which (unlike the development symlink
/// `libcuda.so`) every driver installation has.
#[cfg(not(windows))]
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";

/// The library [`driver()`] opens when [`DRIVER_ENV`] is unset: on Windows `nvcuda.dll`, which
/// the display driver installs in the system folder.
#[cfg(windows)]
pub const DEFAULT_LIBRARY: &str = "nvcuda.dll";

/// Which default-stream semantics the resolved functions have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StreamMode {
    /// The legacy default stream (handle 0 is `CU_STREAM_LEGACY`), as a plain C program gets.
    #[default]
    Legacy,
    /// The per-thread default stream (the `_ptds`/`_ptsz` variants), as with
    /// `CUDA_API_PER_THREAD_DEFAULT_STREAM`.
    PerThread,
}

/// How a [`Driver`] resolves its functions.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DriverOptions {
    /// Default-stream semantics of the functions that take a stream.
    pub stream_mode: StreamMode,
}

impl DriverOptions {
    /// Options with the given default-stream semantics.
    pub fn with_stream_mode(mut self, stream_mode: StreamMode) -> Self {
        self.stream_mode = stream_mode;
        self
    }
}

/// What the symbol table records about one driver function (generated from `cuda.h` and
/// `cudaTypedefs.h`); [`SYMBOLS`](crate::SYMBOLS) lists them all.
#[derive(Debug, Clone, Copy)]
pub struct SymbolInfo {
    /// The versioned symbol `cuda.h` declares (`cuMemAlloc_v2`).
    pub symbol: &'static CStr,
    /// The name `cuGetProcAddress` takes (`cuMemAlloc`).
    pub base: &'static CStr,
    /// The ABI version of that variant, from `cudaTypedefs.h`.
    pub version: Option<u32>,
    /// The per-thread-default-stream variant and its ABI version, where one exists.
    pub per_thread: Option<(&'static CStr, u32)>,
}

/// Why a lookup failed; kept in the cache so a failure is not retried.
#[derive(Debug, Clone, Copy)]
pub enum Failure {
    NotFound { version: Option<u32> },
    TooOld { required: u32, driver: u32 },
}

/// One cached lookup: the entry point's address, or why there is none.
pub type Slot = OnceLock<Result<usize, Failure>>;

type GetProcAddress = unsafe extern "C" fn(
    symbol: *const std::ffi::c_char,
    pfn: *mut *mut c_void,
    cuda_version: c_int,
    flags: cuuint64_t,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult;

/// An open CUDA driver library.
///
/// Its methods named after driver functions (`cuInit`, `cuMemAlloc_v2`, …) return that function's
/// pointer, resolved on first use; calling it is `unsafe` and is the caller's business. Function
/// pointers stay valid as long as the `Driver` lives (forever, for the one [`driver()`] returns):
/// calling one after its `Driver` is dropped is undefined behaviour, which every `unsafe` call
/// site must rule out. A function the driver lacks is a [`LoadError`] naming it, at the first
/// call of its method (the outcome is cached).
pub struct Driver {
    library: libloading::Library,
    path: PathBuf,
    options: DriverOptions,
    get_proc_address: Option<GetProcAddress>,
    /// The entry points of older variants ([`crate::older`]), boxed like `entries`: a `Driver`
    /// is passed by value (back out of `install_driver`, say) and stays small.
    pub(crate) older_entries: Box<crate::older::OlderEntries>,
    version: OnceLock<Option<u32>>,
    pub(crate) entries: Box<Entries>,
    /// The entry points newer than `cuda.h` ([`crate::newer`]).
    pub(crate) newer: crate::newer::NewerEntries,
}

// SAFETY: the driver library's entry points are documented as thread-safe, the library handle
// is only read after construction, and every cache is a `OnceLock`.
unsafe impl Send for Driver {}
// SAFETY: as above; all interior mutability goes through `OnceLock`.
unsafe impl Sync for Driver {}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("options", &self.options)
            .field("has_get_proc_address_v2", &self.get_proc_address.is_some())
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Opens the driver library at `path` (a file path, or a name the dynamic loader searches
    /// for, such as `libcuda.so.1`) with default options.
    ///
    /// [`driver()`] is the safe way to the process-wide driver; this is for opening a library the
    /// program itself chooses.
    ///
    /// # Safety
    /// The library must be a CUDA driver (or a faithful stand-in, such as the `cuda-sim`
    /// simulator): every symbol it exports under a name of the driver API (`cuInit`,
    /// `cuMemAlloc_v2`, `cuGetProcAddress_v2`, …), and every address its `cuGetProcAddress_v2`
    /// returns, implements that function with the C signature and the behaviour `cuda.h`
    /// documents; and running the library's initialisers, which loading does, must be sound. The
    /// accessors of the returned `Driver` hand those addresses out as functions of exactly those
    /// signatures, and safe code built on it (`cuda-mem-core`) relies on the documented
    /// behaviour, so nothing after this call can check it. A library that exports none of those
    /// names is refused ([`LoadError::NotADriver`]) before any of them is called.
    ///
    /// # Errors
    /// [`LoadError::Library`] if the library cannot be loaded, [`LoadError::NotADriver`] if it
    /// exports none of the driver's entry points.
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Driver, LoadError> {
        // SAFETY: forwarded from the caller.
        unsafe { Driver::open_with(path, DriverOptions::default()) }
    }

    /// Opens the driver library at `path` with the given options.
    ///
    /// # Safety
    /// As [`Driver::open`].
    ///
    /// # Errors
    /// As [`Driver::open`].
    pub unsafe fn open_with(path: impl AsRef<Path>, options: DriverOptions) -> Result<Driver, LoadError> {
        let path = path.as_ref().to_path_buf();
        // SAFETY: the caller vouches for the library and its initialisers.
        let library = unsafe { open_library(&path) }?;
        let get_proc_address = lookup(&library, c"cuGetProcAddress_v2").map(|address| {
            // SAFETY: `cuGetProcAddress_v2` has had this signature since it appeared (CUDA 12.0),
            // and the symbol's name pins it.
            unsafe { std::mem::transmute::<*const c_void, GetProcAddress>(address) }
        });
        let has_init = lookup(&library, c"cuInit").is_some() && lookup(&library, c"cuDriverGetVersion").is_some();
        if get_proc_address.is_none() && !has_init {
            return Err(LoadError::NotADriver { path });
        }
        Ok(Driver {
            library,
            path,
            options,
            get_proc_address,
            older_entries: Box::default(),
            version: OnceLock::new(),
            entries: Box::default(),
            newer: crate::newer::NewerEntries::default(),
        })
    }

    /// The path or name the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was opened with.
    pub fn options(&self) -> &DriverOptions {
        &self.options
    }

    /// The address of any symbol the library exports (for extensions outside `cuda.h`, such
    /// as the simulator's own controls), found with `dlsym`.
    ///
    /// # Errors
    /// [`LoadError::SymbolNotFound`] when the library does not export it.
    pub fn library_symbol(&self, name: &'static CStr) -> Result<*const c_void, LoadError> {
        lookup(&self.library, name).ok_or_else(|| LoadError::SymbolNotFound {
            symbol: name.to_str().unwrap_or("?"),
            version: None,
            path: self.path.clone(),
        })
    }

    /// The CUDA version the driver supports (`cuDriverGetVersion`; 13000 for CUDA 13.0).
    ///
    /// # Errors
    /// If the driver lacks `cuDriverGetVersion` or the call fails.
    /// The answer is asked once and kept (a driver's version does not change while it is
    /// loaded), so version checks before each call cost a load.
    pub fn version(&self) -> Result<u32, CudaError> {
        if let Some(Some(version)) = self.version.get() {
            return Ok(*version);
        }
        let f = self.cuDriverGetVersion()?;
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid, writable int for the duration of the call.
        let code = unsafe { f(&mut version) };
        self.check("cuDriverGetVersion", code)?;
        let version = u32::try_from(version).unwrap_or(0);
        let _ = self.version.set(Some(version));
        Ok(version)
    }

    /// Turns a returned code into `Ok(())` or a [`DriverError`] naming `function`, with the
    /// name and description the driver gives (or `cuda.h`'s, when the driver has none).
    ///
    /// # Errors
    /// When `code` is not `CUDA_SUCCESS`.
    #[inline]
    pub fn check(&self, function: &'static str, code: CUresult) -> Result<(), DriverError> {
        // Every driver call goes through here: the success test is inlined at the call site,
        // the error's making is not.
        if code == CUresult::CUDA_SUCCESS { Ok(()) } else { Err(self.error(function, code)) }
    }

    /// The [`DriverError`] for a failed call.
    #[cold]
    #[inline(never)]
    fn error(&self, function: &'static str, code: CUresult) -> DriverError {
        let mut error = DriverError::from_header(function, code);
        if let Some(name) = self.describe(code, Self::cuGetErrorName) {
            error.name = name.into();
        }
        if let Some(description) = self.describe(code, Self::cuGetErrorString) {
            error.description = description.into();
        }
        error
    }

    /// Asks the driver for a code's name or description.
    fn describe(
        &self,
        code: CUresult,
        getter: fn(
            &Self,
        )
            -> Result<unsafe extern "C" fn(CUresult, *mut *const std::ffi::c_char) -> CUresult, LoadError>,
    ) -> Option<String> {
        let f = getter(self).ok()?;
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `text` is a valid out-pointer; the driver stores a pointer to a static string.
        let status = unsafe { f(code, &mut text) };
        if status != CUresult::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: on success the driver returned a NUL-terminated string that lives as long as
        // the library, which outlives this call; it is copied at once.
        Some(unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned())
    }

    /// The entry point `spec` names, resolved on first use and cached in `slot`, as the function
    /// pointer type `F`: what every accessor (generated, and the older variants') returns.
    ///
    /// # Safety
    /// `F` is the `unsafe extern "C" fn` type that `cuda.h` (for an older variant,
    /// `cudaTypedefs.h`'s `PFN_…`) declares for `spec.symbol` at `spec`'s ABI version.
    #[inline]
    pub(crate) unsafe fn entry<F: Copy>(&self, slot: &Slot, spec: &SymbolInfo) -> Result<F, LoadError> {
        const { assert!(size_of::<F>() == size_of::<*const c_void>(), "F must be a function pointer") };
        let address = self.resolve(slot, spec)?;
        // SAFETY: `address` is the driver's entry point for `spec` (a function's address), and the
        // caller vouches that `F` is that function's signature.
        Ok(unsafe { std::mem::transmute_copy::<*const c_void, F>(&address) })
    }

    /// Resolves one entry point, caching the outcome in `slot`. After the first call this is
    /// one load and a branch, inlined into every call site.
    #[inline]
    pub(crate) fn resolve(&self, slot: &Slot, spec: &SymbolInfo) -> Result<*const c_void, LoadError> {
        match slot.get() {
            Some(Ok(address)) => Ok(*address as *const c_void),
            _ => self.resolve_slow(slot, spec),
        }
    }

    /// [`resolve`](Driver::resolve) the first time, and for a symbol the driver lacks.
    #[cold]
    #[inline(never)]
    fn resolve_slow(&self, slot: &Slot, spec: &SymbolInfo) -> Result<*const c_void, LoadError> {
        match *slot.get_or_init(|| self.lookup_entry(spec)) {
            Ok(address) => Ok(address as *const c_void),
            Err(failure) => {
                let symbol = spec.symbol.to_str().unwrap_or("?");
                let path = self.path.clone();
                Err(match failure {
                    Failure::NotFound { version } => LoadError::SymbolNotFound { symbol, version, path },
                    Failure::TooOld { required, driver } => {
                        LoadError::VersionNotSufficient { symbol, required, driver, path }
                    }
                })
            }
        }
    }

    fn lookup_entry(&self, spec: &SymbolInfo) -> Result<usize, Failure> {
        let (name, version, flags) = match (self.options.stream_mode, spec.per_thread) {
            (StreamMode::PerThread, Some((name, version))) => {
                (name, Some(version), CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
            }
            _ => (spec.symbol, spec.version, CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM),
        };
        // A driver older than the variant has only older variants, which `cuGetProcAddress_v2`
        // would hand out for this request (the newest not above the version asked for) with
        // another signature (`cuMemAdvise` of CUDA 8.0 for `cuMemAdvise_v2`): refuse instead.
        if let (Some(required), Some(driver)) = (version, self.known_version())
            && driver < required
        {
            return Err(Failure::TooOld { required, driver });
        }
        let mut too_old = None;
        if let (Some(get_proc_address), Some(version)) = (self.get_proc_address, version) {
            let mut address: *mut c_void = std::ptr::null_mut();
            let mut status = CUdriverProcAddressQueryResult(0);
            // SAFETY: `base` is NUL-terminated, `address` and `status` are valid out-pointers, and
            // the version fits an int (it is at most 5 digits).
            let code = unsafe {
                get_proc_address(
                    spec.base.as_ptr(),
                    &mut address,
                    version as c_int,
                    cuuint64_t::from(flags.0),
                    &mut status,
                )
            };
            if code == CUresult::CUDA_SUCCESS
                && status == CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
                && !address.is_null()
            {
                return Ok(address as usize);
            }
            if status == CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT {
                too_old = Some(version);
            }
        }
        if let Some(address) = lookup(&self.library, name) {
            return Ok(address as usize);
        }
        match too_old {
            Some(required) => Err(Failure::TooOld { required, driver: self.version_cached() }),
            None => Err(Failure::NotFound { version }),
        }
    }

    /// The driver version for error messages, without recursing through a failing lookup.
    fn version_cached(&self) -> u32 {
        self.known_version().unwrap_or(0)
    }

    /// The driver's version, asked once through `dlsym` (never through a lookup, which needs
    /// it); `None` when it cannot be had.
    fn known_version(&self) -> Option<u32> {
        *self.version.get_or_init(|| {
            let address = lookup(&self.library, c"cuDriverGetVersion")?;
            // SAFETY: `cuDriverGetVersion(int*)` has had this signature since CUDA 2.2.
            let f =
                unsafe { std::mem::transmute::<*const c_void, unsafe extern "C" fn(*mut c_int) -> CUresult>(address) };
            let mut version: c_int = 0;
            // SAFETY: `version` is a valid out-pointer.
            let code = unsafe { f(&mut version) };
            (code == CUresult::CUDA_SUCCESS).then(|| u32::try_from(version).unwrap_or(0))
        })
    }
}

/// Loads the library at `path`.
///
/// # Safety
/// Running the library's initialisers is sound (as [`Driver::open`] requires).
unsafe fn open_library(path: &Path) -> Result<libloading::Library, LoadError> {
    // SAFETY: loading runs the library's initialisers, which the caller vouches for.
    unsafe { libloading::Library::new(path) }.map_err(|source| LoadError::Library { path: path.to_path_buf(), source })
}

/// `dlsym` of one name; `None` when absent or null.
fn lookup(library: &libloading::Library, name: &CStr) -> Option<*const c_void> {
    // SAFETY: the symbol is read as an address only; it is never called through this type.
    let symbol = unsafe { library.get::<*const c_void>(name) }.ok()?;
    let address = *symbol;
    (!address.is_null()).then_some(address)
}

/// The generated accessors, one per driver function of `cuda.h`.
mod functions {
    use crate::types::*;
    include!("generated/functions.rs");
}
pub(crate) use functions::Entries;
pub use functions::SYMBOLS;

/// Calls a driver function through a [`Driver`] and checks its result, in one line.
///
/// `cu_call!(driver, cuMemAlloc_v2(&mut ptr, size))` resolves the entry point, calls it and
/// turns the code into `Result<(), CudaError>`. Calling a driver function is `unsafe`, so the
/// macro must be used inside an `unsafe` block whose `// SAFETY:` comment says why the arguments
/// are valid.
///
/// An older variant declared by hand (see [`crate::older`]) is called by its accessor and named
/// in errors as `cuda.h` names the function: `cu_call!(d, cuEventElapsedTime_v1(..) as
/// "cuEventElapsedTime")`.
#[macro_export]
macro_rules! cu_call {
    ($driver:expr, $function:ident ( $($arg:expr),* $(,)? ) as $name:literal) => {{
        let driver: &$crate::Driver = $driver;
        match driver.$function() {
            Ok(f) => driver.check($name, f($($arg),*)).map_err($crate::CudaError::from),
            Err(e) => Err($crate::CudaError::from(e)),
        }
    }};
    ($driver:expr, $function:ident ( $($arg:expr),* $(,)? )) => {{
        let driver: &$crate::Driver = $driver;
        match driver.$function() {
            Ok(f) => driver.check(stringify!($function), f($($arg),*)).map_err($crate::CudaError::from),
            Err(e) => Err($crate::CudaError::from(e)),
        }
    }};
}

static GLOBAL: OnceLock<Driver> = OnceLock::new();
static GLOBAL_INIT: Mutex<()> = Mutex::new(());

/// The process-wide driver: the one [`install_driver`] installed, or else the library named by
/// `CUDA_MEM_DRIVER`, or else [`DEFAULT_LIBRARY`], opened on first use.
///
/// A failed open is not remembered: a later call tries again (after the environment changed,
/// say).
///
/// Unlike [`Driver::open`], this is safe to call: the library is the one the process's
/// configuration names, the driver's runtime soname found by the dynamic loader's search (as
/// for any library the program links), or `CUDA_MEM_DRIVER`, which is configuration of the same
/// standing as `LD_LIBRARY_PATH` or `LD_PRELOAD`: whoever sets the environment chooses the code
/// the process runs. Trusting it is the dynamic linker's rule, not a promise this call asks of
/// its caller.
///
/// # Errors
/// As [`Driver::open`].
#[inline]
pub fn driver() -> Result<&'static Driver, LoadError> {
    match GLOBAL.get() {
        Some(driver) => Ok(driver),
        None => open_global(),
    }
}

/// [`driver()`] until the process-wide driver is open.
#[cold]
#[inline(never)]
fn open_global() -> Result<&'static Driver, LoadError> {
    let _guard = GLOBAL_INIT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(driver) = GLOBAL.get() {
        return Ok(driver);
    }
    let path = std::env::var_os(DRIVER_ENV).map_or_else(|| PathBuf::from(DEFAULT_LIBRARY), PathBuf::from);
    // SAFETY: the library is the CUDA driver the process's configuration names (see `driver()`):
    // `CUDA_MEM_DRIVER`, set by whoever controls the environment, as `LD_LIBRARY_PATH` is, or
    // the driver's own soname.
    let opened = unsafe { Driver::open(path) }?;
    Ok(GLOBAL.get_or_init(|| opened))
}

/// Makes `driver` the process-wide driver that [`driver()`] returns.
///
/// # Errors
/// Gives `driver` back if a process-wide driver is already in place.
pub fn install_driver(driver: Driver) -> Result<&'static Driver, Driver> {
    let _guard = GLOBAL_INIT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if GLOBAL.get().is_some() {
        return Err(driver);
    }
    Ok(GLOBAL.get_or_init(|| driver))
}

/// The process-wide driver, if one has been opened or installed already; never opens one.
pub fn installed_driver() -> Option<&'static Driver> {
    GLOBAL.get()
}
