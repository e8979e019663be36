//! Sharing CUDA memory pools and buffers between processes through POSIX file descriptors.
//!
//! A pool created with an IPC handle type (POSIX file descriptors) can be exported as a file
//! descriptor. Another process that receives that descriptor imports the pool and maps it; from
//! then on, each buffer allocated from the pool in the exporting process can be shared by sending
//! a small fixed-size [`BufferDescriptor`], which the importing process turns into a pointer into
//! its own mapping of the same memory. Both processes then read and write the same device
//! memory, synchronizing as they would between two streams.
//!
//! This crate provides the pieces that involve the driver (exporting and importing pools and
//! buffers) and those that do not:
//!
//! - [`Channel`]: framed messages between two processes over a Unix domain socket, with file
//!   descriptors attached ([`ChannelListener`] for processes that meet at a socket path);
//! - [`spawn_with_channel`] and [`Channel::from_env`]: starting a child process that is
//!   connected to its parent by a channel;
//! - [`BufferDescriptor`]: the versioned, checksummed byte encoding of a shared buffer;
//! - [`MappedMemoryResource`]: a pool imported from another process, one per pool and process,
//!   its memory kind and device asked of the driver; it maps buffers through the counted imports
//!   of its pool (`cuda_mem_core::MemoryPool::import_allocation`);
//! - [`IpcChannel`]: pools, buffers and bytes over a [`Channel`]; the receiving side keeps what
//!   it imported for as long as it lives, and maps a peer's buffers only through the pools that
//!   peer sent on it;
//! - with the feature `vmm`: `SharedVirtualBuffer`, the versioned,
//!   checksummed encoding of a `cuda-mem-vmm` virtual buffer's descriptor (its bytes, and one
//!   file descriptor per chunk), and [`IpcChannel`] carrying virtual buffers beside pools,
//!   buffers and data (`IpcChannel::send_virtual_buffer`, `Received::VirtualBuffer`, imported
//!   with the resource the receiver registered, `IpcChannel::import_virtual_buffers_into`). The
//!   rule: driver calls are `cuda-mem-core`'s and `cuda-mem-vmm`'s, bytes and file descriptors on
//!   the wire are this crate's;
//! - [`Registry`]: a process-wide map from resource UUIDs to the live imported resources;
//! - [`IpcError`]: the crate's errors;
//! - with the feature `tracing` (which turns on `cuda-mem-core`'s, and `cuda-mem-vmm`'s with
//!   `vmm`): `DEBUG` events when a resource is imported (`"resource imported"`) and a buffer is
//!   exported or imported (`"buffer exported"`, `"buffer imported"`), with the resource's `uuid`,
//!   `size`, `ptr` and `pool`, beside the pool-level events of `cuda-mem-core`.
//!
//! **Linux only**: everything here passes POSIX file descriptors (Unix domain sockets,
//! `SCM_RIGHTS`, `/proc`), which the driver exports on Linux only; elsewhere the crate stops
//! with one `compile_error!` saying so (`cuda-mem-core` and `cuda-mem-vmm` build on Windows and
//! macOS).
//!
//! Devices, streams, buffers and pools are `cuda-mem-core`'s, and so is the vocabulary this crate
//! speaks: what memory a shared pool holds ([`PoolKind`](cuda_mem_core::PoolKind), reported by
//! [`MappedMemoryResource::kind`] and expected by [`lookup`]) and the length of an allocation's
//! export data ([`EXPORT_DATA_LEN`](cuda_mem_core::EXPORT_DATA_LEN)). Depend on `cuda-mem-core`
//! for them.
//!
//! # Which module holds what
//!
//! The modules are private but `wire`; what they hold is re-exported here, and the wire formats'
//! constants and errors are `wire`'s.
//!
//! | module | holds |
//! |---|---|
//! | [`wire`] (public) | every byte layout: [`wire::FrameHeader`], [`wire::MessageKind`], the resource and buffers messages, [`BufferDescriptor`], [`EventDescriptor`], `SharedVirtualBuffer` (feature `vmm`), each with its version and error |
//! | `channel` | [`Channel`] (sockets, descriptors, errors and threads are documented there), [`ChannelListener`], [`RawMessage`] |
//! | `spawn` | [`spawn_with_channel`] and the environment it sets, [`CHANNEL_FD_ENV`], [`CHANNEL_INODE_ENV`] |
//! | `share` | the exporting side: [`allocation_handle`] ([`AllocationHandle`]) and [`buffer_descriptor`] |
//! | `mapped` | [`MappedMemoryResource`], the process-wide [`registry()`] of them, [`lookup`] |
//! | `registry` | [`Registry`] |
//! | `protocol` | [`IpcChannel`] and what it keeps of a channel, [`Received`] |
//! | `virtual_buffer` | feature `vmm`: exporting a `SharedVirtualBuffer`, and `IpcChannel`'s virtual buffer methods |
//! | `error` | [`IpcError`], [`ProtocolError`], [`Result`] |
//!
//! # Trust boundary
//!
//! Import only from trusted peers: processes of the same user that run cooperating code. Sharing
//! device memory gives the peer the power to write it at any time, and a malicious exporter can
//! hand over memory that is not what it claims.
//!
//! What this crate validates before acting on a peer's input (and before any driver call):
//!
//! - the lengths of everything received: frames, payloads (at most [`MAX_PAYLOAD_LEN`]), the
//!   number of file descriptors (at most [`MAX_FDS`], and exactly as many as announced), and
//!   encoded descriptors (exactly [`wire::BUFFER_DESCRIPTOR_LEN`] bytes; an encoded virtual buffer exactly the
//!   length its chunk count gives, at most 253 chunks, with one file descriptor per chunk for
//!   POSIX-fd handles and none for fabric handles);
//! - magic numbers and versions (an unknown version is reported as such), and that reserved
//!   fields and flags are zero;
//! - the checksum of every [`BufferDescriptor`] (and encoded virtual buffer), which detects
//!   damaged descriptors;
//! - size bounds: a buffer size is in `1..=`[`MAX_BUFFER_SIZE`], and a resource UUID is not nil;
//! - the device of a pool: [`IpcChannel`] names it by UUID, because processes with different
//!   `CUDA_VISIBLE_DEVICES` number devices differently; a device this process cannot see is
//!   refused ([`IpcError::DeviceNotVisible`]) before anything is imported;
//! - what a pool is: its memory kind and device are asked of the driver once it is imported, and
//!   a pool the peer described otherwise is refused ([`IpcError::MisdescribedResource`]); so is
//!   a pool this process already holds under another UUID ([`IpcError::PoolAlreadyImported`]);
//! - which pools a peer may use: buffers received on a channel map only through the pools
//!   received on that same channel (never one another peer sent, whatever UUID it names), and a
//!   UUID this process already knows is trusted only when the driver confirms the new import is
//!   the same pool;
//! - the types of file descriptors that are meant to be a channel (a Unix domain stream socket,
//!   the very one the parent passed); received descriptors are owned at once (closed if the
//!   message is rejected) and never inherited by child processes.
//!
//! What cannot be validated:
//!
//! - whether the memory behind a well-formed descriptor is what the peer says it is: the export
//!   data is opaque, only the driver interprets it, and the checksum proves integrity in transit,
//!   not honesty (the peer computes it);
//! - what the peer does with shared memory afterwards: it can write to it concurrently at any
//!   time, free it, or exit; contents read from shared memory are as untrusted as the peer;
//! - the peer's identity beyond what the socket's permissions and the process tree establish.
//!
//! # Example
//!
//! Passing a file descriptor between the two ends of a channel (here both in one process; with
//! [`spawn_with_channel`] the other end is in a child process):
//!
//! ```
//! use std::io::{Read, Write};
//! use std::os::fd::AsFd;
//! use std::os::unix::net::UnixStream;
//! use cuda_mem_ipc::Channel;
//!
//! let (here, there) = Channel::pair()?;
//!
//! // Send one end of a fresh socket pair, with a message.
//! let (mut kept, sent) = UnixStream::pair().expect("socketpair");
//! here.send(1, b"write to this", &[sent.as_fd()])?;
//! drop(sent);
//!
//! // The receiver gets its own descriptor for the same socket and uses it.
//! let message = there.recv()?;
//! assert_eq!(message.kind, 1);
//! assert_eq!(message.payload, b"write to this");
//! let mut received = UnixStream::from(message.fds.into_iter().next().expect("one fd"));
//! received.write_all(b"hello through a passed descriptor").expect("write");
//! drop(received);
//!
//! let mut text = String::new();
//! kept.read_to_string(&mut text).expect("read");
//! assert_eq!(text, "hello through a passed descriptor");
//! # Ok::<(), cuda_mem_ipc::IpcError>(())
//! ```
//!
//! # Sharing a pool between two processes
//!
//! The parent sends buffers over an [`IpcChannel`] (each buffer's pool goes first, once per
//! channel); the child maps them and uses the same memory. Whoever writes hands over with an
//! interprocess event instead of synchronizing on the host: it records the event after its work
//! and sends it with the buffers ([`IpcChannel::send_buffers_after`]) or alone
//! ([`IpcChannel::send_event`]); the receiving [`IpcChannel::recv`] makes its stream wait for it
//! on the GPU (see [`IpcChannel`], *Events*). The receiving channel keeps each pool it receives
//! (the [`Received::Resource`] may be dropped at once) for as long as it lives, or until
//! [`IpcChannel::release_resource`]; buffers keep their pool alive themselves. A complete program
//! is `examples/two_process.rs` (`cargo run -p cuda-mem-ipc --example two_process`).
//!
//! ## Who frees first
//!
//! The driver's rule (`cuda.h`, `cuMemPoolImportPointer`): every process that imported a buffer
//! frees it before its exporter does, and an importer's stream-ordered free must have run by
//! then. Dropping the exporter's buffer is its free, and this crate cannot see another
//! process's imports, so the order is the program's: the importer drops its buffers (they are
//! freed on the stream given to [`IpcChannel::recv`]), waits for that stream or exits, and then
//! says so; the exporter drops after hearing it. In the example below the parent's buffer
//! outlives `child.wait()`. Memory freed too early goes back to the exporter's pool, whose next
//! allocation may take it while the importer still reads and writes it, silently on a GPU; the
//! simulator (`cuda-sim`) reports such a free on stderr, and the importer then reads `0xdb`.
//!
//! What cuda.core writes for the hand-over, with its descriptor pickled across by the user:
//!
//! ```python
//! done = stream.record(options=EventOptions(ipc_enabled=True))  # timing off
//! send(done.ipc_descriptor)                                      # the sender
//! stream.wait(Event.from_ipc_descriptor(receive()))              # the receiver: on the GPU
//! ```
//!
//! is, here, `Event::new(device, EventOptions::default().interprocess())`, `record`, and
//! [`IpcChannel::send_buffers_after`] or [`IpcChannel::send_event`] on one side, and
//! [`IpcChannel::recv`] on the other, which opens the event (once per channel) and makes the
//! stream wait (below).
//!
//! The other process may be a Python one that uses cuda.core: the repository's
//! `python/cuda_mem_exchange.py` speaks [`IpcChannel`]'s messages there, turning them into
//! cuda.core pools and buffers and cuda.core's into them (its docstring shows both directions).
//!
//! ```no_run
//! use std::process::Command;
//! use cuda_mem_core::{
//!     Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Event, EventOptions, FillPattern, MemoryResourceExt,
//!     Stream, StreamOptions,
//! };
//! use cuda_mem_ipc::{Channel, IpcChannel, Received, spawn_with_channel};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
//! // The event that hands the work over: interprocess (timing off).
//! let handed_over = Event::new(device, EventOptions::default().interprocess())?;
//! if std::env::var_os("I_AM_THE_CHILD").is_none() {
//!     // The parent: an IPC-enabled pool, a buffer filled on the stream, then sent with an
//!     // event recorded after the fill (no host synchronization).
//!     let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
//!     let mut buffer = pool.allocate(1 << 20, &stream)?;
//!     buffer.fill(FillPattern::U8(1), &stream)?;
//!     handed_over.record(&stream)?;
//!     let mut command = Command::new(std::env::current_exe()?);
//!     let (mut child, channel) = spawn_with_channel(command.env("I_AM_THE_CHILD", "1"))?;
//!     let channel = IpcChannel::new(channel);
//!     channel.send_buffers_after(&handed_over, &[&buffer])?; // the pool, then the buffer and event
//!     // The child's event: `stream` waits for the child's write.
//!     let Received::Event(_) = channel.recv(&stream)? else { panic!("expected the child's event") };
//!     // Work enqueued on `stream` from here sees the child's 2s in `buffer`.
//!     channel.send_data(b"done")?; // the child may let its event go
//!     child.wait()?;
//! } else {
//!     // The child: map the pool and the buffer (`stream` waits for the parent's fill), write,
//!     // hand the write back with its own event.
//!     // SAFETY: this process was started by the parent branch through `spawn_with_channel`,
//!     // and nothing in it but this call adopts inherited descriptors.
//!     let channel = IpcChannel::new(unsafe { Channel::from_env() }?);
//!     let Received::Resource(_) = channel.recv(&stream)? else { panic!("expected the pool") };
//!     let Received::Buffers(mut buffers) = channel.recv(&stream)? else { panic!("expected buffers") };
//!     buffers[0].fill(FillPattern::U8(2), &stream)?;
//!     handed_over.record(&stream)?;
//!     channel.send_event(&handed_over)?;
//!     let Received::Data(_) = channel.recv(&stream)? else { panic!("expected the parent's word") };
//! }
//! # Ok(())
//! # }
//! ```

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
mod channel;
#[cfg(target_os = "linux")]
mod error;
#[cfg(target_os = "linux")]
mod mapped;
#[cfg(target_os = "linux")]
mod protocol;
#[cfg(target_os = "linux")]
mod registry;
#[cfg(target_os = "linux")]
mod share;
#[cfg(target_os = "linux")]
mod spawn;
#[cfg(all(target_os = "linux", feature = "vmm"))]
mod virtual_buffer;
#[cfg(target_os = "linux")]
pub mod wire;

#[cfg(target_os = "linux")]
pub use channel::{Channel, ChannelListener, RawMessage};
#[cfg(target_os = "linux")]
pub use error::{IpcError, MessageLimit, ProtocolError, Result};
#[cfg(target_os = "linux")]
pub use mapped::{MappedMemoryResource, lookup, registry};
#[cfg(target_os = "linux")]
pub use protocol::{IpcChannel, Received};
#[cfg(target_os = "linux")]
pub use registry::Registry;
#[cfg(target_os = "linux")]
pub use share::{AllocationHandle, Unshareable, allocation_handle, buffer_descriptor};
#[cfg(target_os = "linux")]
pub use spawn::{CHANNEL_FD_ENV, CHANNEL_INODE_ENV, ChannelEnvError, spawn_with_channel};
#[cfg(all(target_os = "linux", feature = "vmm"))]
pub use wire::SharedVirtualBuffer;
#[cfg(target_os = "linux")]
pub use wire::{BufferDescriptor, EventDescriptor, MAX_BUFFER_SIZE, MAX_BUFFERS_PER_MESSAGE, MAX_FDS, MAX_PAYLOAD_LEN};

/// The crate's README (its crates.io page), whose example the doc tests compile.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
