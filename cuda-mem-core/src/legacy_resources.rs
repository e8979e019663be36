//! Resources for devices or code paths without stream-ordered pools: `cuMemAllocHost` pinned
//! memory and `cuMemAlloc` device memory. Both free synchronously, after waiting for the
//! buffer's stream (or, when that fails, its device).

use std::ffi::c_void;
use std::sync::Arc;

use cuda_sys::cu_call;

use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::memory_resource::{DevicePtr, MemoryResource};
use crate::stream::Stream;

/// Page-locked host memory from `cuMemAllocHost`, allocated in a device's primary context.
#[derive(Debug)]
pub struct LegacyPinnedMemoryResource {
    device: Device,
}

impl LegacyPinnedMemoryResource {
    /// A resource allocating in `device`'s primary context.
    pub fn new(device: Device) -> Arc<LegacyPinnedMemoryResource> {
        Arc::new(LegacyPinnedMemoryResource { device })
    }
}

// SAFETY: `cuMemAllocHost` returns `size` bytes of page-locked host memory, mapped for the host
// and every device, valid until `cuMemFreeHost`.
unsafe impl MemoryResource for LegacyPinnedMemoryResource {
    fn allocate_raw(&self, size: usize, _stream: &Stream) -> Result<DevicePtr> {
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; a context is current.
        unsafe { cu_call!(d, cuMemAllocHost_v2(&mut ptr, size)) }.map_err(|e| Error::allocation(e, size))?;
        crate::memory_event!(TRACE, size, ptr = ptr as u64, "allocate");
        Ok(ptr as DevicePtr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, _size: usize, stream: &Stream) -> Result<()> {
        // The free is synchronous: it waits for the stream, or, should that fail, its device.
        stream.synchronize_or_device()?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        // SAFETY: the caller guarantees `ptr` came from `allocate_raw` and is freed once; the
        // stream's work on it has finished.
        unsafe { cu_call!(d, cuMemFreeHost(ptr as *mut c_void)) }?;
        crate::memory_event!(TRACE, size = _size, ptr, "free");
        Ok(())
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        true
    }

    fn device(&self) -> Option<Device> {
        None
    }
}

/// Device memory from `cuMemAlloc`, for devices without memory pools.
#[doc(alias = "_SynchronousMemoryResource")]
#[derive(Debug)]
pub struct SynchronousMemoryResource {
    device: Device,
}

impl SynchronousMemoryResource {
    /// A resource allocating on `device`.
    pub fn new(device: Device) -> Arc<SynchronousMemoryResource> {
        Arc::new(SynchronousMemoryResource { device })
    }
}

// SAFETY: `cuMemAlloc` returns `size` bytes of device memory (not host-accessible), valid until
// `cuMemFree`.
unsafe impl MemoryResource for SynchronousMemoryResource {
    fn allocate_raw(&self, size: usize, _stream: &Stream) -> Result<DevicePtr> {
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the device's context is current.
        unsafe { cu_call!(d, cuMemAlloc_v2(&mut ptr, size)) }.map_err(|e| Error::allocation(e, size))?;
        crate::memory_event!(TRACE, size, ptr, device = self.device.ordinal(), "allocate");
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, _size: usize, stream: &Stream) -> Result<()> {
        // The free is synchronous: it waits for the stream, or, should that fail, its device.
        stream.synchronize_or_device()?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        // SAFETY: the caller guarantees `ptr` came from `allocate_raw` and is freed once; the
        // stream's work on it has finished.
        unsafe { cu_call!(d, cuMemFree_v2(ptr)) }?;
        crate::memory_event!(TRACE, size = _size, ptr, device = self.device.ordinal(), "free");
        Ok(())
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        false
    }

    fn device(&self) -> Option<Device> {
        Some(self.device)
    }
}

crate::memory_resource::inherent_allocation!(LegacyPinnedMemoryResource);
crate::memory_resource::inherent_allocation!(SynchronousMemoryResource);
