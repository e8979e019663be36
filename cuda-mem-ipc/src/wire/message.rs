//! The messages of an [`IpcChannel`](crate::IpcChannel): their kinds, and how many file
//! descriptors each carries.
//!
//! Documented on [`MessageKind`].

use std::fmt;

/// What a frame of an [`IpcChannel`](crate::IpcChannel) carries: the `kind` field of its
/// [`FrameHeader`](super::FrameHeader).
///
/// | kind | payload | file descriptors |
/// |---:|---|---|
/// | 1 | [`Resource`](Self::Resource): a pool's UUID, memory and device | the pool's |
/// | 2 | [`Buffers`](Self::Buffers): a count, then encoded [`BufferDescriptor`](super::BufferDescriptor)s | none |
/// | 3 | [`Data`](Self::Data): the application's bytes | none |
/// | 4 | [`VirtualBuffer`](Self::VirtualBuffer): an encoded `SharedVirtualBuffer` (feature `vmm`) | one per chunk (POSIX-fd handles), none (fabric handles) |
/// | 5 | [`Event`](Self::Event): an encoded [`EventDescriptor`](super::EventDescriptor) | none |
/// | 6 | [`BuffersAfterEvent`](Self::BuffersAfterEvent): an encoded [`EventDescriptor`](super::EventDescriptor), then what a buffers message carries | none |
/// | 7 | [`SnapshotRequest`](Self::SnapshotRequest): an encoded [`SnapshotRequest`](super::SnapshotRequest) | none |
/// | 8 | [`Snapshot`](Self::Snapshot): a memory snapshot's JSON | none |
/// | 9 | [`Returned`](Self::Returned): what a buffers message carries, of buffers lent to the sender | none |
///
/// The payloads are versioned by [`FRAME_VERSION`](super::FRAME_VERSION). A kind not in this
/// table is refused ([`MessageError::UnknownKind`]), and so is a message with another number of
/// descriptors than its kind carries ([`MessageError::FdCount`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageKind {
    /// A pool resource: its file descriptor, and 40 bytes
    /// ([`RESOURCE_MESSAGE_LEN`](super::RESOURCE_MESSAGE_LEN)).
    ///
    /// | offset | length | field       | value                                                      |
    /// |-------:|-------:|-------------|------------------------------------------------------------|
    /// |      0 |     16 | pool        | the pool's UUID, not nil                                   |
    /// |     16 |      1 | memory      | `0` device memory, `1` pinned host memory                  |
    /// |     17 |      4 | ordinal     | device memory: the sender's ordinal of the device, `i32`, not negative (for messages: processes number devices differently); pinned: `-1` |
    /// |     21 |      3 | reserved    | `0`                                                        |
    /// |     24 |     16 | device UUID | device memory: the device's UUID, not nil (how the receiver finds it); pinned: zero |
    ///
    /// Decoding checks, in this order: the length, the reserved bytes, the pool UUID, the memory
    /// code, then the ordinal and device UUID the memory needs. Each failure is its own
    /// [`ResourceMessageError`](super::ResourceMessageError) variant.
    Resource,
    /// Buffers of pools sent before: a count, then that many encoded
    /// [`BufferDescriptor`](super::BufferDescriptor)s.
    ///
    /// | offset | length   | field       | value                                                    |
    /// |-------:|---------:|-------------|----------------------------------------------------------|
    /// |      0 |        4 | count       | `n`, `u32`, at most [`MAX_BUFFERS_PER_MESSAGE`](super::MAX_BUFFERS_PER_MESSAGE) |
    /// |      4 |   `108n` | descriptors | `n` encoded buffer descriptors                           |
    ///
    /// Decoding checks the count against the limit, then the exact length for it
    /// ([`BuffersMessageError`](super::BuffersMessageError)), then each descriptor
    /// ([`BufferDescriptorError`](super::BufferDescriptorError)).
    Buffers,
    /// The application's bytes, as they are.
    Data,
    /// A `cuda-mem-vmm` virtual buffer: an encoded `SharedVirtualBuffer` (its layout is on that
    /// type, feature `vmm`), with one file descriptor per chunk for POSIX-fd handles.
    VirtualBuffer,
    /// An interprocess event: an encoded [`EventDescriptor`](super::EventDescriptor).
    Event,
    /// Buffers that are the receiver's once an event has completed: an encoded
    /// [`EventDescriptor`](super::EventDescriptor) (92 bytes), then what a
    /// [`Buffers`](Self::Buffers) message carries.
    ///
    /// Decoding checks the length against the event descriptor's
    /// ([`BuffersMessageError::NoEvent`](super::BuffersMessageError::NoEvent)), decodes the
    /// event, then what follows as a buffers message.
    BuffersAfterEvent,
    /// A request for a memory snapshot of the receiving process: an encoded
    /// [`SnapshotRequest`](super::SnapshotRequest) (4 bytes). Answered (feature `snapshot`)
    /// with a [`Snapshot`](Self::Snapshot) message.
    SnapshotRequest,
    /// A memory snapshot of the sending process: its JSON, UTF-8, in the schema of
    /// `cuda_mem_core::snapshot` (a `version` field, which a reader checks).
    Snapshot,
    /// Buffers lent to the sender (`IpcChannel::lend`), handed back: what a buffers message
    /// carries, each descriptor the one the buffer was lent with. The sender freed its imports
    /// of them, and those frees have run, before it sent this.
    Returned,
}

impl MessageKind {
    /// The kind's number on the wire.
    pub const fn code(self) -> u16 {
        match self {
            MessageKind::Resource => 1,
            MessageKind::Buffers => 2,
            MessageKind::Data => 3,
            MessageKind::VirtualBuffer => 4,
            MessageKind::Event => 5,
            MessageKind::BuffersAfterEvent => 6,
            MessageKind::SnapshotRequest => 7,
            MessageKind::Snapshot => 8,
            MessageKind::Returned => 9,
        }
    }

    /// The kind with the number `code`, if there is one.
    pub const fn from_code(code: u16) -> Option<MessageKind> {
        Some(match code {
            1 => MessageKind::Resource,
            2 => MessageKind::Buffers,
            3 => MessageKind::Data,
            4 => MessageKind::VirtualBuffer,
            5 => MessageKind::Event,
            6 => MessageKind::BuffersAfterEvent,
            7 => MessageKind::SnapshotRequest,
            8 => MessageKind::Snapshot,
            9 => MessageKind::Returned,
            _ => return None,
        })
    }

    /// The kind of a message whose header names `code`.
    ///
    /// # Errors
    ///
    /// - [`MessageError::UnknownKind`]: no kind has that number.
    pub(crate) fn of(code: u16) -> Result<MessageKind, MessageError> {
        MessageKind::from_code(code).ok_or(MessageError::UnknownKind { kind: code })
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageKind::Resource => "resource",
            MessageKind::Buffers => "buffers",
            MessageKind::Data => "data",
            MessageKind::VirtualBuffer => "virtual buffer",
            MessageKind::Event => "event",
            MessageKind::BuffersAfterEvent => "buffers-after-event",
            MessageKind::SnapshotRequest => "snapshot request",
            MessageKind::Snapshot => "snapshot",
            MessageKind::Returned => "returned buffers",
        })
    }
}

/// Refuses a message of `kind` that came with another number of file descriptors than the kind
/// carries (a virtual buffer's number is its encoding's to check).
pub(crate) fn expect_fds(kind: MessageKind, found: usize) -> Result<(), MessageError> {
    let expected = match kind {
        MessageKind::Resource => 1,
        MessageKind::VirtualBuffer => return Ok(()),
        _ => 0,
    };
    if found == expected { Ok(()) } else { Err(MessageError::FdCount { kind, expected, found }) }
}

/// Why a frame is not a message of an [`IpcChannel`](crate::IpcChannel).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// A kind no message has.
    #[error("unknown message kind {kind}")]
    UnknownKind {
        /// The kind in the frame's header.
        kind: u16,
    },
    /// Another number of file descriptors than the kind carries.
    #[error("a {kind} message came with {found} file descriptor(s), expected {expected}")]
    FdCount {
        /// The message's kind.
        kind: MessageKind,
        /// The number its kind carries.
        expected: usize,
        /// The number that came.
        found: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [MessageKind; 9] = [
        MessageKind::Resource,
        MessageKind::Buffers,
        MessageKind::Data,
        MessageKind::VirtualBuffer,
        MessageKind::Event,
        MessageKind::BuffersAfterEvent,
        MessageKind::SnapshotRequest,
        MessageKind::Snapshot,
        MessageKind::Returned,
    ];

    #[test]
    fn the_codes_are_stable() {
        // Golden: a kind's number is the wire's, and never changes.
        assert_eq!(ALL.map(MessageKind::code), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        for kind in ALL {
            assert_eq!(MessageKind::from_code(kind.code()), Some(kind));
        }
        for unknown in [0, 10, 999, u16::MAX] {
            assert_eq!(MessageKind::of(unknown), Err(MessageError::UnknownKind { kind: unknown }));
        }
    }

    #[test]
    fn each_kind_carries_its_number_of_descriptors() {
        assert_eq!(expect_fds(MessageKind::Resource, 1), Ok(()));
        assert_eq!(
            expect_fds(MessageKind::Resource, 0),
            Err(MessageError::FdCount { kind: MessageKind::Resource, expected: 1, found: 0 })
        );
        assert_eq!(expect_fds(MessageKind::VirtualBuffer, 7), Ok(()), "its encoding checks");
        for kind in ALL.into_iter().filter(|&kind| kind != MessageKind::Resource && kind != MessageKind::VirtualBuffer)
        {
            assert_eq!(expect_fds(kind, 0), Ok(()));
            assert_eq!(expect_fds(kind, 1), Err(MessageError::FdCount { kind, expected: 0, found: 1 }));
        }
        let text = MessageError::FdCount { kind: MessageKind::Data, expected: 0, found: 1 }.to_string();
        assert_eq!(text, "a data message came with 1 file descriptor(s), expected 0");
    }
}
