//! Asking the driver about devices: enumeration, the properties the memory crates need, their
//! memory, peer capability; making a device current and waiting for its work.

use std::ffi::c_char;

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUdevice_attribute as A, CUdevice_attribute, CUmemAllocationHandleType, CUresult};

use super::{Device, NumaNode};
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::handle_types::HandleTypes;

/// The CUDA version of `cuDeviceGetUuid_v2` (`PFN_cuDeviceGetUuid_v11040`); older drivers have
/// only CUDA 9.2's `cuDeviceGetUuid` (`PFN_cuDeviceGetUuid_v9020`), with the same arguments.
const UUID_V2: u32 = 11040;

/// What the memory crates need to know about a device.
///
/// A few of these come from attributes newer than CUDA 11.2, the oldest driver the crates
/// support. A driver older than an attribute does not know it and refuses it with
/// `CUDA_ERROR_INVALID_VALUE` (NVIDIA's programming guide says so of
/// `MEMPOOL_SUPPORTED_HANDLE_TYPES` before 11.3; cuda.core met the same, NVIDIA/cuda-python#1437):
/// [`Device::properties`] then gives the field's default, which each field's documentation names.
/// Every other attribute is known to every supported driver, and its refusal is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceProperties {
    /// The device's name.
    pub name: String,
    /// Total memory in bytes.
    pub total_memory: usize,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Whether stream-ordered memory pools are supported (`cuMemAllocAsync` and friends).
    pub memory_pools_supported: bool,
    /// Whether the virtual memory management API (`cuMemCreate`, `cuMemMap`) is supported.
    pub virtual_memory_management_supported: bool,
    /// The shareable handle types memory pools support
    /// (`CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`, CUDA 11.3). Empty on an 11.2 driver,
    /// which cannot say: [`DeviceMemoryResource::new`](crate::DeviceMemoryResource::new) then
    /// leaves the question to the driver's `cuMemPoolCreate`.
    pub mempool_supported_handle_types: HandleTypes,
    /// Whether POSIX file descriptors can share VMM allocations.
    pub posix_fd_handles_supported: bool,
    /// Whether fabric handles can share VMM allocations
    /// (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED`, CUDA 12.3). False before CUDA 12.3,
    /// which has no fabric handles.
    pub fabric_handles_supported: bool,
    /// Whether GPUDirect RDMA is supported (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`,
    /// CUDA 11.3). False on an 11.2 driver, which does not say.
    pub gpu_direct_rdma_supported: bool,
    /// Whether GPUDirect RDMA works with VMM allocations.
    pub gpu_direct_rdma_with_vmm_supported: bool,
    /// The host NUMA node closest to the device, if the system reports one
    /// (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`, CUDA 12.2; the driver's -1 is `None`). `None` before
    /// CUDA 12.2, which does not know the attribute.
    pub host_numa_node: Option<NumaNode>,
    /// Whether the device can access managed memory concurrently with the host.
    pub concurrent_managed_access: bool,
    /// Whether the device shares a unified address space with the host.
    pub unified_addressing: bool,
}

/// A device's free and total memory in bytes, as the driver reports them
/// ([`Device::memory_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryInfo {
    /// Bytes free for allocation now (every process's allocations and pools taken out).
    pub free: usize,
    /// The device's total memory.
    pub total: usize,
}

impl Device {
    /// The number of devices the driver sees.
    ///
    /// # Errors
    /// If the driver cannot be loaded or initialized.
    pub fn count() -> Result<usize> {
        let d = driver()?;
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGetCount(&mut count)) }?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The device with this ordinal.
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`] past the last device.
    pub fn new(ordinal: usize) -> Result<Device> {
        let count = Device::count()?;
        match i32::try_from(ordinal) {
            Ok(raw) if ordinal < count => Ok(Device { ordinal: raw }),
            _ => Err(Error::NoSuchDevice { ordinal, count }),
        }
    }

    /// Every device, in ordinal order.
    ///
    /// # Errors
    /// If the driver cannot be loaded or initialized.
    pub fn all() -> Result<Vec<Device>> {
        Ok((0..Device::count()?).filter_map(|o| i32::try_from(o).ok()).map(|ordinal| Device { ordinal }).collect())
    }

    /// The device with this UUID ([`Device::uuid`]), if this process sees it. Ordinals depend on
    /// the process (`CUDA_VISIBLE_DEVICES` renumbers devices); UUIDs do not, so this is how a
    /// device named by another process is found.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn with_uuid(uuid: [u8; 16]) -> Result<Option<Device>> {
        for device in Device::all()? {
            if device.uuid()? == uuid {
                return Ok(Some(device));
            }
        }
        Ok(None)
    }

    /// The device's name.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn name(&self) -> Result<String> {
        let d = driver()?;
        let mut buffer = [0 as c_char; 256];
        // SAFETY: `buffer` has room for the 256 bytes the call may write.
        unsafe { cu_call!(d, cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, self.ordinal)) }?;
        let bytes: Vec<u8> = buffer.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The device's UUID: `cuDeviceGetUuid_v2` from CUDA 11.4, CUDA 9.2's `cuDeviceGetUuid` (the
    /// same arguments and bytes) on older drivers. Only `_v2` is documented to give a MIG instance
    /// its own UUID.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn uuid(&self) -> Result<[u8; 16]> {
        let d = driver()?;
        let mut uuid = cuda_mem_sys::types::CUuuid::default();
        let has_v2 = d.version()? >= UUID_V2;
        // SAFETY: `uuid` is a valid out-pointer.
        unsafe {
            if has_v2 {
                cu_call!(d, cuDeviceGetUuid_v2(&mut uuid, self.ordinal))
            } else {
                cu_call!(d, cuDeviceGetUuid_v1(&mut uuid, self.ordinal) as "cuDeviceGetUuid")
            }
        }?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// Total memory in bytes.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn total_memory(&self) -> Result<usize> {
        let d = driver()?;
        let mut bytes = 0usize;
        // SAFETY: `bytes` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceTotalMem_v2(&mut bytes, self.ordinal)) }?;
        Ok(bytes)
    }

    /// The device's free and total memory now (`cuMemGetInfo`, asked in the device's primary
    /// context, which is made current on the calling thread). Memory a pool has reserved counts
    /// as taken, whether or not it is in live allocations.
    ///
    /// # Errors
    /// If a driver call fails.
    #[doc(alias("cuMemGetInfo", "mem_get_info"))]
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        crate::context::bind(*self)?;
        let d = driver()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers; the device's context is current.
        unsafe { cu_call!(d, cuMemGetInfo_v2(&mut free, &mut total)) }?;
        Ok(MemoryInfo { free, total })
    }

    /// One raw device attribute.
    ///
    /// # Errors
    /// If the driver call fails (an attribute the driver does not know, say).
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let d = driver()?;
        let mut value = 0;
        // SAFETY: `value` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGetAttribute(&mut value, attribute, self.ordinal)) }?;
        Ok(value)
    }

    /// Whether the device can access managed memory concurrently with the host
    /// (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`). Without it, the host must not touch
    /// managed memory while any device work runs (on such a system a host access during a
    /// kernel faults): host slices of managed buffers are then refused
    /// ([`ManagedError::HostAccessNotConcurrent`](crate::ManagedError::HostAccessNotConcurrent)) unless every device is idle, and the driver
    /// refuses prefetches to the device and the batched managed operations. cuda.core warns once
    /// per process in this case; here the check is this query and those refusals.
    ///
    /// # Errors
    /// If the driver call fails.
    #[doc(alias = "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS")]
    pub fn concurrent_managed_access(&self) -> Result<bool> {
        self.flag(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)
    }

    fn flag(&self, attribute: CUdevice_attribute) -> Result<bool> {
        Ok(self.attribute(attribute)? != 0)
    }

    /// One of the attributes newer than the oldest supported driver (CUDA 11.2) that
    /// [`Device::properties`] reads: `None` when the driver refuses it with
    /// `CUDA_ERROR_INVALID_VALUE`, as a driver older than the attribute does. Any other attribute
    /// is read as [`Device::attribute`] reads it, its refusal an error.
    fn attribute_if_known(&self, attribute: CUdevice_attribute) -> Result<Option<i32>> {
        let newer_than_supported = matches!(
            attribute,
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
                | A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES
                | A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID
                | A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
        );
        match self.attribute(attribute) {
            Ok(value) => Ok(Some(value)),
            Err(error) if newer_than_supported && error.cuda_code() == Some(CUresult::CUDA_ERROR_INVALID_VALUE) => {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// The shareable handle types the device's memory pools support, `None` when the driver
    /// cannot say (before CUDA 11.3, which added `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`).
    pub(crate) fn mempool_handle_types(&self) -> Result<Option<HandleTypes>> {
        let bits = self.attribute_if_known(A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)?;
        // The attribute is a bit mask of `CUmemAllocationHandleType` values.
        Ok(bits.map(|bits| HandleTypes::from_raw(CUmemAllocationHandleType(bits as u32))))
    }

    /// The properties the memory crates use, read from the driver. Attributes newer than the
    /// driver give their defaults ([`DeviceProperties`] says which).
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn properties(&self) -> Result<DeviceProperties> {
        let numa = self.attribute_if_known(A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)?.unwrap_or(-1);
        let newer_flag = |attribute| Ok::<_, Error>(self.attribute_if_known(attribute)?.is_some_and(|v| v != 0));
        Ok(DeviceProperties {
            name: self.name()?,
            total_memory: self.total_memory()?,
            compute_capability: (
                self.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                self.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            memory_pools_supported: self.flag(A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?,
            virtual_memory_management_supported: self
                .flag(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?,
            mempool_supported_handle_types: self.mempool_handle_types()?.unwrap_or_else(HandleTypes::empty),
            posix_fd_handles_supported: self
                .flag(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)?,
            fabric_handles_supported: newer_flag(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)?,
            gpu_direct_rdma_supported: newer_flag(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)?,
            gpu_direct_rdma_with_vmm_supported: self
                .flag(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)?,
            host_numa_node: u32::try_from(numa).ok().map(NumaNode),
            concurrent_managed_access: self.flag(A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)?,
            unified_addressing: self.flag(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?,
        })
    }

    /// The host NUMA node closest to the device (`CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID`): where to
    /// place host memory this device uses most (`Location::HostNuma(device.host_numa_node()?)`).
    ///
    /// # Errors
    /// - [`Error::Unsupported`] ([`DeviceCapability::HostNumaNode`](crate::DeviceCapability::HostNumaNode))
    ///   when the system reports no node for the device, or the driver is older than CUDA 12.2.
    /// - A driver error.
    pub fn host_numa_node(&self) -> Result<NumaNode> {
        let numa = self.attribute_if_known(A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)?.unwrap_or(-1);
        u32::try_from(numa)
            .map(NumaNode)
            .map_err(|_| Error::Unsupported { device: *self, capability: crate::error::DeviceCapability::HostNumaNode })
    }

    /// Whether this device can access memory on `peer`: true for the device itself (its own
    /// memory, as cuda.core's `Device.can_access_peer` says), without asking the driver, whose
    /// `cuDeviceCanAccessPeer` answers only for two different devices.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn can_access_peer(&self, peer: Device) -> Result<bool> {
        if peer == *self {
            return Ok(true);
        }
        let d = driver()?;
        let mut can = 0;
        // SAFETY: `can` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceCanAccessPeer(&mut can, self.ordinal, peer.ordinal)) }?;
        Ok(can != 0)
    }

    /// Makes this device's primary context current on the calling thread (retaining it, once,
    /// for the life of the process).
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn set_current(&self) -> Result<()> {
        crate::context::bind(*self)
    }

    /// Waits for all work on the device's primary context.
    ///
    /// # Errors
    /// If a driver call fails.
    #[doc(alias = "sync")]
    pub fn synchronize(&self) -> Result<()> {
        crate::context::bind(*self)?;
        let d = driver()?;
        // SAFETY: takes no arguments; a context is current.
        unsafe { cu_call!(d, cuCtxSynchronize()) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, SynchronousMemoryResource};

    /// `cuMemGetInfo` in the device's own context: total is the device's memory, and free drops
    /// by what an allocation takes and comes back when it is freed. In a process of its own, so
    /// that no other test allocates meanwhile.
    #[test]
    fn memory_info_follows_allocations() {
        cuda_sim::testing::in_simulated_machine(
            "device::query::tests::memory_info_follows_allocations",
            &[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_MEMORY", "64M")],
            || {
                if !cuda_sim::testing::simulator_only("a known amount of free memory") {
                    return;
                }
                cuda_sim::testing::driver().expect("the test driver loads");
                let (first, second) = (Device::new(0).unwrap(), Device::new(1).unwrap());
                // Device 1's context is current; device 0 is still asked in its own.
                second.set_current().unwrap();
                let before = first.memory_info().unwrap();
                assert_eq!(before.total, first.total_memory().unwrap());
                assert_eq!(before.total, 64 << 20);
                assert_eq!(before.free, before.total, "nothing allocated yet: {before:?}");
                let stream = first.default_stream();
                let buffer = SynchronousMemoryResource::new(first).allocate(3 << 20, &stream).unwrap();
                let during = first.memory_info().unwrap();
                assert_eq!(during.free, before.free - (3 << 20), "{during:?}");
                assert_eq!(second.memory_info().unwrap().free, 64 << 20, "another device's memory is its own");
                drop(buffer);
                assert_eq!(first.memory_info().unwrap(), before);
            },
        );
    }
}
