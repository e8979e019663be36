// Where the Unix-only items are not built (Windows), the names' table links them to the pool's
// page. Link definitions, which show nothing, first: the table would take them for a row.
#![cfg_attr(
    not(unix),
    doc = "[`MemoryPool::import`]: MemoryPool\n[`MemoryPool::shareable_handle`]: MemoryPool\n[`ShareableHandle`]: MemoryPool"
)]
//! Devices, streams, buffers and stream-ordered memory pools over the CUDA driver API: what
//! `cuda.core`'s memory classes are to Python, as typed, owned Rust values that free what they
//! allocate, exactly once, on the right stream.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::prelude::*;
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let pool = DeviceMemoryResource::new(device, Default::default())?;
//!
//! // Rust data into the pool and back: typed views check sizes, alignment and ranges.
//! let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//! let mut buffer = pool.allocate_from_slice(&data, &stream)?;
//! buffer.view_mut::<f32>()?.slice_mut(512..)?.fill(0.0, &stream)?;
//! assert_eq!(buffer.to_vec::<f32>(&stream)?[510..514], [510.0, 511.0, 0.0, 0.0]);
//!
//! // Pinned host memory, read on the host once the copy is done.
//! let mut on_host = PinnedMemoryResource::current()?.allocate(buffer.size(), &stream)?;
//! on_host.copy_from(&buffer, &stream)?;
//! assert_eq!(on_host.host_slice()?[..4], 0.0f32.to_ne_bytes());
//!
//! // Adaptors stack over any resource: a budget over counters over the pool.
//! let counted = StatisticsAdaptor::new(pool.clone());
//! let limited = LimitingAdaptor::new(counted.clone(), 1 << 20);
//! let held = limited.allocate(768 << 10, &stream)?;
//! assert!(matches!(limited.allocate(512 << 10, &stream), Err(Error::LimitExceeded { .. })));
//! assert_eq!(counted.statistics().current_bytes, 768 << 10);
//! drop(held); // freed on its stream, back into the pool
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```
//!
//! # Start here
//!
//! The walk-throughs are numbered examples; CI runs each on the simulator.
//!
//! | example | shows |
//! |---|---|
//! | `01_allocate_and_copy` | a pool buffer from a `Vec`, typed views and slices, pinned host memory, scoped scratch |
//! | `02_pools_and_attributes` | a capped pool, its release threshold, attributes, usage and trim; adaptors |
//! | `03_share_over_ipc` (`cuda-mem-ipc`) | a pool and its buffers shared with a child process |
//! | `04_grow_a_vmm_buffer` (`cuda-mem-vmm`) | a buffer that grows without moving or copying |
//! | `05_dlpack_and_cudarc` (features `dlpack`, `cudarc`) | a buffer handed to cudarc and out as a DLPack tensor |
//!
//! Run one with `cargo run -p cuda-mem-core --example 01_allocate_and_copy`. Without a GPU (no
//! `CUDA_MEM_DRIVER`), it runs on the `cuda-sim` simulator.
//!
//! # What is here
//!
//! - [`Device`], [`Stream`], [`Event`]: devices, stream-ordered work and its synchronization,
//!   within a process and across processes ([`IpcEventHandle`]).
//! - [`MemoryResource`]: anything that allocates in stream order. Every resource here has
//!   `allocate` (an owned [`Buffer`], which keeps the resource alive) and `allocate_scoped` (a
//!   [`ScopedBuffer`], which borrows it: no reference counting).
//! - [`Buffer`]: copies, fills, host slices, typed views ([`DeviceView`], [`DeviceViewMut`]) and
//!   ownership leaving ([`Buffer::into_raw`]). Its page lists them by task.
//! - Pools: [`DeviceMemoryResource`], [`PinnedMemoryResource`], [`ManagedMemoryResource`]. Each
//!   has its [`MemoryPool`]'s features (attributes, usage, release threshold, trim) through
//!   [`PoolResource`], in the [`prelude`]; device pools have their peers too.
//! - Managed memory: advice, prefetches and discards on a [`ManagedBuffer`], one at a time or
//!   in batches ([`prefetch_batch`]).
//! - Graphs: [`Stream::begin_capture`] records work into a [`Graph`];
//!   [`GraphMemoryResource`] allocates inside captures.
//! - Copies with options, and many in one call: [`CopyOptions`], [`copy_batch`],
//!   [`copy_batch_within`].
//! - Without pools: [`SynchronousMemoryResource`], [`LegacyPinnedMemoryResource`].
//! - Adaptors over any resource: [`StatisticsAdaptor`], [`LimitingAdaptor`],
//!   [`TrackingAdaptor`]; a cache of freed blocks over any resource: [`CachingResource`].
//! - With features: DLPack export and import (`dlpack`), cudarc interop (`cudarc`), `tracing`
//!   events (`tracing`).
//!
//! Errors are [`Error`]s. A driver failure names the function and the code. An area with
//! causes of its own nests them ([`ViewError`], [`ManagedError`], [`SharingError`],
//! [`CopyError`]), so a caller matches the few its call can give. Out of memory is
//! [`Error::OutOfMemory`]: what was asked, and what the pool held. Errors in `Drop` are recorded
//! ([`take_drop_errors`]), never lost and never a panic.
//!
//! # Seeing what memory does
//!
//! - `pool.usage()` ([`MemoryPool::usage`]): used and reserved bytes, their high-water marks,
//!   and the live allocations made through the pool.
//! - [`Device::memory_info`]: the device's free and total memory.
//! - Feature `tracing`: an event for every allocation and free (`TRACE`), and for pools,
//!   sharing and peer access (`DEBUG`). Pointers and handles are written in hex. Without the
//!   feature nothing is compiled in.
//!
//! # Which module holds what
//!
//! The modules are private; everything public is re-exported here (and the everyday part of it
//! again in [`prelude`]). They stand in two layers, and no module imports another in a circle.
//!
//! The low modules are the vocabulary and the driver's objects: devices, the driver, errors,
//! contexts, events and streams. They import none of the high modules.
//!
//! | low module | holds |
//! |---|---|
//! | `access` | [`Access`]: what a device may do with memory |
//! | `advice` | [`Advice`]: what managed memory can be advised, and the locations each takes |
//! | `handle_types` | [`HandleType`], [`HandleTypes`]: the OS handles memory is exported as |
//! | `location` | [`Location`]: where memory lives |
//! | `device` | what names a device: [`Device`], [`NumaNode`], [`DevicePtr`]; `device/query.rs`, what the driver says of one: [`DeviceProperties`], [`MemoryInfo`] |
//! | `driver_version` | [`DriverCapability`] and the CUDA version each needs |
//! | `error` | [`Error`] (with [`OutOfMemory`] and [`PoolHoldings`]), [`Result`], [`cuda_code_of`]; a file per area's own error: [`ViewError`], [`ManagedError`], [`SharingError`], [`CopyError`] ([`OverlapKind`]), [`CachingError`] ([`CachingOutOfMemory`]), `DlpackError`, `CudarcError` |
//! | `driver` | [`driver()`]: the process-wide driver, initialized once; [`installed_version`] and [`DriverCapability::require`] |
//! | `ffi` | the driver calls made from three places or more, one thin function each |
//! | `drop_errors` | errors in `Drop`: [`record_drop_error`], [`take_drop_errors`], [`set_drop_error_hook`] |
//! | `context` | primary contexts, retained once and bound before each driver call that needs one |
//! | `event` | [`Event`], [`EventOptions`], [`IpcEventHandle`] |
//! | `stream` | [`Stream`], [`StreamOptions`]; `capture.rs`: [`CaptureMode`], [`CaptureState`] and what a capture keeps alive; `ordering.rs`: streams waiting for each other's events |
//! | `trace` | the events of the `tracing` feature (a macro that is empty without it) |
//! | [`history`] (public) | the memory history: [`history::start_recording`], [`history::MemoryEvent`], a bounded ring of what resources did, off by default |
//!
//! The high modules build memory on them: pools, resources, buffers and what works on buffers.
//!
//! | high module | holds |
//! |---|---|
//! | `pool` | [`MemoryPool`], the driver's pool (a file per concern: attributes and [`PoolUsage`], [`PoolKind`], peers, sharing, counted imports) |
//! | `memory_resource` | the [`MemoryResource`] trait, [`PoolResource`], [`AsDynMemoryResource`] |
//! | `buffer` | [`Buffer`], [`ScopedBuffer`], [`ForeignMemory`], [`FillPattern`], [`CloseError`], [`RawBuffer`]; `allocate.rs`: [`MemoryResourceExt`]; `host.rs`: host slices; `export.rs`: a buffer's export data |
//! | `view` | [`DeviceView`], [`DeviceViewMut`]: typed views of a buffer, copies to and from Rust slices |
//! | `managed` | managed memory's operations: [`ScopedBuffer::managed`] gives a checked [`ManagedBuffer`] (advice, preferred location, accessed-by, prefetch, last prefetch location; [`ManagedBufferMut`] discards), the batches [`prefetch_batch`], [`discard_batch`], [`discard_prefetch_batch`] |
//! | `copy` | copies with options and batches of copies: [`CopyOptions`], [`SourceAccessOrder`], [`OverlapMode`], [`copy_batch`], [`copy_batch_within`], [`BatchCopy`], [`BatchOptions`] |
//! | `graph` | stream capture into graphs: [`Capture`], [`Graph`], [`GraphExec`], [`InstantiateOptions`] |
//! | `resources` | every resource, a file each: [`DeviceMemoryResource`], [`PinnedMemoryResource`] (on a [`NumaNode`]), [`ManagedMemoryResource`] (preferring a [`Location`]) and their options; [`SynchronousMemoryResource`], [`LegacyPinnedMemoryResource`] (no pools); [`GraphMemoryResource`] ([`GraphMemoryAttributes`], [`HighWaterMark`]); `adaptors/`: [`StatisticsAdaptor`] ([`AllocationStatistics`]), [`LimitingAdaptor`], [`TrackingAdaptor`] ([`LeakReport`], [`LiveAllocation`]); `caching/`: [`CachingResource`] ([`CachingOptions`], [`SizeClass`], [`CachingStatistics`], [`StreamStatistics`], [`SegmentSnapshot`]); `expandable.rs`: [`ExpandableMemory`] |
//! | `dlpack` | feature `dlpack`: a file per concern: export, import, the stream exchange, element types, layouts |
//! | `cudarc_interop` | feature `cudarc`: cudarc's streams, views and allocations with this crate's |
//! | [`prelude`] (public) | the traits and the common types, for one glob import |
//!
//!
//! The driver is loaded at run time (see `cuda-mem-sys`): `libcuda.so.1` (`nvcuda.dll` on
//! Windows), or the library `CUDA_MEM_DRIVER` names (such as the `cuda-sim` simulator).
//!
//! # Platforms
//!
//! Linux: everything. Windows: all but a pool's shareable file descriptor
//! ([`MemoryPool::shareable_handle`], [`MemoryPool::import`], [`ShareableHandle`] are Unix only).
//! macOS builds but has no CUDA driver. Tests run on Linux; the other targets are checked with
//! `cargo check`.
//!
//! # Features
//!
//! All off by default: `dlpack` (DLPack export and import, on `dlpark`), `cudarc` (interop with
//! cudarc; its section follows when the feature is on), `tracing` (events, above).

#![cfg_attr(feature = "cudarc", doc = include_str!("cudarc_interop/README.md"))]
#![doc = include_str!("driver_versions.md")]
#![doc = include_str!("cuda_core_names.md")]
// On docs.rs (which sets `docsrs`), items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
mod advice;
mod buffer;
mod context;
mod copy;
#[cfg(feature = "cudarc")]
mod cudarc_interop;
mod device;
#[cfg(feature = "dlpack")]
mod dlpack;
mod driver;
mod driver_version;
mod drop_errors;
mod error;
mod event;
mod ffi;
mod graph;
mod handle_types;
pub mod history;
mod location;
mod managed;
mod memory_resource;
mod pool;
pub mod prelude;
mod resources;
pub mod snapshot;
mod stream;
mod trace;
mod view;

/// What the memory crates' macros and tests reach through this crate; not part of the API.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "tracing")]
    pub use crate::trace::{capture, fields};
    #[cfg(feature = "tracing")]
    pub use tracing;
}

pub use access::Access;
pub use advice::Advice;
pub use buffer::MemoryResourceExt;
pub use buffer::{Buffer, CloseError, FillPattern, ForeignMemory, RawBuffer, ScopedBuffer};
pub use copy::{BatchCopy, BatchOptions, CopyOptions, OverlapMode, SourceAccessOrder, copy_batch, copy_batch_within};
pub use device::{Device, DeviceProperties, DevicePtr, MemoryInfo, NumaNode};
#[cfg(feature = "dlpack")]
pub use dlpack::{
    ConsumerStream, DlpackElement, DlpackImport, DlpackTensor, ExportOptions, ExportSource, OwnedBy, RawStream,
    export_dlpack, export_dlpack_as,
};
/// The DLPack implementation the `dlpack` feature is built on: its C types
/// (`dlpark::ffi::DLDataType`, `DLDevice`, ...) and owning tensor handles.
#[cfg(feature = "dlpack")]
pub use dlpark;
pub use driver::{driver, installed_version};
pub use driver_version::DriverCapability;
pub use drop_errors::{DropError, record as record_drop_error, set_drop_error_hook, take_drop_errors};
#[cfg(feature = "cudarc")]
pub use error::CudarcError;
#[cfg(feature = "dlpack")]
pub use error::DlpackError;
pub use error::{
    CachingError, CachingOutOfMemory, CopyError, DeviceCapability, Error, ManagedError, OutOfMemory, OverlapKind,
    PoolHoldings, Result, SharingError, ViewError, cuda_code_of,
};
pub use event::{Event, EventOptions, IPC_EVENT_HANDLE_LEN, IpcEventHandle};
pub use graph::{Capture, Graph, GraphExec, InstantiateOptions};
pub use handle_types::{HandleType, HandleTypes};
pub use location::Location;
pub use managed::{
    ManagedBuffer, ManagedBufferMut, ManagedLocations, discard_batch, discard_prefetch_batch, prefetch_batch,
};
pub use memory_resource::{AsDynMemoryResource, MemoryResource, PoolResource};
#[cfg(unix)]
pub use pool::ShareableHandle;
pub use pool::{
    EXPORT_DATA_LEN, MemoryPool, PoolAttributes, PoolKind, PoolUsage, ReusePolicy, import_holders,
    import_pending_waits, mapped_range_size,
};
pub use resources::{
    AllocationStatistics, BlockSnapshot, BlockUse, CachingOptions, CachingResource, CachingStatistics,
    DeviceMemoryResource, DeviceMemoryResourceOptions, ExpandableMemory, GraphMemoryAttributes, GraphMemoryResource,
    HighWaterMark, LeakReport, LegacyPinnedMemoryResource, LimitingAdaptor, LiveAllocation, ManagedMemoryResource,
    ManagedMemoryResourceOptions, PinnedMemoryResource, PinnedMemoryResourceOptions, PoolStatistics, SegmentSnapshot,
    SizeClass, Stat, StatisticsAdaptor, StreamStatistics, SynchronousMemoryResource, TrackingAdaptor,
};

/// The crate typed views take their element types' guarantees from ([`bytemuck::Pod`]): derive
/// `Pod` and `Zeroable` for your `#[repr(C)]` types to view buffers as them.
pub use bytemuck;
/// The raw driver bindings this crate is built on.
pub use cuda_mem_sys as sys;
pub use stream::{CaptureMode, CaptureState, Stream, StreamOptions};
pub use view::{DeviceView, DeviceViewMut};

/// The cudarc this crate's interop is built against (feature `cudarc`): use it, or the same
/// version, so that its types are the ones the interop takes.
#[cfg(feature = "cudarc")]
pub use cudarc;
#[cfg(feature = "cudarc")]
pub use cudarc_interop::{CudarcMemoryResource, CudarcView, CudarcViewMut};

/// The crate's README (its crates.io page), whose example the doc tests compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
