//! Handle values: unique for the life of the process, so a stale handle is always detected.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The first handle value; below it lie the special stream handles (`CU_STREAM_LEGACY` = 1,
/// `CU_STREAM_PER_THREAD` = 2) and null.
const FIRST: usize = 0x5100_0000;
/// Handles are spaced so that a handle plus a small offset is never another handle.
const STEP: usize = 0x10;

static NEXT: AtomicUsize = AtomicUsize::new(FIRST);

/// A fresh handle value, never handed out before (of any kind: contexts, streams, events and
/// pools share the sequence, so passing one kind where another is expected is detected too).
pub(crate) fn next() -> usize {
    NEXT.fetch_add(STEP, Ordering::Relaxed)
}
