//! A build without the feature `vmm` cannot import virtual buffers: a peer's virtual buffer
//! (kind 4) is refused saying which feature receives it, its descriptors are closed, and the
//! channel goes on. (With the feature, `tests/tests/ipc_virtual_buffers.rs` covers kind 4.)

#![cfg(not(feature = "vmm"))]

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use cuda_mem_core::{Device, Stream, StreamOptions};
use cuda_mem_ipc::wire::MessageKind;
use cuda_mem_ipc::{Channel, IpcChannel, IpcError, Received};

#[test]
fn a_virtual_buffer_is_refused_naming_the_feature_and_its_descriptors_are_closed() {
    cuda_sim::testing::driver().unwrap();
    let device = Device::new(0).unwrap();
    device.set_current().unwrap();
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let (a, b) = Channel::pair().unwrap();
    let receiver = IpcChannel::new(b);
    // Stand-ins for chunk descriptors: the kept end reads end-of-file once every copy of the
    // other end is closed, whatever other threads open meanwhile.
    let (mut kept, passed) = UnixStream::pair().unwrap();
    let passed = OwnedFd::from(passed);
    a.send(4, b"CUMEMVMM", &[passed.as_fd(), passed.as_fd()]).unwrap();
    drop(passed);
    let error = receiver.recv(&stream).unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, IpcError::NotReceivable { kind: MessageKind::VirtualBuffer, feature: "vmm" }), "{error:?}");
    assert!(text.contains("a virtual buffer (message kind 4)") && text.contains("`vmm` feature"), "{text}");
    kept.set_nonblocking(true).unwrap();
    assert_eq!(kept.read(&mut [0u8; 1]).unwrap(), 0, "the message's descriptors are closed");
    a.send(3, b"still in step", &[]).unwrap();
    let Received::Data(bytes) = receiver.recv(&stream).unwrap() else { panic!("expected data") };
    assert_eq!(bytes, b"still in step");
}
