//! A [`MemorySnapshot`] as the pickle file PyTorch's memory viewer opens (feature `snapshot`):
//! [`MemorySnapshot::to_torch_pickle`] says what maps to what.

mod trace;

use std::collections::HashMap;

use serde::Serialize;

use super::json::SnapshotFormatError;
use super::model::{BlockState, BlockView, EventView, MemorySnapshot, ResourceSnapshot, SegmentView};

/// PyTorch's small segments' size: a fixed segment of at most this is `"small"`.
const SMALL_SEGMENT: u64 = 2 << 20;

impl MemorySnapshot {
    /// The snapshot as the pickle file PyTorch's memory viewer opens: the dictionary of
    /// `torch.cuda.memory._snapshot()`, which pytorch.org/memory_viz and `torch.cuda._memory_viz`
    /// (`segsum`, `trace`) read. `cargo xtask snapshot-view SNAPSHOT.json --torch OUT.pickle`
    /// writes one from a saved JSON snapshot.
    ///
    /// What maps to what:
    ///
    /// - `segments`: every segment of every resource that has a device (a caching resource's
    ///   segments, a virtual memory resource's ranges), sorted by device and address. `device` is
    ///   the resource's, `stream` the segment's, `is_expandable` whether it reserves more than it
    ///   maps; `segment_pool_id` is `(0, id)` with the resource's
    ///   [`ResourceId`](crate::history::ResourceId), so that each resource is a pool of its own;
    ///   `segment_type` is `"small"` for a fixed segment of at most 2 MiB (PyTorch's small
    ///   segments), `"large"` otherwise. A segment with nothing mapped is left out, and so is a
    ///   range of a resource that another resource of the snapshot allocates from and shows in
    ///   finer detail (a virtual memory resource under a caching resource's expandable segments):
    ///   the viewer expects no two segments to overlap.
    /// - Blocks: `active_allocated`, with the bytes asked for as `requested_size`;
    ///   `active_pending_free` (freed, waiting for other streams' work), with its size;
    ///   `inactive`, with 0, as PyTorch writes them. A block's `frames` are those of its latest
    ///   allocation in the history; a segment's, those of its latest `segment_allocate`.
    /// - `device_traces`: one list per device index, the history's events of that device's
    ///   resources in time order. `allocate` is `alloc`, `segment_allocate` is `segment_alloc`,
    ///   `segment_grow` is `segment_map`, `segment_shrink` is `segment_unmap`, `out_of_memory` is
    ///   `oom` (with `device_free` 0: the history does not record the driver's free memory);
    ///   `free_requested`, `free_completed` and `segment_free` keep their names. `time_us` is the
    ///   history's clock in microseconds (since the process's first recording, not since 1970);
    ///   `frames` are the event's backtrace (each `N: symbol` line a frame, with the file and
    ///   line of the `at file:line:column` line after it).
    /// - `allocator_settings`: empty (the snapshot does not hold the resources' options).
    ///
    /// What is left out, and why:
    ///
    /// - `export` and `import` events: PyTorch has no such action.
    /// - Allocations and frees of resources without segments: driver pools place their own
    ///   memory, so the viewer would find their blocks in no segment (their out-of-memory
    ///   failures are kept). Events of resources no longer alive: their device is unknown.
    /// - Events that contradict the final state. The viewer draws the allocator's state at any
    ///   event by undoing the trace from the final `segments` backwards, and fails on a block or
    ///   segment that is not there; so the trace is walked the same way here, and an event it
    ///   cannot undo is left out, a free with its allocation (an allocation freed after its
    ///   segment was released, by a free recorded late on another thread; a virtual memory
    ///   resource's buffer, whose range goes with it).
    ///
    /// A free whose completion was not recorded
    /// ([`free_completions`](crate::history::HistoryOptions::free_completions) off, or not yet run)
    /// gets its `free_completed` beside it, as PyTorch's frees on the block's own stream do: the
    /// block is reusable at once in stream order. An allocation that predates the history shows
    /// as live from the start (the viewer's "allocated before recording").
    ///
    /// The pickle is protocol 3 and uses only the opcodes the viewer's own unpickler reads.
    /// Integers are 8-byte signed ones at most, which JavaScript reads as numbers: exact below
    /// 2^53 (device addresses are far below), rounded above.
    ///
    /// ```
    /// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
    /// use cuda_mem_core::snapshot::take_snapshot;
    /// use cuda_mem_core::{CachingOptions, CachingResource, Device, DeviceMemoryResource, Stream};
    ///
    /// let device = Device::new(0)?;
    /// let stream = Stream::new(device, Default::default())?;
    /// let upstream = DeviceMemoryResource::new(device, Default::default())?;
    /// let cache = CachingResource::new(upstream, CachingOptions::default())?;
    /// let _block = cache.allocate(64 << 10, &stream)?;
    /// let pickle = take_snapshot().to_torch_pickle()?;
    /// assert_eq!(&pickle[..2], b"\x80\x03"); // protocol 3
    /// // `write_torch_pickle("snapshot.pickle")` writes it for pytorch.org/memory_viz.
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`SnapshotFormatError::Pickle`] for an address or size above 2^63.
    pub fn to_torch_pickle(&self) -> Result<Vec<u8>, SnapshotFormatError> {
        let dump = TorchSnapshot::of(self);
        Ok(serde_pickle::to_vec(&dump, serde_pickle::SerOptions::new())?)
    }

    /// Writes [`to_torch_pickle`](MemorySnapshot::to_torch_pickle)'s file to `path`.
    ///
    /// # Errors
    /// As [`to_torch_pickle`](MemorySnapshot::to_torch_pickle), and the file's.
    pub fn write_torch_pickle(&self, path: impl AsRef<std::path::Path>) -> Result<(), SnapshotFormatError> {
        Ok(std::fs::write(path, self.to_torch_pickle()?)?)
    }
}

/// An integer as the viewer reads it: pickled as an i64 (BININT or an 8-byte LONG1, a JavaScript
/// number), never as the 9-byte LONG1 serde-pickle gives a u64 of 2^31 or more, which the viewer
/// reads as a BigInt that its arithmetic refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Int(u64);

impl Serialize for Int {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let value = i64::try_from(self.0).map_err(|_| {
            serde::ser::Error::custom(format!("{:#x} is above 2^63, more than a pickled 8-byte integer holds", self.0))
        })?;
        serializer.serialize_i64(value)
    }
}

/// The file's dictionary (`torch.cuda.memory._snapshot()`'s keys).
#[derive(Serialize)]
struct TorchSnapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<trace::Entry>>,
    allocator_settings: HashMap<String, String>,
}

/// A stack frame, innermost first in a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Frame {
    filename: String,
    line: Int,
    name: String,
}

/// A segment, as PyTorch's snapshot has it.
#[derive(Serialize)]
struct Segment {
    device: Int,
    address: Int,
    total_size: Int,
    allocated_size: Int,
    active_size: Int,
    requested_size: Int,
    stream: Int,
    segment_type: &'static str,
    segment_pool_id: (Int, Int),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<Block>,
}

/// A block of a [`Segment`].
#[derive(Serialize)]
struct Block {
    address: Int,
    size: Int,
    requested_size: Int,
    state: &'static str,
    frames: Vec<Frame>,
}

/// A segment the file shows: its resource and device.
#[derive(Clone, Copy)]
struct Shown<'a> {
    resource: &'a ResourceSnapshot,
    device: usize,
    segment: &'a SegmentView,
}

impl TorchSnapshot {
    fn of(snapshot: &MemorySnapshot) -> TorchSnapshot {
        let shown = shown_segments(snapshot);
        let frames = FramesOf::new(&snapshot.events);
        let devices = shown.iter().map(|s| s.device + 1).chain(trace::devices(snapshot)).max().unwrap_or(0);
        let device_traces = (0..devices)
            .map(|device| {
                let segments: Vec<&SegmentView> =
                    shown.iter().filter(|s| s.device == device).map(|s| s.segment).collect();
                trace::device_trace(snapshot, device, &segments)
            })
            .collect();
        TorchSnapshot {
            segments: shown.iter().map(|s| segment(*s, &frames)).collect(),
            device_traces,
            allocator_settings: HashMap::new(),
        }
    }
}

/// The segments the file shows, by device and address: every resource's that has a device, but
/// those with nothing mapped and those a resource allocating from this one shows in detail.
fn shown_segments(snapshot: &MemorySnapshot) -> Vec<Shown<'_>> {
    let mut shown: Vec<Shown<'_>> = snapshot
        .resources
        .iter()
        .filter_map(|resource| Some((resource, usize::try_from(resource.device?).ok()?)))
        .flat_map(|(resource, device)| resource.segments.iter().map(move |segment| Shown { resource, device, segment }))
        .filter(|s| s.segment.size > 0 && !shown_downstream(snapshot, s.resource, s.segment))
        .collect();
    shown.sort_by_key(|s| (s.device, s.segment.address));
    shown
}

/// Whether a resource that allocates from `upstream` has a segment overlapping `segment`.
fn shown_downstream(snapshot: &MemorySnapshot, upstream: &ResourceSnapshot, segment: &SegmentView) -> bool {
    let end = segment.address.saturating_add(segment.size);
    snapshot
        .resources
        .iter()
        .filter(|resource| resource.upstream == Some(upstream.id))
        .flat_map(|resource| &resource.segments)
        .any(|theirs| theirs.address < end && segment.address < theirs.address.saturating_add(theirs.size))
}

/// PyTorch's segment for one of ours.
fn segment(shown: Shown<'_>, frames: &FramesOf<'_>) -> Segment {
    let Shown { resource, device, segment } = shown;
    let blocks: Vec<Block> = segment.blocks.iter().map(|block| self::block(block, resource.id, frames)).collect();
    let sum = |of: fn(&Block) -> u64| blocks.iter().map(of).sum::<u64>();
    let small = segment.reserved.is_none() && segment.size <= SMALL_SEGMENT;
    Segment {
        device: Int(device as u64),
        address: Int(segment.address),
        total_size: Int(segment.size),
        allocated_size: Int(sum(|b| if b.state == ALLOCATED { b.size.0 } else { 0 })),
        active_size: Int(sum(|b| if b.state == INACTIVE { 0 } else { b.size.0 })),
        requested_size: Int(sum(|b| if b.state == ALLOCATED { b.requested_size.0 } else { 0 })),
        stream: Int(segment.stream),
        segment_type: if small { "small" } else { "large" },
        segment_pool_id: (Int(0), Int(resource.id)),
        is_expandable: segment.reserved.is_some(),
        frames: frames.of("segment_allocate", resource.id, segment.address),
        blocks,
    }
}

/// PyTorch's state of an allocated block.
const ALLOCATED: &str = "active_allocated";
/// PyTorch's state of a free block.
const INACTIVE: &str = "inactive";

/// PyTorch's block for one of `resource`'s.
fn block(block: &BlockView, resource: u64, frames: &FramesOf<'_>) -> Block {
    let (state, requested) = match block.state {
        BlockState::Allocated { requested } => (ALLOCATED, requested),
        // PyTorch's pending block keeps what was asked for, which ours does not know.
        BlockState::Pending => ("active_pending_free", block.size),
        BlockState::Free => (INACTIVE, 0),
    };
    let frames = if state == INACTIVE { Vec::new() } else { frames.of("allocate", resource, block.address) };
    Block { address: Int(block.address), size: Int(block.size), requested_size: Int(requested), state, frames }
}

/// The latest event of each kind, resource and address: where a block or segment came from.
struct FramesOf<'a> {
    latest: HashMap<(&'a str, u64, u64), &'a EventView>,
}

impl<'a> FramesOf<'a> {
    fn new(events: &'a [EventView]) -> FramesOf<'a> {
        let latest = events.iter().map(|event| ((event.kind.as_str(), event.resource, event.address), event)).collect();
        FramesOf { latest }
    }

    /// The frames of the latest `kind` event of `resource` at `address`; none when unrecorded.
    fn of(&self, kind: &str, resource: u64, address: u64) -> Vec<Frame> {
        self.latest.get(&(kind, resource, address)).map_or_else(Vec::new, |event| frames(event))
    }
}

/// An event's backtrace as frames: each `N: symbol` line a frame, named by the symbol, with the
/// file and line of the `at file:line:column` line after it (`??` and 0 without one).
fn frames(event: &EventView) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    for line in event.backtrace.iter().flatten().map(|line| line.trim()) {
        if let Some(place) = line.strip_prefix("at ") {
            if let Some(frame) = frames.last_mut().filter(|frame| frame.filename == "??") {
                (frame.filename, frame.line) = file_and_line(place);
            }
        } else if let Some((number, symbol)) = line.split_once(": ")
            && number.parse::<u64>().is_ok()
        {
            frames.push(Frame { filename: "??".to_owned(), line: Int(0), name: symbol.to_owned() });
        }
    }
    frames
}

/// `file:line:column` (or `file:line`) as the file and the line.
fn file_and_line(place: &str) -> (String, Int) {
    let mut parts = place.rsplitn(3, ':');
    let (last, middle, file) = (parts.next(), parts.next(), parts.next());
    match (file, middle.and_then(|m| m.parse().ok()), last.and_then(|l| l.parse().ok())) {
        (Some(file), Some(line), Some(_column)) => (file.to_owned(), Int(line)),
        (_, _, Some(line)) => (place.rsplit_once(':').map_or(place, |(file, _)| file).to_owned(), Int(line)),
        _ => (place.to_owned(), Int(0)),
    }
}

#[cfg(test)]
mod tests {
    use serde_pickle::{DeOptions, HashableValue, Value};

    use super::*;
    use crate::history::{HistoryRecord, ResourceId};
    use crate::snapshot::ResourceKind;

    pub(super) fn event(kind: &str, address: u64, size: u64, resource: u64) -> EventView {
        EventView { time_ns: 5_000, kind: kind.into(), address, size, stream: 7, resource, thread: 1, backtrace: None }
    }

    /// A cache (1) over a virtual memory resource (3) that shows the same range, and a pool (4,
    /// handle 0x44): the cache's segment has an allocated, a pending and a free block.
    fn sample(events: Vec<EventView>) -> MemorySnapshot {
        let mut cache = ResourceSnapshot::new(ResourceId(1), ResourceKind::Caching, "cache");
        (cache.device, cache.upstream) = (Some(0), Some(3));
        let mut segment = SegmentView::new(0x1000, 4096);
        segment.stream = 7;
        segment.blocks = vec![
            BlockView::new(0x1000, 1024, BlockState::Allocated { requested: 1000 }),
            BlockView::new(0x1400, 1024, BlockState::Pending),
            BlockView::new(0x1800, 2048, BlockState::Free),
        ];
        cache.segments.push(segment);
        let mut vmm = ResourceSnapshot::new(ResourceId(3), ResourceKind::VirtualMemory, "vmm");
        vmm.device = Some(0);
        let mut range = SegmentView::new(0x1000, 4096);
        range.reserved = Some(1 << 20);
        range.blocks = vec![BlockView::new(0x1000, 4096, BlockState::Allocated { requested: 4096 })];
        vmm.segments.push(range);
        let mut pool = ResourceSnapshot::new(ResourceId(4), ResourceKind::DevicePool, "pool");
        (pool.device, pool.pool) = (Some(0), Some(0x44));
        let mut snapshot = MemorySnapshot::new(vec![cache, vmm, pool], &HistoryRecord::default(), 0);
        snapshot.events = events;
        snapshot
    }

    fn key(name: &str) -> HashableValue {
        HashableValue::String(name.into())
    }

    /// The value at `path` (dictionary keys, or list indices as numbers) of a pickled snapshot.
    fn at<'v>(value: &'v Value, path: &[&str]) -> &'v Value {
        path.iter().fold(value, |value, step| match (value, step.parse::<usize>()) {
            (Value::List(items), Ok(index)) => &items[index],
            (Value::Dict(entries), _) => &entries[&key(step)],
            (other, _) => panic!("no {step} in {other:?}"),
        })
    }

    fn decoded(snapshot: &MemorySnapshot) -> Value {
        serde_pickle::value_from_slice(&snapshot.to_torch_pickle().unwrap(), DeOptions::new()).unwrap()
    }

    #[test]
    fn segments_and_blocks_are_pytorchs_and_an_upstream_under_its_cache_is_left_out() {
        let dump = decoded(&sample(Vec::new()));
        let Value::List(segments) = at(&dump, &["segments"]) else { panic!("{dump:?}") };
        assert_eq!(segments.len(), 1, "the virtual memory range under the cache's segment is left out");
        let segment = at(&dump, &["segments", "0"]);
        let figure = |name: &str| at(segment, &[name]).clone();
        assert_eq!(figure("total_size"), Value::I64(4096));
        assert_eq!((figure("allocated_size"), figure("active_size")), (Value::I64(1024), Value::I64(2048)));
        assert_eq!((figure("requested_size"), figure("stream")), (Value::I64(1000), Value::I64(7)));
        assert_eq!(figure("segment_pool_id"), Value::Tuple(vec![Value::I64(0), Value::I64(1)]));
        assert_eq!(
            (figure("segment_type"), figure("is_expandable")),
            (Value::String("small".into()), Value::Bool(false))
        );
        let states: Vec<Value> = (0..3).map(|i| at(segment, &["blocks", &i.to_string(), "state"]).clone()).collect();
        let names = ["active_allocated", "active_pending_free", "inactive"].map(|name| Value::String(name.into()));
        assert_eq!(states, names);
        let requested: Vec<Value> =
            (0..3).map(|i| at(segment, &["blocks", &i.to_string(), "requested_size"]).clone()).collect();
        assert_eq!(requested, [Value::I64(1000), Value::I64(1024), Value::I64(0)]);
        assert_eq!(at(&dump, &["device_traces"]), &Value::List(vec![Value::List(Vec::new())]));
        assert_eq!(at(&dump, &["allocator_settings"]), &Value::Dict(Default::default()));
    }

    #[test]
    fn events_become_actions_and_a_pools_own_allocations_and_exports_are_left_out() {
        let events = vec![
            event("allocate", 0x1000, 1000, 1),
            event("allocate", 0x1400, 1024, 1),
            event("allocate", 0x9000, 64, 4),
            event("export", 0x9000, 64, 0x44),
            event("out_of_memory", 0, 1 << 40, 0x44),
            event("free_requested", 0x1400, 1024, 1),
        ];
        let dump = decoded(&sample(events));
        let Value::List(trace) = at(&dump, &["device_traces", "0"]) else { panic!("{dump:?}") };
        let actions: Vec<&Value> = trace.iter().map(|entry| at(entry, &["action"])).collect();
        let expected = ["alloc", "alloc", "oom", "free_requested"].map(|name| Value::String(name.into()));
        assert_eq!(actions, expected.iter().collect::<Vec<_>>());
        let oom = &trace[2];
        assert_eq!((at(oom, &["device_free"]), at(oom, &["size"])), (&Value::I64(0), &Value::I64(1 << 40)));
        let Value::Dict(oom) = oom else { panic!() };
        assert!(!oom.contains_key(&key("addr")), "an oom has device_free in place of addr");
        assert_eq!(at(&trace[0], &["addr"]), &Value::I64(0x1000));
        assert_eq!(at(&trace[0], &["time_us"]), &Value::I64(5));
    }

    #[test]
    fn an_address_above_2_to_the_63_is_refused_by_name() {
        let mut snapshot = sample(Vec::new());
        snapshot.resources[0].segments[0].address = 1 << 63;
        let error = snapshot.to_torch_pickle().unwrap_err();
        assert!(matches!(error, SnapshotFormatError::Pickle(_)), "{error}");
        assert!(error.to_string().contains("0x8000000000000000 is above 2^63"), "{error}");
    }

    #[test]
    fn frames_are_read_from_a_backtraces_lines() {
        let mut allocation = event("allocate", 0x1000, 1000, 1);
        allocation.backtrace =
            Some(vec!["   2: my_app::step".into(), "             at ./src/main.rs:9:5".into(), "   3: main".into()]);
        let frame =
            |filename: &str, line, name: &str| Frame { filename: filename.into(), line: Int(line), name: name.into() };
        assert_eq!(frames(&allocation), [frame("./src/main.rs", 9, "my_app::step"), frame("??", 0, "main")]);
        assert_eq!(file_and_line("C:\\x.rs:12"), ("C:\\x.rs".to_owned(), Int(12)));
        assert_eq!(file_and_line("nowhere"), ("nowhere".to_owned(), Int(0)));
        let dump = decoded(&sample(vec![allocation]));
        let name = at(&dump, &["segments", "0", "blocks", "0", "frames", "0", "name"]);
        assert_eq!(name, &Value::String("my_app::step".into()), "a block's frames are its allocation's");
    }
}
