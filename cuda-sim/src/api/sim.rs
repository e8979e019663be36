//! The simulator's own controls, exported beside the driver functions for tests: counts of
//! live objects, fault injection, and counts of driver calls. With `CUDA_SIM_HIDE_CONTROLS=1`
//! each answers `CUDA_ERROR_NOT_FOUND`, as if the library had none ([`HIDE_CONTROLS_ENV`]).

use std::ffi::{CStr, c_char, c_uint};

use crate::error::{SimResult, ensure, write_out};

/// Environment variable that, set to `1`, hides the simulator's own controls: every `cuSim*`
/// function answers `CUDA_ERROR_NOT_FOUND` (read once). A test suite then takes the paths it
/// takes on a real driver, which has none of them, with the simulator behind them: a rehearsal
/// of a GPU run that finds a test relying on the simulator where it would not be.
pub const HIDE_CONTROLS_ENV: &str = "CUDA_SIM_HIDE_CONTROLS";

/// `Ok` unless the controls are hidden ([`HIDE_CONTROLS_ENV`]).
fn controls_shown() -> SimResult {
    static HIDDEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let hidden = *HIDDEN.get_or_init(|| std::env::var(HIDE_CONTROLS_ENV).is_ok_and(|value| value.trim() == "1"));
    if hidden { Err(cuda_mem_sys::types::CUresult::CUDA_ERROR_NOT_FOUND) } else { Ok(()) }
}

/// Counts of the simulator's live objects (`cuSimLiveObjects`), for checking that nothing
/// leaks: compare before and after (`cuda_sim::testing::live_objects` reads them).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveObjects {
    /// VMM address reservations.
    pub reservations: u64,
    /// VMM mappings.
    pub mappings: u64,
    /// VMM physical allocations.
    pub physical_allocations: u64,
    /// Pools other than the default ones.
    pub pools: u64,
    /// Allocations (device, pinned, managed, registered, pool).
    pub allocations: u64,
    /// User objects not yet destroyed (references remain, from user code, graphs or executable
    /// graphs).
    pub user_objects: u64,
    /// Graphs (captured, not yet destroyed).
    pub graphs: u64,
    /// Executable graphs not yet destroyed.
    pub executable_graphs: u64,
}

/// `cuSimLiveObjects`: how many of each kind of object are alive now.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn live_objects(out: *mut LiveObjects) -> SimResult {
    controls_shown()?;
    let state = crate::state::lock()?;
    let counts = LiveObjects {
        reservations: state.memory.reservations.len() as u64,
        mappings: state.memory.mapped.len() as u64,
        physical_allocations: state.physicals.len() as u64,
        // A destroyed pool waiting only for a pending free to run (to give its reserve back)
        // holds nothing of the application's: not counted, as an allocation it still had would be.
        pools: state
            .pools
            .values()
            .filter(|p| !p.is_default && (!p.is_destroyed() || state.memory.pooled_in(p.handle).next().is_some()))
            .count() as u64,
        allocations: state.memory.allocation_count() as u64,
        user_objects: state.user_objects.values().filter(|o| o.is_alive()).count() as u64,
        graphs: state.graphs.len() as u64,
        executable_graphs: state.execs.len() as u64,
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, counts) }
}

/// `cuSimBuildId`: the build id of this library ([`crate::BUILD_ID`]), NUL-terminated and
/// static.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn build_id(out: *mut *const c_char) -> SimResult {
    controls_shown()?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, BUILD_ID_C.as_ptr()) }
}

/// [`crate::BUILD_ID`] with its terminating NUL, for C callers.
const BUILD_ID_C: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CUDA_SIM_BUILD_ID"), "\0").as_bytes()) {
    Ok(id) => id,
    Err(_) => panic!("the build id holds no NUL"),
};

/// `cuSimInjectFailure`: the `nth` next call of `function` fails with
/// `CUDA_ERROR_OUT_OF_MEMORY`.
///
/// # Safety
/// `function` is null or NUL-terminated.
pub(crate) unsafe fn inject_failure(function: *const c_char, nth: u32) -> SimResult {
    controls_shown()?;
    ensure(nth > 0)?;
    // SAFETY: forwarded from the caller.
    let name = unsafe { function_name(function) }?;
    crate::fault::arm(name, nth);
    Ok(())
}

/// `function` as a name.
///
/// # Safety
/// `function` is null or NUL-terminated, and outlives the returned name.
unsafe fn function_name<'a>(function: *const c_char) -> SimResult<&'a str> {
    ensure(!function.is_null())?;
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(function) }.to_str().map_err(|_| cuda_mem_sys::types::CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `cuSimCountCalls`: `on` non-zero starts counting every driver call from zero; zero stops
/// counting and keeps the counts for `cuSimCallCount`.
pub(crate) fn count_calls(on: c_uint) -> SimResult {
    controls_shown()?;
    crate::fault::count_calls(on != 0);
    Ok(())
}

/// `cuSimCallCount`: how many calls of `function` were counted since counting last started
/// (a per-thread-default-stream variant counts under the plain name).
///
/// # Safety
/// `function` is null or NUL-terminated; `count` is null or valid for a write.
pub(crate) unsafe fn call_count(function: *const c_char, count: *mut c_uint) -> SimResult {
    controls_shown()?;
    // SAFETY: forwarded from the caller.
    let name = unsafe { function_name(function) }?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(count, crate::fault::calls(name)) }
}
