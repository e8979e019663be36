//! Fault injection: make the Nth call of a driver function fail, so that tests can check that
//! every step of a multi-step operation rolls back.
//!
//! Armed by `CUDA_SIM_FAIL` (read once, at the first driver call): a comma-separated list of
//! `function:n` (`cuMemMap:3` fails the third `cuMemMap`; per-thread variants count under the
//! plain name). Also armed at run time through the simulator's own export `cuSimInjectFailure`.
//! An injected failure returns `CUDA_ERROR_OUT_OF_MEMORY` without doing anything.
//!
//! Calls are also counted on request (`cuSimCountCalls`, read back with `cuSimCallCount`), so
//! that a test can learn which driver calls a path makes, and then fail each of them in turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, PoisonError};

/// Per function: calls seen since armed, and the call numbers that fail.
type Plan = HashMap<String, (u32, Vec<u32>)>;

static PLAN: Mutex<Option<Plan>> = Mutex::new(None);
/// Whether anything is armed: the common case costs one atomic load.
static ARMED: AtomicBool = AtomicBool::new(false);
static FROM_ENV: Once = Once::new();

/// Calls of each driver function since counting last started (`cuSimCountCalls`).
static COUNTS: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);
/// Whether calls are being counted.
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Arms a failure of the `nth` next call of `function` (1 = the next one).
pub(crate) fn arm(function: &str, nth: u32) {
    let mut plan = PLAN.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = plan.get_or_insert_with(HashMap::new).entry(function.to_string()).or_insert((0, Vec::new()));
    let at = entry.0 + nth;
    entry.1.push(at);
    ARMED.store(true, Ordering::Release);
}

fn arm_from_env() {
    let Ok(spec) = std::env::var("CUDA_SIM_FAIL") else { return };
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.rsplit_once(':').map(|(f, n)| (f, n.parse::<u32>())) {
            Some((function, Ok(n))) if n > 0 => arm(function, n),
            _ => eprintln!("cuda-sim: CUDA_SIM_FAIL entry {item:?} ignored: expected function:n with n >= 1"),
        }
    }
}

/// Starts counting every driver call from zero (`true`), or stops counting, keeping the counts
/// for reading (`false`).
pub(crate) fn count_calls(on: bool) {
    if on {
        *COUNTS.lock().unwrap_or_else(PoisonError::into_inner) = Some(HashMap::new());
    }
    COUNTING.store(on, Ordering::Release);
}

/// The calls of `function` counted since counting last started.
pub(crate) fn calls(function: &str) -> u32 {
    let counts = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
    counts.as_ref().and_then(|c| c.get(function)).copied().unwrap_or(0)
}

/// Counts a call of `function`; whether it must fail.
pub(crate) fn should_fail(function: &str) -> bool {
    FROM_ENV.call_once(arm_from_env);
    let name = function.strip_suffix("_ptsz").or_else(|| function.strip_suffix("_ptds")).unwrap_or(function);
    // The simulator's own controls are not driver calls.
    if COUNTING.load(Ordering::Acquire) && !name.starts_with("cuSim") {
        let mut counts = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.get_or_insert_with(HashMap::new).entry(name.to_string()).or_insert(0) += 1;
    }
    if !ARMED.load(Ordering::Acquire) {
        return false;
    }
    let mut plan = PLAN.lock().unwrap_or_else(PoisonError::into_inner);
    let Some((calls, fail_at)) = plan.as_mut().and_then(|p| p.get_mut(name)) else { return false };
    *calls += 1;
    let hit = fail_at.iter().position(|&at| at == *calls);
    if let Some(i) = hit {
        fail_at.swap_remove(i);
    }
    hit.is_some()
}
