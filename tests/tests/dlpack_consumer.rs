//! DLPack against a real consumer and producer: cuda.core, in one Python process with
//! cuda-mem-core (the `dlpack_ffi` example, a C library loaded with `ctypes`), both on one
//! simulator. `tests/python/dlpack_consumer.py` hands a tensor exported by
//! `Buffer::into_dlpack` to cuda.core's `StridedMemoryView` (pointer, shape, dtype, device, the
//! elements read through cuda.bindings, the deleter called once on release), and a cuda.core
//! `Buffer`'s `__dlpack__` tensor to `DlpackImport::from_raw` (the bytes read back, cuda.core's
//! deleter called once when the import is dropped).
//!
//! Gated as `python_exchange.rs`: without `CUDA_MEM_PYTHON` (a Python with cuda.core, which
//! `cargo xtask ci` installs and sets) it says SKIP and passes without running.

#[macro_use]
mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::python::{PythonProcess, python, use_this_simulator, workspace};

/// The environment variable naming a `dlpack_ffi` library built beforehand, for a machine
/// without cargo: the GPU bundle carries one (built with the test binaries), and its `run.sh`
/// names it.
const FFI_LIBRARY_ENV: &str = "CUDA_MEM_DLPACK_FFI";

/// Builds the `dlpack_ffi` example (a `cdylib`) into this test's target folder and profile,
/// and returns the library's path: built here so that the test never loads a stale one. Where
/// [`FFI_LIBRARY_ENV`] names one, that one.
fn ffi_library() -> PathBuf {
    if let Some(library) = std::env::var_os(FFI_LIBRARY_ENV) {
        return PathBuf::from(library);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // `<target>/<profile folder>/deps/<test binary>`.
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("the profile folder");
    let target_dir = profile_dir.parent().expect("the target folder");
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => "dev",
        Some(name) => name,
    };
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", env!("CARGO_PKG_NAME"), "--example", "dlpack_ffi", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(workspace())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the dlpack_ffi example failed ({status})");
    profile_dir.join("examples/libdlpack_ffi.so")
}

#[test]
fn cuda_core_consumes_and_produces_dlpack_tensors() {
    let Some(python) = python() else { return };
    let library = ffi_library();
    let mut command = Command::new(python);
    command
        .arg(workspace().join("tests/python/dlpack_consumer.py"))
        .arg(&library)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Our driver is the library cuda.bindings loads: the simulator's link, or on a GPU
    // machine whatever this process was given (`CUDA_MEM_DRIVER`, else `libcuda.so.1`).
    if let Some(link) = use_this_simulator(&mut command) {
        command.env(cuda_mem_sys::DRIVER_ENV, link);
    }
    let process = PythonProcess::new(command.spawn().expect("the Python process starts"));
    process.wait("dlpack-consumer: ok");
}
