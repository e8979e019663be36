//! Older variants of driver functions, which `cuda.h` 13.0 no longer declares but which
//! `cuda-mem` uses on drivers that lack the newer variant (declared by hand, with the signature
//! and ABI version `cudaTypedefs.h` gives them).
//!
//! They resolve like every generated entry point: `cuGetProcAddress_v2(base name, their ABI
//! version)`, which a newer driver answers with exactly this variant, then `dlsym` of their
//! unversioned name.

use crate::error::LoadError;
use crate::loader::{Driver, Slot, SymbolInfo};
use crate::types::{CUdevice, CUdeviceptr, CUevent, CUmem_advise, CUresult, CUstream, CUuuid};

/// `cuEventElapsedTime` as CUDA 2.0 defined it (`PFN_cuEventElapsedTime_v2000`): the signature
/// of CUDA 12.8's `cuEventElapsedTime_v2`, for drivers before 12.8.
const EVENT_ELAPSED_TIME_V1: SymbolInfo =
    SymbolInfo { symbol: c"cuEventElapsedTime", base: c"cuEventElapsedTime", version: Some(2000), per_thread: None };

/// `cuMemAdvise` as CUDA 8.0 defined it (`PFN_cuMemAdvise_v8000`): a device ordinal, or
/// `CU_DEVICE_CPU` (-1) for the host, where CUDA 12.2's `cuMemAdvise_v2` takes a `CUmemLocation`.
const MEM_ADVISE_V1: SymbolInfo =
    SymbolInfo { symbol: c"cuMemAdvise", base: c"cuMemAdvise", version: Some(8000), per_thread: None };

/// `cuMemPrefetchAsync` as CUDA 8.0 defined it (`PFN_cuMemPrefetchAsync_v8000`, and
/// `PFN_cuMemPrefetchAsync_v8000_ptsz`): a device ordinal or `CU_DEVICE_CPU`, and no flags.
const MEM_PREFETCH_ASYNC_V1: SymbolInfo = SymbolInfo {
    symbol: c"cuMemPrefetchAsync",
    base: c"cuMemPrefetchAsync",
    version: Some(8000),
    per_thread: Some((c"cuMemPrefetchAsync_ptsz", 8000)),
};

/// `cuDeviceGetUuid` as CUDA 9.2 defined it (`PFN_cuDeviceGetUuid_v9020`): the signature of
/// CUDA 11.4's `cuDeviceGetUuid_v2`, for drivers before 11.4.
const DEVICE_GET_UUID_V1: SymbolInfo =
    SymbolInfo { symbol: c"cuDeviceGetUuid", base: c"cuDeviceGetUuid", version: Some(9020), per_thread: None };

/// Every variant declared here, in the form of [`SYMBOLS`](crate::SYMBOLS).
pub static OLDER_SYMBOLS: &[SymbolInfo] =
    &[EVENT_ELAPSED_TIME_V1, MEM_ADVISE_V1, MEM_PREFETCH_ASYNC_V1, DEVICE_GET_UUID_V1];

/// The signature of `cuEventElapsedTime` (both variants).
pub type EventElapsedTime = unsafe extern "C" fn(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;

/// The signature of `cuDeviceGetUuid` (both variants).
pub type DeviceGetUuid = unsafe extern "C" fn(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;

/// The signature of CUDA 8.0's `cuMemAdvise`.
pub type MemAdviseV1 =
    unsafe extern "C" fn(dev_ptr: CUdeviceptr, count: usize, advice: CUmem_advise, device: CUdevice) -> CUresult;

/// The signature of CUDA 8.0's `cuMemPrefetchAsync` (and its `_ptsz` twin).
pub type MemPrefetchAsyncV1 =
    unsafe extern "C" fn(dev_ptr: CUdeviceptr, count: usize, dst_device: CUdevice, stream: CUstream) -> CUresult;

#[allow(non_snake_case)]
impl Driver {
    /// `cuEventElapsedTime(ms, start, end)` as CUDA 2.0 defined it, for drivers older than
    /// 12.8 (whose `cuEventElapsedTime_v2` takes the same arguments).
    ///
    /// The entry point, resolved on first use; a [`LoadError`] naming the symbol where the
    /// driver lacks it.
    #[inline]
    pub fn cuEventElapsedTime_v1(&self) -> Result<EventElapsedTime, LoadError> {
        // SAFETY: `EventElapsedTime` is `PFN_cuEventElapsedTime_v2000`, the version the spec names.
        unsafe { self.entry(&self.older_entries.event_elapsed_time, &EVENT_ELAPSED_TIME_V1) }
    }

    /// `cuMemAdvise(devPtr, count, advice, device)` as CUDA 8.0 defined it, for drivers older
    /// than 12.2: `device` is a device ordinal or `CU_DEVICE_CPU` (-1) for the host.
    ///
    /// The entry point, resolved on first use; a [`LoadError`] naming the symbol where the
    /// driver lacks it.
    #[inline]
    pub fn cuMemAdvise_v1(&self) -> Result<MemAdviseV1, LoadError> {
        // SAFETY: `MemAdviseV1` is `PFN_cuMemAdvise_v8000`, the version the spec names.
        unsafe { self.entry(&self.older_entries.mem_advise, &MEM_ADVISE_V1) }
    }

    /// `cuMemPrefetchAsync(devPtr, count, dstDevice, hStream)` as CUDA 8.0 defined it, for
    /// drivers older than 12.2: `dstDevice` is a device ordinal or `CU_DEVICE_CPU` (-1).
    ///
    /// The entry point, resolved on first use; a [`LoadError`] naming the symbol where the
    /// driver lacks it.
    #[inline]
    pub fn cuMemPrefetchAsync_v1(&self) -> Result<MemPrefetchAsyncV1, LoadError> {
        // SAFETY: `MemPrefetchAsyncV1` is `PFN_cuMemPrefetchAsync_v8000`, the version the spec
        // names.
        unsafe { self.entry(&self.older_entries.mem_prefetch_async, &MEM_PREFETCH_ASYNC_V1) }
    }

    /// `cuDeviceGetUuid(uuid, dev)` as CUDA 9.2 defined it, for drivers older than 11.4
    /// (whose `cuDeviceGetUuid_v2` takes the same arguments; only `_v2` is documented to give
    /// a MIG instance's own UUID).
    ///
    /// The entry point, resolved on first use; a [`LoadError`] naming the symbol where the
    /// driver lacks it.
    #[inline]
    pub fn cuDeviceGetUuid_v1(&self) -> Result<DeviceGetUuid, LoadError> {
        // SAFETY: `DeviceGetUuid` is `PFN_cuDeviceGetUuid_v9020`, the version the spec names.
        unsafe { self.entry(&self.older_entries.device_get_uuid, &DEVICE_GET_UUID_V1) }
    }
}

/// One cache slot per variant declared here.
#[derive(Default)]
pub(crate) struct OlderEntries {
    event_elapsed_time: Slot,
    mem_advise: Slot,
    mem_prefetch_async: Slot,
    device_get_uuid: Slot,
}
