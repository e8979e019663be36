//! [`ManagedError`]: why a managed-memory operation was refused before any driver call.

use crate::advice::Advice;
use crate::device::DevicePtr;
use crate::location::Location;

/// A managed-memory operation refused before any driver call (inside
/// [`Error::Managed`](crate::Error::Managed)): memory that is not managed, a location the advice
/// or the pool cannot take, locations that do not match the buffers, host access that could
/// overlap device work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManagedError {
    /// A managed-memory operation (advice, prefetch, discard, range query) on memory that is not
    /// managed.
    #[error(
        "{operation} requires a managed-memory allocation ({size} bytes at {ptr:#x} is not managed memory): allocate \
         it from a ManagedMemoryResource, or wrap memory from cuMemAllocManaged"
    )]
    NotManaged {
        /// The operation refused (`"prefetch"`, `"set_read_mostly"`, …).
        operation: &'static str,
        /// The buffer's address.
        ptr: DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// Advice given with a location of a kind it does not take (checked before any driver
    /// call; see [`Advice::accepts`](crate::Advice::accepts)).
    #[error("advice {advice:?} does not take the location {location:?}: it takes {}", advice.accepted())]
    AdviceLocation {
        /// The advice.
        advice: Advice,
        /// The location refused.
        location: Location,
    },
    /// A managed pool asked to prefer a location a pool cannot have (checked before any driver
    /// call): the calling thread's NUMA node ([`Location::HostNumaCurrent`](crate::Location::HostNumaCurrent)),
    /// which `cuMemPoolCreate` refuses.
    #[error(
        "invalid argument: a managed pool cannot prefer {location:?}, which names no fixed location: use \
         Location::HostNuma(node), Location::Host, a device, or None"
    )]
    PoolLocation {
        /// The location refused.
        location: Location,
    },
    /// A batched prefetch given a number of locations other than one or one per buffer.
    #[error(
        "{locations} locations for {buffers} buffers: give one location for every buffer (ManagedLocations::Same, \
         or a slice of one) or one per buffer"
    )]
    BatchLengthMismatch {
        /// How many buffers.
        buffers: usize,
        /// How many locations.
        locations: usize,
    },
    /// A host slice of managed memory on a system where a device lacks concurrent managed
    /// access ([`Device::concurrent_managed_access`](crate::Device::concurrent_managed_access)): the host may touch managed memory only
    /// while no device work runs.
    #[error(
        "host access to managed memory ({size} bytes at {ptr:#x}) is unsafe while device work runs, and a device \
         here lacks concurrent managed access: use host_slice_devices_idle (unsafe), which synchronizes every \
         device first, and launch no work while the slice lives"
    )]
    HostAccessNotConcurrent {
        /// The buffer's address.
        ptr: DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
}
