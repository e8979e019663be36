//! Shared setup of the in-process tests: the simulator, device 0 current, a stream, and two
//! `IpcChannel`s connected to each other.

#![allow(dead_code)]

use cuda_mem_core::{Device, Stream, StreamOptions};
use cuda_mem_ipc::{Channel, IpcChannel};

/// Installs the test driver and returns device 0, its context current, with a non-blocking
/// stream of it.
pub fn setup() -> (Device, Stream) {
    cuda_sim::testing::driver().unwrap();
    let device = Device::new(0).unwrap();
    device.set_current().unwrap();
    (device, Stream::new(device, StreamOptions::default().non_blocking()).unwrap())
}

/// Two `IpcChannel`s, each the other's peer.
pub fn pair() -> (IpcChannel, IpcChannel) {
    let (a, b) = Channel::pair().unwrap();
    (IpcChannel::new(a), IpcChannel::new(b))
}
