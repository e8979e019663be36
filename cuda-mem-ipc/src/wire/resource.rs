//! The resource message: a pool's UUID, memory and device (its layout:
//! [`MessageKind::Resource`](super::MessageKind::Resource)).

use uuid::Uuid;

use super::envelope::field;
use super::location::WireDevice;

/// The length in bytes of a resource message's payload.
pub const RESOURCE_MESSAGE_LEN: usize = 40;

const MEMORY_AT: usize = 16;
const ORDINAL_AT: usize = 17;
const RESERVED_AT: usize = 21;
const DEVICE_AT: usize = 24;

const DEVICE_CODE: u8 = 0;
const PINNED_CODE: u8 = 1;
/// The ordinal a pinned pool's message names.
const NO_ORDINAL: i32 = -1;

const _: () = assert!(DEVICE_AT + 16 == RESOURCE_MESSAGE_LEN);

/// A resource message: which pool, and what memory it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResourceMessage {
    /// The UUID the sender names the pool with.
    pub(crate) pool: Uuid,
    /// What memory the pool holds.
    pub(crate) memory: PoolMemory,
}

/// What memory a pool on the wire holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolMemory {
    /// Device memory of this device.
    Device(WireDevice),
    /// Pinned host memory.
    Pinned,
}

impl ResourceMessage {
    /// The message's payload. Encodes the fields as they are: a nil UUID, or a device with a
    /// negative ordinal or a nil UUID, gives bytes that [`decode`](Self::decode) refuses.
    pub(crate) fn encode(&self) -> [u8; RESOURCE_MESSAGE_LEN] {
        let mut payload = [0u8; RESOURCE_MESSAGE_LEN];
        payload[..MEMORY_AT].copy_from_slice(self.pool.as_bytes());
        let (code, ordinal, device) = match self.memory {
            PoolMemory::Device(device) => (DEVICE_CODE, device.sender_ordinal, device.uuid),
            PoolMemory::Pinned => (PINNED_CODE, NO_ORDINAL, Uuid::nil()),
        };
        payload[MEMORY_AT] = code;
        payload[ORDINAL_AT..RESERVED_AT].copy_from_slice(&ordinal.to_le_bytes());
        payload[DEVICE_AT..].copy_from_slice(device.as_bytes());
        payload
    }

    /// Decodes and checks a payload, in the order of
    /// [`MessageKind::Resource`](super::MessageKind::Resource). Never panics.
    pub(crate) fn decode(payload: &[u8]) -> Result<ResourceMessage, ResourceMessageError> {
        let payload: &[u8; RESOURCE_MESSAGE_LEN] = payload
            .try_into()
            .map_err(|_| ResourceMessageError::Length { found: payload.len(), expected: RESOURCE_MESSAGE_LEN })?;
        let reserved: [u8; 3] = field(payload, RESERVED_AT);
        if reserved != [0; 3] {
            return Err(ResourceMessageError::Reserved { found: reserved });
        }
        let pool = Uuid::from_bytes(field(payload, 0));
        if pool.is_nil() {
            return Err(ResourceMessageError::NilPool);
        }
        let ordinal = i32::from_le_bytes(field(payload, ORDINAL_AT));
        let device = Uuid::from_bytes(field(payload, DEVICE_AT));
        let memory = match payload[MEMORY_AT] {
            DEVICE_CODE if ordinal < 0 => return Err(ResourceMessageError::NegativeOrdinal { found: ordinal }),
            DEVICE_CODE if device.is_nil() => return Err(ResourceMessageError::NilDevice),
            DEVICE_CODE => PoolMemory::Device(WireDevice { uuid: device, sender_ordinal: ordinal }),
            PINNED_CODE if ordinal != NO_ORDINAL || !device.is_nil() => {
                return Err(ResourceMessageError::DeviceForPinnedPool { ordinal, device });
            }
            PINNED_CODE => PoolMemory::Pinned,
            found => return Err(ResourceMessageError::MemoryKind { found }),
        };
        Ok(ResourceMessage { pool, memory })
    }
}

/// Why a resource message's payload is malformed
/// ([`MessageKind::Resource`](super::MessageKind::Resource) has its layout).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceMessageError {
    /// The payload is not exactly [`RESOURCE_MESSAGE_LEN`] bytes.
    #[error("a resource message has {expected} bytes; got {found}")]
    Length {
        /// The payload's length.
        found: usize,
        /// [`RESOURCE_MESSAGE_LEN`].
        expected: usize,
    },
    /// The reserved bytes are not zero.
    #[error("a resource message's reserved bytes are {found:02x?}, expected zero")]
    Reserved {
        /// The reserved bytes in the payload.
        found: [u8; 3],
    },
    /// The pool's UUID is nil.
    #[error("a resource message names the nil UUID, expected the pool's")]
    NilPool,
    /// An unknown memory code.
    #[error("memory kind {found} in a resource message, expected 0 (device) or 1 (pinned)")]
    MemoryKind {
        /// The code in the payload.
        found: u8,
    },
    /// A device pool with a negative ordinal.
    #[error("device ordinal {found} in a resource message, expected the sender's ordinal (not negative)")]
    NegativeOrdinal {
        /// The ordinal in the payload.
        found: i32,
    },
    /// A device pool without a device UUID.
    #[error("a device pool's resource message has no device UUID")]
    NilDevice,
    /// A pinned pool whose message names a device.
    #[error(
        "a pinned pool's resource message names a device (ordinal {ordinal}, UUID {device}; ordinal -1 and a zero \
         UUID expected)"
    )]
    DeviceForPinnedPool {
        /// The ordinal in the payload.
        ordinal: i32,
        /// The device UUID in the payload.
        device: Uuid,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: Uuid = Uuid::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff);
    const DEVICE: Uuid = Uuid::from_u128(0xfeed_0000_0000_0000_0000_0000_0000_0001);

    fn device_pool() -> ResourceMessage {
        ResourceMessage { pool: POOL, memory: PoolMemory::Device(WireDevice { uuid: DEVICE, sender_ordinal: 3 }) }
    }

    #[test]
    fn encoding_is_stable() {
        // Golden encodings: changing the format must change FRAME_VERSION, not this test.
        let mut device = POOL.as_bytes().to_vec();
        device.extend_from_slice(b"\x00\x03\x00\x00\x00\x00\x00\x00");
        device.extend_from_slice(DEVICE.as_bytes());
        assert_eq!(device_pool().encode().as_slice(), device.as_slice());
        assert_eq!(ResourceMessage::decode(&device), Ok(device_pool()));

        let pinned = ResourceMessage { pool: POOL, memory: PoolMemory::Pinned };
        let mut bytes = POOL.as_bytes().to_vec();
        bytes.extend_from_slice(b"\x01\xff\xff\xff\xff\x00\x00\x00");
        bytes.extend_from_slice(&[0; 16]);
        assert_eq!(pinned.encode().as_slice(), bytes.as_slice());
        assert_eq!(ResourceMessage::decode(&bytes), Ok(pinned));
    }

    #[test]
    fn each_check_has_its_own_error() {
        use ResourceMessageError as E;
        let good = device_pool().encode();
        let with = |at: usize, value: &[u8]| {
            let mut p = good;
            p[at..at + value.len()].copy_from_slice(value);
            ResourceMessage::decode(&p)
        };
        assert_eq!(ResourceMessage::decode(&good[..39]), Err(E::Length { found: 39, expected: 40 }));
        assert_eq!(ResourceMessage::decode(&[0; 41]), Err(E::Length { found: 41, expected: 40 }));
        assert_eq!(with(23, &[1]), Err(E::Reserved { found: [0, 0, 1] }));
        assert_eq!(with(0, &[0; 16]), Err(E::NilPool));
        assert_eq!(with(16, &[7]), Err(E::MemoryKind { found: 7 }));
        assert_eq!(with(17, &(-5i32).to_le_bytes()), Err(E::NegativeOrdinal { found: -5 }));
        assert_eq!(with(24, &[0; 16]), Err(E::NilDevice));
        assert_eq!(with(16, &[1]), Err(E::DeviceForPinnedPool { ordinal: 3, device: DEVICE }));
        let pinned_with_device = [&[1u8][..], &(-1i32).to_le_bytes()].concat();
        assert_eq!(with(16, &pinned_with_device), Err(E::DeviceForPinnedPool { ordinal: -1, device: DEVICE }));
    }

    #[test]
    fn error_messages_say_what_came() {
        let cases = [
            (ResourceMessageError::Length { found: 39, expected: 40 }, "has 40 bytes; got 39"),
            (ResourceMessageError::Reserved { found: [0, 0, 1] }, "reserved bytes are [00, 00, 01], expected zero"),
            (ResourceMessageError::NilPool, "names the nil UUID"),
            (ResourceMessageError::MemoryKind { found: 7 }, "memory kind 7"),
            (ResourceMessageError::NegativeOrdinal { found: -5 }, "device ordinal -5"),
            (ResourceMessageError::NilDevice, "has no device UUID"),
            (
                ResourceMessageError::DeviceForPinnedPool { ordinal: 0, device: DEVICE },
                "a pinned pool's resource message names a device",
            ),
        ];
        for (error, needle) in cases {
            let text = error.to_string();
            assert!(text.contains(needle), "{text:?} should contain {needle:?}");
        }
    }

    proptest::proptest! {
        /// Whatever the payload: a message or an error, never a panic; a message re-encodes to
        /// the payload.
        #[test]
        #[cfg_attr(miri, ignore)]
        fn decode_never_panics(payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48)) {
            if let Ok(message) = ResourceMessage::decode(&payload) {
                let encoded = message.encode();
                proptest::prop_assert_eq!(encoded.as_slice(), payload.as_slice());
            }
        }
    }
}
