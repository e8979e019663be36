//! Holding a stream busy: a host function (`cuLaunchHostFunc`) that waits until the probe opens
//! its gate, so that work enqueued after it is still pending while the probe looks. The gate
//! opens by itself after a time limit, so that a driver call that waits for the stream (which
//! would otherwise wait for the probe, which waits for the call) returns late instead of never.

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use cuda_mem_sys::types::CUstream;
use cuda_mem_sys::{CudaError, cu_call, driver};

/// What the host function reads.
struct GateState {
    open: AtomicBool,
    deadline: Instant,
    /// When the host function returned: the wall clock, which other processes read too.
    released: OnceLock<SystemTime>,
}

/// A gate held by a host function on a stream; opened on drop.
pub(crate) struct Gate {
    /// Leaked on purpose: the driver may run the host function after the `Gate` is gone (the
    /// stream may be busy with earlier work), so what it reads must live for the rest of the
    /// process. A few bytes per gate.
    state: &'static GateState,
}

impl Gate {
    /// Enqueues on `stream` a host function that returns once the gate opens, or after `limit`.
    pub(crate) fn hold(stream: CUstream, limit: Duration) -> Result<Gate, CudaError> {
        let state: &'static GateState = Box::leak(Box::new(GateState {
            open: AtomicBool::new(false),
            deadline: Instant::now() + limit,
            released: OnceLock::new(),
        }));
        let d = driver()?;
        let user_data = std::ptr::from_ref(state).cast_mut().cast::<c_void>();
        // SAFETY: `wait` has the host function's signature and only reads the `GateState` that
        // `user_data` points to, which lives for the rest of the process; it calls no driver
        // function. The stream is the caller's, alive.
        unsafe { cu_call!(d, cuLaunchHostFunc(stream, Some(wait), user_data)) }?;
        Ok(Gate { state })
    }

    /// Lets the stream go on.
    pub(crate) fn open(&self) {
        self.state.open.store(true, Ordering::Release);
    }

    /// When the host function let the stream go (the wall clock, comparable across processes),
    /// once it has.
    pub(crate) fn released_at(&self) -> Option<SystemTime> {
        self.state.released.get().copied()
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// The host function: waits for the gate (on the driver's thread for host functions).
unsafe extern "C" fn wait(user_data: *mut c_void) {
    // SAFETY: `user_data` is the leaked `GateState` that `Gate::hold` passed, valid forever and
    // only reached through atomics and a `OnceLock` here.
    let state = unsafe { &*user_data.cast_const().cast::<GateState>() };
    while !state.open.load(Ordering::Acquire) && Instant::now() < state.deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = state.released.set(SystemTime::now());
}
