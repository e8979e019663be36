//! The crate's error type.

use cuda_sys::{CudaError, LoadError};

/// Everything that can go wrong in `cuda-mem-core`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed, or the driver could not be loaded.
    #[error(transparent)]
    Cuda(#[from] CudaError),
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
    /// An argument is outside what the operation accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation needs a capability the device or resource lacks.
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Devices that cannot be given access to a pool's memory; nothing was changed.
    #[error("device(s) {peers:?} cannot access memory of device {owner}; peer access was left unchanged")]
    PeerAccess {
        /// The pool's device.
        owner: usize,
        /// The devices refused.
        peers: Vec<usize>,
    },
    /// The operation is refused in the object's current state.
    #[error("{0}")]
    InvalidState(String),
    /// A host slice of memory that others may write (a buffer of a pool shared with other
    /// processes), which the safe accessors do not lend: another process's write would change
    /// bytes behind a live `&[u8]`.
    #[error(
        "host slices of memory that other processes may write are not lent by the safe API ({size} bytes at \
         {ptr:#x}, from a pool shared between processes): copy the bytes out with copy_to_host, or use \
         host_slice_assume_exclusive (unsafe) while nothing else writes them"
    )]
    WritableElsewhere {
        /// The buffer's address.
        ptr: crate::memory_resource::DevicePtr,
        /// Its size in bytes.
        size: usize,
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
}

impl From<LoadError> for Error {
    fn from(error: LoadError) -> Self {
        Error::Cuda(CudaError::Load(error))
    }
}

impl From<cuda_sys::DriverError> for Error {
    fn from(error: cuda_sys::DriverError) -> Self {
        Error::Cuda(CudaError::Driver(error))
    }
}

impl Error {
    /// The driver's code, when the error came from a driver call.
    pub fn cuda_code(&self) -> Option<cuda_sys::types::CUresult> {
        match self {
            Error::Cuda(e) => e.code(),
            _ => None,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
