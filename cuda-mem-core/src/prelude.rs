//! The everyday imports in one line: `use cuda_mem_core::prelude::*;`.
//!
//! The traits are here so that their methods are in scope: [`MemoryResourceExt`]'s `allocate`
//! on an `Arc<dyn MemoryResource>` or a resource of your own (this crate's resources have the
//! same methods inherent, no import needed) and its typed `allocate_zeroed` and
//! `allocate_from_slice` on any resource, [`MemoryResource`]'s `is_device_accessible`,
//! `is_host_accessible` and `device` on any resource, and [`PoolResource`]'s `pool`. The types
//! are the ones almost every program names, with the adaptors that stack over any resource.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::prelude::*;
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default())?;
//! let resource: std::sync::Arc<dyn MemoryResource> = DeviceMemoryResource::current(device)?;
//! let buffer = resource.allocate(4096, &stream)?; // `MemoryResourceExt`, from the prelude
//! assert!(resource.is_device_accessible() && !resource.is_host_accessible());
//! assert_eq!(buffer.size(), 4096);
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```

pub use crate::{
    Buffer, CachingOptions, CachingResource, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Error, Event,
    FillPattern, LimitingAdaptor, ManagedMemoryResource, MemoryResource, MemoryResourceExt, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PoolResource, StatisticsAdaptor, Stream, StreamOptions, TrackingAdaptor,
};
