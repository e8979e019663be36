//! `cargo xtask bench --compare`: cuda.core's side of the comparison, run on the same driver in a
//! private virtual environment (`xtask/compare/cuda_core_bench.py`); in a GPU bundle, the same
//! from what [`pack`] put there (`xtask compare-bundle`, run by the bundle's `run.sh`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{create_dir, python_smoke};
use serde_json::Value;

/// The cuda.core release compared against (the one the exchange step installs too).
pub use crate::python_smoke::CUDA_CORE;

/// Where the comparison's pieces are: in the workspace (`cargo xtask bench --compare`), or in a
/// GPU bundle (`cargo xtask gpu-test`), where there is no Rust and no PyPI.
pub struct Setup {
    /// A Python with cuda-core and cuda-bindings.
    python: PathBuf,
    /// `cuda_core_bench.py`.
    script: PathBuf,
    /// The built `raw_pairs.rs`.
    raw_pairs: PathBuf,
    /// A folder whose `libcuda.so.1` is the built `null_driver.rs`.
    null_dir: PathBuf,
    /// Our `bench` binary (release).
    bench: PathBuf,
    /// The folder with our run's `results.json`; `compare.md` is written there.
    results: PathBuf,
    /// A folder whose `libcuda.so.1` is the simulator, for runs on it.
    simulator_dir: Option<PathBuf>,
    /// In a bundle, the temporary folder `simulator_dir` names: removed when the setup is.
    _simulator_temp: Option<tempfile::TempDir>,
}

impl Setup {
    /// In the workspace: a private virtual environment with cuda.core from PyPI, the helper
    /// libraries built with `rustc` under `target/python-smoke/`, our results in `target/bench/`.
    pub fn in_workspace(workspace: &Path) -> Result<Setup, String> {
        let scratch = workspace.join("target/python-smoke");
        let (raw_pairs, null_dir) = (scratch.join("libraw_pairs.so"), scratch.join("libcuda-null"));
        build_helpers(workspace, &raw_pairs, &null_dir)?;
        Ok(Setup {
            python: python_smoke::venv(workspace, &[python_smoke::CUDA_BINDINGS, CUDA_CORE])??,
            script: workspace.join("xtask/compare/cuda_core_bench.py"),
            raw_pairs,
            null_dir,
            bench: workspace.join("target/release/bench"),
            results: workspace.join("target/bench"),
            simulator_dir: python_smoke::simulator_lib_dir(workspace, "release").ok(),
            _simulator_temp: None,
        })
    }

    /// In a GPU bundle, as [`pack`] laid it out under `bundle/compare/`; our results in
    /// `results`. The Python is `CUDA_MEM_COMPARE_PYTHON`, else `python3`, with the packed wheels
    /// on its path (the bundle's `run.sh` installs them and sets `PYTHONPATH`).
    pub fn in_bundle(bundle: &Path, results: &Path) -> Setup {
        let dir = bundle.join("compare");
        let simulator_temp = simulator_link(&bundle.join("libcuda_sim.so")).ok();
        Setup {
            python: std::env::var_os("CUDA_MEM_COMPARE_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from),
            script: dir.join("cuda_core_bench.py"),
            raw_pairs: dir.join("libraw_pairs.so"),
            null_dir: dir.join("null"),
            bench: bundle.join("bench"),
            results: results.to_path_buf(),
            simulator_dir: simulator_temp.as_ref().map(|temp| temp.path().to_path_buf()),
            _simulator_temp: simulator_temp,
        }
    }
}

/// A new temporary folder whose `libcuda.so.1` links to `simulator` (for a bundle run on the
/// simulator, as when it is tried out without a GPU); removed when dropped.
fn simulator_link(simulator: &Path) -> Result<tempfile::TempDir, String> {
    if !simulator.is_file() {
        return Err(format!("{} is missing", simulator.display()));
    }
    let temp = tempfile::Builder::new()
        .prefix("cuda-mem-compare-simulator")
        .tempdir()
        .map_err(|e| format!("creating a temporary folder: {e}"))?;
    python_smoke::libcuda_dir(simulator, temp.path())?;
    Ok(temp)
}

/// Packs what [`Setup::in_bundle`] needs into `dir`: the script, the two helper libraries built
/// here, and wheels of cuda.core and cuda-bindings and of what they import (cuda-pathfinder,
/// numpy) for the GPU machine's Python (3.12, x86-64 Linux), which has no PyPI and, being a bare
/// machine, no numpy either; the wheels go to `dir/wheels`.
pub fn pack(workspace: &Path, dir: &Path) -> Result<(), String> {
    build_helpers(workspace, &dir.join("libraw_pairs.so"), &dir.join("null"))?;
    let script = workspace.join("xtask/compare/cuda_core_bench.py");
    std::fs::copy(&script, dir.join("cuda_core_bench.py")).map_err(|e| format!("copying {}: {e}", script.display()))?;
    let wheels = dir.join("wheels");
    let mut download = Command::new("python3");
    download
        .args(["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:"])
        .args(["--python-version", "3.12", "--implementation", "cp"])
        .args(["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64"])
        .args(["--platform", "manylinux2014_x86_64", "--platform", "any"])
        .arg("-d")
        .arg(&wheels)
        .args([python_smoke::CUDA_BINDINGS, CUDA_CORE, CUDA_PATHFINDER, NUMPY]);
    let status = download.status().map_err(|e| format!("running pip download: {e}"))?;
    if !status.success() {
        return Err(format!("pip download of the wheels failed ({status}); no PyPI here?"));
    }
    Ok(())
}

/// The cuda-pathfinder release packed with cuda.core and cuda-bindings (both ask for at least
/// 1.4.2; this is the one pip installs beside them here).
const CUDA_PATHFINDER: &str = "cuda-pathfinder==1.9.0";

/// The numpy release packed with them: cuda.core asks for numpy, unpinned, and cuda-bindings'
/// NVML module (which `import cuda.core` loads) imports it; without it the comparison stops at
/// its first import (found by running the bundle's comparison with a Python 3.12 that had none).
const NUMPY: &str = "numpy==2.4.6";

/// Which driver a comparison runs on.
enum Driver {
    /// The one our benchmarks chose: the simulator (`simulator: true`) or the real driver.
    OfTheRun { simulator: bool },
    /// The nearly free driver `null_driver.rs`.
    Null,
}

impl Driver {
    /// The folder to put first on `LD_LIBRARY_PATH` so that `libcuda.so.1` is this driver
    /// (`None`: the normal library search finds the real one).
    fn lib_dir<'a>(&self, setup: &'a Setup) -> Result<Option<&'a Path>, String> {
        match self {
            Driver::OfTheRun { simulator: true } => setup
                .simulator_dir
                .as_deref()
                .map(Some)
                .ok_or_else(|| "the results are the simulator's, and the simulator is not at hand".to_string()),
            Driver::OfTheRun { simulator: false } => Ok(None),
            Driver::Null => Ok(Some(&setup.null_dir)),
        }
    }
}

impl Driver {
    /// Whether the driver files a Python process mapped (`drivers`, real paths) are this driver
    /// alone: the stand-in or the simulator that [`Driver::lib_dir`] names; for the driver of
    /// the run, the one our benchmarks were given by path (`named`, `CUDA_MEM_DRIVER` when it
    /// is a path), else one file that is neither of those. Else the figures would be another
    /// driver's (a loader that ignored `LD_LIBRARY_PATH`), and the error says which.
    fn check_loaded(&self, setup: &Setup, named: Option<&Path>, drivers: &[Value]) -> Result<(), String> {
        let loaded: Vec<PathBuf> = drivers.iter().filter_map(Value::as_str).map(PathBuf::from).collect();
        let real_path = |dir: &Path| std::fs::canonicalize(dir.join("libcuda.so.1")).ok();
        let stand_ins: Vec<PathBuf> = [Some(&setup.null_dir), setup.simulator_dir.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|d| real_path(d))
            .collect();
        let ok = match (self.lib_dir(setup)?, named) {
            (Some(dir), _) => real_path(dir).is_some_and(|expected| loaded == [expected]),
            (None, Some(named)) => std::fs::canonicalize(named).is_ok_and(|expected| loaded == [expected]),
            (None, None) => loaded.len() == 1 && !stand_ins.contains(&loaded[0]),
        };
        if ok {
            return Ok(());
        }
        let wanted = match self {
            Driver::OfTheRun { simulator: true } => "the simulator",
            Driver::OfTheRun { simulator: false } => "the real driver alone",
            Driver::Null => "the nearly free driver",
        };
        Err(format!(
            "cuda.core's process was to run on {wanted}, and it loaded {loaded:?}: its figures would be of another driver"
        ))
    }
}

/// Runs cuda.core's benchmarks on `driver`; returns their JSON, once it is known to be of that
/// driver ([`Driver::check_loaded`]).
fn run(setup: &Setup, driver: &Driver, args: &[&str]) -> Result<Value, String> {
    let mut command = Command::new(&setup.python);
    command.arg(&setup.script).args(args).env_remove("CUDA_SIM_DEVICES").env("CUDA_MEM_RAW_PAIRS", &setup.raw_pairs);
    if let Some(dir) = driver.lib_dir(setup)? {
        // First on the path, the rest kept (a GPU machine's other libraries may need it).
        let mut path = std::ffi::OsString::from(dir);
        if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH").filter(|r| !r.is_empty()) {
            path.push(":");
            path.push(rest);
        }
        command.env("LD_LIBRARY_PATH", path);
    }
    let value = crate::parse_json(stdout_of(&mut command, &setup.script.display().to_string())?.trim())?;
    // The driver our benchmarks loaded, where they were given it by path (the bundle's `run.sh`
    // passes its `CUDA_MEM_DRIVER` on to us; a file name is left to the loader).
    let named = std::env::var_os("CUDA_MEM_DRIVER").map(PathBuf::from).filter(|p| p.components().count() > 1);
    driver.check_loaded(setup, named.as_deref(), items(&value, "drivers"))?;
    Ok(value)
}

/// Runs `command` (`what`, for messages) and returns its standard output; a failure, with its
/// standard error, is an error.
fn stdout_of(command: &mut Command, what: &str) -> Result<String, String> {
    let output = command.output().map_err(|e| format!("running {what}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{what} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr)));
    }
    String::from_utf8(output.stdout).map_err(|e| format!("the output of {what} is not UTF-8: {e}"))
}

/// Builds the two helpers of `xtask/compare/`: `raw_pairs.rs` as the library `raw_pairs`, and
/// `null_driver.rs` as `libcuda.so.1` in the folder `null_dir`.
fn build_helpers(workspace: &Path, raw_pairs: &Path, null_dir: &Path) -> Result<(), String> {
    let sources = workspace.join("xtask/compare");
    create_dir(null_dir)?;
    cdylib(&sources.join("raw_pairs.rs"), raw_pairs)?;
    cdylib(&sources.join("null_driver.rs"), &null_dir.join("libcuda.so.1"))
}

/// Compiles `source` alone with `rustc` into the shared library `library`, unless that is
/// newer than the source.
fn cdylib(source: &Path, library: &Path) -> Result<(), String> {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    if modified(library).is_some_and(|built| modified(source).is_some_and(|changed| built >= changed)) {
        return Ok(());
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let status = Command::new(rustc)
        .args(["--edition", "2021", "--crate-type", "cdylib", "-C", "opt-level=3", "-C", "strip=symbols", "-o"])
        .arg(library)
        .arg(source)
        .status()
        .map_err(|e| format!("running rustc for {}: {e}", source.display()))?;
    if !status.success() {
        return Err(format!("rustc could not build {} ({status})", source.display()));
    }
    Ok(())
}

/// The array `key` of an object, empty when it is missing or not an array.
fn items<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value.get(key).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// Whether cuda.core's result `r` is of `case`.
fn is_case(r: &Value, case: &str) -> bool {
    r.get("case").and_then(Value::as_str) == Some(case)
}

/// The median of a `{"median": …}` (ours) or `{"median_ns": …}` (cuda.core's) object.
fn median(value: &Value, key: &str) -> Option<f64> {
    value.get(key).and_then(Value::as_f64)
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
pub fn compare(setup: &Setup) -> Result<(), String> {
    let ours_text = std::fs::read_to_string(setup.results.join("results.json"))
        .map_err(|e| format!("reading results.json in {}: {e}", setup.results.display()))?;
    let ours = crate::parse_json(&ours_text)?;
    let on_simulator = ours.get("simulator").and_then(Value::as_bool).unwrap_or(true);
    let theirs = run(setup, &Driver::OfTheRun { simulator: on_simulator }, &[])?;
    let their_results = items(&theirs, "results");
    let mut vmm = String::new();
    for r in their_results.iter().filter(|r| is_case(r, "vmm_grow_step")) {
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
         Allocate+free pairs on one stream, on one thread, medians per pair. Each API is sampled in turn with \
         the raw driver calls made natively in its own process, on its pool and stream (ours: cuda-mem-sys; \
         cuda.core's: `raw_pairs.rs`, a native loop through the driver's entry points, called from the \
         script), so that an overhead is the API's median minus the raw median measured beside it. Ours \
         twice: `allocate` (a `Buffer`, holding shares of its pool and stream) and `allocate_scoped` (a \
         `ScopedBuffer`, borrowing them). {POOL_ROUNDS} rounds, ours then cuda.core's each time; the table shows \
         the median over the rounds, the ratio of the median overheads, and each round's ratio. The target is \
         ours at most 1/20 (0.05) of cuda.core's. Negative values are noise.\n\n{}\n\
         ### On a nearly free driver\n\n\
         The same rounds on `xtask/compare/null_driver.rs`, a stand-in `libcuda.so.1` whose entry points do next \
         to nothing (a raw pair takes a few nanoseconds), loaded by both sides the way they load the real one: \
         what is left of each API's time is its own code, without the driver's time and its noise, nor the \
         driver's effect on the caches the API's code runs in.\n\n{}\n\
         ## 2. Sharing with a child process\n\n{}\n\
         ## 3. VMM growth\n\n{}\n{vmm}",
        python_smoke::CUDA_BINDINGS,
        pool_table(&pool_rounds(setup, &Driver::OfTheRun { simulator: on_simulator })?) + &additivity(&ours),
        pool_table(&pool_rounds(setup, &Driver::Null)?),
        sharing_tables(&ours, their_results),
        first_grow_table(&ours, their_results),
    );
    std::fs::write(setup.results.join("compare.md"), &text).map_err(|e| format!("writing compare.md: {e}"))?;
    println!("{text}");
    Ok(())
}

/// How many times [`pool_rounds`] runs each side of case (1).
const POOL_ROUNDS: usize = 5;

/// One round of case (1): our `bench --pool-pairs` rows, then cuda.core's `pool_pair` rows.
struct PoolRound {
    ours: Vec<Value>,
    theirs: Vec<Value>,
}

/// Runs case (1) [`POOL_ROUNDS`] times on each side, alternating: the simulator's cost per pair
/// drifts with the machine's load by more than either API's overhead, and one side measured
/// minutes after the other compares the load as much as the APIs.
fn pool_rounds(setup: &Setup, driver: &Driver) -> Result<Vec<PoolRound>, String> {
    (0..POOL_ROUNDS)
        .map(|round| {
            println!("case (1), round {} of {POOL_ROUNDS}: ours, then cuda.core's", round + 1);
            let mut ours = Command::new(&setup.bench);
            ours.arg("--pool-pairs");
            if let Driver::Null = driver {
                ours.env("CUDA_MEM_DRIVER", setup.null_dir.join("libcuda.so.1"));
            }
            let stdout = stdout_of(&mut ours, &format!("{} --pool-pairs", setup.bench.display()))?;
            let last = stdout.lines().last().unwrap_or_default();
            let ours = items(&crate::parse_json(last)?, "pools").to_vec();
            let theirs = items(&run(setup, driver, &["--pool-pairs"])?, "results").to_vec();
            Ok(PoolRound { ours, theirs })
        })
        .collect()
}

/// The median of `values` (NaN for none), the middle two averaged.
fn median_of(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Case (1): allocate+free pairs on one thread, ours against cuda.core's, over the rounds.
fn pool_table(rounds: &[PoolRound]) -> String {
    let mut table = String::from(
        "| size | raw calls, our process | ours: Buffer | ScopedBuffer | our overhead: Buffer, ScopedBuffer | raw calls, cuda.core's process | cuda.core | cuda.core overhead | ours / theirs: Buffer, ScopedBuffer | each round's ours / theirs (Buffer) | raw cuda.bindings (Python, for reference) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    for size in [256.0, 65536.0, 4194304.0] {
        // Per round: our raw, ours, their native raw, cuda.core, cuda.bindings raw, our scoped
        // (medians per pair).
        let per_round: Vec<[f64; 6]> = rounds
            .iter()
            .map(|round| {
                let ours = round.ours.iter().find(|r| r.get("size").and_then(Value::as_f64) == Some(size));
                let of =
                    |key: &str| ours.and_then(|r| r.get(key)).and_then(|v| median(v, "median")).unwrap_or(f64::NAN);
                let theirs = |api: &str| {
                    round
                        .theirs
                        .iter()
                        .find(|r| {
                            is_case(r, "pool_pair")
                                && r.get("size").and_then(Value::as_f64) == Some(size)
                                && r.get("api").and_then(Value::as_str) == Some(api)
                        })
                        .and_then(|r| median(r, "median_ns"))
                        .unwrap_or(f64::NAN)
                };
                [
                    of("raw_per_pair"),
                    of("safe_per_pair"),
                    theirs("native raw"),
                    theirs("cuda.core"),
                    theirs("cuda.bindings raw"),
                    of("scoped_per_pair"),
                ]
            })
            .collect();
        let column = |i: usize| median_of(per_round.iter().map(|r| r[i]).collect());
        // Each overhead is taken from the native raw pair measured in its own process, sampled
        // in turn with it: Python's own raw calls (cuda.bindings) carry interpreter costs that
        // cuda.core's compiled path does not, so they are no floor for it.
        let ours_over = median_of(per_round.iter().map(|r| r[1] - r[0]).collect());
        let scoped_over = median_of(per_round.iter().map(|r| r[5] - r[0]).collect());
        let theirs_over = median_of(per_round.iter().map(|r| r[3] - r[2]).collect());
        let each: Vec<String> = per_round.iter().map(|r| format!("{:.3}", (r[1] - r[0]) / (r[3] - r[2]))).collect();
        table.push_str(&format!(
            "| {size} | {:.0} ns | {:.0} ns | {:.0} ns | {ours_over:.0} ns, {scoped_over:.0} ns | {:.0} ns | {:.0} ns | {theirs_over:.0} ns | {:.3}, {:.3} | {} | {:.0} ns |\n",
            column(0),
            column(1),
            column(5),
            column(2),
            column(3),
            ours_over / theirs_over,
            scoped_over / theirs_over,
            each.join(", "),
            column(4),
        ));
    }
    table
}

/// The additivity check of our run (`results.json`'s `pacing`), as a note under case (1).
fn additivity(ours: &Value) -> String {
    let pacing = ours.get("pacing");
    let number = |key: &str| pacing.and_then(|p| p.get(key)).and_then(Value::as_f64);
    let (Some(hidden), Some(work)) = (number("hidden_ns"), number("work_ns")) else { return String::new() };
    format!(
        "\nAdditivity on this driver (our run's check, BENCHMARKS.md method item 1): raw pairs with {work:.0} ns of \
         the caller's own work after each took {}, the work's time taken off. {}\n",
        paced_difference(hidden),
        hidden_work(hidden, work)
    )
}

/// How long raw pairs with the caller's work took against alone, `hidden` being alone minus
/// with the work (the work's own time taken off): less, more, or the same to the nanosecond.
fn paced_difference(hidden: f64) -> String {
    if hidden >= 0.5 {
        format!("{hidden:.0} ns less than alone")
    } else if hidden <= -0.5 {
        format!("{:.0} ns more than alone", -hidden)
    } else {
        "as long as alone".to_string()
    }
}

/// What [`paced_difference`] means for the overheads: caller work that hides in the driver's
/// time (up to `work`, what was added) hides overheads as small; work that slowed the pairs
/// down hides none, and an overhead may then include that slowing.
fn hidden_work(hidden: f64, work: f64) -> String {
    if hidden >= 0.5 {
        format!(
            "Caller work of up to about {:.0} ns per pair, an API's overhead included, can hide in the driver's time, \
             on either side, so overheads that small are not resolved here.",
            hidden.min(work)
        )
    } else if hidden <= -0.5 {
        format!(
            "None of the caller's work hid in the driver's time: overheads are not understated here, and may include \
             up to about {:.0} ns per pair of the driver slowed by its caller's work.",
            -hidden
        )
    } else {
        "None of the caller's work hid in the driver's time: overheads add to the raw time in full here.".to_string()
    }
}

/// Case (2): sharing buffers with a child, per buffer, ours (`results.json`'s `sharing` rows)
/// against cuda.core's (the script's `sharing` rows, one per batch and path).
fn sharing_tables(ours: &Value, their_results: &[Value]) -> String {
    let theirs: Vec<&Value> = their_results.iter().filter(|r| is_case(r, "sharing")).collect();
    if let Some(error) = theirs.iter().find_map(|r| r.get("error").and_then(Value::as_str)) {
        return format!("cuda.core sharing: failed on this driver: {error}\n");
    }
    let find = |batch: f64, api: &str| {
        theirs.iter().copied().find(|r| {
            r.get("batch").and_then(Value::as_f64) == Some(batch) && r.get("api").and_then(Value::as_str) == Some(api)
        })
    };
    let mut table = String::from(
        "| batch | raw native (cuda-mem-sys) | ours | our cost beyond raw | cuda.core | cuda.core's cost beyond raw | ours / theirs | raw cuda.bindings (Python, for reference) | cuda.core, buffers through Connection.send (for reference) |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut split = String::from(
        "| batch | raw native (cuda-mem-sys) | ours | cuda.core | raw cuda.bindings | cuda.core, Connection.send |\n\
         |---:|---:|---:|---:|---:|---:|\n",
    );
    for row in items(ours, "sharing") {
        let batch = row.get("batch").and_then(Value::as_f64).unwrap_or(f64::NAN);
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
         (`cuMemPoolExportPointer`, 64 bytes per buffer over a socket, `cuMemPoolImportPointer`; cuda-mem-sys, our \
         run), for both APIs: that path is the floor of the driver work both must do; cuda.bindings' raw path adds \
         Python work of its own (a loop, ctypes copies, a wrapper per call), which is no part of cuda.core's \
         compiled import path, so it cannot serve as cuda.core's floor. The last column sends the list with \
         `Connection.send`, whose pickler sends the pool's handle again with every message.\n\n{table}\n\
         Parent + child, medians per buffer:\n\n{split}"
    )
}

/// Case (3) as far as cuda.core 1.2.2 goes: one growth of a fresh buffer from 2 MiB to 4 MiB,
/// ours (`results.json`'s `vmm_first_grow` rows) against cuda.core's `modify_allocation`.
fn first_grow_table(ours: &Value, their_results: &[Value]) -> String {
    let Some(theirs) = their_results.iter().find(|r| is_case(r, "vmm_first_grow")) else {
        return "cuda.core first growth: not measured\n".to_string();
    };
    if let Some(error) = theirs.get("error").and_then(Value::as_str) {
        return format!("cuda.core first growth: failed on this driver: {error}\n");
    }
    let core = Spread::of(Some(theirs), "_ns");
    let count = |key: &str| theirs.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let mut table = String::from(
        "| API | how it grew | per growth | ours / cuda.core |\n\
         |---|---|---:|---:|\n",
    );
    for row in items(ours, "vmm_first_grow") {
        let mode = row.get("mode").and_then(Value::as_str).unwrap_or("?");
        let mine = Spread::of(row.get("per_grow"), "");
        table.push_str(&format!("| ours | {mode} | {} | {:.3} |\n", mine.show(), mine.median / core.median));
    }
    table.push_str(&format!(
        "| cuda.core | moved {:.0} of {:.0} times | {} | |\n",
        count("moved"),
        count("of"),
        core.show()
    ));
    format!(
        "One growth of a fresh buffer from 2 MiB to 4 MiB, repeated; medians (p10–p90). Timed: the growth and \
         the release of the range grown from (ours: `grow` and dropping the old buffer; cuda.core: \
         `modify_allocation`, which frees the old range itself). cuda.core 1.2.2 cannot make the second growth \
         of the series below, and its in-place path is unreachable (it compares the reserved `CUdeviceptr` with \
         an `int`), so it moves every time: compare it with ours forced to move.\n\n{table}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two helpers are built only by `--compare` and `gpu-test`: CI builds them here, so a
    /// change that breaks them fails before a GPU session needs them.
    #[test]
    fn the_helper_libraries_build() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let (raw_pairs, null_dir) = (dir.join("libraw_pairs.so"), dir.join("null"));
        build_helpers(&crate::workspace_root(), &raw_pairs, &null_dir).unwrap();
        for library in [raw_pairs, null_dir.join("libcuda.so.1")] {
            assert!(std::fs::metadata(&library).is_ok_and(|m| m.len() > 0), "{} built nothing", library.display());
        }
    }

    #[test]
    fn the_additivity_note_reads_a_negative_difference_as_slower_pairs() {
        let note = |hidden: f64| additivity(&serde_json::json!({"pacing": {"hidden_ns": hidden, "work_ns": 500}}));
        let hid = note(120.4);
        assert!(hid.contains("took 120 ns less than alone") && hid.contains("up to about 120 ns"), "{hid}");
        let capped = note(900.0);
        assert!(capped.contains("up to about 500 ns"), "no more than the work added: {capped}");
        let slower = note(-85.2);
        assert!(slower.contains("took 85 ns more than alone") && slower.contains("None of the caller's work hid"));
        assert!(
            !slower.contains("-85") && slower.contains("up to about 85 ns per pair of the driver slowed"),
            "{slower}"
        );
        let same = note(0.2);
        assert!(same.contains("took as long as alone") && same.contains("add to the raw time in full"), "{same}");
        assert_eq!(additivity(&serde_json::json!({})), "");
    }

    #[test]
    fn figures_count_only_when_cuda_core_loaded_the_driver_chosen() {
        let temp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(temp.path()).unwrap();
        // The stand-in driver, and the simulator linked as `libcuda.so.1` (as `simulator_link`).
        let null_dir = dir.join("null");
        std::fs::create_dir_all(&null_dir).unwrap();
        std::fs::write(null_dir.join("libcuda.so.1"), b"null").unwrap();
        let simulator = dir.join("libcuda_sim.so");
        std::fs::write(&simulator, b"sim").unwrap();
        let simulator_dir = dir.join("sim");
        std::fs::create_dir_all(&simulator_dir).unwrap();
        std::os::unix::fs::symlink(&simulator, simulator_dir.join("libcuda.so.1")).unwrap();
        let setup = Setup {
            python: PathBuf::from("python3"),
            script: dir.join("script.py"),
            raw_pairs: dir.join("libraw_pairs.so"),
            null_dir: null_dir.clone(),
            bench: dir.join("bench"),
            results: dir.clone(),
            simulator_dir: Some(simulator_dir),
            _simulator_temp: None,
        };
        let null = null_dir.join("libcuda.so.1").display().to_string();
        let sim = simulator.display().to_string();
        let real = "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04".to_string();
        let check_named = |driver: Driver, named: Option<&Path>, loaded: &[&String]| {
            let loaded: Vec<Value> = loaded.iter().map(|p| Value::from(p.as_str())).collect();
            driver.check_loaded(&setup, named, &loaded)
        };
        let check = |driver: Driver, loaded: &[&String]| check_named(driver, None, loaded);
        assert!(check(Driver::Null, &[&null]).is_ok());
        assert!(check(Driver::OfTheRun { simulator: true }, &[&sim]).is_ok());
        assert!(check(Driver::OfTheRun { simulator: false }, &[&real]).is_ok());
        // A driver named by path (a rehearsal names the simulator, as if it were a GPU's): that
        // one, and nothing else.
        let named = setup.simulator_dir.as_ref().unwrap().join("libcuda.so.1");
        assert!(check_named(Driver::OfTheRun { simulator: false }, Some(&named), &[&sim]).is_ok());
        let error = check_named(Driver::OfTheRun { simulator: false }, Some(&named), &[&real]).unwrap_err();
        assert!(error.contains("its figures would be of another driver"), "{error}");
        for (driver, loaded) in [
            (Driver::Null, vec![&real]),
            (Driver::Null, vec![&null, &real]),
            (Driver::Null, vec![]),
            (Driver::OfTheRun { simulator: true }, vec![&null]),
            (Driver::OfTheRun { simulator: false }, vec![&sim]),
            (Driver::OfTheRun { simulator: false }, vec![&null]),
            (Driver::OfTheRun { simulator: false }, vec![]),
        ] {
            let error = check(driver, &loaded).unwrap_err();
            assert!(error.contains("its figures would be of another driver"), "{error}");
        }
    }
}
