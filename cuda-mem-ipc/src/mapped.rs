//! `MappedMemoryResource`: a pool imported from another process.
//!
//! It cannot allocate; it maps the allocations the exporting process shares (through the
//! duplicate-import cache) into buffers that keep it, and so its file descriptor, alive. It may
//! be dropped before those buffers.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use cuda_mem_core::{Buffer, Device, DevicePtr, MemoryPool, MemoryResource, Stream};
use uuid::Uuid;

use crate::descriptor::BufferDescriptor;
use crate::error::{IpcError, Result};
use crate::import_cache;
use crate::registry::Registry;

/// What kind of memory a shared pool holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedKind {
    /// Device memory of this device (by ordinal in the importing process).
    Device(Device),
    /// Pinned host memory (accessible from the host and every device).
    Pinned,
}

/// A pool imported from another process.
#[derive(Debug)]
pub struct MappedMemoryResource {
    pool: MemoryPool,
    uuid: Uuid,
    kind: SharedKind,
}

/// Every mapped resource of the process, by the UUID of the resource it maps.
static REGISTRY: Registry<MappedMemoryResource> = Registry::new();

/// The process-wide registry of mapped resources (an entry goes when its resource goes).
pub fn registry() -> &'static Registry<MappedMemoryResource> {
    &REGISTRY
}

/// The kind of memory a lookup expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedKind {
    /// A device pool.
    Device,
    /// A pinned host pool.
    Pinned,
}

impl SharedKind {
    fn name(self) -> &'static str {
        match self {
            SharedKind::Device(_) => "device memory pool",
            SharedKind::Pinned => "pinned host memory pool",
        }
    }
}

/// The registered mapped resource with this UUID, which must be of the expected kind.
///
/// # Errors
/// [`IpcError::UnknownResource`] when none is registered (or it was dropped);
/// [`IpcError::WrongResourceKind`] when it holds the other kind of memory.
pub fn lookup(uuid: Uuid, expected: ExpectedKind) -> Result<Arc<MappedMemoryResource>> {
    let resource = registry().get(uuid)?;
    let matches = matches!(
        (resource.kind, expected),
        (SharedKind::Device(_), ExpectedKind::Device) | (SharedKind::Pinned, ExpectedKind::Pinned)
    );
    if !matches {
        let expected = match expected {
            ExpectedKind::Device => "device memory pool",
            ExpectedKind::Pinned => "pinned host memory pool",
        };
        return Err(IpcError::WrongResourceKind { uuid, expected, found: resource.kind.name() });
    }
    Ok(resource)
}

impl MappedMemoryResource {
    /// Imports the pool behind `fd` (which this takes), exported by the resource `uuid`.
    ///
    /// # Errors
    /// When the driver refuses the descriptor (it is not a pool, or of a kind this process
    /// cannot map).
    pub fn from_owned_fd(fd: OwnedFd, uuid: Uuid, kind: SharedKind) -> Result<Arc<MappedMemoryResource>> {
        let owner = match kind {
            SharedKind::Device(device) => Some(device),
            SharedKind::Pinned => None,
        };
        let pool = MemoryPool::import(fd, uuid.as_u128(), owner)?;
        Ok(Arc::new(MappedMemoryResource { pool, uuid, kind }))
    }

    /// Imports the pool behind `fd`, duplicating it: the caller keeps the original.
    ///
    /// # Errors
    /// As [`MappedMemoryResource::from_owned_fd`], and when no descriptor can be duplicated.
    pub fn from_fd(fd: BorrowedFd<'_>, uuid: Uuid, kind: SharedKind) -> Result<Arc<MappedMemoryResource>> {
        let owned = fd
            .try_clone_to_owned()
            .map_err(|source| IpcError::Io { context: "duplicating a pool's file descriptor", source })?;
        MappedMemoryResource::from_owned_fd(owned, uuid, kind)
    }

    /// The UUID of the exporting resource.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Device or pinned memory.
    pub fn kind(&self) -> SharedKind {
        self.kind
    }

    /// The imported pool (it keeps the file descriptor it was imported from).
    pub fn imported_pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// Maps the buffer `descriptor` describes, as a buffer that keeps this resource alive and
    /// unmaps (when no other import of it in this process remains) when dropped, on `stream`.
    ///
    /// # Errors
    /// [`IpcError::WrongResource`] when the descriptor belongs to another resource; a protocol
    /// error when its size exceeds the shared allocation; driver errors for data the driver
    /// refuses. Nothing stays mapped on failure.
    pub fn import_buffer(self: &Arc<Self>, descriptor: &BufferDescriptor, stream: &Stream) -> Result<Buffer> {
        if descriptor.resource != self.uuid {
            return Err(IpcError::WrongResource { expected: self.uuid, found: descriptor.resource });
        }
        let size = usize::try_from(descriptor.size).map_err(|_| {
            IpcError::Protocol(format!("a buffer of {} bytes does not fit this machine", descriptor.size))
        })?;
        let ptr = import_cache::acquire(&self.pool, &descriptor.export_data, size, stream)?;
        let resource: Arc<dyn MemoryResource> = Arc::clone(self) as Arc<dyn MemoryResource>;
        // SAFETY: the pointer is one holder's share of an import of `size` (checked) bytes, which
        // the buffer releases once, through `deallocate_raw` below.
        Ok(unsafe { Buffer::from_raw_owned(ptr, size, resource, stream) })
    }
}

// SAFETY: buffers come only from `import_buffer`, whose mapping covers the size (checked
// against the driver's range size); the memory is reported as not host-accessible, because
// another process may write it at any time.
unsafe impl MemoryResource for MappedMemoryResource {
    fn allocate_raw(&self, _size: usize, _stream: &Stream) -> cuda_mem_core::Result<DevicePtr> {
        Err(cuda_mem_core::Error::InvalidState(
            "cannot allocate from a mapped memory resource (a pool imported from another process): \
             allocate in the exporting process and send the buffer"
                .to_string(),
        ))
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, _size: usize, stream: &Stream) -> cuda_mem_core::Result<()> {
        // SAFETY: forwarded from the caller (a buffer releasing its one share).
        unsafe { import_cache::release(&self.pool, ptr, stream) }.map_err(|e| match e {
            IpcError::Core(core) => core,
            other => cuda_mem_core::Error::InvalidState(other.to_string()),
        })
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        // Even pinned memory: the exporting process may write it at any time, so no safe host
        // slice can be lent; copy it to local memory instead.
        false
    }

    fn device(&self) -> Option<Device> {
        match self.kind {
            SharedKind::Device(device) => Some(device),
            SharedKind::Pinned => None,
        }
    }

    fn pool(&self) -> Option<&MemoryPool> {
        Some(&self.pool)
    }
}
