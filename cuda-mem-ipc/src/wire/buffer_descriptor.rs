//! The buffer descriptor: what one process sends another so that it can import a buffer.
//!
//! Documented on [`BufferDescriptor`]: its encoding and what decoding checks.

use std::fmt;

use cuda_mem_core::EXPORT_DATA_LEN;

use super::envelope::{self, CHECKSUM_LEN, EnvelopeError, HEADER_LEN, field};

/// The length in bytes of an encoded [`BufferDescriptor`].
pub const BUFFER_DESCRIPTOR_LEN: usize = 108;

/// The first 8 bytes of every encoded [`BufferDescriptor`].
pub const BUFFER_DESCRIPTOR_MAGIC: [u8; 8] = *b"CUMEMBUF";

/// The encoding version written by [`BufferDescriptor::encode`], the only one decoded.
pub const BUFFER_DESCRIPTOR_VERSION: u16 = 1;

/// The largest buffer size a descriptor may carry: 2⁴⁸ bytes (256 TiB), beyond any device's
/// address space.
pub const MAX_BUFFER_SIZE: u64 = 1 << 48;

const SIZE_AT: usize = 16;
const RESOURCE_AT: usize = 24;
const EXPORT_DATA_AT: usize = 40;
const CHECKSUM_AT: usize = 104;

// The layout above is fixed at 64 bytes of export data, whatever the driver headers say.
const _: () = assert!(EXPORT_DATA_LEN == 64);
const _: () = assert!(HEADER_LEN == SIZE_AT);
const _: () = assert!(EXPORT_DATA_AT + EXPORT_DATA_LEN == CHECKSUM_AT);
const _: () = assert!(CHECKSUM_AT + CHECKSUM_LEN == BUFFER_DESCRIPTOR_LEN);

/// Why bytes are not a valid encoded [`BufferDescriptor`] (or why [`BufferDescriptor::new`] or
/// [`BufferDescriptor::validate`] refused it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BufferDescriptorError {
    /// The input is not exactly [`BUFFER_DESCRIPTOR_LEN`] bytes.
    #[error("{found} bytes, expected exactly {expected}")]
    Length {
        /// [`BUFFER_DESCRIPTOR_LEN`].
        expected: usize,
        /// The input's length.
        found: usize,
    },
    /// The magic ([`BUFFER_DESCRIPTOR_MAGIC`]), version ([`BUFFER_DESCRIPTOR_VERSION`]),
    /// checksum, flags or reserved field is wrong.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The buffer size is zero.
    #[error("buffer size is 0, expected 1 to {max} bytes")]
    ZeroSize {
        /// [`MAX_BUFFER_SIZE`].
        max: u64,
    },
    /// The buffer size is beyond [`MAX_BUFFER_SIZE`].
    #[error("buffer size is {size} bytes, more than the maximum of {max}")]
    SizeTooLarge {
        /// The size in the input.
        size: u64,
        /// [`MAX_BUFFER_SIZE`].
        max: u64,
    },
    /// The resource UUID is nil.
    #[error("resource UUID is nil, expected the exporting resource's UUID")]
    NilResource,
}

/// What a process needs to import one buffer of a pool it has already imported.
///
/// A descriptor from [`BufferDescriptor::decode`] or [`BufferDescriptor::new`] is valid: its
/// size is in `1..=MAX_BUFFER_SIZE` and its resource UUID is not nil. The fields are public, so
/// one built field by field may not be; [`validate`](Self::validate) checks, and such a
/// descriptor encodes to bytes that [`decode`](Self::decode) rejects.
///
/// A buffer allocated from an IPC-enabled pool is shared in two steps: the pool itself is
/// shared once (as a file descriptor, see the crate docs), then each buffer is shared as a
/// [`BufferDescriptor`]: the driver's 64-byte `CUmemPoolPtrExportData` for the allocation, the
/// buffer's size, and the UUID of the exporting memory resource, which tells the importer which
/// of its imported pools the buffer belongs to.
///
/// # Encoding
///
/// [`BufferDescriptor::encode`] writes exactly [`BUFFER_DESCRIPTOR_LEN`] (108) bytes; integers are
/// little-endian.
///
/// | offset | length | field         | value                                                   |
/// |-------:|-------:|---------------|---------------------------------------------------------|
/// |      0 |      8 | magic         | `b"CUMEMBUF"` ([`BUFFER_DESCRIPTOR_MAGIC`])                               |
/// |      8 |      2 | version       | `1` ([`BUFFER_DESCRIPTOR_VERSION`]), `u16`                                |
/// |     10 |      2 | flags         | `0`, `u16`: reserved for future versions                |
/// |     12 |      4 | reserved      | `0`, `u32`                                              |
/// |     16 |      8 | size          | buffer size in bytes, `u64`, `1..=`[`MAX_BUFFER_SIZE`]  |
/// |     24 |     16 | resource      | UUID of the exporting resource (RFC 9562 byte order), not nil |
/// |     40 |     64 | export data   | the driver's `CUmemPoolPtrExportData`, opaque           |
/// |    104 |      4 | checksum      | CRC-32 (IEEE 802.3, as zlib's `crc32`) of bytes 0..104, `u32` |
///
/// [`BufferDescriptor::decode`] checks, in this order and before any driver call: the exact
/// length, the magic, the version (an unknown one is reported as such, so that a newer peer is
/// recognized), the checksum, that flags and reserved are zero, that the size is in range and
/// that the UUID is not nil. Each failure is its own [`BufferDescriptorError`] variant. Because the
/// checksum covers every other byte, any change of a single byte (indeed any burst of up to 32
/// changed bits) of a valid encoding is rejected.
///
/// The first 16 bytes (magic, version, flags, reserved) and the trailing CRC-32 are the envelope
/// every descriptor shares, checked by one function ([`EnvelopeError`]).
///
/// The checksum detects damage, not forgery: a peer can compute it too. What decoding cannot
/// establish is described in the crate documentation's trust boundary.
#[doc(alias = "IPCBufferDescriptor")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferDescriptor {
    /// The driver's `CUmemPoolPtrExportData` for the allocation: opaque bytes.
    pub export_data: [u8; EXPORT_DATA_LEN],
    /// The buffer's size in bytes.
    pub size: u64,
    /// The UUID of the memory resource the buffer was allocated from.
    pub resource: uuid::Uuid,
}

impl fmt::Debug for BufferDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Hex<'a>(&'a [u8]);
        impl fmt::Debug for Hex<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }
        f.debug_struct("BufferDescriptor")
            .field("size", &self.size)
            .field("resource", &self.resource)
            .field("export_data", &Hex(&self.export_data))
            .finish()
    }
}

impl BufferDescriptor {
    /// A descriptor for a buffer of `size` bytes from the resource `resource`, with the driver's
    /// export data.
    ///
    /// # Errors
    ///
    /// - As [`validate`](Self::validate).
    pub fn new(
        export_data: [u8; EXPORT_DATA_LEN],
        size: u64,
        resource: uuid::Uuid,
    ) -> Result<Self, BufferDescriptorError> {
        let descriptor = Self { export_data, size, resource };
        descriptor.validate()?;
        Ok(descriptor)
    }

    /// Checks what [`decode`](Self::decode) checks of the fields: the size and the UUID.
    ///
    /// # Errors
    ///
    /// - [`BufferDescriptorError::ZeroSize`]: the size is 0.
    /// - [`BufferDescriptorError::SizeTooLarge`]: the size is beyond [`MAX_BUFFER_SIZE`].
    /// - [`BufferDescriptorError::NilResource`]: the UUID is nil.
    pub fn validate(&self) -> Result<(), BufferDescriptorError> {
        check_size(self.size)?;
        if self.resource.is_nil() {
            return Err(BufferDescriptorError::NilResource);
        }
        Ok(())
    }

    /// The descriptor's fixed-size encoding (see [`BufferDescriptor`], *Encoding*).
    ///
    /// Encodes the fields as they are: an invalid descriptor (see
    /// [`validate`](Self::validate)) gives bytes that [`decode`](Self::decode) rejects.
    pub fn encode(&self) -> [u8; BUFFER_DESCRIPTOR_LEN] {
        let mut out = [0u8; BUFFER_DESCRIPTOR_LEN];
        out[..HEADER_LEN].copy_from_slice(&envelope::header(BUFFER_DESCRIPTOR_MAGIC, BUFFER_DESCRIPTOR_VERSION));
        out[SIZE_AT..RESOURCE_AT].copy_from_slice(&self.size.to_le_bytes());
        out[RESOURCE_AT..EXPORT_DATA_AT].copy_from_slice(self.resource.as_bytes());
        out[EXPORT_DATA_AT..CHECKSUM_AT].copy_from_slice(&self.export_data);
        envelope::seal(&mut out);
        out
    }

    /// Decodes and validates an encoded descriptor.
    ///
    /// Never panics, whatever the input.
    ///
    /// # Errors
    ///
    /// - A [`BufferDescriptorError`] naming the first check that failed (see [`BufferDescriptor`],
    ///   *Encoding*, for the order).
    pub fn decode(bytes: &[u8]) -> Result<Self, BufferDescriptorError> {
        let bytes: &[u8; BUFFER_DESCRIPTOR_LEN] = bytes
            .try_into()
            .map_err(|_| BufferDescriptorError::Length { expected: BUFFER_DESCRIPTOR_LEN, found: bytes.len() })?;
        envelope::check(bytes, BUFFER_DESCRIPTOR_MAGIC, BUFFER_DESCRIPTOR_VERSION)?;
        let size = u64::from_le_bytes(field(bytes, SIZE_AT));
        let resource = uuid::Uuid::from_bytes(field(bytes, RESOURCE_AT));
        Self::new(field(bytes, EXPORT_DATA_AT), size, resource)
    }
}

impl TryFrom<&[u8]> for BufferDescriptor {
    type Error = BufferDescriptorError;

    fn try_from(bytes: &[u8]) -> Result<Self, BufferDescriptorError> {
        Self::decode(bytes)
    }
}

fn check_size(size: u64) -> Result<(), BufferDescriptorError> {
    if size == 0 {
        Err(BufferDescriptorError::ZeroSize { max: MAX_BUFFER_SIZE })
    } else if size > MAX_BUFFER_SIZE {
        Err(BufferDescriptorError::SizeTooLarge { size, max: MAX_BUFFER_SIZE })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::crc32;
    use proptest::prelude::*;

    fn sample() -> BufferDescriptor {
        let mut export = [0u8; EXPORT_DATA_LEN];
        for (i, b) in export.iter_mut().enumerate() {
            *b = i as u8 ^ 0xA5;
        }
        BufferDescriptor::new(export, 4096, uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677)).unwrap()
    }

    fn envelope_error(error: EnvelopeError) -> BufferDescriptorError {
        BufferDescriptorError::Envelope(error)
    }

    /// Re-seals `bytes` with a correct checksum after a deliberate change.
    fn reseal(bytes: &mut [u8; BUFFER_DESCRIPTOR_LEN]) {
        envelope::seal(bytes);
    }

    #[test]
    fn encoding_has_the_documented_layout() {
        let d = sample();
        let e = d.encode();
        assert_eq!(e.len(), 108);
        assert_eq!(&e[0..8], b"CUMEMBUF");
        assert_eq!(&e[8..10], &[1, 0]);
        assert_eq!(&e[10..16], &[0; 6]);
        assert_eq!(&e[16..24], &4096u64.to_le_bytes());
        assert_eq!(&e[24..40], d.resource.as_bytes());
        assert_eq!(&e[40..104], &d.export_data);
        assert_eq!(&e[104..108], &crc32(&e[..104]).to_le_bytes());
    }

    #[test]
    fn encoding_is_stable() {
        // A golden encoding: changing the format must change BUFFER_DESCRIPTOR_VERSION, not this test.
        let d = BufferDescriptor::new([7; 64], 1 << 20, uuid::Uuid::from_u128(1)).unwrap();
        let e = d.encode();
        let mut expected = Vec::new();
        expected.extend_from_slice(b"CUMEMBUF\x01\x00\x00\x00\x00\x00\x00\x00");
        expected.extend_from_slice(&[0, 0, 0x10, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&[0; 15]);
        expected.push(1);
        expected.extend_from_slice(&[7; 64]);
        // The CRC-32 of those 104 bytes, as zlib computes it.
        expected.extend_from_slice(&0xad2b_a57bu32.to_le_bytes());
        assert_eq!(e.as_slice(), expected.as_slice());
    }

    #[test]
    fn new_enforces_the_invariants() {
        let id = uuid::Uuid::from_u128(9);
        assert_eq!(
            BufferDescriptor::new([0; 64], 0, id),
            Err(BufferDescriptorError::ZeroSize { max: MAX_BUFFER_SIZE })
        );
        assert_eq!(
            BufferDescriptor::new([0; 64], MAX_BUFFER_SIZE + 1, id),
            Err(BufferDescriptorError::SizeTooLarge { size: MAX_BUFFER_SIZE + 1, max: MAX_BUFFER_SIZE })
        );
        assert_eq!(BufferDescriptor::new([0; 64], 1, uuid::Uuid::nil()), Err(BufferDescriptorError::NilResource));
        assert!(BufferDescriptor::new([0; 64], MAX_BUFFER_SIZE, id).is_ok());
        assert!(BufferDescriptor::new([0; 64], 1, id).is_ok());
    }

    #[test]
    fn invalid_field_values_encode_to_rejected_bytes() {
        let mut d = sample();
        d.size = 0;
        assert!(matches!(d.validate(), Err(BufferDescriptorError::ZeroSize { .. })));
        assert!(matches!(BufferDescriptor::decode(&d.encode()), Err(BufferDescriptorError::ZeroSize { .. })));
        let mut d = sample();
        d.resource = uuid::Uuid::nil();
        assert_eq!(d.validate(), Err(BufferDescriptorError::NilResource));
        assert_eq!(BufferDescriptor::decode(&d.encode()), Err(BufferDescriptorError::NilResource));
        assert_eq!(sample().validate(), Ok(()));
    }

    #[test]
    fn each_check_has_its_own_error() {
        let good = sample().encode();
        assert_eq!(BufferDescriptor::decode(&good), Ok(sample()));
        assert_eq!(BufferDescriptor::try_from(&good[..]), Ok(sample()));

        assert_eq!(
            BufferDescriptor::decode(&good[..107]),
            Err(BufferDescriptorError::Length { expected: 108, found: 107 })
        );
        assert_eq!(BufferDescriptor::decode(&[]), Err(BufferDescriptorError::Length { expected: 108, found: 0 }));

        let mut b = good;
        b[0] = b'X';
        assert_eq!(
            BufferDescriptor::decode(&b),
            Err(envelope_error(EnvelopeError::Magic { found: *b"XUMEMBUF", expected: BUFFER_DESCRIPTOR_MAGIC }))
        );

        let mut b = good;
        b[8..10].copy_from_slice(&2u16.to_le_bytes());
        reseal(&mut b);
        assert_eq!(
            BufferDescriptor::decode(&b),
            Err(envelope_error(EnvelopeError::UnsupportedVersion { found: 2, supported: 1 }))
        );

        let mut b = good;
        b[50] ^= 1;
        let computed = crc32(&b[..104]);
        let stored = u32::from_le_bytes(good[104..].try_into().unwrap());
        assert_eq!(BufferDescriptor::decode(&b), Err(envelope_error(EnvelopeError::Checksum { stored, computed })));

        let mut b = good;
        b[10] = 1;
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(envelope_error(EnvelopeError::Flags { found: 1 })));

        let mut b = good;
        b[15] = 0x80;
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(envelope_error(EnvelopeError::Reserved { found: 0x8000_0000 })));

        let mut b = good;
        b[16..24].copy_from_slice(&0u64.to_le_bytes());
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(BufferDescriptorError::ZeroSize { max: MAX_BUFFER_SIZE }));

        let mut b = good;
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut b);
        assert_eq!(
            BufferDescriptor::decode(&b),
            Err(BufferDescriptorError::SizeTooLarge { size: u64::MAX, max: MAX_BUFFER_SIZE })
        );

        let mut b = good;
        b[24..40].fill(0);
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(BufferDescriptorError::NilResource));
    }

    #[test]
    fn error_messages_name_the_expected_value() {
        let cases = [
            (BufferDescriptorError::Length { expected: 108, found: 3 }, "3 bytes, expected exactly 108"),
            (
                // Transparent: the envelope's own message.
                BufferDescriptorError::Envelope(EnvelopeError::Flags { found: 2 }),
                "flags are 0x0002, expected 0",
            ),
            (
                BufferDescriptorError::ZeroSize { max: MAX_BUFFER_SIZE },
                "buffer size is 0, expected 1 to 281474976710656 bytes",
            ),
            (BufferDescriptorError::SizeTooLarge { size: 5, max: 4 }, "5 bytes, more than the maximum of 4"),
            (BufferDescriptorError::NilResource, "resource UUID is nil"),
        ];
        for (error, needle) in cases {
            let text = error.to_string();
            assert!(text.contains(needle), "{text:?} should contain {needle:?}");
        }
    }

    #[test]
    fn debug_shows_export_data_as_hex() {
        let text = format!("{:?}", sample());
        assert!(text.contains("size: 4096"), "{text}");
        assert!(text.contains("a5a4a7a6"), "{text}");
    }

    fn descriptor() -> impl Strategy<Value = BufferDescriptor> {
        (
            proptest::array::uniform32(any::<u8>()),
            proptest::array::uniform32(any::<u8>()),
            1..=MAX_BUFFER_SIZE,
            any::<u128>().prop_filter("nil", |&u| u != 0),
        )
            .prop_map(|(lo, hi, size, id)| {
                let mut export = [0u8; EXPORT_DATA_LEN];
                export[..32].copy_from_slice(&lo);
                export[32..].copy_from_slice(&hi);
                BufferDescriptor::new(export, size, uuid::Uuid::from_u128(id)).unwrap()
            })
    }

    // The properties below run hundreds of cases each; under Miri one case takes about a
    // second (`round_trips` took 8 minutes), and proptest reads its regression files, which
    // Miri's isolation refuses. `cargo xtask sanitize --miri` runs the tests above.
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        #[cfg_attr(miri, ignore)]
        fn round_trips(d in descriptor()) {
            let e = d.encode();
            prop_assert_eq!(BufferDescriptor::decode(&e), Ok(d));
            prop_assert_eq!(BufferDescriptor::decode(&e).map(|d| d.encode()), Ok(e));
        }

        #[test]
        #[cfg_attr(miri, ignore)]
        fn any_single_byte_change_is_rejected(
            d in descriptor(),
            at in 0..BUFFER_DESCRIPTOR_LEN,
            xor in 1..=255u8,
        ) {
            let mut e = d.encode();
            e[at] ^= xor;
            prop_assert!(BufferDescriptor::decode(&e).is_err(), "byte {} ^ {:#x} accepted", at, xor);
        }

        #[test]
        #[cfg_attr(miri, ignore)]
        fn truncations_and_extensions_are_rejected(
            d in descriptor(),
            extra in proptest::collection::vec(any::<u8>(), 1..64),
        ) {
            let e = d.encode();
            for len in 0..BUFFER_DESCRIPTOR_LEN {
                prop_assert_eq!(
                    BufferDescriptor::decode(&e[..len]),
                    Err(BufferDescriptorError::Length { expected: BUFFER_DESCRIPTOR_LEN, found: len })
                );
            }
            let mut longer = e.to_vec();
            longer.extend_from_slice(&extra);
            prop_assert_eq!(
                BufferDescriptor::decode(&longer),
                Err(BufferDescriptorError::Length { expected: BUFFER_DESCRIPTOR_LEN, found: longer.len() })
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]

        /// Every one of the 108 × 255 single-byte changes of a few valid encodings.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn every_single_byte_change_is_rejected(d in descriptor()) {
            let e = d.encode();
            for at in 0..BUFFER_DESCRIPTOR_LEN {
                for xor in 1..=255u8 {
                    let mut m = e;
                    m[at] ^= xor;
                    prop_assert!(
                        BufferDescriptor::decode(&m).is_err(),
                        "byte {} ^ {:#x} accepted", at, xor
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        #[cfg_attr(miri, ignore)]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = BufferDescriptor::decode(&bytes);
        }

        /// Inputs that get past the length and magic checks, to reach the later ones.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn decode_never_panics_on_well_framed_input(
            tail in proptest::collection::vec(any::<u8>(), BUFFER_DESCRIPTOR_LEN - 8),
            version in prop_oneof![Just(BUFFER_DESCRIPTOR_VERSION), any::<u16>()],
            seal in any::<bool>(),
        ) {
            let mut b = [0u8; BUFFER_DESCRIPTOR_LEN];
            b[..8].copy_from_slice(&BUFFER_DESCRIPTOR_MAGIC);
            b[8..].copy_from_slice(&tail);
            b[8..10].copy_from_slice(&version.to_le_bytes());
            if seal {
                reseal(&mut b);
            }
            if let Ok(d) = BufferDescriptor::decode(&b) {
                // Whatever decodes re-encodes to the same bytes.
                prop_assert_eq!(d.encode(), b);
            }
        }
    }
}
