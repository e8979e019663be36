//! Sending virtual buffers over `cuda-mem-ipc`'s channel (feature `ipc`).
//!
//! One frame of kind [`VIRTUAL_BUFFER`]: the descriptor's encoding as payload, its chunk file
//! descriptors attached. Pool messages and these can share a channel: the receiver dispatches
//! on the kind.

use std::sync::Arc;

use cuda_mem_core::Stream;
use cuda_mem_ipc::{Channel, IpcError, RawMessage};

use crate::buffer::VirtualBuffer;
use crate::error::{Result, VmmError};
use crate::resource::VirtualMemoryResource;
use crate::share::VirtualBufferDescriptor;

/// The channel message kind of a virtual buffer.
pub const VIRTUAL_BUFFER: u16 = 16;

/// Exports `buffer` and sends it; its descriptors are closed here once sent.
///
/// # Errors
/// Export errors (an imported buffer, a resource without handles) and channel errors
/// ([`VmmError::Channel`]).
pub fn send_virtual_buffer(channel: &Channel, buffer: &VirtualBuffer) -> Result<()> {
    let descriptor = buffer.export()?;
    let (bytes, fds) = descriptor.encode();
    Ok(channel.send(VIRTUAL_BUFFER, &bytes, &fds)?)
}

/// Maps a virtual buffer from a received message of kind [`VIRTUAL_BUFFER`] with `resource`
/// (whose handle type must match the sender's).
///
/// # Errors
/// A protocol error ([`VmmError::Channel`]) for another kind of message; descriptor and import
/// errors.
pub fn import_virtual_buffer(
    message: RawMessage,
    resource: &Arc<VirtualMemoryResource>,
    stream: Option<&Stream>,
) -> Result<VirtualBuffer> {
    if message.kind != VIRTUAL_BUFFER {
        return Err(VmmError::Channel(IpcError::Protocol(format!(
            "expected a virtual buffer (kind {VIRTUAL_BUFFER}), got kind {}",
            message.kind
        ))));
    }
    let descriptor = VirtualBufferDescriptor::decode(&message.payload, message.fds)?;
    resource.import(descriptor, stream)
}

/// Receives one message and maps the virtual buffer it carries.
///
/// # Errors
/// Channel errors, and those of [`import_virtual_buffer`].
pub fn recv_virtual_buffer(
    channel: &Channel,
    resource: &Arc<VirtualMemoryResource>,
    stream: Option<&Stream>,
) -> Result<VirtualBuffer> {
    import_virtual_buffer(channel.recv()?, resource, stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem_core::MemoryResourceExt;
    use cuda_mem_core::{Device, FillPattern, PinnedMemoryResource, PinnedMemoryResourceOptions, StreamOptions};

    #[test]
    fn a_virtual_buffer_travels_over_a_channel() {
        cuda_sim::testing::driver().unwrap();
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
        let mut buffer = vmm.allocate(4 << 20, Some(&stream)).unwrap();
        buffer.fill(FillPattern::U8(0x5c), &stream).unwrap();
        stream.synchronize().unwrap();
        let (a, b) = Channel::pair().unwrap();
        send_virtual_buffer(&a, &buffer).unwrap();
        let received = recv_virtual_buffer(&b, &vmm, Some(&stream)).unwrap();
        assert!(received.is_imported());
        assert_ne!(received.ptr(), buffer.ptr());
        let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
        let mut check = host.allocate(received.size(), &stream).unwrap();
        check.copy_from(received.as_buffer(), &stream).unwrap();
        assert!(check.host_slice().unwrap().iter().all(|&x| x == 0x5c));
        a.send(1, b"not a buffer", &[]).unwrap();
        assert!(recv_virtual_buffer(&b, &vmm, None).is_err());
    }
}
