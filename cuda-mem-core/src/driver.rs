//! The process-wide driver, initialized once.

use std::sync::OnceLock;

use cuda_mem_sys::{Driver, cu_call};

use crate::error::Result;

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
