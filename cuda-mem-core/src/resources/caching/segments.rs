//! [`Arena`]: the segments one stream's state holds, the blocks they are split into, and the
//! splitting and merging of blocks; every change of a block is counted in the resource's
//! [`Counters`] here, so the statistics follow the blocks by construction.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::bins::Bins;
use super::options::{CachingOptions, SizeClass};
use super::statistics::{Counters, Field, LocalCounters};
use crate::device::DevicePtr;

/// What a block is.
#[derive(Debug)]
pub(super) enum BlockState<P> {
    /// Handed out, for `requested` bytes.
    Allocated { requested: usize },
    /// Free for the arena's stream. Another stream may take it once an event recorded on the
    /// arena's stream after its `epoch`-th free has completed; epoch 0: for anyone.
    Free { epoch: u64 },
    /// Freed on another stream, whose last use `P` (an event) says when it is done; no stream
    /// takes it before (it is then made free for anyone, [`Arena::settle`]). Boxed: blocks move
    /// within the map's nodes on every insert and remove, and the common ones stay small.
    Pending(Box<P>),
}

/// A block: part of one segment, as many bytes as `size`.
#[derive(Debug)]
pub(super) struct Block<P> {
    pub(super) size: usize,
    /// The base address of its segment.
    pub(super) segment: DevicePtr,
    /// Its segment's size and class (kept here: no lookup of the segment on the hot path).
    pub(super) of: Segment,
    pub(super) state: BlockState<P>,
}

/// One upstream allocation, or one expandable range of the upstream's
/// ([`ExpandableMemory`](crate::ExpandableMemory)): its mapped part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Segment {
    /// The bytes it holds (of an expandable segment: the bytes mapped from its base).
    pub(super) size: usize,
    pub(super) class: SizeClass,
    /// The addresses reserved for an expandable segment, which it grows into; 0 for a segment
    /// of fixed size.
    pub(super) reserved: usize,
}

impl Segment {
    /// A segment of fixed size (one upstream allocation).
    pub(super) fn fixed(size: usize, class: SizeClass) -> Segment {
        Segment { size, class, reserved: 0 }
    }

    /// Whether it is an expandable range.
    pub(super) fn is_expandable(&self) -> bool {
        self.reserved > 0
    }
}

/// The segments of one stream's state and their blocks. Blocks tile their segment exactly: a
/// split makes two blocks of one, a merge one of two free neighbours, and no byte is in two
/// blocks or none.
#[derive(Debug)]
pub(super) struct Arena<P> {
    segments: BTreeMap<DevicePtr, Segment>,
    blocks: BTreeMap<DevicePtr, Block<P>>,
    bins: Bins,
    pending: BTreeSet<DevicePtr>,
    /// Frees (and segments added) so far: the epoch of the latest.
    epoch: u64,
    /// The resource's counters: segments and reserved bytes, which change rarely, are counted
    /// there, for exact figures across streams.
    counters: Arc<Counters>,
    /// This stream's figures of its blocks, under its lock: the hot path writes no shared
    /// memory.
    local: LocalCounters,
    /// Blocks freed on the arena's stream and not merged yet, newest last: free in `blocks`
    /// and in the figures, but in no bin ([`free_recent`](Arena::free_recent)).
    recent: Vec<Recent>,
}

/// A block freed on the arena's stream whose merge with its neighbours waits
/// ([`Arena::free_recent`]): a stream that frees a block and asks for the same size again (the
/// common pair) gets it back without touching the bins.
#[derive(Debug, Clone, Copy)]
struct Recent {
    ptr: DevicePtr,
    size: usize,
    of: Segment,
}

/// How many recent frees wait before they are merged.
const RECENT_CAPACITY: usize = 8;

impl<P> Arena<P> {
    pub(super) fn new(counters: Arc<Counters>) -> Self {
        Arena {
            segments: BTreeMap::new(),
            blocks: BTreeMap::new(),
            bins: Bins::default(),
            pending: BTreeSet::new(),
            epoch: 0,
            counters,
            local: LocalCounters::default(),
            recent: Vec::with_capacity(RECENT_CAPACITY),
        }
    }

    /// The epoch of the latest free: an event recorded on the stream now follows every free up
    /// to it.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether the arena holds no segment.
    pub(super) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Whether any pending block waits for its event.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The segment at `base`.
    pub(super) fn segment(&self, base: DevicePtr) -> Option<Segment> {
        self.segments.get(&base).copied()
    }

    pub(super) fn segments(&self) -> impl Iterator<Item = (DevicePtr, Segment)> + '_ {
        self.segments.iter().map(|(&base, &segment)| (base, segment))
    }

    /// The blocks of the segment at `base`, in address order.
    pub(super) fn blocks_of(&self, base: DevicePtr) -> impl Iterator<Item = (DevicePtr, &Block<P>)> + '_ {
        let end = self.segments.get(&base).map_or(base, |segment| base + segment.size as DevicePtr);
        self.blocks.range(base..end).map(|(&ptr, block)| (ptr, block))
    }

    /// The largest free block.
    pub(super) fn largest_free(&self) -> usize {
        self.bins.largest()
    }

    /// Whether a free block of `class` of at least `size` bytes is here.
    pub(super) fn has_fit(&self, class: SizeClass, size: usize) -> bool {
        self.bins.has_fit(class, size)
    }

    /// Takes a new segment at `base`, as one free block of the latest epoch (another stream may
    /// use it once the upstream's allocation on this stream is done).
    pub(super) fn add_segment(&mut self, base: DevicePtr, segment: Segment) {
        self.counters.add(segment.class, Field::ReservedBytes, segment.size as u64);
        self.counters.add(segment.class, Field::Segments, 1);
        self.attach_segment(base, segment);
    }

    /// The expandable segment of `class` that can serve `rounded` bytes by growing: one whose
    /// free bytes at its end, with what its reservation has left, come to `rounded`. Its base
    /// and the bytes free at its end.
    pub(super) fn growable(&self, class: SizeClass, rounded: usize) -> Option<(DevicePtr, usize)> {
        self.segments.iter().filter(|(_, segment)| segment.class == class && segment.is_expandable()).find_map(
            |(&base, segment)| {
                let free_at_end = self.free_at_end(base, segment);
                let room = segment.reserved - segment.size + free_at_end;
                (room >= rounded).then_some((base, free_at_end))
            },
        )
    }

    /// The bytes of the free block that ends `segment` (at `base`), if its last block is free
    /// (not pending, whatever its epoch).
    fn free_at_end(&self, base: DevicePtr, segment: &Segment) -> usize {
        let end = base + segment.size as DevicePtr;
        match self.blocks.range(base..end).next_back() {
            Some((_, Block { size, state: BlockState::Free { .. }, .. })) => *size,
            _ => 0,
        }
    }

    /// The expandable segments whose last block is free and which are not wholly free: each
    /// base, and the offset its free end starts at (what a shrink may unmap from).
    pub(super) fn shrinkable(&self) -> Vec<(DevicePtr, usize)> {
        self.segments
            .iter()
            .filter(|(_, segment)| segment.is_expandable())
            .filter_map(|(&base, segment)| {
                let free = self.free_at_end(base, segment);
                (free > 0 && free < segment.size).then_some((base, segment.size - free))
            })
            .collect()
    }

    /// The expandable segment at `base` grew by `added` bytes mapped at its end: one free block
    /// of the latest epoch, merged with a free last block.
    pub(super) fn expand_segment(&mut self, base: DevicePtr, added: usize) {
        let Some(segment) = self.segments.get_mut(&base) else { return };
        let old_end = base + segment.size as DevicePtr;
        segment.size += added;
        let segment = *segment;
        self.counters.add(segment.class, Field::ReservedBytes, added as u64);
        self.count_segment(segment.class, added, 0, true);
        self.resize_blocks_of(base, old_end, segment);
        self.epoch += 1;
        let block = Block { size: added, segment: base, of: segment, state: BlockState::Free { epoch: self.epoch } };
        self.insert(old_end, block);
        self.set_free(old_end, self.epoch);
    }

    /// The expandable segment at `base` keeps only its first `mapped` bytes (the rest was
    /// unmapped): they lay in its free last block, which shrinks or goes. A segment left with
    /// nothing mapped is removed.
    pub(super) fn shrink_segment(&mut self, base: DevicePtr, mapped: usize) {
        let Some(&segment) = self.segments.get(&base) else { return };
        if mapped >= segment.size {
            return;
        }
        if mapped == 0 {
            self.remove_segment(base);
            return;
        }
        let (end, new_end) = (base + segment.size as DevicePtr, base + mapped as DevicePtr);
        let Some((&last, _)) = self.blocks.range(base..end).next_back() else { return };
        let Some(block) = self.remove(last) else { return };
        let BlockState::Free { epoch } = block.state else {
            debug_assert!(false, "only a free end is unmapped");
            self.insert(last, block);
            return;
        };
        let shrunk = Segment { size: mapped, ..segment };
        self.segments.insert(base, shrunk);
        self.counters.subtract(segment.class, Field::ReservedBytes, (segment.size - mapped) as u64);
        self.count_segment(segment.class, segment.size - mapped, 0, false);
        self.resize_blocks_of(base, new_end, shrunk);
        if last < new_end {
            // Inside the segment, whose size is a `usize`: the cast is lossless.
            let size = (new_end - last) as usize;
            self.insert(last, Block { size, segment: base, of: shrunk, state: BlockState::Free { epoch } });
        }
    }

    /// Gives the blocks of the segment at `base` below `end` its new size (recounted: whether a
    /// free block is a split one depends on it).
    fn resize_blocks_of(&mut self, base: DevicePtr, end: DevicePtr, segment: Segment) {
        for block in self.blocks.range_mut(base..end).map(|(_, block)| block) {
            Self::count(&mut self.local, block, false);
            block.of = segment;
            Self::count(&mut self.local, block, true);
        }
    }

    /// Counts `bytes` of reserved memory and `segments` segments of `class` in (`add`) or out
    /// of this stream's figures (the resource's own counters count them apart).
    fn count_segment(&mut self, class: SizeClass, bytes: usize, segments: u64, add: bool) {
        self.local.apply(class, Field::ReservedBytes, bytes as u64, add);
        self.local.apply(class, Field::Segments, segments, add);
    }

    /// Takes over a wholly free segment that another arena of the same resource
    /// [detached](Arena::detach_free_segment) (the resource's counters already count it), as one
    /// free block of the latest epoch: for this arena's stream now, for another once an event
    /// recorded on this stream after it has completed.
    pub(super) fn attach_segment(&mut self, base: DevicePtr, segment: Segment) {
        self.segments.insert(base, segment);
        self.count_segment(segment.class, segment.size, 1, true);
        self.epoch += 1;
        let block =
            Block { size: segment.size, segment: base, of: segment, state: BlockState::Free { epoch: self.epoch } };
        self.insert(base, block);
    }

    /// When the best-fitting free block of `class` for `rounded` bytes whose epoch is at most
    /// `epoch` (what [`take`](Arena::take) would hand out) is a whole segment, removes that
    /// segment, for another arena of the same resource to [attach](Arena::attach_segment): it
    /// stays counted in the resource's counters, and no block of it is allocated or pending.
    pub(super) fn detach_free_segment(
        &mut self,
        class: SizeClass,
        rounded: usize,
        epoch: u64,
    ) -> Option<(DevicePtr, Segment)> {
        let blocks = &self.blocks;
        let (size, ptr) = self.bins.best_fit(class, rounded, |ptr| {
            matches!(blocks.get(&ptr), Some(Block { state: BlockState::Free { epoch: freed }, .. }) if *freed <= epoch)
        })?;
        let segment = *self.segments.get(&ptr)?;
        if segment.size != size {
            return None;
        }
        self.remove(ptr)?;
        self.segments.remove(&ptr);
        self.count_segment(segment.class, segment.size, 1, false);
        Some((ptr, segment))
    }

    /// Hands out the best-fitting free block of `class` for `rounded` bytes whose epoch is at
    /// most `epoch` (`u64::MAX`: any), split when the policy says so.
    pub(super) fn take(
        &mut self,
        options: &CachingOptions,
        class: SizeClass,
        rounded: usize,
        requested: usize,
        epoch: u64,
    ) -> Option<DevicePtr> {
        let blocks = &self.blocks;
        let (size, ptr) = self.bins.best_fit(class, rounded, |ptr| {
            matches!(blocks.get(&ptr), Some(Block { state: BlockState::Free { epoch: freed }, .. }) if *freed <= epoch)
        })?;
        // Changed in place (one lookup), the remainder of a split added beside it.
        self.bins.remove(class, size, ptr);
        let block = self.blocks.get_mut(&ptr)?;
        let BlockState::Free { epoch: freed } = block.state else { return None };
        Self::count(&mut self.local, block, false);
        let split = options.splits(class, size, rounded, block.of.is_expandable());
        if split {
            block.size = rounded;
        }
        block.state = BlockState::Allocated { requested };
        Self::count(&mut self.local, block, true);
        let (segment, of) = (block.segment, block.of);
        if split {
            let rest = Block { size: size - rounded, segment, of, state: BlockState::Free { epoch: freed } };
            self.insert(ptr + rounded as DevicePtr, rest);
        }
        Some(ptr)
    }

    /// The size of the block allocated at `ptr`, if one is.
    pub(super) fn allocated_size(&self, ptr: DevicePtr) -> Option<usize> {
        match self.blocks.get(&ptr) {
            Some(Block { size, state: BlockState::Allocated { .. }, .. }) => Some(*size),
            _ => None,
        }
    }

    /// Frees the block allocated at `ptr` for this arena's stream, without merging it with its
    /// free neighbours yet: it waits among the recent frees, free for the figures,
    /// for [`take_recent`](Arena::take_recent) to hand it out again, until
    /// [`flush_recent`](Arena::flush_recent) merges it. Every other use of the arena must flush
    /// first (the bins and the merges do not see recent blocks). False when no block is
    /// allocated there.
    #[inline]
    pub(super) fn free_recent(&mut self, ptr: DevicePtr) -> bool {
        if self.recent.len() == RECENT_CAPACITY {
            self.flush_recent();
        }
        let Some(block) = self.blocks.get_mut(&ptr) else { return false };
        let BlockState::Allocated { .. } = block.state else { return false };
        self.epoch += 1;
        Self::count(&mut self.local, block, false);
        block.state = BlockState::Free { epoch: self.epoch };
        Self::count(&mut self.local, block, true);
        self.recent.push(Recent { ptr, size: block.size, of: block.of });
        true
    }

    /// The most recently freed block of [`free_recent`](Arena::free_recent)'s that serves
    /// `rounded` bytes of `class` as the bins would without a split: one of that size, or a
    /// larger one the policy hands out whole.
    #[inline]
    pub(super) fn take_recent(
        &mut self,
        options: &CachingOptions,
        class: SizeClass,
        rounded: usize,
        requested: usize,
    ) -> Option<DevicePtr> {
        let fits = |r: &Recent| {
            r.of.class == class
                && (r.size == rounded
                    || (r.size > rounded && !options.splits(class, r.size, rounded, r.of.is_expandable())))
        };
        let index = self.recent.iter().rposition(fits)?;
        let Recent { ptr, .. } = self.recent.swap_remove(index);
        let block = self.blocks.get_mut(&ptr)?;
        Self::count(&mut self.local, block, false);
        block.state = BlockState::Allocated { requested };
        Self::count(&mut self.local, block, true);
        Some(ptr)
    }

    /// Merges the recent frees with their free neighbours into the bins, as a free merges.
    /// A recent block merged into an earlier one meanwhile is no block any more, and is skipped.
    pub(super) fn flush_recent(&mut self) {
        while let Some(Recent { ptr, .. }) = self.recent.pop() {
            let Some(&Block { state: BlockState::Free { epoch }, .. }) = self.blocks.get(&ptr) else { continue };
            self.set_free(ptr, epoch);
        }
    }

    /// Whether no recent free waits (what every use but the fast pair expects).
    pub(super) fn is_flushed(&self) -> bool {
        self.recent.is_empty()
    }

    /// Frees the block allocated at `ptr` for this arena's stream, merged with its free
    /// neighbours at once (the resource frees through [`free_recent`](Arena::free_recent) and
    /// merges later). False when no block is allocated there.
    #[cfg(test)]
    pub(super) fn free_here(&mut self, ptr: DevicePtr) -> bool {
        let freed = self.free_recent(ptr);
        self.flush_recent();
        freed
    }

    /// Frees the block allocated at `ptr` on another stream, pending until `last_use` is done.
    /// `last_use` back when no block is allocated there.
    pub(super) fn free_pending(&mut self, ptr: DevicePtr, last_use: P) -> Result<(), P> {
        let Some(mut block) = self.allocated_size(ptr).and_then(|_| self.remove(ptr)) else { return Err(last_use) };
        block.state = BlockState::Pending(Box::new(last_use));
        self.pending.insert(ptr);
        self.insert(ptr, block);
        Ok(())
    }

    /// The pending blocks whose last use `done` says is done.
    pub(super) fn pending_where(&mut self, mut done: impl FnMut(&mut P) -> bool) -> Vec<DevicePtr> {
        let mut found = Vec::new();
        for ptr in &self.pending {
            if let Some(Block { state: BlockState::Pending(last_use), .. }) = self.blocks.get_mut(ptr)
                && done(last_use)
            {
                found.push(*ptr);
            }
        }
        found
    }

    /// The pending blocks of the segment at `base` and what each waits for.
    pub(super) fn pending_in(&mut self, base: DevicePtr) -> impl Iterator<Item = &mut P> + '_ {
        let end = self.segments.get(&base).map_or(base, |segment| base + segment.size as DevicePtr);
        self.blocks.range_mut(base..end).filter_map(|(_, block)| match &mut block.state {
            BlockState::Pending(last_use) => Some(&mut **last_use),
            _ => None,
        })
    }

    /// A pending block whose last use is done: free for any stream, merged with its free
    /// neighbours.
    pub(super) fn settle(&mut self, ptr: DevicePtr) {
        if self.pending.remove(&ptr) {
            self.set_free(ptr, 0);
        }
    }

    /// The segments that are one free block, not pending: what can go back upstream.
    pub(super) fn releasable(&self) -> Vec<(DevicePtr, Segment)> {
        self.segments
            .iter()
            .filter(|&(base, segment)| {
                matches!(self.blocks.get(base), Some(Block { size, state: BlockState::Free { .. }, .. }) if *size == segment.size)
            })
            .map(|(&base, &segment)| (base, segment))
            .collect()
    }

    /// Removes the segment at `base` with its blocks (the caller gives it back upstream, or
    /// leaks it): what it was.
    pub(super) fn remove_segment(&mut self, base: DevicePtr) -> Option<Segment> {
        let segment = self.segments.get(&base).copied()?;
        let inside: Vec<DevicePtr> = self.blocks_of(base).map(|(ptr, _)| ptr).collect();
        for ptr in inside {
            self.pending.remove(&ptr);
            self.remove(ptr);
        }
        self.segments.remove(&base);
        self.counters.subtract(segment.class, Field::ReservedBytes, segment.size as u64);
        self.counters.subtract(segment.class, Field::Segments, 1);
        self.count_segment(segment.class, segment.size, 1, false);
        Some(segment)
    }

    /// Makes the block at `ptr` free with `epoch`, merged with every free block next to it on
    /// either side (more than one: recent frees wait unmerged, see
    /// [`free_recent`](Arena::free_recent)); the merged block takes the latest of their epochs:
    /// it is as recently used as its most recent part.
    fn set_free(&mut self, ptr: DevicePtr, epoch: u64) {
        let Some(block) = self.blocks.get(&ptr) else { return };
        let (mut start, mut size, mut epoch, segment, of) = (ptr, block.size, epoch, block.segment, block.of);
        while let Some(&Block {
            segment: theirs_segment, size: after, state: BlockState::Free { epoch: theirs }, ..
        }) = self.blocks.get(&(start + size as DevicePtr))
            && theirs_segment == segment
        {
            epoch = epoch.max(theirs);
            self.remove(start + size as DevicePtr);
            size += after;
        }
        while let Some((at, before, theirs)) =
            self.blocks.range(segment..start).next_back().and_then(|(&at, b)| match b.state {
                BlockState::Free { epoch: theirs } if at + b.size as DevicePtr == start => Some((at, b.size, theirs)),
                _ => None,
            })
        {
            epoch = epoch.max(theirs);
            self.remove(at);
            size += before;
            start = at;
        }
        if start != ptr {
            self.remove(ptr);
            self.insert(start, Block { size, segment, of, state: BlockState::Free { epoch } });
            return;
        }
        // Nothing free before it: changed in place (out of the bins first if it was in them).
        let Some(block) = self.blocks.get_mut(&ptr) else { return };
        if let BlockState::Free { .. } = block.state {
            self.bins.remove(of.class, block.size, ptr);
        }
        Self::count(&mut self.local, block, false);
        block.size = size;
        block.state = BlockState::Free { epoch };
        Self::count(&mut self.local, block, true);
        self.bins.insert(of.class, size, ptr);
    }

    /// Adds a block, to the bins if free, and counts it.
    fn insert(&mut self, ptr: DevicePtr, block: Block<P>) {
        let segment = block.of;
        Self::count(&mut self.local, &block, true);
        if let BlockState::Free { .. } = block.state {
            self.bins.insert(segment.class, block.size, ptr);
        }
        self.blocks.insert(ptr, block);
    }

    /// Removes a block, from the bins if free, and uncounts it.
    fn remove(&mut self, ptr: DevicePtr) -> Option<Block<P>> {
        let block = self.blocks.remove(&ptr)?;
        let segment = block.of;
        Self::count(&mut self.local, &block, false);
        if let BlockState::Free { .. } = block.state {
            self.bins.remove(segment.class, block.size, ptr);
        }
        Some(block)
    }

    /// Counts a block's share of the figures in (`add`) or out.
    fn count(local: &mut LocalCounters, block: &Block<P>, add: bool) {
        let segment = block.of;
        let mut change = |field: Field, amount: usize| local.apply(segment.class, field, amount as u64, add);
        match block.state {
            BlockState::Allocated { requested } => {
                change(Field::AllocatedBytes, block.size);
                change(Field::RequestedBytes, requested);
                change(Field::Allocations, 1);
                change(Field::ActiveBytes, block.size);
                change(Field::ActiveBlocks, 1);
            }
            BlockState::Pending(_) => {
                change(Field::ActiveBytes, block.size);
                change(Field::ActiveBlocks, 1);
            }
            BlockState::Free { .. } if block.size < segment.size => {
                change(Field::InactiveSplitBytes, block.size);
                change(Field::InactiveSplitBlocks, 1);
            }
            BlockState::Free { .. } => {}
        }
    }

    /// This stream's figures.
    pub(super) fn local(&self) -> &LocalCounters {
        &self.local
    }

    /// Starts this stream's peaks again from the current values.
    pub(super) fn reset_peaks(&mut self) {
        self.local.reset_peaks();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn arena() -> (Arena<u32>, Arc<Counters>, CachingOptions) {
        let counters = Arc::new(Counters::default());
        (Arena::new(Arc::clone(&counters)), counters, CachingOptions::default())
    }

    fn sizes(arena: &Arena<u32>, base: DevicePtr) -> Vec<(DevicePtr, usize, bool)> {
        arena
            .blocks_of(base)
            .map(|(ptr, block)| (ptr, block.size, matches!(block.state, BlockState::Free { .. })))
            .collect()
    }

    #[test]
    fn blocks_split_off_a_segment_and_merge_back_into_it() {
        let (mut arena, counters, options) = arena();
        arena.add_segment(0x10_0000, Segment::fixed(2 * MIB, SizeClass::Small));
        let a = arena.take(&options, SizeClass::Small, 1024, 1000, u64::MAX).unwrap();
        let b = arena.take(&options, SizeClass::Small, 4096, 4096, u64::MAX).unwrap();
        assert_eq!((a, b), (0x10_0000, 0x10_0400));
        assert_eq!(sizes(&arena, 0x10_0000), [(a, 1024, false), (b, 4096, false), (0x10_1400, 2 * MIB - 5120, true)]);
        let stats = counters.read([arena.local()]).small;
        assert_eq!((stats.allocated_bytes.current, stats.requested_bytes.current), (5120, 5096));
        assert_eq!(stats.inactive_split_bytes.current, 2 * MIB as u64 - 5120);

        assert!(arena.free_here(a) && !arena.free_here(a), "freed once");
        assert_eq!(counters.read([arena.local()]).small.inactive_split_blocks.current, 2);
        assert!(arena.free_here(b));
        assert_eq!(sizes(&arena, 0x10_0000), [(0x10_0000, 2 * MIB, true)], "merged with both neighbours");
        let stats = counters.read([arena.local()]).small;
        assert_eq!((stats.allocated_bytes.current, stats.inactive_split_bytes.current), (0, 0));
        assert_eq!(stats.allocated_bytes.peak, 5120);
        assert_eq!(arena.releasable().len(), 1);
        arena.remove_segment(0x10_0000).unwrap();
        let all = counters.read([arena.local()]).all;
        assert_eq!((all.reserved_bytes.current, all.segments.current, all.reserved_bytes.peak), (0, 0, 2 * MIB as u64));
        assert!(arena.is_empty());
    }

    /// Recent frees are free for the figures at once, are handed out again newest first for a
    /// request they serve whole, refuse a second free, and merge with each other and their
    /// neighbours when flushed, whatever the order.
    #[test]
    fn recent_frees_are_reused_newest_first_and_merge_when_flushed() {
        let (mut arena, counters, options) = arena();
        arena.add_segment(0x10_0000, Segment::fixed(2 * MIB, SizeClass::Small));
        let blocks: Vec<_> =
            (0..4).map(|_| arena.take(&options, SizeClass::Small, 4096, 4000, u64::MAX).unwrap()).collect();
        assert!(arena.free_recent(blocks[1]) && arena.free_recent(blocks[2]));
        assert!(!arena.free_recent(blocks[2]), "freed once");
        let stats = counters.read([arena.local()]).small;
        assert_eq!((stats.allocated_bytes.current, stats.allocations.current), (2 * 4096, 2));
        assert_eq!(arena.take_recent(&options, SizeClass::Small, 8192, 8192), None, "no recent block serves 8 KiB");
        assert_eq!(arena.take_recent(&options, SizeClass::Small, 4096, 10), Some(blocks[2]), "the newest");
        assert!(arena.free_recent(blocks[2]) && arena.free_recent(blocks[0]) && arena.free_recent(blocks[3]));
        assert!(!arena.is_flushed());
        arena.flush_recent();
        assert!(arena.is_flushed());
        assert_eq!(sizes(&arena, 0x10_0000), [(0x10_0000, 2 * MIB, true)], "one block again");
        let stats = counters.read([arena.local()]).small;
        assert_eq!((stats.allocated_bytes.current, stats.inactive_split_blocks.current), (0, 0));
        assert_eq!(arena.releasable().len(), 1);
        // A full list merges before it takes another.
        let many: Vec<_> = (0..=RECENT_CAPACITY)
            .map(|_| arena.take(&options, SizeClass::Small, 512, 512, u64::MAX).unwrap())
            .collect();
        for ptr in &many {
            assert!(arena.free_recent(*ptr));
        }
        assert_eq!(arena.recent.len(), 1);
        arena.flush_recent();
        assert_eq!(sizes(&arena, 0x10_0000), [(0x10_0000, 2 * MIB, true)]);
    }

    /// Once the recent frees are merged, no two free blocks are neighbours, and the bins hold
    /// exactly the free blocks, each with its size.
    fn assert_merged_and_binned(arena: &Arena<u32>) {
        let mut previous: Option<(DevicePtr, usize, bool)> = None;
        let mut free = std::collections::BTreeSet::new();
        for (&ptr, block) in &arena.blocks {
            let is_free = matches!(block.state, BlockState::Free { .. });
            if let Some((at, size, was_free)) = previous {
                assert!(!(was_free && is_free && at + size as DevicePtr == ptr), "unmerged: {at:x}+{size} and {ptr:x}");
            }
            if is_free {
                free.insert((block.of.class, block.size, ptr));
            }
            previous = Some((ptr, block.size, is_free));
        }
        assert_eq!(arena.bins.entries(), free, "the bins are the free blocks");
    }

    proptest::proptest! {
        /// Any mix of allocations (recent blocks first, as the resource takes them), frees
        /// (recent ones) and merges leaves the blocks merged and binned once merged.
        #[test]
        fn recent_frees_merge_whatever_their_order(
            ops in proptest::collection::vec((0u8..4, 1usize..64, proptest::prelude::any::<usize>()), 1..200),
        ) {
            let (mut arena, _counters, options) = arena();
            arena.add_segment(0x10_0000, Segment::fixed(2 * MIB, SizeClass::Small));
            let mut live: Vec<DevicePtr> = Vec::new();
            for (kind, units, index) in ops {
                let size = units * 512;
                match kind {
                    0 => {
                        let taken = arena.take_recent(&options, SizeClass::Small, size, size).or_else(|| {
                            arena.flush_recent();
                            arena.take(&options, SizeClass::Small, size, size, u64::MAX)
                        });
                        live.extend(taken);
                    }
                    1 | 2 if !live.is_empty() => {
                        let ptr = live.swap_remove(index % live.len());
                        proptest::prop_assert!(arena.free_recent(ptr));
                    }
                    _ => arena.flush_recent(),
                }
                if arena.is_flushed() {
                    assert_merged_and_binned(&arena);
                }
            }
            for ptr in live {
                proptest::prop_assert!(arena.free_recent(ptr));
            }
            arena.flush_recent();
            proptest::prop_assert_eq!(sizes(&arena, 0x10_0000), [(0x10_0000, 2 * MIB, true)]);
        }
    }

    #[test]
    fn a_large_block_is_not_split_when_a_sliver_would_remain() {
        let (mut arena, counters, options) = arena();
        arena.add_segment(0x1000_0000, Segment::fixed(20 * MIB, SizeClass::Large));
        let a = arena.take(&options, SizeClass::Large, 19 * MIB + 512, 19 * MIB, u64::MAX).unwrap();
        assert_eq!(sizes(&arena, a), [(a, 20 * MIB, false)], "the whole segment, not a 1 MiB sliver");
        assert_eq!(counters.read([arena.local()]).large.allocated_bytes.current, 20 * MIB as u64);
        assert!(arena.free_here(a));
        let b = arena.take(&options, SizeClass::Large, 4 * MIB, 4 * MIB, u64::MAX).unwrap();
        assert_eq!(sizes(&arena, b), [(b, 4 * MIB, false), (b + (4 * MIB) as u64, 16 * MIB, true)]);
    }

    #[test]
    fn pending_blocks_neither_serve_nor_merge_until_settled() {
        let (mut arena, counters, options) = arena();
        arena.add_segment(0x4000, Segment::fixed(2 * MIB, SizeClass::Small));
        let a = arena.take(&options, SizeClass::Small, 2 * MIB, 2 * MIB, u64::MAX).unwrap();
        assert!(arena.free_pending(a, 7).is_ok());
        assert_eq!(arena.free_pending(a, 8), Err(8), "no longer allocated");
        assert_eq!(arena.take(&options, SizeClass::Small, 512, 512, u64::MAX), None);
        assert!(arena.releasable().is_empty() && arena.has_pending());
        assert_eq!(counters.read([arena.local()]).small.active_bytes.current, 2 * MIB as u64);
        assert_eq!(arena.pending_where(|last_use| *last_use == 7), [a]);
        assert!(arena.pending_where(|last_use| *last_use == 8).is_empty());
        arena.settle(a);
        assert_eq!(counters.read([arena.local()]).small.active_bytes.current, 0);
        assert_eq!(arena.releasable().len(), 1);
        // Settled blocks are anyone's (epoch 0); a block freed on the arena's stream is not.
        assert_eq!(arena.take(&options, SizeClass::Small, 512, 512, 0), Some(a));
        assert!(arena.free_here(a));
        assert_eq!(arena.take(&options, SizeClass::Small, 512, 512, arena.epoch() - 1), None);
        assert_eq!(arena.take(&options, SizeClass::Small, 512, 512, arena.epoch()), Some(a));
    }
    #[test]
    fn only_a_wholly_free_settled_segment_that_fits_best_is_detached_and_it_stays_counted() {
        let (mut arena, counters, options) = arena();
        arena.add_segment(0x10_0000, Segment::fixed(2 * MIB, SizeClass::Small));
        let a = arena.take(&options, SizeClass::Small, 1024, 1024, u64::MAX).unwrap();
        assert_eq!(arena.detach_free_segment(SizeClass::Small, 1024, u64::MAX), None, "a block is allocated");
        assert!(arena.free_pending(a, 1).is_ok());
        assert_eq!(arena.detach_free_segment(SizeClass::Small, 1024, u64::MAX), None, "a block is pending");
        arena.settle(a);
        let again = arena.take(&options, SizeClass::Small, 1024, 1024, u64::MAX).unwrap();
        assert!(arena.free_here(again));
        let freed = arena.epoch();
        assert_eq!(arena.detach_free_segment(SizeClass::Small, 1024, freed - 1), None, "its last free not covered");
        // The best fit, part of a segment with a block handed out, is no whole segment.
        arena.add_segment(0x40_0000, Segment::fixed(2 * MIB, SizeClass::Small));
        let held = arena.take(&options, SizeClass::Small, 2 * MIB - 4096, 1, u64::MAX).unwrap();
        assert_eq!(held, 0x10_0000);
        assert_eq!(arena.detach_free_segment(SizeClass::Small, 1024, u64::MAX), None);
        assert!(arena.free_here(held));
        let (base, segment) = arena.detach_free_segment(SizeClass::Small, 1024, u64::MAX).unwrap();
        assert_eq!((base, segment.size), (0x10_0000, 2 * MIB), "the lower of two equal fits");
        assert_eq!(arena.segments().map(|(base, _)| base).collect::<Vec<_>>(), [0x40_0000]);
        let mut other: Arena<u32> = Arena::new(Arc::clone(&counters));
        other.attach_segment(base, segment);
        let all = counters.read([arena.local(), other.local()]).all;
        assert_eq!((all.reserved_bytes.current, all.segments.current), (4 * MIB as u64, 2), "moved, not re-counted");
        assert_eq!(other.take(&options, SizeClass::Small, 512, 512, other.epoch() - 1), None, "new to other's epochs");
        assert_eq!(other.take(&options, SizeClass::Small, 512, 512, u64::MAX), Some(base));
        assert_eq!(counters.read([arena.local(), other.local()]).all.allocated_bytes.current, 512);
    }
}
