//! A [`MemorySnapshot`] as JSON (feature `snapshot`): the schema is the model's types, field for
//! field, with a `version` that a reader checks ([`SCHEMA_VERSION`]).

use super::model::{MemorySnapshot, SCHEMA_VERSION};

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotFormatError {
    /// The JSON is not a snapshot (the parser's error says where).
    #[error("not a memory snapshot: {0}")]
    Json(#[from] serde_json::Error),
    /// A snapshot of a newer schema than this library reads.
    #[error("memory snapshot schema {found} is newer than {supported}, the newest this library reads")]
    NewerSchema {
        /// The snapshot's version.
        found: u32,
        /// [`SCHEMA_VERSION`].
        supported: u32,
    },
    /// The pickle of PyTorch's memory viewer could not be written (a figure above 2^63).
    #[error("memory snapshot as PyTorch's pickle: {0}")]
    Pickle(#[from] serde_pickle::Error),
    /// Writing or reading the file failed.
    #[error("memory snapshot file: {0}")]
    Io(#[from] std::io::Error),
}

impl MemorySnapshot {
    /// The snapshot as JSON.
    ///
    /// # Errors
    /// [`SnapshotFormatError::Json`] should serialization fail (it does not for these types).
    pub fn to_json(&self) -> Result<String, SnapshotFormatError> {
        Ok(serde_json::to_string(self)?)
    }

    /// A snapshot read back from [`to_json`](MemorySnapshot::to_json)'s text.
    ///
    /// # Errors
    /// [`SnapshotFormatError::Json`] for text that is no snapshot;
    /// [`SnapshotFormatError::NewerSchema`] for one of a newer schema.
    pub fn from_json(text: &str) -> Result<MemorySnapshot, SnapshotFormatError> {
        MemorySnapshot::from_json_bytes(text.as_bytes())
    }

    /// A snapshot read back from [`to_json`](MemorySnapshot::to_json)'s text as bytes (as a file
    /// or a message carries it): as [`from_json`](MemorySnapshot::from_json), and bytes that are
    /// not UTF-8 are [`SnapshotFormatError::Json`] too.
    ///
    /// # Errors
    /// As [`from_json`](MemorySnapshot::from_json).
    pub fn from_json_bytes(bytes: &[u8]) -> Result<MemorySnapshot, SnapshotFormatError> {
        #[derive(serde::Deserialize)]
        struct Version {
            version: u32,
        }
        let Version { version } = serde_json::from_slice(bytes)?;
        if version > SCHEMA_VERSION {
            return Err(SnapshotFormatError::NewerSchema { found: version, supported: SCHEMA_VERSION });
        }
        Ok(serde_json::from_slice(bytes)?)
    }

    /// Writes the snapshot as JSON to `path`.
    ///
    /// # Errors
    /// As [`to_json`](MemorySnapshot::to_json), and the file's.
    pub fn write_json(&self, path: impl AsRef<std::path::Path>) -> Result<(), SnapshotFormatError> {
        Ok(std::fs::write(path, self.to_json()?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{HistoryRecord, ResourceId};
    use crate::snapshot::{BlockState, BlockView, EventView, ResourceKind, ResourceSnapshot, SegmentView};

    fn sample() -> MemorySnapshot {
        let mut resource = ResourceSnapshot::new(ResourceId(1), ResourceKind::Caching, "caching");
        let mut segment = SegmentView::new(0x1000, 4096);
        segment.reserved = Some(1 << 30);
        segment.blocks = vec![
            BlockView::new(0x1000, 1024, BlockState::Allocated { requested: 1000 }),
            BlockView::new(0x1400, 1024, BlockState::Pending),
            BlockView::new(0x1800, 2048, BlockState::Free),
        ];
        resource.segments.push(segment);
        let mut snapshot = MemorySnapshot::new(vec![resource], &HistoryRecord::default(), 42);
        snapshot.events.push(EventView {
            time_ns: 7,
            kind: "allocate".into(),
            address: 0x1000,
            size: 1000,
            stream: 0x55,
            resource: 1,
            thread: 1,
            backtrace: Some(vec!["0: main".into()]),
        });
        snapshot
    }

    #[test]
    fn a_snapshot_reads_back_as_it_was_written() {
        let snapshot = sample();
        let text = snapshot.to_json().unwrap();
        assert!(text.contains(r#""kind":"caching""#) && text.contains(r#""allocated":{"requested":1000}"#), "{text}");
        assert_eq!(MemorySnapshot::from_json(&text).unwrap(), snapshot);
    }

    #[test]
    fn a_newer_schema_and_what_is_no_snapshot_are_refused_by_name() {
        let newer = sample().to_json().unwrap().replacen(r#""version":1"#, r#""version":2"#, 1);
        assert!(matches!(
            MemorySnapshot::from_json(&newer),
            Err(SnapshotFormatError::NewerSchema { found: 2, supported: 1 })
        ));
        assert!(matches!(MemorySnapshot::from_json("[1, 2]"), Err(SnapshotFormatError::Json(_))));
        let mut not_utf8 = sample().to_json().unwrap().into_bytes();
        let name = not_utf8.windows(7).position(|w| w == b"caching").unwrap();
        not_utf8[name] = 0xff;
        assert!(matches!(MemorySnapshot::from_json_bytes(&not_utf8), Err(SnapshotFormatError::Json(_))));
    }
}
