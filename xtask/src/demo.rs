//! `cargo xtask demo [ARGS…]` and `cargo xtask probe [NAMES…]`: build the simulator (so that
//! the program has it to fall back on, and the probe something to compare a GPU with), then run
//! the `demo` or `probe` binary of the integration package ([`crate::INTEGRATION`], in `tests/`)
//! with the given arguments and the caller's
//! environment (`CUDA_MEM_DRIVER`, `PROBE_OUT` and the `CUDA_SIM_*` variables included).

use std::path::Path;

use crate::{cargo, run_command};

/// Runs the subcommand: `binary` is `demo` or `probe`.
pub fn run(workspace: &Path, binary: &str, args: &[String]) -> Result<(), String> {
    // Cargo is quiet while it finds nothing to do: say what the first, slow build is.
    println!("building the simulator and the {binary} (on a fresh clone about 35 s on 2 cores, then instant)…");
    run_command(cargo(workspace).args(["build", "-p", "cuda-sim"]))
        .map_err(|e| format!("building the simulator: {e}"))?;
    run_command(cargo(workspace).args(["run", "-p", crate::INTEGRATION, "--bin", binary, "--"]).args(args))
        .map_err(|e| format!("the {binary} failed: {e}"))
}
