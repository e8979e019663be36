//! Case (5): the time from spawning a process to its first driver call returning, as the
//! parent sees it and as the child (`bench --first-call`) sees it from its `main`.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use cuda_mem_core::sys::DRIVER_ENV;

use crate::Error;
use crate::cli::FIRST_CALL_ARG;
use crate::stats::{Stats, elapsed_ns};

/// Timed runs (after 2 warm-up runs).
const FIRST_CALL_RUNS: usize = 20;

/// Spawns `bench --first-call` (2 warm-up runs, then `FIRST_CALL_RUNS`): the parent's time from
/// spawn to the child's line, and the child's own from `main` to the call's return.
pub(crate) fn first_call(driver_path: &Path) -> Result<(Stats, Stats), Error> {
    let exe = std::env::current_exe()?;
    let (mut spawn_to_return, mut main_to_return) = (Vec::new(), Vec::new());
    for run in 0..FIRST_CALL_RUNS + 2 {
        let start = Instant::now();
        let mut child = Command::new(&exe)
            .arg(FIRST_CALL_ARG)
            .env(DRIVER_ENV, driver_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = Vec::new();
        let mut byte = [0u8];
        while stdout.read(&mut byte)? == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let took = elapsed_ns(start);
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("`bench {FIRST_CALL_ARG}` exited with {status}").into());
        }
        let inner: f64 = String::from_utf8(line)?.trim().parse()?;
        if run >= 2 {
            spawn_to_return.push(took);
            main_to_return.push(inner);
        }
    }
    let result = (Stats::of(spawn_to_return), Stats::of(main_to_return));
    println!("  spawn to first call returned {}; main() to returned {}", result.0.show(), result.1.show());
    Ok(result)
}

/// The child of case 5: opens the driver through `cuda_mem_sys::driver()` (`CUDA_MEM_DRIVER`),
/// calls `cuDriverGetVersion`, and prints the nanoseconds since `main` began.
pub(crate) fn first_call_main(started: Instant) -> Result<(), Error> {
    let version = cuda_mem_core::sys::driver()?.version()?;
    let took = elapsed_ns(started);
    std::hint::black_box(version);
    println!("{took:.0}");
    Ok(())
}
