//! [`SharingError`]: why sharing a pool or an allocation between processes was refused.

use crate::device::DevicePtr;

/// Sharing pools and their allocations between processes refused (inside
/// [`Error::Sharing`](crate::Error::Sharing)): a pool that is not shared or not imported, an
/// address that is no import, an imported pool this crate cannot keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharingError {
    /// Allocation from a pool imported from another process, which only maps what its exporter
    /// allocates.
    #[error(
        "cannot allocate from a pool imported from another process (a mapped memory resource): allocate in the \
         exporting process and send the buffer"
    )]
    ImportedPoolAllocation,
    /// Sharing a pool that was created without an IPC handle type.
    #[error("not supported: this memory pool is not IPC-enabled: create it with ipc_enabled(true) to share it")]
    PoolNotIpcEnabled,
    /// Mapping another process's allocation through a pool that was not imported.
    #[error("not supported: only a pool imported from another process (MemoryPool::import) maps exported allocations")]
    PoolNotImported,
    /// An address that is not an allocation this process imported through the pool (to release
    /// or to export again).
    #[error("{ptr:#x} is not an allocation this process imported through this pool")]
    NotAnImport {
        /// The address given.
        ptr: DevicePtr,
    },
    /// The driver mapped an allocation to import at an address this process holds already
    /// through another pool (another import of the same pool): the held mapping is left as it
    /// is, and this import refused, since the driver does not count imports and releasing one
    /// would unmap both.
    #[error(
        "the driver mapped the allocation at {ptr:#x}, which this process holds already through another imported \
         pool; that mapping was left alone"
    )]
    ImportHeldElsewhere {
        /// The address the driver answered with.
        ptr: DevicePtr,
    },
    /// A buffer of a [`CachingResource`](crate::CachingResource): a block carved out of a larger
    /// segment of the upstream pool, which the driver would export as the whole segment (another
    /// process would map, and could write, the other blocks of it).
    #[error(
        "a block of a caching resource ({size} bytes at {ptr:#x}) cannot be shared with another process: it is part          of a larger cached segment; allocate what you share from the pool resource itself"
    )]
    CachedBlock {
        /// The buffer's address.
        ptr: DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// An imported pool that is neither a device pool nor a pinned host pool; it was not kept.
    #[error(
        "not supported: the imported memory pool is neither a device pool nor a pinned host pool \
         ({reachable_devices} devices can reach it at once): share device or pinned memory pools only"
    )]
    UnsupportedImportedPool {
        /// How many devices have read-write access to it.
        reachable_devices: usize,
    },
    /// Importing a pool gave the handle of a pool this process already owns (a driver may
    /// return one handle for every import of a pool): nothing new was owned, so that dropping the
    /// import cannot destroy the pool under its first owner.
    #[error(
        "the driver answered the import with memory pool {handle:#x}, which this process already owns \
         (imported or created earlier): use the existing pool instead of importing it again"
    )]
    PoolAlreadyOwned {
        /// The pool's handle (`CUmemoryPool`, as an integer).
        handle: usize,
    },
    /// Buffers lent to another process were let go of while that process may still map them
    /// (it had not handed them back, and had not exited): they are left allocated, not freed,
    /// until this process exits, so that no later allocation takes memory that process uses.
    #[error(
        "{buffers} buffers ({bytes} bytes) lent to process {pid:?} were let go of while it may still use them: \
         they stay allocated until this process exits"
    )]
    LentBuffersKept {
        /// How many buffers.
        buffers: usize,
        /// Their bytes in all.
        bytes: u64,
        /// The borrowing process, where the kernel vouched for it.
        pid: Option<u32>,
    },
}
