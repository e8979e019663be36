//! The exporting side: a resource's allocation handle and a buffer's descriptor.

use cuda_mem_core::{MemoryResource, PoolKind, ScopedBuffer, ShareableHandle};
use uuid::Uuid;

use crate::descriptor::BufferDescriptor;
use crate::error::{IpcError, Result};
use crate::mapped::pool_behind;

/// A resource's allocation handle: the pool's file descriptor (owned by the pool, exported once:
/// asking again returns the same one) and the UUID naming the resource in every process.
#[doc(alias = "IPCAllocationHandle")]
#[derive(Debug, Clone, Copy)]
pub struct AllocationHandle<'a> {
    handle: &'a ShareableHandle,
    kind: PoolKind,
}

impl<'a> AllocationHandle<'a> {
    /// The pool's file descriptor (send it; it stays owned by the pool).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'a> {
        self.handle.fd()
    }

    /// The UUID of the exporting resource.
    pub fn uuid(&self) -> Uuid {
        Uuid::from_u128(self.handle.id())
    }

    /// Device or pinned memory.
    pub fn kind(&self) -> PoolKind {
        self.kind
    }
}

/// The allocation handle of an IPC-enabled pool resource ([`DeviceMemoryResource`] or
/// [`PinnedMemoryResource`] created with `ipc_enabled(true)`, or a mapped resource, which
/// re-exports the handle it was imported from).
///
/// [`DeviceMemoryResource`]: cuda_mem_core::DeviceMemoryResource
/// [`PinnedMemoryResource`]: cuda_mem_core::PinnedMemoryResource
///
/// # Errors
/// [`IpcError::NotIpcEnabled`] for any other resource; driver errors from the first export.
#[doc(alias = "get_allocation_handle")]
pub fn allocation_handle(resource: &dyn MemoryResource) -> Result<AllocationHandle<'_>> {
    let pool = pool_behind(resource)
        .ok_or_else(|| IpcError::NotIpcEnabled("a resource that is not a memory pool".to_string()))?;
    if !pool.is_shareable() {
        return Err(IpcError::NotIpcEnabled("this resource's memory pool".to_string()));
    }
    let handle = pool.shareable_handle()?;
    Ok(AllocationHandle { handle, kind: pool.kind() })
}

/// The descriptor of `buffer`, for another process to import (after it has imported the
/// buffer's resource). A buffer imported from elsewhere re-exports the data it came with, so it
/// can be passed on (A→B→C).
///
/// # Errors
/// [`IpcError::NotIpcEnabled`] for buffers of resources that cannot be shared, or views;
/// driver errors.
#[doc(alias("ipc_descriptor", "get_ipc_descriptor", "export"))]
pub fn buffer_descriptor(buffer: &ScopedBuffer<'_>) -> Result<BufferDescriptor> {
    let resource = buffer
        .memory_resource()
        .ok_or_else(|| IpcError::NotIpcEnabled("a buffer view (it owns no memory)".to_string()))?;
    let handle = allocation_handle(resource)?;
    let pool = pool_behind(resource)
        .ok_or_else(|| IpcError::NotIpcEnabled("a buffer that is not from a memory pool".to_string()))?;
    // An imported buffer gives the data it came with.
    let export_data = pool.export_pointer(buffer.ptr())?;
    Ok(BufferDescriptor { export_data, size: buffer.size() as u64, resource: handle.uuid() })
}
