//! Resources for devices or code paths without stream-ordered pools: `cuMemAllocHost` pinned
//! memory and `cuMemAlloc` device memory. Both free synchronously, after waiting for the
//! buffer's stream (or, when that fails, its device).
//!
//! Under capture: a capturing stream cannot be waited for (waiting invalidates the capture), so
//! both refuse to allocate on one ([`Error::CapturingStream`], as pools do), and a buffer freed
//! on one is not freed then: its free is handed to the capture when it was begun through this
//! crate (done once the graph and its executable graphs are gone, after their work; see
//! [`Stream::keep_alive_in_capture`]), and refused otherwise ([`Error::CapturingStream`]; the
//! memory is then kept, never freed under work a graph may still do).

use std::ffi::c_void;
use std::sync::Arc;

use cuda_mem_sys::cu_call;

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::{Device, DevicePtr};
use crate::driver::driver;
use crate::drop_errors::on_drop;
use crate::error::{Error, Result};
use crate::memory_resource::MemoryResource;
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

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this resource alive
    /// ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) without the import).
    /// A zero-size request makes an empty buffer without asking the resource.
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows this resource and
    /// the stream ([`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped)
    /// without the import).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(self, size, stream)
    }
}

// SAFETY: `cuMemAllocHost` returns `size` bytes of page-locked host memory, mapped for the host
// and every device, valid until `cuMemFreeHost`.
unsafe impl MemoryResource for LegacyPinnedMemoryResource {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        refuse_capture(stream)?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; a context is current.
        unsafe { cu_call!(d, cuMemAllocHost_v2(&mut ptr, size)) }.map_err(|e| Error::allocation(e, size))?;
        crate::memory_event!(TRACE, size, ptr = %hex(ptr), "allocate");
        Ok(ptr as DevicePtr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        let free = SynchronousFree { ptr, size, device: self.device, host: true };
        // SAFETY: forwarded from the caller.
        unsafe { free.after(stream) }
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

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this resource alive
    /// ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) without the import).
    /// A zero-size request makes an empty buffer without asking the resource.
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows this resource and
    /// the stream ([`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped)
    /// without the import).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(self, size, stream)
    }
}

// SAFETY: `cuMemAlloc` returns `size` bytes of device memory (not host-accessible), valid until
// `cuMemFree`.
unsafe impl MemoryResource for SynchronousMemoryResource {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        refuse_capture(stream)?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the device's context is current.
        unsafe { cu_call!(d, cuMemAlloc_v2(&mut ptr, size)) }.map_err(|e| Error::allocation(e, size))?;
        crate::memory_event!(TRACE, size, ptr = %hex(ptr), device = self.device.ordinal(), "allocate");
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        let free = SynchronousFree { ptr, size, device: self.device, host: false };
        // SAFETY: forwarded from the caller.
        unsafe { free.after(stream) }
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

/// [`Error::CapturingStream`] when `stream` captures: a free that waits for it would invalidate
/// the capture.
fn refuse_capture(stream: &Stream) -> Result<()> {
    stream.bind_if_default()?;
    if stream.refuses_allocation()? { Err(Error::CapturingStream) } else { Ok(()) }
}

/// A synchronous free (`cuMemFreeHost` or `cuMemFree`) of memory a legacy resource allocated.
#[derive(Debug)]
struct SynchronousFree {
    ptr: DevicePtr,
    #[cfg_attr(not(feature = "tracing"), expect(dead_code, reason = "only the `tracing` events name the size"))]
    size: usize,
    device: Device,
    /// `cuMemFreeHost` rather than `cuMemFree`.
    host: bool,
}

impl SynchronousFree {
    /// Frees after `stream`'s work: waits for it (or, should that fail, its device) and frees
    /// now, unless the stream captures (see the module's notes).
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate_raw`].
    unsafe fn after(self, stream: &Stream) -> Result<()> {
        // The driver is asked even where the stream's capture is known: the free waits for the
        // stream anyway, and a wrong answer would invalidate a capture. A status that cannot be
        // read is taken as "not capturing": waiting for a capturing stream (or its device)
        // fails, so memory a capture may use is never freed that way.
        if stream.is_capturing().unwrap_or(false) {
            // Freed when the graphs are gone, after their work (the drop below), or refused.
            return stream.keep_alive_in_capture(PendingFree(Some(self))).map_err(|mut refused| {
                // Not freed: the memory stays the caller's (kept, never freed under the capture).
                refused.0 = None;
                Error::CapturingStream
            });
        }
        stream.synchronize_or_device()?;
        // SAFETY: forwarded from the caller; the stream's work on it has finished.
        unsafe { self.now() }
    }

    /// Frees now.
    ///
    /// # Safety
    /// The memory is live, from this resource, freed once, and nothing uses it any more.
    unsafe fn now(self) -> Result<()> {
        crate::context::bind(self.device)?;
        let d = driver()?;
        if self.host {
            // SAFETY: the caller guarantees the memory came from cuMemAllocHost, is unused and
            // freed once.
            unsafe { cu_call!(d, cuMemFreeHost(self.ptr as *mut c_void)) }?;
            crate::memory_event!(TRACE, size = self.size, ptr = %hex(self.ptr), "free");
        } else {
            // SAFETY: the caller guarantees the memory came from cuMemAlloc, is unused and freed
            // once.
            unsafe { cu_call!(d, cuMemFree_v2(self.ptr)) }?;
            crate::memory_event!(TRACE, size = self.size, ptr = %hex(self.ptr), device = self.device.ordinal(), "free");
        }
        Ok(())
    }
}

/// A free handed to a capture: done when the capture's graphs let go of it, after their work.
#[derive(Debug)]
struct PendingFree(Option<SynchronousFree>);

impl Drop for PendingFree {
    fn drop(&mut self) {
        if let Some(free) = self.0.take() {
            // SAFETY: the buffer's deallocation handed the free over unperformed (its memory is
            // live and freed once, here); the graph resources drop what they keep only after
            // the work of the capture's stream and of every launch is done.
            on_drop("legacy allocation (freed after its graphs)", || unsafe { free.now() });
        }
    }
}
