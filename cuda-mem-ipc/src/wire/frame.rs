//! The frame: the header every message of a [`Channel`](crate::Channel) starts with, and what a
//! frame received whole must be.
//!
//! Documented on [`FrameHeader`].

use super::Escaped;
use super::envelope::field;

/// The first 8 bytes of every frame.
pub const FRAME_MAGIC: [u8; 8] = *b"CUMEMMSG";

/// The frame version written by [`FrameHeader::encode`], the only one decoded. It also versions
/// the payloads of the messages ([`MessageKind`](super::MessageKind)).
pub const FRAME_VERSION: u16 = 1;

/// The length in bytes of a frame's header.
pub const FRAME_HEADER_LEN: usize = 24;

/// The largest payload of one frame: 16 MiB.
pub const MAX_PAYLOAD_LEN: usize = 16 << 20;

/// The most file descriptors one frame carries: 253, Linux's `SCM_MAX_FD`.
pub const MAX_FDS: usize = 253;

const VERSION_AT: usize = 8;
const KIND_AT: usize = 10;
const LEN_AT: usize = 12;
const FDS_AT: usize = 16;
const RESERVED_AT: usize = 20;

const _: () = assert!(RESERVED_AT + 4 == FRAME_HEADER_LEN);
// The limits fit the header's `u32` fields (the payload's is the larger).
const _: () = assert!(MAX_FDS <= MAX_PAYLOAD_LEN && MAX_PAYLOAD_LEN <= u32::MAX as usize);

/// The header of a frame: one message of a [`Channel`](crate::Channel).
///
/// # Encoding
///
/// Each message is one frame: a 24-byte header ([`FRAME_HEADER_LEN`]), then the payload.
///
/// | offset | length | field    | value                                                       |
/// |-------:|-------:|----------|-------------------------------------------------------------|
/// |      0 |      8 | magic    | `b"CUMEMMSG"` ([`FRAME_MAGIC`])                             |
/// |      8 |      2 | version  | `1` ([`FRAME_VERSION`]), `u16`                              |
/// |     10 |      2 | kind     | the message kind, `u16`                                     |
/// |     12 |      4 | length   | payload length in bytes, `u32`, at most [`MAX_PAYLOAD_LEN`] |
/// |     16 |      4 | fd count | number of file descriptors, `u32`, at most [`MAX_FDS`]      |
/// |     20 |      4 | reserved | `0`, `u32`                                                  |
/// |     24 |      … | payload  | `length` bytes                                              |
///
/// The descriptors travel beside the bytes, as one `SCM_RIGHTS` control message on the frame's
/// first bytes (see [`Channel`](crate::Channel)). A frame received must bring exactly as many as
/// its header announces, and end no sooner than its length says.
///
/// [`FrameHeader::decode`] checks, in this order: the magic, the version, that reserved is zero,
/// the length and the descriptor count. Each failure is its own [`FrameError`] variant, as is
/// each way a frame's descriptors or bytes can fail to match its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The message kind ([`MessageKind`](super::MessageKind) on an
    /// [`IpcChannel`](crate::IpcChannel); any on a [`Channel`](crate::Channel)).
    pub kind: u16,
    /// The payload's length in bytes.
    pub payload_len: usize,
    /// The number of file descriptors that come with the frame.
    pub fds: usize,
}

impl FrameHeader {
    /// The header's encoding. Encodes the fields as they are: a length or count beyond the
    /// limits gives bytes that [`decode`](Self::decode) rejects.
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let saturated = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[..VERSION_AT].copy_from_slice(&FRAME_MAGIC);
        h[VERSION_AT..KIND_AT].copy_from_slice(&FRAME_VERSION.to_le_bytes());
        h[KIND_AT..LEN_AT].copy_from_slice(&self.kind.to_le_bytes());
        h[LEN_AT..FDS_AT].copy_from_slice(&saturated(self.payload_len).to_le_bytes());
        h[FDS_AT..RESERVED_AT].copy_from_slice(&saturated(self.fds).to_le_bytes());
        h
    }

    /// Decodes and checks a header. Never panics, whatever the input.
    ///
    /// # Errors
    ///
    /// - The first check that failed: [`FrameError::Magic`], [`FrameError::UnsupportedVersion`],
    ///   [`FrameError::Reserved`], [`FrameError::PayloadTooLarge`] or [`FrameError::TooManyFds`].
    pub fn decode(h: &[u8; FRAME_HEADER_LEN]) -> Result<FrameHeader, FrameError> {
        let found = field(h, 0);
        if found != FRAME_MAGIC {
            return Err(FrameError::Magic { found });
        }
        let version = u16::from_le_bytes(field(h, VERSION_AT));
        if version != FRAME_VERSION {
            return Err(FrameError::UnsupportedVersion { found: version, supported: FRAME_VERSION });
        }
        let reserved = u32::from_le_bytes(field(h, RESERVED_AT));
        if reserved != 0 {
            return Err(FrameError::Reserved { found: reserved });
        }
        let payload_len = u32::from_le_bytes(field(h, LEN_AT)) as usize;
        if payload_len > MAX_PAYLOAD_LEN {
            return Err(FrameError::PayloadTooLarge { len: payload_len, max: MAX_PAYLOAD_LEN });
        }
        let fds = u32::from_le_bytes(field(h, FDS_AT)) as usize;
        if fds > MAX_FDS {
            return Err(FrameError::TooManyFds { count: fds, max: MAX_FDS });
        }
        Ok(FrameHeader { kind: u16::from_le_bytes(field(h, KIND_AT)), payload_len, fds })
    }
}

/// Why what arrived on a channel is not a frame: its header, or descriptors and bytes that do not
/// match it. The channel no longer finds message boundaries after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The header does not start with [`FRAME_MAGIC`].
    #[error(
        "a frame starts with {}, expected {}: the peer does not speak the cuda-mem-ipc channel protocol",
        Escaped(found),
        Escaped(&FRAME_MAGIC)
    )]
    Magic {
        /// The first 8 bytes of the header.
        found: [u8; 8],
    },
    /// The version is not [`FRAME_VERSION`].
    #[error("unsupported frame version {found}, expected {supported}")]
    UnsupportedVersion {
        /// The version in the header.
        found: u16,
        /// [`FRAME_VERSION`].
        supported: u16,
    },
    /// The reserved field is not zero.
    #[error("the frame header's reserved field is {found:#010x}, expected 0")]
    Reserved {
        /// The reserved field in the header.
        found: u32,
    },
    /// The header announces a payload beyond [`MAX_PAYLOAD_LEN`].
    #[error("a frame announces a payload of {len} bytes, more than the limit of {max}")]
    PayloadTooLarge {
        /// The length announced.
        len: usize,
        /// [`MAX_PAYLOAD_LEN`].
        max: usize,
    },
    /// The header announces more than [`MAX_FDS`] descriptors.
    #[error("a frame announces {count} file descriptors, more than the limit of {max}")]
    TooManyFds {
        /// The count announced.
        count: usize,
        /// [`MAX_FDS`].
        max: usize,
    },
    /// Another number of descriptors arrived with the frame than its header announced (refused
    /// as soon as one too many arrives).
    #[error("a frame announces {announced} file descriptor(s) but {arrived} arrived with it")]
    FdCount {
        /// The count the header announced.
        announced: usize,
        /// The descriptors that arrived (so far, when too many).
        arrived: usize,
    },
    /// More than [`MAX_FDS`] descriptors arrived before the header was complete.
    #[error("{arrived} file descriptors arrived before the frame's header was complete, more than the limit of {max}")]
    FdsBeforeHeader {
        /// The descriptors that arrived.
        arrived: usize,
        /// [`MAX_FDS`].
        max: usize,
    },
    /// The peer attached more control data than a frame may carry, and the system discarded the
    /// excess.
    #[error(
        "the peer attached more control data (file descriptors) than a frame may carry ({max} descriptors); the \
         excess was discarded by the system"
    )]
    ControlDataTruncated {
        /// [`MAX_FDS`].
        max: usize,
    },
    /// The peer closed the channel inside a frame's header.
    #[error("truncated frame: the peer closed the channel after {received} of the {len} header bytes")]
    TruncatedHeader {
        /// The header bytes received.
        received: usize,
        /// [`FRAME_HEADER_LEN`].
        len: usize,
    },
    /// The peer closed the channel inside a frame's payload.
    #[error("truncated frame: the peer closed the channel after {received} of {len} bytes")]
    Truncated {
        /// The frame's bytes received, its header included.
        received: usize,
        /// The frame's length, its header included.
        len: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_layout() {
        let h = FrameHeader { kind: 0x0102, payload_len: 0x0304_0506, fds: 7 }.encode();
        assert_eq!(&h[..8], b"CUMEMMSG");
        assert_eq!(&h[8..10], &[1, 0]);
        assert_eq!(&h[10..12], &[2, 1]);
        assert_eq!(&h[12..16], &[6, 5, 4, 3]);
        assert_eq!(&h[16..20], &[7, 0, 0, 0]);
        assert_eq!(&h[20..24], &[0; 4]);
    }

    #[test]
    fn encoding_is_stable() {
        // A golden encoding: changing the format must change FRAME_VERSION, not this test.
        let header = FrameHeader { kind: 2, payload_len: 112, fds: 1 };
        let golden = *b"CUMEMMSG\x01\x00\x02\x00\x70\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00";
        assert_eq!(header.encode(), golden);
        assert_eq!(FrameHeader::decode(&golden), Ok(header));
    }

    #[test]
    fn each_check_has_its_own_error() {
        let good = FrameHeader { kind: 9, payload_len: 10, fds: 2 }.encode();
        let with = |at: usize, value: &[u8]| {
            let mut h = good;
            h[at..at + value.len()].copy_from_slice(value);
            FrameHeader::decode(&h)
        };
        assert_eq!(with(0, b"GET / HT"), Err(FrameError::Magic { found: *b"GET / HT" }));
        assert_eq!(with(8, &[2]), Err(FrameError::UnsupportedVersion { found: 2, supported: 1 }));
        assert_eq!(with(23, &[1]), Err(FrameError::Reserved { found: 0x0100_0000 }));
        let over = (MAX_PAYLOAD_LEN as u32 + 1).to_le_bytes();
        assert_eq!(
            with(12, &over),
            Err(FrameError::PayloadTooLarge { len: MAX_PAYLOAD_LEN + 1, max: MAX_PAYLOAD_LEN })
        );
        assert_eq!(with(16, &[254]), Err(FrameError::TooManyFds { count: 254, max: MAX_FDS }));
        // Lengths beyond the limits encode to bytes that decoding refuses.
        let beyond = FrameHeader { kind: 1, payload_len: usize::MAX, fds: 0 }.encode();
        assert!(matches!(FrameHeader::decode(&beyond), Err(FrameError::PayloadTooLarge { .. })));
    }

    #[test]
    fn error_messages_say_what_came_and_what_was_expected() {
        let cases = [
            (FrameError::Magic { found: *b"GET / HT" }, r#"a frame starts with b"GET / HT", expected b"CUMEMMSG""#),
            (FrameError::UnsupportedVersion { found: 2, supported: 1 }, "unsupported frame version 2, expected 1"),
            (FrameError::Reserved { found: 0x0100_0000 }, "reserved field is 0x01000000, expected 0"),
            (
                FrameError::PayloadTooLarge { len: MAX_PAYLOAD_LEN + 1, max: MAX_PAYLOAD_LEN },
                "payload of 16777217 bytes, more than the limit of 16777216",
            ),
            (FrameError::TooManyFds { count: 254, max: 253 }, "254 file descriptors, more than the limit of 253"),
            (FrameError::FdCount { announced: 2, arrived: 5 }, "announces 2 file descriptor(s) but 5 arrived"),
            (
                FrameError::FdsBeforeHeader { arrived: 400, max: 253 },
                "400 file descriptors arrived before the frame's header was complete",
            ),
            (FrameError::ControlDataTruncated { max: 253 }, "more control data"),
            (FrameError::TruncatedHeader { received: 10, len: 24 }, "after 10 of the 24 header bytes"),
            (FrameError::Truncated { received: 34, len: 124 }, "after 34 of 124 bytes"),
        ];
        for (error, needle) in cases {
            let text = error.to_string();
            assert!(text.contains(needle), "{text:?} should contain {needle:?}");
        }
    }

    proptest! {
        /// Whatever the bytes: a header or an error, never a panic; a header re-encodes to them.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn decode_never_panics(tail in proptest::array::uniform16(any::<u8>()), magic in any::<bool>()) {
            let mut h = [0u8; FRAME_HEADER_LEN];
            h[..8].copy_from_slice(if magic { &FRAME_MAGIC } else { b"CUMEMMSX" });
            h[8..].copy_from_slice(&tail);
            if let Ok(header) = FrameHeader::decode(&h) {
                prop_assert_eq!(header.encode(), h);
            }
        }
    }
}
