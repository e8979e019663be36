//! [`PoolKind`]: what memory a pool holds, and where.

use std::fmt;

use cuda_mem_sys::types::CUmemAllocationType;

use crate::device::Device;

/// What memory a pool holds: device memory of one device, pinned host memory, or managed
/// memory. A pool created here knows it from how it was created; an imported pool asks the
/// driver (never the exporter's word).
#[cfg_attr(unix, doc = "See [`MemoryPool::import`](crate::MemoryPool::import).")]
///
/// It is also the kind a look-up of a shared pool expects: two kinds are equal only when the
/// memory is the same kind, on the same device for device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoolKind {
    /// Device memory of this device (by its ordinal in this process).
    Device(Device),
    /// Pinned (page-locked) host memory, accessible from the host and every device given access.
    Pinned,
    /// Managed memory, migrating between the host and the devices on demand.
    Managed,
}

impl PoolKind {
    /// The device whose memory it is, for device memory.
    pub fn device(self) -> Option<Device> {
        match self {
            PoolKind::Device(device) => Some(device),
            PoolKind::Pinned | PoolKind::Managed => None,
        }
    }

    /// Whether the host can reach the memory (pinned and managed memory).
    pub(crate) fn is_host_accessible(self) -> bool {
        matches!(self, PoolKind::Pinned | PoolKind::Managed)
    }

    /// The driver's allocation type of the memory (device and pinned memory are both "pinned",
    /// page-locked, to the driver).
    pub(crate) fn allocation_type(self) -> CUmemAllocationType {
        match self {
            PoolKind::Device(_) | PoolKind::Pinned => CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            PoolKind::Managed => CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolKind::Device(device) => write!(f, "device memory pool on {device}"),
            PoolKind::Pinned => f.write_str("pinned host memory pool"),
            PoolKind::Managed => f.write_str("managed memory pool"),
        }
    }
}
