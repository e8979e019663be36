//! cuda.core's graphs on our driver: `tests/python/cuda_core_graph.py` captures a graph with
//! cuda.core's `GraphBuilder` (graph memory from `GraphMemoryResource`, a fill of it, a copy out
//! to a `DeviceMemoryResource` buffer, the graph memory freed in the graph), completes it
//! (`cuGraphInstantiateWithParams`, which cuda.core makes hold a user object), launches it twice
//! and checks the bytes, `GraphMemoryResource`'s attributes (`used_mem_*`, `reserved_mem_*`,
//! resetting a high-water mark, refusing a non-zero one), its trim, and its refusal to allocate
//! on a stream that is not capturing.
//!
//! Gated as `python_exchange.rs`: without `CUDA_MEM_PYTHON` (a Python with cuda.core, which
//! `cargo xtask ci` installs and sets) it says SKIP and passes without running.

#[macro_use]
mod common;

use std::process::{Command, Stdio};

use common::python::{PythonProcess, python, use_this_simulator, workspace};

#[test]
fn cuda_core_captures_completes_and_launches_a_graph_with_graph_memory() {
    let Some(python) = python() else { return };
    let mut command = Command::new(python);
    command
        .arg(workspace().join("tests/python/cuda_core_graph.py"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    use_this_simulator(&mut command);
    let process = PythonProcess::new(command.spawn().expect("the Python process starts"));
    process.wait("cuda-core-graph: ok");
}
