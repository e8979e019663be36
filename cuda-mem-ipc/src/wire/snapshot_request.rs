//! The snapshot request: a peer asks this process for a memory snapshot (feature `snapshot`).
//! The answer is a [`MessageKind::Snapshot`](super::MessageKind::Snapshot) message: the
//! snapshot's JSON, `cuda_mem_core::snapshot`'s schema.

/// The bytes of an encoded [`SnapshotRequest`].
pub const SNAPSHOT_REQUEST_LEN: usize = 4;

/// "Every event": the value of the request's `max_events` field that sets no bound.
const EVERY_EVENT: u32 = u32::MAX;

/// A peer's request for a memory snapshot of this process.
///
/// | offset | length | field      | value                                                        |
/// |-------:|-------:|------------|--------------------------------------------------------------|
/// |      0 |      4 | max events | the most events of the history the answer holds (the latest), `u32` little-endian; `0xFFFF_FFFF`: every event |
///
/// The answer holds fewer when its JSON would not fit one message
/// ([`MAX_PAYLOAD_LEN`](super::MAX_PAYLOAD_LEN)): the oldest go, counted as dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotRequest {
    /// The most events the answer holds (the latest); `None`: every event that fits.
    pub max_events: Option<u32>,
}

impl SnapshotRequest {
    /// A request for a snapshot with at most `max_events` events (`None`: all that fit).
    pub fn new(max_events: Option<u32>) -> SnapshotRequest {
        SnapshotRequest { max_events: max_events.filter(|&n| n != EVERY_EVENT) }
    }

    /// The request's bytes.
    pub fn encode(&self) -> [u8; SNAPSHOT_REQUEST_LEN] {
        self.max_events.unwrap_or(EVERY_EVENT).to_le_bytes()
    }

    /// The request in `bytes`.
    ///
    /// # Errors
    /// [`SnapshotRequestError::Length`] for other than [`SNAPSHOT_REQUEST_LEN`] bytes.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotRequest, SnapshotRequestError> {
        let field: [u8; SNAPSHOT_REQUEST_LEN] =
            bytes.try_into().map_err(|_| SnapshotRequestError::Length { len: bytes.len() })?;
        Ok(SnapshotRequest::new(Some(u32::from_le_bytes(field))))
    }
}

/// Why bytes are not a [`SnapshotRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotRequestError {
    /// Not [`SNAPSHOT_REQUEST_LEN`] bytes.
    #[error("a snapshot request is {SNAPSHOT_REQUEST_LEN} bytes, not {len}")]
    Length {
        /// The payload's bytes.
        len: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_other_lengths_are_refused() {
        for request in [SnapshotRequest::new(None), SnapshotRequest::new(Some(0)), SnapshotRequest::new(Some(1000))] {
            assert_eq!(SnapshotRequest::decode(&request.encode()), Ok(request));
        }
        assert_eq!(SnapshotRequest::decode(&[0xff; 4]), Ok(SnapshotRequest { max_events: None }));
        assert_eq!(SnapshotRequest::new(Some(u32::MAX)), SnapshotRequest::new(None));
        for len in [0, 3, 5, 8] {
            assert_eq!(SnapshotRequest::decode(&vec![0; len]), Err(SnapshotRequestError::Length { len }));
        }
    }
}
