//! [`CudarcError`]: what this crate cannot do with a cudarc object (feature `cudarc`).

use crate::device::DevicePtr;

/// What this crate cannot do with a cudarc object, inside [`Error::Cudarc`](crate::Error::Cudarc).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudarcError {
    /// A cudarc context other than its device's primary context (`CudaContext::new_non_primary`,
    /// `from_raw_context`): this crate's streams and memory live in primary contexts.
    #[error(
        "not supported: the cudarc context of device {ordinal} is not the device's primary context, the one this \
         crate works in: make it with CudaContext::new({ordinal})"
    )]
    NotPrimaryContext {
        /// The context's device ordinal.
        ordinal: usize,
    },
    /// A stream handed to the cudarc context of another device.
    #[error(
        "the stream is of device {stream_device} and the cudarc context of device {context_device}: give the \
         context of the stream's device (CudaContext::new({stream_device}))"
    )]
    ContextOfAnotherDevice {
        /// The stream's device ordinal.
        stream_device: usize,
        /// The context's device ordinal.
        context_device: usize,
    },
    /// Memory given back to a [`CudarcMemoryResource`](crate::CudarcMemoryResource) that does not hold it (a caller bug:
    /// `deallocate_raw` of another resource's memory, or of a size other than the one held).
    #[error("{size} bytes at {ptr:#x} are not a cudarc allocation this resource holds")]
    NotHeld {
        /// The address given.
        ptr: DevicePtr,
        /// The size given.
        size: usize,
    },
}
