//! [`MemorySnapshot`]: everything the process's memory resources hold at one moment, with the
//! recorded [history](crate::history) (PyTorch's `torch.cuda.memory._snapshot()`), in one value
//! that a person reads ([`Display`](std::fmt::Display): the table of
//! `torch.cuda.memory_summary`), a program writes and reads back (feature `snapshot`: a
//! versioned JSON schema) and the viewer draws (feature `snapshot`: one self-contained HTML page,
//! or the pickle file PyTorch's memory viewer opens).
//!
//! Every pool resource of this crate, every [`CachingResource`](crate::CachingResource) and
//! (through [`register`]) other crates' resources — `cuda-mem-vmm`'s virtual memory resources —
//! take part from their creation until they are dropped; [`take_snapshot`] asks each.
//!
//! - `registry`: [`SnapshotSource`], [`register`], [`take_snapshot`];
//! - `model`: the snapshot's types;
//! - `summary`: the text table;
//! - `json`, `viewer`, `torch` (feature `snapshot`): the file formats (`torch`: PyTorch's pickle,
//!   [`MemorySnapshot::to_torch_pickle`], for pytorch.org/memory_viz); `timeline` (feature
//!   `snapshot`): what the viewer draws of a history.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::snapshot::{ResourceKind, take_snapshot};
//! use cuda_mem_core::{CachingOptions, CachingResource, Device, DeviceMemoryResource, MemoryResourceExt, Stream};
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, Default::default())?;
//! let cache = CachingResource::new(DeviceMemoryResource::new(device, Default::default())?, CachingOptions::default())?;
//! let block = cache.allocate(64 << 10, &stream)?;
//! let snapshot = take_snapshot();
//! let ours = snapshot.resource(cuda_mem_core::history::ResourceId::of(&*cache)).expect("registered");
//! assert_eq!(ours.kind, ResourceKind::Caching);
//! assert_eq!((ours.reserved_bytes, ours.used_bytes), (2 << 20, 64 << 10));
//! assert_eq!(ours.segments[0].blocks[0].address, block.ptr());
//! println!("{snapshot}"); // the table
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```

mod model;
mod registry;
mod summary;

#[cfg(feature = "snapshot")]
mod json;
#[cfg(feature = "snapshot")]
mod timeline;
#[cfg(feature = "snapshot")]
mod torch;
#[cfg(feature = "snapshot")]
mod viewer;

#[cfg(feature = "snapshot")]
pub use json::SnapshotFormatError;
pub use model::{
    BlockState, BlockView, EventView, MemorySnapshot, ResourceKind, ResourceSnapshot, SCHEMA_VERSION, SegmentView,
};
pub use registry::{SnapshotSource, pool_snapshot, register, take_snapshot};
#[cfg(feature = "snapshot")]
pub use viewer::DRAWN_ALLOCATIONS;
