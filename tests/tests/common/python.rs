//! Running Python with cuda.core beside a Rust test (`python_exchange.rs`,
//! `dlpack_consumer.rs`): the Python named by [`PYTHON_ENV`], on the simulator this process
//! loads.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::JoinHandle;
use std::time::Duration;

use cuda_mem_integration::child_process::{KillOnDrop, read_in_background};

/// The environment variable naming a Python that has cuda.core.
pub const PYTHON_ENV: &str = "CUDA_MEM_PYTHON";

/// How long a Python process may run.
pub const PYTHON_TIMEOUT: Duration = Duration::from_secs(120);

/// The Python to run, or `None` (said on stderr) when `CUDA_MEM_PYTHON` is not set.
pub fn python() -> Option<PathBuf> {
    let python = std::env::var_os(PYTHON_ENV).map(PathBuf::from);
    if python.is_none() {
        // Straight to the standard error, past the test harness's capture, so that the skip
        // shows in `cargo test`'s output, with the test's name (its thread's), by which `cargo
        // xtask ci` counts it as skipped rather than passed; in one write, so that the line
        // stays whole among the other tests' output.
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let line = format!(
            "SKIP {test}: {PYTHON_ENV} is not set, so the Python side cannot run: `cargo xtask ci` runs these \
             tests with a Python that has cuda.core\n"
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
    python
}

/// The environment variable naming a folder that holds the workspace's Python files in their
/// places (`python/`, `tests/python/`) when the workspace itself is not at hand: the GPU bundle
/// carries them, and its `run.sh` names the copy.
pub const WORKSPACE_ENV: &str = "CUDA_MEM_WORKSPACE";

/// The workspace's root (where this binary was built), or the folder [`WORKSPACE_ENV`] names.
pub fn workspace() -> PathBuf {
    std::env::var_os(WORKSPACE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// On the simulator, makes `command` load the simulator this process uses as its
/// `libcuda.so.1` (a link to it beside the library, made atomically by
/// [`cuda_sim::testing::libcuda_dir`], first in `LD_LIBRARY_PATH`), and returns the link; on a
/// real driver, `None` (the system's `libcuda.so.1`).
pub fn use_this_simulator(command: &mut Command) -> Option<PathBuf> {
    if !cuda_sim::testing::on_simulator() {
        return None;
    }
    let dir = cuda_sim::testing::libcuda_dir().expect("libcuda.so.1 links to the simulator");
    let mut path = std::ffi::OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    command.env("LD_LIBRARY_PATH", path);
    Some(dir.join("libcuda.so.1"))
}

/// A Python process, its output read as it runs; killed, and its output shown, if dropped
/// before [`PythonProcess::wait`] (a failed test).
pub struct PythonProcess {
    child: KillOnDrop,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl PythonProcess {
    pub fn new(child: std::process::Child) -> PythonProcess {
        let mut child = KillOnDrop::new(child);
        let stdout = child.child().stdout.take().map(read_in_background);
        let stderr = child.child().stderr.take().map(read_in_background);
        PythonProcess { child, stdout, stderr }
    }

    fn output(&mut self) -> (String, String) {
        let join = |h: Option<JoinHandle<String>>| h.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        (join(self.stdout.take()), join(self.stderr.take()))
    }

    /// Waits and asserts it exited 0 having printed `marker` (so a script that did not get to
    /// its end never passes).
    pub fn wait(mut self, marker: &str) {
        let status = self.child.wait(PYTHON_TIMEOUT);
        let (stdout, stderr) = self.output();
        let ok = matches!(&status, Ok(status) if status.success());
        assert!(
            ok && stdout.lines().any(|line| line == marker),
            "the Python process failed ({status:?}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        );
        eprintln!("{stdout}");
    }
}

impl Drop for PythonProcess {
    fn drop(&mut self) {
        if self.stdout.is_none() && self.stderr.is_none() {
            return;
        }
        // Not waited for: the test failed. Stop it and show what it said.
        let _ = self.child.child().kill();
        let (stdout, stderr) = self.output();
        eprintln!("the Python process:\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    }
}
