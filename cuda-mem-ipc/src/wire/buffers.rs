//! The buffers message: a count, then buffer descriptors, after an event descriptor in a
//! buffers-after-event message (layouts: [`MessageKind::Buffers`](super::MessageKind::Buffers),
//! [`MessageKind::BuffersAfterEvent`](super::MessageKind::BuffersAfterEvent)).
//!
//! The count and the length are checked here; each descriptor is its own codec's.

use super::buffer_descriptor::{BUFFER_DESCRIPTOR_LEN, BufferDescriptor};
use super::event_descriptor::EVENT_DESCRIPTOR_LEN;

/// The most buffers one message may carry.
pub const MAX_BUFFERS_PER_MESSAGE: usize = 65_536;

const COUNT_LEN: usize = 4;

// The largest message fits a frame.
const _: () = assert!(
    EVENT_DESCRIPTOR_LEN + COUNT_LEN + MAX_BUFFERS_PER_MESSAGE * BUFFER_DESCRIPTOR_LEN <= super::MAX_PAYLOAD_LEN
);

/// Appends a buffers message's payload for `descriptors` (at most [`MAX_BUFFERS_PER_MESSAGE`],
/// which the caller checked) to `payload`.
pub(crate) fn encode_buffers(payload: &mut Vec<u8>, descriptors: &[BufferDescriptor]) {
    let count = u32::try_from(descriptors.len()).unwrap_or(u32::MAX);
    payload.reserve(COUNT_LEN + descriptors.len() * BUFFER_DESCRIPTOR_LEN);
    payload.extend_from_slice(&count.to_le_bytes());
    for descriptor in descriptors {
        payload.extend_from_slice(&descriptor.encode());
    }
}

/// The encoded descriptors of a buffers message's payload, once its count and length check
/// out (each is still to decode).
pub(crate) fn buffer_descriptors(payload: &[u8]) -> Result<std::slice::ChunksExact<'_, u8>, BuffersMessageError> {
    let Some((count, descriptors)) = payload.split_first_chunk::<COUNT_LEN>() else {
        return Err(BuffersMessageError::NoCount { found: payload.len() });
    };
    let count = u32::from_le_bytes(*count) as usize;
    if count > MAX_BUFFERS_PER_MESSAGE {
        return Err(BuffersMessageError::TooManyBuffers { count, max: MAX_BUFFERS_PER_MESSAGE });
    }
    let expected = COUNT_LEN + count * BUFFER_DESCRIPTOR_LEN;
    if payload.len() != expected {
        return Err(BuffersMessageError::Length { count, expected, found: payload.len() });
    }
    Ok(descriptors.chunks_exact(BUFFER_DESCRIPTOR_LEN))
}

/// A buffers-after-event payload's encoded event descriptor, and the buffers message's payload
/// after it.
pub(crate) fn split_event(payload: &[u8]) -> Result<(&[u8], &[u8]), BuffersMessageError> {
    if payload.len() < EVENT_DESCRIPTOR_LEN {
        return Err(BuffersMessageError::NoEvent { found: payload.len(), min: EVENT_DESCRIPTOR_LEN });
    }
    Ok(payload.split_at(EVENT_DESCRIPTOR_LEN))
}

/// Why a buffers message's count and length do not add up (each descriptor's own checks are
/// [`BufferDescriptorError`](super::BufferDescriptorError)s).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuffersMessageError {
    /// The payload is shorter than its count.
    #[error("a buffers message shorter than its count ({found} bytes, at least 4 expected)")]
    NoCount {
        /// The payload's length.
        found: usize,
    },
    /// The count is beyond [`MAX_BUFFERS_PER_MESSAGE`].
    #[error("a buffers message for {count} buffers; the most one message may carry is {max}")]
    TooManyBuffers {
        /// The count in the payload.
        count: usize,
        /// [`MAX_BUFFERS_PER_MESSAGE`].
        max: usize,
    },
    /// The length is not the count's.
    #[error("a buffers message for {count} buffers must have {expected} bytes; it has {found}")]
    Length {
        /// The count in the payload.
        count: usize,
        /// The length that count needs.
        expected: usize,
        /// The payload's length.
        found: usize,
    },
    /// A buffers-after-event payload is shorter than the event descriptor it starts with.
    #[error("a buffers-after-event message shorter than its event descriptor ({found} bytes, at least {min} expected)")]
    NoEvent {
        /// The payload's length.
        found: usize,
        /// [`EVENT_DESCRIPTOR_LEN`](super::EVENT_DESCRIPTOR_LEN).
        min: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EventDescriptor;
    use cuda_mem_core::IpcEventHandle;

    fn descriptor(byte: u8) -> BufferDescriptor {
        BufferDescriptor::new([byte; 64], 4096, uuid::Uuid::from_u128(7)).unwrap()
    }

    #[test]
    fn encoding_is_stable() {
        // Golden encodings: changing the format must change FRAME_VERSION, not this test.
        let (first, second) = (descriptor(1), descriptor(2));
        let mut payload = Vec::new();
        encode_buffers(&mut payload, &[first, second]);
        let golden = [&2u32.to_le_bytes()[..], &first.encode(), &second.encode()].concat();
        assert_eq!(payload, golden);
        let decoded: Vec<_> = buffer_descriptors(&payload).unwrap().map(BufferDescriptor::decode).collect();
        assert_eq!(decoded, [Ok(first), Ok(second)]);

        let mut empty = Vec::new();
        encode_buffers(&mut empty, &[]);
        assert_eq!(empty, [0, 0, 0, 0]);
        assert_eq!(buffer_descriptors(&empty).unwrap().count(), 0);

        // After an event: its descriptor, then the same.
        let event = EventDescriptor { id: 3, handle: IpcEventHandle::from_bytes([9; 64]) }.encode();
        let mut after = event.to_vec();
        encode_buffers(&mut after, &[first]);
        let (head, rest) = split_event(&after).unwrap();
        assert_eq!(head, event);
        assert_eq!(rest, [&1u32.to_le_bytes()[..], &first.encode()].concat());
    }

    #[test]
    fn each_check_has_its_own_error() {
        use BuffersMessageError as E;
        assert_eq!(buffer_descriptors(&[1, 0, 0]).err(), Some(E::NoCount { found: 3 }));
        assert_eq!(
            buffer_descriptors(&u32::MAX.to_le_bytes()).err(),
            Some(E::TooManyBuffers { count: u32::MAX as usize, max: MAX_BUFFERS_PER_MESSAGE })
        );
        let three_and_garbage = [&3u32.to_le_bytes()[..], &[0xAB; 50]].concat();
        assert_eq!(
            buffer_descriptors(&three_and_garbage).err(),
            Some(E::Length { count: 3, expected: 328, found: 54 })
        );
        let one_and_a_byte = [&1u32.to_le_bytes()[..], &[0; 109]].concat();
        assert_eq!(buffer_descriptors(&one_and_a_byte).err(), Some(E::Length { count: 1, expected: 112, found: 113 }));
        assert_eq!(split_event(&[0; 91]).err(), Some(E::NoEvent { found: 91, min: 92 }));
    }

    #[test]
    fn error_messages_say_what_came() {
        let cases = [
            (BuffersMessageError::NoCount { found: 3 }, "shorter than its count"),
            (BuffersMessageError::TooManyBuffers { count: 70_000, max: 65_536 }, "for 70000 buffers; the most"),
            (BuffersMessageError::Length { count: 3, expected: 328, found: 54 }, "for 3 buffers must have 328 bytes"),
            (BuffersMessageError::NoEvent { found: 10, min: 92 }, "shorter than its event descriptor (10 bytes"),
        ];
        for (error, needle) in cases {
            let text = error.to_string();
            assert!(text.contains(needle), "{text:?} should contain {needle:?}");
        }
    }
}
