//! Every [`MemoryResource`](crate::MemoryResource) of this crate, a file each:
//!
//! - [`device`]: [`DeviceMemoryResource`], device memory from a driver pool;
//! - [`pinned`]: [`PinnedMemoryResource`], page-locked host memory from a driver pool;
//! - [`managed`]: [`ManagedMemoryResource`], managed memory from a driver pool;
//! - [`legacy`]: [`SynchronousMemoryResource`] and [`LegacyPinnedMemoryResource`], without pools;
//! - [`graph`]: [`GraphMemoryResource`], memory that graphs allocate and free as they run;
//! - [`adaptors`]: resources over resources (statistics, a limit, tracking);
//! - [`caching`]: [`CachingResource`], a cache of freed blocks over any resource;
//! - [`expandable`]: [`ExpandableMemory`], resources whose allocations grow in place (what the
//!   cache's expandable segments need).
//!
//! The driver's pools themselves are in `pool`; the buffers these resources hand out, in
//! `buffer`.

pub mod adaptors;
pub mod caching;
pub mod device;
pub mod expandable;
pub mod graph;
pub mod legacy;
pub mod managed;
pub mod pinned;

pub use adaptors::{
    AllocationStatistics, LeakReport, LimitingAdaptor, LiveAllocation, StatisticsAdaptor, TrackingAdaptor,
};
pub use caching::{
    BlockSnapshot, BlockUse, CachingOptions, CachingResource, CachingStatistics, PoolStatistics, SegmentSnapshot,
    SizeClass, Stat, StreamStatistics,
};
pub use device::{DeviceMemoryResource, DeviceMemoryResourceOptions};
pub use expandable::ExpandableMemory;
pub use graph::{GraphMemoryAttributes, GraphMemoryResource, HighWaterMark};
pub use legacy::{LegacyPinnedMemoryResource, SynchronousMemoryResource};
pub use managed::{ManagedMemoryResource, ManagedMemoryResourceOptions};
pub use pinned::{PinnedMemoryResource, PinnedMemoryResourceOptions};
