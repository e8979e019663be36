//! Case (9): what the memory history and snapshots cost. A 64 KiB pool pair (a `Buffer`
//! allocated and dropped) with recording off, on, on with backtraces and on with frees'
//! completions, alternately in the same run (off is what every allocation pays: one relaxed
//! load); and a snapshot
//! (`take_snapshot`), its JSON and its viewer page, against the live allocations of a caching
//! resource (each a block of its segments) and the events recorded.

use std::time::Instant;

use cuda_mem_core::history::{self, HistoryOptions};
use cuda_mem_core::snapshot::take_snapshot;
use cuda_mem_core::{
    CachingOptions, CachingResource, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream, StreamOptions,
};
use serde_json::{Value, json};

use crate::Error;
use crate::pools::per_pair;
use crate::stats::{Stats, rounded};
use crate::units::KIB;

/// The pairs' size.
pub(crate) const RECORDING_PAIR_SIZE: usize = 64 * KIB;
/// Live allocations the snapshot is timed against.
pub(crate) const SNAPSHOT_LIVE: [usize; 3] = [100, 1_000, 10_000];

/// The pair with recording off, on and on with backtraces.
pub(crate) struct RecordingRow {
    /// Recording off.
    pub(crate) off: Stats,
    /// Recording on.
    pub(crate) on: Stats,
    /// Recording on, with backtraces.
    pub(crate) backtraces: Stats,
    /// Recording on, with frees' completions (a host function per free).
    pub(crate) completions: Stats,
}

impl RecordingRow {
    /// As a JSON object (`results.json`'s `recording`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "size": RECORDING_PAIR_SIZE,
            "off_per_pair": self.off.json(),
            "on_per_pair": self.on.json(),
            "backtraces_per_pair": self.backtraces.json(),
            "ratio_on": rounded(self.on.median / self.off.median, 3),
            "ratio_backtraces": rounded(self.backtraces.median / self.off.median, 3),
            "completions_per_pair": self.completions.json(),
            "ratio_completions": rounded(self.completions.median / self.off.median, 3),
        })
    }
}

/// Events in the long history's row: allocate+free pairs fill the ring.
pub(crate) const LONG_HISTORY_EVENTS: usize = 1_000_000;

/// A snapshot of a caching resource with `live` allocations and `events` events recorded.
pub(crate) struct SnapshotRow {
    /// Live allocations (blocks).
    pub(crate) live: usize,
    /// Events in the history.
    pub(crate) events: usize,
    /// `take_snapshot()`.
    pub(crate) take: Stats,
    /// `to_json()`.
    pub(crate) json: Stats,
    /// `to_html()`.
    pub(crate) html: Stats,
    /// The page's bytes.
    pub(crate) page_bytes: usize,
}

impl SnapshotRow {
    /// As a JSON object (a row of `results.json`'s `snapshots`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "live_allocations": self.live,
            "take": self.take.json(),
            "to_json": self.json.json(),
            "to_html": self.html.json(),
            "page_bytes": self.page_bytes,
        })
    }
}

/// The pair with recording off, on, and on with backtraces, each timed in turn.
pub(crate) fn recording(device: Device) -> Result<RecordingRow, Error> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    pool.pool().set_release_threshold(u64::MAX)?;
    let pairs = || {
        per_pair(|| {
            drop(pool.allocate(RECORDING_PAIR_SIZE, &stream)?);
            Ok(())
        })
    };
    let timed = |options: Option<HistoryOptions>| -> Result<f64, Error> {
        if let Some(options) = options {
            history::start_recording(options);
        }
        let ns = pairs();
        history::stop_recording();
        // Off the clock: the host functions of frees' completions are the stream's work, and
        // must not be left to the next kind's repetition.
        stream.synchronize()?;
        ns
    };
    let kinds = [
        None,
        Some(HistoryOptions::default()),
        Some(HistoryOptions::default().backtraces(true)),
        Some(HistoryOptions::default().free_completions(true)),
    ];
    let mut samples = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..10 {
        for kind in kinds {
            timed(kind)?;
        }
    }
    // Backtraces cost microseconds each: fewer repetitions keep the case short.
    for rep in 0..300 {
        for k in 0..kinds.len() {
            let kind = (rep + k) % kinds.len();
            if kind == 2 && rep % 5 != 0 {
                continue;
            }
            samples[kind].push(timed(kinds[kind])?);
        }
        stream.synchronize()?;
    }
    let [off, on, backtraces, completions] = samples.map(Stats::of);
    let row = RecordingRow { off, on, backtraces, completions };
    println!(
        "  recording off {}, on {} ({:.2}×), with backtraces {} ({:.2}×), with frees' completions {} ({:.2}×) per pair",
        row.off.show(),
        row.on.show(),
        row.on.median / row.off.median,
        row.backtraces.show(),
        row.backtraces.median / row.off.median,
        row.completions.show(),
        row.completions.median / row.off.median
    );
    Ok(row)
}

/// A snapshot against the live allocations of a caching resource, and one of a long history.
pub(crate) fn snapshots(device: Device) -> Result<Vec<SnapshotRow>, Error> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let mut rows = Vec::new();
    for live in SNAPSHOT_LIVE {
        let cache =
            CachingResource::new(DeviceMemoryResource::new(device, Default::default())?, CachingOptions::default())?;
        history::start_recording(HistoryOptions::default().capacity(live * 2));
        let buffers = (0..live).map(|i| cache.allocate(512 * (1 + i % 8), &stream)).collect::<Result<Vec<_>, _>>()?;
        history::stop_recording();
        rows.push(timed_snapshot(live, 7)?);
        drop(buffers);
    }
    // A million events: 1,000 live, the ring filled by pairs of many sizes.
    let cache =
        CachingResource::new(DeviceMemoryResource::new(device, Default::default())?, CachingOptions::default())?;
    history::start_recording(HistoryOptions::default().capacity(LONG_HISTORY_EVENTS));
    let buffers = (0..1000).map(|i| cache.allocate(512 * (1 + i % 8), &stream)).collect::<Result<Vec<_>, _>>()?;
    for i in 0..LONG_HISTORY_EVENTS / 2 {
        drop(cache.allocate(512 * (1 + i % 64), &stream)?);
    }
    history::stop_recording();
    rows.push(timed_snapshot(buffers.len(), 3)?);
    drop(buffers);
    Ok(rows)
}

/// `take_snapshot`, `to_json` and `to_html` of what is live and recorded now, `rounds` times.
fn timed_snapshot(live: usize, rounds: usize) -> Result<SnapshotRow, Error> {
    let (mut take, mut to_json, mut to_html, mut page_bytes, mut events) = (Vec::new(), Vec::new(), Vec::new(), 0, 0);
    for _ in 0..rounds {
        let start = Instant::now();
        let snapshot = take_snapshot();
        take.push(start.elapsed().as_nanos() as f64);
        let start = Instant::now();
        std::hint::black_box(snapshot.to_json()?);
        to_json.push(start.elapsed().as_nanos() as f64);
        let start = Instant::now();
        let page = snapshot.to_html()?;
        to_html.push(start.elapsed().as_nanos() as f64);
        page_bytes = page.len();
        events = snapshot.events.len();
    }
    let row = SnapshotRow {
        live,
        events,
        take: Stats::of(take),
        json: Stats::of(to_json),
        html: Stats::of(to_html),
        page_bytes,
    };
    println!(
        "  snapshot of {live} live allocations, {events} events: take {}, JSON {}, page {} ({} KiB)",
        row.take.show(),
        row.json.show(),
        row.html.show(),
        row.page_bytes / 1024
    );
    Ok(row)
}
