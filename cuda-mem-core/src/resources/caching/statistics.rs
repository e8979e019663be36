//! [`CachingStatistics`]: what a [`CachingResource`](super::CachingResource) holds and hands out,
//! per size class, current and peak (`torch.cuda.memory_stats`'s figures), and the counters
//! behind them.

use std::sync::atomic::{AtomicU64, Ordering};

use super::options::SizeClass;

/// A quantity now and at its highest (since the resource was made or its peaks were reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value.
    pub peak: u64,
}

/// A pool's figures (small blocks, large blocks, or both: [`CachingStatistics`]), each a
/// [`Stat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PoolStatistics {
    /// Bytes in blocks handed out (their rounded sizes).
    pub allocated_bytes: Stat,
    /// Bytes asked for by the blocks handed out (before rounding).
    pub requested_bytes: Stat,
    /// Bytes of segments held from the upstream resource.
    pub reserved_bytes: Stat,
    /// Bytes in blocks handed out or freed whose last use is not yet known done (freed on another
    /// stream than their segment's, until the event recorded at the free completes).
    pub active_bytes: Stat,
    /// Bytes in free blocks of segments split into several blocks: memory that fragmentation
    /// keeps from serving larger requests.
    pub inactive_split_bytes: Stat,
    /// Blocks handed out.
    pub allocations: Stat,
    /// Segments held.
    pub segments: Stat,
    /// Active blocks (as `active_bytes`).
    pub active_blocks: Stat,
    /// Free blocks of split segments (as `inactive_split_bytes`).
    pub inactive_split_blocks: Stat,
}

/// What a [`CachingResource`](super::CachingResource) holds, read at once
/// ([`CachingResource::statistics`](super::CachingResource::statistics)): per size class and in
/// all, and the retries and failures of allocations.
///
/// The current values are exact (under concurrent allocation the streams are read one after
/// another, so they may come from moments a few operations apart). The peaks of `segments` and
/// `reserved_bytes` are exact; each stream counts its blocks under its own lock, so the other
/// figures' peaks are the sums of the streams' peaks: exact where one stream allocates, at
/// least the true peak where several do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CachingStatistics {
    /// Small blocks and their segments.
    pub small: PoolStatistics,
    /// Large blocks and their segments.
    pub large: PoolStatistics,
    /// Both (each stream's peaks of its own: the highest value of its small and large figures'
    /// sum, not the sum of their peaks).
    pub all: PoolStatistics,
    /// Allocations the upstream refused a segment for, retried after the cached segments not in
    /// use were given back.
    pub retries: u64,
    /// Allocations that failed for want of memory ([`CachingError::OutOfMemory`](crate::CachingError::OutOfMemory)).
    pub out_of_memory: u64,
    /// Allocations on capturing streams, passed through to the upstream resource and never
    /// cached (not in the pools' figures).
    pub passed_through: Stat,
}

impl PoolStatistics {
    /// Adds a stream's block figures (all but segments and reserved bytes).
    fn add_blocks(&mut self, set: &[(u64, u64); FIELDS]) {
        let add = |stat: &mut Stat, field: Field| {
            let (current, peak) = set[field as usize];
            stat.current += current;
            stat.peak += peak;
        };
        add(&mut self.allocated_bytes, Field::AllocatedBytes);
        add(&mut self.requested_bytes, Field::RequestedBytes);
        add(&mut self.active_bytes, Field::ActiveBytes);
        add(&mut self.inactive_split_bytes, Field::InactiveSplitBytes);
        add(&mut self.allocations, Field::Allocations);
        add(&mut self.active_blocks, Field::ActiveBlocks);
        add(&mut self.inactive_split_blocks, Field::InactiveSplitBlocks);
    }
}

impl CachingStatistics {
    /// The figures of one size class.
    pub fn pool(&self, class: SizeClass) -> &PoolStatistics {
        match class {
            SizeClass::Small => &self.small,
            SizeClass::Large => &self.large,
        }
    }
}

/// A figure of [`PoolStatistics`], as an index into [`ClassCounters`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Field {
    AllocatedBytes,
    RequestedBytes,
    ReservedBytes,
    ActiveBytes,
    InactiveSplitBytes,
    Allocations,
    Segments,
    ActiveBlocks,
    InactiveSplitBlocks,
}

pub(super) const FIELDS: usize = 9;

/// A value and its peak.
#[derive(Debug, Default)]
pub(super) struct Counter {
    current: AtomicU64,
    peak: AtomicU64,
}

impl Counter {
    pub(super) fn add(&self, amount: u64) {
        let now = self.current.fetch_add(amount, Ordering::Relaxed) + amount;
        // A load first: below the peak (the steady state of a cache) no second write is needed.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    pub(super) fn subtract(&self, amount: u64) {
        self.current.fetch_sub(amount, Ordering::Relaxed);
    }

    pub(super) fn read(&self) -> Stat {
        let current = self.current.load(Ordering::Relaxed);
        Stat { current, peak: self.peak.load(Ordering::Relaxed).max(current) }
    }

    fn reset_peak(&self) {
        self.peak.store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The counters of one pool (small, large, all).
#[derive(Debug, Default)]
struct ClassCounters([Counter; FIELDS]);

impl ClassCounters {
    fn read(&self) -> PoolStatistics {
        PoolStatistics::from_fields(|field| self.0[field as usize].read())
    }
}

impl PoolStatistics {
    /// Every figure, each read by `read`.
    fn from_fields(read: impl Fn(Field) -> Stat) -> PoolStatistics {
        PoolStatistics {
            allocated_bytes: read(Field::AllocatedBytes),
            requested_bytes: read(Field::RequestedBytes),
            reserved_bytes: read(Field::ReservedBytes),
            active_bytes: read(Field::ActiveBytes),
            inactive_split_bytes: read(Field::InactiveSplitBytes),
            allocations: read(Field::Allocations),
            segments: read(Field::Segments),
            active_blocks: read(Field::ActiveBlocks),
            inactive_split_blocks: read(Field::InactiveSplitBlocks),
        }
    }
}

/// A stream's figures of its blocks (small, large, all), current and peak, kept under its
/// state's lock: plain numbers, so the hot path writes no memory other streams share.
#[derive(Debug, Default, Clone)]
pub(super) struct LocalCounters {
    classes: [[(u64, u64); FIELDS]; 3],
}

impl LocalCounters {
    /// Adds `amount` to `field` of `class` and of all (`add`), or takes it away.
    #[inline]
    pub(super) fn apply(&mut self, class: SizeClass, field: Field, amount: u64, add: bool) {
        for set in [class.index(), 2] {
            let (current, peak) = &mut self.classes[set][field as usize];
            if add {
                *current += amount;
                *peak = (*peak).max(*current);
            } else {
                *current -= amount;
            }
        }
    }

    pub(super) fn reset_peaks(&mut self) {
        for (current, peak) in self.classes.iter_mut().flatten() {
            *peak = *current;
        }
    }

    /// Every figure of this stream's, its segments' included.
    pub(super) fn read(&self) -> StreamStatistics {
        let pool = |set: &[(u64, u64); FIELDS]| {
            PoolStatistics::from_fields(|field| {
                let (current, peak) = set[field as usize];
                Stat { current, peak }
            })
        };
        let [small, large, all] = &self.classes;
        StreamStatistics { small: pool(small), large: pool(large), all: pool(all) }
    }
}

/// One stream's share of a [`CachingResource`](super::CachingResource)
/// ([`CachingResource::stream_statistics`](super::CachingResource::stream_statistics)): the
/// blocks allocated on it and the segments whose free blocks are in its bins (the ones first
/// allocated for it, or taken over), each figure exact, peaks included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StreamStatistics {
    /// Small blocks and their segments.
    pub small: PoolStatistics,
    /// Large blocks and their segments.
    pub large: PoolStatistics,
    /// Both.
    pub all: PoolStatistics,
}

impl StreamStatistics {
    /// The figures of one size class.
    pub fn pool(&self, class: SizeClass) -> &PoolStatistics {
        match class {
            SizeClass::Small => &self.small,
            SizeClass::Large => &self.large,
        }
    }
}

/// The counters a resource shares between its streams' states: segments and reserved bytes
/// (changed only with segments), retries, failures and pass-throughs, lock-free.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Small, large, all; only the segment figures are counted here.
    classes: [ClassCounters; 3],
    pub(super) retries: AtomicU64,
    pub(super) out_of_memory: AtomicU64,
    pub(super) passed_through: Counter,
}

impl Counters {
    /// Adds `amount` to `field` of `class` (and of all).
    pub(super) fn add(&self, class: SizeClass, field: Field, amount: u64) {
        self.classes[class.index()].0[field as usize].add(amount);
        self.classes[2].0[field as usize].add(amount);
    }

    /// Takes `amount` from `field` of `class` (and of all).
    pub(super) fn subtract(&self, class: SizeClass, field: Field, amount: u64) {
        self.classes[class.index()].0[field as usize].subtract(amount);
        self.classes[2].0[field as usize].subtract(amount);
    }

    /// Everything, with the streams' figures of their blocks (`streams`) summed: the currents
    /// are exact, and so are the peaks of segments and reserved bytes; a block figure's peak is
    /// the sum of the streams' peaks (exact for one stream, at least the true peak for several).
    pub(super) fn read<'a>(&self, streams: impl IntoIterator<Item = &'a LocalCounters>) -> CachingStatistics {
        let mut sums = [self.classes[0].read(), self.classes[1].read(), self.classes[2].read()];
        for local in streams {
            for (sum, set) in sums.iter_mut().zip(&local.classes) {
                sum.add_blocks(set);
            }
        }
        let [small, large, all] = sums;
        CachingStatistics {
            small,
            large,
            all,
            retries: self.retries.load(Ordering::Relaxed),
            out_of_memory: self.out_of_memory.load(Ordering::Relaxed),
            passed_through: self.passed_through.read(),
        }
    }

    /// Starts the shared peaks again (the streams' own are reset under their locks).
    pub(super) fn reset_peaks(&self) {
        self.classes.iter().flat_map(|class| &class.0).for_each(Counter::reset_peak);
        self.passed_through.reset_peak();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_class_counts_into_all_and_peaks_reset_to_the_current_values() {
        let counters = Counters::default();
        let mut local = LocalCounters::default();
        local.apply(SizeClass::Small, Field::AllocatedBytes, 512, true);
        local.apply(SizeClass::Large, Field::AllocatedBytes, 4096, true);
        local.apply(SizeClass::Large, Field::AllocatedBytes, 4096, false);
        local.apply(SizeClass::Small, Field::AllocatedBytes, 512, true);
        let read = counters.read([&local]);
        assert_eq!(read.small.allocated_bytes, Stat { current: 1024, peak: 1024 });
        assert_eq!(read.large.allocated_bytes, Stat { current: 0, peak: 4096 });
        assert_eq!(read.all.allocated_bytes, Stat { current: 1024, peak: 4608 });
        local.reset_peaks();
        assert_eq!(counters.read([&local]).all.allocated_bytes, Stat { current: 1024, peak: 1024 });
        counters.add(SizeClass::Small, Field::ReservedBytes, 2048);
        counters.subtract(SizeClass::Small, Field::ReservedBytes, 2048);
        assert_eq!(counters.read([&local, &local]).small.reserved_bytes, Stat { current: 0, peak: 2048 });
        assert_eq!(counters.read([&local, &local]).small.allocated_bytes.current, 2048, "streams sum");
        assert_eq!(read.pool(SizeClass::Large), &read.large);
    }
}
