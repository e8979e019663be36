//! Case (1c): a 64 KiB allocate+free pair on the same stream through each memory resource of
//! [`crate::contenders`], on 1, 2 and as many threads as the host has CPUs, each thread on a
//! stream of its own, against the raw driver pool pair (`cuMemAllocFromPoolAsync` +
//! `cuMemFreeAsync` on a pool that keeps its memory) in the same run. As case (1b), the result
//! is pairs per second of all threads together (see [`crate::rates`]); the ratio is the time
//! per pair against the raw pair's.
//!
//! Each resource is timed two ways: a [`Buffer`](cuda_mem_core::Buffer) allocated and dropped
//! (what an application writes), and the trait's own calls (`allocate_raw` +
//! `deallocate_raw`: the resource's cost without the buffer's).

use std::sync::Arc;

use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryResource, MemoryResourceExt, Stream, StreamOptions,
};
use serde_json::{Value, json};

use crate::Error;
use crate::contenders::Contender;
use crate::pools::raw_pair;
use crate::rates::rate_per_thread;
use crate::scaling::PAIRS_PER_SYNC;
use crate::stats::{Stats, rounded};
use crate::units::{KIB, bytes, ns};

/// Bytes per allocation.
pub(crate) const RESOURCE_PAIR_SIZE: usize = 64 * KIB;
/// Synchronized groups of [`PAIRS_PER_SYNC`] pairs per timed repetition, split between the
/// threads: 10,000 pairs.
const GROUPS_PER_REP: usize = 200;
/// Timed repetitions per kind and thread count: one per round, every kind in each round (which
/// goes first rotating), so that a change of the host's load meets every kind alike.
pub(crate) const ROUNDS: usize = 12;

/// The thread counts: 1, 2 and the host's CPUs (each once, in order).
pub(crate) fn resource_pair_threads() -> Vec<usize> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let mut threads = vec![1, 2, cpus];
    threads.sort_unstable();
    threads.dedup();
    threads
}

/// One resource on one thread count: pairs per second of all threads together.
pub(crate) struct ResourcePairRow {
    /// The resource's name.
    pub(crate) name: &'static str,
    /// Threads, each on a stream of its own.
    pub(crate) threads: usize,
    /// A `Buffer` allocated and dropped.
    pub(crate) buffer: Stats,
    /// `allocate_raw` + `deallocate_raw`.
    pub(crate) calls: Stats,
    /// The raw driver pool pair on the same thread count, in the same run.
    pub(crate) raw: Stats,
}

impl ResourcePairRow {
    /// The time per pair of `kind` against the raw pair's (raw's rate over the kind's).
    pub(crate) fn ratio(&self, kind: &Stats) -> f64 {
        self.raw.median / kind.median
    }

    /// A thread's time per pair at a median `rate` of all threads: nanoseconds.
    pub(crate) fn per_thread_ns(&self, rate: &Stats) -> f64 {
        self.threads as f64 * 1e9 / rate.median
    }

    /// As a JSON object (a row of `results.json`'s `resource_pairs`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "resource": self.name,
            "threads": self.threads,
            "size": RESOURCE_PAIR_SIZE,
            "pairs_per_second": {"buffer": self.buffer.json(), "calls": self.calls.json(), "raw": self.raw.json()},
            "ratio_buffer": rounded(self.ratio(&self.buffer), 3),
            "ratio_calls": rounded(self.ratio(&self.calls), 3),
        })
    }
}

/// What a group of pairs goes through.
#[derive(Clone, Copy)]
enum Kind<'a> {
    Buffer(&'a Arc<dyn MemoryResource>),
    Calls(&'a Arc<dyn MemoryResource>),
    Raw(&'a DeviceMemoryResource),
}

/// Case (1c): a row per thread count of [`resource_pair_threads`] and contender, printed as
/// they come.
pub(crate) fn resource_pairs(device: Device, contenders: &[Contender]) -> Result<Vec<ResourcePairRow>, Error> {
    let raw_pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    raw_pool.pool().set_release_threshold(u64::MAX)?;
    let mut rows = Vec::new();
    for threads in resource_pair_threads() {
        let resources = contenders.iter().map(|c| Ok((c.make)(device)?.resource)).collect::<Result<Vec<_>, Error>>()?;
        let mut kinds = vec![Kind::Raw(&raw_pool)];
        kinds.extend(resources.iter().flat_map(|r| [Kind::Buffer(r), Kind::Calls(r)]));
        // A stream per thread for the whole measurement, as a program keeps its streams: a
        // caching resource keeps what each stream freed for that stream.
        let streams = (0..threads)
            .map(|_| Stream::new(device, StreamOptions::default().non_blocking()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut samples = vec![Vec::with_capacity(ROUNDS); kinds.len()];
        for round in 0..ROUNDS {
            for k in 0..kinds.len() {
                let kind = (round + k) % kinds.len();
                samples[kind].push(rate(device, &streams, kinds[kind])?);
            }
        }
        let mut stats = samples.into_iter().map(Stats::of);
        let raw = stats.next().ok_or("the raw pair's sample")?;
        for contender in contenders {
            let (Some(buffer), Some(calls)) = (stats.next(), stats.next()) else {
                return Err("a sample per contender's kind".into());
            };
            let row = ResourcePairRow { name: contender.name, threads, buffer, calls, raw };
            println!(
                "  {} × {threads} thread(s), {}: Buffer {} per pair per thread ({:.2}× raw), calls {} ({:.2}×), raw {}",
                bytes(RESOURCE_PAIR_SIZE),
                contender.name,
                ns(row.per_thread_ns(&row.buffer)),
                row.ratio(&row.buffer),
                ns(row.per_thread_ns(&row.calls)),
                row.ratio(&row.calls),
                ns(row.per_thread_ns(&row.raw)),
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Pairs per second of `kind` on as many threads as `streams`, thread `t` on `streams[t]`: one
/// timed repetition, after one warm-up.
fn rate(device: Device, streams: &[Stream], kind: Kind<'_>) -> Result<f64, Error> {
    let d = cuda_mem_core::driver()?;
    let groups = rate_per_thread(
        streams.len(),
        GROUPS_PER_REP,
        1,
        |t| {
            device.set_current()?;
            Ok(streams.get(t).ok_or("a stream per thread")?.clone())
        },
        |stream: &Stream| {
            for _ in 0..PAIRS_PER_SYNC {
                match kind {
                    Kind::Buffer(resource) => drop(resource.allocate(RESOURCE_PAIR_SIZE, stream)?),
                    Kind::Calls(resource) => calls_pair(&**resource, stream)?,
                    Kind::Raw(pool) => raw_pair(d, pool, RESOURCE_PAIR_SIZE, stream)?,
                }
            }
            stream.synchronize()?;
            Ok(())
        },
    )?;
    Ok(groups.median * PAIRS_PER_SYNC as f64)
}

/// One pair through the resource's own calls.
fn calls_pair(resource: &dyn MemoryResource, stream: &Stream) -> Result<(), Error> {
    let ptr = resource.allocate_raw(RESOURCE_PAIR_SIZE, stream)?;
    // SAFETY: `ptr` and the size come from the `allocate_raw` just above, nothing uses the
    // memory, and it is freed once.
    unsafe { resource.deallocate_raw(ptr, RESOURCE_PAIR_SIZE, stream) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_counts_are_one_two_and_the_cpus_once_each() {
        let threads = resource_pair_threads();
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(threads[..2], [1, 2]);
        assert_eq!(threads.last(), Some(&cpus.max(2)));
        assert!(threads.windows(2).all(|w| w[0] < w[1]), "{threads:?}");
    }
}
