//! Sharing CUDA memory pools, buffers and events between processes through POSIX file
//! descriptors (Linux).
//!
//! A pool created with an IPC handle type is exported as a file descriptor. The process that
//! receives it imports the pool. From then on each buffer of the pool travels as a small
//! [`BufferDescriptor`], which the receiver maps into its own address space. Both processes then
//! read and write the same memory, ordered by interprocess events.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! use cuda_mem_core::{Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, Stream, StreamOptions};
//! use cuda_mem_ipc::{Channel, IpcChannel};
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! // Both ends here; with `spawn_with_channel`, `there` is in a child process.
//! let (here, there) = Channel::pair()?;
//! let (sender, receiver) = (IpcChannel::new(here), IpcChannel::new(there));
//!
//! let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
//! let mut buffer = pool.allocate(4096, &stream)?;
//! buffer.fill(FillPattern::U8(7), &stream)?;
//! stream.synchronize()?;
//! sender.send_buffers(&[&buffer])?; // the pool's file descriptor first, then the buffer
//!
//! let mapped = receiver.recv_buffers(&stream)?;
//! assert_eq!(mapped[0].to_vec::<u8>(&stream)?, vec![7; 4096]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `examples/03_share_over_ipc.rs` does it between two processes, with events instead of
//! `synchronize` (`cargo run -p cuda-mem-ipc --example 03_share_over_ipc`). A Python process
//! that uses cuda.core takes part through the repository's `python/cuda_mem_exchange.py`.
//!
//! # Modules
//!
//! The modules are private except [`wire`]; what they hold is re-exported here.
//!
//! | module | holds |
//! |---|---|
//! | `assembly` | one frame read one `recvmsg` at a time, its descriptors owned as they come (what every channel's receive drives), into a [`RawMessage`] |
//! | `async_channel` | feature `tokio`: `AsyncChannel` (a channel's frames as cancellation-safe futures) and `AsyncChannelListener` |
//! | `channel` | [`Channel`]: framed messages and file descriptors over a Unix domain socket |
//! | `listener` | [`ChannelListener`]: connections by socket path or abstract name, admitted by a [`PeerPolicy`] of their [`PeerCredentials`] |
//! | `channel_env` | how a parent names the channel it passes a child: [`CHANNEL_FD_ENV`], [`CHANNEL_INODE_ENV`], and [`ChannelEnvError`] |
//! | `spawn` | [`spawn_with_channel`] and [`Channel::from_env`] |
//! | `protocol` | [`IpcChannel`], the blocking channel: every message's send and receive, lending |
//! | `async_ipc` | feature `tokio`: `AsyncIpcChannel`, the same messages on an `AsyncChannel` |
//! | `session` | what either channel keeps of its peer (the pools sent and received, the peer's events, the loans) and how it receives each message |
//! | `received` | [`Received`]: what a receive yields |
//! | `loans` | buffers lent to a peer: [`Held`], [`Unlent`], [`Outstanding`] |
//! | `device_naming` | how the wire names a device (its UUID), and which device here a peer's name means |
//! | `share` | the exporting side: [`allocation_handle`] ([`AllocationHandle`]), [`buffer_descriptor`] |
//! | `mapped` | [`MappedMemoryResource`] (a pool imported from another process), the process-wide [`registry()`], [`lookup`] |
//! | `registry` | [`Registry`] |
//! | `virtual_buffer` | feature `vmm`: exporting a `SharedVirtualBuffer`, and the resources a channel imports them with |
//! | `snapshot` | feature `snapshot`: the snapshot a request is answered with (fitted to one message), and a peer's snapshot read back |
//! | [`wire`] | every byte layout: frame, message kinds, resource and buffers messages, [`BufferDescriptor`], [`EventDescriptor`], `SharedVirtualBuffer`; their versions and errors |
//! | `peer` | who is at a channel's other end, as the kernel vouches for it (the key of the pools imported from it) |
//! | `error` | [`IpcError`], [`ProtocolError`], [`MessageLimit`], [`ChannelOperation`], [`Unshareable`], [`Result`] |
//!
//! The driver calls are `cuda-mem-core`'s and `cuda-mem-vmm`'s; the bytes and file descriptors on
//! the wire are this crate's. Devices, streams, buffers and pools are `cuda-mem-core`'s, and so is
//! the vocabulary: [`PoolKind`](cuda_mem_core::PoolKind), [`Location`](cuda_mem_core::Location).
//!
//! # Features
//!
//! - `vmm`: `cuda-mem-vmm`'s virtual buffers on the channel (`IpcChannel::send_virtual_buffer`,
//!   `Received::VirtualBuffer`, `IpcChannel::import_virtual_buffers_into`).
//! - `snapshot`: memory snapshots over the channel (`IpcChannel::request_snapshot`,
//!   `Received::SnapshotRequest`, `IpcChannel::answer_snapshot_request`, `Received::Snapshot`):
//!   a peer, Rust or Python's `cuda_mem_exchange`, asks this process what memory it holds.
//! - `tokio`: `AsyncChannel` and `AsyncChannelListener`, the channel's frames on Tokio's
//!   readiness, for servers (cancellation-safe; the same wire as the blocking channel).
//! - `tracing`: `DEBUG` events when a resource is imported and a buffer exported or imported,
//!   with the resource's `uuid`, the `size`, `ptr` and `pool`.
//!
//! **Linux only**: the driver exports file descriptors on Linux only. Elsewhere the crate stops
//! with one `compile_error!` (`cuda-mem-core` and `cuda-mem-vmm` build on Windows and macOS).
//!
//! # Trust boundary
//!
//! Import only from trusted peers: processes of the same user that run cooperating code. A peer
//! that shares memory can write it at any time, and can hand over memory that is not what it
//! claims. Before any driver call, this crate checks:
//!
//! - lengths: frames, payloads, descriptor counts, encoded descriptors (see [`wire`]);
//! - magic numbers, versions, reserved fields and flags, and the CRC-32 of every descriptor
//!   (it detects damage, not forgery);
//! - sizes in `1..=`[`MAX_BUFFER_SIZE`], resource UUIDs that are not nil;
//! - devices, named by UUID: one this process cannot see is refused
//!   ([`IpcError::DeviceNotVisible`]).
//!
//! After an import, the driver is asked what a pool is: a pool the peer described otherwise is
//! refused ([`IpcError::MisdescribedResource`]), and so is a pool this process holds under
//! another UUID ([`IpcError::PoolAlreadyImported`]). A descriptor or buffer the driver refuses is
//! the peer's error ([`IpcError::PoolImport`], [`IpcError::BufferImport`]). Buffers map only
//! through the pools received on their own channel. A pool is imported once per sending process
//! (as the kernel identifies it: [`Channel::peer_process_id`]) and UUID, so a UUID named by
//! another process never reaches that import. Received file descriptors are owned at once,
//! closed on any error, and never inherited by child processes.
//!
//! What cannot be checked: whether the memory is what the peer says (the export data is opaque),
//! what the peer does with it afterwards, and who the peer is beyond the process the kernel
//! names (the one that created or connected the socket's other end, which may have handed it on).
//! The exporter must also free last: see [`IpcChannel`], *Who frees first*.

// On docs.rs (which sets `docsrs`), items behind a feature say which.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Every module passes or adopts POSIX file descriptors (Unix domain sockets, `SCM_RIGHTS`,
// `/proc`), and the driver exports pools as file descriptors on Linux only: elsewhere the crate
// stops here, with one message, rather than with an error per module.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "cuda-mem-ipc builds on Linux only: it shares CUDA memory between processes by passing POSIX file \
     descriptors, which the CUDA driver exports on Linux only. On Windows and macOS depend on \
     cuda-mem-core and cuda-mem-vmm, which build there."
);

#[cfg(target_os = "linux")]
mod assembly;
#[cfg(all(target_os = "linux", feature = "tokio"))]
mod async_channel;
#[cfg(all(target_os = "linux", feature = "tokio"))]
mod async_ipc;
#[cfg(target_os = "linux")]
mod channel;
#[cfg(target_os = "linux")]
mod channel_env;
#[cfg(target_os = "linux")]
mod device_naming;
#[cfg(target_os = "linux")]
mod error;
#[cfg(target_os = "linux")]
mod listener;
#[cfg(target_os = "linux")]
mod loans;
#[cfg(target_os = "linux")]
mod mapped;
#[cfg(target_os = "linux")]
mod peer;
#[cfg(target_os = "linux")]
mod protocol;
#[cfg(target_os = "linux")]
mod received;
#[cfg(target_os = "linux")]
mod registry;
#[cfg(target_os = "linux")]
mod session;
#[cfg(target_os = "linux")]
mod share;
#[cfg(all(target_os = "linux", feature = "snapshot"))]
mod snapshot;
#[cfg(target_os = "linux")]
mod spawn;
#[cfg(all(test, target_os = "linux"))]
mod test_fds;
#[cfg(all(target_os = "linux", feature = "vmm"))]
mod virtual_buffer;
#[cfg(target_os = "linux")]
pub mod wire;

#[cfg(target_os = "linux")]
pub use assembly::RawMessage;
#[cfg(all(target_os = "linux", feature = "tokio"))]
pub use async_channel::{AsyncChannel, AsyncChannelListener};
#[cfg(all(target_os = "linux", feature = "tokio"))]
pub use async_ipc::AsyncIpcChannel;
#[cfg(target_os = "linux")]
pub use channel::Channel;
#[cfg(target_os = "linux")]
pub use channel_env::{CHANNEL_FD_ENV, CHANNEL_INODE_ENV, ChannelEnvError};
#[cfg(target_os = "linux")]
pub use error::{ChannelOperation, IpcError, MessageLimit, ProtocolError, Result, Unshareable};
#[cfg(target_os = "linux")]
pub use listener::{ChannelListener, PeerCredentials, PeerPolicy};
#[cfg(target_os = "linux")]
pub use loans::{Held, Outstanding, Unlent};
#[cfg(target_os = "linux")]
pub use mapped::{MappedMemoryResource, lookup, registry};
#[cfg(target_os = "linux")]
pub use protocol::IpcChannel;
#[cfg(target_os = "linux")]
pub use received::Received;
#[cfg(target_os = "linux")]
pub use registry::Registry;
#[cfg(target_os = "linux")]
pub use share::{AllocationHandle, allocation_handle, buffer_descriptor};
#[cfg(target_os = "linux")]
pub use spawn::spawn_with_channel;
#[cfg(all(target_os = "linux", feature = "vmm"))]
pub use wire::SharedVirtualBuffer;
#[cfg(target_os = "linux")]
pub use wire::{
    BufferDescriptor, EventDescriptor, MAX_BUFFER_SIZE, MAX_BUFFERS_PER_MESSAGE, MAX_FDS, MAX_PAYLOAD_LEN,
    SnapshotRequest,
};

/// The crate's README (its crates.io page), whose example the doc tests compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
