//! The event descriptor: what one process sends another so that its streams can wait for work
//! the first one recorded.
//!
//! Documented on [`EventDescriptor`]: its encoding and what decoding checks.

use std::fmt;

use cuda_mem_core::{Event, IPC_EVENT_HANDLE_LEN, IpcEventHandle};

use super::envelope::{self, CHECKSUM_LEN, EnvelopeError, HEADER_LEN, field};

/// The length in bytes of an encoded [`EventDescriptor`].
pub const EVENT_DESCRIPTOR_LEN: usize = 92;

/// The first 8 bytes of every encoded event descriptor.
pub const EVENT_DESCRIPTOR_MAGIC: [u8; 8] = *b"CUMEMEVT";

/// The event descriptor encoding version written by [`EventDescriptor::encode`], the only one
/// decoded.
pub const EVENT_DESCRIPTOR_VERSION: u16 = 1;

const ID_AT: usize = 16;
const HANDLE_AT: usize = 24;
const CHECKSUM_AT: usize = 88;

const _: () = assert!(HEADER_LEN == ID_AT);
const _: () = assert!(HANDLE_AT + IPC_EVENT_HANDLE_LEN == CHECKSUM_AT);
const _: () = assert!(CHECKSUM_AT + CHECKSUM_LEN == EVENT_DESCRIPTOR_LEN);

/// Why bytes are not a valid encoded [`EventDescriptor`] (or why
/// [`EventDescriptor::validate`] refused one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventDescriptorError {
    /// The input is not exactly [`EVENT_DESCRIPTOR_LEN`] bytes.
    #[error("{found} bytes, expected exactly {expected}")]
    Length {
        /// [`EVENT_DESCRIPTOR_LEN`].
        expected: usize,
        /// The input's length.
        found: usize,
    },
    /// The magic ([`EVENT_DESCRIPTOR_MAGIC`]), version ([`EVENT_DESCRIPTOR_VERSION`]), checksum,
    /// flags or reserved field is wrong.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The event id is zero.
    #[error("event id is 0, expected the exporting process's nonzero id of the event")]
    NoEventId,
    /// The handle is all zeros, which names no event.
    #[error("event handle is all zeros, expected the driver's handle of an interprocess event")]
    EmptyHandle,
}

/// What a process needs to open an interprocess event of another process, and to know it again
/// when it arrives again.
///
/// The event is named twice: by the driver's handle (`CUipcEventHandle`, which the receiver
/// opens) and by the exporting process's [`Event::id`], a number that process never gives
/// another event. A receiver keeps what it opened by that id ([`IpcChannel`](crate::IpcChannel)
/// does, per channel), because the driver may give a new event the handle of a destroyed one:
/// the id tells the two apart, the handle would not.
///
/// # Encoding
///
/// [`EventDescriptor::encode`] writes exactly [`EVENT_DESCRIPTOR_LEN`] (92) bytes; integers are
/// little-endian. The envelope (magic, version, flags, reserved, checksum) is that of a
/// [`BufferDescriptor`](super::BufferDescriptor), with its own magic and version ([`EnvelopeError`]).
///
/// | offset | length | field    | value                                                        |
/// |-------:|-------:|----------|--------------------------------------------------------------|
/// |      0 |      8 | magic    | `b"CUMEMEVT"` ([`EVENT_DESCRIPTOR_MAGIC`])                              |
/// |      8 |      2 | version  | `1` ([`EVENT_DESCRIPTOR_VERSION`]), `u16`                               |
/// |     10 |      2 | flags    | `0`, `u16`: reserved for future versions                     |
/// |     12 |      4 | reserved | `0`, `u32`                                                   |
/// |     16 |      8 | id       | the exporter's id of the event, `u64`, not zero              |
/// |     24 |     64 | handle   | the driver's `CUipcEventHandle`, opaque, not all zeros       |
/// |     88 |      4 | checksum | CRC-32 (IEEE 802.3, as zlib's `crc32`) of bytes 0..88, `u32` |
///
/// [`EventDescriptor::decode`] checks, in this order and before any driver call: the exact
/// length, the magic, the version, the checksum, that flags and reserved are zero, that the id
/// is not zero and that the handle is not all zeros. Each failure is its own [`EventDescriptorError`]
/// variant. Whether the handle names a live event only the driver can say, when the receiver
/// opens it.
#[doc(alias = "IPCEventDescriptor")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventDescriptor {
    /// The exporting process's [`Event::id`] of the event.
    pub id: u64,
    /// The driver's handle of the event.
    pub handle: IpcEventHandle,
}

impl fmt::Debug for EventDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventDescriptor").field("id", &self.id).field("handle", &self.handle).finish()
    }
}

impl EventDescriptor {
    /// The descriptor of an interprocess event of this process (its handle is asked of the
    /// driver once, see [`Event::ipc_handle`]).
    ///
    /// # Errors
    ///
    /// - [`cuda_mem_core::Error::EventNotInterprocess`]: `event` was created without
    ///   [`EventOptions::interprocess`](cuda_mem_core::EventOptions::interprocess).
    /// - Another [`cuda_mem_core::Error`]: the driver call failed.
    pub fn of(event: &Event) -> cuda_mem_core::Result<EventDescriptor> {
        Ok(EventDescriptor { id: event.id(), handle: event.ipc_handle()? })
    }

    /// Checks what [`decode`](Self::decode) checks of the fields: the id and the handle.
    ///
    /// # Errors
    ///
    /// - [`EventDescriptorError::NoEventId`]: the id is 0.
    /// - [`EventDescriptorError::EmptyHandle`]: the handle is all zeros.
    pub fn validate(&self) -> Result<(), EventDescriptorError> {
        if self.id == 0 {
            return Err(EventDescriptorError::NoEventId);
        }
        if self.handle.as_bytes().iter().all(|&b| b == 0) {
            return Err(EventDescriptorError::EmptyHandle);
        }
        Ok(())
    }

    /// The descriptor's fixed-size encoding (see [`EventDescriptor`], *Encoding*).
    pub fn encode(&self) -> [u8; EVENT_DESCRIPTOR_LEN] {
        let mut out = [0u8; EVENT_DESCRIPTOR_LEN];
        out[..HEADER_LEN].copy_from_slice(&envelope::header(EVENT_DESCRIPTOR_MAGIC, EVENT_DESCRIPTOR_VERSION));
        out[ID_AT..HANDLE_AT].copy_from_slice(&self.id.to_le_bytes());
        out[HANDLE_AT..CHECKSUM_AT].copy_from_slice(self.handle.as_bytes());
        envelope::seal(&mut out);
        out
    }

    /// Decodes and validates an encoded descriptor. Never panics, whatever the input.
    ///
    /// # Errors
    ///
    /// - An [`EventDescriptorError`] naming the first check that failed (see [`EventDescriptor`],
    ///   *Encoding*, for the order).
    pub fn decode(bytes: &[u8]) -> Result<EventDescriptor, EventDescriptorError> {
        let bytes: &[u8; EVENT_DESCRIPTOR_LEN] = bytes
            .try_into()
            .map_err(|_| EventDescriptorError::Length { expected: EVENT_DESCRIPTOR_LEN, found: bytes.len() })?;
        envelope::check(bytes, EVENT_DESCRIPTOR_MAGIC, EVENT_DESCRIPTOR_VERSION)?;
        let descriptor = EventDescriptor {
            id: u64::from_le_bytes(field(bytes, ID_AT)),
            handle: IpcEventHandle::from_bytes(field(bytes, HANDLE_AT)),
        };
        descriptor.validate()?;
        Ok(descriptor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> EventDescriptor {
        let mut handle = [0u8; IPC_EVENT_HANDLE_LEN];
        for (i, b) in handle.iter_mut().enumerate() {
            *b = i as u8 ^ 0x5A;
        }
        EventDescriptor { id: 0x0102_0304_0506_0708, handle: IpcEventHandle::from_bytes(handle) }
    }

    fn reseal(bytes: &mut [u8; EVENT_DESCRIPTOR_LEN]) {
        envelope::seal(bytes);
    }

    fn envelope_error(error: EnvelopeError) -> EventDescriptorError {
        EventDescriptorError::Envelope(error)
    }

    #[test]
    fn encoding_is_stable() {
        // A golden encoding: changing the format must change EVENT_DESCRIPTOR_VERSION, not this test.
        let d = EventDescriptor { id: 3, handle: IpcEventHandle::from_bytes([9; 64]) };
        let mut expected = Vec::new();
        expected.extend_from_slice(b"CUMEMEVT\x01\x00\x00\x00\x00\x00\x00\x00");
        expected.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&[9; 64]);
        // The CRC-32 of those 88 bytes, as zlib computes it.
        expected.extend_from_slice(&0xe55a_3724u32.to_le_bytes());
        assert_eq!(d.encode().as_slice(), expected.as_slice());
        assert_eq!(EventDescriptor::decode(&expected), Ok(d));
    }

    #[test]
    fn each_check_has_its_own_error() {
        let good = sample().encode();
        assert_eq!(EventDescriptor::decode(&good), Ok(sample()));
        assert_eq!(EventDescriptor::decode(&good[..91]), Err(EventDescriptorError::Length { expected: 92, found: 91 }));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(
            EventDescriptor::decode(&b),
            Err(envelope_error(EnvelopeError::Magic { found: *b"XUMEMEVT", expected: EVENT_DESCRIPTOR_MAGIC }))
        );
        // A buffer descriptor's magic is not an event's.
        let mut b = good;
        b[..8].copy_from_slice(b"CUMEMBUF");
        assert!(matches!(
            EventDescriptor::decode(&b),
            Err(EventDescriptorError::Envelope(EnvelopeError::Magic { .. }))
        ));
        let mut b = good;
        b[8] = 2;
        reseal(&mut b);
        assert_eq!(
            EventDescriptor::decode(&b),
            Err(envelope_error(EnvelopeError::UnsupportedVersion { found: 2, supported: 1 }))
        );
        let mut b = good;
        b[40] ^= 1;
        assert!(matches!(
            EventDescriptor::decode(&b),
            Err(EventDescriptorError::Envelope(EnvelopeError::Checksum { .. }))
        ));
        let mut b = good;
        b[11] = 1;
        reseal(&mut b);
        assert_eq!(EventDescriptor::decode(&b), Err(envelope_error(EnvelopeError::Flags { found: 0x100 })));
        let mut b = good;
        b[12] = 1;
        reseal(&mut b);
        assert_eq!(EventDescriptor::decode(&b), Err(envelope_error(EnvelopeError::Reserved { found: 1 })));
        let mut b = good;
        b[ID_AT..HANDLE_AT].fill(0);
        reseal(&mut b);
        assert_eq!(EventDescriptor::decode(&b), Err(EventDescriptorError::NoEventId));
        let mut b = good;
        b[HANDLE_AT..CHECKSUM_AT].fill(0);
        reseal(&mut b);
        assert_eq!(EventDescriptor::decode(&b), Err(EventDescriptorError::EmptyHandle));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        #[cfg_attr(miri, ignore)]
        fn round_trips_and_any_single_byte_change_is_rejected(
            id in 1..=u64::MAX,
            handle in proptest::array::uniform32(1..=255u8),
            at in 0..EVENT_DESCRIPTOR_LEN,
            xor in 1..=255u8,
        ) {
            let mut bytes = [0u8; IPC_EVENT_HANDLE_LEN];
            bytes[..32].copy_from_slice(&handle);
            let d = EventDescriptor { id, handle: IpcEventHandle::from_bytes(bytes) };
            let mut e = d.encode();
            prop_assert_eq!(EventDescriptor::decode(&e), Ok(d));
            e[at] ^= xor;
            prop_assert!(EventDescriptor::decode(&e).is_err(), "byte {} ^ {:#x} accepted", at, xor);
        }

        #[test]
        #[cfg_attr(miri, ignore)]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = EventDescriptor::decode(&bytes);
        }
    }
}
