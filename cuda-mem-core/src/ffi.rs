//! The driver calls this crate makes from three places or more, one thin function each (as
//! cudarc's `result` layer): the `unsafe` of each call, and why it holds, is argued here once.
//! A call made from one or two places stays beside its one use.
//!
//! Each function returns the driver's error as `cu_call!` does ([`CudaError`]); the callers'
//! `?` makes it the crate's error.

use std::ffi::c_void;

use cuda_mem_sys::types::{CUpointer_attribute, CUstream, CUstreamCaptureStatus};
use cuda_mem_sys::{CudaError, Driver, cu_call};

use crate::device::DevicePtr;

/// A memset of `count` units of one width (`cuMemsetD8Async`, `cuMemsetD16Async`,
/// `cuMemsetD32Async`): the value and how many units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Memset {
    /// `count` bytes of the value.
    D8(u8, usize),
    /// `count` 2-byte units of the value.
    D16(u16, usize),
    /// `count` 4-byte units of the value.
    D32(u32, usize),
}

/// `cuStreamIsCapturing`: whether `stream` captures, and whether that capture was invalidated.
///
/// # Safety
/// `stream` is a live stream handle (or a default-stream handle whose context is current).
pub(crate) unsafe fn stream_capture_status(d: &Driver, stream: CUstream) -> Result<CUstreamCaptureStatus, CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer; the caller vouches for the stream handle.
    unsafe { cu_call!(d, cuStreamIsCapturing(stream, &mut status)) }?;
    Ok(status)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_IS_MANAGED)`: whether the driver reports `ptr` as
/// managed memory. Any address may be asked (the driver only looks it up); one it does not
/// know is refused with its error.
pub(crate) fn pointer_is_managed(d: &Driver, ptr: DevicePtr) -> Result<bool, CudaError> {
    // Four bytes, zeroed: `cuda.h` calls the attribute "a boolean" without a width, so the slot
    // holds the widest a driver writes (`unsigned int`), and a narrower write (the simulator's C
    // `bool`) leaves the rest zero; either way the value is read as nonzero or not.
    let mut managed = 0u32;
    // SAFETY: `managed` is valid for writes of up to four bytes, the widest the attribute takes;
    // the address is only looked up.
    unsafe {
        cu_call!(
            d,
            cuPointerGetAttribute(
                (&raw mut managed).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                ptr
            )
        )
    }?;
    Ok(managed != 0)
}

/// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_SIZE)`: the size of the allocation (or
/// mapping) `ptr` lies in, as the current context sees it.
pub(crate) fn pointer_range_size(d: &Driver, ptr: DevicePtr) -> Result<usize, CudaError> {
    let mut size: usize = 0;
    // SAFETY: RANGE_SIZE writes a `size_t`, which `size` is; the address is only looked up.
    unsafe {
        cu_call!(
            d,
            cuPointerGetAttribute(
                (&raw mut size).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr
            )
        )
    }?;
    Ok(size)
}

/// `cuMemcpyAsync`: copies `size` bytes from `src` to `dst` on `stream`.
///
/// # Safety
/// Both ranges are `size` bytes of live memory that stay valid until the copy has run (their
/// free is ordered after `stream`'s work), and `stream` is a live stream handle.
pub(crate) unsafe fn memcpy_async(
    d: &Driver,
    dst: DevicePtr,
    src: DevicePtr,
    size: usize,
    stream: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller vouches for both ranges and the stream; the driver handles overlap.
    unsafe { cu_call!(d, cuMemcpyAsync(dst, src, size, stream)) }
}

/// `cuMemsetD8Async`, `cuMemsetD16Async` or `cuMemsetD32Async`: sets the units of `memset` at
/// `ptr` on `stream`.
///
/// # Safety
/// `ptr` addresses the units `memset` counts, aligned to their width, of live memory that stays
/// valid until the work has run; `stream` is a live stream handle.
pub(crate) unsafe fn memset_async(
    d: &Driver,
    ptr: DevicePtr,
    memset: Memset,
    stream: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller vouches for the range, its alignment and the stream.
    unsafe {
        match memset {
            Memset::D8(value, count) => cu_call!(d, cuMemsetD8Async(ptr, value, count, stream)),
            Memset::D16(value, count) => cu_call!(d, cuMemsetD16Async(ptr, value, count, stream)),
            Memset::D32(value, count) => cu_call!(d, cuMemsetD32Async(ptr, value, count, stream)),
        }
    }
}

/// `cuMemFreeAsync`: frees (or, for an import, unmaps) stream-ordered memory once `stream`'s
/// work so far is done. On every pool free: inlined.
///
/// # Safety
/// `ptr` is live memory from a pool (`cuMemAllocFromPoolAsync`, `cuMemAllocAsync`,
/// `cuMemPoolImportPointer`) that nothing uses after `stream`'s work so far, freed once; `stream`
/// is a live stream handle.
#[inline(always)]
pub(crate) unsafe fn mem_free_async(d: &Driver, ptr: DevicePtr, stream: CUstream) -> Result<(), CudaError> {
    // SAFETY: the caller vouches for the memory and the stream.
    unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream)) }
}
