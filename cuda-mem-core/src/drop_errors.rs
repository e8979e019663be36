//! Errors that happen in `Drop`, where they cannot be returned.
//!
//! `Drop` never panics; a failed driver call there is recorded here (the most recent
//! [`KEPT`] of them) and passed to the hook set with [`set_drop_error_hook`], so it is never
//! lost silently. Tests and long-running services can drain them with [`take_drop_errors`].

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use crate::error::{Error, Result};

/// How many recorded errors are kept; older ones are dropped first.
pub const KEPT: usize = 64;

/// Where an error happened and what it was.
#[derive(Debug)]
pub struct DropError {
    /// What was being released (`"Buffer"`, `"Stream"`, …).
    pub what: &'static str,
    /// The error.
    pub error: Error,
}

static RECORDED: Mutex<VecDeque<DropError>> = Mutex::new(VecDeque::new());
static HOOK: Mutex<Option<fn(&DropError)>> = Mutex::new(None);

/// Records an error that happened while releasing `what` (for the crates built on this one,
/// whose `Drop` implementations report the same way).
pub fn record(what: &'static str, error: Error) {
    let entry = DropError { what, error };
    // Copied out so that the hook runs without the lock: it may set the hook or record errors.
    let hook = *HOOK.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(hook) = hook {
        // `record` runs inside `Drop`: a panicking hook must not unwind out of it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(&entry)));
    }
    let mut recorded = RECORDED.lock().unwrap_or_else(PoisonError::into_inner);
    if recorded.len() == KEPT {
        recorded.pop_front();
    }
    recorded.push_back(entry);
}

/// The body of a `Drop` that releases something: runs `release`, and records its failure as one
/// while releasing `what` (never returned, never a panic). Inlined, with the recording out of
/// line: a `Drop` on the hot path (a buffer's) costs no more than the release itself.
#[inline]
pub(crate) fn on_drop(what: &'static str, release: impl FnOnce() -> Result<()>) {
    if let Err(error) = release() {
        record_cold(what, error);
    }
}

/// [`record`], kept out of the callers' code.
#[cold]
#[inline(never)]
fn record_cold(what: &'static str, error: Error) {
    record(what, error);
}

/// Takes every recorded error, oldest first.
pub fn take_drop_errors() -> Vec<DropError> {
    RECORDED.lock().unwrap_or_else(PoisonError::into_inner).drain(..).collect()
}

/// Calls `hook` for every error recorded from now on (for logging); `None` removes it.
pub fn set_drop_error_hook(hook: Option<fn(&DropError)>) {
    *HOOK.lock().unwrap_or_else(PoisonError::into_inner) = hook;
}
