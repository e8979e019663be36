//! cuda.core's own `copy_batch` and `CopyOptions` (cuda.core 1.2) on our driver:
//! `tests/python/cuda_core_copy.py` checks what a GPU gives (the bytes of every copy, a
//! `DURING_API_CALL` source reusable as soon as the call returns, cuda.core's refusals, and the
//! driver's own errors for `cuMemcpyBatchAsync` through cuda.bindings). On the simulator it runs
//! three times: as a CUDA 12.8 driver (`CUDA_SIM_DRIVER_VERSION=12080`), where `copy_batch` falls
//! back to plain copies too; as a CUDA 13.0 one, where `Buffer.copy_to` with options falls back
//! to plain copies and a batch is one `cuMemcpyBatchAsync`; and as a CUDA 13.2 one
//! (`CUDA_SIM_DRIVER_VERSION=13020`), where it goes through `cuMemcpyWithAttributesAsync`. There
//! the script counts the driver calls of each path with the simulator's counters
//! (`CUDA_CORE_COPY_EXPECT_COUNTS=1` makes their absence a failure), so each run shows which
//! path it took.
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
    // The simulator with its controls shown (not a rehearsal's, which hides them) counts calls.
    if cuda_sim::testing::driver().is_ok_and(cuda_sim::testing::is_simulator) {
        command.env("CUDA_CORE_COPY_EXPECT_COUNTS", "1");
    }
    let process = PythonProcess::new(command.spawn().expect("the Python process starts"));
    process.wait("cuda-core-copy: ok");
}

#[test]
fn cuda_core_copies_on_a_cuda_13_0_driver() {
    run(None);
}

#[test]
fn cuda_core_copies_on_a_cuda_12_8_driver() {
    run(Some("12080"));
}

#[test]
fn cuda_core_copies_on_a_cuda_13_2_driver() {
    run(Some("13020"));
}
