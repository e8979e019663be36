//! Results inside the simulator: `Err` carries the `CUresult` the exported function returns.

use cuda_mem_sys::types::CUresult;

/// What simulator functions return; the export layer turns it into a `CUresult`.
pub(crate) type SimResult<T = ()> = Result<T, CUresult>;

/// Shorthand for returning an error code.
pub(crate) fn fail<T>(code: CUresult) -> SimResult<T> {
    Err(code)
}

/// `CUDA_ERROR_INVALID_VALUE` unless `condition` holds.
pub(crate) fn ensure(condition: bool) -> SimResult {
    if condition { Ok(()) } else { Err(CUresult::CUDA_ERROR_INVALID_VALUE) }
}

/// Writes `value` through an out-pointer, or fails with `CUDA_ERROR_INVALID_VALUE` if it is null.
///
/// # Safety
/// `out` is null or valid for a write of a `T` (the contract of every driver out-parameter).
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) -> SimResult {
    if out.is_null() {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for a write by the caller's contract; unaligned-safe.
    unsafe { out.write_unaligned(value) };
    Ok(())
}
