//! cuda.core's own `copy_batch` and `CopyOptions` (cuda.core 1.2) on our driver:
//! `tests/python/cuda_core_copy.py` checks what a GPU gives (the bytes of every copy, a
//! `DURING_API_CALL` source reusable as soon as the call returns, cuda.core's refusals, and the
//! driver's own errors for `cuMemcpyBatchAsync` through cuda.bindings). On the simulator it runs
//! twice: as a CUDA 13.0 driver, where `Buffer.copy_to` with options falls back to plain copies,
//! and as a CUDA 13.2 one (`CUDA_SIM_DRIVER_VERSION=13020`), where it goes through
//! `cuMemcpyWithAttributesAsync`.
//!
//! Gated as `python_exchange.rs`: without `CUDA_MEM_PYTHON` (a Python with cuda.core, which
//! `cargo xtask ci` installs and sets) it says SKIP and passes without running.

#[macro_use]
mod common;

use std::process::{Command, Stdio};

use common::python::{PythonProcess, python, use_this_simulator, workspace};

/// Runs the script with `driver_version` as the simulator's reported version (`None`: its
/// default; ignored on a real driver).
fn run(driver_version: Option<&str>) {
    let Some(python) = python() else { return };
    let mut command = Command::new(python);
    command
        .arg(workspace().join("tests/python/cuda_core_copy.py"))
        .env_remove("CUDA_SIM_DRIVER_VERSION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if use_this_simulator(&mut command).is_none() && driver_version.is_some() {
        return; // A real driver reports its own version.
    }
    if let Some(version) = driver_version {
        command.env("CUDA_SIM_DRIVER_VERSION", version);
    }
    let process = PythonProcess::new(command.spawn().expect("the Python process starts"));
    process.wait("cuda-core-copy: ok");
}

#[test]
fn cuda_core_copies_on_a_cuda_13_0_driver() {
    run(None);
}

#[test]
fn cuda_core_copies_on_a_cuda_13_2_driver() {
    run(Some("13020"));
}
