//! Host and managed memory pools: `PinnedMemoryResource` and `ManagedMemoryResource`.

use std::sync::Arc;

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps, CUmemoryPool};

use crate::device::NumaNode;
use crate::driver::driver;
use crate::driver_version::DriverCapability;
use crate::error::{Error, Result};
use crate::handle_types::{HandleType, HandleTypes};
use crate::location::Location;
use crate::pool::{MemoryPool, PoolKind};

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

fn current_pool(mut location: CUmemLocation, kind: CUmemAllocationType) -> Result<CUmemoryPool> {
    let d = driver()?;
    let mut handle: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `handle` and `location` are valid for the call.
    unsafe { cu_call!(d, cuMemGetMemPool(&mut handle, &mut location, kind)) }?;
    Ok(handle)
}

impl PinnedMemoryResource {
    /// The process's current pinned host pool (shared, never destroyed). Every device is given
    /// read-write access to its memory (a host pool's memory is the host CPU's alone until then),
    /// which holds for every user of the process-wide pool.
    ///
    /// # Errors
    /// [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::CurrentPools`]: there is
    /// no current host pool; [`PinnedMemoryResource::new`] makes one of its own from 12.6);
    /// driver errors.
    pub fn current() -> Result<Arc<PinnedMemoryResource>> {
        DriverCapability::CurrentPools.require()?;
        let handle = current_pool(host_location(None), CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED)?;
        let pool = MemoryPool::borrowed(handle, PoolKind::Pinned)?;
        pool.grant_all_devices()?;
        Ok(Arc::new(PinnedMemoryResource { pool, numa_node: None }))
    }

    /// A pinned pool of its own, its memory readable and writable by every device.
    ///
    /// # Errors
    /// [`Error::DriverTooOld`] before CUDA 12.6 ([`DriverCapability::PinnedPools`]);
    /// [`Error::NumaLocationRequired`] for IPC without a NUMA node; driver errors.
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
        Ok(Arc::new(PinnedMemoryResource { pool, numa_node }))
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

crate::pool::pool_resource!(PinnedMemoryResource, host_accessible: true, device: |_this| None);

/// A managed pool's preferred location in the driver's form: `CU_MEM_LOCATION_TYPE_NONE` for
/// none, else the location's own, which must be one a pool can have.
fn pool_location(preferred_location: Option<Location>) -> Result<CUmemLocation> {
    match preferred_location {
        None => Ok(CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_NONE, id: 0 }),
        // `cuMemPoolCreate`: "Specifying CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT … will result in
        // CUDA_ERROR_INVALID_VALUE"; `cuMemGetMemPool` does not take it either. A pool's
        // location is fixed, and the calling thread's node is not.
        Some(location @ Location::HostNumaCurrent) => Err(Error::PoolLocation { location }),
        Some(location) => Ok(location.raw()),
    }
}

/// How to create an owned managed pool.
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
    /// [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::CurrentPools`]);
    /// [`Error::PoolLocation`] for [`Location::HostNumaCurrent`] (both before any driver call);
    /// driver errors.
    pub fn current(preferred_location: Option<Location>) -> Result<Arc<ManagedMemoryResource>> {
        DriverCapability::CurrentPools.require()?;
        let location = pool_location(preferred_location)?;
        let handle = current_pool(location, CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED)?;
        Ok(Arc::new(ManagedMemoryResource {
            pool: MemoryPool::borrowed(handle, PoolKind::Managed)?,
            preferred_location,
        }))
    }

    /// A managed pool of its own.
    ///
    /// # Errors
    /// [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::ManagedPools`]);
    /// [`Error::PoolLocation`] for [`Location::HostNumaCurrent`] (both before any driver call);
    /// driver errors.
    pub fn new(options: ManagedMemoryResourceOptions) -> Result<Arc<ManagedMemoryResource>> {
        DriverCapability::ManagedPools.require()?;
        let props = CUmemPoolProps {
            allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
            location: pool_location(options.preferred_location)?,
            ..CUmemPoolProps::default()
        };
        let pool = MemoryPool::create(&props, PoolKind::Managed)?;
        Ok(Arc::new(ManagedMemoryResource { pool, preferred_location: options.preferred_location }))
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

crate::pool::pool_resource!(ManagedMemoryResource, host_accessible: true, device: |this| match this.preferred_location {
    Some(Location::Device(device)) => Some(device),
    _ => None,
}, managed: true);
