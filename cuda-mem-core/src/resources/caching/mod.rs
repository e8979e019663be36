//! [`CachingResource`]: a memory resource that caches what is freed, over any upstream resource
//! (PyTorch's CUDA caching allocator), a file per concept:
//!
//! - [`options`]: [`CachingOptions`], the policy's knobs, and [`SizeClass`];
//! - `bins`: a stream's free blocks by size class, for best-fit lookup;
//! - `segments`: upstream allocations split into blocks and merged back;
//! - `stream_state`: one stream's segments and bins behind a lock of its own, and the events
//!   that order reuse on one stream after use on another;
//! - [`statistics`]: [`CachingStatistics`] (`torch.cuda.memory_stats`);
//! - [`snapshot`]: [`SegmentSnapshot`] (`torch.cuda.memory_snapshot`);
//! - [`resource`]: the resource.

mod bins;
pub mod options;
pub mod resource;
mod segments;
pub mod snapshot;
pub mod statistics;
mod stream_state;

pub use options::{CachingOptions, SizeClass};
pub use resource::CachingResource;
pub use snapshot::{BlockSnapshot, BlockUse, SegmentSnapshot};
pub use statistics::{CachingStatistics, PoolStatistics, Stat, StreamStatistics};
