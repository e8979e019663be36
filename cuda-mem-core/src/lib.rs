// Where the Unix-only items are not built (Windows), the names' table links them to the pool's
// page. Link definitions, which show nothing, first: the table would take them for a row.
#![cfg_attr(
    not(unix),
    doc = "[`MemoryPool::import`]: MemoryPool\n[`MemoryPool::shareable_handle`]: MemoryPool\n[`ShareableHandle`]: MemoryPool"
)]
//! Devices, streams, buffers and stream-ordered memory pools over the CUDA driver API.
//!
//! This crate is to Rust what `cuda.core`'s memory classes are to Python: typed, owned wrappers
//! that free what they allocate, exactly once, on the right stream.
//!
//! The everyday path needs no trait import: a resource's constructor returns an `Arc` of it, and
//! `resource.allocate(size, &stream)` on that `Arc` gives an owned [`Buffer`] (an inherent method
//! of every resource of this crate); the pool's features are on the resource too
//! (`resource.attributes()`, `resource.set_release_threshold(…)`, `resource.trim_to(…)`,
//! `resource.set_peer_accessible_by(…)`). For the rest, `use cuda_mem_core::prelude::*;` brings the
//! traits ([`MemoryResource`], [`MemoryResourceExt`], [`PoolResource`]) and the common types into
//! scope. Coming from cuda.core? [Its names and ours](#cudacores-names-and-ours) are at the end.
//! Which CUDA driver each capability needs: [Driver versions](#driver-versions), also at the end.
//!
//! - [`Device`]: enumeration, properties, peer capability, making the primary context current.
//! - [`Stream`] and [`Event`]: stream-ordered work and its synchronization; an interprocess
//!   event ([`EventOptions::interprocess`]) names itself to another process by an
//!   [`IpcEventHandle`] ([`Event::ipc_handle`]), which opens it there ([`Event::from_ipc_handle`])
//!   so that its streams wait for this process's work on the GPU.
//! - [`MemoryResource`]: anything that allocates in stream order; [`MemoryResourceExt::allocate`]
//!   (inherent on this crate's resources) turns an `Arc` of one into owned [`Buffer`]s, which keep their resource alive;
//!   [`MemoryResourceExt::allocate_scoped`] makes [`ScopedBuffer`]s, which borrow the resource
//!   and the stream instead (no reference counting: the cheapest allocation, for buffers that
//!   live inside one scope).
//! - Rust data: [`DeviceView`] and [`DeviceViewMut`] view a buffer's bytes as `[T]` for any
//!   [`bytemuck::Pod`] `T` (size, alignment and sub-ranges checked), and copy from `&[T]`, into
//!   `&mut [T]` and to a `Vec<T>`; [`ScopedBuffer::copy_to_new`] copies into a new buffer of the
//!   same resource; [`Buffer::into_raw`] and [`Buffer::leak`] let ownership leave.
//! - Pools: [`DeviceMemoryResource`] (the device's current pool, or one of its own),
//!   [`PinnedMemoryResource`] (host memory), [`ManagedMemoryResource`]; each forwards the
//!   features of its [`MemoryPool`] (attributes, the release threshold, trimming and, for device
//!   pools, peer access) and exposes the pool itself through `pool()` (and is a
//!   [`PoolResource`]; [`MemoryResource::memory_pool`] finds the pool behind any resource). A pool also
//!   shares itself with other processes: its shareable file descriptor, importing a pool, and
//!   mapping another process's allocations, counted
//!   ([`MemoryPool::import_allocation`]/[`MemoryPool::release_import`]).
//! - Managed memory: [`Buffer::managed`] checks a buffer is managed and gives its advice
//!   (read-mostly, preferred location, accessed-by), prefetches and the last prefetch location
//!   ([`ManagedBuffer`]; discards through [`Buffer::managed_mut`]), with [`Location`]s;
//!   [`prefetch_batch`], [`discard_batch`] and [`discard_prefetch_batch`] do many buffers in one
//!   driver call; [`Device::concurrent_managed_access`] tells whether the host may touch managed
//!   memory while devices work.
//! - Graphs: [`Stream::begin_capture`] records a stream's work into a [`Graph`] ([`Capture`],
//!   [`CaptureMode`]), instantiated into a [`GraphExec`] that launches on any stream; the
//!   stream's [`capture_state`](Stream::capture_state) is known without asking the driver for
//!   the streams this crate created, so that their allocations make no capture query (give
//!   code that may capture a stream through FFI its [`shared_handle`](Stream::shared_handle),
//!   see [`Stream::handle`]). [`GraphMemoryResource`] (one per device) allocates inside
//!   captures, memory the graph allocates and frees as it runs ([`GraphMemoryAttributes`],
//!   [`HighWaterMark`], `trim`). Every other resource refuses a capturing stream
//!   ([`Error::CapturingStream`]); see [below](#graphs-and-graph-memory).
//! - Copies with options ([`CopyOptions`]: source access order, location hints, overlap
//!   preference) between buffers and views ([`Buffer::copy_to_with`]), and many copies in one
//!   driver call ([`copy_batch`], of [`BatchCopy`]s), refused with a [`CopyError`] where cuda.core
//!   refuses them (and where copies of a batch overlap).
//! - Without pools: [`SynchronousMemoryResource`] (`cuMemAlloc`) and
//!   [`LegacyPinnedMemoryResource`] (`cuMemAllocHost`).
//! - Adaptors over any resource, RMM's, which stack and are resources themselves:
//!   [`StatisticsAdaptor`] (current, peak and total bytes and counts), [`LimitingAdaptor`] (a
//!   byte budget, refused past with [`Error::LimitExceeded`]) and [`TrackingAdaptor`] (the live
//!   allocations, with backtraces when asked, to find leaks).
//!
//! Errors are [`Error`]s; a driver failure carries the function, the code and its name. An area
//! whose calls fail for several reasons of its own nests its error, so that a caller matches
//! the few its call can give: [`ViewError`], [`ManagedError`], [`SharingError`], [`CopyError`]. An
//! allocation the driver has no memory for is an [`Error::OutOfMemory`] ([`OutOfMemory`]): the
//! bytes asked for and, for a pool, its `max_size` and what it held ([`PoolHoldings`]), with the
//! driver's error as the source. Errors in `Drop` are recorded ([`take_drop_errors`]), never
//! lost and never a panic.
//!
//! # Seeing what memory does
//!
//! - `resource.usage()` ([`MemoryPool::usage`]): a pool's [`PoolUsage`] in one call: used and
//!   reserved bytes, their high-water marks, and the live allocations made through it (counted
//!   here, in a slot per thread: a load and a store per allocation and per free, no locked
//!   instruction, the only cost on the hot path).
//! - [`Device::memory_info`]: the device's free and total memory ([`MemoryInfo`],
//!   `cuMemGetInfo`).
//! - The optional feature `tracing` (off by default): [`tracing`](https://docs.rs/tracing)
//!   events at `TRACE` for every allocation and free (`"allocate"`, `"free"`: `size`, `ptr`,
//!   `pool`, `stream`) and at `DEBUG` for a pool's creation and destruction (`"pool created"`:
//!   `pool`, `kind`, `max_size`, `ipc_enabled`; `"pool destroyed"`), its export (`"pool
//!   exported"`, `"allocation exported"`), imports (`"pool imported"`, `"allocation imported"`,
//!   `"import released"`, with the `holders` left) and peer-access changes (`"peer access
//!   changed"`: `device`, `access`). `ptr`, `pool` (the `CUmemoryPool` handle) and `stream` (the
//!   `CUstream` handle) are written in hex, as the errors write addresses; `kind` in a word or
//!   two (`device 0`, `pinned`, `managed`); a pool without a cap has no `max_size`. Without the
//!   feature the macro that emits them expands to nothing: the hot path is the same code as
//!   without it.
//!
//! The vocabulary the memory crates share is defined here once: [`Access`] (what a device may
//! do with memory), [`HandleType`] and [`HandleTypes`] (the OS handles memory is exported as),
//! [`PoolKind`] (what memory a pool holds), [`EXPORT_DATA_LEN`] (the driver's export data of
//! one allocation).
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
//! | `error` | [`Error`] (with [`OutOfMemory`] and [`PoolHoldings`]), [`Result`], [`cuda_code_of`]; a file per area's own error: [`ViewError`], [`ManagedError`], [`SharingError`], [`CopyError`] ([`OverlapKind`]), `DlpackError`, `CudarcError` |
//! | `driver` | [`driver()`]: the process-wide driver, initialized once; [`installed_version`] and [`DriverCapability::require`] |
//! | `ffi` | the driver calls made from three places or more, one thin function each |
//! | `drop_errors` | errors in `Drop`: [`record_drop_error`], [`take_drop_errors`], [`set_drop_error_hook`] |
//! | `context` | primary contexts, retained once and bound before each driver call that needs one |
//! | `event` | [`Event`], [`EventOptions`], [`IpcEventHandle`] |
//! | `stream` | [`Stream`], [`StreamOptions`]; `capture.rs`: [`CaptureMode`], [`CaptureState`] and what a capture keeps alive; `ordering.rs`: streams waiting for each other's events |
//! | `trace` | the events of the `tracing` feature (a macro that is empty without it) |
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
//! | `resources` | every resource, a file each: [`DeviceMemoryResource`], [`PinnedMemoryResource`] (on a [`NumaNode`]), [`ManagedMemoryResource`] (preferring a [`Location`]) and their options; [`SynchronousMemoryResource`], [`LegacyPinnedMemoryResource`] (no pools); [`GraphMemoryResource`] ([`GraphMemoryAttributes`], [`HighWaterMark`]); `adaptors/`: [`StatisticsAdaptor`] ([`AllocationStatistics`]), [`LimitingAdaptor`], [`TrackingAdaptor`] ([`LeakReport`], [`LiveAllocation`]) |
//! | `dlpack` | feature `dlpack`: a file per concern: export, import, the stream exchange, element types, layouts |
//! | `cudarc_interop` | feature `cudarc`: cudarc's streams, views and allocations with this crate's |
//! | [`prelude`] (public) | the traits and the common types, for one glob import |
//!
//! With the `cudarc` feature (off by default), cudarc's streams, copies, memsets, launches and
//! allocations meet this crate's: see "cudarc" below (built with the feature).
//!
//! The driver is loaded at run time (see `cuda-mem-sys`): `libcuda.so.1` (`nvcuda.dll` on
//! Windows), or the library `CUDA_MEM_DRIVER` names (such as the `cuda-sim` simulator).
//!
//! # Platforms
//!
//! Linux: everything. Windows: everything but a pool's shareable file descriptor
//! (`ShareableHandle`, `MemoryPool::shareable_handle` and `MemoryPool::import` are built on Unix
//! only, as `std::os::fd` is; the driver exports pools as file descriptors on Linux only, and
//! Windows handles are not implemented). macOS: builds, but has no CUDA driver to load. The tests
//! run on Linux; the other targets are checked with `cargo check`.
//!
//! # Features
//!
//! All off by default.
//!
//! - `dlpack`: DLPack export and import ([see below](#dlpack-feature-dlpack)), on the `dlpark`
//!   crate. Turn it on with `cuda-mem-core = { version = "0.1", features = ["dlpack"] }`.
//! - `cudarc`: interop with cudarc (its streams as ours and back, typed views in its copies,
//!   memsets and launches, its allocations as buffers); documented in the section "cudarc" when
//!   the feature is on.
//! - `tracing`: events for allocations, frees, pools, sharing and peer access
//!   ([see above](#seeing-what-memory-does)); compiled out without it.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{
//!     Device, DeviceMemoryResource, Error, FillPattern, LimitingAdaptor, PinnedMemoryResource, StatisticsAdaptor,
//!     Stream, StreamOptions,
//! };
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//!
//! // Rust data into a pool of its own, and back: typed, sizes checked, and each copy returns
//! // once the data is where it goes (see `DeviceView` on host memory).
//! let pool = DeviceMemoryResource::new(device, Default::default())?;
//! let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//! let mut on_device = pool.allocate(data.len() * size_of::<f32>(), &stream)?;
//! on_device.copy_from_slice(&data, &stream)?;
//! let mut view = on_device.view_mut::<f32>()?;
//! view.slice_mut(512..)?.fill(0.0, &stream)?;
//! assert_eq!(view.slice(..4)?.to_vec(&stream)?, [0.0, 1.0, 2.0, 3.0]);
//! let copy = on_device.copy_to_new(&stream)?; // from the same pool
//! assert_eq!(copy.to_vec::<f32>(&stream)?[510..514], [510.0, 511.0, 0.0, 0.0]);
//!
//! // Fill on the device, copy to pinned host memory and read it there.
//! on_device.fill(FillPattern::U32(0xC0FFEE), &stream)?;
//! let mut on_host = PinnedMemoryResource::current()?.allocate(on_device.size(), &stream)?;
//! on_host.copy_from(&on_device, &stream)?;
//! assert!(on_host.host_slice()?.chunks(4).all(|w| w == 0xC0FFEEu32.to_ne_bytes()));
//! let usage = pool.usage()?;
//! let (used, reserved) = (usage.used_bytes, usage.reserved_bytes);
//! println!("pool uses {used} of {reserved} reserved bytes in {} allocations", usage.live_allocations);
//! println!("{device} has {} bytes free", device.memory_info()?.free);
//!
//! // Scratch memory for this scope only: it borrows the pool and the stream (no reference
//! // counting), and the borrow checker keeps both alive until it is freed.
//! let mut scratch = pool.allocate_scoped(4096, &stream)?;
//! scratch.fill(FillPattern::U8(0), &stream)?;
//!
//! // Adaptors stack over any resource: a budget over counters over the pool.
//! let counted = StatisticsAdaptor::new(pool.clone());
//! let limited = LimitingAdaptor::new(counted.clone(), 1 << 20);
//! let held = limited.allocate(768 << 10, &stream)?;
//! assert!(matches!(limited.allocate(512 << 10, &stream), Err(Error::LimitExceeded { .. })));
//! assert_eq!(counted.statistics().current_bytes, 768 << 10);
//! drop(held);
//!
//! // Let every other device that can reach it use the pool's memory.
//! let peers: Vec<Device> = Device::all()?
//!     .into_iter()
//!     .filter(|&d| d != device && d.can_access_peer(device).unwrap_or(false))
//!     .collect();
//! pool.set_peer_accessible_by(peers)?;
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```

//!
//! # Graphs and graph memory
//!
//! What cuda.core writes with a `GraphBuilder` and a `GraphMemoryResource`:
//!
//! ```python
//! gmr = GraphMemoryResource(device)
//! gb = stream.create_graph_builder().begin_building("relaxed")
//! scratch = gmr.allocate(16, stream=gb)
//! scratch.fill(3, width=4, stream=gb)
//! output.copy_from(scratch, stream=gb)
//! scratch.close()
//! graph = gb.end_building().complete()
//! graph.launch(stream); graph.launch(stream)
//! gmr.attributes.used_mem_high = 0
//! gmr.trim()
//! ```
//!
//! is, here:
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{
//!     CaptureMode, Device, DeviceMemoryResource, Error, FillPattern, GraphMemoryResource, HighWaterMark,
//!     InstantiateOptions, Stream, StreamOptions,
//! };
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let pool = DeviceMemoryResource::new(device, Default::default())?;
//! let mut output = pool.allocate(16, &stream)?; // allocated before the capture
//! let graph_memory = GraphMemoryResource::new(device); // the same `Arc` for every call
//! assert!(matches!(graph_memory.allocate(16, &stream), Err(Error::NotCapturing { .. })));
//!
//! let capture = stream.begin_capture(CaptureMode::Relaxed)?;
//! assert!(matches!(pool.allocate(16, &stream), Err(Error::CapturingStream)));
//! let mut scratch = graph_memory.allocate(16, capture.stream())?; // an allocation node
//! scratch.fill(FillPattern::U32(3), capture.stream())?;
//! output.copy_from(&scratch, capture.stream())?;
//! drop(scratch); // a free node: each launch allocates and frees it
//! let exec = capture.end()?.instantiate(InstantiateOptions::default())?;
//! // SAFETY: `output`, the one buffer the graph uses that it does not allocate itself, lives
//! // on, and no host slice of it is taken before the launches' work is done.
//! unsafe {
//!     exec.launch(&stream)?;
//!     exec.launch(&stream)?;
//! }
//! assert_eq!(output.to_vec::<u32>(&stream)?, [3; 4]);
//!
//! let attributes = graph_memory.attributes()?; // used and reserved, current and high
//! assert!(attributes.used_high >= 16 && attributes.reserved_high >= attributes.used_high);
//! graph_memory.reset_high_water_mark(HighWaterMark::Used)?; // to the current use: no other value
//! graph_memory.trim()?;
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```
//!
//! A capture keeps what its graphs may use ([`Stream::keep_alive_in_capture`]): a
//! `cuda-mem-vmm` virtual buffer dropped during the capture stays mapped, a buffer of a
//! resource without pools unfreed, and any buffer the captured work used on the capturing stream
//! and dropped on another during the capture unfreed, until the graph and every executable graph
//! made from it are gone and their launches done. Captures begun through raw handles cannot be followed: there
//! the pools and the resources without pools refuse, and virtual buffers wait only for the end of
//! the capture.
//!
//! # Managed memory
//!
//! What cuda.core 1.2 writes with a `ManagedMemoryResource`, a `ManagedBuffer`'s advice and
//! its prefetches and discards, and the batches of `cuda.core.utils`:
//!
//! ```python
//! mr = ManagedMemoryResource(ManagedMemoryResourceOptions(preferred_location=0))
//! buf = mr.allocate(1 << 20, stream=stream)
//! other = mr.allocate(4096, stream=stream)
//! buf.read_mostly = True
//! buf.preferred_location = Host(numa_id=0)
//! buf.accessed_by.add(device)
//! buf.prefetch(device, stream=stream)
//! prefetch_batch(stream, [buf, other], [Host(), device])
//! buf.discard_prefetch(Host.numa_current(), stream=stream)
//! discard_batch(stream, [buf, other])
//! discard_prefetch_batch(stream, [buf, other], device)
//! ```
//!
//! is, here:
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{
//!     Device, Error, Location, ManagedError, ManagedMemoryResource, ManagedMemoryResourceOptions, NumaNode, Stream,
//!     StreamOptions,
//!     discard_batch, discard_prefetch_batch, prefetch_batch,
//! };
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let options = ManagedMemoryResourceOptions::default().preferred_location(Some(Location::Device(device)));
//! let resource = ManagedMemoryResource::new(options)?;
//! let mut buf = resource.allocate(1 << 20, &stream)?;
//! let mut other = resource.allocate(4096, &stream)?;
//!
//! let managed = buf.managed()?; // checked once: ManagedError::NotManaged for other memory
//! managed.set_read_mostly(true)?;
//! managed.set_preferred_location(Location::HostNuma(NumaNode(0)))?;
//! managed.add_accessed_by(device)?;
//! managed.prefetch(device, &stream)?;
//! assert!(managed.read_mostly()?);
//! assert_eq!(managed.preferred_location()?, Some(Location::HostNuma(NumaNode(0))));
//! assert_eq!(managed.accessed_by()?, [Location::Device(device)]);
//! assert_eq!(managed.last_prefetch_location()?, Some(Location::Device(device)));
//! // cuda.core's table of the locations each advice takes, checked before the driver is called.
//! assert!(matches!(managed.add_accessed_by(Location::HostNuma(NumaNode(0))), Err(Error::Managed(ManagedError::AdviceLocation { .. }))));
//!
//! prefetch_batch([&buf, &other], &[Location::Host, Location::Device(device)][..], &stream)?;
//! // Discards destroy the contents: they take the buffers exclusively.
//! buf.managed_mut()?.discard_prefetch(Location::HostNumaCurrent, &stream)?;
//! let (mut a, mut b) = (buf.managed_mut()?, other.managed_mut()?);
//! discard_batch([&mut a, &mut b], &stream)?;
//! discard_prefetch_batch([&mut a, &mut b], device, &stream)?;
//! stream.synchronize()?;
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```
//!
//! # Copies with options, and batches
//!
//! What cuda.core 1.2 writes with `CopyOptions` and `copy_batch`:
//!
//! ```python
//! during_call = CopyOptions(src_access_order=MemcpySrcAccessOrder.DURING_API_CALL)
//! copy_batch(stream, [staging, staging_tail], [a, b], options=during_call)
//! staging_host[:] = 0          # the sources were read before copy_batch returned
//! a.copy_to(c, stream=stream, options=CopyOptions(dst_location_hint=device))
//! ```
//!
//! is, here (a range of the source instead of a second buffer; overlapping copies in one batch
//! are refused rather than left undefined):
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{
//!     BatchCopy, CopyOptions, Device, DeviceMemoryResource, PinnedMemoryResource, SourceAccessOrder, Stream,
//!     StreamOptions, copy_batch,
//! };
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let pool = DeviceMemoryResource::new(device, Default::default())?;
//! let mut staging = PinnedMemoryResource::new(Default::default())?.allocate(8, &stream)?;
//! staging.host_slice_mut()?.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
//! let (mut a, mut b, mut c) = (pool.allocate(8, &stream)?, pool.allocate(4, &stream)?, pool.allocate(8, &stream)?);
//!
//! let during_call = CopyOptions::default().src_access_order(SourceAccessOrder::DuringApiCall);
//! copy_batch(&stream, [BatchCopy::new(&staging, &mut a)?, BatchCopy::range(&staging, 4, &mut b)?], during_call)?;
//! staging.host_slice_mut()?.fill(0); // read before copy_batch returned
//! a.copy_to_with(&mut c, &stream, CopyOptions::default().dst_location_hint(device))?;
//! assert_eq!(c.to_vec::<u8>(&stream)?, [1, 2, 3, 4, 5, 6, 7, 8]);
//! assert_eq!(b.to_vec::<u8>(&stream)?, [5, 6, 7, 8]);
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```
//!
//! On drivers without the calls (`cuMemcpyBatchAsync` came with CUDA 13.0,
//! `cuMemcpyWithAttributesAsync` with 13.2), options that only stream order needs fall back to
//! plain copies, as cuda.core's do; [`SourceAccessOrder::DuringApiCall`] is refused, naming the
//! version needed.
//!
//! # DLPack (feature `dlpack`)
//!
//! A buffer leaves as a versioned DLPack tensor (`DLManagedTensorVersioned`) for any DLPack
//! consumer (PyTorch, CuPy, JAX, cuda.core's `StridedMemoryView`, a C library): `into_dlpack`
//! moves an owned `Buffer` into the tensor (writable), `export_dlpack` takes an `Arc<Buffer>`
//! or any `ExportSource`, `DeviceView::to_dlpack` a typed view of a shared buffer (both
//! read-only). The tensor keeps the buffer, and so its pool, alive until the consumer calls its
//! deleter; its device is the memory's (`kDLCUDA`, `kDLCUDAHost`, `kDLCUDAManaged`), its data
//! type the element type's (`DlpackElement`), its shape one dimension or the one
//! `ExportOptions` gives (strides checked against the size). The consumer names its stream
//! (`ConsumerStream`, as `__dlpack__(stream=…)`): it waits for the buffer's work, and the
//! memory is freed after the consumer's. `DlpackImport` takes a tensor of CUDA device, pinned or
//! managed memory as a buffer that frees nothing and calls the producer's deleter once when
//! dropped (after the work enqueued through it).
//!
//! ```
//! # #[cfg(feature = "dlpack")] {
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{ConsumerStream, Device, DeviceMemoryResource, DlpackImport, ExportOptions, Stream, StreamOptions};
//!
//! let device = Device::new(0)?;
//! let producer = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let consumer = Stream::new(device, StreamOptions::default().non_blocking())?;
//! let pool = DeviceMemoryResource::new(device, Default::default())?;
//! let mut buffer = pool.allocate(6 * size_of::<f32>(), &producer)?;
//! buffer.copy_from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &producer)?;
//!
//! // Export: a 2x3 float32 tensor that owns the buffer (and keeps the pool alive); the
//! // consumer's stream waits for the producer's work. `tensor.into_raw()` hands it to C, or
//! // to Python in a `dltensor_versioned` capsule.
//! let options = ExportOptions::default().shape(&[2, 3]).consumer_stream(ConsumerStream::Stream(&consumer));
//! let tensor = buffer.into_dlpack::<f32>(&options)?;
//! drop(pool);
//!
//! // Import, as a consumer: a buffer over the tensor's memory, typed views of it.
//! // SAFETY: the tensor's memory stays valid until its deleter runs (it owns the buffer), and
//! // nothing else writes it.
//! let import = unsafe { DlpackImport::from_dlpack(tensor)? };
//! assert_eq!(import.shape(), [2, 3]);
//! assert_eq!(import.view::<f32>()?.to_vec(&consumer)?, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
//! drop(import); // the deleter: the buffer is freed (after the consumer's work), then the pool
//! # }
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```

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
mod location;
mod managed;
mod memory_resource;
mod pool;
pub mod prelude;
mod resources;
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
    CopyError, DeviceCapability, Error, ManagedError, OutOfMemory, OverlapKind, PoolHoldings, Result, SharingError,
    ViewError, cuda_code_of,
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
    AllocationStatistics, DeviceMemoryResource, DeviceMemoryResourceOptions, GraphMemoryAttributes,
    GraphMemoryResource, HighWaterMark, LeakReport, LegacyPinnedMemoryResource, LimitingAdaptor, LiveAllocation,
    ManagedMemoryResource, ManagedMemoryResourceOptions, PinnedMemoryResource, PinnedMemoryResourceOptions,
    StatisticsAdaptor, SynchronousMemoryResource, TrackingAdaptor,
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
