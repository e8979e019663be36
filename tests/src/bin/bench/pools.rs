//! Case (1): pool allocate+free pairs at 256 B, 64 KiB and 4 MiB on one thread and on several
//! (a stream each), through the safe API (shared and scoped buffers), through the raw driver
//! calls, and through the raw calls with the safe API's capture check.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use cuda_mem_core::sys::types::CUstreamCaptureStatus;
use cuda_mem_core::sys::{Driver, cu_call};
use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, DevicePtr, MemoryResourceExt, Stream, StreamOptions,
};
use serde_json::{Value, json};

use crate::Error;
use crate::stats::{Stats, elapsed_ns, rounded};
use crate::units::{KIB, MIB, bytes};

/// The sizes of the pairs.
pub(crate) const POOL_SIZES: [usize; 3] = [256, 64 * KIB, 4 * MIB];
/// Allocate+free pairs per timed repetition of case 1.
const PAIRS_PER_REP: usize = 50;
/// The threads of the multi-threaded rows.
pub(crate) const POOL_THREADS: usize = 4;

/// One size on one thread count: ns per pair of each kind.
pub(crate) struct PoolRow {
    /// Bytes per allocation.
    pub(crate) size: usize,
    /// Threads, each on a stream of its own.
    pub(crate) threads: usize,
    /// The safe API's shared allocation (`allocate`: a `Buffer`).
    pub(crate) safe: Stats,
    /// `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` through cuda-mem-sys.
    pub(crate) raw: Stats,
    /// The raw calls with the capture check the safe API makes before each allocation (as
    /// cuda.core does): the same driver work as the safe pair, so the rest is our code's.
    pub(crate) raw_checked: Stats,
    /// The safe API's scoped allocation (`allocate_scoped`: borrows instead of shares).
    pub(crate) scoped: Stats,
}

impl PoolRow {
    /// Safe against the raw calls.
    pub(crate) fn ratio(&self) -> f64 {
        self.safe.median / self.raw.median
    }

    /// Safe against the raw calls that do the same driver work.
    pub(crate) fn ratio_checked(&self) -> f64 {
        self.safe.median / self.raw_checked.median
    }

    /// Scoped against the raw calls.
    pub(crate) fn ratio_scoped(&self) -> f64 {
        self.scoped.median / self.raw.median
    }

    /// As a JSON object (a row of `results.json`'s `pools`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "size": self.size,
            "threads": self.threads,
            "safe_per_pair": self.safe.json(),
            "raw_per_pair": self.raw.json(),
            "raw_checked_per_pair": self.raw_checked.json(),
            "scoped_per_pair": self.scoped.json(),
            "ratio": rounded(self.ratio(), 3),
            "ratio_checked": rounded(self.ratio_checked(), 3),
            "ratio_scoped": rounded(self.ratio_scoped(), 3),
        })
    }
}

/// Case (1) on each of `thread_counts`, every size: a row each, printed as it comes.
pub(crate) fn pools(device: Device, thread_counts: &[usize]) -> Result<Vec<PoolRow>, Error> {
    let mut rows = Vec::new();
    for &threads in thread_counts {
        for size in POOL_SIZES {
            let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
            pool.pool().set_release_threshold(u64::MAX)?;
            let reps = if threads == 1 { 1500 } else { 500 };
            let barrier = Barrier::new(threads);
            let samples: Vec<ThreadSamples> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let pool = &pool;
                        let barrier = &barrier;
                        scope.spawn(move || pool_thread(device, pool, size, reps, barrier).map_err(|e| e.to_string()))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
            });
            let [mut safe, mut raw, mut raw_checked, mut scoped] = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            for sample in samples {
                let [s, r, c, b] = sample?;
                safe.extend(s);
                raw.extend(r);
                raw_checked.extend(c);
                scoped.extend(b);
            }
            let row = PoolRow {
                size,
                threads,
                safe: Stats::of(safe),
                raw: Stats::of(raw),
                raw_checked: Stats::of(raw_checked),
                scoped: Stats::of(scoped),
            };
            println!(
                "  {} × {threads} thread(s): safe {} scoped {} raw {} raw+check {} per pair, ratio {:.2} ({:.2} against \
                 raw+check, scoped {:.2})",
                bytes(size),
                row.safe.show(),
                row.scoped.show(),
                row.raw.show(),
                row.raw_checked.show(),
                row.ratio(),
                row.ratio_checked(),
                row.ratio_scoped()
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

/// One thread's safe and raw samples, or why it failed.
type ThreadSamples = Result<[Vec<f64>; KINDS], String>;

/// The kinds of pair timed in case (1): safe, raw, raw with the capture check, scoped.
const KINDS: usize = 4;

/// A timed repetition of one kind (safe, raw, raw with the capture check, scoped): ns per pair.
type Rep<'a> = Box<dyn Fn() -> Result<f64, Error> + 'a>;

/// One thread's repetitions on its own stream, safe and raw alternating; ns per pair.
fn pool_thread(
    device: Device,
    pool: &Arc<DeviceMemoryResource>,
    size: usize,
    reps: usize,
    barrier: &Barrier,
) -> Result<[Vec<f64>; KINDS], Error> {
    // Every thread reaches the barrier, even one whose setup or warm-up failed: a thread that
    // returned early would leave the others waiting there forever.
    let prepared = prepare_pool_thread(device);
    let warmed = prepared
        .as_ref()
        .map_err(|e| e.to_string())
        .and_then(|(d, stream)| warm_pool_thread(d, pool, size, stream).map_err(|e| e.to_string()));
    barrier.wait();
    let (d, stream) = prepared?;
    warmed.map_err(|e| -> Error { e.into() })?;
    measure_pool_thread(d, pool, size, reps, &stream)
}

/// A thread's driver and stream, with the device's context current.
fn prepare_pool_thread(device: Device) -> Result<(&'static Driver, Stream), Error> {
    let d = cuda_mem_core::driver()?;
    device.set_current()?;
    Ok((d, Stream::new(device, StreamOptions::default().non_blocking())?))
}

/// The repetitions of [`pool_thread`]: safe, raw, raw with the capture check, and scoped.
fn pool_reps<'a>(
    d: &'static Driver,
    pool: &'a Arc<DeviceMemoryResource>,
    size: usize,
    stream: &'a Stream,
) -> [Rep<'a>; KINDS] {
    let safe_rep = move || {
        per_pair(|| {
            drop(pool.allocate(size, stream)?);
            Ok(())
        })
    };
    let scoped_rep = move || {
        per_pair(|| {
            drop(pool.allocate_scoped(size, stream)?);
            Ok(())
        })
    };
    let raw_rep = move |checked: bool| {
        per_pair(|| {
            if checked {
                let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                // SAFETY: a valid out-pointer and the stream's live handle.
                unsafe { cu_call!(d, cuStreamIsCapturing(stream.handle(), &mut status)) }?;
                if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    return Err("the stream is capturing".into());
                }
            }
            raw_pair(d, pool, size, stream)
        })
    };
    [Box::new(safe_rep), Box::new(move || raw_rep(false)), Box::new(move || raw_rep(true)), Box::new(scoped_rep)]
}

/// Runs `pair` [`PAIRS_PER_REP`] times: nanoseconds per run.
pub(crate) fn per_pair(mut pair: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    let start = Instant::now();
    for _ in 0..PAIRS_PER_REP {
        pair()?;
    }
    Ok(elapsed_ns(start) / PAIRS_PER_REP as f64)
}

/// One allocate+free pair of `size` bytes from `pool` on `stream`, through the raw driver calls.
pub(crate) fn raw_pair(d: &Driver, pool: &DeviceMemoryResource, size: usize, stream: &Stream) -> Result<(), Error> {
    let mut ptr: DevicePtr = 0;
    // SAFETY: a valid out-pointer, the pool's and the stream's live handles.
    unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut ptr, size, pool.pool().handle(), stream.handle())) }?;
    // SAFETY: `ptr` was just allocated on this stream and is freed once.
    unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream.handle())) }?;
    Ok(())
}

/// Ten repetitions of each kind, untimed.
fn warm_pool_thread(
    d: &'static Driver,
    pool: &Arc<DeviceMemoryResource>,
    size: usize,
    stream: &Stream,
) -> Result<(), Error> {
    let reps = pool_reps(d, pool, size, stream);
    for _ in 0..10 {
        for rep in &reps {
            rep()?;
        }
    }
    stream.synchronize()?;
    Ok(())
}

/// `reps` timed repetitions of each kind, in turn.
fn measure_pool_thread(
    d: &'static Driver,
    pool: &Arc<DeviceMemoryResource>,
    size: usize,
    reps: usize,
    stream: &Stream,
) -> Result<[Vec<f64>; KINDS], Error> {
    let kinds = pool_reps(d, pool, size, stream);
    let mut samples: [Vec<f64>; KINDS] = std::array::from_fn(|_| Vec::with_capacity(reps));
    for rep in 0..reps {
        // Rotate which goes first, so that none always follows another.
        for k in 0..kinds.len() {
            let kind = (rep + k) % kinds.len();
            samples[kind].push(kinds[kind]()?);
        }
        stream.synchronize()?;
    }
    Ok(samples)
}
