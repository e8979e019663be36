//! The throughput harness of case (4): operations per second of an operation run on several
//! threads at once.

use std::sync::Barrier;
use std::time::Instant;

use cuda_mem_core::{Device, Stream, StreamOptions};

use crate::Error;
use crate::stats::Stats;

/// Operations per second of `op` on `threads` threads, `total` operations per repetition split
/// between them, 5 repetitions after one warm-up.
pub(crate) fn rate(
    threads: usize,
    total: usize,
    op: impl Fn(usize) -> Result<(), Error> + Sync,
) -> Result<Stats, Error> {
    let each = total / threads;
    let mut sample = Vec::new();
    for rep in 0..6 {
        let barrier = Barrier::new(threads + 1);
        let took = std::thread::scope(|scope| -> Result<f64, Error> {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (op, barrier) = (&op, &barrier);
                    scope.spawn(move || -> Result<(), String> {
                        barrier.wait();
                        (0..each).try_for_each(|_| op(t)).map_err(|e| e.to_string())
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            for handle in handles {
                handle.join().map_err(|_| "a thread panicked")??;
            }
            Ok(start.elapsed().as_secs_f64())
        })?;
        if rep > 0 {
            sample.push((each * threads) as f64 / took);
        }
    }
    Ok(Stats::of(sample))
}

/// [`rate`] where each thread has a stream of its own.
pub(crate) fn rate_with_stream(
    device: Device,
    threads: usize,
    total: usize,
    op: impl Fn(&Stream) -> Result<(), Error> + Sync,
) -> Result<Stats, Error> {
    let streams = (0..threads)
        .map(|_| Stream::new(device, StreamOptions::default().non_blocking()))
        .collect::<Result<Vec<_>, _>>()?;
    let stats = rate(threads, total, |t| op(&streams[t]))?;
    for stream in &streams {
        stream.synchronize()?;
    }
    Ok(stats)
}
