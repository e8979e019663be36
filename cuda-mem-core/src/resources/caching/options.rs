//! [`CachingOptions`]: the knobs of a [`CachingResource`](super::CachingResource)'s policy, and
//! the size classes ([`SizeClass`]) and segment sizes they give.

use crate::error::{CachingError, Error, Result};

const MIB: usize = 1 << 20;

/// Which pool of segments a request is served from. Small and large requests never share a
/// segment: a long-lived small block cannot pin a large segment (PyTorch's small and large
/// pools).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SizeClass {
    /// Requests of at most [`CachingOptions::small_limit`] bytes, from segments of
    /// [`CachingOptions::small_segment`] bytes.
    Small,
    /// Every larger request.
    Large,
}

impl SizeClass {
    /// Both classes, small first.
    pub const ALL: [SizeClass; 2] = [SizeClass::Small, SizeClass::Large];

    /// An index into per-class arrays.
    pub(super) fn index(self) -> usize {
        match self {
            SizeClass::Small => 0,
            SizeClass::Large => 1,
        }
    }
}

/// The policy of a [`CachingResource`](super::CachingResource), PyTorch's by default:
///
/// - every request is rounded up to a multiple of [`rounding`](CachingOptions::rounding) (512 B);
/// - a rounded request of at most [`small_limit`](CachingOptions::small_limit) (1 MiB) is
///   [small](SizeClass::Small) and comes from segments of
///   [`small_segment`](CachingOptions::small_segment) bytes (2 MiB);
/// - a larger one comes from a segment of [`large_segment`](CachingOptions::large_segment) bytes
///   (20 MiB) when it is under [`large_own_segment`](CachingOptions::large_own_segment) (10 MiB),
///   otherwise from a segment of its own, its size rounded up to a multiple of
///   [`large_segment_rounding`](CachingOptions::large_segment_rounding) (2 MiB);
/// - a free block is split for a request when what remains is at least
///   [`rounding`](CachingOptions::rounding) bytes (small) or more than
///   [`large_split_remainder`](CachingOptions::large_split_remainder) bytes (large, 1 MiB): a
///   large block is not cut into slivers, which would fragment the large pool; the whole block
///   is handed out instead (with expandable segments every block is split as a small one is);
/// - with [expandable segments](super::CachingResource::with_expandable_segments), a segment
///   grows by what a request lacks in steps of [`small_segment`](CachingOptions::small_segment)
///   or [`large_segment_rounding`](CachingOptions::large_segment_rounding) bytes, inside
///   [`expandable_reservation`](CachingOptions::expandable_reservation) bytes of addresses;
/// - [`cross_stream_reuse`](CachingOptions::cross_stream_reuse) (on): a stream that finds no
///   block of its own may take another stream's free block once an event shows the block's last
///   use done.
///
/// ```
/// use cuda_mem_core::{CachingOptions, SizeClass};
///
/// let options = CachingOptions::default();
/// assert_eq!(options.round(1000), Some(1024));
/// assert_eq!(options.size_class(1 << 20), SizeClass::Small);
/// assert_eq!(options.segment_size(4 << 20), Some(20 << 20));
/// assert_eq!(options.segment_size(11 << 20), Some(12 << 20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachingOptions {
    rounding: usize,
    small_limit: usize,
    small_segment: usize,
    large_segment: usize,
    large_own_segment: usize,
    large_segment_rounding: usize,
    large_split_remainder: usize,
    cross_stream_reuse: bool,
    expandable_reservation: Option<usize>,
    expandable_small_pool: bool,
}

impl Default for CachingOptions {
    fn default() -> Self {
        CachingOptions {
            rounding: 512,
            small_limit: MIB,
            small_segment: 2 * MIB,
            large_segment: 20 * MIB,
            large_own_segment: 10 * MIB,
            large_segment_rounding: 2 * MIB,
            large_split_remainder: MIB,
            cross_stream_reuse: true,
            expandable_reservation: None,
            expandable_small_pool: false,
        }
    }
}

impl CachingOptions {
    /// Requests are rounded up to a multiple of `bytes` (a power of two; 512 by default). It is
    /// also the alignment of every block and the smallest block a split leaves.
    pub fn rounding(mut self, bytes: usize) -> Self {
        self.rounding = bytes;
        self
    }

    /// Rounded requests of at most `bytes` are small (1 MiB by default).
    pub fn small_limit(mut self, bytes: usize) -> Self {
        self.small_limit = bytes;
        self
    }

    /// The size of a small segment (2 MiB by default; at least the small limit).
    pub fn small_segment(mut self, bytes: usize) -> Self {
        self.small_segment = bytes;
        self
    }

    /// The size of a shared large segment (20 MiB by default).
    pub fn large_segment(mut self, bytes: usize) -> Self {
        self.large_segment = bytes;
        self
    }

    /// Large requests of at least `bytes` get a segment of their own (10 MiB by default; at
    /// most the large segment's size).
    pub fn large_own_segment(mut self, bytes: usize) -> Self {
        self.large_own_segment = bytes;
        self
    }

    /// A segment of its own is rounded up to a multiple of `bytes` (a power of two; 2 MiB by
    /// default).
    pub fn large_segment_rounding(mut self, bytes: usize) -> Self {
        self.large_segment_rounding = bytes;
        self
    }

    /// A large block is split only when more than `bytes` would remain (1 MiB by default).
    pub fn large_split_remainder(mut self, bytes: usize) -> Self {
        self.large_split_remainder = bytes;
        self
    }

    /// Whether a stream may take another stream's free blocks once their last use is known done
    /// (on by default). Off, each stream reuses only what was freed on it.
    pub fn cross_stream_reuse(mut self, enabled: bool) -> Self {
        self.cross_stream_reuse = enabled;
        self
    }

    /// Whether cross-stream reuse is on.
    pub fn is_cross_stream_reuse(&self) -> bool {
        self.cross_stream_reuse
    }

    /// The addresses each expandable segment reserves
    /// ([`CachingResource::with_expandable_segments`](super::CachingResource::with_expandable_segments);
    /// rounded up to the upstream's granularity). By default (`None`) the device's memory, as
    /// PyTorch reserves: one segment per stream (and size class) can then grow to hold anything
    /// the device can. Addresses cost no memory, but they are finite: a smaller reservation
    /// suits many streams on a small address space; a request larger than it gets a segment of
    /// its size.
    pub fn expandable_reservation(mut self, bytes: impl Into<Option<usize>>) -> Self {
        self.expandable_reservation = bytes.into();
        self
    }

    /// With expandable segments, whether small requests keep segments of their own, as
    /// PyTorch's small and large pools (off by default). Off, one expandable segment per stream
    /// serves every size: a hole left by any free serves any request that fits, and no memory
    /// sits in a small segment that large requests cannot use. Case 8 of the benchmarks
    /// (BENCHMARKS.md) measured peak reserved over peak allocated at 1.06 (serving) and 1.09
    /// (training) with one segment, 1.16 and 1.13 with the small pool. Segments of fixed size
    /// always keep the pools apart (a long-lived small block would pin a large segment).
    pub fn expandable_small_pool(mut self, separate: bool) -> Self {
        self.expandable_small_pool = separate;
        self
    }

    /// Whether small requests keep expandable segments of their own.
    pub fn has_expandable_small_pool(&self) -> bool {
        self.expandable_small_pool
    }

    /// The addresses each expandable segment reserves, if set.
    pub fn expandable_reservation_bytes(&self) -> Option<usize> {
        self.expandable_reservation
    }

    /// What an expandable segment of `class` grows by at least, and in multiples of: the small
    /// segment size, or the large segments' rounding (2 MiB each by default), rounded up to the
    /// upstream's `granularity` (`None`: past the address space).
    pub(super) fn expansion_step(&self, class: SizeClass, granularity: usize) -> Option<usize> {
        let step = match class {
            SizeClass::Small => self.small_segment,
            SizeClass::Large => self.large_segment_rounding,
        };
        step.checked_next_multiple_of(granularity.max(1))
    }

    /// Checks that the knobs make a policy.
    ///
    /// # Errors
    /// [`CachingError::InvalidOption`] naming the first knob that does not.
    pub fn validate(&self) -> Result<()> {
        let invalid =
            |option: &'static str, value: usize| Err(Error::Caching(CachingError::InvalidOption { option, value }));
        if !self.rounding.is_power_of_two() || self.rounding < 8 {
            return invalid("rounding (a power of two, at least 8)", self.rounding);
        }
        if self.small_limit == 0 || !self.small_limit.is_multiple_of(self.rounding) {
            return invalid("small_limit (a multiple of rounding)", self.small_limit);
        }
        if self.small_segment < self.small_limit || !self.small_segment.is_multiple_of(self.rounding) {
            return invalid("small_segment (a multiple of rounding, at least small_limit)", self.small_segment);
        }
        if !self.large_segment_rounding.is_power_of_two() || self.large_segment_rounding < self.rounding {
            return invalid("large_segment_rounding (a power of two, at least rounding)", self.large_segment_rounding);
        }
        if self.large_own_segment > self.large_segment || !self.large_segment.is_multiple_of(self.rounding) {
            return invalid("large_segment (a multiple of rounding, at least large_own_segment)", self.large_segment);
        }
        Ok(())
    }

    /// `size` rounded up to the block size it is served with (`None`: past the address space).
    pub fn round(&self, size: usize) -> Option<usize> {
        size.max(1).checked_next_multiple_of(self.rounding)
    }

    /// The class of a rounded request.
    pub fn size_class(&self, rounded: usize) -> SizeClass {
        if rounded <= self.small_limit { SizeClass::Small } else { SizeClass::Large }
    }

    /// The size of a new segment for a rounded request (`None`: past the address space).
    pub fn segment_size(&self, rounded: usize) -> Option<usize> {
        match self.size_class(rounded) {
            SizeClass::Small => Some(self.small_segment),
            SizeClass::Large if rounded < self.large_own_segment => Some(self.large_segment),
            SizeClass::Large => rounded.checked_next_multiple_of(self.large_segment_rounding),
        }
    }

    /// Whether a free block of `block` bytes of `class` is split to serve `rounded` bytes. A
    /// block of an `expandable` segment is split as a small one is (as PyTorch splits with
    /// expandable segments): a remainder at the segment's end joins its next growth, and one
    /// in the middle serves any request of its size, so no sliver is wasted there.
    pub(super) fn splits(&self, class: SizeClass, block: usize, rounded: usize, expandable: bool) -> bool {
        let remainder = block - rounded;
        match class {
            SizeClass::Large if !expandable => remainder > self.large_split_remainder,
            SizeClass::Small | SizeClass::Large => remainder >= self.rounding,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorchs_policy_by_default() {
        let options = CachingOptions::default();
        options.validate().unwrap();
        assert_eq!(options.round(1), Some(512));
        assert_eq!(options.round(512), Some(512));
        assert_eq!(options.round(513), Some(1024));
        assert_eq!(options.round(usize::MAX), None);
        assert_eq!(options.size_class(MIB), SizeClass::Small);
        assert_eq!(options.size_class(MIB + 512), SizeClass::Large);
        assert_eq!(options.segment_size(512), Some(2 * MIB));
        assert_eq!(options.segment_size(MIB + 512), Some(20 * MIB));
        assert_eq!(options.segment_size(10 * MIB), Some(10 * MIB));
        assert_eq!(options.segment_size(10 * MIB + 512), Some(12 * MIB));
        assert!(options.splits(SizeClass::Small, 2 * MIB, 2 * MIB - 512, false));
        assert!(!options.splits(SizeClass::Large, 3 * MIB, 2 * MIB, false), "a remainder of 1 MiB is not split off");
        assert!(options.splits(SizeClass::Large, 3 * MIB + 512, 2 * MIB, false));
        assert!(options.splits(SizeClass::Large, 3 * MIB, 2 * MIB, true), "in an expandable segment it is");
        assert_eq!((64 << 10) % options.rounding, 0);
    }

    #[test]
    fn knobs_that_make_no_policy_are_refused_by_name() {
        let refused = CachingOptions::default().rounding(500).validate().unwrap_err();
        assert!(matches!(refused, Error::Caching(CachingError::InvalidOption { value: 500, .. })), "{refused}");
        let refused = CachingOptions::default().small_segment(512).validate().unwrap_err();
        assert!(matches!(refused, Error::Caching(CachingError::InvalidOption { value: 512, .. })), "{refused}");
        assert!(CachingOptions::default().large_own_segment(40 * MIB).validate().is_err());
    }
}
