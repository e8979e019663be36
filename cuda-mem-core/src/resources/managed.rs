//! `ManagedMemoryResource`: managed memory from a driver pool (CUDA 13).

use std::sync::Arc;

use cuda_mem_sys::types::{CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::{Device, DevicePtr};
use crate::driver_version::DriverCapability;
use crate::error::{Error, ManagedError, Result};
use crate::location::Location;
use crate::memory_resource::{MemoryResource, PoolResource};
use crate::pool::{MemoryPool, PoolKind};
use crate::stream::Stream;

/// A managed pool's preferred location in the driver's form: `CU_MEM_LOCATION_TYPE_NONE` for
/// none, else the location's own, which must be one a pool can have.
fn pool_location(preferred_location: Option<Location>) -> Result<CUmemLocation> {
    match preferred_location {
        None => Ok(CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_NONE, id: 0 }),
        // `cuMemPoolCreate`: "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT … will result in
        // CUDA_ERROR_INVALID_VALUE"; `cuMemGetMemPool` does not take it either. A pool's
        // location is fixed, and the calling thread's node is not.
        Some(location @ Location::HostNumaCurrent) => Err(Error::Managed(ManagedError::PoolLocation { location })),
        Some(location) => Ok(location.raw()),
    }
}

/// How to create an owned managed pool.
///
/// # From cuda.core
///
/// What cuda.core 1.2 writes with a `ManagedMemoryResource`, a `ManagedBuffer`'s advice and
/// its prefetches and discards, and the batches of `cuda.core.utils`:
///
/// ```python
/// mr = ManagedMemoryResource(ManagedMemoryResourceOptions(preferred_location=0))
/// buf = mr.allocate(1 << 20, stream=stream)
/// other = mr.allocate(4096, stream=stream)
/// buf.read_mostly = True
/// buf.preferred_location = Host(numa_id=0)
/// buf.accessed_by.add(device)
/// buf.prefetch(device, stream=stream)
/// prefetch_batch(stream, [buf, other], [Host(), device])
/// buf.discard_prefetch(Host.numa_current(), stream=stream)
/// discard_batch(stream, [buf, other])
/// discard_prefetch_batch(stream, [buf, other], device)
/// ```
///
/// is, here:
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{
///     Device, Error, Location, ManagedError, ManagedMemoryResource, ManagedMemoryResourceOptions, NumaNode, Stream,
///     StreamOptions,
///     discard_batch, discard_prefetch_batch, prefetch_batch,
/// };
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let options = ManagedMemoryResourceOptions::default().preferred_location(Some(Location::Device(device)));
/// let resource = ManagedMemoryResource::new(options)?;
/// let mut buf = resource.allocate(1 << 20, &stream)?;
/// let mut other = resource.allocate(4096, &stream)?;
///
/// let managed = buf.managed()?; // checked once: ManagedError::NotManaged for other memory
/// managed.set_read_mostly(true)?;
/// managed.set_preferred_location(Location::HostNuma(NumaNode(0)))?;
/// managed.add_accessed_by(device)?;
/// managed.prefetch(device, &stream)?;
/// assert!(managed.read_mostly()?);
/// assert_eq!(managed.preferred_location()?, Some(Location::HostNuma(NumaNode(0))));
/// assert_eq!(managed.accessed_by()?, [Location::Device(device)]);
/// assert_eq!(managed.last_prefetch_location()?, Some(Location::Device(device)));
/// // cuda.core's table of the locations each advice takes, checked before the driver is called.
/// assert!(matches!(managed.add_accessed_by(Location::HostNuma(NumaNode(0))), Err(Error::Managed(ManagedError::AdviceLocation { .. }))));
///
/// prefetch_batch([&buf, &other], &[Location::Host, Location::Device(device)][..], &stream)?;
/// // Discards destroy the contents: they take the buffers exclusively.
/// buf.managed_mut()?.discard_prefetch(Location::HostNumaCurrent, &stream)?;
/// let (mut a, mut b) = (buf.managed_mut()?, other.managed_mut()?);
/// discard_batch([&mut a, &mut b], &stream)?;
/// discard_prefetch_batch([&mut a, &mut b], device, &stream)?;
/// stream.synchronize()?;
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManagedMemoryResourceOptions {
    /// Where the memory prefers to live (`None`: no preference, the driver decides): a device,
    /// the host or a host NUMA node; not [`Location::HostNumaCurrent`], which a pool cannot
    /// have.
    pub preferred_location: Option<Location>,
}

impl ManagedMemoryResourceOptions {
    /// With a preferred location (`None`: none).
    pub fn preferred_location(mut self, location: Option<Location>) -> Self {
        self.preferred_location = location;
        self
    }
}

/// Managed memory from a stream-ordered pool (CUDA 13): accessible from the host and every
/// device, migrating on demand.
#[derive(Debug)]
pub struct ManagedMemoryResource {
    pool: MemoryPool,
    preferred_location: Option<Location>,
}

impl ManagedMemoryResource {
    /// The current managed pool for a preferred location (`None`: the pool with no preferred
    /// location; shared, never destroyed).
    ///
    /// # Errors
    /// - [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::CurrentPools`]).
    /// - [`ManagedError::PoolLocation`] for [`Location::HostNumaCurrent`] (both before any driver
    ///   call).
    /// - Driver errors.
    pub fn current(preferred_location: Option<Location>) -> Result<Arc<ManagedMemoryResource>> {
        DriverCapability::CurrentPools.require()?;
        let location = pool_location(preferred_location)?;
        let resource = Arc::new(ManagedMemoryResource {
            pool: MemoryPool::current(location, PoolKind::Managed)?,
            preferred_location,
        });
        crate::snapshot::register(&resource);
        Ok(resource)
    }

    /// A managed pool of its own.
    ///
    /// # Errors
    /// - [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::ManagedPools`]).
    /// - [`ManagedError::PoolLocation`] for [`Location::HostNumaCurrent`] (both before any driver
    ///   call).
    /// - Driver errors.
    pub fn new(options: ManagedMemoryResourceOptions) -> Result<Arc<ManagedMemoryResource>> {
        DriverCapability::ManagedPools.require()?;
        let props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
            location: pool_location(options.preferred_location)?,
            ..CUmemPoolProps::default()
        };
        let pool = MemoryPool::create(&props, PoolKind::Managed)?;
        let resource = Arc::new(ManagedMemoryResource { pool, preferred_location: options.preferred_location });
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

    /// Where the memory prefers to live (`None`: no preference).
    pub fn preferred_location(&self) -> Option<Location> {
        self.preferred_location
    }
}

// SAFETY: the pool hands out `size` valid bytes per allocation until they are freed; managed memory: the
// answers the trait derives from the pool (its kind is `PoolKind::Managed`, and whether it is
// shared) are its memory's; its device is its preferred location's, if that is a device.
unsafe impl MemoryResource for ManagedMemoryResource {
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

    fn device(&self) -> Option<Device> {
        match self.preferred_location {
            Some(Location::Device(device)) => Some(device),
            _ => None,
        }
    }

    fn memory_pool(&self) -> Option<&MemoryPool> {
        Some(&self.pool)
    }
}

impl PoolResource for ManagedMemoryResource {
    fn pool(&self) -> &MemoryPool {
        &self.pool
    }
}
