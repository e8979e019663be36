//! Devices: what names one ([`Device`], by ordinal), the host NUMA node near it ([`NumaNode`])
//! and an address in its memory ([`DevicePtr`]). What the driver says of a device, and does with
//! it, is in [`query`].

mod query;

pub use query::{DeviceProperties, MemoryInfo};

/// A device address (or, for host-accessible memory, the same address seen from the device).
pub type DevicePtr = cuda_mem_sys::types::CUdeviceptr;

/// A CUDA device, by ordinal. Cheap to copy; it owns nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    ordinal: i32,
}

/// A host NUMA node, by the id the operating system gives it (the driver's `CUmemLocation` id
/// for `CU_MEM_LOCATION_TYPE_HOST_NUMA`). A device names the one closest to it:
/// [`Device::host_numa_node`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumaNode(pub u32);

impl NumaNode {
    /// The id as the driver takes it: a node beyond `int` is no node the driver knows, so it
    /// becomes `i32::MAX`, which the driver refuses as it refuses any unknown node (where `as`
    /// would wrap to a negative id). `cuda-mem-ipc` writes it on the wire the same way.
    pub fn raw(self) -> i32 {
        i32::try_from(self.0).unwrap_or(i32::MAX)
    }
}

impl std::fmt::Display for NumaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NUMA node {}", self.0)
    }
}

impl Device {
    /// The ordinal.
    #[doc(alias = "device_id")]
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// The ordinal as the driver's `CUdevice`.
    pub fn raw(&self) -> cuda_mem_sys::types::CUdevice {
        self.ordinal
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}", self.ordinal)
    }
}
