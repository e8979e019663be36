//! The outputs: what the run found ([`Results`]), written to the output folder as JSON
//! ([`json`]), Markdown ([`markdown`]) and four SVG plots ([`svg`]).

mod json;
mod markdown;
mod svg;

use std::path::Path;
use std::time::Instant;

use crate::Error;
use crate::adaptors::{AdaptorRow, CopyRow};
use crate::pacing::Pacing;
use crate::pools::PoolRow;
use crate::scaling::ScalingRow;
use crate::sharing::{RateRow, ShareRow};
use crate::stats::Stats;
use crate::vmm::VmmMode;

/// What the run found, for the outputs.
#[derive(Default)]
pub(crate) struct Results {
    /// The driver, in words.
    pub(crate) driver: String,
    /// Whether it is the simulator.
    pub(crate) simulator: bool,
    /// Case (1).
    pub(crate) pools: Vec<PoolRow>,
    /// Case (2).
    pub(crate) sharing: Vec<ShareRow>,
    /// Case (3), per mode.
    pub(crate) vmm: Vec<VmmMode>,
    /// One growth from one chunk to two, repeated: (moving, its time).
    pub(crate) first_grows: Vec<(bool, Stats)>,
    /// Case (1b): pairs per second against threads.
    pub(crate) scaling: Vec<ScalingRow>,
    /// Case (1)'s additivity check.
    pub(crate) pacing: Option<Pacing>,
    /// Case (4).
    pub(crate) lookups: Vec<RateRow>,
    /// Case (5): spawn to return, and main to return.
    pub(crate) first_call: Option<(Stats, Stats)>,
    /// Case (6).
    pub(crate) adaptors: Vec<AdaptorRow>,
    /// Case (7).
    pub(crate) copies: Vec<CopyRow>,
}

/// Writes `results.json`, `results.md`, `vmm_steps.svg`, `pools.svg`, `scaling.svg` and `copies.svg` to the
/// output folder,
/// then prints the Markdown and what it wrote, with the time since `total`.
pub(crate) fn write_all(results: &Results, total: Instant) -> Result<(), Error> {
    let out = tests::output::output_dir("BENCH_OUT", "bench");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let markdown = markdown::markdown(results);
    write(&out.join("results.json"), &json::json(results))?;
    write(&out.join("results.md"), &markdown)?;
    write(&out.join("vmm_steps.svg"), &svg::vmm_svg(&results.vmm))?;
    write(&out.join("pools.svg"), &svg::pools_svg(&results.pools))?;
    write(&out.join("scaling.svg"), &svg::scaling_svg(&results.scaling, host_cpus()))?;
    write(&out.join("copies.svg"), &svg::copies_svg(&results.copies))?;
    println!("\n{markdown}");
    println!(
        "wrote {}/{{results.json, results.md, vmm_steps.svg, pools.svg, scaling.svg, copies.svg}} in {:.1} s",
        out.display(),
        total.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The CPUs this process may run on: with fewer than the threads of a row of case (1) or (1b),
/// the threads take turns and the row measures the scheduler as much as the pool.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()).into())
}
