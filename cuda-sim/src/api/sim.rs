//! The simulator's own controls, exported beside the driver functions for tests: counts of
//! live objects, and fault injection.

use std::ffi::{CStr, c_char};

use crate::error::{SimResult, ensure, write_out};
use crate::testing::LiveObjects;

/// `cuSimLiveObjects`: how many of each kind of object are alive now.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn live_objects(out: *mut LiveObjects) -> SimResult {
    let state = crate::state::lock()?;
    let counts = LiveObjects {
        reservations: state.memory.reservations.len() as u64,
        mappings: state.memory.mapped.len() as u64,
        physical_allocations: state.physicals.len() as u64,
        pools: state.pools.values().filter(|p| !p.is_default).count() as u64,
        allocations: state.memory.allocation_count() as u64,
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, counts) }
}

/// `cuSimInjectFailure`: the `nth` next call of `function` fails with
/// `CUDA_ERROR_OUT_OF_MEMORY`.
///
/// # Safety
/// `function` is null or NUL-terminated.
pub(crate) unsafe fn inject_failure(function: *const c_char, nth: u32) -> SimResult {
    ensure(!function.is_null() && nth > 0)?;
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(function) }
        .to_str()
        .map_err(|_| cuda_sys::types::CUresult::CUDA_ERROR_INVALID_VALUE)?;
    crate::fault::arm(name, nth);
    Ok(())
}
