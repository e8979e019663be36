//! Shared setup: the driver the tests run on (the simulator unless `CUDA_MEM_DRIVER` is set).

#![allow(dead_code)]

use cuda_mem_core::{Device, Stream, StreamOptions};

/// Installs the test driver and returns device 0 with its context current on this thread.
pub fn device() -> Device {
    cuda_sim::testing::driver().expect("the test driver loads");
    let device = Device::new(0).expect("device 0 exists");
    device.set_current().expect("device 0's context can be made current");
    device
}

/// A new non-blocking stream on `device`.
pub fn stream(device: Device) -> Stream {
    Stream::new(device, StreamOptions::default().non_blocking()).expect("a stream can be created")
}

/// The devices, or a declared skip when there are fewer than `n`.
pub fn devices(n: usize) -> Option<Vec<Device>> {
    cuda_sim::testing::driver().expect("the test driver loads");
    let all = Device::all().expect("devices can be listed");
    if all.len() < n {
        cuda_sim::testing::skip(&format!("needs {n} devices, this machine has {}", all.len()));
        return None;
    }
    Some(all)
}

/// A gate a host function waits on, holding a stream's later work until the test opens it.
///
/// Gates are leaked (`&'static`), so a stream blocked on one never sees it freed. Keep the
/// [`OpenOnDrop`] guard [`Gate::new`] returns: it opens the gate if the test fails first, so that
/// no stream stays blocked for the rest of the process.
pub struct Gate {
    open: std::sync::Mutex<bool>,
    changed: std::sync::Condvar,
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
        static MADE: std::sync::Mutex<Vec<&'static Gate>> = std::sync::Mutex::new(Vec::new());
        let gate: &'static Gate =
            Box::leak(Box::new(Gate { open: std::sync::Mutex::new(false), changed: std::sync::Condvar::new() }));
        MADE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(gate);
        (gate, OpenOnDrop(gate))
    }

    /// Enqueues on `stream` (a raw handle, as the calling thread names it; a context must be
    /// current) a host function that waits until the gate is open.
    pub fn hold(&'static self, stream: cuda_mem_core::sys::types::CUstream) {
        let d = cuda_sim::testing::driver().expect("the test driver loads");
        let data = std::ptr::from_ref(self).cast_mut().cast::<std::ffi::c_void>();
        // SAFETY: `wait_for_gate` takes a `Gate` pointer, and the gate is never freed.
        unsafe { cuda_mem_core::sys::cu_call!(d, cuLaunchHostFunc(stream, Some(wait_for_gate), data)) }
            .expect("a host function can be enqueued");
    }

    /// Lets the host functions waiting on the gate (and any later one) return.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        self.changed.notify_all();
    }

    /// Whether the gate has been opened.
    pub fn is_open(&self) -> bool {
        *self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens the gate from another thread after `delay`: a call that must wait for the held work
    /// returns only after that, so the gate is open when it returns; a call that does not wait
    /// returns while it is still closed.
    pub fn open_after(&'static self, delay: std::time::Duration) {
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            self.open();
        });
    }

    fn wait(&self) {
        let open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let _open = self.changed.wait_while(open, |open| !*open).unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

/// The host function [`Gate::hold`] enqueues.
extern "C" fn wait_for_gate(data: *mut std::ffi::c_void) {
    // SAFETY: `hold` passes a pointer to a leaked `Gate`.
    let gate = unsafe { &*data.cast::<Gate>() };
    gate.wait();
}

/// How long an opener waits before opening a gate that a call must wait for.
pub const OPEN_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// Reads `buffer` on the host and checks that the read waited for the work held behind `gate`
/// (opening later: it is open when a read that waited returns) and that the work wrote `value`
/// into every byte.
pub fn expect_host_read_waited(buffer: &cuda_mem_core::ScopedBuffer<'_>, gate: &Gate, value: u8) {
    let bytes = buffer.host_slice().unwrap();
    assert!(gate.is_open(), "host_slice lent the bytes before the work it must wait for could run");
    assert!(bytes.iter().all(|&b| b == value), "the work had not completed");
}
