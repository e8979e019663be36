//! The types of a [`MemorySnapshot`]: plain data (addresses, sizes, names), so that a snapshot
//! outlives the resources it describes and round-trips through its file format unchanged.

use crate::history::{HistoryRecord, MemoryEvent, ResourceId};

/// The version of the snapshot's schema: a reader refuses a newer one. Version 1 is what this
/// module's types hold.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything the process's memory resources held at one moment, and the recorded history.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct MemorySnapshot {
    /// [`SCHEMA_VERSION`] when taken.
    pub version: u32,
    /// When, in nanoseconds on the history's clock (since the process's first recording began;
    /// 0 when nothing was ever recorded).
    pub taken_at_ns: u64,
    /// Each resource alive then, in the order they were made.
    pub resources: Vec<ResourceSnapshot>,
    /// The recorded events, oldest first.
    pub events: Vec<EventView>,
    /// Events the history dropped for want of room before these.
    pub dropped_events: u64,
}

impl MemorySnapshot {
    /// A snapshot of `resources` with the events of `history`, taken `taken_at_ns` into the
    /// history's clock.
    pub fn new(resources: Vec<ResourceSnapshot>, history: &HistoryRecord, taken_at_ns: u64) -> MemorySnapshot {
        MemorySnapshot {
            version: SCHEMA_VERSION,
            taken_at_ns,
            resources,
            events: history.events.iter().map(EventView::from).collect(),
            dropped_events: history.dropped,
        }
    }

    /// The resource named `id`, if it was alive.
    pub fn resource(&self, id: ResourceId) -> Option<&ResourceSnapshot> {
        self.resources.iter().find(|resource| resource.id == id.0)
    }

    /// The resource an event names: by its id, or by the handle of the pool it allocates from
    /// (a pool's own events name it so).
    pub fn resource_of_event(&self, resource: u64) -> Option<&ResourceSnapshot> {
        self.resources
            .iter()
            .find(|r| r.id == resource)
            .or_else(|| self.resources.iter().find(|r| r.pool == Some(resource)))
    }
}

/// What kind of resource a [`ResourceSnapshot`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "snapshot", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ResourceKind {
    /// A driver pool of device memory.
    DevicePool,
    /// A driver pool of pinned host memory.
    PinnedPool,
    /// A driver pool of managed memory.
    ManagedPool,
    /// A pool imported from another process.
    ImportedPool,
    /// A [`CachingResource`](crate::CachingResource).
    Caching,
    /// A virtual memory resource (`cuda-mem-vmm`).
    VirtualMemory,
    /// Any other.
    Other,
}

impl ResourceKind {
    /// Its name in the table and the viewer.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::DevicePool => "device pool",
            ResourceKind::PinnedPool => "pinned pool",
            ResourceKind::ManagedPool => "managed pool",
            ResourceKind::ImportedPool => "imported pool",
            ResourceKind::Caching => "caching",
            ResourceKind::VirtualMemory => "virtual memory",
            ResourceKind::Other => "other",
        }
    }
}

/// One resource at the moment of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ResourceSnapshot {
    /// Its [`ResourceId`] (events name it so).
    pub id: u64,
    /// What it is.
    pub kind: ResourceKind,
    /// A short description (its pool's handle, its upstream, its options).
    pub name: String,
    /// The device its memory is on or for, if one.
    pub device: Option<i32>,
    /// Bytes it holds from the driver (or from its upstream).
    pub reserved_bytes: u64,
    /// Bytes of it in use.
    pub used_bytes: u64,
    /// The most `reserved_bytes` has been (since creation or the last reset of peaks).
    pub reserved_peak: u64,
    /// The most `used_bytes` has been.
    pub used_peak: u64,
    /// Allocations it handed out and has not taken back.
    pub live_allocations: u64,
    /// The [`ResourceId`] of the resource it allocates from, if it is one that others see.
    pub upstream: Option<u64>,
    /// The handle of the driver pool it allocates from, if one: a pool's own events (its
    /// out-of-memory failures, exports and imports) name it so.
    pub pool: Option<u64>,
    /// Its segments (a caching resource's; a virtual memory resource's reservations) and what
    /// lies in them, in address order; empty for a resource whose memory the driver places.
    pub segments: Vec<SegmentView>,
}

impl ResourceSnapshot {
    /// A resource with no segments, its figures 0: fill in what it knows.
    pub fn new(id: ResourceId, kind: ResourceKind, name: impl Into<String>) -> ResourceSnapshot {
        ResourceSnapshot {
            id: id.0,
            kind,
            name: name.into(),
            device: None,
            reserved_bytes: 0,
            used_bytes: 0,
            reserved_peak: 0,
            used_peak: 0,
            live_allocations: 0,
            upstream: None,
            pool: None,
            segments: Vec::new(),
        }
    }
}

/// A range of addresses a resource holds, and the blocks it is cut into.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct SegmentView {
    /// Its first address.
    pub address: u64,
    /// Its bytes (of an expandable segment or a reservation: those mapped).
    pub size: u64,
    /// The addresses reserved for it, when it can grow into more than it maps.
    pub reserved: Option<u64>,
    /// The handle of the stream it belongs to (0: none).
    pub stream: u64,
    /// Its blocks, in address order: their sizes add up to `size`.
    pub blocks: Vec<BlockView>,
}

impl SegmentView {
    /// A segment of `size` bytes at `address`, with no blocks yet.
    pub fn new(address: u64, size: u64) -> SegmentView {
        SegmentView { address, size, reserved: None, stream: 0, blocks: Vec::new() }
    }
}

/// A block of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct BlockView {
    /// Its address.
    pub address: u64,
    /// Its bytes.
    pub size: u64,
    /// What it is used for.
    pub state: BlockState,
}

impl BlockView {
    /// A block.
    pub fn new(address: u64, size: u64, state: BlockState) -> BlockView {
        BlockView { address, size, state }
    }
}

/// What a [`BlockView`] is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "snapshot", serde(rename_all = "snake_case"))]
pub enum BlockState {
    /// Handed out, for this many bytes asked for.
    Allocated {
        /// The bytes asked for.
        requested: u64,
    },
    /// Free.
    Free,
    /// Freed, waiting for the work that used it.
    Pending,
}

/// A recorded [`MemoryEvent`], as data.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "snapshot", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct EventView {
    /// Nanoseconds on the history's clock.
    pub time_ns: u64,
    /// [`MemoryEventKind::name`](crate::history::MemoryEventKind::name).
    pub kind: String,
    /// The address.
    pub address: u64,
    /// The bytes.
    pub size: u64,
    /// The stream's handle (0: none).
    pub stream: u64,
    /// The resource's [`ResourceId`].
    pub resource: u64,
    /// The thread's number.
    pub thread: u64,
    /// The stack it came from, one frame a line, when recorded with backtraces.
    pub backtrace: Option<Vec<String>>,
}

impl From<&MemoryEvent> for EventView {
    fn from(event: &MemoryEvent) -> EventView {
        EventView {
            time_ns: u64::try_from(event.time.as_nanos()).unwrap_or(u64::MAX),
            kind: event.kind.name().to_owned(),
            address: event.address,
            size: event.size as u64,
            stream: event.stream,
            resource: event.resource.0,
            thread: event.thread,
            // Resolved here, when the snapshot is taken, not when the event was recorded.
            backtrace: event.backtrace.as_ref().map(|backtrace| caller_frames(&backtrace.to_string())),
        }
    }
}

/// The lines of a resolved backtrace from the frame that called into the recording on: the
/// recorder's own frames (and the capture's) are the same in every event and say nothing.
fn caller_frames(resolved: &str) -> Vec<String> {
    let lines: Vec<&str> = resolved.lines().map(str::trim_end).filter(|line| !line.is_empty()).collect();
    // A frame is its `N: symbol` line and the `at file:line` lines after it.
    let is_frame_start = |line: &str| line.trim_start().split_once(':').is_some_and(|(n, _)| n.parse::<u32>().is_ok());
    let last_internal = lines.iter().rposition(|line| {
        is_frame_start(line) && (line.contains("cuda_mem_core::history::") || line.contains("std::backtrace"))
    });
    let first = match last_internal {
        Some(at) => lines.iter().skip(at + 1).position(|line| is_frame_start(line)).map_or(lines.len(), |n| at + 1 + n),
        None => 0,
    };
    lines[first..].iter().map(|line| (*line).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorders_frames_are_left_out_of_a_backtrace() {
        let resolved = "   0: std::backtrace::Backtrace::force_capture\n             at /rustc/x/backtrace.rs:1:1\n   1: cuda_mem_core::history::record_now\n             at ./src/history.rs:2:3\n   2: my_app::step\n             at ./src/main.rs:9:5\n   3: main\n";
        assert_eq!(caller_frames(resolved), ["   2: my_app::step", "             at ./src/main.rs:9:5", "   3: main"]);
        assert_eq!(caller_frames("   0: main\n"), ["   0: main"]);
    }
}
