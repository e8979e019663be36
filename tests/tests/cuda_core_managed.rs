//! cuda.core's managed memory (cuda.core 1.2) on our driver: `tests/python/cuda_core_managed.py`
//! drives `ManagedMemoryResource`, `ManagedBuffer`'s advice (`read_mostly`,
//! `preferred_location`, `accessed_by`), `prefetch`, `discard`, `discard_prefetch`, the batches
//! of `cuda.core.utils`, `Host()`, `Host(numa_id=...)` and `Host.numa_current()`, and a wrapped
//! `cuMemAllocManaged` pointer, and checks what a GPU gives: the values cuda.core reads back
//! and the driver's own range attributes beside them (through cuda.bindings), cuda.core's
//! refusals and the driver's errors. On the simulator it runs a second time with devices that
//! lack concurrent managed access (`CUDA_SIM_DEVICE_ATTRIBUTES`), where cuda.core warns and the
//! driver refuses devices as locations and the batched calls.
//!
//! Gated as `python_exchange.rs`: without `CUDA_MEM_PYTHON` (a Python with cuda.core, which
//! `cargo xtask ci` installs and sets) it says SKIP and passes without running.

#[macro_use]
mod common;

use std::process::{Command, Stdio};

use common::python::{PythonProcess, python, use_this_simulator, workspace};

/// `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS` reported as 0.
const NO_CONCURRENT_MANAGED_ACCESS: &str = "89=0";

/// Runs the script; with `without_concurrent_access`, on a simulator whose devices lack
/// concurrent managed access (skipped on a real driver, which reports its own).
fn run(without_concurrent_access: bool) {
    let Some(python) = python() else { return };
    let mut command = Command::new(python);
    command
        .arg(workspace().join("tests/python/cuda_core_managed.py"))
        .env_remove("CUDA_SIM_DEVICE_ATTRIBUTES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if use_this_simulator(&mut command).is_none() && without_concurrent_access {
        return;
    }
    if without_concurrent_access {
        command.arg("--no-concurrent-managed-access").env("CUDA_SIM_DEVICE_ATTRIBUTES", NO_CONCURRENT_MANAGED_ACCESS);
    }
    let process = PythonProcess::new(command.spawn().expect("the Python process starts"));
    process.wait("cuda-core-managed: ok");
}

#[test]
fn cuda_core_advises_prefetches_and_discards_managed_memory() {
    run(false);
}

#[test]
fn cuda_core_on_devices_without_concurrent_managed_access() {
    run(true);
}
