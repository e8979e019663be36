//! Older variants of driver functions, which `cuda.h` 13.0 no longer declares but which
//! `cuda-mem` uses on drivers that lack the newer variant (declared by hand, with the signature
//! and ABI version `cudaTypedefs.h` gives them).
//!
//! They resolve like every generated entry point: `cuGetProcAddress_v2(base name, their ABI
//! version)`, which a newer driver answers with exactly this variant, then `dlsym` of their
//! unversioned name.

use std::ffi::c_void;

use crate::error::LoadError;
use crate::loader::{Driver, SymbolInfo};
use crate::types::{CUevent, CUresult};

/// `cuEventElapsedTime` as CUDA 2.0 defined it (`PFN_cuEventElapsedTime_v2000`): the signature
/// of CUDA 12.8's `cuEventElapsedTime_v2`, for drivers before 12.8.
const EVENT_ELAPSED_TIME_V1: SymbolInfo =
    SymbolInfo { symbol: c"cuEventElapsedTime", base: c"cuEventElapsedTime", version: Some(2000), per_thread: None };

/// Every variant declared here, in the form of [`SYMBOLS`](crate::SYMBOLS).
pub static OLDER_SYMBOLS: &[SymbolInfo] = &[EVENT_ELAPSED_TIME_V1];

/// The signature of `cuEventElapsedTime` (both variants).
pub type EventElapsedTime = unsafe extern "C" fn(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;

#[allow(non_snake_case)]
impl Driver {
    /// `cuEventElapsedTime(ms, start, end)` as CUDA 2.0 defined it, for drivers older than 12.8
    /// (whose `cuEventElapsedTime_v2` takes the same arguments).
    ///
    /// **Loader:** returns the entry point, resolved on first use, valid while this `Driver`
    /// lives.
    ///
    /// # Errors
    /// A [`LoadError`] naming the symbol when the driver lacks it.
    #[inline]
    pub fn cuEventElapsedTime_v1(&self) -> Result<EventElapsedTime, LoadError> {
        static SPEC: SymbolInfo = EVENT_ELAPSED_TIME_V1;
        let address = self.resolve(&self.older_entries.event_elapsed_time, &SPEC)?;
        // SAFETY: `address` is the driver's entry point for `cuEventElapsedTime` at ABI version
        // 2000, whose C signature is `EventElapsedTime`.
        Ok(unsafe { std::mem::transmute::<*const c_void, EventElapsedTime>(address) })
    }
}

/// One cache slot per variant declared here.
#[derive(Default)]
pub(crate) struct OlderEntries {
    event_elapsed_time: crate::loader::Slot,
}
