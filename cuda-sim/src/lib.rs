//! A host-memory simulator of the CUDA driver API.
//!
//! Built as `libcuda_sim.so`, it exports, with the C ABI and the very symbol names the real
//! `libcuda.so.1` exports (`cuMemAlloc_v2`, `cuMemcpyHtoD_v2_ptds`, …), the driver functions this
//! project uses, backed by host memory, so that the whole suite runs where there is no GPU. It
//! answers `cuGetProcAddress_v2` as the real driver does, so any program that loads a driver by
//! path (`CUDA_MEM_DRIVER=…/libcuda_sim.so` here; cuda-python or PyTorch through
//! `LD_LIBRARY_PATH` and a `libcuda.so.1` symlink) can use it.
//!
//! **Linux only**: it simulates the driver of a Linux process (memfd-backed shared memory,
//! `/proc`, file descriptors for exported memory); elsewhere the crate stops with one
//! `compile_error!` saying so.
//!
//! # Strictness
//! The simulator exists to catch bugs before a GPU does, so wherever `cuda.h` documents an error
//! it returns that error: calls before `cuInit` return `CUDA_ERROR_NOT_INITIALIZED`, calls that
//! need a context return `CUDA_ERROR_INVALID_CONTEXT` without one, unknown or stale handles return
//! `CUDA_ERROR_INVALID_HANDLE` (every handle value is unique for the life of the process, so a
//! destroyed handle is never mistaken for a live one), zero sizes, out-of-range copies and double
//! frees return `CUDA_ERROR_INVALID_VALUE`. Device memory is reserved as inaccessible host
//! address space, so host code that dereferences a device pointer faults as it would on a GPU.
//!
//! Stream work runs asynchronously, on a worker thread per stream, in stream order; events and
//! `cuStreamWaitEvent` order streams; the legacy default stream synchronizes with blocking
//! streams. A missing synchronization therefore shows up as a wrong result. Synchronous copies
//! and memsets follow the driver's documented host-synchronization rules (a device-to-device
//! `cuMemcpyDtoD` or a `cuMemsetD8` on device memory returns before it is done).
//!
//! # What is simulated
//! Initialization, devices and their attributes, primary and created contexts (their limits,
//! cache preference and context-wide events too), streams (legacy, per-thread
//! and created), events (interprocess ones too: `cuIpcGetEventHandle`/`cuIpcOpenEventHandle`),
//! host functions, `cuMemAlloc`/`cuMemAllocHost`/`cuMemHostAlloc`/`cuMemAllocManaged`,
//! host registration, copies (between devices too) and memsets, pointer attributes, managed memory's advice, prefetches,
//! discards and range attributes (per page), memory pools (default, current
//! and owned; device, host, host-NUMA and managed; attributes, trimming, peer access, sharing
//! between processes through sealed `memfd`s), graph capture far enough to refuse what it forbids
//! (a synchronizing call on a capturing stream invalidates the capture, as on a GPU), and
//! the VMM API (reservations, physical allocations, mappings, access, POSIX-fd and fabric
//! handles). Kernels and modules are not.
//!
//! Five exports of the simulator's own, not part of the driver API, serve the tests
//! ([`testing::driver`], [`testing::live_objects`], [`testing::inject_failure`],
//! [`testing::count_calls`] and [`testing::run_failing`] call them): `cuSimBuildId` says which
//! sources the library was built from ([`BUILD_ID`]), `cuSimLiveObjects` counts live
//! reservations, mappings, physical allocations, pools and allocations, `cuSimInjectFailure` arms
//! a failure at run time, and `cuSimCountCalls` and `cuSimCallCount` count the driver calls a
//! stretch of code makes, so that a test can fail each of them in turn.
//!
//! # Which module holds what
//! | module | holds |
//! |---|---|
//! | `exports` | the C ABI: every exported driver symbol with the signature `cuda.h` declares, forwarding to `api` |
//! | `api` | each driver function's behaviour (argument checks, state lookups, the work it enqueues), one file per area: `init`, `device`, `context`, `limits`, `stream`, `attach`, `event`, `memory`, `managed`, `pointer`, `pool`, `ipc`, `vmm`, and `sim` (the simulator's own test exports) |
//! | `state`, `config` | the process-wide state made by the first `cuInit`, and the `CUDA_SIM_*` settings it reads |
//! | `device`, `context` | simulated devices (attributes, memory, peer topology); primary contexts and the current-context stack |
//! | `stream`, `event`, `capture` | per-stream worker queues; events; graph capture and the calls that invalidate it |
//! | `memory`, `pool`, `vmm` | device and host allocations with copies and memsets; stream-ordered pools and their accounting; VMM physical allocations |
//! | `managed` | managed memory's range attributes, kept per run of equal pages |
//! | `shared`, `sealed` | memory other processes map: the shareable pools' layout, and the sealed `memfd`s behind it and VMM handles |
//! | `ipc_event` | interprocess events' progress, shared with the processes that open their handles |
//! | `handle`, `error`, `fault`, `proc_address` | never-reused handle values; `CUresult`s inside the simulator; fault injection and call counts; `cuGetProcAddress_v2` |
//! | [`conservative`] | every reading taken where `cuda.h` is silent, and why |
//! | [`testing`] | helpers for test suites: choosing the driver, declared skips, live-object counts, fault injection, counting the driver calls of a path and failing each in turn, open descriptors |
//!
//! Where the driver's behaviour is not documented, the simulator takes the most conservative
//! reading; each such choice is listed in [`conservative`].
//!
//! # Configuration (read once, at the first `cuInit` of the process)
//! | variable | meaning | default |
//! |---|---|---|
//! | `CUDA_SIM_DEVICES` | number of physical devices of the simulated machine (1–64) | 1 |
//! | `CUDA_SIM_PEER_ACCESS` | which physical devices can access each other: `all`, `none`, or pairs of physical indices such as `0-1,2-3` (symmetric) | `all` |
//! | `CUDA_VISIBLE_DEVICES` | as with the real driver: the devices this process sees, in ordinal order, as physical indices or UUIDs (`GPU-…`, or a unique prefix); parsing stops at the first invalid entry; empty hides every device (`cuInit` fails with `CUDA_ERROR_NO_DEVICE`) | all, in order |
//! | `CUDA_SIM_MEMORY` | bytes of memory per device (accepts `K`, `M`, `G` suffixes, powers of 1024) | 8 GiB |
//! | `CUDA_SIM_POOL_IMPORT` | what a second import of one pool returns: `new-handle` (a handle of its own) or `same-handle` (the first import's, uncounted) | `new-handle` |
//! | `CUDA_SIM_POOL_HANDLES` | pool handle values: `unique` (never reused, so a destroyed pool's handle is always detected) or `recycle` (a gone device pool's value goes to the next pool created or imported on its device, with its peer access: nvbug 5698116; see [`conservative`]) | `unique` |
//! | `CUDA_SIM_ADDRESS_HINTS` | which `cuMemAddressReserve` hints are refused, as the driver may refuse any: `honour`, `refuse-all`, or `refuse-every-N` (every N-th call with a hint) | `honour` |
//! | `CUDA_SIM_DEVICE_ATTRIBUTES` | what `cuDeviceGetAttribute` reports for every device instead of the simulated value: `code=value` pairs of `CUdevice_attribute` codes, such as `115=0` (no memory pools), for testing a library's capability checks; only the report changes, except that the managed-memory operations follow a reported 0 for concurrent managed access (`89=0`, see [`conservative`]) | none |
//! | `CUDA_SIM_DRIVER_VERSION` | the CUDA version the simulator pretends to be, as `cuDriverGetVersion` encodes it (`12080` for CUDA 12.8), from 11000 to 13020 (read at the first `cuInit`, `cuDriverGetVersion` or `cuGetProcAddress`): `cuDriverGetVersion` reports it and `cuGetProcAddress_v2` answers as that driver would, with no entry point or variant newer than it (none at all before 12.0, which had no `cuGetProcAddress_v2`; 13020, CUDA 13.2, makes `cuMemcpyWithAttributesAsync` available), and `cuDeviceGetAttribute` refuses with `CUDA_ERROR_INVALID_VALUE` the attributes newer than it; everything else behaves as 13.0 (see [`conservative`]); an unreadable value makes `cuInit` fail with `CUDA_ERROR_INVALID_VALUE` | 13000 (`cuda.h`'s) |
//! | `CUDA_SIM_IMEX_CHANNEL` | the IMEX channel this process was granted (a number), which fabric handles need: without one, `cuMemCreate` of fabric-shareable memory is `CUDA_ERROR_NOT_PERMITTED`, as on a machine without `/dev/nvidia-caps-imex-channels` (the device attribute says fabric handles are supported all the same); a fabric handle imports only into a process on the exporter's channel (`CUDA_ERROR_NOT_PERMITTED` otherwise, as `cuda.h` documents) | none |
//! | `CUDA_SIM_FAIL` | fault injection: `function:n[,function:n…]` makes the n-th call of each function fail with `CUDA_ERROR_OUT_OF_MEMORY` (read at the first driver call) | none |
//! | `CUDA_SIM_HIDE_CONTROLS` | `1` hides the simulator's own controls (`cuSimBuildId`, `cuSimLiveObjects`, fault injection, call counts: each answers `CUDA_ERROR_NOT_FOUND`), so that a test suite given the simulator by `CUDA_MEM_DRIVER` takes the paths it takes on a real driver: a rehearsal of a GPU run (the GPU bundle's `REHEARSE=1`) | shown |
//!
//! Each process simulates its own devices; nothing is shared between processes except what the
//! IPC functions share explicitly, so several processes can use the simulator at once. Pools
//! created with the POSIX-fd handle type keep their memory in a `memfd`, so
//! `cuMemPoolExportToShareableHandle` returns a real file descriptor that another process can
//! import, and exported pointers map the same bytes there (see the `shared` module's layout).
//!
//! Processes given the same `CUDA_SIM_*` settings simulate the same machine, and
//! `CUDA_VISIBLE_DEVICES` can show them its devices under different ordinals, as on real
//! hardware. Everything that identifies a device (name, UUID, PCI bus id), the peer topology, and
//! the records that cross processes (shared pools' and VMM allocations' headers, so fabric
//! handles too) use the physical index; an importing process translates it to its own ordinal
//! and refuses memory on a device it does not see (see [`conservative`]). Everything else is
//! keyed by the process's own ordinals.
//!
//! # Example
//! ```no_run
//! use cuda_mem_sys::{Driver, cu_call};
//!
//! let path = cuda_sim::testing::library_path().expect("build cuda-sim first");
//! // SAFETY: the library is the simulator, which implements each driver function it exports
//! // with the signature and behaviour `cuda.h` documents.
//! let driver = unsafe { Driver::open(path) }?;
//! // SAFETY: cuInit takes no pointers and flags must be 0.
//! unsafe { cu_call!(&driver, cuInit(0)) }?;
//! let mut count = 0;
//! // SAFETY: `count` is a valid out-pointer.
//! unsafe { cu_call!(&driver, cuDeviceGetCount(&mut count)) }?;
//! assert_eq!(count, 1);
//! # Ok::<(), cuda_mem_sys::CudaError>(())
//! ```

// The simulator models a Linux process (memfd-backed shared memory, `/proc`, file descriptors
// for exported pools and memory): elsewhere the crate stops here, with one message, rather
// than with an error per module.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "cuda-sim builds on Linux only: it simulates the CUDA driver of a Linux process (memfd shared memory, \
     /proc, POSIX file descriptors). Run its tests on Linux (or WSL)."
);

/// A hash of the simulator's sources (made by its build script), the same in the shared library
/// and in the `rlib` test suites link: [`testing::driver`] refuses a library whose
/// `cuSimBuildId` differs, which would be a stale build found outside this build's folders.
#[cfg(target_os = "linux")]
pub const BUILD_ID: &str = env!("CUDA_SIM_BUILD_ID");

#[cfg(target_os = "linux")]
pub(crate) mod api;
#[cfg(target_os = "linux")]
mod blocks;
#[cfg(target_os = "linux")]
mod capture;
#[cfg(target_os = "linux")]
mod config;
#[cfg(target_os = "linux")]
pub mod conservative;
#[cfg(target_os = "linux")]
mod context;
#[cfg(target_os = "linux")]
mod device;
#[cfg(target_os = "linux")]
mod error;
#[cfg(target_os = "linux")]
mod event;
#[cfg(target_os = "linux")]
mod exports;
#[cfg(target_os = "linux")]
mod fault;
#[cfg(target_os = "linux")]
mod graph;
#[cfg(target_os = "linux")]
mod handle;
#[cfg(target_os = "linux")]
mod holds;
#[cfg(target_os = "linux")]
mod ipc_event;
#[cfg(target_os = "linux")]
mod managed;
#[cfg(target_os = "linux")]
mod memory;
#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
mod proc_address;
#[cfg(target_os = "linux")]
mod sealed;
#[cfg(target_os = "linux")]
mod shared;
#[cfg(target_os = "linux")]
mod state;
#[cfg(target_os = "linux")]
mod stream;
#[cfg(target_os = "linux")]
pub mod testing;
#[cfg(target_os = "linux")]
mod user_object;
#[cfg(target_os = "linux")]
mod vmm;

/// The crate's README (its crates.io page), whose example the doc tests compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
