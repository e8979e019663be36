//! `cargo xtask bench`: builds the simulator in release (so that the benchmarks have it to fall
//! back on, optimized), then runs the release `bench` binary of the integration package
//! ([`crate::INTEGRATION`], in `tests/`) with the
//! caller's environment (`CUDA_MEM_DRIVER` and the `CUDA_SIM_*` variables included). The binary
//! writes `target/bench/results.{json,md}` and the SVG plots, and prints the Markdown tables.
//!
//! `--compare` then runs cuda.core's equivalents on the same driver (see [`crate::compare`]),
//! and case (1) of both again on a nearly free stand-in driver (`xtask/compare/null_driver.rs`),
//! and writes `target/bench/compare.md`: each side's overhead beyond its own raw driver calls,
//! and their ratio (the target: ours at most 1/20 of cuda.core's).

use std::path::Path;

use crate::{cargo, run_command};

/// Runs the subcommand.
pub fn run(workspace: &Path, compare: bool) -> Result<(), String> {
    println!("building the simulator and the benchmarks in release (the first time, minutes on 2 cores)…");
    run_command(cargo(workspace).args(["build", "--release", "-p", "cuda-sim"]))
        .map_err(|e| format!("building the simulator: {e}"))?;
    run_command(cargo(workspace).args(["run", "--release", "-p", crate::INTEGRATION, "--bin", "bench"]))
        .map_err(|e| format!("the benchmarks failed: {e}"))?;
    if compare {
        crate::compare::compare(&crate::compare::Setup::in_workspace(workspace)?)?;
    }
    Ok(())
}
