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
