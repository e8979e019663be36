//! The crate's error type: what went wrong, as variants a caller can match, each saying what to
//! do; a failed driver call, system call or other resource stays the
//! [`source`](std::error::Error::source), and [`Error::cuda_code`] finds a driver code anywhere
//! in the chain.
//!
//! An area whose calls refuse for several reasons of its own has an error type of its own, a
//! file each, nested in [`Error`]: [`ViewError`] (`view`), [`ManagedError`] (`managed`),
//! [`SharingError`] (`sharing`), [`CopyError`] (`copy`), `DlpackError` (`dlpack`) and
//! `CudarcError` (`cudarc`). They name only the crate's vocabulary (devices, addresses,
//! locations, advice), so this module, at the bottom of the crate, imports none of the modules
//! that report them.

mod caching;
mod copy;
#[cfg(feature = "cudarc")]
mod cudarc;
#[cfg(feature = "dlpack")]
pub(crate) mod dlpack;
mod managed;
mod sharing;
mod view;

use cuda_mem_sys::types::CUresult;
use cuda_mem_sys::{CudaError, DriverError, LoadError};

pub use caching::{CachingError, CachingOutOfMemory};
pub use copy::{CopyError, OverlapKind};
#[cfg(feature = "cudarc")]
pub use cudarc::CudarcError;
#[cfg(feature = "dlpack")]
pub use dlpack::DlpackError;
pub use managed::ManagedError;
pub use sharing::SharingError;
pub use view::ViewError;

use crate::device::{Device, DevicePtr};
use crate::driver_version::DriverCapability;
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
        capability: DriverCapability,
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
    /// An allocation from a buffer's own resource, which it does not hold a share of (a
    /// [`ScopedBuffer`](crate::ScopedBuffer) borrows it; a view of memory someone else owns has
    /// none).
    #[error(
        "not supported: the buffer ({size} bytes at {ptr:#x}) holds no share of a memory resource to allocate \
         from (it is scoped, or a view): allocate the destination yourself and use copy_to"
    )]
    NoSharedResource {
        /// The buffer's address.
        ptr: DevicePtr,
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
        ptr: DevicePtr,
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
        ptr: DevicePtr,
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
        ptr: DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// A batch (of copies, prefetches or discards) given nothing to do.
    #[error("{operation} needs at least one buffer: the batch is empty")]
    EmptyBatch {
        /// The operation (`"copy_batch"`, `"prefetch_batch"`, …).
        operation: &'static str,
    },
    /// A typed view refused: its size, its alignment or a sub-range ([`ViewError`]).
    #[error(transparent)]
    View(#[from] ViewError),
    /// A managed-memory operation refused before any driver call ([`ManagedError`]).
    #[error(transparent)]
    Managed(#[from] ManagedError),
    /// Sharing a pool or an allocation between processes refused ([`SharingError`]).
    #[error(transparent)]
    Sharing(#[from] SharingError),
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
    /// A [`CachingResource`](crate::CachingResource) refused: out of memory with what it
    /// held, an invalid option, a free of memory it did not allocate ([`CachingError`]).
    #[error(transparent)]
    Caching(#[from] CachingError),
    /// A copy with options, or a batch of copies, refused before any driver call (see
    /// [`copy_batch`](crate::copy_batch)).
    #[error(transparent)]
    Copy(#[from] CopyError),
    /// A DLPack export or import was refused (feature `dlpack`).
    #[cfg(feature = "dlpack")]
    #[error(transparent)]
    Dlpack(#[from] DlpackError),
    /// A cudarc object this crate cannot work with (feature `cudarc`).
    #[cfg(feature = "cudarc")]
    #[error(transparent)]
    Cudarc(#[from] CudarcError),
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
