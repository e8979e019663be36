//! The channel layer of `python/cuda_mem_exchange.py` on its own: `tests/python/test_channel.py`
//! (`unittest`, socket pairs and small Python subprocesses, no GPU and no cuda.core) checks that
//! the Python end behaves as cuda-mem-ipc's `Channel` and `spawn_with_channel` do: received
//! descriptors close-on-exec, a frame whose descriptors this process has no numbers for dropped
//! whole with the channel still in step, a reset after the peer's last frame an end of stream, a
//! receive time-out that bounds the whole message, the channel taken from the environment once,
//! the child's descriptor above 2, an explicit environment kept, sends without `SIGPIPE`, and
//! buffers all checked before any pool is sent.
//!
//! It needs only a Python 3 (`python3` on the `PATH`), so it runs with every `cargo test`;
//! without one it says SKIP on stderr and passes without running.

mod common;

use std::process::{Command, Stdio};

use common::python::{PythonProcess, workspace};

#[test]
fn python_channel_layer() {
    let script = workspace().join("tests/python/test_channel.py");
    let mut command = Command::new("python3");
    command
        .arg(&script)
        .current_dir(workspace())
        .env_remove(cuda_mem_ipc::CHANNEL_FD_ENV)
        .env_remove(cuda_mem_ipc::CHANNEL_INODE_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Straight to the standard error, past the test harness's capture, with the test's
            // name (its thread's), by which `cargo xtask ci` counts it as skipped; in one write,
            // so that the line stays whole.
            use std::io::Write;
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let line = format!("SKIP {test}: no python3 on the PATH, so {} cannot run\n", script.display());
            let _ = std::io::stderr().write_all(line.as_bytes());
            return;
        }
        Err(e) => panic!("starting python3 {}: {e}", script.display()),
    };
    PythonProcess::new(child).wait("test_channel: ok");
}
