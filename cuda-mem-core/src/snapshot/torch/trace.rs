//! The `device_traces` of PyTorch's snapshot: the history's events as the viewer's actions, kept
//! consistent with the final segments by walking them backwards as the viewer does.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::{Frame, Int, frames};
use crate::snapshot::model::{BlockState, EventView, MemorySnapshot, ResourceKind, ResourceSnapshot, SegmentView};

/// What the viewer's trace says an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
}

impl Action {
    /// The action of an event of kind `kind` (a [`MemoryEventKind`](crate::history::MemoryEventKind)
    /// name); none for exports and imports, which PyTorch has no action for.
    fn of(kind: &str) -> Option<Action> {
        Some(match kind {
            "allocate" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_allocate" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_grow" => Action::SegmentMap,
            "segment_shrink" => Action::SegmentUnmap,
            "out_of_memory" => Action::Oom,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
        }
    }
}

/// An entry of a device's trace, as PyTorch's snapshot has it (an `oom` has `device_free` in
/// place of `addr`).
#[derive(Debug, Serialize)]
pub(super) struct Entry {
    action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    addr: Option<Int>,
    #[serde(skip_serializing_if = "Option::is_none")]
    device_free: Option<Int>,
    size: Int,
    stream: Int,
    time_us: Int,
    frames: Vec<Frame>,
}

/// One event of the trace, and the action it is.
#[derive(Debug, Clone, Copy)]
struct Step<'a> {
    action: Action,
    event: &'a EventView,
}

impl Step<'_> {
    fn entry(self) -> Entry {
        let event = self.event;
        let oom = self.action == Action::Oom;
        Entry {
            action: self.action.name(),
            addr: (!oom).then_some(Int(event.address)),
            // The history does not record the driver's free memory at a failure.
            device_free: oom.then_some(Int(0)),
            size: Int(event.size),
            stream: Int(event.stream),
            time_us: Int(event.time_ns / 1000),
            frames: frames(event),
        }
    }
}

/// The device index (plus one) of every event the traces show: the length they need.
pub(super) fn devices(snapshot: &MemorySnapshot) -> impl Iterator<Item = usize> + '_ {
    snapshot.events.iter().filter_map(|event| Some(step(snapshot, event)?.0 + 1))
}

/// The trace of `device`, whose final segments are `segments`: its events that the viewer can
/// undo from them, oldest first.
pub(super) fn device_trace(snapshot: &MemorySnapshot, device: usize, segments: &[&SegmentView]) -> Vec<Entry> {
    let steps: Vec<Step<'_>> = snapshot
        .events
        .iter()
        .filter_map(|event| step(snapshot, event))
        .filter(|(d, _)| *d == device)
        .map(|(_, s)| s)
        .collect();
    Walk::new(segments).consistent(&steps).into_iter().map(Step::entry).collect()
}

/// The device and action of an event the traces show: one of a live resource with a device, an
/// out-of-memory failure or an event of a resource whose memory lies in segments.
fn step<'a>(snapshot: &MemorySnapshot, event: &'a EventView) -> Option<(usize, Step<'a>)> {
    let action = Action::of(&event.kind)?;
    let resource = snapshot.resource_of_event(event.resource)?;
    let device = usize::try_from(resource.device?).ok()?;
    (action == Action::Oom || has_segments(resource)).then_some((device, Step { action, event }))
}

/// Whether a resource's memory lies in segments (a driver pool's does not: the driver places it).
fn has_segments(resource: &ResourceSnapshot) -> bool {
    !resource.segments.is_empty() || matches!(resource.kind, ResourceKind::Caching | ResourceKind::VirtualMemory)
}

/// A segment, as the viewer's walk holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    address: u64,
    size: u64,
    stream: u64,
}

impl Range {
    fn end(&self) -> u64 {
        self.address.saturating_add(self.size)
    }

    fn of(event: &EventView) -> Range {
        Range { address: event.address, size: event.size, stream: event.stream }
    }
}

/// What the walk does with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Keep,
    /// A free whose completion is not in the trace: kept, with its completion beside it.
    KeepCompleted,
    Leave,
}

/// The viewer's backward walk ("Allocator State History"): from the final segments and active
/// blocks, each event undone, newest first. Its segment list changes as the viewer's does
/// (merging neighbours of one stream, inserting where the viewer inserts), so that every check
/// here is one the viewer would pass.
#[derive(Debug)]
struct Walk {
    segments: Vec<Range>,
    /// Active blocks by address: whether a free of them was requested (pending).
    blocks: BTreeMap<u64, bool>,
    /// Addresses whose free was left out: their allocation goes too.
    orphans: HashSet<u64>,
}

impl Walk {
    fn new(segments: &[&SegmentView]) -> Walk {
        let mut ranges: Vec<Range> =
            segments.iter().map(|s| Range { address: s.address, size: s.size, stream: s.stream }).collect();
        ranges.sort_by_key(|range| range.address);
        let blocks = segments
            .iter()
            .flat_map(|segment| &segment.blocks)
            .filter_map(|block| match block.state {
                BlockState::Allocated { .. } => Some((block.address, false)),
                BlockState::Pending => Some((block.address, true)),
                BlockState::Free => None,
            })
            .collect();
        Walk { segments: ranges, blocks, orphans: HashSet::new() }
    }

    /// `steps` (oldest first) less those the viewer could not undo, with the completions of
    /// frees that lack one: oldest first.
    fn consistent<'a>(mut self, steps: &[Step<'a>]) -> Vec<Step<'a>> {
        let mut kept = Vec::with_capacity(steps.len());
        for step in steps.iter().rev() {
            match self.undo(*step) {
                Verdict::Keep => kept.push(*step),
                Verdict::KeepCompleted => {
                    kept.push(Step { action: Action::FreeCompleted, event: step.event });
                    kept.push(*step);
                }
                Verdict::Leave => {}
            }
        }
        kept.reverse();
        kept
    }

    /// Undoes `step` if the viewer can, and says so.
    fn undo(&mut self, step: Step<'_>) -> Verdict {
        let address = step.event.address;
        match step.action {
            Action::Alloc if self.orphans.remove(&address) => Verdict::Leave,
            Action::Alloc => {
                self.blocks.remove(&address);
                Verdict::Keep
            }
            // A completion after its block was allocated again is out of order: the free stands
            // completed at once instead.
            Action::FreeCompleted if self.blocks.contains_key(&address) || !self.in_segment(address) => Verdict::Leave,
            Action::FreeCompleted => {
                self.blocks.insert(address, true);
                Verdict::Keep
            }
            Action::FreeRequested => self.undo_free(address),
            Action::SegmentAlloc => self.undo_segment_alloc(address),
            Action::SegmentFree | Action::SegmentUnmap if self.overlaps(Range::of(step.event)) => Verdict::Leave,
            Action::SegmentFree => {
                self.insert(Range::of(step.event));
                Verdict::Keep
            }
            Action::SegmentUnmap => {
                self.insert_merged(Range::of(step.event));
                Verdict::Keep
            }
            Action::SegmentMap => self.undo_map(Range::of(step.event)),
            Action::Oom => Verdict::Keep,
        }
    }

    /// A free requested: the block it freed is active again (the viewer finds it by address).
    fn undo_free(&mut self, address: u64) -> Verdict {
        match self.blocks.get(&address) {
            Some(true) => {
                self.blocks.insert(address, false);
                Verdict::Keep
            }
            None if self.in_segment(address) => {
                self.blocks.insert(address, false);
                Verdict::KeepCompleted
            }
            // Allocated, not freed, here; or in no segment (freed after its segment went, or a
            // resource's that leaves no segment behind).
            _ => {
                self.orphans.insert(address);
                Verdict::Leave
            }
        }
    }

    /// A segment allocated: gone (the viewer finds it by its address), if no block is in it.
    fn undo_segment_alloc(&mut self, address: u64) -> Verdict {
        let Some(at) = self.segments.iter().position(|s| s.address == address) else { return Verdict::Leave };
        if self.holds_block(self.segments[at].address, self.segments[at].end()) {
            return Verdict::Leave;
        }
        self.segments.remove(at);
        Verdict::Keep
    }

    /// A range mapped at a segment's end (or start, or within): unmapped again, if no block is in it.
    fn undo_map(&mut self, range: Range) -> Verdict {
        let Some(at) = self.segments.iter().position(|s| s.address <= range.address && range.end() <= s.end()) else {
            return Verdict::Leave;
        };
        if self.holds_block(range.address, range.end()) {
            return Verdict::Leave;
        }
        let existing = self.segments[at];
        if existing.address == range.address {
            self.segments[at].address += range.size;
            self.segments[at].size -= range.size;
            if self.segments[at].size == 0 {
                self.segments.remove(at);
            }
        } else if existing.end() == range.end() {
            self.segments[at].size -= range.size;
        } else {
            self.segments[at].size = range.address - existing.address;
            let tail = Range { address: range.end(), size: existing.end() - range.end(), stream: range.stream };
            self.segments.insert(at + 1, tail);
        }
        Verdict::Keep
    }

    /// Inserts a freed segment back where the viewer does: before the first above it, or (as
    /// JavaScript's `splice(-1, 0, …)` does) before the last when none is above.
    fn insert(&mut self, range: Range) {
        let at = self.segments.iter().position(|s| s.address > range.address);
        self.segments.insert(at.unwrap_or(self.segments.len().saturating_sub(1)), range);
    }

    /// Inserts an unmapped range back, merged with its neighbours in the list when they touch it
    /// and share its stream.
    fn insert_merged(&mut self, range: Range) {
        let at = self.segments.iter().position(|s| s.address > range.address).unwrap_or(self.segments.len());
        self.segments.insert(at, range);
        if let Some(next) = self.segments.get(at + 1).copied()
            && range.end() == next.address
            && range.stream == next.stream
        {
            self.segments[at].size += next.size;
            self.segments.remove(at + 1);
        }
        if at > 0 {
            let (previous, this) = (self.segments[at - 1], self.segments[at]);
            if previous.end() == this.address && previous.stream == this.stream {
                self.segments[at - 1].size += this.size;
                self.segments.remove(at);
            }
        }
    }

    fn in_segment(&self, address: u64) -> bool {
        self.segments.iter().any(|s| s.address <= address && address < s.end())
    }

    fn overlaps(&self, range: Range) -> bool {
        self.segments.iter().any(|s| s.address < range.end() && range.address < s.end())
    }

    fn holds_block(&self, start: u64, end: u64) -> bool {
        self.blocks.range(start..end).next().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::BlockView;
    use crate::snapshot::torch::tests::event;

    /// A segment of 0x1000 bytes at 0x1000 on stream 7, with an allocated block at 0x1000 of
    /// 0x400 bytes, the rest free.
    fn segment() -> SegmentView {
        let mut segment = SegmentView::new(0x1000, 0x1000);
        segment.stream = 7;
        segment.blocks = vec![
            BlockView::new(0x1000, 0x400, BlockState::Allocated { requested: 0x400 }),
            BlockView::new(0x1400, 0xc00, BlockState::Free),
        ];
        segment
    }

    /// The actions and addresses the walk keeps of `events` (kind, address, size).
    fn walked(segments: &[SegmentView], events: &[(&str, u64, u64)]) -> Vec<(&'static str, u64)> {
        let events: Vec<EventView> =
            events.iter().map(|&(kind, address, size)| event(kind, address, size, 1)).collect();
        let steps: Vec<Step<'_>> =
            events.iter().map(|event| Step { action: Action::of(&event.kind).unwrap(), event }).collect();
        let segments: Vec<&SegmentView> = segments.iter().collect();
        Walk::new(&segments).consistent(&steps).iter().map(|step| (step.action.name(), step.event.address)).collect()
    }

    #[test]
    fn a_free_without_its_completion_gets_one_beside_it() {
        let kept = walked(&[segment()], &[("allocate", 0x1400, 0x100), ("free_requested", 0x1400, 0x100)]);
        assert_eq!(kept, [("alloc", 0x1400), ("free_requested", 0x1400), ("free_completed", 0x1400)]);
    }

    #[test]
    fn a_completion_after_its_block_was_allocated_again_is_left_out() {
        let kept = walked(
            &[segment()],
            &[("free_requested", 0x1000, 0x400), ("allocate", 0x1000, 0x400), ("free_completed", 0x1000, 0x400)],
        );
        assert_eq!(kept, [("free_requested", 0x1000), ("free_completed", 0x1000), ("alloc", 0x1000)]);
    }

    #[test]
    fn a_free_in_no_segment_is_left_out_with_its_allocation() {
        let kept = walked(
            &[segment()],
            &[("allocate", 0x9000, 0x100), ("free_requested", 0x9000, 0x100), ("out_of_memory", 0, 1 << 40)],
        );
        assert_eq!(kept, [("oom", 0)]);
    }

    #[test]
    fn a_free_of_a_block_still_allocated_is_left_out_and_so_is_the_allocation_before_it() {
        let kept = walked(&[segment()], &[("allocate", 0x1000, 0x400), ("free_requested", 0x1000, 0x400)]);
        assert_eq!(kept, []);
    }

    #[test]
    fn segments_mapped_and_unmapped_are_undone_as_the_viewer_does() {
        // Allocated with 0x800 mapped, grown by 0x800, shrunk by 0x400 and grown back (its end
        // held by no block), then a block allocated: the final segment is 0x1000 bytes.
        let events = [
            ("segment_allocate", 0x1000, 0x800),
            ("segment_grow", 0x1800, 0x800),
            ("segment_shrink", 0x1c00, 0x400),
            ("segment_grow", 0x1c00, 0x400),
            ("allocate", 0x1000, 0x400),
        ];
        let kept = walked(&[segment()], &events);
        assert_eq!(kept.len(), events.len(), "{kept:?}");
        // A grow whose range holds a live block cannot be undone: left out.
        let kept = walked(&[segment()], &[("segment_grow", 0x1000, 0x800)]);
        assert_eq!(kept, []);
        // A segment allocated before its final block's allocation was recorded: left out.
        let kept = walked(&[segment()], &[("segment_allocate", 0x1000, 0x1000)]);
        assert_eq!(kept, []);
        // A segment freed where another lies is left out; elsewhere it comes back.
        let kept = walked(&[segment()], &[("segment_free", 0x1800, 0x100), ("segment_free", 0x4000, 0x100)]);
        assert_eq!(kept, [("segment_free", 0x4000)]);
    }

    #[test]
    fn the_viewers_segment_list_is_kept_as_it_keeps_it() {
        let mut walk = Walk::new(&[]);
        let range = |address, size| Range { address, size, stream: 7 };
        // JavaScript's splice(-1, 0, …) when none is above: before the last, not after it.
        for address in [0x1000, 0x3000, 0x5000, 0x2000] {
            walk.insert(range(address, 0x100));
        }
        assert_eq!(walk.segments.iter().map(|s| s.address).collect::<Vec<_>>(), [0x2000, 0x3000, 0x5000, 0x1000]);
        let mut walk = Walk::new(&[]);
        walk.insert_merged(range(0x1000, 0x100));
        walk.insert_merged(range(0x1200, 0x100));
        walk.insert_merged(range(0x1100, 0x100));
        assert_eq!(walk.segments, [range(0x1000, 0x300)], "merged with both neighbours");
        assert_eq!(walk.undo_map(range(0x1100, 0x100)), Verdict::Keep);
        assert_eq!(walk.segments, [range(0x1000, 0x100), range(0x1200, 0x100)], "split around the hole");
    }
}
