//! `DeviceMemoryResource`: stream-ordered device memory from a driver pool.

use std::sync::Arc;

use cuda_sys::cu_call;
use cuda_sys::types::{CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps, CUmemoryPool};

use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::handle_types::{HandleType, HandleTypes};
use crate::pool::{MemoryPool, PoolKind};

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
    device: Device,
    pool: MemoryPool,
    ipc_enabled: bool,
}

impl DeviceMemoryResource {
    /// The device's current pool. If its release threshold is 0 it is raised to the maximum,
    /// so that freed memory stays cached between allocations instead of going back to the
    /// system at every synchronization (a change every user of the shared pool sees).
    ///
    /// # Errors
    /// If the device has no memory pools, or a driver call fails.
    pub fn current(device: Device) -> Result<Arc<DeviceMemoryResource>> {
        require_pools(device)?;
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGetMemPool(&mut handle, device.raw())) }?;
        let pool = MemoryPool::borrowed(handle, PoolKind::Device(device));
        if pool.release_threshold()? == 0 {
            pool.set_release_threshold(u64::MAX)?;
        }
        Ok(Arc::new(DeviceMemoryResource { device, pool, ipc_enabled: false }))
    }

    /// A pool of its own on `device`, destroyed when the resource and every buffer from it are
    /// gone.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the device has no pools, or cannot share them by file
    /// descriptor and `ipc_enabled` is set; driver errors.
    pub fn new(device: Device, options: DeviceMemoryResourceOptions) -> Result<Arc<DeviceMemoryResource>> {
        require_pools(device)?;
        let handle_types = if options.ipc_enabled {
            let supported = device.properties()?.mempool_supported_handle_types;
            if !supported.contains(HandleType::PosixFd) {
                return Err(Error::NotSupported(format!(
                    "{device} cannot share memory pools by file descriptor (its pools support {supported:?}); \
                     create the resource with ipc_enabled(false)"
                )));
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
        Ok(Arc::new(DeviceMemoryResource { device, pool, ipc_enabled: options.ipc_enabled }))
    }

    /// The pool: attributes, release threshold, trimming, peer access.
    pub fn pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// Whether the pool can be shared by file descriptor.
    pub fn is_ipc_enabled(&self) -> bool {
        self.ipc_enabled
    }
}

/// Fails unless the device supports memory pools.
fn require_pools(device: Device) -> Result<()> {
    use cuda_sys::types::CUdevice_attribute as A;
    if device.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? == 0 {
        return Err(Error::NotSupported(format!(
            "{device} does not support memory pools; use SynchronousMemoryResource instead"
        )));
    }
    Ok(())
}

crate::pool::pool_resource!(DeviceMemoryResource, host_accessible: false, device: |this| Some(this.device));
