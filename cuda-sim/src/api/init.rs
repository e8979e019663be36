//! `cuInit`, the driver version, and error names.

use std::ffi::c_char;

use cuda_mem_sys::types::CUresult;

use crate::error::{SimResult, ensure, fail, write_out};

/// The CUDA version the simulator reports: the version of the header it was built from, or the
/// one `CUDA_SIM_DRIVER_VERSION` names (see [`crate::config::driver_version`]).
pub(crate) fn reported_version() -> SimResult<i32> {
    crate::config::driver_version().or(Err(CUresult::CUDA_ERROR_INVALID_VALUE))
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
    let table = cuda_mem_sys::error_table::ERROR_TABLE;
    let found = table.binary_search_by_key(&code.0, |(c, _, _)| *c).ok().map(|i| table[i]);
    let text = found.map_or(std::ptr::null(), |(_, n, d)| if name { n.as_ptr() } else { d.as_ptr() });
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, text) }?;
    if found.is_none() {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}
