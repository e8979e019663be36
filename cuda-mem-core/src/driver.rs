//! The process-wide driver, initialized once, and whether it has a capability
//! ([`DriverCapability::require`]).

use std::sync::OnceLock;

use cuda_mem_sys::{Driver, cu_call};

use crate::driver_version::DriverCapability;
use crate::error::{Error, Result};

static INITIALIZED: OnceLock<()> = OnceLock::new();

/// The process-wide driver ([`cuda_mem_sys::driver()`]), with `cuInit(0)` done. A failed
/// initialization is not remembered, so a later call tries again.
#[inline]
pub fn driver() -> Result<&'static Driver> {
    let driver = cuda_mem_sys::driver()?;
    if INITIALIZED.get().is_none() {
        initialize(driver)?;
    }
    Ok(driver)
}

/// `cuInit(0)`, the first time.
#[cold]
#[inline(never)]
fn initialize(driver: &Driver) -> Result<()> {
    // SAFETY: cuInit takes no pointers; 0 is the only valid flag value.
    unsafe { cu_call!(driver, cuInit(0)) }?;
    let _ = INITIALIZED.set(());
    Ok(())
}

impl DriverCapability {
    /// Whether the installed driver has it.
    ///
    /// # Errors
    /// If the driver cannot be loaded or does not say its version.
    pub fn is_available(self) -> Result<bool> {
        Ok(installed_version()? >= self.needs())
    }

    /// `Ok` if the installed driver has it, else [`Error::DriverTooOld`].
    ///
    /// # Errors
    /// - [`Error::DriverTooOld`].
    /// - If the driver cannot be loaded or does not say its version.
    pub fn require(self) -> Result<()> {
        let installed = installed_version()?;
        if installed < self.needs() {
            return Err(self.too_old(installed));
        }
        Ok(())
    }

    /// [`Error::DriverTooOld`] for this capability on a driver of version `installed`.
    pub(crate) fn too_old(self, installed: u32) -> Error {
        Error::DriverTooOld { capability: self, needs: self.needs(), installed }
    }
}

/// The CUDA version of the installed driver (`cuDriverGetVersion`, asked once per process).
///
/// # Errors
/// If the driver cannot be loaded or does not say its version.
pub fn installed_version() -> Result<u32> {
    Ok(driver()?.version()?)
}
