//! The envelope every descriptor shares: a 16-byte header and a trailing CRC-32.
//!
//! | offset | length | field    | value                                                    |
//! |-------:|-------:|----------|----------------------------------------------------------|
//! |      0 |      8 | magic    | the format's                                             |
//! |      8 |      2 | version  | the format's, `u16`                                      |
//! |     10 |      2 | flags    | `0`, `u16`: reserved for future versions                 |
//! |     12 |      4 | reserved | `0`, `u32`                                               |
//! |  end−4 |      4 | checksum | CRC-32 (IEEE 802.3, as zlib's `crc32`) of every byte before it, `u32` |

use super::Escaped;

/// The length of the header every descriptor starts with.
pub(crate) const HEADER_LEN: usize = 16;
/// The length of the checksum every descriptor ends with.
pub(crate) const CHECKSUM_LEN: usize = 4;

const VERSION_AT: usize = 8;
const FLAGS_AT: usize = 10;
const RESERVED_AT: usize = 12;

/// Why the envelope of a descriptor is wrong: its header (magic, version, flags, reserved) or its
/// checksum. A [`BufferDescriptorError`](super::BufferDescriptorError),
/// [`EventDescriptorError`](super::EventDescriptorError) or `SharedVirtualBufferError` wraps it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The input does not start with the format's magic.
    #[error("magic is {}, expected {}", Escaped(found), Escaped(expected))]
    Magic {
        /// The first 8 bytes of the input.
        found: [u8; 8],
        /// The format's magic.
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
        /// The format's version.
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
}

/// The header of a descriptor of the format `magic`, `version`: zero flags and reserved.
pub(crate) fn header(magic: [u8; 8], version: u16) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..VERSION_AT].copy_from_slice(&magic);
    out[VERSION_AT..FLAGS_AT].copy_from_slice(&version.to_le_bytes());
    out
}

/// Writes the checksum of every byte before the last 4 into the last 4 (`bytes` has at least 4).
pub(crate) fn seal(bytes: &mut [u8]) {
    let at = bytes.len() - CHECKSUM_LEN;
    let checksum = crc32(&bytes[..at]);
    bytes[at..].copy_from_slice(&checksum.to_le_bytes());
}

/// Checks, in this order: the magic, the version (an unknown one is reported as such), the
/// checksum, and that flags and reserved are zero. The caller checked that `bytes` holds at least
/// a header and a checksum.
pub(crate) fn check(bytes: &[u8], magic: [u8; 8], version: u16) -> Result<(), EnvelopeError> {
    let found = field(bytes, 0);
    if found != magic {
        return Err(EnvelopeError::Magic { found, expected: magic });
    }
    let found = u16::from_le_bytes(field(bytes, VERSION_AT));
    if found != version {
        return Err(EnvelopeError::UnsupportedVersion { found, supported: version });
    }
    let checksum_at = bytes.len() - CHECKSUM_LEN;
    let stored = u32::from_le_bytes(field(bytes, checksum_at));
    let computed = crc32(&bytes[..checksum_at]);
    if stored != computed {
        return Err(EnvelopeError::Checksum { stored, computed });
    }
    let flags = u16::from_le_bytes(field(bytes, FLAGS_AT));
    if flags != 0 {
        return Err(EnvelopeError::Flags { found: flags });
    }
    let reserved = u32::from_le_bytes(field(bytes, RESERVED_AT));
    if reserved != 0 {
        return Err(EnvelopeError::Reserved { found: reserved });
    }
    Ok(())
}

/// The `N` bytes at `at` of an encoding (which the caller checked is long enough).
pub(crate) fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// CRC-32 as in IEEE 802.3 and zlib's `crc32`.
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

    /// The shortest descriptor: a header and a checksum.
    const ENVELOPE_LEN: usize = HEADER_LEN + CHECKSUM_LEN;

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
    fn an_envelope_round_trips_and_is_golden() {
        let mut bytes = [0u8; ENVELOPE_LEN];
        bytes[..HEADER_LEN].copy_from_slice(&header(*b"TESTMAGI", 3));
        seal(&mut bytes);
        // The CRC-32 of those 16 bytes, as zlib computes it.
        let mut expected = b"TESTMAGI\x03\x00\x00\x00\x00\x00\x00\x00".to_vec();
        expected.extend_from_slice(&crc32(&expected).to_le_bytes());
        assert_eq!(bytes.as_slice(), expected.as_slice());
        assert_eq!(check(&bytes, *b"TESTMAGI", 3), Ok(()));
    }

    #[test]
    fn each_check_has_its_own_error_in_order() {
        let mut good = [0u8; ENVELOPE_LEN];
        good[..HEADER_LEN].copy_from_slice(&header(*b"TESTMAGI", 3));
        seal(&mut good);
        let spoiled = |at: usize, value: &[u8], reseal: bool| {
            let mut b = good;
            b[at..at + value.len()].copy_from_slice(value);
            if reseal {
                seal(&mut b);
            }
            check(&b, *b"TESTMAGI", 3)
        };
        // The magic comes before the checksum, which the change also spoiled.
        assert_eq!(spoiled(0, b"X", false), Err(EnvelopeError::Magic { found: *b"XESTMAGI", expected: *b"TESTMAGI" }));
        assert_eq!(spoiled(8, &[4], false), Err(EnvelopeError::UnsupportedVersion { found: 4, supported: 3 }));
        assert!(matches!(spoiled(12, &[1], false), Err(EnvelopeError::Checksum { .. })));
        assert_eq!(spoiled(10, &[0, 1], true), Err(EnvelopeError::Flags { found: 0x100 }));
        assert_eq!(spoiled(12, &[0, 0, 0, 0x80], true), Err(EnvelopeError::Reserved { found: 0x8000_0000 }));
    }

    #[test]
    fn error_messages_name_the_expected_value() {
        let cases = [
            (
                EnvelopeError::Magic { found: *b"GARBAGE\0", expected: *b"CUMEMBUF" },
                r#"magic is b"GARBAGE\x00", expected b"CUMEMBUF""#,
            ),
            (
                EnvelopeError::UnsupportedVersion { found: 7, supported: 1 },
                "unsupported descriptor version 7, expected 1",
            ),
            (EnvelopeError::Checksum { stored: 1, computed: 2 }, "carries 0x00000001, its contents give 0x00000002"),
            (EnvelopeError::Flags { found: 2 }, "flags are 0x0002, expected 0"),
            (EnvelopeError::Reserved { found: 3 }, "reserved field is 0x00000003, expected 0"),
        ];
        for (error, needle) in cases {
            let text = error.to_string();
            assert!(text.contains(needle), "{text:?} should contain {needle:?}");
        }
    }
}
