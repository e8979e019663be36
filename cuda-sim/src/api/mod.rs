//! The driver functions' behaviour: argument checks, state lookups, and the work they enqueue.
//! `crate::exports` gives each one its C symbol(s).

pub(crate) mod attach;
pub(crate) mod context;
pub(crate) mod copy_batch;
pub(crate) mod device;
pub(crate) mod event;
pub(crate) mod graph;
pub(crate) mod init;
pub(crate) mod ipc;
pub(crate) mod limits;
pub(crate) mod managed;
pub(crate) mod memory;
pub(crate) mod pointer;
pub(crate) mod pool;
pub(crate) mod sim;
pub(crate) mod stream;
pub(crate) mod user_object;
pub(crate) mod vmm;

use std::cell::Cell;

thread_local! {
    /// Set while a host function enqueued with `cuLaunchHostFunc` runs on this thread.
    static IN_HOST_FUNCTION: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running a host function (which must not call the driver).
pub(crate) fn in_host_function() -> bool {
    IN_HOST_FUNCTION.with(Cell::get)
}

/// Runs `f` with the host-function flag set.
pub(crate) fn as_host_function(f: impl FnOnce()) {
    IN_HOST_FUNCTION.with(|flag| flag.set(true));
    f();
    IN_HOST_FUNCTION.with(|flag| flag.set(false));
}

/// What stream handle 0 means for a function: the legacy default stream (plain symbols) or the
/// per-thread default stream (the `_ptds`/`_ptsz` symbols).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DefaultStream {
    /// Handle 0 is the legacy default stream.
    Legacy,
    /// Handle 0 is the calling thread's per-thread default stream.
    PerThread,
}
