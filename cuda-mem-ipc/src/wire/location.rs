//! Where memory lives, as the wire names it: a device by UUID, a host NUMA node by id.
//!
//! Private: the public API speaks [`cuda_mem_core::Location`]. A device's ordinal differs
//! between processes (`CUDA_VISIBLE_DEVICES`), so the wire names it by UUID and keeps the
//! sender's ordinal for messages only; the receiver finds its own device with that UUID.

use uuid::Uuid;

/// A device as the wire names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WireDevice {
    /// The device's UUID: how the receiver finds it.
    pub(crate) uuid: Uuid,
    /// The device's ordinal in the sending process, for messages only.
    pub(crate) sender_ordinal: i32,
}

/// Where a shared virtual buffer's memory lives, as its encoding names it.
#[cfg(feature = "vmm")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireLocation {
    /// Device memory.
    Device(WireDevice),
    /// Host memory on a NUMA node.
    HostNuma(cuda_mem_core::NumaNode),
}
