//! The viewer's timeline, worked out from a snapshot's history before the page is written: the
//! page carries the largest allocations one by one and the rest as one band of at most
//! [`REST_POINTS`] points, so its size and the browser's work stay bounded however long the
//! history (a million events make a page of a few hundred KiB, not of the history's size).

use std::collections::HashMap;

use super::model::{EventView, MemorySnapshot};

/// At most this many points draw the band of the allocations not drawn one by one.
pub(crate) const REST_POINTS: usize = 4000;

/// How many out-of-memory failures the page lists (the latest), with the events before each.
pub(crate) const OOMS_LISTED: usize = 50;

/// How many events before each listed failure the page shows.
pub(crate) const EVENTS_BEFORE_OOM: usize = 20;

/// One allocation of the history: live from its `allocate` move to its `free_requested` move
/// (or the end), moves being the history's allocate and free_requested events, counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// The move that made it.
    pub start: usize,
    /// The move that freed it (the number of moves when it is live at the end).
    pub end: usize,
    /// Its bytes.
    pub size: u64,
    /// Its `allocate` event's index in the snapshot's events.
    pub event: usize,
}

/// The allocations of a history, in the order they were made.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    /// How many moves (allocate and free_requested events) the history holds.
    pub moves: usize,
    /// Every allocation.
    pub allocations: Vec<Allocation>,
}

impl Timeline {
    /// The allocations of `events`. A free_requested event closes the latest open allocation of
    /// the same resource, address and size (buffers may alias: a grown virtual buffer and its
    /// growth share an address); one that closes none (its allocation came before the history)
    /// is a move that changes nothing.
    pub fn of(events: &[EventView]) -> Timeline {
        let mut open: HashMap<(u64, u64, u64), Vec<usize>> = HashMap::new();
        let mut allocations: Vec<Allocation> = Vec::new();
        let mut moves = 0;
        for (index, event) in events.iter().enumerate() {
            let key = (event.resource, event.address, event.size);
            match event.kind.as_str() {
                "allocate" => {
                    open.entry(key).or_default().push(allocations.len());
                    allocations.push(Allocation { start: moves, end: usize::MAX, size: event.size, event: index });
                }
                "free_requested" => {
                    if let Some(list) = open.get_mut(&key) {
                        if let Some(latest) = list.pop() {
                            allocations[latest].end = moves;
                        }
                        if list.is_empty() {
                            open.remove(&key);
                        }
                    }
                }
                _ => continue,
            }
            moves += 1;
        }
        for allocation in &mut allocations {
            allocation.end = allocation.end.min(moves);
        }
        Timeline { moves, allocations }
    }

    /// Which allocations are drawn one by one: the `most` largest (the earlier of equal sizes),
    /// as flags beside [`allocations`](Timeline::allocations).
    pub fn drawn(&self, most: usize) -> Vec<bool> {
        let mut by_size: Vec<usize> = (0..self.allocations.len()).collect();
        by_size.sort_by(|&a, &b| self.allocations[b].size.cmp(&self.allocations[a].size).then(a.cmp(&b)));
        let mut drawn = vec![false; self.allocations.len()];
        for &index in by_size.iter().take(most) {
            drawn[index] = true;
        }
        drawn
    }

    /// The live bytes after each move, of the drawn allocations and of the rest, as at most
    /// [`REST_POINTS`] points `[move, drawn bytes, rest bytes]` (the point at
    /// [`moves`](Timeline::moves) is the timeline's right edge, where every band ends): each point
    /// stands for a span of moves and is its moment of the most live bytes (so no peak is lost),
    /// placed at the span's first move.
    pub fn live_bytes(&self, drawn: &[bool]) -> Vec<[u64; 3]> {
        // The change of each kind of bytes at each move.
        let mut changes = vec![(0i128, 0i128); self.moves + 1];
        for (allocation, &is_drawn) in self.allocations.iter().zip(drawn) {
            let size = i128::from(allocation.size);
            let slot = |change: &mut (i128, i128), by: i128| {
                if is_drawn {
                    change.0 += by;
                } else {
                    change.1 += by;
                }
            };
            slot(&mut changes[allocation.start], size);
            slot(&mut changes[allocation.end], -size);
        }
        let span = (self.moves + 1).div_ceil(REST_POINTS).max(1);
        let (mut drawn_bytes, mut rest_bytes) = (0i128, 0i128);
        let mut points: Vec<[u64; 3]> = Vec::with_capacity(REST_POINTS + 1);
        for (at, (drawn_change, rest_change)) in changes.into_iter().enumerate() {
            drawn_bytes += drawn_change;
            rest_bytes += rest_change;
            let now = [at as u64, clamp(drawn_bytes), clamp(rest_bytes)];
            if at % span == 0 {
                points.push(now);
            } else if let Some(last) = points.last_mut()
                && now[1] + now[2] > last[1] + last[2]
            {
                *last = [last[0], now[1], now[2]];
            }
        }
        points
    }
}

/// Bytes as the page holds them (never negative: every free follows its allocation).
fn clamp(bytes: i128) -> u64 {
    u64::try_from(bytes.max(0)).unwrap_or(u64::MAX)
}

/// The latest [`OOMS_LISTED`] out-of-memory failures of a snapshot's history: each one's event
/// index, and how many earlier ones are not listed.
pub(crate) fn listed_ooms(snapshot: &MemorySnapshot) -> (Vec<usize>, usize) {
    let all: Vec<usize> =
        snapshot.events.iter().enumerate().filter(|(_, e)| e.kind == "out_of_memory").map(|(i, _)| i).collect();
    let skipped = all.len().saturating_sub(OOMS_LISTED);
    (all[skipped..].to_vec(), skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(kind: &str, address: u64, size: u64) -> EventView {
        EventView { time_ns: 0, kind: kind.into(), address, size, stream: 0, resource: 1, thread: 1, backtrace: None }
    }

    #[test]
    fn frees_close_the_latest_open_allocation_and_unknown_frees_change_nothing() {
        let events = [
            event("allocate", 0x10, 8),
            event("segment_allocate", 0x0, 1 << 20),
            event("allocate", 0x10, 8),
            event("free_requested", 0x10, 8),
            event("free_requested", 0x99, 4),
            event("allocate", 0x20, 16),
        ];
        let timeline = Timeline::of(&events);
        assert_eq!(timeline.moves, 5);
        let spans: Vec<_> = timeline.allocations.iter().map(|a| (a.start, a.end, a.event)).collect();
        assert_eq!(spans, [(0, 5, 0), (1, 2, 2), (4, 5, 5)]);
        let drawn = timeline.drawn(1);
        assert_eq!(drawn, [false, false, true], "the largest");
        assert_eq!(timeline.live_bytes(&drawn), [[0, 0, 8], [1, 0, 16], [2, 0, 8], [3, 0, 8], [4, 16, 8], [5, 0, 0]]);
        // The last point is the right edge, where every band ends.
    }

    proptest! {
        /// However long the history, the band keeps at most REST_POINTS points and loses no peak:
        /// its highest point is the most bytes ever live.
        #[test]
        fn the_band_is_bounded_and_keeps_the_peak(sizes in proptest::collection::vec((1u64..1000, any::<bool>()), 1..3000), most in 0usize..50) {
            let mut events = Vec::new();
            let mut live = Vec::new();
            let (mut now, mut peak) = (0u64, 0u64);
            for (index, (size, free)) in sizes.into_iter().enumerate() {
                if free && !live.is_empty() {
                    let (address, size) = live.remove(index % live.len());
                    events.push(event("free_requested", address, size));
                    now -= size;
                } else {
                    events.push(event("allocate", index as u64, size));
                    live.push((index as u64, size));
                    now += size;
                    peak = peak.max(now);
                }
            }
            let timeline = Timeline::of(&events);
            let points = timeline.live_bytes(&timeline.drawn(most));
            prop_assert!(points.len() <= REST_POINTS + 1);
            prop_assert_eq!(points.iter().map(|p| p[1] + p[2]).max(), Some(peak));
            if events.len() < REST_POINTS {
                prop_assert_eq!(points.len(), events.len() + 1, "one point per move, and the start");
                prop_assert_eq!(points[events.len() - 1][1] + points[events.len() - 1][2], now);
            }
        }
    }
}
