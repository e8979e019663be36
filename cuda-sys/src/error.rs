//! Typed errors: a driver that could not be loaded or lacks a symbol ([`LoadError`]), and a
//! driver call that returned something other than `CUDA_SUCCESS` ([`DriverError`]).

use std::borrow::Cow;
use std::path::PathBuf;

use crate::types::CUresult;

/// Why the driver library, or one of its functions, could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not open the library. The message says how to proceed: install
    /// the NVIDIA driver, or name a driver library (the `cuda-sim` simulator runs without a GPU)
    /// with `CUDA_MEM_DRIVER`.
    #[error(
        "cannot load the CUDA driver from {path}: {}; install the NVIDIA driver, or set CUDA_MEM_DRIVER to a driver \
         library's path (without a GPU, the cuda-sim simulator's: `cargo build -p cuda-sim` makes \
         target/debug/libcuda_sim.so)",
        loader_said(source)
    )]
    Library {
        /// The name or path that was tried.
        path: PathBuf,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// No library was found to try: whoever looks for the driver (the simulator's test harness,
    /// say) found nothing where it looked.
    #[error(
        "cannot load the CUDA driver: {path} was not found beside the test binary or in the target folder; build it \
         with `cargo build -p cuda-sim`, or set {env} to its path"
    )]
    LibraryNotFound {
        /// The name of the library looked for.
        path: PathBuf,
        /// The environment variable that names the library instead.
        env: &'static str,
    },
    /// The library found was built from other sources than the code loading it (a stale build
    /// in a shared target folder, or one of another checkout): its behaviour is not what that
    /// code expects.
    #[error(
        "cannot load the CUDA driver from {path}: it has {}, but this code was built with build id \
         {expected}: it is a stale build or one of other sources; rebuild it with `cargo build -p cuda-sim`, or \
         set {env} to the library built with this code",
        found.as_deref().map_or_else(|| "no build id (an older build)".to_owned(), |id| format!("build id {id}"))
    )]
    BuildMismatch {
        /// The library.
        path: PathBuf,
        /// Its build id (`None`: it reports none).
        found: Option<String>,
        /// The build id the loading code was built with.
        expected: &'static str,
        /// The environment variable that names the library instead.
        env: &'static str,
    },
    /// The library opened but exports none of the driver's entry points.
    #[error(
        "{path} is not a CUDA driver: it exports neither cuGetProcAddress_v2 nor cuInit \
         (set CUDA_MEM_DRIVER to the path of libcuda.so.1 or of the cuda-sim library)"
    )]
    NotADriver {
        /// The library that was opened.
        path: PathBuf,
    },
    /// The driver does not provide this function (at the ABI version `cuda.h` declares).
    #[error("the CUDA driver at {path} does not provide {symbol}{}", version_suffix(*.version))]
    SymbolNotFound {
        /// The versioned symbol, as `cuda.h` names it (`cuMemAlloc_v2`).
        symbol: &'static str,
        /// The ABI version that was asked for, when known.
        version: Option<u32>,
        /// The library it was looked up in.
        path: PathBuf,
    },
    /// The driver knows the function but is older than the ABI version asked for.
    #[error(
        "the CUDA driver at {path} is too old for {symbol}: it needs CUDA {}, the driver is CUDA {}",
        cuda_version(*.required), cuda_version(*.driver)
    )]
    VersionNotSufficient {
        /// The versioned symbol.
        symbol: &'static str,
        /// The ABI version needed.
        required: u32,
        /// What `cuDriverGetVersion` reports.
        driver: u32,
        /// The library it was looked up in.
        path: PathBuf,
    },
}

/// What the dynamic loader said (`dlerror`'s text). libloading's error names only the call that
/// failed ("dlopen failed") and holds the system's message as its source.
fn loader_said(error: &libloading::Error) -> String {
    std::error::Error::source(error).map_or_else(|| error.to_string(), ToString::to_string)
}

fn version_suffix(version: Option<u32>) -> String {
    version.map_or_else(String::new, |v| format!(" (CUDA {})", cuda_version(v)))
}

/// Formats a CUDA version number (12050) as "12.5".
fn cuda_version(v: u32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// A driver call that returned an error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{function} failed with {name} ({}): {description}", .code.0)]
pub struct DriverError {
    /// The driver function that failed, as `cuda.h` names it.
    pub function: &'static str,
    /// The code it returned.
    pub code: CUresult,
    /// The code's name (`CUDA_ERROR_INVALID_VALUE`), from the driver or from `cuda.h`.
    pub name: Cow<'static, str>,
    /// The code's description, from the driver or from `cuda.h`.
    pub description: Cow<'static, str>,
}

impl DriverError {
    /// Describes `code` returned by `function` with the names `cuda.h` gives, without asking a
    /// driver (used when none is at hand, and as the fallback for codes a driver cannot name).
    pub fn from_header(function: &'static str, code: CUresult) -> Self {
        DriverError {
            function,
            code,
            name: Cow::Borrowed(error_name(code).unwrap_or("CUDA_ERROR_UNKNOWN_CODE")),
            description: Cow::Borrowed(error_description(code).unwrap_or("unknown error code")),
        }
    }
}

/// Any failure of a driver call: the function could not be loaded, or it returned an error.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The driver, or the function, could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The function ran and returned an error code.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

impl CudaError {
    /// The code the driver returned, if the call got as far as the driver.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            CudaError::Driver(e) => Some(e.code),
            CudaError::Load(_) => None,
        }
    }
}

/// The name `cuda.h` gives to `code`, if it defines one.
pub fn error_name(code: CUresult) -> Option<&'static str> {
    lookup(code).and_then(|(name, _)| name.to_str().ok())
}

/// The first sentence of `cuda.h`'s description of `code`, if it defines one.
pub fn error_description(code: CUresult) -> Option<&'static str> {
    lookup(code).and_then(|(_, description)| description.to_str().ok())
}

fn lookup(code: CUresult) -> Option<(&'static std::ffi::CStr, &'static std::ffi::CStr)> {
    crate::error_table::ERROR_TABLE.binary_search_by_key(&code.0, |(c, _, _)| *c).ok().map(|i| {
        let (_, name, description) = crate::error_table::ERROR_TABLE[i];
        (name, description)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_and_descriptions() {
        assert_eq!(error_name(CUresult::CUDA_SUCCESS), Some("CUDA_SUCCESS"));
        assert_eq!(error_name(CUresult::CUDA_ERROR_INVALID_VALUE), Some("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(error_name(CUresult::CUDA_ERROR_UNKNOWN), Some("CUDA_ERROR_UNKNOWN"));
        assert_eq!(error_name(CUresult(123_456)), None);
        assert!(error_description(CUresult::CUDA_ERROR_OUT_OF_MEMORY).is_some_and(|d| d.contains("memory")));
    }

    #[test]
    fn the_table_is_sorted_for_binary_search() {
        let codes: Vec<u32> = crate::error_table::ERROR_TABLE.iter().map(|(c, _, _)| *c).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(codes, sorted);
    }

    #[test]
    fn unknown_codes_still_format() {
        let e = DriverError::from_header("cuFoo", CUresult(9_999));
        assert_eq!(e.to_string(), "cuFoo failed with CUDA_ERROR_UNKNOWN_CODE (9999): unknown error code");
        let e = DriverError::from_header("cuMemAlloc_v2", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert!(e.to_string().starts_with("cuMemAlloc_v2 failed with CUDA_ERROR_OUT_OF_MEMORY (2): "));
    }

    #[test]
    fn load_errors_name_the_symbol_and_versions() {
        let e = LoadError::VersionNotSufficient {
            symbol: "cuCtxCreate_v4",
            required: 12050,
            driver: 12020,
            path: "libcuda.so.1".into(),
        };
        assert_eq!(
            e.to_string(),
            "the CUDA driver at libcuda.so.1 is too old for cuCtxCreate_v4: it needs CUDA 12.5, the driver is CUDA 12.2"
        );
        let e = LoadError::SymbolNotFound { symbol: "cuFoo", version: Some(13000), path: "x.so".into() };
        assert_eq!(e.to_string(), "the CUDA driver at x.so does not provide cuFoo (CUDA 13.0)");
    }
}
