//! `PinnedMemoryResource`: page-locked host memory from a driver pool.

use std::sync::Arc;

use cuda_mem_sys::types::{CUmemAllocationType, CUmemLocation, CUmemPoolProps};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::{DevicePtr, NumaNode};
use crate::driver_version::DriverCapability;
use crate::error::{Error, Result};
use crate::handle_types::{HandleType, HandleTypes};
use crate::location::Location;
use crate::memory_resource::{MemoryResource, PoolResource};
use crate::pool::{MemoryPool, PoolKind};
use crate::stream::Stream;

/// How to create an owned pinned pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PinnedMemoryResourceOptions {
    /// The most the pool may reserve (`None`: no limit of its own).
    pub max_size: Option<usize>,
    /// Whether the pool can be shared with other processes by file descriptor (needs a
    /// [`numa_node`](Self::numa_node)).
    pub ipc_enabled: bool,
    /// The host NUMA node its memory lives on (`None`: no preference, the pool's location is
    /// [`Location::Host`]). [`Device::host_numa_node`](crate::Device::host_numa_node) names the node closest to a device.
    pub numa_node: Option<NumaNode>,
}

impl PinnedMemoryResourceOptions {
    /// With a maximum size.
    pub fn max_size(mut self, bytes: usize) -> Self {
        self.max_size = Some(bytes);
        self
    }

    /// With sharing by file descriptor on or off.
    pub fn ipc_enabled(mut self, enabled: bool) -> Self {
        self.ipc_enabled = enabled;
        self
    }

    /// With its memory on a host NUMA node (`None`: no preference).
    pub fn numa_node(mut self, node: impl Into<Option<NumaNode>>) -> Self {
        self.numa_node = node.into();
        self
    }
}

/// Page-locked host memory from a stream-ordered pool, accessible from the host and from every
/// device.
#[derive(Debug)]
pub struct PinnedMemoryResource {
    pool: MemoryPool,
    numa_node: Option<NumaNode>,
}

fn host_location(numa_node: Option<NumaNode>) -> CUmemLocation {
    numa_node.map_or(Location::Host, Location::HostNuma).raw()
}

impl PinnedMemoryResource {
    /// The process's current pinned host pool (shared, never destroyed). Every device is given
    /// read-write access to its memory (a host pool's memory is the host CPU's alone until then),
    /// which holds for every user of the process-wide pool.
    ///
    /// # Errors
    /// - [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::CurrentPools`]: there is no
    ///   current host pool; [`PinnedMemoryResource::new`] makes one of its own from 12.6).
    /// - Driver errors.
    pub fn current() -> Result<Arc<PinnedMemoryResource>> {
        DriverCapability::CurrentPools.require()?;
        let pool = MemoryPool::current(host_location(None), PoolKind::Pinned)?;
        pool.grant_all_devices()?;
        let resource = Arc::new(PinnedMemoryResource { pool, numa_node: None });
        crate::snapshot::register(&resource);
        Ok(resource)
    }

    /// A pinned pool of its own, its memory readable and writable by every device.
    ///
    /// # Errors
    /// - [`Error::DriverTooOld`] before CUDA 12.6 ([`DriverCapability::PinnedPools`]).
    /// - [`Error::NumaLocationRequired`] for IPC without a NUMA node.
    /// - Driver errors.
    pub fn new(options: PinnedMemoryResourceOptions) -> Result<Arc<PinnedMemoryResource>> {
        DriverCapability::PinnedPools.require()?;
        let numa_node = options.numa_node;
        if options.ipc_enabled && numa_node.is_none() {
            return Err(Error::NumaLocationRequired);
        }
        let handle_types =
            if options.ipc_enabled { HandleTypes::from(HandleType::PosixFd) } else { HandleTypes::empty() };
        let props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: handle_types.raw(),
            location: host_location(numa_node),
            maxSize: options.max_size.unwrap_or(0),
            ..CUmemPoolProps::default()
        };
        let pool = MemoryPool::create(&props, PoolKind::Pinned)?;
        pool.grant_all_devices()?;
        let resource = Arc::new(PinnedMemoryResource { pool, numa_node });
        crate::snapshot::register(&resource);
        Ok(resource)
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

    /// The pool: attributes, release threshold, trimming.
    pub fn pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// The NUMA node of its memory, if it has one.
    pub fn numa_node(&self) -> Option<NumaNode> {
        self.numa_node
    }
}

// SAFETY: the pool hands out `size` valid bytes per allocation until they are freed; page-locked host
// memory, given to every device: the answers the trait derives from the pool (its kind is
// `PoolKind::Pinned`, and whether it is shared) are its memory's.
unsafe impl MemoryResource for PinnedMemoryResource {
    /// Allocates from the pool, in stream order; [`Error::CapturingStream`] on a capturing
    /// stream (the pool would allocate outside the graph).
    #[inline(always)]
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        self.pool.allocate(size, stream)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.pool.deallocate(ptr, size, stream) }
    }

    fn memory_pool(&self) -> Option<&MemoryPool> {
        Some(&self.pool)
    }
}

impl PoolResource for PinnedMemoryResource {
    fn pool(&self) -> &MemoryPool {
        &self.pool
    }
}
