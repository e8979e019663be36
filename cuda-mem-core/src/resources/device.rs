//! `DeviceMemoryResource`: stream-ordered device memory from a driver pool.

use std::collections::BTreeSet;
use std::sync::Arc;

use cuda_mem_sys::types::{CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::{Device, DevicePtr};
use crate::error::{DeviceCapability, Error, Result};
use crate::handle_types::{HandleType, HandleTypes};
use crate::memory_resource::{MemoryResource, PoolResource};
use crate::pool::{MemoryPool, PoolKind};
use crate::stream::Stream;

/// How to create an owned device pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceMemoryResourceOptions {
    /// The most the pool may reserve (`None`: as much as the device has).
    pub max_size: Option<usize>,
    /// Whether the pool can be shared with other processes by file descriptor.
    pub ipc_enabled: bool,
}

impl DeviceMemoryResourceOptions {
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
}

/// Device memory from a stream-ordered pool: either the device's current pool (shared with
/// every other user of it in the process, never destroyed) or a pool of its own.
#[derive(Debug)]
pub struct DeviceMemoryResource {
    pool: MemoryPool,
}

impl DeviceMemoryResource {
    /// The device's current pool. If its release threshold is 0 it is raised to the maximum,
    /// so that freed memory stays cached between allocations instead of going back to the
    /// system at every synchronization (a change every user of the shared pool sees).
    ///
    /// # Errors
    /// - [`Error::Unsupported`] ([`DeviceCapability::MemoryPools`]) if the device has no memory
    ///   pools.
    /// - Driver errors.
    #[doc(alias = "memory_resource")]
    pub fn current(device: Device) -> Result<Arc<DeviceMemoryResource>> {
        require_pools(device)?;
        let pool = MemoryPool::current_of_device(device)?;
        if pool.release_threshold()? == 0 {
            pool.set_release_threshold(u64::MAX)?;
        }
        let resource = Arc::new(DeviceMemoryResource { pool });
        crate::snapshot::register(&resource);
        Ok(resource)
    }

    /// A pool of its own on `device`, destroyed when the resource and every buffer from it are
    /// gone.
    ///
    /// # Errors
    /// - [`Error::Unsupported`] when the device has no pools ([`DeviceCapability::MemoryPools`]),
    ///   or cannot share them by file descriptor and `ipc_enabled` is set
    ///   ([`DeviceCapability::PoolFileDescriptors`]; an 11.2 driver cannot say which handle types
    ///   its pools take, so there the driver's `cuMemPoolCreate` decides).
    /// - Driver errors.
    pub fn new(device: Device, options: DeviceMemoryResourceOptions) -> Result<Arc<DeviceMemoryResource>> {
        require_pools(device)?;
        let handle_types = if options.ipc_enabled {
            // `None`: a driver before 11.3, which does not know the attribute.
            if let Some(supported) = device.mempool_handle_types()?
                && !supported.contains(HandleType::PosixFd)
            {
                return Err(Error::Unsupported {
                    device,
                    capability: DeviceCapability::PoolFileDescriptors { supported },
                });
            }
            HandleTypes::from(HandleType::PosixFd)
        } else {
            HandleTypes::empty()
        };
        let props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: handle_types.raw(),
            location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() },
            maxSize: options.max_size.unwrap_or(0),
            ..CUmemPoolProps::default()
        };
        let pool = MemoryPool::create(&props, PoolKind::Device(device))?;
        let resource = Arc::new(DeviceMemoryResource { pool });
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

    /// The pool: attributes, release threshold, trimming, peer access.
    pub fn pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// The devices other than the owner that have read-write access to the pool's memory:
    /// [`MemoryPool::peer_accessible_by`].
    ///
    /// # Errors
    /// Driver errors.
    pub fn peer_accessible_by(&self) -> Result<BTreeSet<Device>> {
        self.pool.peer_accessible_by()
    }

    /// Makes exactly `peers` (the owner ignored) have read-write access:
    /// [`MemoryPool::set_peer_accessible_by`].
    ///
    /// # Errors
    /// - [`Error::PeerAccess`] naming the devices that cannot be peers.
    /// - Driver errors.
    pub fn set_peer_accessible_by(&self, peers: impl IntoIterator<Item = Device>) -> Result<()> {
        self.pool.set_peer_accessible_by(peers)
    }

    /// Gives `peer` read-write access: [`MemoryPool::add_peer`].
    ///
    /// # Errors
    /// As [`DeviceMemoryResource::set_peer_accessible_by`].
    pub fn add_peer(&self, peer: Device) -> Result<()> {
        self.pool.add_peer(peer)
    }

    /// Revokes `peer`'s access: [`MemoryPool::remove_peer`].
    ///
    /// # Errors
    /// Driver errors.
    pub fn remove_peer(&self, peer: Device) -> Result<()> {
        self.pool.remove_peer(peer)
    }
}

/// Fails unless the device supports memory pools.
fn require_pools(device: Device) -> Result<()> {
    use cuda_mem_sys::types::CUdevice_attribute as A;
    crate::DriverCapability::MemoryPools.require()?;
    if device.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? == 0 {
        return Err(Error::Unsupported { device, capability: DeviceCapability::MemoryPools });
    }
    Ok(())
}

// SAFETY: the pool hands out `size` valid bytes per allocation until they are freed; device memory of its
// device, which the host cannot reach: the answers the trait derives from the pool (its kind is
// `PoolKind::Device`, and whether it is shared) are its memory's.
unsafe impl MemoryResource for DeviceMemoryResource {
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

impl PoolResource for DeviceMemoryResource {
    fn pool(&self) -> &MemoryPool {
        &self.pool
    }
}
