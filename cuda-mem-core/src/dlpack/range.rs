//! Where a tensor's bytes lie: checked against the driver's allocations before an import lends
//! them as a buffer, so that a producer's pointer, byte offset or shape cannot make the buffer
//! cover memory that is unmapped or another allocation's.

use std::ffi::c_void;

use cuda_mem_sys::types::{CUmemGenericAllocationHandle, CUresult};
use cuda_mem_sys::{CudaError, Driver, cu_call};

use crate::context;
use crate::device::{Device, DevicePtr};
use crate::driver::driver;
use crate::error::{DlpackError, Result};

/// Whether a tensor's bytes must lie in memory the driver knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// Device and managed memory: memory the driver does not know is refused.
    Required,
    /// Pinned host memory: checked where the driver knows the address (memory it allocated or
    /// registered); host memory it does not know is taken on the caller's word, as
    /// [`Buffer::from_raw`](crate::Buffer::from_raw) takes it.
    IfKnown,
}

/// Checks that the `size` bytes at `ptr` (`size` > 0, `ptr + size` without overflow) lie inside
/// one allocation the driver knows (`cuMemGetAddressRange`), binding `device`'s context (or,
/// without one, any context, device 0's when none is current) to ask.
///
/// Memory mapped through the VMM API is the exception: the driver names each mapping (one
/// physical allocation), and a buffer of several, mapped one after the other in one reservation
/// (a grown `cuda-mem-vmm` buffer, PyTorch's expandable segments), is one range to its owner. A
/// range that starts in such a mapping may run on through the mappings that follow it without
/// a gap, each mapped through the VMM API too (`cuMemRetainAllocationHandle` finds its handle);
/// memory of `cuMemAlloc` or a pool never continues into its neighbour.
///
/// # Errors
/// - [`DlpackError::NotAllocated`] when the driver knows no allocation at `ptr` (and `known`
///   requires one).
/// - [`DlpackError::OutsideAllocation`] when the range runs past the allocation it starts in.
/// - A driver error binding the context or asking.
pub(crate) fn check_inside_allocation(device: Option<Device>, ptr: DevicePtr, size: usize, known: Known) -> Result<()> {
    match device {
        Some(device) => context::bind(device)?,
        None if context::current_is_none()? => context::bind(Device::new(0)?)?,
        None => {}
    }
    let d = driver()?;
    let end = u128::from(ptr) + size as u128;
    let Some((base, len)) = address_range(d, ptr)? else {
        return match known {
            Known::Required => Err(DlpackError::NotAllocated { ptr, size }.into()),
            Known::IfKnown => Ok(()),
        };
    };
    let mut reached = u128::from(base) + len as u128;
    let outside = |reached: u128| DlpackError::OutsideAllocation {
        ptr,
        size,
        base,
        allocation: usize::try_from(reached - u128::from(base)).unwrap_or(usize::MAX),
    };
    if end <= reached {
        return Ok(());
    }
    if !is_vmm_mapped(d, ptr)? {
        return Err(outside(reached).into());
    }
    while reached < end {
        // Below `end`, which fits in 64 bits.
        let next = reached as DevicePtr;
        match address_range(d, next)? {
            Some((start, len)) if start == next && len > 0 && is_vmm_mapped(d, next)? => {
                reached += len as u128;
            }
            _ => return Err(outside(reached).into()),
        }
    }
    Ok(())
}

/// Whether the driver reports "no allocation here": `cuMemGetAddressRange` documents
/// `CUDA_ERROR_NOT_FOUND`, and drivers answer `CUDA_ERROR_INVALID_VALUE` for some addresses
/// too; `cuMemRetainAllocationHandle` answers memory not mapped through the VMM API so.
fn is_no_such_memory(error: &CudaError) -> bool {
    matches!(error.code(), Some(CUresult::CUDA_ERROR_NOT_FOUND | CUresult::CUDA_ERROR_INVALID_VALUE))
}

/// `cuMemGetAddressRange`: the base and size of the allocation `ptr` lies in, `None` when the
/// driver knows none there.
fn address_range(d: &Driver, ptr: DevicePtr) -> Result<Option<(DevicePtr, usize)>> {
    let (mut base, mut size): (DevicePtr, usize) = (0, 0);
    // SAFETY: both out-pointers are valid for their writes; the address is only looked up.
    match unsafe { cu_call!(d, cuMemGetAddressRange_v2(&mut base, &mut size, ptr) as "cuMemGetAddressRange") } {
        Ok(()) => Ok(Some((base, size))),
        Err(error) if is_no_such_memory(&error) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Whether `ptr` lies in memory mapped through the VMM API: `cuMemRetainAllocationHandle`
/// finds the handle mapped there (and the reference it takes is given back at once).
fn is_vmm_mapped(d: &Driver, ptr: DevicePtr) -> Result<bool> {
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is a valid out-pointer; the address is only looked up (the driver takes
    // it as `void*` and does not dereference it on the host).
    let retained = unsafe { cu_call!(d, cuMemRetainAllocationHandle(&mut handle, ptr as *mut c_void)) };
    match retained {
        Ok(()) => {
            // SAFETY: the reference the call above took, given back once.
            unsafe { cu_call!(d, cuMemRelease(handle)) }?;
            Ok(true)
        }
        Err(error) if is_no_such_memory(&error) => Ok(false),
        Err(error) => Err(error.into()),
    }
}
