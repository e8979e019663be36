//! Case (1)'s additivity check: whether the driver's time per pair stays the same however busy
//! its caller is, which the overheads (an API's time minus the raw time) rest on.

use std::time::Instant;

use cuda_mem_core::{Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream, StreamOptions};

use crate::Error;
use crate::pools::{per_pair, raw_pair};
use crate::stats::Stats;

/// Caller work added between raw pairs by [`pacing`], in nanoseconds.
pub(crate) const PACING_WORK_NS: u64 = 500;

/// Whether the driver's cost per pair is additive: raw 256 B pairs alone, and with
/// [`PACING_WORK_NS`] of the caller's own work (a spin) after each pair, sampled in turn. An
/// API's overhead is measured as its time minus the raw time, which holds only if the driver
/// takes as long however busy its caller is; a driver that does part of the work on a thread
/// of its own (the simulator frees on its stream's thread, contending with the caller for the
/// process's memory map) hides caller work up to some amount, and overheads below it.
pub(crate) struct Pacing {
    /// A raw 256 B pair alone.
    pub(crate) raw: Stats,
    /// Pair and work together, the work's own time (measured alone) taken off.
    pub(crate) raw_with_work: Stats,
}

impl Pacing {
    /// How much of the work did not show in the time: the median pair alone minus the median
    /// pair with the work (its own time taken off). Near zero where the driver is additive.
    pub(crate) fn hidden_ns(&self) -> f64 {
        self.raw.median - self.raw_with_work.median
    }
}

/// Measures [`Pacing`] on device 0, and prints it.
pub(crate) fn pacing(device: Device) -> Result<Pacing, Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    pool.pool().set_release_threshold(u64::MAX)?;
    let spin = || {
        let start = Instant::now();
        while start.elapsed().as_nanos() < u128::from(PACING_WORK_NS) {}
    };
    let rep = |work: bool| {
        per_pair(|| {
            raw_pair(d, &pool, 256, &stream)?;
            if work {
                spin();
            }
            Ok(())
        })
    };
    let work_alone = || {
        per_pair(|| {
            spin();
            Ok(())
        })
    };
    let (mut raw, mut with_work) = (Vec::new(), Vec::new());
    for i in 0..550 {
        let (alone, paced, work) = (rep(false)?, rep(true)?, work_alone()?);
        stream.synchronize()?;
        if i >= 50 {
            raw.push(alone);
            with_work.push(paced - work);
        }
    }
    let pacing = Pacing { raw: Stats::of(raw), raw_with_work: Stats::of(with_work) };
    println!(
        "  additivity: raw 256 B pair {}, with {PACING_WORK_NS} ns of caller work after each (work's time taken off) {}: {:.0} ns less",
        pacing.raw.show(),
        pacing.raw_with_work.show(),
        pacing.hidden_ns()
    );
    Ok(pacing)
}
