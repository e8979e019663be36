//! Which driver a program of this crate (the demo, the benchmarks) runs on: the library
//! `CUDA_MEM_DRIVER` names; else the real driver (`libcuda.so.1`) when it sees a device; else the
//! `cuda-sim` simulator found beside the program.

use std::path::PathBuf;

use cuda_mem_sys::{DEFAULT_LIBRARY, DRIVER_ENV, Driver, cu_call};

/// Any failure while choosing.
pub type Error = Box<dyn std::error::Error>;

/// How the driver was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// `CUDA_MEM_DRIVER` named it.
    Named,
    /// The real driver, which sees this many devices.
    Real {
        /// The devices it reports.
        devices: i32,
    },
    /// The simulator, because the real driver could not be used (the reason).
    NoGpu {
        /// Why the real driver was not used.
        why_not_real: String,
    },
}

/// A driver, opened (not yet installed), and how it was chosen.
#[derive(Debug)]
pub struct Choice {
    /// The opened library.
    pub driver: Driver,
    /// How it was chosen.
    pub how: How,
}

impl Choice {
    /// Whether the chosen driver is the `cuda-sim` simulator (one whose controls are hidden,
    /// `CUDA_SIM_HIDE_CONTROLS=1`, counts as a real driver).
    pub fn is_simulator(&self) -> bool {
        cuda_sim::testing::is_simulator(&self.driver)
    }
}

/// Picks the driver: `CUDA_MEM_DRIVER`, else the real driver when it sees a device, else the
/// simulator. `program` names the caller in messages (`demo`, `bench`); `build_hint` says how
/// to get the simulator built.
///
/// # Errors
/// When the named library cannot be opened, or there is no GPU and no simulator.
pub fn choose(program: &str, build_hint: &str) -> Result<Choice, Error> {
    if let Some(path) = std::env::var_os(DRIVER_ENV) {
        let path = PathBuf::from(path);
        // SAFETY: `CUDA_MEM_DRIVER` names the driver library for this process, as the
        // environment names libraries to the dynamic linker (`cuda_mem_sys::driver()` trusts it the
        // same way).
        let driver = unsafe { Driver::open(&path) }.map_err(|e| {
            format!(
                "{e}; unset {DRIVER_ENV} to let the {program} choose (the real driver when it sees a GPU, else the \
                 simulator)"
            )
        })?;
        return Ok(Choice { driver, how: How::Named });
    }
    match probe_real_driver() {
        Ok((driver, devices)) => Ok(Choice { driver, how: How::Real { devices } }),
        Err(why_not_real) => {
            let path = simulator_path().ok_or_else(|| {
                format!(
                    "no GPU found ({DEFAULT_LIBRARY}: {why_not_real}) and the simulator library was not found: run \
                     {build_hint} or `cargo build -p cuda-sim`, or set CUDA_SIM_LIB to the path of libcuda_sim.so"
                )
            })?;
            // SAFETY: the library is the workspace's simulator (`cuda_sim::testing` finds the same
            // file), which implements each driver function it exports as `cuda.h` documents.
            let driver = unsafe { Driver::open(&path) }?;
            Ok(Choice { driver, how: How::NoGpu { why_not_real: why_not_real.to_string() } })
        }
    }
}

/// Opens the real driver and checks that it sees at least one device.
fn probe_real_driver() -> Result<(Driver, i32), Error> {
    // SAFETY: the driver's runtime soname, found by the dynamic loader's search as for any
    // library the program links: the NVIDIA driver.
    let driver = unsafe { Driver::open(DEFAULT_LIBRARY) }?;
    // SAFETY: cuInit takes no pointers; flags must be 0.
    unsafe { cu_call!(&driver, cuInit(0)) }?;
    let mut count = 0;
    // SAFETY: `count` is a valid, writable int for the duration of the call.
    unsafe { cu_call!(&driver, cuDeviceGetCount(&mut count)) }?;
    if count > 0 { Ok((driver, count)) } else { Err("the driver reports no devices".into()) }
}

/// The simulator library: where `cuda_sim::testing` finds it, or in `deps/` beside this program
/// (where cargo builds it as a dependency).
pub fn simulator_path() -> Option<PathBuf> {
    cuda_sim::testing::library_path().or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let candidate = exe.parent()?.join("deps").join(cuda_sim::testing::LIBRARY_NAME);
        candidate.is_file().then_some(candidate)
    })
}
