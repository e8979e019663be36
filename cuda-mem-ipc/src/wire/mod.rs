//! Every byte layout this crate sends and receives, one file per format.
//!
//! | format | carries | version | its checks fail with |
//! |---|---|---|---|
//! | [`FrameHeader`] | every message: its kind, payload length and descriptor count | [`FRAME_VERSION`] | [`FrameError`] |
//! | [`MessageKind`] | what a frame's payload is, and how many descriptors come with it | the frame's | [`MessageError`] |
//! | resource message ([`MessageKind::Resource`]) | a pool: its UUID, memory and device | the frame's | [`ResourceMessageError`] |
//! | buffers message ([`MessageKind::Buffers`], [`MessageKind::BuffersAfterEvent`]) | a count, then buffer descriptors | the frame's | [`BuffersMessageError`] |
//! | [`BufferDescriptor`] | one buffer of a shared pool | [`BUFFER_DESCRIPTOR_VERSION`] | [`BufferDescriptorError`] |
//! | [`EventDescriptor`] | one interprocess event | [`EVENT_DESCRIPTOR_VERSION`] | [`EventDescriptorError`] |
//! | [`SnapshotRequest`] ([`MessageKind::SnapshotRequest`]) | a peer's request for a memory snapshot: how many events | the frame's | [`SnapshotRequestError`] |
//! | snapshot message ([`MessageKind::Snapshot`]) | a memory snapshot's JSON | its `version` field | `cuda_mem_core::snapshot::SnapshotFormatError` (feature `snapshot`) |
//! | `SharedVirtualBuffer` (feature `vmm`) | a `cuda-mem-vmm` virtual buffer and where its memory lives | `SHARED_VIRTUAL_BUFFER_VERSION` | `SharedVirtualBufferError` |
//!
//! Each format's layout table is on the item the table names. Integers are little-endian, UUIDs
//! in RFC 9562 byte order. The three descriptors share an envelope: a 16-byte header (magic,
//! version, zero flags, zero reserved) and a trailing CRC-32, checked by one function
//! ([`EnvelopeError`]). The payloads of the messages have no version of their own: a change to
//! one changes [`FRAME_VERSION`].
//!
//! A format's constants and error are named after the type that encodes it
//! (`BufferDescriptor`: [`BUFFER_DESCRIPTOR_MAGIC`], [`BufferDescriptorError`]). Each check
//! has its own error variant, and each format has golden-bytes tests: changing a layout must
//! change its version, not those tests.
//!
//! The codecs make no driver call: they turn bytes into values and back. Sockets and file
//! descriptors are [`Channel`](crate::Channel)'s. `python/cuda_mem_exchange.py` (in the
//! repository) mirrors this module, with the same names.

mod buffer_descriptor;
mod buffers;
mod envelope;
mod event_descriptor;
mod frame;
mod location;
mod message;
mod resource;
mod snapshot_request;
#[cfg(feature = "vmm")]
mod virtual_buffer;

pub use buffer_descriptor::{
    BUFFER_DESCRIPTOR_LEN, BUFFER_DESCRIPTOR_MAGIC, BUFFER_DESCRIPTOR_VERSION, BufferDescriptor, BufferDescriptorError,
    MAX_BUFFER_SIZE,
};
pub use buffers::{BuffersMessageError, MAX_BUFFERS_PER_MESSAGE};
pub use envelope::EnvelopeError;
pub use event_descriptor::{
    EVENT_DESCRIPTOR_LEN, EVENT_DESCRIPTOR_MAGIC, EVENT_DESCRIPTOR_VERSION, EventDescriptor, EventDescriptorError,
};
pub use frame::{FRAME_HEADER_LEN, FRAME_MAGIC, FRAME_VERSION, FrameError, FrameHeader, MAX_FDS, MAX_PAYLOAD_LEN};
pub use message::{MessageError, MessageKind};
pub use resource::{RESOURCE_MESSAGE_LEN, ResourceMessageError};
pub use snapshot_request::{SNAPSHOT_REQUEST_LEN, SnapshotRequest, SnapshotRequestError};
#[cfg(feature = "vmm")]
pub use virtual_buffer::{
    SHARED_VIRTUAL_BUFFER_MAGIC, SHARED_VIRTUAL_BUFFER_VERSION, SharedVirtualBuffer, SharedVirtualBufferError,
};

pub(crate) use buffers::{buffer_descriptors, encode_buffers, split_event};
pub(crate) use location::WireDevice;
#[cfg(feature = "vmm")]
pub(crate) use location::WireLocation;
pub(crate) use message::expect_fds;
pub(crate) use resource::{PoolMemory, ResourceMessage};

use std::fmt;

/// Bytes shown as an escaped byte string, such as `b"CUMEMBUF"`.
pub(crate) struct Escaped<'a>(pub(crate) &'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("b\"")?;
        for &b in self.0 {
            write!(f, "{}", b.escape_ascii())?;
        }
        f.write_str("\"")
    }
}
