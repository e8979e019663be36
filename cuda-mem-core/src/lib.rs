//! Devices, streams, buffers and stream-ordered memory pools over the CUDA driver API.
//!
//! This crate is to Rust what `cuda.core`'s memory classes are to Python: typed, owned wrappers
//! that free what they allocate, exactly once, on the right stream.
//!
//! - [`Device`]: enumeration, properties, peer capability, making the primary context current.
//! - [`Stream`] and [`Event`]: stream-ordered work and its synchronization.
//!
//! The driver is loaded at run time (see `cuda-sys`): `libcuda.so.1`, or the library
//! `CUDA_MEM_DRIVER` names (such as the `cuda-sim` simulator).
//!
//! ```no_run
//! use cuda_mem_core::{Device, Stream, StreamOptions};
//!
//! let device = Device::new(0)?;
//! println!("{}: {}", device, device.name()?);
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! stream.synchronize()?;
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```

mod buffer;
mod context;
mod device;
mod device_resource;
mod driver;
mod drop_errors;
mod error;
mod event;
mod handle_types;
mod host_resources;
mod legacy_resources;
mod memory_resource;
mod pool;
mod stream;

pub use buffer::{Buffer, FillPattern};
pub use device::{Device, DeviceProperties};
pub use device_resource::{DeviceMemoryResource, DeviceMemoryResourceOptions};
pub use driver::driver;
pub use drop_errors::{DropError, set_drop_error_hook, take_drop_errors};
pub use error::{Error, Result};
pub use event::{Event, EventOptions};
pub use handle_types::HandleTypes;
pub use host_resources::{
    ManagedMemoryResource, ManagedMemoryResourceOptions, PinnedLocation, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PreferredLocation,
};
pub use legacy_resources::{LegacyPinnedMemoryResource, SynchronousMemoryResource};
pub use memory_resource::{DevicePtr, MemoryResource, MemoryResourceExt};
pub use pool::{Access, MemoryPool, PoolAttributes, ReusePolicy};
pub use stream::{Stream, StreamOptions};
