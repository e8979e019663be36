//! The exporting side: a resource's allocation handle and a buffer's descriptor.

use cuda_mem_core::{MemoryPool, MemoryResource, PoolKind, ScopedBuffer, ShareableHandle};
use uuid::Uuid;

use crate::error::{IpcError, Result, Unshareable};
use crate::wire::BufferDescriptor;

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
///
/// - [`IpcError::NotIpcEnabled`]: any other resource.
/// - [`IpcError::Core`]: the driver's first export failed.
#[doc(alias = "get_allocation_handle")]
pub fn allocation_handle(resource: &dyn MemoryResource) -> Result<AllocationHandle<'_>> {
    handle_of(shareable_pool(resource)?)
}

/// The pool behind `resource`, if it was created for sharing.
fn shareable_pool(resource: &dyn MemoryResource) -> Result<&MemoryPool> {
    let pool = resource.memory_pool().ok_or(IpcError::NotIpcEnabled(Unshareable::NotAPool))?;
    if !pool.is_shareable() {
        return Err(IpcError::NotIpcEnabled(Unshareable::PoolWithoutHandleType));
    }
    Ok(pool)
}

fn handle_of(pool: &MemoryPool) -> Result<AllocationHandle<'_>> {
    Ok(AllocationHandle { handle: pool.shareable_handle()?, kind: pool.kind() })
}

/// The descriptor of `buffer`, for another process to import (after it has imported the
/// buffer's resource). A buffer imported from elsewhere re-exports the data it came with, so it
/// can be passed on (A→B→C). The export data is made once per buffer and kept in it
/// ([`MemoryPool::export_buffer`](cuda_mem_core::MemoryPool::export_buffer)): describing the
/// same buffer again makes no driver call.
///
/// # Errors
///
/// - [`IpcError::NotIpcEnabled`]: a buffer of a resource that cannot be shared, or a view.
/// - [`IpcError::Core`] with [`SharingError::CachedBlock`](cuda_mem_core::SharingError::CachedBlock):
///   a block of a [`CachingResource`](cuda_mem_core::CachingResource), part of a larger segment
///   that the driver would export whole.
/// - [`IpcError::Core`]: the driver's export failed.
#[doc(alias("ipc_descriptor", "get_ipc_descriptor", "export"))]
pub fn buffer_descriptor(buffer: &ScopedBuffer<'_>) -> Result<BufferDescriptor> {
    let resource = buffer.memory_resource().ok_or(IpcError::NotIpcEnabled(Unshareable::BufferView))?;
    if cuda_mem_core::CachingResource::serves(resource) {
        let refused = cuda_mem_core::SharingError::CachedBlock { ptr: buffer.ptr(), size: buffer.size() };
        return Err(IpcError::Core(refused.into()));
    }
    let pool = shareable_pool(resource)?;
    let handle = handle_of(pool)?;
    // Made once per buffer and kept in it: sending the buffer again makes no driver call. An
    // imported buffer gives the data it came with.
    let export_data = pool.export_buffer(buffer)?;
    cuda_mem_core::memory_event!(
        DEBUG,
        uuid = %handle.uuid(),
        size = buffer.size(),
        ptr = %hex(buffer.ptr()),
        pool = %hex(pool.handle()),
        "buffer exported"
    );
    Ok(BufferDescriptor { export_data, size: buffer.size() as u64, resource: handle.uuid() })
}

#[cfg(all(test, feature = "tracing"))]
mod tests {
    use cuda_mem_core::__private::capture::{Captured, capture, named};
    use cuda_mem_core::{
        Device, DeviceMemoryResource, DeviceMemoryResourceOptions, PoolResource, Stream, StreamOptions,
    };

    use crate::{MappedMemoryResource, allocation_handle, buffer_descriptor};

    fn only<'a>(events: &'a [Captured], message: &'a str) -> &'a Captured {
        let found: Vec<&Captured> = named(events, message).collect();
        assert_eq!(found.len(), 1, "one {message:?} event in {events:#?}");
        found[0]
    }

    /// A pool and a buffer exported and imported in one process: each step's event carries the
    /// resource's UUID, the size and the addresses on each side.
    #[test]
    fn exports_and_imports_are_traced_with_the_resource_uuid() {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let buffer = pool.allocate(4096, &stream).unwrap();
        let ((uuid, mapped_pool, imported_ptr), events) = capture(|| {
            let handle = allocation_handle(pool.as_ref()).unwrap();
            let mapped = MappedMemoryResource::from_fd(handle.fd(), handle.uuid()).unwrap();
            let descriptor = buffer_descriptor(&buffer).unwrap();
            let imported = mapped.import_buffer(&descriptor, &stream).unwrap();
            (handle.uuid(), mapped.imported_pool().handle() as usize as u64, imported.ptr())
        });
        let uuid = uuid.to_string();
        let exporter = pool.handle() as usize as u64;
        assert_eq!(only(&events, "pool exported").number("pool"), Some(exporter));
        let resource = only(&events, "resource imported");
        assert_eq!(resource.target, "cuda_mem_ipc::mapped");
        assert_eq!((resource.fields.get("uuid"), resource.number("pool")), (Some(&uuid), Some(mapped_pool)));
        let exported = only(&events, "buffer exported");
        assert_eq!(exported.target, "cuda_mem_ipc::share");
        assert_eq!((exported.fields.get("uuid"), exported.number("size")), (Some(&uuid), Some(4096)));
        assert_eq!((exported.number("ptr"), exported.number("pool")), (Some(buffer.ptr()), Some(exporter)));
        let imported = only(&events, "buffer imported");
        assert_eq!((imported.fields.get("uuid"), imported.number("size")), (Some(&uuid), Some(4096)));
        assert_eq!((imported.number("ptr"), imported.number("pool")), (Some(imported_ptr), Some(mapped_pool)));
        assert_eq!(only(&events, "allocation imported").number("ptr"), Some(imported_ptr));
        assert_eq!(only(&events, "import released").number("ptr"), Some(imported_ptr), "dropped in the closure");
    }
}
