//! Simulated devices: names, attributes, memory size, peer topology.
//!
//! Every device looks like one H100-class GPU (compute capability 9.0, 132 multiprocessors) with
//! the memory size `CUDA_SIM_MEMORY` gives. Attributes are listed in [`attribute`]; an attribute
//! `cuda.h` defines but the simulator does not model reads as 0 ("not supported"), the most
//! conservative answer for a capability.
//!
//! A device's identity (its name, UUID and PCI bus id) is that of its *physical* index on the
//! simulated machine, whatever ordinal `CUDA_VISIBLE_DEVICES` gives it in a process (see
//! [`config`](crate::config)), so two processes that see it under different ordinals agree on
//! which GPU it is.

use cuda_mem_sys::types::{CUdevice_attribute, CUmemAllocationHandleType};

use crate::config::Config;
use crate::error::{SimResult, fail};
use cuda_mem_sys::types::CUresult;

/// Per-device bookkeeping that changes at run time.
#[derive(Debug, Default)]
pub(crate) struct DeviceState {
    /// Bytes allocated on the device (live allocations, rounded to pages).
    pub used: u64,
}

/// Checks a device ordinal (this process's, after `CUDA_VISIBLE_DEVICES`) against the
/// configuration.
pub(crate) fn check_ordinal(config: &Config, device: i32) -> SimResult<usize> {
    match usize::try_from(device) {
        Ok(d) if d < config.devices() => Ok(d),
        _ => fail(CUresult::CUDA_ERROR_INVALID_DEVICE),
    }
}

/// The physical index of the device with ordinal `device`: what names, UUIDs and other hardware
/// identity follow. An ordinal this process does not have is `CUDA_ERROR_INVALID_DEVICE`.
pub(crate) fn check_physical(config: &Config, device: i32) -> SimResult<usize> {
    let ordinal = check_ordinal(config, device)?;
    config.physical(ordinal).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// The name of physical device `physical`, as `cuDeviceGetName` reports it.
pub(crate) fn name(physical: usize) -> String {
    format!("cuda-sim Simulated GPU {physical}")
}

/// A stable UUID per physical device (version-4 layout, fixed bits), distinct for every device
/// and already in its first 32 bits, so that short prefixes (`GPU-1a2b3c4d`) name one device,
/// as with real GPUs' random UUIDs.
pub(crate) fn uuid(physical: usize) -> [u8; 16] {
    // splitmix64's finalizer: a bijection, so distinct devices get distinct words.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let high = mix(0x6375_6461_2d73_696d ^ physical as u64);
    let low = mix(high ^ 0x2d64_6576_6963_6500);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&high.to_be_bytes());
    bytes[8..].copy_from_slice(&low.to_be_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes
}

/// The UUID of physical device `physical` as `nvidia-smi` prints it and `CUDA_VISIBLE_DEVICES`
/// takes it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase hex.
pub(crate) fn uuid_string(physical: usize) -> String {
    let hex: String = uuid(physical).iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The CUDA version (`cuDriverGetVersion`'s encoding) that added each device attribute newer than
/// CUDA 11.0, the oldest driver `CUDA_SIM_DRIVER_VERSION` pretends to be; an attribute not listed
/// is older. A driver older than an attribute does not know it and answers
/// `CUDA_ERROR_INVALID_VALUE` (as NVIDIA's programming guide says of 11.3's
/// `MEMPOOL_SUPPORTED_HANDLE_TYPES` on earlier drivers, and as cuda.core meets on old drivers,
/// NVIDIA/cuda-python#1409, #1437).
///
/// Where the versions come from (`cuda.h` does not say when an enum value came):
/// - 11.4 to 13.0: the `CUdevice_attribute_enum` of each release's `cuda.h`, as cudarc's bindings
///   transcribe them one release at a time (coreylowman/cudarc, `src/driver/sys`, CUDA 11.4 to
///   13.x); cross-checked with cuda-python's notes: 139 and 140 came with 12.8 (#1437), 138 with
///   12.9 (#1409), 142 with 12.9 and 144 with 13.0 (#2795). The numbers are not in order of
///   release: 120 (cluster launch, 11.8) is younger than 121 to 124 (11.6, 11.7).
/// - 11.3: NVIDIA's programming guide ("Starting with CUDA 11.3, IPC memory pool support can be
///   queried with `cudaDevAttrMemoryPoolSupportedHandleTypes`") for 119; 116 to 118, the GPUDirect
///   RDMA attributes, came with `cuFlushGPUDirectRDMAWrites` (`PFN_…_v11030` in `cudaTypedefs.h`),
///   which 117 and 118 describe.
/// - 11.1, 11.2: the release of what each describes: sparse arrays (`cuArrayGetSparseProperties`,
///   `PFN_…_v11010`), read-only host registration (11.1), timeline semaphores (11.2), memory pools
///   (`cuMemPoolCreate`, `PFN_…_v11020`, and the programming guide's `driverVersion >= 11020`
///   before asking `cudaDevAttrMemoryPoolsSupported`).
///
/// The readings among these (everything before 11.4 but 115 and 119) are listed in
/// [`conservative`](crate::conservative).
const ATTRIBUTE_VERSIONS: &[(CUdevice_attribute, i32)] = {
    use CUdevice_attribute as A;
    &[
        (A::CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED, 11010),
        (A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 11010),
        (A::CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED, 11020),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 11020),
        (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 11030),
        (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, 11030),
        (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, 11030),
        (A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 11030),
        (A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 11080),
        (A::CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, 11060),
        (A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 11070),
        (A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 11070),
        (A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, 11070),
        (A::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 12000),
        (A::CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT, 12000),
        (A::CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED, 12000),
        (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 12030),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS, 12000),
        (A::CU_DEVICE_ATTRIBUTE_NUMA_CONFIG, 12020),
        (A::CU_DEVICE_ATTRIBUTE_NUMA_ID, 12020),
        (A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 12010),
        (A::CU_DEVICE_ATTRIBUTE_MPS_ENABLED, 12030),
        (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 12020),
        (A::CU_DEVICE_ATTRIBUTE_D3D12_CIG_SUPPORTED, 12050),
        (A::CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, 12080),
        (A::CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH, 12080),
        (A::CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED, 12090),
        (A::CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID, 12080),
        (A::CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID, 12080),
        (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 12090),
        (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED, 12090),
        (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED, 12080),
        (A::CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED, 13000),
        (A::CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 13000),
        (A::CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED, 13000),
        (A::CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED, 13000),
    ]
};

/// The CUDA version that added `attribute` ([`ATTRIBUTE_VERSIONS`]); 0 for one CUDA 11.0 already
/// had (or one `cuda.h` does not define, which [`attribute`] refuses whatever the version).
pub(crate) fn attribute_version(attribute: CUdevice_attribute) -> i32 {
    ATTRIBUTE_VERSIONS.iter().find(|(a, _)| *a == attribute).map_or(0, |&(_, version)| version)
}

/// Whether a driver of `version` knows `attribute`: `CUDA_ERROR_INVALID_VALUE` if not, as a
/// driver answers an attribute newer than itself.
pub(crate) fn check_known(attribute: CUdevice_attribute, version: i32) -> SimResult {
    if attribute_version(attribute) > version { fail(CUresult::CUDA_ERROR_INVALID_VALUE) } else { Ok(()) }
}

/// The value of one attribute of physical device `physical` (only its PCI bus id depends on
/// which device it is).
pub(crate) fn attribute(physical: usize, attribute: CUdevice_attribute) -> SimResult<i32> {
    use CUdevice_attribute as A;
    let physical = i32::try_from(physical).unwrap_or(i32::MAX);
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
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => physical.saturating_add(1),
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
        let config = Config::parse(Some("2"), None, None, None).unwrap();
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

    #[test]
    fn attributes_newer_than_the_driver_are_refused() {
        use CUdevice_attribute as A;
        let invalid = Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        // The attributes `cuda-mem` reads, on the drivers it supports.
        for (attribute, added) in [
            (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 11020),
            (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 11030),
            (A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 11030),
            (A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 12020),
            (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 12030),
        ] {
            assert_eq!(attribute_version(attribute), added, "{attribute:?}");
            assert_eq!(check_known(attribute, added - 10), invalid, "{attribute:?} before {added}");
            assert_eq!(check_known(attribute, added), Ok(()), "{attribute:?} at {added}");
            assert_eq!(check_known(attribute, 13000), Ok(()), "{attribute:?} at 13.0");
        }
        // CUDA 11.0's attributes are known to every driver the simulator pretends to be.
        for attribute in [
            A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
            A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
            A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
        ] {
            assert_eq!(check_known(attribute, crate::config::OLDEST_DRIVER_VERSION), Ok(()), "{attribute:?}");
        }
        // Not in order of number: 11.8's cluster launch (120) is younger than 11.6's 121.
        assert_eq!(check_known(A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 11070), invalid);
        assert_eq!(check_known(A::CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, 11070), Ok(()));
        // Every attribute of `cuda.h` 13.0 is known to the driver the simulator is by default, and
        // the table lists each attribute once, none newer than that header.
        for code in 1..A::CU_DEVICE_ATTRIBUTE_MAX.0 {
            assert_eq!(check_known(CUdevice_attribute(code), crate::config::DEFAULT_DRIVER_VERSION), Ok(()));
        }
        for (i, (attribute, version)) in ATTRIBUTE_VERSIONS.iter().enumerate() {
            assert!(ATTRIBUTE_VERSIONS[..i].iter().all(|(a, _)| a != attribute), "{attribute:?} twice");
            assert!((11010..=crate::config::DEFAULT_DRIVER_VERSION).contains(version), "{attribute:?}");
        }
    }

    #[test]
    fn uuids_are_distinct_in_their_first_32_bits_and_print_as_nvidia_smi_does() {
        let prefixes: std::collections::BTreeSet<[u8; 4]> = (0..64).map(|d| uuid(d)[..4].try_into().unwrap()).collect();
        assert_eq!(prefixes.len(), 64);
        let text = uuid_string(5);
        assert_eq!(text.len(), "GPU-".len() + 36);
        let groups: Vec<&str> = text["GPU-".len()..].split('-').collect();
        assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
        assert!(groups.concat().bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let hex: String = uuid(5).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(groups.concat(), hex);
        assert_eq!(&groups[2][..1], "4", "version 4");
    }

    #[test]
    fn identity_follows_the_physical_device() {
        let config = Config::parse(Some("4"), None, None, Some("3,1")).unwrap();
        assert_eq!(check_physical(&config, 0), Ok(3));
        assert_eq!(check_physical(&config, 1), Ok(1));
        assert_eq!(check_physical(&config, 2), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(check_ordinal(&config, 2), Err(CUresult::CUDA_ERROR_INVALID_DEVICE));
        assert_eq!(name(3), "cuda-sim Simulated GPU 3");
        assert_eq!(attribute(3, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), Ok(4));
    }
}
