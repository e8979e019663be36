//! CI steps with Python: NVIDIA's `cuda-bindings` (the layer under cuda.core), installed from PyPI
//! into a private virtual environment, drives the simulator through the normal library search
//! (`libcuda.so.1` in `LD_LIBRARY_PATH`), which shows that programs other than ours can load the
//! simulator; and cuda.core, installed beside it, shares pools and buffers with Rust processes
//! through `python/cuda_mem_exchange.py` ([`exchange_test`]), installed as users install it (the
//! package `python/`, with its `cuda` extra). Both are skipped, saying why, where Python or PyPI
//! cannot be had.

use std::path::Path;
use std::process::Command;

/// The cuda-bindings release the steps install.
pub const CUDA_BINDINGS: &str = "cuda-bindings==13.5.0";

/// The cuda.core release the exchange step and the benchmark comparison install: the newest on
/// PyPI that works with [`CUDA_BINDINGS`] (1.2.2 is the newest release as of this pin).
pub const CUDA_CORE: &str = "cuda-core==1.2.2";

/// The environment variable that gives `tests/tests/python_exchange.rs`,
/// `tests/tests/dlpack_consumer.rs`, `tests/tests/cuda_core_copy.rs`,
/// `tests/tests/cuda_core_graph.rs` and `tests/tests/cuda_core_managed.rs` their Python (one with
/// cuda.core); without it those tests say SKIP and do not run.
pub const PYTHON_ENV: &str = "CUDA_MEM_PYTHON";

/// The integration package's test targets that need [`PYTHON_ENV`]; each must run and pass.
pub const PYTHON_TEST_TARGETS: &[&str] =
    &["python_exchange", "dlpack_consumer", "cuda_core_copy", "cuda_core_graph", "cuda_core_managed"];

/// The `cargo test` that runs the exchange between Rust and Python (cuda.core) processes,
/// DLPack between cuda-mem-core and cuda.core in one process, and cuda.core's `copy_batch`,
/// `CopyOptions`, graphs and managed memory, on the simulator, with [`PYTHON_ENV`] naming a Python with
/// cuda.core; `Ok(Err(reason))` when Python or PyPI cannot be had.
///
/// The Python gets the package `python/` (`pip install ./python[cuda]`, beside the releases pinned
/// here), and the installed module must import from outside the workspace.
pub fn exchange_test(workspace: &Path) -> Result<Result<Command, String>, String> {
    let package = format!("{}[cuda]", workspace.join("python").display());
    let python = match venv(workspace, &[&package, CUDA_BINDINGS, CUDA_CORE])? {
        Ok(python) => python,
        Err(reason) => return Ok(Err(reason)),
    };
    let imported = Command::new(&python)
        .args(["-c", "import cuda_mem_exchange"])
        .current_dir(workspace.join("target"))
        .status()
        .map_err(|e| format!("running {}: {e}", python.display()))?;
    if !imported.success() {
        return Err(format!("the installed package does not import cuda_mem_exchange ({imported})"));
    }
    let mut command = crate::cargo(workspace);
    command.args(["test", "-p", crate::INTEGRATION]);
    for target in PYTHON_TEST_TARGETS {
        command.args(["--test", target]);
    }
    command.env(PYTHON_ENV, python);
    Ok(Ok(command))
}

/// A private virtual environment under `target/` with `packages` installed; `Ok(Err(reason))`
/// when Python or PyPI cannot be had.
pub fn venv(workspace: &Path, packages: &[&str]) -> Result<Result<std::path::PathBuf, String>, String> {
    let venv = workspace.join("target/python-smoke");
    let python = venv.join("bin/python");
    if !python.is_file() {
        println!("creating a Python virtual environment in {}…", venv.display());
        let created = Command::new("python3").args(["-m", "venv"]).arg(&venv).status();
        if !created.is_ok_and(|s| s.success()) {
            return Ok(Err("python3 -m venv is not available".to_string()));
        }
    }
    // Quick when they are there already; the first time, pip downloads them from PyPI.
    println!("pip: installing {} into {} (the first time, a download from PyPI)…", packages.join(" "), venv.display());
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(packages)
        .status();
    if !installed.is_ok_and(|s| s.success()) {
        return Ok(Err(format!("pip could not install {} (no network access to PyPI?)", packages.join(" "))));
    }
    Ok(Ok(python))
}

/// A folder where `libcuda.so.1` is the simulator built in `target/<profile>`, for
/// `LD_LIBRARY_PATH`.
pub fn simulator_lib_dir(workspace: &Path, profile: &str) -> Result<std::path::PathBuf, String> {
    let library = workspace.join("target").join(profile).join("libcuda_sim.so");
    if !library.is_file() {
        return Err(format!("{} is missing: build cuda-sim first", library.display()));
    }
    libcuda_dir(&library, &workspace.join("target/python-smoke").join(format!("libcuda-{profile}")))
}

/// Makes `dir` a folder whose `libcuda.so.1` links to `library`, for `LD_LIBRARY_PATH`; returns
/// `dir`.
pub fn libcuda_dir(library: &Path, dir: &Path) -> Result<std::path::PathBuf, String> {
    crate::create_dir(dir)?;
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(library, &link).map_err(|e| format!("linking {}: {e}", link.display()))?;
    Ok(dir.to_path_buf())
}

/// Runs the smoke test; `Ok(None)` when it passed, `Ok(Some(reason))` when skipped.
pub fn run(workspace: &Path) -> Result<Option<String>, String> {
    let python = match venv(workspace, &[CUDA_BINDINGS])? {
        Ok(python) => python,
        Err(reason) => return Ok(Some(reason)),
    };
    let lib_dir = simulator_lib_dir(workspace, "debug")?;
    let script = workspace.join("tests/python/cuda_bindings_smoke.py");
    let status = Command::new(&python)
        .arg(&script)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env_remove("CUDA_SIM_DEVICES")
        .status()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if status.success() { Ok(None) } else { Err(format!("{} failed ({status})", script.display())) }
}
