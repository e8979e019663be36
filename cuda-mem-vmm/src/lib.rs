//! A virtual memory resource over the CUDA VMM API (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`): allocations that grow without copying and can be shared with
//! other processes by file descriptor (or fabric handle).
//!
//! - [`VirtualMemoryResourceOptions`]: every option, typed, with cuda.core's defaults; invalid
//!   combinations are refused by [`VirtualMemoryResource::new`] with a message saying what to
//!   change.
//! - [`VirtualMemoryResource::allocate`]: physical memory, an address reservation, a mapping and
//!   its access, as separate owned pieces: a failure at any step undoes the earlier ones.
//! - The resource is a [`MemoryResource`](cuda_mem_core::MemoryResource): through
//!   [`MemoryResourceExt`](cuda_mem_core::MemoryResourceExt) (or as an
//!   `Arc<dyn MemoryResource>`) it allocates plain `Buffer`s, which neither grow nor export.
//! - [`VirtualBuffer::grow`]: in place (same pointer) when the addresses after the buffer are
//!   free, otherwise by mapping the same chunks again at a new address; never a copy; the old
//!   buffer stays valid and aliases the same memory. With [`ReserveAhead`] (an option) each
//!   reservation is made larger than what it maps, and growth inside it never moves, whatever
//!   the driver does with address hints; reserving costs address space only. A second growth
//!   of the same buffer, while the first one lives, moves: the addresses after it are mapped.
//! - [`VirtualBuffer::export`] / [`VirtualMemoryResource::import`]: one handle per chunk, as a
//!   [`VirtualBufferDescriptor`] in memory. Its bytes and file descriptors on the wire are
//!   `cuda-mem-ipc`'s (feature `vmm`): its `IpcChannel` carries virtual buffers beside pools,
//!   buffers and data, and its `SharedVirtualBuffer` encodes and decodes the descriptor for any
//!   other transport. This crate makes the driver calls and does not depend on `cuda-mem-ipc`.
//!
//! Memory is freed when the last buffer mapping it is dropped, after the work of its stream:
//! unmapping is not stream-ordered, so the buffer's stream is synchronized first. A capturing
//! stream is never synchronized and memory it may use never unmapped: dropping a buffer then
//! hands its memory to the capture when it was begun through
//! [`Stream::begin_capture`](cuda_mem_core::Stream::begin_capture) (it stays mapped while the
//! graph or any executable graph made from it lives, and until their launches are done), and
//! otherwise (a capture begun through a raw handle, which cannot be followed) defers its release
//! until the capture has ended ([`release_deferred`]: a graph from such a capture must not be
//! launched after that); [`VirtualBuffer::close`] refuses, giving the buffer back.
//!
//! Errors are [`VmmError`]s, with variants to match on; a driver error stays their source and
//! answers [`VmmError::cuda_code`].
//!
//! With the feature `tracing` (which turns on `cuda-mem-core`'s), the resource emits `tracing`
//! events: `"virtual memory resource created"` (`DEBUG`: `device`, `granularity`), `"allocate"`
//! (`TRACE`: `size`, `ptr`, `device`), `"virtual buffer grown"` (`DEBUG`: `old_ptr`, `old_size`,
//! `ptr`, `size`, `in_place`, `chunks`, `device`), `"virtual buffer exported"` and `"virtual
//! buffer imported"` (`DEBUG`: `ptr`, `size`, `chunks`). Without it nothing is emitted and
//! nothing is compiled in. Virtual buffers do not shrink, so there is no shrink event.
//!
//! The handle type and the access in the options are `cuda-mem-core`'s
//! ([`HandleType`](cuda_mem_core::HandleType), [`Access`](cuda_mem_core::Access)), the same
//! words the pools use; depend on `cuda-mem-core` for them and for devices and streams.
//!
//! # Which module holds what
//!
//! The modules are private; everything public is re-exported here.
//!
//! | module | holds |
//! |---|---|
//! | `options` | [`VirtualMemoryResourceOptions`] and its enums ([`AllocationType`], [`Granularity`], [`ReserveAhead`]; where memory lives is `cuda-mem-core`'s [`Location`](cuda_mem_core::Location)) |
//! | `resource` | [`VirtualMemoryResource`]: checking options, allocation, growth |
//! | `memory_resource` | the resource as a `MemoryResource`, and the ranges of the buffers it handed out |
//! | `buffer` | [`VirtualBuffer`], [`CloseError`] |
//! | `pieces` | the owned driver objects (physical chunk, reservation, mapping, range), mapping chunks contiguously into a reservation, and claiming the addresses after a range inside its reservation |
//! | `release` | letting go of ranges after their stream's work, deferred while it captures ([`release_deferred`]) |
//! | `share` | export, the descriptor in memory ([`VirtualBufferDescriptor`], [`ChunkHandle`], [`MAX_CHUNKS`]), import |
//! | `error` | [`VmmError`], [`Result`] and the enums it names ([`InvalidOptions`], [`DeviceFeature`], [`DescriptorError`], [`DeferCause`]) |
//!
//! Fabric handles are tested on the simulator only; they have not yet run on hardware.
//!
//! # Platforms
//!
//! Linux: everything. Windows: allocating, growing, mapping and fabric handles build, but not
//! export and import by file descriptor ([`ChunkHandle`]'s `Fd` is built on Unix only): the
//! default [`handle_type`](VirtualMemoryResourceOptions::handle_type) is `None` there and
//! `HandleType::PosixFd` is refused as unsupported. macOS: builds, but has no CUDA driver. The
//! tests run on Linux; the other targets are checked with `cargo check`.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{Device, FillPattern, Stream, StreamOptions};
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
//! use cuda_mem_core::MemoryResourceExt;
//! let mut scratch = vmm.allocate_scoped(4096, &stream)?;
//! scratch.fill(FillPattern::U8(0), &stream)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod buffer;
mod error;
mod memory_resource;
mod options;
mod pieces;
mod release;
mod resource;
mod share;

pub use buffer::{CloseError, VirtualBuffer};
pub use error::{DeferCause, DescriptorError, DeviceFeature, InvalidOptions, Result, VmmError};
pub use options::{AllocationType, Granularity, ReserveAhead, VirtualMemoryResourceOptions};
pub use release::release_deferred;
pub use resource::VirtualMemoryResource;
pub use share::{ChunkHandle, MAX_CHUNKS, VirtualBufferDescriptor};

/// The crate's README (its crates.io page), whose example the doc tests compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
