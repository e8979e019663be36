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

/// The gate that holds a stream's later work until the test opens it (shared with the
/// simulator's own tests).
pub use cuda_sim::testing::Gate;

/// Enqueues on `stream` (a raw handle, as the calling thread names it; a context must be
/// current) a host function that waits until `gate` is open.
pub fn hold(gate: &'static Gate, stream: cuda_mem_core::sys::types::CUstream) {
    let d = cuda_sim::testing::driver().expect("the test driver loads");
    // SAFETY: the tests pass only their own live streams and the per-thread handle.
    unsafe { gate.hold(d, stream) }.expect("a host function can be enqueued");
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
