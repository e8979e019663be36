//! Case (1b): how pool allocate+free pairs scale with threads. 1, 2, 4 and 8 threads, each on a
//! stream of its own, allocate and free from one pool at once, through `Buffer`, `ScopedBuffer`
//! and the raw calls; the result is pairs per second of all threads together (over the union of
//! their spans, see [`crate::rates`]). With fewer CPUs than threads the threads take turns, and
//! those rows measure the scheduler as much as the pool.

use std::sync::Arc;

use cuda_mem_core::sys::Driver;
use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryResourceExt, Stream, StreamOptions,
};
use serde_json::{Value, json};

use crate::Error;
use crate::pools::raw_pair;
use crate::rates::rate_per_thread;
use crate::stats::{Stats, rounded};
use crate::units::{bytes, ns};

/// The thread counts of the curve.
pub(crate) const SCALING_THREADS: [usize; 4] = [1, 2, 4, 8];
/// Bytes per allocation.
pub(crate) const SCALING_SIZE: usize = 256;
/// Pairs a thread makes before it waits for its stream (the frees are stream-ordered work).
pub(crate) const PAIRS_PER_SYNC: usize = 50;
/// Synchronized groups of pairs per timed repetition, split between the threads: 20,000 pairs.
const GROUPS_PER_REP: usize = 400;
/// Timed repetitions per kind and thread count (after one warm-up).
const REPS: usize = 15;

/// One thread count: pairs per second of all threads together, per kind.
pub(crate) struct ScalingRow {
    /// Threads, each on a stream of its own.
    pub(crate) threads: usize,
    /// `allocate`: a `Buffer`.
    pub(crate) buffer: Stats,
    /// `allocate_scoped`: a `ScopedBuffer`.
    pub(crate) scoped: Stats,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` through cuda-mem-sys.
    pub(crate) raw: Stats,
}

impl ScalingRow {
    /// Each kind: its name and its rate.
    pub(crate) fn kinds(&self) -> [(&'static str, &Stats); 3] {
        [("Buffer", &self.buffer), ("ScopedBuffer", &self.scoped), ("raw", &self.raw)]
    }

    /// A thread's time per pair at a median `rate` of all threads: nanoseconds.
    pub(crate) fn per_thread_ns(&self, rate: &Stats) -> f64 {
        self.threads as f64 * 1e9 / rate.median
    }

    /// Time per pair of `kind` against raw's (raw's rate over the kind's, medians).
    pub(crate) fn ratio(&self, kind: &Stats) -> f64 {
        self.raw.median / kind.median
    }

    /// As a JSON object (a row of `results.json`'s `scaling`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "threads": self.threads,
            "size": SCALING_SIZE,
            "pairs_per_second": {"buffer": self.buffer.json(), "scoped": self.scoped.json(), "raw": self.raw.json()},
            "per_thread_ns_per_pair": {
                "buffer": rounded(self.per_thread_ns(&self.buffer), 1),
                "scoped": rounded(self.per_thread_ns(&self.scoped), 1),
                "raw": rounded(self.per_thread_ns(&self.raw), 1),
            },
            "ratio_buffer": rounded(self.ratio(&self.buffer), 3),
            "ratio_scoped": rounded(self.ratio(&self.scoped), 3),
        })
    }
}

/// The kinds of pair of the curve.
#[derive(Clone, Copy)]
enum Kind {
    Buffer,
    Scoped,
    Raw,
}

/// Case (1b): a row per thread count of [`SCALING_THREADS`], printed as it comes.
pub(crate) fn scaling(device: Device) -> Result<Vec<ScalingRow>, Error> {
    let d = cuda_mem_core::driver()?;
    let mut rows = Vec::new();
    for threads in SCALING_THREADS {
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
        pool.pool().set_release_threshold(u64::MAX)?;
        let [buffer, scoped, raw] = [Kind::Buffer, Kind::Scoped, Kind::Raw].map(|kind| {
            rate_per_thread(
                threads,
                GROUPS_PER_REP,
                REPS,
                |_| {
                    device.set_current()?;
                    Ok(Stream::new(device, StreamOptions::default().non_blocking())?)
                },
                |stream: &Stream| group(d, &pool, kind, stream),
            )
            .map(|groups| Stats {
                median: groups.median * PAIRS_PER_SYNC as f64,
                p10: groups.p10 * PAIRS_PER_SYNC as f64,
                p90: groups.p90 * PAIRS_PER_SYNC as f64,
                n: groups.n,
            })
        });
        let row = ScalingRow { threads, buffer: buffer?, scoped: scoped?, raw: raw? };
        let shown: Vec<String> = row
            .kinds()
            .iter()
            .map(|(name, rate)| {
                format!("{name} {:.2} M/s ({} per pair per thread)", rate.median / 1e6, ns(row.per_thread_ns(rate)))
            })
            .collect();
        println!("  {} × {threads} thread(s): {}", bytes(SCALING_SIZE), shown.join(", "));
        rows.push(row);
    }
    Ok(rows)
}

/// [`PAIRS_PER_SYNC`] pairs of `kind` on `stream`, then a wait for the stream.
fn group(d: &Driver, pool: &Arc<DeviceMemoryResource>, kind: Kind, stream: &Stream) -> Result<(), Error> {
    for _ in 0..PAIRS_PER_SYNC {
        match kind {
            Kind::Buffer => drop(pool.allocate(SCALING_SIZE, stream)?),
            Kind::Scoped => drop(pool.allocate_scoped(SCALING_SIZE, stream)?),
            Kind::Raw => raw_pair(d, pool, SCALING_SIZE, stream)?,
        }
    }
    stream.synchronize()?;
    Ok(())
}
