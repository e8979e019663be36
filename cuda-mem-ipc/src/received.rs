//! [`Received`]: what a receive on an IPC channel yields, whichever channel received it
//! ([`IpcChannel`] or, with the feature `tokio`, `AsyncIpcChannel`).

use std::sync::Arc;

#[cfg(doc)]
use cuda_mem_core::Stream;
use cuda_mem_core::{Buffer, Event};

#[cfg(doc)]
use crate::IpcChannel;
use crate::mapped::MappedMemoryResource;

/// What arrived. More kinds may come with features (and later versions): match with a `_` arm.
#[derive(Debug)]
#[non_exhaustive]
pub enum Received {
    /// A pool resource, imported (or the same pool imported earlier); the channel keeps it too.
    Resource(Arc<MappedMemoryResource>),
    /// Buffers, each mapped through its (already received) resource.
    Buffers(Vec<Buffer>),
    /// The peer's own bytes.
    Data(Vec<u8>),
    /// An interprocess event of the peer, opened here (or the one opened when it came before):
    /// the stream given to [`IpcChannel::recv`] already waits for its latest recording. Other
    /// streams may wait for it too ([`Stream::wait`]); the channel keeps it.
    Event(Arc<Event>),
    /// A virtual buffer (feature `vmm`), mapped with the resource registered for where its
    /// memory lives.
    #[cfg(feature = "vmm")]
    VirtualBuffer(cuda_mem_vmm::VirtualBuffer),
    /// The peer asks for a memory snapshot of this process (feature `snapshot`): answer with
    /// [`IpcChannel::answer_snapshot_request`] (or send one of your own making with
    /// [`IpcChannel::send_snapshot`]), or not at all.
    #[cfg(feature = "snapshot")]
    SnapshotRequest(crate::wire::SnapshotRequest),
    /// A memory snapshot of the peer (feature `snapshot`), read back from its JSON.
    #[cfg(feature = "snapshot")]
    Snapshot(Box<cuda_mem_core::snapshot::MemorySnapshot>),
    /// Buffers this side lent the peer ([`IpcChannel::lend`]), handed back: this process's own
    /// buffers again, which the peer no longer maps (it freed its imports, and the frees ran,
    /// before it said so).
    Returned(Vec<Buffer>),
}
