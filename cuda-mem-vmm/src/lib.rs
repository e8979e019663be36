//! A virtual memory resource over the CUDA VMM API (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`): buffers that grow without copying, shared with other
//! processes by file descriptor or fabric handle.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{Device, FillPattern, MemoryResourceExt, Stream, StreamOptions};
//! use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions};
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
//!
//! let mut small = vmm.allocate(1 << 20, &stream)?;
//! small.fill(FillPattern::U8(7), &stream)?;
//! let big = small.grow(64 << 20)?; // no copy: the same chunk, and a new one after it
//! assert!(big.size() >= 64 << 20);
//!
//! let shared = big.export()?; // one file descriptor per chunk, for another process
//! assert_eq!(shared.handles.len(), big.chunk_count());
//!
//! // As a memory resource: plain buffers, here borrowing the resource for a scope.
//! let mut scratch = vmm.allocate_scoped(4096, &stream)?;
//! scratch.fill(FillPattern::U8(0), &stream)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `examples/04_grow_a_vmm_buffer.rs` grows one buffer step by step without moving it
//! (`cargo run -p cuda-mem-vmm --example 04_grow_a_vmm_buffer`).
//!
//! - [`VirtualMemoryResourceOptions`]: every option, typed, with cuda.core's defaults.
//!   [`VirtualMemoryResource::new`] refuses invalid combinations and says what to change.
//! - [`VirtualMemoryResource::allocate`]: physical memory, a reservation, a mapping and its
//!   access, each an owned piece. A failure at any step undoes the earlier ones.
//! - [`VirtualBuffer::grow`]: in place (same pointer) when the addresses after the buffer are
//!   free, otherwise by mapping the same chunks again elsewhere; never a copy. The old buffer
//!   stays valid. With [`ReserveAhead`], growth inside the reservation never moves.
//! - [`VirtualBuffer::export`] and [`VirtualMemoryResource::import`]: one handle per chunk, as
//!   a [`VirtualBufferDescriptor`]. Its bytes and file descriptors on the wire are
//!   `cuda-mem-ipc`'s (feature `vmm`); this crate makes the driver calls only.
//! - The resource is also a [`MemoryResource`](cuda_mem_core::MemoryResource): plain `Buffer`s,
//!   which neither grow nor export.
//! - Elastic memory: an [`ElasticGroup`]'s buffers give their physical memory back to the
//!   device and take new memory at the same addresses ([`ElasticGroup::sleep`] with
//!   [`Release::Offload`] to pinned host memory or [`Release::Discard`],
//!   [`ElasticGroup::wake`]); an [`OnDemandRange`] reserves far more than memory and maps pages
//!   as they are needed. `examples/06_sleep_and_wake.rs` sleeps and wakes a model's weights and
//!   KV cache (`cargo run -p cuda-mem-vmm --example 06_sleep_and_wake`).
//!
//! Memory is freed when the last buffer mapping it is dropped, after its stream's work.
//! Unmapping is not stream-ordered, so that stream is synchronized first. A capturing stream is
//! never synchronized: memory a capture may use stays mapped while its graphs live (captures
//! begun with [`Stream::begin_capture`](cuda_mem_core::Stream::begin_capture)), or until the
//! capture ends ([`release_deferred`], for captures begun through raw handles).
//!
//! Errors are [`VmmError`]s. A driver error stays their source and answers
//! [`VmmError::cuda_code`]. Where memory lives, the handle types and the access are
//! `cuda-mem-core`'s words ([`Location`](cuda_mem_core::Location),
//! [`HandleType`](cuda_mem_core::HandleType), [`Access`](cuda_mem_core::Access)), shared with
//! the pools.
//!
//! The feature `tracing` (which turns on `cuda-mem-core`'s) emits events: `"virtual memory
//! resource created"`, `"allocate"`, `"virtual buffer grown"`, `"virtual buffer exported"` and
//! `"virtual buffer imported"`, with sizes, pointers and the device. Without it nothing is
//! compiled in.
//!
//! # Which module holds what
//!
//! The modules are private; everything public is re-exported here.
//!
//! | module | holds |
//! |---|---|
//! | `options` | [`VirtualMemoryResourceOptions`], [`AllocationType`], [`Granularity`], [`ReserveAhead`] |
//! | `resource` | [`VirtualMemoryResource`]: checking options, allocation, growth |
//! | `memory_resource` | the resource as a `MemoryResource`, and the ranges of the buffers it handed out |
//! | `buffer` | [`VirtualBuffer`], [`CloseError`] |
//! | `pieces` | the owned driver objects (chunk, reservation, mapping, range) and the calls that make and unmake them |
//! | `expandable` | the resource as [`ExpandableMemory`](cuda_mem_core::ExpandableMemory): ranges a caching resource's expandable segments grow in |
//! | `release` | letting go of ranges after their stream's work, deferred while it captures ([`release_deferred`]) |
//! | `snapshot` | the resource in memory snapshots (`cuda_mem_core::snapshot`): its buffers' ranges and expandable ranges as segments |
//! | `elastic` | elastic memory: [`ElasticGroup`] (buffers that sleep and wake at the same addresses, [`Release`], [`Discarded`]), [`OnDemandRange`] (pages mapped on demand in a large reservation) |
//! | `share` | export, the descriptor in memory ([`VirtualBufferDescriptor`], [`ChunkHandle`], [`MAX_CHUNKS`]), import |
//! | `error` | [`VmmError`], [`Result`], [`InvalidOptions`], [`DeviceFeature`], [`DescriptorError`], [`DeferCause`], [`ElasticMemory`] |
//!
//! # Platforms
//!
//! Linux: everything. Windows: all but export and import by file descriptor
//! ([`ChunkHandle`]'s `Fd` is Unix only; the default handle type there is `None`). macOS builds
//! but has no CUDA driver. Fabric handles have run on the simulator only.

mod buffer;
mod elastic;
mod error;
mod expandable;
mod memory_resource;
mod options;
mod pieces;
mod release;
mod resource;
mod share;
mod snapshot;

pub use buffer::{CloseError, VirtualBuffer};
pub use elastic::{
    Discarded, ElasticAccess, ElasticBuffer, ElasticGroup, ElasticStatistics, OnDemandRange, OnDemandStatistics,
    Release, SleepReport, WakeReport,
};
pub use error::{DeferCause, DescriptorError, DeviceFeature, ElasticMemory, InvalidOptions, Result, VmmError};
pub use options::{AllocationType, Granularity, ReserveAhead, VirtualMemoryResourceOptions};
pub use release::release_deferred;
pub use resource::VirtualMemoryResource;
pub use share::{ChunkHandle, MAX_CHUNKS, VirtualBufferDescriptor};

/// The crate's README (its crates.io page), whose example the doc tests compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
