//! Driver functions newer than the `cuda.h` the bindings were generated from (CUDA 13.0),
//! declared by hand with the signature and ABI version their own release's header gives.
//!
//! They resolve like every generated entry point (`cuGetProcAddress_v2` at their version, then
//! `dlsym`), so a driver older than the version gets a [`LoadError`] naming the symbol. The types
//! they take are already in [`crate::types`]: only the function is new.

use crate::error::LoadError;
use crate::loader::{Driver, Slot, SymbolInfo};
use crate::types::{CUdeviceptr, CUmemcpyAttributes, CUresult, CUstream};

/// The CUDA version (`cuDriverGetVersion`'s encoding) that added `cuMemcpyWithAttributesAsync`.
pub const MEMCPY_WITH_ATTRIBUTES_VERSION: u32 = 13020;

/// `cuMemcpyWithAttributesAsync` (CUDA 13.2), and its per-thread-default-stream twin.
const MEMCPY_WITH_ATTRIBUTES: SymbolInfo = SymbolInfo {
    symbol: c"cuMemcpyWithAttributesAsync",
    base: c"cuMemcpyWithAttributesAsync",
    version: Some(MEMCPY_WITH_ATTRIBUTES_VERSION),
    per_thread: Some((c"cuMemcpyWithAttributesAsync_ptsz", MEMCPY_WITH_ATTRIBUTES_VERSION)),
};

/// Every driver function declared here, in the form of [`SYMBOLS`](crate::SYMBOLS).
pub static NEWER_SYMBOLS: &[SymbolInfo] = &[MEMCPY_WITH_ATTRIBUTES];

/// The signature of `cuMemcpyWithAttributesAsync`.
pub type MemcpyWithAttributesAsync = unsafe extern "C" fn(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    size: usize,
    attr: *mut CUmemcpyAttributes,
    stream: CUstream,
) -> CUresult;

/// One cache slot per function declared here.
#[derive(Default)]
pub(crate) struct NewerEntries {
    memcpy_with_attributes: Slot,
}

#[allow(non_snake_case)]
impl Driver {
    /// `cuMemcpyWithAttributesAsync(dst, src, size, attr, stream)` (CUDA 13.2): one copy of
    /// `size` bytes with the attributes `cuMemcpyBatchAsync` takes (source access order,
    /// location hints, flags).
    ///
    /// **Loader:** returns the entry point, resolved on first use, valid while this `Driver`
    /// lives.
    ///
    /// # Errors
    /// A [`LoadError`] naming the symbol when the driver lacks it (any driver older than CUDA
    /// 13.2).
    #[inline]
    pub fn cuMemcpyWithAttributesAsync(&self) -> Result<MemcpyWithAttributesAsync, LoadError> {
        // SAFETY: the symbol's C signature at the ABI version CUDA 13.2 introduced it with is
        // `MemcpyWithAttributesAsync`.
        unsafe { self.entry(&self.newer.memcpy_with_attributes, &MEMCPY_WITH_ATTRIBUTES) }
    }
}
