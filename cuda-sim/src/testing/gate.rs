//! A gate that holds a stream: a host function that waits until the test opens it, so that
//! work enqueued after it is provably pending while the test looks (the simulator's own tests
//! and the library crates' ordering tests share it).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use cuda_mem_sys::types::CUstream;
use cuda_mem_sys::{CudaError, Driver, cu_call};

/// A gate a host function waits on, holding its stream until the test opens it.
///
/// Gates are leaked (`&'static`), so a stream worker blocked on one never sees it freed. Hold
/// the [`OpenOnDrop`] guard [`Gate::new`] returns: it opens the gate if the test fails first, so
/// that no stream stays blocked for the rest of the process.
pub struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
    entered: Mutex<u32>,
    entered_changed: Condvar,
}

/// Opens its gate when dropped.
pub struct OpenOnDrop(&'static Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl Gate {
    /// A closed gate and the guard that opens it on drop.
    pub fn new() -> (&'static Gate, OpenOnDrop) {
        /// Every gate made, so that the leaked ones stay reachable (LeakSanitizer reports only
        /// memory nothing points to).
        static MADE: Mutex<Vec<&'static Gate>> = Mutex::new(Vec::new());
        let gate: &'static Gate = Box::leak(Box::new(Gate {
            open: Mutex::new(false),
            changed: Condvar::new(),
            entered: Mutex::new(0),
            entered_changed: Condvar::new(),
        }));
        MADE.lock().unwrap_or_else(PoisonError::into_inner).push(gate);
        (gate, OpenOnDrop(gate))
    }

    /// Lets every host function waiting on the gate (and any later one) return.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.changed.notify_all();
    }

    /// Whether the gate has been opened.
    pub fn is_open(&self) -> bool {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Blocks until the gate is open.
    pub fn wait(&self) {
        *self.entered.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.entered_changed.notify_all();
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let _open = self.changed.wait_while(open, |open| !*open).unwrap_or_else(PoisonError::into_inner);
    }

    /// Blocks until `n` host functions have reached the gate (so their stream is provably
    /// blocked there, not merely about to be).
    pub fn wait_entered(&self, n: u32) {
        let entered = self.entered.lock().unwrap_or_else(PoisonError::into_inner);
        let _entered =
            self.entered_changed.wait_while(entered, |entered| *entered < n).unwrap_or_else(PoisonError::into_inner);
    }

    /// Enqueues a host function on `s` (through `d`; a raw handle, as the calling thread names
    /// it, with a context current where it needs one) that waits for this gate.
    ///
    /// # Safety
    /// `s` is a live stream of `d` (or one of the special handles: the null, legacy or
    /// per-thread stream) that a host function may be enqueued on from this thread.
    ///
    /// # Errors
    /// When the driver refuses the host function.
    pub unsafe fn hold(&'static self, d: &Driver, s: CUstream) -> Result<(), CudaError> {
        let data = std::ptr::from_ref(self).cast_mut().cast::<c_void>();
        // SAFETY: `wait_for_gate` takes a `Gate` pointer, and the gate is never freed; the
        // caller vouches for the stream.
        unsafe { cu_call!(d, cuLaunchHostFunc(s, Some(wait_for_gate), data)) }
    }

    /// Opens the gate from another thread after `delay`. Used where the test must show that a
    /// call *waits*: if the call returned without waiting, the effect it should have waited for
    /// is still missing when the test looks.
    pub fn open_after(&'static self, delay: Duration) {
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            self.open();
        });
    }

    /// A watchdog for a call that must *not* wait for this gate: if the gate is still closed
    /// after `limit`, it opens it (so a wrong wait ends) and records that it had to. The test
    /// then asserts `!gate.is_open()` after the call: only a call that waited sees it open.
    pub fn watchdog(&'static self, limit: Duration) -> Arc<AtomicBool> {
        let fired = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&fired);
        std::thread::spawn(move || {
            let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            let (open, timeout) =
                self.changed.wait_timeout_while(open, limit, |open| !*open).unwrap_or_else(PoisonError::into_inner);
            drop(open);
            if timeout.timed_out() {
                flag.store(true, Ordering::SeqCst);
                self.open();
            }
        });
        fired
    }
}

/// The host function [`Gate::hold`] enqueues.
pub extern "C" fn wait_for_gate(data: *mut c_void) {
    // SAFETY: `hold` passes a pointer to a leaked `Gate`.
    let gate = unsafe { &*data.cast::<Gate>() };
    gate.wait();
}
