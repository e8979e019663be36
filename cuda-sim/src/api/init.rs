//! `cuInit`, the driver version, and error names.

use std::ffi::c_char;

use cuda_sys::types::CUresult;

use crate::error::{SimResult, ensure, fail, write_out};

/// The CUDA version the simulator reports by default: the version of the header it was built
/// from.
pub(crate) const DRIVER_VERSION: i32 = cuda_sys::HEADER_VERSION;

/// The environment variable that makes the simulator report another CUDA version (between
/// [`OLDEST_VERSION`] and [`NEWEST_VERSION`]): `cuGetProcAddress` then offers only the entry
/// points a driver of that version has, so a program's handling of an older or newer driver can
/// be tested.
pub(crate) const DRIVER_VERSION_ENV: &str = "CUDA_SIM_DRIVER_VERSION";
/// The oldest version [`DRIVER_VERSION_ENV`] accepts (CUDA 12.0, the first with
/// `cuGetProcAddress_v2`).
pub(crate) const OLDEST_VERSION: i32 = 12000;
/// The newest version [`DRIVER_VERSION_ENV`] accepts: CUDA 13.2, whose
/// `cuMemcpyWithAttributesAsync` is the newest entry point the simulator implements.
pub(crate) const NEWEST_VERSION: i32 = cuda_sys::MEMCPY_WITH_ATTRIBUTES_VERSION as i32;

/// Reads a [`DRIVER_VERSION_ENV`] value.
fn parse_version(text: Option<&str>) -> Result<i32, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(DRIVER_VERSION);
    };
    match text.parse::<i32>() {
        Ok(v) if (OLDEST_VERSION..=NEWEST_VERSION).contains(&v) => Ok(v),
        _ => Err(format!(
            "{DRIVER_VERSION_ENV}={text:?}: expected a CUDA version as cuDriverGetVersion encodes it, \
             from {OLDEST_VERSION} to {NEWEST_VERSION} (13020 for CUDA 13.2)"
        )),
    }
}

/// The CUDA version the simulator reports: [`DRIVER_VERSION_ENV`] when set (read once), else
/// [`DRIVER_VERSION`]. A value out of range is reported on stderr and makes `cuInit` and
/// `cuDriverGetVersion` fail with `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn reported_version() -> SimResult<i32> {
    static VERSION: std::sync::OnceLock<Result<i32, String>> = std::sync::OnceLock::new();
    let version = VERSION.get_or_init(|| {
        let parsed = parse_version(std::env::var(DRIVER_VERSION_ENV).ok().as_deref());
        if let Err(message) = &parsed {
            eprintln!("cuda-sim: {message}");
        }
        parsed
    });
    version.clone().or(Err(CUresult::CUDA_ERROR_INVALID_VALUE))
}

/// `cuInit`: flags must be 0.
pub(crate) fn init(flags: u32) -> SimResult {
    ensure(flags == 0)?;
    reported_version()?;
    crate::state::init()
}

/// `cuDriverGetVersion` (callable before `cuInit`, as in the driver).
///
/// # Safety
/// `out` is null or valid for a write of an `int`.
pub(crate) unsafe fn driver_version(out: *mut i32) -> SimResult {
    let version = reported_version()?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, version) }
}

/// `cuGetErrorName` / `cuGetErrorString`: an unknown code writes null and fails with
/// `CUDA_ERROR_INVALID_VALUE`, as `cuda.h` documents.
///
/// # Safety
/// `out` is null or valid for a write of a pointer.
pub(crate) unsafe fn error_text(code: CUresult, out: *mut *const c_char, name: bool) -> SimResult {
    let table = cuda_sys::error_table::ERROR_TABLE;
    let found = table.binary_search_by_key(&code.0, |(c, _, _)| *c).ok().map(|i| table[i]);
    let text = found.map_or(std::ptr::null(), |(_, n, d)| if name { n.as_ptr() } else { d.as_ptr() });
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, text) }?;
    if found.is_none() {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_version_setting_is_checked() {
        assert_eq!(parse_version(None), Ok(DRIVER_VERSION));
        assert_eq!(parse_version(Some(" ")), Ok(DRIVER_VERSION));
        assert_eq!(parse_version(Some("13020")), Ok(13020));
        assert_eq!(parse_version(Some("12080")), Ok(12080));
        for bad in ["13.2", "11080", "13030", "x"] {
            assert!(parse_version(Some(bad)).unwrap_err().contains(DRIVER_VERSION_ENV), "{bad}");
        }
    }
}
