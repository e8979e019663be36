//! `cargo xtask demo [ARGS…]`: builds the simulator (so that the demo has it to fall back on),
//! then runs the `demo` binary of the `tests` crate with the given arguments and the caller's
//! environment (`CUDA_MEM_DRIVER` and the `CUDA_SIM_*` variables included).

use std::path::Path;

use crate::{cargo, run_command};

/// Runs the subcommand.
pub fn run(workspace: &Path, args: &[String]) -> Result<(), String> {
    run_command(cargo(workspace).args(["build", "-p", "cuda-sim"]))
        .map_err(|e| format!("building the simulator: {e}"))?;
    run_command(cargo(workspace).args(["run", "-p", "tests", "--bin", "demo", "--"]).args(args))
        .map_err(|e| format!("the demo failed: {e}"))
}
