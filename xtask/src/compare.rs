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

/// A median with its p10 and p90, in nanoseconds.
#[derive(Clone, Copy)]
struct Spread {
    median: f64,
    p10: f64,
    p90: f64,
}

impl Spread {
    /// Reads `{"median", "p10", "p90"}` (ours) or, with `suffix` `"_ns"`, cuda.core's
    /// `{"median_ns", "p10_ns", "p90_ns"}`; NaN where a number is missing.
    fn of(value: Option<&Value>, suffix: &str) -> Spread {
        let at = |key: &str| value.and_then(|v| median(v, &format!("{key}{suffix}"))).unwrap_or(f64::NAN);
        Spread { median: at("median"), p10: at("p10"), p90: at("p90") }
    }

    /// `median ns (p10–p90)`.
    fn show(self) -> String {
        format!("{:.0} ns ({:.0}–{:.0})", self.median, self.p10, self.p90)
    }
}

/// Runs cuda.core's side on the driver our benchmarks used, then writes and prints the tables.
pub fn compare(workspace: &Path) -> Result<(), String> {
    let out = workspace.join("target/bench");
    let ours_text =
        std::fs::read_to_string(out.join("results.json")).map_err(|e| format!("reading results.json: {e}"))?;
    let ours = json::parse(&ours_text)?;
    let on_simulator = ours.get("simulator").and_then(Value::as_bool).unwrap_or(true);
    let theirs_text = run(workspace, on_simulator, false)?;
    let theirs = json::parse(theirs_text.trim())?;
    let their_results = theirs.get("results").and_then(Value::as_array).unwrap_or_default();
    let mut vmm = String::new();
    for r in their_results.iter().filter(|r| r.get("case").and_then(Value::as_str) == Some("vmm_grow_step")) {
        match (r.get("error").and_then(Value::as_str), median(r, "median_ns")) {
            (Some(error), _) => vmm.push_str(&format!("cuda.core VMM grow: failed on this driver: {error}\n")),
            (None, Some(m)) => vmm.push_str(&format!("cuda.core VMM grow: {m:.0} ns per 2 MiB step (median)\n")),
            _ => {}
        }
    }
    let driver = if on_simulator { "the cuda-sim simulator" } else { "the real driver" };
    let text = format!(
        "# cuda-mem against cuda.core ({CUDA_CORE}, {}), on {driver}\n\n\
         ## 1. Pool allocate+free pairs\n\n\
         Allocate+free pairs on one stream, medians. Overhead = the API's time per pair minus the raw driver \
         calls' time (cuda-sys, native) in the same run, on the same driver; the target is ours at most 1/20 of \
         cuda.core's. Negative values are noise.\n\n{}\n\
         ## 2. Sharing with a child process\n\n{}\n\
         ## 3. VMM growth\n\n{vmm}",
        python_smoke::CUDA_BINDINGS,
        pool_table(&ours, their_results),
        sharing_tables(&ours, their_results),
    );
    std::fs::write(out.join("compare.md"), &text).map_err(|e| format!("writing compare.md: {e}"))?;
    println!("{text}");
    Ok(())
}

/// Case (1): allocate+free pairs on one thread, ours against cuda.core's.
fn pool_table(ours: &Value, their_results: &[Value]) -> String {
    let mut table = String::from(
        "| size | raw driver calls (cuda-sys) | ours: safe | our overhead | cuda.core | cuda.core overhead | ours / theirs | raw cuda.bindings (Python, for reference) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
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
    table
}

/// Case (2): sharing buffers with a child, per buffer, ours (`results.json`'s `sharing` rows)
/// against cuda.core's (the script's `sharing` rows, one per batch and path).
fn sharing_tables(ours: &Value, their_results: &[Value]) -> String {
    let theirs: Vec<&Value> =
        their_results.iter().filter(|r| r.get("case").and_then(Value::as_str) == Some("sharing")).collect();
    if let Some(error) = theirs.iter().find_map(|r| r.get("error").and_then(Value::as_str)) {
        return format!("cuda.core sharing: failed on this driver: {error}\n");
    }
    let find = |batch: f64, api: &str| {
        theirs.iter().copied().find(|r| {
            r.get("batch").and_then(Value::as_number) == Some(batch)
                && r.get("api").and_then(Value::as_str) == Some(api)
        })
    };
    let mut table = String::from(
        "| batch | raw native (cuda-sys) | ours | our cost beyond raw | cuda.core | cuda.core's cost beyond raw | ours / theirs | raw cuda.bindings (Python, for reference) | cuda.core, buffers through Connection.send (for reference) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut split = String::from(
        "| batch | raw native (cuda-sys) | ours | cuda.core | raw cuda.bindings | cuda.core, Connection.send |\n\
         |---:|---:|---:|---:|---:|---:|\n",
    );
    for row in ours.get("sharing").and_then(Value::as_array).unwrap_or_default() {
        let batch = row.get("batch").and_then(Value::as_number).unwrap_or(f64::NAN);
        let per_buffer = row.get("per_buffer");
        let ours_side = |key: &str| Spread::of(per_buffer.and_then(|p| p.get(key)), "");
        let (mine, raw) = (ours_side("ours"), ours_side("raw"));
        let (core, core_send, core_raw) =
            (find(batch, "cuda.core"), find(batch, "cuda.core Connection.send"), find(batch, "cuda.bindings raw"));
        let theirs_total = |r: Option<&Value>| Spread::of(r, "_ns");
        let core_total = theirs_total(core);
        // Both costs are taken beyond the same native raw path (the two driver calls per buffer
        // and one socket message, in our run): cuda.bindings' raw path is no floor for
        // cuda.core, its Python work per buffer (a loop, ctypes copies, a wrapper per call) is
        // other work than cuda.core's compiled import path.
        let (ours_over, theirs_over) = (mine.median - raw.median, core_total.median - raw.median);
        let ratio = if theirs_over > 0.0 { format!("{:.3}", ours_over / theirs_over) } else { "n/a".to_string() };
        table.push_str(&format!(
            "| {batch} | {} | {} | {ours_over:.0} ns | {} | {theirs_over:.0} ns | {ratio} | {} | {} |\n",
            raw.show(),
            mine.show(),
            core_total.show(),
            theirs_total(core_raw).show(),
            theirs_total(core_send).show(),
        ));
        let ours_split = |side: &str| {
            let (parent, child) = (ours_side(&format!("{side}_parent")), ours_side(&format!("{side}_child")));
            format!("{:.0} + {:.0} ns", parent.median, child.median)
        };
        let theirs_split = |r: Option<&Value>| {
            let (parent, child) =
                (Spread::of(r.and_then(|r| r.get("parent")), "_ns"), Spread::of(r.and_then(|r| r.get("child")), "_ns"));
            format!("{:.0} + {:.0} ns", parent.median, child.median)
        };
        split.push_str(&format!(
            "| {batch} | {} | {} | {} | {} | {} |\n",
            ours_split("raw"),
            ours_split("ours"),
            theirs_split(core),
            theirs_split(core_raw),
            theirs_split(core_send),
        ));
    }
    format!(
        "Per buffer of 64 KiB: (the parent's export+encode+send + the child's recv+decode+import) / batch, per \
         repetition; medians (p10–p90). The pool went to the child once, before. cuda.core: the memory resource \
         sent once through a multiprocessing Connection (its reducer sends the pool's handle), then per batch the \
         list of Buffers pickled and sent with `Connection.send_bytes`, unpickled by the spawned child (a registry \
         lookup, then one import per buffer); cuda.core caches each buffer's export, so after the warm-up its \
         parent makes no driver call. Cost beyond raw = the API's median minus the median of the native raw path \
         (`cuMemPoolExportPointer`, 64 bytes per buffer over a socket, `cuMemPoolImportPointer`; cuda-sys, our \
         run), for both APIs: that path is the floor of the driver work both must do; cuda.bindings' raw path adds \
         Python work of its own (a loop, ctypes copies, a wrapper per call), which is no part of cuda.core's \
         compiled import path, so it cannot serve as cuda.core's floor. The last column sends the list with \
         `Connection.send`, whose pickler sends the pool's handle again with every message.\n\n{table}\n\
         Parent + child, medians per buffer:\n\n{split}"
    )
}
