//! Step 1, the driver: which library the demo runs on (`cuda_mem_integration::driver_choice`), installed as the
//! process-wide driver and said in the first lines of output; on the simulator, two devices
//! unless the environment says otherwise.

use std::path::PathBuf;

use cuda_mem_core::sys::{DEFAULT_LIBRARY, DRIVER_ENV};
use cuda_mem_integration::driver_choice::How;

use crate::Error;

/// The simulator's device count variable (read at its first `cuInit`).
pub(crate) const SIM_DEVICES_ENV: &str = "CUDA_SIM_DEVICES";

/// Asks for two simulated devices, so that the peer-access step has a peer, unless
/// `CUDA_SIM_DEVICES` is set already (the user's choice stands). The simulator reads it at its
/// first `cuInit`, so this runs before any driver is loaded; a real driver ignores it. Returns
/// whether it set it.
pub(crate) fn default_simulated_devices() -> bool {
    if std::env::var_os(SIM_DEVICES_ENV).is_some() {
        return false;
    }
    // SAFETY: this runs first thing in `main`, before the process has started any thread or
    // loaded any library that could read or write the environment concurrently.
    unsafe { std::env::set_var(SIM_DEVICES_ENV, "2") };
    true
}

/// The driver chosen and installed as the process-wide one.
pub(crate) struct ChosenDriver {
    /// Where it was loaded from (the child loads the same library).
    pub(crate) path: PathBuf,
    /// Whether it is the `cuda-sim` simulator.
    pub(crate) simulator: bool,
}

/// Picks the driver, installs it as the process-wide one, and prints, as the first line of
/// output, which one it is.
pub(crate) fn choose_driver(devices_defaulted: bool) -> Result<ChosenDriver, Error> {
    let choice = cuda_mem_integration::driver_choice::choose("demo", "`cargo xtask demo` (it builds cuda-sim first)")?;
    let simulator = choice.is_simulator();
    match &choice.how {
        How::Named => {
            println!("driver: {} (named by {DRIVER_ENV})", choice.driver.path().display());
            if simulator {
                println!("  it is the cuda-sim SIMULATOR");
            }
        }
        How::Real { devices } => {
            println!("driver: the CUDA driver {DEFAULT_LIBRARY}, which sees {devices} device(s)");
        }
        How::NoGpu { why_not_real } => {
            println!(
                "driver: no GPU found, so this runs on the cuda-sim SIMULATOR at {}",
                choice.driver.path().display()
            );
            println!("  ({DEFAULT_LIBRARY}: {why_not_real}; set {DRIVER_ENV} to choose a driver library)");
        }
    }
    if simulator {
        if devices_defaulted {
            println!(
                "  simulating 2 devices: {SIM_DEVICES_ENV} was unset, so the demo set it to 2 before the first cuInit, \
                 for the peer-access step"
            );
        } else {
            let count = std::env::var(SIM_DEVICES_ENV).unwrap_or_default();
            println!("  simulating {SIM_DEVICES_ENV}={count} device(s), as the environment says");
        }
    }
    let path = choice.driver.path().to_path_buf();
    cuda_mem_core::sys::install_driver(choice.driver).map_err(|_| "a process-wide driver was already installed")?;
    Ok(ChosenDriver { path, simulator })
}
