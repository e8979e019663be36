//! [`Bins`]: a stream's free blocks by size class, ordered by size for best-fit lookup.

use std::collections::BTreeSet;

use super::options::SizeClass;
use crate::device::DevicePtr;

/// Free blocks, by class, ordered by size then address: the best fit for a request is the
/// first block of at least its size (the lowest address among equals, which keeps reuse
/// compact).
#[derive(Debug, Default)]
pub(super) struct Bins {
    by_class: [BTreeSet<(usize, DevicePtr)>; 2],
}

impl Bins {
    pub(super) fn insert(&mut self, class: SizeClass, size: usize, ptr: DevicePtr) {
        self.by_class[class.index()].insert((size, ptr));
    }

    pub(super) fn remove(&mut self, class: SizeClass, size: usize, ptr: DevicePtr) -> bool {
        self.by_class[class.index()].remove(&(size, ptr))
    }

    /// The smallest block of `class` of at least `size` bytes that `usable` accepts.
    pub(super) fn best_fit(
        &self,
        class: SizeClass,
        size: usize,
        mut usable: impl FnMut(DevicePtr) -> bool,
    ) -> Option<(usize, DevicePtr)> {
        self.by_class[class.index()].range((size, 0)..).copied().find(|&(_, ptr)| usable(ptr))
    }

    /// Whether any block of `class` has at least `size` bytes.
    pub(super) fn has_fit(&self, class: SizeClass, size: usize) -> bool {
        self.by_class[class.index()].range((size, 0)..).next().is_some()
    }

    /// Every block in the bins, with its class.
    #[cfg(test)]
    pub(super) fn entries(&self) -> BTreeSet<(SizeClass, usize, DevicePtr)> {
        SizeClass::ALL
            .iter()
            .flat_map(|&class| self.by_class[class.index()].iter().map(move |&(size, ptr)| (class, size, ptr)))
            .collect()
    }

    /// The largest free block of either class.
    pub(super) fn largest(&self) -> usize {
        self.by_class.iter().filter_map(|bin| bin.last().map(|&(size, _)| size)).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_fit_is_the_smallest_block_large_enough_and_usable() {
        let mut bins = Bins::default();
        bins.insert(SizeClass::Small, 4096, 0x1000);
        bins.insert(SizeClass::Small, 1024, 0x9000);
        bins.insert(SizeClass::Small, 2048, 0x5000);
        bins.insert(SizeClass::Large, 1 << 21, 0x10_0000);
        assert_eq!(bins.best_fit(SizeClass::Small, 1500, |_| true), Some((2048, 0x5000)));
        assert_eq!(bins.best_fit(SizeClass::Small, 1500, |ptr| ptr != 0x5000), Some((4096, 0x1000)));
        assert_eq!(bins.best_fit(SizeClass::Small, 5000, |_| true), None, "large blocks serve no small request");
        assert!(bins.has_fit(SizeClass::Large, 1 << 21) && !bins.has_fit(SizeClass::Large, (1 << 21) + 1));
        assert!(bins.remove(SizeClass::Small, 2048, 0x5000) && !bins.remove(SizeClass::Small, 2048, 0x5000));
        assert_eq!(bins.largest(), 1 << 21);
    }
}
