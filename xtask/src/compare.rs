//! `cargo xtask bench --compare`: cuda.core's side of the comparison, run on the same driver in a
//! private virtual environment (`xtask/compare/cuda_core_bench.py`).

use std::path::Path;
use std::process::Command;

use crate::json::{self, Value};
use crate::python_smoke;

/// The cuda.core release compared against.
pub const CUDA_CORE: &str = "cuda-core==1.2.2";

/// Runs cuda.core's benchmarks on the simulator (when `on_simulator`) or on the driver the
/// normal library search finds; returns their JSON.
pub fn run(workspace: &Path, on_simulator: bool, quick: bool) -> Result<String, String> {
    let python = python_smoke::venv(workspace, &[python_smoke::CUDA_BINDINGS, CUDA_CORE])??;
    let script = workspace.join("xtask/compare/cuda_core_bench.py");
    let mut command = Command::new(python);
    command.arg(&script).env_remove("CUDA_SIM_DEVICES");
    if quick {
        command.arg("--quick");
    }
    if on_simulator {
        command.env("LD_LIBRARY_PATH", python_smoke::simulator_lib_dir(workspace, "release")?);
    }
    let output = command.output().map_err(|e| format!("running {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8(output.stdout).map_err(|e| format!("cuda.core's output is not UTF-8: {e}"))
}

/// The median of a `{"median": …}` (ours) or `{"median_ns": …}` (cuda.core's) object.
fn median(value: &Value, key: &str) -> Option<f64> {
    value.get(key).and_then(Value::as_number)
}

/// Runs cuda.core's side on the driver our benchmarks used, then writes and prints the table.
pub fn compare(workspace: &Path) -> Result<(), String> {
    let out = workspace.join("target/bench");
    let ours_text =
        std::fs::read_to_string(out.join("results.json")).map_err(|e| format!("reading results.json: {e}"))?;
    let ours = json::parse(&ours_text)?;
    let on_simulator = ours.get("simulator").and_then(Value::as_bool).unwrap_or(true);
    let theirs_text = run(workspace, on_simulator, false)?;
    let theirs = json::parse(theirs_text.trim())?;
    let mut table = String::from(
        "| size | raw driver calls (cuda-sys) | ours: safe | our overhead | cuda.core | cuda.core overhead | ours / theirs | raw cuda.bindings (Python, for reference) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let their_results = theirs.get("results").and_then(Value::as_array).unwrap_or_default();
    for pool in ours.get("pools").and_then(Value::as_array).unwrap_or_default() {
        if pool.get("threads").and_then(Value::as_number) != Some(1.0) {
            continue;
        }
        let size = pool.get("size").and_then(Value::as_number).unwrap_or(0.0);
        let safe = pool.get("safe_per_pair").and_then(|v| median(v, "median")).unwrap_or(f64::NAN);
        let raw = pool.get("raw_per_pair").and_then(|v| median(v, "median")).unwrap_or(f64::NAN);
        let find = |api: &str| {
            their_results
                .iter()
                .find(|r| {
                    r.get("case").and_then(Value::as_str) == Some("pool_pair")
                        && r.get("size").and_then(Value::as_number) == Some(size)
                        && r.get("api").and_then(Value::as_str) == Some(api)
                })
                .and_then(|r| median(r, "median_ns"))
                .unwrap_or(f64::NAN)
        };
        let (core, core_raw) = (find("cuda.core"), find("cuda.bindings raw"));
        // Both overheads are measured against the same native raw pair: Python's own raw calls
        // (cuda.bindings) carry interpreter costs that cuda.core's compiled path does not.
        let (ours_over, theirs_over) = (safe - raw, core - raw);
        table.push_str(&format!(
            "| {size} | {raw:.0} ns | {safe:.0} ns | {ours_over:.0} ns | {core:.0} ns | {theirs_over:.0} ns | {:.3} | {core_raw:.0} ns |\n",
            ours_over / theirs_over
        ));
    }
    for r in their_results.iter().filter(|r| r.get("case").and_then(Value::as_str) == Some("vmm_grow_step")) {
        match (r.get("error").and_then(Value::as_str), median(r, "median_ns")) {
            (Some(error), _) => table.push_str(&format!("\ncuda.core VMM grow: failed on this driver: {error}\n")),
            (None, Some(m)) => table.push_str(&format!("\ncuda.core VMM grow: {m:.0} ns per 2 MiB step (median)\n")),
            _ => {}
        }
    }
    let driver = if on_simulator { "the cuda-sim simulator" } else { "the real driver" };
    let text = format!(
        "# cuda-mem against cuda.core ({CUDA_CORE}, {}), on {driver}\n\n\
         Allocate+free pairs on one stream, medians. Overhead = the API's time per pair minus the raw driver \
         calls' time (cuda-sys, native) in the same run, on the same driver; the target is ours at most 1/20 of \
         cuda.core's. Negative values are noise.\n\n{table}",
        python_smoke::CUDA_BINDINGS
    );
    std::fs::write(out.join("compare.md"), &text).map_err(|e| format!("writing compare.md: {e}"))?;
    println!("{text}");
    Ok(())
}
