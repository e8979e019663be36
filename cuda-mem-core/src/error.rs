//! The crate's error type: what went wrong, as variants a caller can match, each saying what to
//! do; a failed driver call, system call or other resource stays the
//! [`source`](std::error::Error::source), and [`Error::cuda_code`] finds a driver code anywhere
//! in the chain.

use cuda_mem_sys::types::CUresult;
use cuda_mem_sys::{CudaError, DriverError, LoadError};

use crate::device::Device;
use crate::handle_types::HandleTypes;

/// Everything that can go wrong in `cuda-mem-core`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed, or the driver could not be loaded.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The driver had no memory for an allocation (`CUDA_ERROR_OUT_OF_MEMORY`, the source, so
    /// [`Error::cuda_code`] still names it): how many bytes were asked for and, for a pool, its
    /// cap and what it held. Boxed, so that every `Result` of the crate stays small.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// A device ordinal past the last device.
    #[error("device {ordinal} does not exist: the driver reports {count} device(s)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// Two sizes that must agree do not.
    #[error("size mismatch: {what} is {actual} bytes, expected {expected}")]
    SizeMismatch {
        /// What was compared.
        what: &'static str,
        /// The size required.
        expected: usize,
        /// The size given.
        actual: usize,
    },
    /// The device lacks a capability the operation needs.
    #[error("not supported: {}", unsupported_message(*.device, .capability))]
    Unsupported {
        /// The device.
        device: Device,
        /// What it lacks.
        capability: DeviceCapability,
    },
    /// The installed driver is older than a capability needs (see the crate documentation's
    /// "Driver versions"); nothing was done.
    #[error(
        "not supported: {capability} need CUDA {} or newer, but the installed driver is CUDA {}: update the \
         driver{} (the crate documentation's \"Driver versions\" lists what each capability needs)",
        crate::driver_version::dotted(*.needs),
        crate::driver_version::dotted(*.installed),
        .capability.alternative()
    )]
    DriverTooOld {
        /// What was asked for.
        capability: crate::DriverCapability,
        /// The CUDA version it needs (`cuDriverGetVersion`'s encoding: `12060` for 12.6).
        needs: u32,
        /// The version the installed driver reports.
        installed: u32,
    },
    /// Devices that cannot be given access to a pool's memory; nothing was changed.
    #[error("device(s) {peers:?} cannot access memory of device {owner}; peer access was left unchanged")]
    PeerAccess {
        /// The pool's device.
        owner: usize,
        /// The devices refused.
        peers: Vec<usize>,
    },
    /// Peer access was asked of a pool that is not a device pool (pinned host memory is given to
    /// every device already).
    #[error("not supported: peer access applies to device pools only")]
    PeerAccessNeedsDevicePool,
    /// An IPC-enabled pinned pool was asked for without a NUMA location, which the driver needs
    /// to share host memory.
    #[error(
        "invalid argument: an IPC-enabled pinned pool needs a NUMA node: use numa_node(NumaNode(n)) or \
         numa_node(device.host_numa_node()?)"
    )]
    NumaLocationRequired,
    /// A fill pattern whose width does not divide the buffer's size.
    #[error(
        "invalid argument: a {width}-byte fill pattern needs a size divisible by {width}; the buffer has {size} bytes"
    )]
    FillPatternWidth {
        /// The pattern's width in bytes.
        width: usize,
        /// The buffer's size in bytes.
        size: usize,
    },
    /// A typed view of bytes that are not a whole number of its elements.
    #[error(
        "invalid argument: {size} bytes are not a whole number of `{element}` ({element_size} bytes each): view \
         them as a smaller type, or view a buffer (or sub-range) whose size is a multiple of {element_size}"
    )]
    ViewSize {
        /// The element type's name.
        element: &'static str,
        /// Its size in bytes.
        element_size: usize,
        /// The size of the bytes viewed.
        size: usize,
    },
    /// A typed view of memory whose address is not aligned for its elements.
    #[error(
        "invalid argument: address {ptr:#x} is not aligned for `{element}` (which needs {align}-byte alignment): \
         view it as a type of smaller alignment, or copy it into an aligned buffer"
    )]
    ViewAlignment {
        /// The element type's name.
        element: &'static str,
        /// Its alignment in bytes.
        align: usize,
        /// The address.
        ptr: crate::device::DevicePtr,
    },
    /// A sub-range of a view that does not lie within it (in elements).
    #[error("out of range: elements {start}..{end} of a view of {len} elements: slice within 0..{len}")]
    SliceOutOfRange {
        /// The first element asked for (`usize::MAX` when the bound overflowed).
        start: usize,
        /// One past the last element asked for (`usize::MAX` when the bound overflowed).
        end: usize,
        /// The view's length.
        len: usize,
    },
    /// An allocation from a buffer's own resource, which it does not hold a share of (a
    /// [`ScopedBuffer`](crate::ScopedBuffer) borrows it; a view of memory someone else owns has
    /// none).
    #[error(
        "not supported: the buffer ({size} bytes at {ptr:#x}) holds no share of a memory resource to allocate \
         from (it is scoped, or a view): allocate the destination yourself and use copy_to"
    )]
    NoSharedResource {
        /// The buffer's address.
        ptr: crate::device::DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// Ownership asked of a buffer that owns nothing (a view of memory someone else owns).
    #[error(
        "not supported: the buffer ({size} bytes at {ptr:#x}) is a view of memory someone else owns and has no \
         ownership to hand out: keep the view, or take the memory from its owner"
    )]
    NotOwning {
        /// The buffer's address.
        ptr: crate::device::DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// Host access to memory the host cannot reach (device memory, or memory another process
    /// shares, which is never lent to the host).
    #[error(
        "not supported: host access to a buffer that is not host-accessible ({size} bytes at {ptr:#x}); copy it \
         to a host-accessible buffer first"
    )]
    NotHostAccessible {
        /// The buffer's address.
        ptr: crate::device::DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// A pool was asked to allocate on a capturing stream: it would allocate outside the graph.
    /// The resources without pools refuse the same way (their frees wait for the stream, which
    /// a capture forbids).
    #[error(
        "memory pools cannot allocate on a capturing stream: allocate before capture begins, or on a stream that \
         is not capturing (or, inside the capture, from a GraphMemoryResource)"
    )]
    CapturingStream,
    /// A [`GraphMemoryResource`](crate::GraphMemoryResource) was asked to allocate on a stream
    /// that is not capturing a graph (or whose capture was invalidated): graph memory is
    /// allocated by the graph's launches, so it can only be asked for while capturing.
    #[error(
        "GraphMemoryResource cannot allocate on a stream that is not capturing a graph{}: begin a capture first \
         (Stream::begin_capture), or allocate from a DeviceMemoryResource outside captures",
        if *.invalidated { " (its capture was invalidated)" } else { "" }
    )]
    NotCapturing {
        /// Whether the stream's capture was under way but invalidated.
        invalidated: bool,
    },
    /// A resource of one device was asked to allocate on a stream of another.
    #[error(
        "the memory resource allocates on device {resource} but the stream belongs to device {stream}: allocate \
         on a stream of device {resource}, or use that device's resource"
    )]
    StreamOfAnotherDevice {
        /// The resource's device ordinal.
        resource: usize,
        /// The stream's device ordinal.
        stream: usize,
    },
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
        ptr: crate::device::DevicePtr,
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
        ptr: crate::device::DevicePtr,
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
    /// An allocation a [`LimitingAdaptor`](crate::LimitingAdaptor) refused: it would have taken
    /// the bytes allocated through it past its limit. The resource it wraps was not asked.
    #[error(
        "memory limit exceeded: {requested} bytes asked for with {in_use} of the limit's {limit} bytes in use: \
         free buffers allocated through the limiting adaptor, or give it a larger limit"
    )]
    LimitExceeded {
        /// The size asked for, in bytes.
        requested: usize,
        /// The adaptor's limit, in bytes.
        limit: usize,
        /// The bytes allocated through the adaptor and not yet freed, when it refused.
        in_use: usize,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, such as "duplicating the pool's file descriptor".
        context: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A memory resource outside this crate failed (a virtual memory resource's error, an
    /// imported pool's, an application's own resource's), through a [`MemoryResource`] method,
    /// whose signature names this type. The resource's error is the source: downcast it to
    /// match on it; [`Error::cuda_code`] finds a driver code anywhere in it.
    ///
    /// [`MemoryResource`]: crate::MemoryResource
    #[error("{0}")]
    Resource(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A host slice of memory that others may write (a buffer of a pool shared with other
    /// processes), which the safe accessors do not lend: another process's write would change
    /// bytes behind a live `&[u8]`.
    #[error(
        "host slices of memory that other processes may write are not lent by the safe API ({size} bytes at \
         {ptr:#x}, from a pool shared between processes): copy the bytes out with copy_to_slice or to_vec, or use \
         host_slice_assume_exclusive (unsafe) while nothing else writes them"
    )]
    WritableElsewhere {
        /// The buffer's address.
        ptr: crate::device::DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
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
        ptr: crate::device::DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// Advice given with a location of a kind it does not take (checked before any driver
    /// call; see [`Advice::accepts`](crate::Advice::accepts)).
    #[error("advice {advice:?} does not take the location {location:?}: it takes {}", advice.accepted())]
    AdviceLocation {
        /// The advice.
        advice: crate::managed::Advice,
        /// The location refused.
        location: crate::location::Location,
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
        location: crate::location::Location,
    },
    /// A batched managed-memory operation given no buffers.
    #[error("{operation} needs at least one buffer: the batch is empty")]
    EmptyBatch {
        /// The operation (`"prefetch_batch"`, …).
        operation: &'static str,
    },
    /// A batched prefetch given a number of locations other than one or one per buffer.
    #[error(
        "{locations} locations for {buffers} buffers: give one location for every buffer (ManagedLocations::Same) \
         or one per buffer"
    )]
    BatchLengthMismatch {
        /// How many buffers.
        buffers: usize,
        /// How many locations.
        locations: usize,
    },
    /// A host slice of managed memory on a system where a device lacks concurrent managed
    /// access ([`Device::concurrent_managed_access`]): the host may touch managed memory only
    /// while no device work runs.
    #[error(
        "host access to managed memory ({size} bytes at {ptr:#x}) is unsafe while device work runs, and a device \
         here lacks concurrent managed access: use host_slice_devices_idle (unsafe), which synchronizes every \
         device first, and launch no work while the slice lives"
    )]
    ManagedAccessNotConcurrent {
        /// The buffer's address.
        ptr: crate::device::DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// An interprocess event was asked for with timing: the driver does not time interprocess
    /// events (checked before any driver call).
    #[error(
        "invalid argument: an interprocess event cannot record timing: create it with \
         EventOptions::default().interprocess() (timing off), and time the work with a separate event"
    )]
    InterprocessEventTiming,
    /// An interprocess handle was asked of an event created without
    /// [`EventOptions::interprocess`](crate::EventOptions::interprocess) (checked before any
    /// driver call).
    #[error(
        "not supported: this event is not IPC-enabled: create it with EventOptions::default().interprocess() to \
         share it between processes"
    )]
    EventNotInterprocess,
    /// A DLPack export or import was refused (feature `dlpack`).
    #[cfg(feature = "dlpack")]
    #[error(transparent)]
    Dlpack(#[from] crate::dlpack::DlpackError),
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
    /// A copy with options, or a batch of copies, refused before any driver call (see
    /// [`copy_batch`](crate::copy_batch)).
    #[error(transparent)]
    Copy(crate::copy::CopyError),
    /// A cudarc object this crate cannot work with (feature `cudarc`).
    #[cfg(feature = "cudarc")]
    #[error(transparent)]
    Cudarc(#[from] crate::cudarc_interop::CudarcError),
}

impl From<LoadError> for Error {
    fn from(error: LoadError) -> Self {
        Error::Cuda(CudaError::Load(error))
    }
}

impl From<cuda_mem_sys::DriverError> for Error {
    fn from(error: cuda_mem_sys::DriverError) -> Self {
        Error::Cuda(CudaError::Driver(error))
    }
}

impl Error {
    /// An [`Error::Resource`]: `error`, from a memory resource outside this crate, kept as the
    /// source (text becomes an error of its own: `Error::resource("out of slots")`).
    pub fn resource(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::Resource(error.into())
    }

    /// A failed allocation of `requested` bytes: [`Error::OutOfMemory`] when the driver ran out
    /// of memory (the caller may fill in what its pool held), the driver's error otherwise.
    #[cold]
    pub(crate) fn allocation(source: CudaError, requested: usize) -> Error {
        if source.code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
            Error::OutOfMemory(Box::new(OutOfMemory { requested, pool: None, source }))
        } else {
            Error::Cuda(source)
        }
    }

    /// The driver's code, when the error came from a driver call: this error's own, or one found
    /// anywhere in its source chain (a virtual memory resource's failed chunk import reaching
    /// the caller through [`MemoryResource`](crate::MemoryResource), say). See [`cuda_code_of`].
    pub fn cuda_code(&self) -> Option<CUresult> {
        cuda_code_of(self)
    }
}

/// The driver's code in `error` or the first error of its source chain that has one: an
/// [`Error::Cuda`], a [`CudaError`] or a [`DriverError`], wherever in the chain it is. `None`
/// when no driver call failed (or a driver error is hidden behind a wrapper that neither names it
/// as its source nor is one of these types).
pub fn cuda_code_of(error: &(dyn std::error::Error + 'static)) -> Option<CUresult> {
    let mut next = Some(error);
    while let Some(error) = next {
        let code = if let Some(core) = error.downcast_ref::<Error>() {
            match core {
                Error::Cuda(cuda) => cuda.code(),
                Error::OutOfMemory(refused) => refused.source.code(),
                _ => None,
            }
        } else if let Some(cuda) = error.downcast_ref::<CudaError>() {
            cuda.code()
        } else {
            error.downcast_ref::<DriverError>().map(|driver| driver.code)
        };
        if code.is_some() {
            return code;
        }
        next = error.source();
    }
    None
}

/// A capability a device lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceCapability {
    /// Stream-ordered memory pools.
    MemoryPools,
    /// Pools shareable by POSIX file descriptor.
    PoolFileDescriptors {
        /// The handle types its pools do support.
        supported: HandleTypes,
    },
    /// A host NUMA node near the device.
    HostNumaNode,
}

fn unsupported_message(device: Device, capability: &DeviceCapability) -> String {
    match capability {
        DeviceCapability::MemoryPools => {
            format!("{device} does not support memory pools; use SynchronousMemoryResource instead")
        }
        DeviceCapability::PoolFileDescriptors { supported } => format!(
            "{device} cannot share memory pools by file descriptor (its pools support {supported:?}); create the \
             resource with ipc_enabled(false)"
        ),
        DeviceCapability::HostNumaNode => {
            format!("{device} reports no host NUMA node; give the node with NumaNode(n)")
        }
    }
}

/// An allocation the driver had no memory for ([`Error::OutOfMemory`]). For a pool, what it
/// held is read after the failure (never on a successful allocation).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", out_of_memory_message(*.requested, .pool.as_ref()))]
#[non_exhaustive]
pub struct OutOfMemory {
    /// The bytes asked for.
    pub requested: usize,
    /// For a pool, its cap and what it held at the failure (`None`: not a pool).
    pub pool: Option<PoolHoldings>,
    /// The driver's error (`CUDA_ERROR_OUT_OF_MEMORY`).
    #[source]
    pub source: CudaError,
}

/// A pool's cap and what it held when it refused an allocation ([`OutOfMemory::pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolHoldings {
    /// The pool's `max_size` (`None`: no cap of its own).
    pub max_size: Option<usize>,
    /// The bytes it had reserved from the device (`None`: the attribute could not be read).
    pub reserved: Option<u64>,
    /// The bytes in its live allocations, every process's (`None` as for `reserved`).
    pub used: Option<u64>,
}

fn out_of_memory_message(requested: usize, pool: Option<&PoolHoldings>) -> String {
    let Some(&PoolHoldings { max_size, reserved, used }) = pool else {
        return format!("out of memory: {requested} bytes were asked for: free buffers or allocate less");
    };
    let held = match (reserved, used) {
        (Some(reserved), Some(used)) => format!(" that holds {reserved} bytes reserved, {used} of them in use"),
        _ => String::new(),
    };
    match max_size {
        Some(cap) => format!(
            "out of memory: {requested} bytes were asked of a pool capped at {cap} bytes (max_size){held}: free \
             buffers, allocate less, or create the pool with a larger max_size"
        ),
        None => format!(
            "out of memory: {requested} bytes were asked of a pool{held}, and the device has no more: free buffers, \
             trim other pools (trim_to) or allocate less"
        ),
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn oom() -> DriverError {
        DriverError::from_header("cuMemCreate", CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// An error of another crate that wraps a core error as its source.
    #[derive(Debug, thiserror::Error)]
    #[error("importing chunk 2 of 3: {source}")]
    struct Wrapper {
        #[source]
        source: Error,
    }

    #[test]
    fn the_code_is_found_through_the_whole_chain() {
        assert_eq!(Error::from(oom()).cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let wrapped = Error::resource(Wrapper { source: Error::from(oom()) });
        assert_eq!(wrapped.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let twice = Error::resource(Wrapper { source: wrapped });
        assert_eq!(twice.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        // A bare driver error, or one as `CudaError`, inside another crate's error.
        assert_eq!(Error::resource(oom()).cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(Error::resource(CudaError::from(oom())).cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    }

    #[test]
    fn errors_without_a_driver_call_have_no_code() {
        assert_eq!(Error::CapturingStream.cuda_code(), None);
        assert_eq!(Error::resource("a resource of the application's that ran out").cuda_code(), None);
        let io = Error::Io { context: "duplicating", source: std::io::Error::from_raw_os_error(24) };
        assert_eq!(io.cuda_code(), None);
    }

    #[test]
    fn a_resource_error_is_the_source_and_keeps_its_text() {
        let error = Error::resource(Wrapper { source: Error::from(oom()) });
        assert!(error.to_string().starts_with("importing chunk 2 of 3: cuMemCreate failed"), "{error}");
        let source = error.source().and_then(|s| s.downcast_ref::<Wrapper>());
        assert!(source.is_some(), "the resource's error is the source, for downcasting");
    }

    #[test]
    fn io_errors_keep_context_and_source() {
        let error = Error::Io {
            context: "duplicating the pool's file descriptor",
            source: std::io::Error::from_raw_os_error(24),
        };
        assert!(error.to_string().starts_with("duplicating the pool's file descriptor: "), "{error}");
        let source = error.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(source.and_then(std::io::Error::raw_os_error), Some(24));
    }

    #[test]
    fn errors_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Error>();
    }
}
