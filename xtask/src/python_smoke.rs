//! A CI step: NVIDIA's `cuda-bindings` (the layer under cuda.core), installed from PyPI into a
//! private virtual environment, drives the simulator through the normal library search
//! (`libcuda.so.1` in `LD_LIBRARY_PATH`). It shows that programs other than ours can load the
//! simulator; it is skipped, saying why, where Python or PyPI cannot be had.

use std::path::Path;
use std::process::Command;

/// The cuda-bindings release the step installs.
const CUDA_BINDINGS: &str = "cuda-bindings==13.5.0";

/// Runs the smoke test; `Ok(None)` when it passed, `Ok(Some(reason))` when skipped.
pub fn run(workspace: &Path) -> Result<Option<String>, String> {
    let target = workspace.join("target");
    let venv = target.join("python-smoke");
    let python = venv.join("bin/python");
    if !python.is_file() {
        let created = Command::new("python3").args(["-m", "venv"]).arg(&venv).status();
        if !created.is_ok_and(|s| s.success()) {
            return Ok(Some("python3 -m venv is not available".to_string()));
        }
    }
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", CUDA_BINDINGS])
        .status();
    if !installed.is_ok_and(|s| s.success()) {
        return Ok(Some(format!("pip could not install {CUDA_BINDINGS} (no network access to PyPI?)")));
    }
    let library = target.join("debug/libcuda_sim.so");
    if !library.is_file() {
        return Err(format!("{} is missing: build cuda-sim first", library.display()));
    }
    let lib_dir = venv.join("libcuda");
    std::fs::create_dir_all(&lib_dir).map_err(|e| format!("creating {}: {e}", lib_dir.display()))?;
    let link = lib_dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&library, &link).map_err(|e| format!("linking {}: {e}", link.display()))?;
    let script = workspace.join("tests/python/cuda_bindings_smoke.py");
    let status = Command::new(&python)
        .arg(&script)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env_remove("CUDA_SIM_DEVICES")
        .status()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if status.success() { Ok(None) } else { Err(format!("{} failed ({status})", script.display())) }
}
