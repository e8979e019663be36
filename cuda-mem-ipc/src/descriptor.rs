//! Buffer descriptors: what one process sends another so that it can import a buffer.
//!
//! Documented on [`BufferDescriptor`]: its encoding and what decoding checks.

use std::fmt;

use cuda_mem_core::EXPORT_DATA_LEN;

/// The length in bytes of an encoded [`BufferDescriptor`].
pub const BUFFER_DESCRIPTOR_LEN: usize = 108;

/// The first 8 bytes of every encoded descriptor.
pub const BUFFER_DESCRIPTOR_MAGIC: [u8; 8] = *b"CUMEMBUF";

/// The encoding version written by [`BufferDescriptor::encode`], the only one decoded.
pub const BUFFER_DESCRIPTOR_VERSION: u16 = 1;

/// The largest buffer size a descriptor may carry: 2⁴⁸ bytes (256 TiB), beyond any device's
/// address space.
pub const MAX_BUFFER_SIZE: u64 = 1 << 48;

const VERSION_AT: usize = 8;
const FLAGS_AT: usize = 10;
const RESERVED_AT: usize = 12;
const SIZE_AT: usize = 16;
const RESOURCE_AT: usize = 24;
const EXPORT_DATA_AT: usize = 40;
const CHECKSUM_AT: usize = 104;

// The layout above is fixed at 64 bytes of export data, whatever the driver headers say.
const _: () = assert!(EXPORT_DATA_LEN == 64);
const _: () = assert!(EXPORT_DATA_AT + EXPORT_DATA_LEN == CHECKSUM_AT);
const _: () = assert!(CHECKSUM_AT + CHECKSUM_LEN == BUFFER_DESCRIPTOR_LEN);

/// Why bytes are not a valid encoded [`BufferDescriptor`] (or why [`BufferDescriptor::new`] or
/// [`BufferDescriptor::validate`] refused it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input is not exactly [`BUFFER_DESCRIPTOR_LEN`] bytes.
    #[error("{found} bytes, expected exactly {expected}")]
    Length {
        /// [`BUFFER_DESCRIPTOR_LEN`].
        expected: usize,
        /// The input's length.
        found: usize,
    },
    /// The input does not start with the encoding's magic ([`BUFFER_DESCRIPTOR_MAGIC`] for a buffer descriptor).
    #[error("magic is {}, expected {}", Escaped(found), Escaped(expected))]
    Magic {
        /// The first 8 bytes of the input.
        found: [u8; 8],
        /// The encoding's magic.
        expected: [u8; 8],
    },
    /// The version is not one this library decodes.
    #[error(
        "unsupported descriptor version {found}, expected {supported}: the peer uses a \
         different cuda-mem-ipc version"
    )]
    UnsupportedVersion {
        /// The version in the input.
        found: u16,
        /// [`BUFFER_DESCRIPTOR_VERSION`].
        supported: u16,
    },
    /// The checksum does not match the contents.
    #[error(
        "checksum mismatch: the descriptor carries {stored:#010x}, its contents give \
         {computed:#010x}, so it was damaged or altered"
    )]
    Checksum {
        /// The checksum in the input.
        stored: u32,
        /// The checksum of the input's contents.
        computed: u32,
    },
    /// The flags are not zero.
    #[error("flags are {found:#06x}, expected 0")]
    Flags {
        /// The flags in the input.
        found: u16,
    },
    /// The reserved field is not zero.
    #[error("reserved field is {found:#010x}, expected 0")]
    Reserved {
        /// The reserved field in the input.
        found: u32,
    },
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
    /// An event descriptor's event id is zero (an [`EventDescriptor`](crate::EventDescriptor)).
    #[error("event id is 0, expected the exporting process's nonzero id of the event")]
    NoEventId,
    /// An event descriptor's handle is all zeros, which names no event.
    #[error("event handle is all zeros, expected the driver's handle of an interprocess event")]
    EmptyEventHandle,
}

/// Bytes shown as an escaped byte string, such as `b"CUMEMBUF"`.
struct Escaped<'a>(&'a [u8]);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("b\"")?;
        for &b in self.0 {
            write!(f, "{}", b.escape_ascii())?;
        }
        f.write_str("\"")
    }
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
/// that the UUID is not nil. Each failure is its own [`DecodeError`] variant. Because the
/// checksum covers every other byte, any change of a single byte (indeed any burst of up to 32
/// changed bits) of a valid encoding is rejected.
///
/// The first 16 bytes (magic, version, flags, reserved) and the trailing CRC-32 are the envelope
/// every encoding of this crate shares, checked by one function: the virtual buffer encoding
/// (feature `vmm`) has its own magic and version in the same places.
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
    /// As [`validate`](Self::validate).
    pub fn new(export_data: [u8; EXPORT_DATA_LEN], size: u64, resource: uuid::Uuid) -> Result<Self, DecodeError> {
        let descriptor = Self { export_data, size, resource };
        descriptor.validate()?;
        Ok(descriptor)
    }

    /// Checks what [`decode`](Self::decode) checks of the fields: the size and the UUID.
    ///
    /// # Errors
    ///
    /// [`DecodeError::ZeroSize`], [`DecodeError::SizeTooLarge`] or [`DecodeError::NilResource`].
    pub fn validate(&self) -> Result<(), DecodeError> {
        check_size(self.size)?;
        if self.resource.is_nil() {
            return Err(DecodeError::NilResource);
        }
        Ok(())
    }

    /// The descriptor's fixed-size encoding (see [`BufferDescriptor`], *Encoding*).
    ///
    /// Encodes the fields as they are: an invalid descriptor (see
    /// [`validate`](Self::validate)) gives bytes that [`decode`](Self::decode) rejects.
    pub fn encode(&self) -> [u8; BUFFER_DESCRIPTOR_LEN] {
        let mut out = [0u8; BUFFER_DESCRIPTOR_LEN];
        out[..VERSION_AT].copy_from_slice(&BUFFER_DESCRIPTOR_MAGIC);
        out[VERSION_AT..FLAGS_AT].copy_from_slice(&BUFFER_DESCRIPTOR_VERSION.to_le_bytes());
        // flags (10..12) and reserved (12..16) stay zero.
        out[SIZE_AT..RESOURCE_AT].copy_from_slice(&self.size.to_le_bytes());
        out[RESOURCE_AT..EXPORT_DATA_AT].copy_from_slice(self.resource.as_bytes());
        out[EXPORT_DATA_AT..CHECKSUM_AT].copy_from_slice(&self.export_data);
        let checksum = crc32(&out[..CHECKSUM_AT]);
        out[CHECKSUM_AT..].copy_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Decodes and validates an encoded descriptor.
    ///
    /// Never panics, whatever the input.
    ///
    /// # Errors
    ///
    /// A [`DecodeError`] naming the first check that failed (see [`BufferDescriptor`], *Encoding*, for
    /// the order).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let bytes: &[u8; BUFFER_DESCRIPTOR_LEN] = bytes
            .try_into()
            .map_err(|_| DecodeError::Length { expected: BUFFER_DESCRIPTOR_LEN, found: bytes.len() })?;
        check_envelope(bytes, BUFFER_DESCRIPTOR_MAGIC, BUFFER_DESCRIPTOR_VERSION)?;
        let size = u64::from_le_bytes(field(bytes, SIZE_AT));
        let resource = uuid::Uuid::from_bytes(field(bytes, RESOURCE_AT));
        Self::new(field(bytes, EXPORT_DATA_AT), size, resource)
    }
}

impl TryFrom<&[u8]> for BufferDescriptor {
    type Error = DecodeError;

    fn try_from(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode(bytes)
    }
}

/// The length of what every encoding of this crate shares: the 16-byte header (magic, version,
/// flags, reserved, laid out as in a buffer descriptor) and the 4-byte checksum at the end.
// Read only by compile-time assertions, which Rust 1.88 (the MSRV) does not count as a use.
#[allow(dead_code)]
pub(crate) const ENVELOPE_LEN: usize = CHECKSUM_LEN + 16;
const CHECKSUM_LEN: usize = 4;
const _: () = assert!(BUFFER_DESCRIPTOR_LEN >= ENVELOPE_LEN);

/// Checks what every encoding of this crate shares, in this order: the magic, the version (an
/// unknown one is reported as such), the CRC-32 in the last 4 bytes over all the bytes before
/// it, and that flags and reserved are zero. The caller checked that `bytes` has at least
/// [`ENVELOPE_LEN`] bytes.
pub(crate) fn check_envelope(bytes: &[u8], magic: [u8; 8], version: u16) -> Result<(), DecodeError> {
    let found = field(bytes, 0);
    if found != magic {
        return Err(DecodeError::Magic { found, expected: magic });
    }
    let found = u16::from_le_bytes(field(bytes, VERSION_AT));
    if found != version {
        return Err(DecodeError::UnsupportedVersion { found, supported: version });
    }
    let checksum_at = bytes.len() - CHECKSUM_LEN;
    let stored = u32::from_le_bytes(field(bytes, checksum_at));
    let computed = crc32(&bytes[..checksum_at]);
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let flags = u16::from_le_bytes(field(bytes, FLAGS_AT));
    if flags != 0 {
        return Err(DecodeError::Flags { found: flags });
    }
    let reserved = u32::from_le_bytes(field(bytes, RESERVED_AT));
    if reserved != 0 {
        return Err(DecodeError::Reserved { found: reserved });
    }
    Ok(())
}

fn check_size(size: u64) -> Result<(), DecodeError> {
    if size == 0 {
        Err(DecodeError::ZeroSize { max: MAX_BUFFER_SIZE })
    } else if size > MAX_BUFFER_SIZE {
        Err(DecodeError::SizeTooLarge { size, max: MAX_BUFFER_SIZE })
    } else {
        Ok(())
    }
}

/// The `N` bytes at `at` of an encoding (which the caller checked is long enough).
pub(crate) fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// CRC-32 as in IEEE 802.3 and zlib's `crc32` (the checksum of every encoding of this crate).
///
/// `crc32fast`, not a byte-wise table: every descriptor sent or received is checksummed, and a
/// table walk over a 104-byte descriptor was a large part of re-sending a buffer.
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> BufferDescriptor {
        let mut export = [0u8; EXPORT_DATA_LEN];
        for (i, b) in export.iter_mut().enumerate() {
            *b = i as u8 ^ 0xA5;
        }
        BufferDescriptor::new(export, 4096, uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677)).unwrap()
    }

    /// Re-seals `bytes` with a correct checksum after a deliberate change.
    fn reseal(bytes: &mut [u8; BUFFER_DESCRIPTOR_LEN]) {
        let c = crc32(&bytes[..CHECKSUM_AT]);
        bytes[CHECKSUM_AT..].copy_from_slice(&c.to_le_bytes());
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    /// The CRC-32 bit by bit, from its definition (reflected polynomial 0xEDB88320).
    fn crc32_by_definition(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { 0xEDB8_8320 ^ (crc >> 1) } else { crc >> 1 };
            }
        }
        !crc
    }

    /// Every length up to 128 bytes (each encoding checksums 64 to 104, and `crc32fast` changes
    /// path at 16, 64 and 128), at every alignment of the first 16: runs under Miri too, which
    /// checks `crc32fast`'s own unsafe code on the path Miri's CPU takes.
    #[test]
    fn crc32_is_the_definition_at_every_length_and_alignment() {
        let bytes: Vec<u8> = (0..160u32).map(|i| (i.wrapping_mul(0x9E37_79B9) >> 24) as u8).collect();
        for start in 0..16 {
            for len in 0..=128 {
                let slice = &bytes[start..start + len];
                assert_eq!(crc32(slice), crc32_by_definition(slice), "{len} bytes at {start}");
            }
        }
    }

    proptest! {
        // Random contents, up to lengths past every encoding's.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn crc32_is_the_definition(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(crc32(&bytes), crc32_by_definition(&bytes));
        }
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
        expected.extend_from_slice(&crc32(&expected).to_le_bytes());
        assert_eq!(e.as_slice(), expected.as_slice());
    }

    #[test]
    fn new_enforces_the_invariants() {
        let id = uuid::Uuid::from_u128(9);
        assert_eq!(BufferDescriptor::new([0; 64], 0, id), Err(DecodeError::ZeroSize { max: MAX_BUFFER_SIZE }));
        assert_eq!(
            BufferDescriptor::new([0; 64], MAX_BUFFER_SIZE + 1, id),
            Err(DecodeError::SizeTooLarge { size: MAX_BUFFER_SIZE + 1, max: MAX_BUFFER_SIZE })
        );
        assert_eq!(BufferDescriptor::new([0; 64], 1, uuid::Uuid::nil()), Err(DecodeError::NilResource));
        assert!(BufferDescriptor::new([0; 64], MAX_BUFFER_SIZE, id).is_ok());
        assert!(BufferDescriptor::new([0; 64], 1, id).is_ok());
    }

    #[test]
    fn invalid_field_values_encode_to_rejected_bytes() {
        let mut d = sample();
        d.size = 0;
        assert!(matches!(d.validate(), Err(DecodeError::ZeroSize { .. })));
        assert!(matches!(BufferDescriptor::decode(&d.encode()), Err(DecodeError::ZeroSize { .. })));
        let mut d = sample();
        d.resource = uuid::Uuid::nil();
        assert_eq!(d.validate(), Err(DecodeError::NilResource));
        assert_eq!(BufferDescriptor::decode(&d.encode()), Err(DecodeError::NilResource));
        assert_eq!(sample().validate(), Ok(()));
    }

    #[test]
    fn each_check_has_its_own_error() {
        let good = sample().encode();
        assert_eq!(BufferDescriptor::decode(&good), Ok(sample()));
        assert_eq!(BufferDescriptor::try_from(&good[..]), Ok(sample()));

        assert_eq!(BufferDescriptor::decode(&good[..107]), Err(DecodeError::Length { expected: 108, found: 107 }));
        assert_eq!(BufferDescriptor::decode(&[]), Err(DecodeError::Length { expected: 108, found: 0 }));

        let mut b = good;
        b[0] = b'X';
        assert_eq!(
            BufferDescriptor::decode(&b),
            Err(DecodeError::Magic { found: *b"XUMEMBUF", expected: BUFFER_DESCRIPTOR_MAGIC })
        );

        let mut b = good;
        b[8..10].copy_from_slice(&2u16.to_le_bytes());
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(DecodeError::UnsupportedVersion { found: 2, supported: 1 }));

        let mut b = good;
        b[50] ^= 1;
        let computed = crc32(&b[..104]);
        let stored = u32::from_le_bytes(good[104..].try_into().unwrap());
        assert_eq!(BufferDescriptor::decode(&b), Err(DecodeError::Checksum { stored, computed }));

        let mut b = good;
        b[10] = 1;
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(DecodeError::Flags { found: 1 }));

        let mut b = good;
        b[15] = 0x80;
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(DecodeError::Reserved { found: 0x8000_0000 }));

        let mut b = good;
        b[16..24].copy_from_slice(&0u64.to_le_bytes());
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(DecodeError::ZeroSize { max: MAX_BUFFER_SIZE }));

        let mut b = good;
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut b);
        assert_eq!(
            BufferDescriptor::decode(&b),
            Err(DecodeError::SizeTooLarge { size: u64::MAX, max: MAX_BUFFER_SIZE })
        );

        let mut b = good;
        b[24..40].fill(0);
        reseal(&mut b);
        assert_eq!(BufferDescriptor::decode(&b), Err(DecodeError::NilResource));
    }

    #[test]
    fn error_messages_name_the_expected_value() {
        let cases = [
            (DecodeError::Length { expected: 108, found: 3 }, "3 bytes, expected exactly 108"),
            (
                DecodeError::Magic { found: *b"GARBAGE\0", expected: BUFFER_DESCRIPTOR_MAGIC },
                r#"magic is b"GARBAGE\x00", expected b"CUMEMBUF""#,
            ),
            (
                DecodeError::UnsupportedVersion { found: 7, supported: 1 },
                "unsupported descriptor version 7, expected 1",
            ),
            (DecodeError::Checksum { stored: 1, computed: 2 }, "carries 0x00000001, its contents give 0x00000002"),
            (DecodeError::Flags { found: 2 }, "flags are 0x0002, expected 0"),
            (DecodeError::Reserved { found: 3 }, "reserved field is 0x00000003, expected 0"),
            (DecodeError::ZeroSize { max: MAX_BUFFER_SIZE }, "buffer size is 0, expected 1 to 281474976710656 bytes"),
            (DecodeError::SizeTooLarge { size: 5, max: 4 }, "5 bytes, more than the maximum of 4"),
            (DecodeError::NilResource, "resource UUID is nil"),
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
                    Err(DecodeError::Length { expected: BUFFER_DESCRIPTOR_LEN, found: len })
                );
            }
            let mut longer = e.to_vec();
            longer.extend_from_slice(&extra);
            prop_assert_eq!(
                BufferDescriptor::decode(&longer),
                Err(DecodeError::Length { expected: BUFFER_DESCRIPTOR_LEN, found: longer.len() })
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
