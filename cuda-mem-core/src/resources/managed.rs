//! `ManagedMemoryResource`: managed memory from a driver pool (CUDA 13).

use std::sync::Arc;

use cuda_mem_sys::types::{CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps};

use crate::driver_version::DriverCapability;
use crate::error::{Error, Result};
use crate::location::Location;
use crate::pool::{MemoryPool, PoolKind};

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
        Ok(Arc::new(ManagedMemoryResource {
            pool: MemoryPool::current(location, PoolKind::Managed)?,
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
