//! Managed memory's range attributes: what `cuMemAdvise` and prefetches record, page by page.
//!
//! The driver keeps advice per page (a range is rounded out to whole CPU pages before advice
//! applies) and answers a range query with what every page of the range agrees on. Each
//! managed allocation keeps its pages' attributes as runs of equal pages, so that advice on a
//! large allocation costs a few entries, not one per page; an allocation never advised keeps
//! none.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// A place managed memory can prefer or be prefetched to, resolved (the calling thread's NUMA
/// node is the simulated host's only node, 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Place {
    /// A device, by ordinal.
    Device(usize),
    /// The host, no node named.
    Host,
    /// A host NUMA node.
    HostNuma(i32),
}

/// A processor that `CU_MEM_ADVISE_SET_ACCESSED_BY` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Accessor {
    /// A device, by ordinal.
    Device(usize),
    /// The host.
    Host,
}

/// The range attributes of one page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PageAttributes {
    /// `CU_MEM_ADVISE_SET_READ_MOSTLY` is in force.
    pub read_mostly: bool,
    /// The preferred location, if one is set.
    pub preferred: Option<Place>,
    /// The processors the memory is advised to be accessed by.
    pub accessed_by: BTreeSet<Accessor>,
    /// Where the page was last prefetched to explicitly, if it was.
    pub last_prefetch: Option<Place>,
}

/// A page nothing was recorded for.
static UNTOUCHED: PageAttributes =
    PageAttributes { read_mostly: false, preferred: None, accessed_by: BTreeSet::new(), last_prefetch: None };

/// The pages of one allocation as runs of equal attributes: each key is a run's first page
/// (counted from the allocation's start), and the run lasts until the next key. Empty: every
/// page is untouched.
#[derive(Debug, Default)]
pub(crate) struct PageRuns {
    runs: BTreeMap<u64, PageAttributes>,
}

impl PageRuns {
    /// Makes a run start at page `at`.
    fn split(&mut self, at: u64) {
        if self.runs.is_empty() {
            self.runs.insert(0, PageAttributes::default());
        }
        let before = self.runs.range(..=at).next_back().map(|(&start, attributes)| (start, attributes.clone()));
        if let Some((start, attributes)) = before
            && start != at
        {
            self.runs.insert(at, attributes);
        }
    }

    /// Applies `change` to every page in `pages`, then merges runs that became equal.
    pub(crate) fn update(&mut self, pages: Range<u64>, change: impl Fn(&mut PageAttributes)) {
        self.split(pages.start);
        self.split(pages.end);
        self.runs.range_mut(pages).for_each(|(_, attributes)| change(attributes));
        let mut previous: Option<&PageAttributes> = None;
        let mut redundant = Vec::new();
        for (&start, attributes) in &self.runs {
            if previous == Some(attributes) {
                redundant.push(start);
            }
            previous = Some(attributes);
        }
        for start in redundant {
            self.runs.remove(&start);
        }
    }

    /// The attributes of the runs that cover `pages` (each run once).
    pub(crate) fn covering(&self, pages: Range<u64>) -> Vec<&PageAttributes> {
        let Some((_, first)) = self.runs.range(..=pages.start).next_back() else {
            return vec![&UNTOUCHED];
        };
        let later = self.runs.range(pages.start + 1..pages.end).map(|(_, attributes)| attributes);
        std::iter::once(first).chain(later).collect()
    }
}

/// The value `read` gives every run, if they all agree.
pub(crate) fn agreed<T: PartialEq>(runs: &[&PageAttributes], read: impl Fn(&PageAttributes) -> T) -> Option<T> {
    let mut values = runs.iter().map(|attributes| read(attributes));
    let first = values.next()?;
    values.all(|value| value == first).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_applies_to_the_pages_it_covers_and_equal_runs_merge() {
        let mut pages = PageRuns::default();
        assert_eq!(pages.covering(0..10), [&UNTOUCHED]);
        pages.update(2..5, |a| a.read_mostly = true);
        assert_eq!(agreed(&pages.covering(2..5), |a| a.read_mostly), Some(true));
        assert_eq!(agreed(&pages.covering(1..5), |a| a.read_mostly), None, "page 1 was not advised");
        assert_eq!(agreed(&pages.covering(5..6), |a| a.read_mostly), Some(false));
        pages.update(4..8, |a| a.preferred = Some(Place::Host));
        assert_eq!(pages.covering(2..8).len(), 3, "read-mostly; both; preferred only");
        pages.update(0..10, |a| a.read_mostly = false);
        pages.update(0..10, |a| a.preferred = None);
        assert_eq!(pages.runs.len(), 1, "every page equal again: one run");
        assert_eq!(pages.covering(0..10), [&UNTOUCHED]);
    }
}
