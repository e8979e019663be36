//! The outputs: what the run found ([`Results`]), written to the output folder as JSON
//! ([`json`]), Markdown ([`markdown`]) and SVG plots ([`svg`]), with case (8)'s series as CSV.

mod json;
mod markdown;
mod svg;

use std::path::Path;
use std::time::Instant;

use crate::Error;
use crate::adaptors::{AdaptorRow, CopyRow};
use crate::elastic::{ElasticRow, OnDemandRow};
use crate::handoff::Handoff;
use crate::pacing::Pacing;
use crate::pools::PoolRow;
use crate::replay::TraceRun;
use crate::resource_pairs::ResourcePairRow;
use crate::scaling::ScalingRow;
use crate::sharing::{RateRow, ResendRow, ShareRow};
use crate::snapshots::{RecordingRow, SnapshotRow};
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
    /// Case (2)'s re-send of buffers already sent.
    pub(crate) resend: Option<ResendRow>,
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
    /// Case (1c): each resource's pairs against the raw pair, per thread count.
    pub(crate) resource_pairs: Vec<ResourcePairRow>,
    /// Case (8): each trace replayed against each resource.
    pub(crate) traces: Vec<TraceRun>,
    /// Case (9): the pair with the history recording off and on.
    pub(crate) recording: Option<RecordingRow>,
    /// Case (9): snapshots against live allocations.
    pub(crate) snapshots: Vec<SnapshotRow>,
    /// Case (10): elastic groups, per size.
    pub(crate) elastic: Vec<ElasticRow>,
    /// Case (10): the on-demand range.
    pub(crate) on_demand: Option<OnDemandRow>,
    /// Case (11): hand-offs to workers.
    pub(crate) handoff: Option<Handoff>,
}

/// Writes `results.json`, `results.md`, `vmm_steps.svg`, `pools.svg`, `scaling.svg`,
/// `copies.svg` and case (8)'s `trace_<name>.{svg,csv}` to the output folder, then prints the
/// Markdown and what it wrote, with the time since `total`.
pub(crate) fn write_all(results: &Results, total: Instant) -> Result<(), Error> {
    let out = output_dir()?;
    let markdown = markdown::markdown(results);
    write(&out.join("results.json"), &json::json(results))?;
    write(&out.join("results.md"), &markdown)?;
    write(&out.join("vmm_steps.svg"), &svg::vmm_svg(&results.vmm))?;
    write(&out.join("pools.svg"), &svg::pools_svg(&results.pools))?;
    write(&out.join("scaling.svg"), &svg::scaling_svg(&results.scaling, host_cpus()))?;
    write(&out.join("copies.svg"), &svg::copies_svg(&results.copies))?;
    let traces = write_traces(&out, &results.traces)?;
    println!("\n{markdown}");
    println!(
        "wrote {}/{{results.json, results.md, vmm_steps.svg, pools.svg, scaling.svg, copies.svg, {}}} in {:.1} s",
        out.display(),
        traces.join(", "),
        total.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The output folder (`BENCH_OUT`, else `target/bench`), made if missing.
pub(crate) fn output_dir() -> Result<std::path::PathBuf, Error> {
    let out = cuda_mem_integration::output::output_dir("BENCH_OUT", "bench");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    Ok(out)
}

/// Writes each of case (8)'s runs as `trace_<name>.svg` (the plot), `trace_<name>.csv` (a row
/// per step) and `trace_<name>_samples.csv` (every reading, the plot's points) to `out`; the
/// names written.
pub(crate) fn write_traces(out: &Path, runs: &[TraceRun]) -> Result<Vec<String>, Error> {
    let mut written = Vec::new();
    for run in runs {
        let files = [
            (format!("trace_{}.svg", run.trace), svg::trace_svg(run)),
            (format!("trace_{}.csv", run.trace), run.csv()),
            (format!("trace_{}_samples.csv", run.trace), run.samples_csv()),
        ];
        for (file, text) in files {
            write(&out.join(&file), &text)?;
            written.push(file);
        }
    }
    Ok(written)
}

/// Case (1c)'s and case (8)'s tables alone (for `bench --resource-pairs` and `bench --traces`).
pub(crate) fn markdown_of(resource_pairs: &[ResourcePairRow], traces: &[TraceRun]) -> String {
    let mut md = String::new();
    markdown::resource_pairs(&mut md, resource_pairs);
    markdown::traces(&mut md, traces);
    md
}

/// The CPUs this process may run on: with fewer than the threads of a row of case (1) or (1b),
/// the threads take turns and the row measures the scheduler as much as the pool.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()).into())
}

#[cfg(test)]
mod report_tests {
    use super::*;

    /// `median (p10–p90)` of nanoseconds, from 100 samples.
    fn stats(median: f64, p10: f64, p90: f64) -> Stats {
        Stats { median, p10, p90, n: 100 }
    }

    /// Results with a re-send at 1/20 of raw: 50 + 25 ns against 1,500 ns.
    fn with_resend() -> Results {
        let resend = ResendRow {
            batch: 1024,
            parent: stats(50.0, 40.0, 60.0),
            child: stats(25.0, 20.0, 30.0),
            both: stats(75.0, 65.0, 85.0),
            raw: stats(1500.0, 1400.0, 1600.0),
        };
        Results { resend: Some(resend), ..Results::default() }
    }

    #[test]
    fn the_json_has_the_resend_with_its_raw_figure() {
        let text = json::json(&with_resend());
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let expected = serde_json::json!({
            "batch": 1024,
            "per_buffer": {
                "parent": {"median": 50.0, "p10": 40.0, "p90": 60.0, "n": 100},
                "child": {"median": 25.0, "p10": 20.0, "p90": 30.0, "n": 100},
                "both": {"median": 75.0, "p10": 65.0, "p90": 85.0, "n": 100},
                "raw": {"median": 1500.0, "p10": 1400.0, "p90": 1600.0, "n": 100},
            },
            "ratio_to_raw": 0.05,
            "target_ratio": 0.1,
        });
        assert_eq!(parsed["sharing_resend"], expected, "{text}");
        let without = json::json(&Results::default());
        let parsed: serde_json::Value = serde_json::from_str(&without).unwrap_or_else(|e| panic!("{e}: {without}"));
        assert_eq!(parsed["sharing_resend"], serde_json::Value::Null, "{without}");
    }

    #[test]
    fn the_json_rounds_to_a_tenth_and_writes_what_is_not_a_number_as_null() {
        let mut results = with_resend();
        if let Some(r) = &mut results.resend {
            r.parent = stats(50.04, f64::NAN, 60.06);
        }
        let text = json::json(&results);
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let parent = &parsed["sharing_resend"]["per_buffer"]["parent"];
        assert_eq!(parent["median"], 50.0, "{text}");
        assert_eq!(parent["p10"], serde_json::Value::Null, "{text}");
        assert_eq!(parent["p90"], 60.1, "{text}");
    }

    #[test]
    fn the_markdown_has_the_resend_row_with_its_ratio_and_target() {
        let md = markdown::markdown(&with_resend());
        let row = md.lines().find(|line| line.starts_with("| 1024 |")).unwrap_or_else(|| panic!("{md}"));
        assert!(row.contains("| 0.050× | met |"), "{row}");
        assert!(md.contains("target ≤ 1/10 of raw"), "{md}");
        let mut missed = with_resend();
        if let Some(r) = &mut missed.resend {
            r.both = stats(300.0, 290.0, 310.0);
        }
        let md = markdown::markdown(&missed);
        assert!(md.contains("| 0.200× | missed |"), "{md}");
        assert!(!markdown::markdown(&Results::default()).contains("Re-send"));
    }

    #[test]
    fn the_additivity_check_reads_a_negative_difference_as_slower_pairs() {
        let paced = |alone: f64, with_work: f64| {
            let pacing =
                Pacing { raw: stats(alone, alone, alone), raw_with_work: stats(with_work, with_work, with_work) };
            markdown::markdown(&Results { pacing: Some(pacing), ..Results::default() })
        };
        let hid = paced(1200.0, 1080.0);
        assert!(hid.contains(": 120 ns less than alone") && hid.contains("up to about 120 ns per pair"), "{hid}");
        let slower = paced(1200.0, 1290.0);
        assert!(slower.contains(": 90 ns more than alone") && slower.contains("None of the caller's work hid"));
        assert!(!slower.contains("-90") && !slower.contains("up to about 0 ns"), "{slower}");
        assert!(paced(1200.0, 1200.0).contains(": as long as alone"));
    }
}
