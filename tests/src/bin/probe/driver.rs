//! Which driver the probes ask (chosen as the demo chooses, `cuda_mem_integration::driver_choice`, and installed
//! as the process-wide driver that `cuda_mem_sys::driver()` returns), and what the report says
//! about it.

use std::path::PathBuf;

use cuda_mem_integration::driver_choice::How;
use cuda_mem_sys::{DRIVER_ENV, install_driver};
use serde_json::{Value, json};

use crate::Error;
use crate::raw::{device_count, device_name};

/// The simulator's device count variable (read at its first `cuInit`).
pub(crate) const SIM_DEVICES_ENV: &str = "CUDA_SIM_DEVICES";

/// The environment variables that change the simulator's answers, shown in the report.
const SIMULATOR_SETTINGS: [&str; 10] = [
    SIM_DEVICES_ENV,
    "CUDA_SIM_DRIVER_VERSION",
    "CUDA_SIM_POOL_IMPORT",
    "CUDA_SIM_POOL_HANDLES",
    "CUDA_SIM_ADDRESS_HINTS",
    "CUDA_SIM_PEER_ACCESS",
    "CUDA_SIM_MEMORY",
    "CUDA_SIM_FAIL",
    "CUDA_SIM_IMEX_CHANNEL",
    "CUDA_VISIBLE_DEVICES",
];

/// Two simulated devices unless `CUDA_SIM_DEVICES` says otherwise, so that the questions about
/// other devices and peers have one to ask about (a real driver ignores the variable). Called
/// first thing in `main`, before any driver is loaded.
pub(crate) fn default_simulated_devices() {
    if std::env::var_os(SIM_DEVICES_ENV).is_none() {
        // SAFETY: this runs first in `main`, before the process has started a thread or loaded
        // a library that could read or write the environment concurrently.
        unsafe { std::env::set_var(SIM_DEVICES_ENV, "2") };
    }
}

/// The driver the probes run on.
pub(crate) struct Chosen {
    /// Where it was loaded from (the child processes load the same library).
    pub(crate) path: PathBuf,
    /// Whether it is the `cuda-sim` simulator.
    pub(crate) simulator: bool,
}

/// Picks the driver (`CUDA_MEM_DRIVER`, else `libcuda.so.1` when it sees a device, else the
/// simulator), installs it as the process-wide one and says which it is.
pub(crate) fn choose() -> Result<Chosen, Error> {
    let choice =
        cuda_mem_integration::driver_choice::choose("probe", "`cargo xtask probe` (it builds cuda-sim first)")?;
    let simulator = choice.is_simulator();
    let path = choice.driver.path().to_path_buf();
    let what = if simulator { "the cuda-sim SIMULATOR" } else { "a CUDA driver" };
    match &choice.how {
        How::Named => println!("driver: {} ({what}, named by {DRIVER_ENV})", path.display()),
        How::Real { devices } => println!("driver: {} ({what}, which sees {devices} device(s))", path.display()),
        How::NoGpu { why_not_real } => {
            println!("driver: {} ({what}: no GPU found: {why_not_real})", path.display());
        }
    }
    install_driver(choice.driver).map_err(|_| "a process-wide driver was already installed")?;
    Ok(Chosen { path, simulator })
}

/// What the report says about the driver.
pub(crate) struct DriverInfo {
    /// Where it was loaded from.
    pub(crate) path: PathBuf,
    /// Whether it is the simulator.
    pub(crate) simulator: bool,
    /// `cuDriverGetVersion`, or why it is unknown.
    pub(crate) version: String,
    /// Each device's name, in ordinal order.
    pub(crate) devices: Vec<String>,
    /// The simulator's settings from the environment (those set).
    pub(crate) settings: Vec<(&'static str, String)>,
}

impl DriverInfo {
    /// Asks the installed driver (after `cuInit`).
    pub(crate) fn read(chosen: &Chosen) -> DriverInfo {
        let version = match cuda_mem_sys::driver().map_err(Error::from).and_then(|d| d.version().map_err(Error::from)) {
            Ok(v) => format!("{}.{}", v / 1000, (v % 1000) / 10),
            Err(e) => format!("unknown ({e})"),
        };
        let devices = match device_count() {
            Ok(count) => (0..count).map(|i| device_name(i).unwrap_or_else(|e| format!("unnamed ({e})"))).collect(),
            Err(_) => Vec::new(),
        };
        let settings =
            SIMULATOR_SETTINGS.iter().filter_map(|&name| std::env::var(name).ok().map(|value| (name, value))).collect();
        DriverInfo { path: chosen.path.clone(), simulator: chosen.simulator, version, devices, settings }
    }

    /// Prints what the first lines of output say about the driver.
    pub(crate) fn print(&self) {
        println!("CUDA version (cuDriverGetVersion): {}", self.version);
        for (ordinal, name) in self.devices.iter().enumerate() {
            println!("device {ordinal}: {name}");
        }
        if self.simulator {
            let settings: Vec<String> = self.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
            println!(
                "simulator settings: {}",
                if settings.is_empty() { "defaults".to_string() } else { settings.join(" ") }
            );
        }
    }

    /// The driver as a JSON object.
    pub(crate) fn json(&self) -> Value {
        let settings: serde_json::Map<String, Value> =
            self.settings.iter().map(|(k, v)| ((*k).to_string(), Value::from(v.as_str()))).collect();
        json!({
            "path": self.path.display().to_string(),
            "simulator": self.simulator,
            "cuda_version": self.version,
            "devices": self.devices,
            "settings": settings,
        })
    }
}
