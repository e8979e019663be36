//! The throughput harness of cases (4) and (1b): operations per second of an operation run on
//! several threads at once, over the span in which the threads did it.

use std::sync::Barrier;
use std::time::Instant;

use cuda_mem_core::{Device, Stream, StreamOptions};

use crate::Error;
use crate::stats::Stats;

/// When one thread began its share of the operations and when it had done them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) start: Instant,
    pub(crate) end: Instant,
}

/// Operations per second of `ops` operations done by threads that worked over `spans`: over
/// their union, from the first thread's start to the last one's end. Every operation lies in
/// it, however the scheduler ran the threads; a clock started by any one thread after the
/// others were released (as the coordinator's used to be) can start after most of the work is
/// done, and with more threads than CPUs it often does. `None` without spans.
pub(crate) fn ops_per_second(ops: usize, spans: &[Span]) -> Option<f64> {
    let start = spans.iter().map(|s| s.start).min()?;
    let end = spans.iter().map(|s| s.end).max()?;
    let seconds = end.saturating_duration_since(start).as_secs_f64();
    Some(ops as f64 / seconds.max(f64::MIN_POSITIVE))
}

/// Operations per second of `op` on `threads` threads, `total` operations per repetition split
/// between them, 5 repetitions after one warm-up.
pub(crate) fn rate(
    threads: usize,
    total: usize,
    op: impl Fn(usize) -> Result<(), Error> + Sync,
) -> Result<Stats, Error> {
    rate_per_thread(threads, total, 5, Ok, |t: &usize| op(*t))
}

/// Operations per second of `op` on `threads` threads, `total` operations per repetition split
/// between them, `reps` repetitions after one warm-up. Each thread first makes its state with
/// `setup` (its index in), untimed; then all are released together by a barrier and each times
/// its own share from its release ([`Span`]); the rate is over the union of their spans.
pub(crate) fn rate_per_thread<S>(
    threads: usize,
    total: usize,
    reps: usize,
    setup: impl Fn(usize) -> Result<S, Error> + Sync,
    op: impl Fn(&S) -> Result<(), Error> + Sync,
) -> Result<Stats, Error> {
    let each = total / threads;
    let mut sample = Vec::new();
    for rep in 0..=reps {
        let barrier = Barrier::new(threads);
        let spans = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (setup, op, barrier) = (&setup, &op, &barrier);
                    scope.spawn(move || -> Result<Span, String> {
                        // Every thread reaches the barrier, even one whose setup failed: one
                        // that returned early would leave the others waiting there forever.
                        let state = setup(t).map_err(|e| e.to_string());
                        barrier.wait();
                        let state = state?;
                        let start = Instant::now();
                        (0..each).try_for_each(|_| op(&state)).map_err(|e| e.to_string())?;
                        Ok(Span { start, end: Instant::now() })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                .collect::<Result<Vec<Span>, String>>()
        })?;
        if rep > 0 {
            sample.push(ops_per_second(each * threads, &spans).ok_or("no threads")?);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A span from `start` to `end` milliseconds after `base`.
    fn span(base: Instant, start: u64, end: u64) -> Span {
        Span { start: base + Duration::from_millis(start), end: base + Duration::from_millis(end) }
    }

    #[test]
    fn the_rate_is_over_the_union_of_the_spans() {
        let base = Instant::now();
        // Two threads released together, each 10 ms of work; the second was descheduled for
        // 9 ms after its release (as the coordinator that started the clock could be): 2,000
        // operations in 19 ms, not in the 10 ms from the late starter to the end.
        let spans = [span(base, 0, 10), span(base, 9, 19)];
        let rate = ops_per_second(2_000, &spans).unwrap();
        assert!((rate - 2_000.0 / 0.019).abs() < 1e-6, "{rate}");
        // Overlapping and nested spans count once: 8 threads over 0–40 ms.
        let spans: Vec<Span> = (0..8).map(|t| span(base, t, 40 - t)).collect();
        let rate = ops_per_second(8_000, &spans).unwrap();
        assert!((rate - 8_000.0 / 0.040).abs() < 1e-6, "{rate}");
        assert!(ops_per_second(1, &[]).is_none());
    }

    #[test]
    fn a_measured_rate_is_bounded_by_the_work() {
        // 4 threads, 10 operations each of at least 200 µs: at most 4 / 200 µs = 20,000 per
        // second, whatever the scheduler does.
        let stats = rate_per_thread(
            4,
            40,
            5,
            |_| Ok(()),
            |_: &()| {
                std::thread::sleep(Duration::from_micros(200));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(stats.n, 5);
        assert!(stats.p90 <= 20_000.0 && stats.p10 > 0.0, "{stats:?}");
    }
}
