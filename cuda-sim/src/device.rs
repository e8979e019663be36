//! Simulated devices: names, attributes, memory size, peer topology.
//!
//! Every device looks like one H100-class GPU (compute capability 9.0, 132 multiprocessors) with
//! the memory size `CUDA_SIM_MEMORY` gives. Attributes are listed in [`attribute`]; an attribute
//! `cuda.h` defines but the simulator does not model reads as 0 ("not supported"), the most
//! conservative answer for a capability.

use cuda_sys::types::{CUdevice_attribute, CUmemAllocationHandleType};

use crate::config::Config;
use crate::error::{SimResult, fail};
use cuda_sys::types::CUresult;

/// Per-device bookkeeping that changes at run time.
#[derive(Debug, Default)]
pub(crate) struct DeviceState {
    /// Bytes allocated on the device (live allocations, rounded to pages).
    pub used: u64,
}

/// Checks a device ordinal against the configuration.
pub(crate) fn check_ordinal(config: &Config, device: i32) -> SimResult<usize> {
    match usize::try_from(device) {
        Ok(d) if d < config.devices => Ok(d),
        _ => fail(CUresult::CUDA_ERROR_INVALID_DEVICE),
    }
}

/// The device's name, as `cuDeviceGetName` reports it.
pub(crate) fn name(device: usize) -> String {
    format!("cuda-sim Simulated GPU {device}")
}

/// A stable UUID per device ordinal (version-4 layout, fixed bits).
pub(crate) fn uuid(device: usize) -> [u8; 16] {
    let mut bytes = *b"cuda-sim-device\0";
    bytes[15] = u8::try_from(device).unwrap_or(u8::MAX);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes
}

/// The value of one device attribute.
pub(crate) fn attribute(device: usize, attribute: CUdevice_attribute) -> SimResult<i32> {
    use CUdevice_attribute as A;
    let ordinal = i32::try_from(device).unwrap_or(i32::MAX);
    let value = match attribute {
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 65536,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_PITCH => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK | A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => {
            65536
        }
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_980_000,
        A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => 132,
        A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS
        | A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
        | A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        | A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        | A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH
        | A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => ordinal + 1,
        A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 2_619_000,
        A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 5120,
        A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 50 << 20,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 2,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => 9,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => 0,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 233_472,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 232_448,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES => {
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as i32
        }
        A::CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT => 4,
        // No device NUMA node; the host side of every device is NUMA node 0.
        A::CU_DEVICE_ATTRIBUTE_NUMA_ID => -1,
        A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID => 0,
        other if other.0 < A::CU_DEVICE_ATTRIBUTE_MAX.0 && other.0 > 0 => 0,
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_and_errors() {
        let config = Config::parse(Some("2"), None, None).unwrap();
        let a = |x| attribute(1, x);
        assert_eq!(a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), Ok(9));
        assert_eq!(a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED), Ok(1));
        assert_eq!(a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), Ok(2));
        assert_eq!(a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED), Ok(0));
        assert_eq!(a(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(a(CUdevice_attribute(0)), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(check_ordinal(&config, 2), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(check_ordinal(&config, -1), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_ne!(uuid(0), uuid(1));
    }
}
