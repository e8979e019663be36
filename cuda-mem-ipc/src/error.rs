//! The crate's error type, [`IpcError`].

use std::fmt;

use cuda_mem_core::PoolKind;

use crate::channel_env::ChannelEnvError;

use crate::wire::{
    BufferDescriptorError, BuffersMessageError, EventDescriptorError, FrameError, MessageError, MessageKind,
    ResourceMessageError, SnapshotRequestError,
};

/// Everything that can go wrong in `cuda-mem-ipc`.
///
/// Every fallible function of `cuda-mem-ipc` returns [`IpcError`]. The variants separate what the
/// caller can act on differently:
///
/// - a failed driver call or core-library check ([`IpcError::Core`]);
/// - a failed system call, with what was being done ([`IpcError::Io`]), one that failed partway
///   through a message ([`IpcError::ChannelBroken`]), and a channel's time-out
///   ([`IpcError::Timeout`]);
/// - bytes or messages from the peer that do not follow the format
///   ([`IpcError::BufferDescriptor`], [`IpcError::EventDescriptor`],
///   `IpcError::SharedVirtualBuffer` (feature `vmm`), [`IpcError::Protocol`]): the peer is
///   broken, incompatible or hostile;
/// - an event the peer sent that the driver will not open ([`IpcError::EventImport`]): the peer
///   destroyed it too early, or sent a bad handle; likewise a pool descriptor or a buffer the
///   driver refuses to import ([`IpcError::PoolImport`], [`IpcError::BufferImport`]): the peer's
///   error, the driver's refusal kept as the source;
/// - a message of a kind this build receives only with a feature it lacks
///   ([`IpcError::NotReceivable`]), or of another kind than the call receives
///   ([`IpcError::UnexpectedMessage`]): the channel goes on;
/// - the peer going away ([`IpcError::PeerClosed`]);
/// - this process running out of file descriptors while receiving
///   ([`IpcError::OutOfDescriptors`]): local, the peer is not at fault;
/// - lookups and uses of shared resources that cannot succeed ([`IpcError::UnknownResource`],
///   [`IpcError::WrongResource`], [`IpcError::WrongResourceKind`], [`IpcError::NotIpcEnabled`],
///   [`IpcError::DeviceNotVisible`]), and a pool that cannot go on a channel that carried
///   another under its UUID ([`IpcError::UuidTakenOnChannel`]);
/// - pools the peer describes otherwise than the driver does ([`IpcError::MisdescribedResource`])
///   or sends a second time under another UUID ([`IpcError::PoolAlreadyImported`]), and buffers
///   it claims larger than the memory it shares ([`IpcError::MisdescribedBuffer`]); allocating
///   from a mapped resource is refused by the resource itself, with a core error
///   ([`cuda_mem_core::SharingError::ImportedPoolAllocation`]).
/// - with the feature `vmm`, virtual buffers that cannot be exported or imported
///   (`IpcError::Vmm`, with `cuda-mem-vmm`'s error) or that nothing is registered to import
///   (`IpcError::NoVirtualMemoryResource`);
/// - arguments the local caller passed beyond the limits ([`IpcError::MessageTooLarge`]) and a
///   process that was not started with a channel ([`IpcError::ChannelEnv`], whose
///   [`ChannelEnvError`] says what is missing or wrong).
///
/// A failed system or driver call stays the [`source`](std::error::Error::source), and
/// [`IpcError::cuda_code`] finds a driver code anywhere in the chain. [`IpcError::Protocol`]
/// groups the cases where the peer is not a compatible exporter (a bad frame, a malformed
/// message, a channel out of step); its [`ProtocolError`] says which check failed.
///
/// # Whether the channel goes on
///
/// [`IpcError::channel_usable`] says whether the channel an error came from can still be used,
/// and every error's message says it in the same words: "the channel is still usable" (the
/// failed message was read whole, or nothing of it was sent: the next one is received or sent
/// normally) or "the channel is no longer usable: drop it and open a new one" (the peer closed
/// it, or message boundaries are lost in one direction: a frame cut short or malformed, a
/// time-out or failed system call partway through a message). Python's `cuda_mem_exchange`
/// words its exceptions the same way, and gives them the same `channel_usable`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IpcError {
    /// A driver call failed, or `cuda-mem-core` refused an operation.
    #[error(transparent)]
    Core(#[from] cuda_mem_core::Error),

    /// A system call failed before anything of a message went out or came in (or outside any
    /// message: creating, connecting, configuring a channel); a channel it was made on is still
    /// usable.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, such as "sending a message on the IPC channel".
        context: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A system call failed partway through a message, or a send came after such a failure: the
    /// channel lost its message boundaries in that direction and is no longer usable.
    #[error(
        "{context}: {source}; message boundaries are lost, so the channel is no longer usable: drop it and open a \
         new one"
    )]
    ChannelBroken {
        /// What was being done, such as "receiving a message on the IPC channel".
        context: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The channel's time-out ran out ([`Channel::set_read_timeout`](crate::Channel::set_read_timeout),
    /// [`Channel::set_write_timeout`](crate::Channel::set_write_timeout)). Before the first byte
    /// of a message the channel is still usable (try again); partway through one its message
    /// boundaries are lost in that direction.
    #[error("{operation} timed out {}", timeout_advice(.channel_usable))]
    Timeout {
        /// Receiving or sending.
        operation: ChannelOperation,
        /// Whether the time-out struck before any byte of the message (the channel goes on).
        channel_usable: bool,
        /// The socket's error (`EAGAIN`: kind [`WouldBlock`](std::io::ErrorKind::WouldBlock)).
        #[source]
        source: std::io::Error,
    },

    /// A buffer descriptor received from a peer is malformed; nothing was imported.
    #[error(
        "invalid buffer descriptor: {0}; the peer is not a compatible cuda-mem-ipc exporter \
         or the bytes were damaged in transit, so nothing was imported; the channel is still usable"
    )]
    BufferDescriptor(#[from] BufferDescriptorError),

    /// An event descriptor received from a peer is malformed; no event was opened and no
    /// stream waits for one (a buffers message that came with it imported none of its buffers).
    #[error(
        "invalid event descriptor: {0}; the peer is not a compatible cuda-mem-ipc exporter or the bytes were \
         damaged in transit, so no event was opened and nothing was imported; the channel is still usable"
    )]
    EventDescriptor(#[from] EventDescriptorError),

    /// The driver refused to open the interprocess event a peer sent; no stream waits for it
    /// (a buffers message that came with it imported none of its buffers), and the channel is
    /// still usable.
    #[error(
        "the peer's event (its id {id}) could not be opened: {source}; the peer must hold the event (not destroy it, \
         not exit) until this side has received it, and the handle must be the driver's; nothing was imported and \
         the channel is still usable"
    )]
    EventImport {
        /// The exporting process's id of the event.
        id: u64,
        /// The core library's error (the driver's refusal).
        #[source]
        source: cuda_mem_core::Error,
    },

    /// The driver refused to import the pool a peer sent (`cuMemPoolImportFromShareableHandle`
    /// answered `CUDA_ERROR_INVALID_VALUE` or `CUDA_ERROR_INVALID_HANDLE`): the descriptor is not
    /// an exported pool, or not one this process can import. The peer's error; nothing was
    /// imported and the channel is still usable.
    #[error(
        "the peer's pool {uuid} could not be imported: {source}; the descriptor the peer sent is not an exported \
         memory pool this process can import (the peer is broken or hostile), so nothing was imported; the \
         channel is still usable"
    )]
    PoolImport {
        /// The UUID the peer named the pool with.
        uuid: uuid::Uuid,
        /// The core library's error (the driver's refusal).
        #[source]
        source: cuda_mem_core::Error,
    },

    /// The driver refused to map a buffer a peer described (`cuMemPoolImportPointer` answered
    /// `CUDA_ERROR_INVALID_VALUE` or `CUDA_ERROR_INVALID_HANDLE`): its export data is not an
    /// allocation of the pool it names that the exporter still holds. The peer's error; nothing
    /// of its message stayed mapped and the channel is still usable.
    #[error(
        "the driver refused the peer's buffer of pool {resource}: {source}; the descriptor's export data is not a \
         live allocation of that pool (the peer freed it already, or sent another pool's or made-up data), so \
         nothing was imported; the channel is still usable"
    )]
    BufferImport {
        /// The resource the buffer names.
        resource: uuid::Uuid,
        /// The core library's error (the driver's refusal).
        #[source]
        source: cuda_mem_core::Error,
    },

    /// A virtual buffer received from a peer is malformed (feature `vmm`); nothing was imported
    /// and the file descriptors that came with it are closed.
    #[cfg(feature = "vmm")]
    #[error(
        "invalid virtual buffer descriptor: {0}; the peer is not a compatible cuda-mem-ipc exporter \
         or the bytes were damaged in transit, so nothing was imported (its file descriptors are closed); the \
         channel is still usable"
    )]
    SharedVirtualBuffer(#[from] crate::wire::SharedVirtualBufferError),

    /// Exporting or importing a virtual buffer failed in `cuda-mem-vmm` (feature `vmm`): its
    /// error says which check or driver call, and nothing stays imported.
    #[cfg(feature = "vmm")]
    #[error(transparent)]
    Vmm(#[from] cuda_mem_vmm::VmmError),

    /// A virtual buffer arrived whose memory lives where no resource was registered to import
    /// it (feature `vmm`); it was not imported and its file descriptors are closed.
    #[cfg(feature = "vmm")]
    #[error(
        "a virtual buffer of {location} arrived, but no VirtualMemoryResource is registered on this channel \
         for it: register one for that location with IpcChannel::import_virtual_buffers_into (with the \
         sender's handle type) before the peer sends; this one was not imported, and the channel is still usable"
    )]
    NoVirtualMemoryResource {
        /// Where the buffer's memory lives, in this process's terms.
        location: cuda_mem_core::Location,
    },

    /// The peer sent a message of a kind this build cannot receive without a feature it lacks;
    /// the message was dropped (its file descriptors closed) and the channel is still in step.
    #[error(
        "a {kind} (message kind {}), which this build cannot receive: enable cuda-mem-ipc's `{feature}` \
         feature; the message was dropped (its file descriptors closed) and the channel is still usable",
        .kind.code()
    )]
    NotReceivable {
        /// The message's kind ([`MessageKind::VirtualBuffer`]).
        kind: MessageKind,
        /// The feature that receives it.
        feature: &'static str,
    },

    /// A message of another kind came where [`IpcChannel::recv_buffers`](crate::IpcChannel::recv_buffers)
    /// expected buffers. It was dropped unread (nothing of it imported, its file descriptors
    /// closed), and the channel is still in step.
    #[error(
        "expected a {expected} message, but a {found} message came; it was dropped (nothing of it imported) and \
         the channel is still usable: receive with IpcChannel::recv where other messages may come first"
    )]
    UnexpectedMessage {
        /// The kind expected.
        expected: MessageKind,
        /// The kind that came.
        found: MessageKind,
    },

    /// The peer sent a frame or message that does not follow the channel protocol, or an earlier
    /// one broke the channel. Whether the channel goes on depends on which
    /// ([`ProtocolError::channel_usable`]): after a message read whole it does, after a frame
    /// that is malformed or cut short it does not.
    #[error(
        "malformed message from the IPC peer: {0}; check that both processes use compatible cuda-mem-ipc \
         versions; {advice}",
        advice = .0.advice()
    )]
    Protocol(#[from] ProtocolError),

    /// This process ran out of file descriptors while receiving a message, so the system could
    /// not hand it the descriptors the message carried.
    ///
    /// The message was read to its end and dropped (its descriptors closed); the channel is
    /// still in step and usable. Nothing is wrong with the peer: free descriptors here, then
    /// have the peer send the message again.
    #[error(
        "this process is out of file descriptors, so the {fds} descriptor(s) of a message of \
         kind {kind} could not be received; the message was dropped and the channel is still \
         usable: close descriptors or raise RLIMIT_NOFILE (`ulimit -n`), then have the peer \
         send it again"
    )]
    OutOfDescriptors {
        /// The kind of the dropped message.
        kind: u16,
        /// The number of descriptors its header announced.
        fds: usize,
    },

    /// The peer closed its end of the channel (it exited or dropped its channel).
    #[error(
        "the IPC peer closed the channel (it exited or dropped its end); no more messages will arrive, so the \
         channel is no longer usable: drop it and open a new one"
    )]
    PeerClosed,

    /// No live resource with this UUID is registered in this process, or, for buffers received
    /// on a channel, was received on that channel (and not released).
    #[error(
        "no live memory resource with UUID {0} is known here (a channel maps buffers only through the \
         pools it received itself): import the exporting resource (its pool) before importing buffers \
         from it, and keep it alive while they are in use; the channel is still usable"
    )]
    UnknownResource(uuid::Uuid),

    /// The peer described a pool otherwise than the driver reports it (device memory as pinned
    /// host memory, or another device); the pool was not kept.
    #[error(
        "the peer described memory pool {uuid} as a {claimed}, but the driver reports a {actual}: the \
         peer is broken or hostile, so the pool was not imported; the channel is still usable"
    )]
    MisdescribedResource {
        /// The UUID the peer named the pool with.
        uuid: uuid::Uuid,
        /// What the peer said it is.
        claimed: PoolKind,
        /// What the driver says it is.
        actual: PoolKind,
    },

    /// A pool this process already holds under another UUID (or its own pool) was imported again;
    /// the import was not kept, and the pool is as it was.
    #[error(
        "memory pool {uuid} is one this process already holds under another UUID (or its own pool): a \
         pool is imported once per process, so it was not imported again; use the first import; the channel is \
         still usable"
    )]
    PoolAlreadyImported {
        /// The UUID it was sent (or imported) under this time.
        uuid: uuid::Uuid,
        /// The core library's refusal.
        #[source]
        source: cuda_mem_core::Error,
    },

    /// The peer described a buffer as larger than the memory the driver maps for it (the size in
    /// the descriptor is wrong); nothing was imported.
    #[error(
        "malformed message from the IPC peer: the descriptor claims {claimed} bytes but the shared allocation maps \
         only {mapped}; the peer sent a bad size, so nothing of its message was imported; the channel is still \
         usable"
    )]
    MisdescribedBuffer {
        /// The resource the buffer belongs to.
        resource: uuid::Uuid,
        /// The size the descriptor claims.
        claimed: usize,
        /// The size the driver maps.
        mapped: usize,
    },

    /// A pool was to be sent on a channel that already carried another pool under the same UUID,
    /// or to a process (identified by the kernel) that was sent another pool under it on another
    /// channel (a process passing on two imports that different peers named alike): the receiver
    /// would map this pool's buffers through the other one, so nothing of it was sent. The
    /// channel goes on; send this pool on another channel, to another process.
    #[error(
        "another pool is (or was) sent under the same UUID {uuid} on this channel, or to the process at its other \
         end (two imports named alike, by different peers), and the receiver would map this pool's buffers \
         through that one: nothing of it was sent, and the channel is still usable; send it on another channel, \
         to another process where the peer is identified (Channel::peer_process_id)"
    )]
    UuidTakenOnChannel {
        /// The UUID both pools go by.
        uuid: uuid::Uuid,
    },

    /// A buffer descriptor names another resource than the one asked to import it.
    #[error(
        "the buffer descriptor belongs to memory resource {found}, not to {expected}: import it \
         through the resource it names"
    )]
    WrongResource {
        /// The resource asked to import the buffer.
        expected: uuid::Uuid,
        /// The resource the descriptor names.
        found: uuid::Uuid,
    },

    /// A resource was found, but it is not of the kind the operation needs.
    #[error("memory resource {uuid} is a {found}, but this operation needs a {expected}")]
    WrongResourceKind {
        /// The resource's UUID.
        uuid: uuid::Uuid,
        /// The kind the operation needs.
        expected: PoolKind,
        /// The kind it is.
        found: PoolKind,
    },

    /// A peer sent a pool of a device this process does not see (the two processes see
    /// different sets of devices, through `CUDA_VISIBLE_DEVICES` for example).
    #[error(
        "the pool lives on a device this process cannot see (device UUID {uuid}, device {sender_ordinal} \
         in the sending process); make it visible here (check CUDA_VISIBLE_DEVICES in both processes); the \
         channel is still usable"
    )]
    DeviceNotVisible {
        /// The device's UUID.
        uuid: uuid::Uuid,
        /// Its ordinal in the sending process (which may differ from any ordinal here).
        sender_ordinal: i32,
    },

    /// The resource or buffer cannot be shared because it was not created for sharing.
    #[error(
        "{0} is not IPC-enabled: create its pool with an IPC handle type (POSIX file \
         descriptors) to share it between processes"
    )]
    NotIpcEnabled(Unshareable),

    /// A message to send is beyond the channel's limits; nothing was sent.
    #[error(
        "cannot send: the {what} is {actual}, more than the limit of {limit}; nothing was \
         sent, split the data over several messages; the channel is still usable"
    )]
    MessageTooLarge {
        /// What is too large.
        what: MessageLimit,
        /// The size asked for.
        actual: usize,
        /// The most allowed.
        limit: usize,
    },

    /// A [`ChannelListener`](crate::ChannelListener)'s [`PeerPolicy`](crate::PeerPolicy)
    /// refused a peer: its connection was closed, and the listener goes on.
    #[error(
        "the listener's peer policy refused {credentials}: its connection was closed; the listener is still usable"
    )]
    PeerRefused {
        /// The refused peer, as the kernel reports it.
        credentials: crate::PeerCredentials,
    },

    /// The peer handed back a buffer that was not lent to it on this channel (or more of one
    /// than it had): the whole message was refused, every loan stays as it was, and the channel
    /// goes on.
    #[error(
        "the peer handed back a buffer of {size} bytes of pool {resource} that was not lent to it on this channel; \
         nothing was taken back and the channel is still usable"
    )]
    NotLent {
        /// The pool's UUID, as the peer named it.
        resource: uuid::Uuid,
        /// The size the peer's descriptor states.
        size: u64,
    },

    /// A buffer given back (`IpcChannel::give_back`) was not lent through this channel: not an
    /// import of a pool it received. Nothing was freed or sent.
    #[error(
        "buffer {ptr:#x} was not received on this channel, so it cannot be given back on it; nothing was \
         freed or sent and the channel is still usable"
    )]
    NotReceivedHere {
        /// Its address in this process.
        ptr: cuda_mem_core::DevicePtr,
    },

    /// The channel a parent passed through the environment cannot be taken; nothing was taken.
    #[error(
        "cannot take the IPC channel from the environment: {0}; start this process with \
         cuda_mem_ipc::spawn_with_channel"
    )]
    ChannelEnv(#[from] ChannelEnvError),

    /// The peer's memory snapshot (feature `snapshot`) is not one this build reads: not its JSON,
    /// or a newer schema. The message was read whole, so the channel is still in step.
    #[cfg(feature = "snapshot")]
    #[error("the peer's memory snapshot cannot be read: {0}; the message was dropped and the channel is still usable")]
    Snapshot(#[source] cuda_mem_core::snapshot::SnapshotFormatError),
}

/// The words every error message ends its advice with when the channel goes on.
pub(crate) const CHANNEL_USABLE: &str = "the channel is still usable";
/// The words every error message ends its advice with when the channel does not go on.
pub(crate) const CHANNEL_BROKEN: &str = "the channel is no longer usable: drop it and open a new one";

/// What [`IpcError::Timeout`] says after "timed out".
fn timeout_advice(channel_usable: &bool) -> String {
    if *channel_usable {
        format!("before any byte of the message (the channel's time-out ran out); {CHANNEL_USABLE}")
    } else {
        format!(
            "partway through a message (the channel's time-out ran out), so message boundaries are lost; \
             {CHANNEL_BROKEN}"
        )
    }
}

/// What timed out ([`IpcError::Timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelOperation {
    /// Receiving a message ([`Channel::recv`](crate::Channel::recv)).
    Receive,
    /// Sending a message ([`Channel::send`](crate::Channel::send)).
    Send,
}

impl fmt::Display for ChannelOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChannelOperation::Receive => "receiving a message on the IPC channel",
            ChannelOperation::Send => "sending a message on the IPC channel",
        })
    }
}

/// What is beyond a channel's limits ([`IpcError::MessageTooLarge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MessageLimit {
    /// The payload's bytes ([`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN)).
    Payload,
    /// The file descriptors ([`MAX_FDS`](crate::MAX_FDS)).
    FileDescriptors,
    /// The buffers of one message ([`MAX_BUFFERS_PER_MESSAGE`](crate::MAX_BUFFERS_PER_MESSAGE)).
    Buffers,
}

impl fmt::Display for MessageLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageLimit::Payload => "payload",
            MessageLimit::FileDescriptors => "number of file descriptors",
            MessageLimit::Buffers => "number of buffers",
        })
    }
}

/// How a peer broke the channel protocol ([`IpcError::Protocol`]): a frame or message that does
/// not follow its format (each format's error says which check failed), or what the channel
/// keeps of the peer contradicted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A malformed frame: the channel no longer finds message boundaries after it.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// An earlier frame was cut short or malformed, so the channel refuses to receive.
    #[error("an earlier message was cut short or malformed, so message boundaries are lost")]
    OutOfStep,
    /// A frame that is no message of an [`IpcChannel`](crate::IpcChannel).
    #[error(transparent)]
    Message(#[from] MessageError),
    /// A malformed resource message.
    #[error(transparent)]
    ResourceMessage(#[from] ResourceMessageError),
    /// A buffers message whose count and length do not add up.
    #[error(transparent)]
    BuffersMessage(#[from] BuffersMessageError),
    /// The peer sent an event again with another handle than before: an id names one event.
    #[error("the peer sent its event {id} with another handle than before: an id names one event")]
    EventHandleChanged {
        /// The peer's id of the event.
        id: u64,
    },
    /// A malformed snapshot request.
    #[error(transparent)]
    SnapshotRequest(#[from] SnapshotRequestError),
    /// A buffer larger than this machine's address space (a 32-bit process).
    #[error("a buffer of {size} bytes does not fit this machine")]
    BufferBeyondAddressSpace {
        /// The size the descriptor claims.
        size: u64,
    },
}

impl ProtocolError {
    /// Whether the channel is still usable after this error: `true` when the message was read
    /// whole and only its contents are wrong (the next message is received normally), `false`
    /// when message boundaries are lost ([`ProtocolError::Frame`], [`ProtocolError::OutOfStep`]).
    pub fn channel_usable(&self) -> bool {
        !matches!(self, ProtocolError::Frame(_) | ProtocolError::OutOfStep)
    }

    /// What the error's message advises: whether the channel goes on, in the crate's words.
    fn advice(&self) -> &'static str {
        if self.channel_usable() {
            "the message was dropped and the channel is still usable"
        } else {
            "message boundaries are lost, so the channel is no longer usable: drop it and open a new one"
        }
    }
}

/// A malformed frame or message, as the channel reports it.
impl From<FrameError> for IpcError {
    fn from(error: FrameError) -> Self {
        IpcError::Protocol(ProtocolError::from(error))
    }
}

/// A malformed frame or message, as the channel reports it.
impl From<MessageError> for IpcError {
    fn from(error: MessageError) -> Self {
        IpcError::Protocol(ProtocolError::from(error))
    }
}

/// A malformed frame or message, as the channel reports it.
impl From<ResourceMessageError> for IpcError {
    fn from(error: ResourceMessageError) -> Self {
        IpcError::Protocol(ProtocolError::from(error))
    }
}

/// A malformed frame or message, as the channel reports it.
impl From<SnapshotRequestError> for IpcError {
    fn from(error: SnapshotRequestError) -> Self {
        IpcError::Protocol(ProtocolError::from(error))
    }
}

/// A malformed frame or message, as the channel reports it.
impl From<BuffersMessageError> for IpcError {
    fn from(error: BuffersMessageError) -> Self {
        IpcError::Protocol(ProtocolError::from(error))
    }
}

impl IpcError {
    /// An [`IpcError::Io`] with its context.
    pub(crate) fn io(context: &'static str, source: impl Into<std::io::Error>) -> Self {
        IpcError::Io { context, source: source.into() }
    }

    /// Whether the channel this error came from is still usable: `false` after the peer closed it
    /// ([`IpcError::PeerClosed`]) or once its message boundaries are lost in a direction
    /// ([`IpcError::ChannelBroken`], an [`IpcError::Timeout`] partway through a message, a
    /// [`ProtocolError`] whose [`channel_usable`](ProtocolError::channel_usable) is `false`):
    /// drop it then, and open a new one. `true` for every other error: the failed message was
    /// read whole (and dropped), or nothing of it was sent, so the channel goes on; also for the
    /// errors that involve no channel (a lookup, a local import, a process started without a
    /// channel). Each error's message says the same.
    pub fn channel_usable(&self) -> bool {
        match self {
            IpcError::PeerClosed | IpcError::ChannelBroken { .. } => false,
            IpcError::Timeout { channel_usable, .. } => *channel_usable,
            IpcError::Protocol(error) => error.channel_usable(),
            _ => true,
        }
    }

    /// The driver's code, when the error came from a driver call: a core error's, or one found
    /// anywhere in the error's source chain (see [`cuda_mem_core::cuda_code_of`]).
    pub fn cuda_code(&self) -> Option<cuda_mem_core::sys::types::CUresult> {
        match self {
            // Transparent: their source chains start below the wrapped error, so ask it directly.
            IpcError::Core(error) => error.cuda_code(),
            #[cfg(feature = "vmm")]
            IpcError::Vmm(error) => error.cuda_code(),
            other => cuda_mem_core::cuda_code_of(other),
        }
    }
}

/// An `IpcError` as `cuda-mem-core`'s error, for [`MemoryResource`](cuda_mem_core::MemoryResource)
/// methods, whose signatures name that type: a core error as it was, any other kept whole as an
/// [`Error::Resource`](cuda_mem_core::Error::Resource) (its source, for downcasting).
impl From<IpcError> for cuda_mem_core::Error {
    fn from(error: IpcError) -> Self {
        match error {
            IpcError::Core(error) => error,
            // Unwrapped, so that a core error inside comes out as itself and a driver error
            // inside stays in the source chain (both wrappers are transparent).
            #[cfg(feature = "vmm")]
            IpcError::Vmm(error) => error.into(),
            other => cuda_mem_core::Error::resource(other),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = IpcError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn io_errors_keep_context_and_source() {
        let e = IpcError::io(
            "sending a message",
            std::io::Error::from_raw_os_error(32), // EPIPE
        );
        let text = e.to_string();
        assert!(text.starts_with("sending a message: "), "{text}");
        let source = e.source().map(|s| s.to_string()).unwrap_or_default();
        assert!(!source.is_empty(), "the io error must be the source");
    }

    #[test]
    fn messages_say_what_to_do() {
        let uuid = uuid::Uuid::from_u128(0x1234);
        let cases = [
            (IpcError::PeerClosed, "closed the channel"),
            (
                IpcError::Protocol(ProtocolError::OutOfStep),
                "malformed message from the IPC peer: an earlier message was cut short or malformed, so message \
                 boundaries are lost; check that both processes use compatible cuda-mem-ipc versions; message \
                 boundaries are lost, so the channel is no longer usable: drop it and open a new one",
            ),
            (
                IpcError::from(MessageError::UnknownKind { kind: 9 }),
                "malformed message from the IPC peer: unknown message kind 9; check",
            ),
            (
                IpcError::Protocol(ProtocolError::EventHandleChanged { id: 4 }),
                "the peer sent its event 4 with another handle than before",
            ),
            (IpcError::UnknownResource(uuid), "import the exporting resource"),
            (
                IpcError::WrongResourceKind { uuid, expected: PoolKind::Pinned, found: PoolKind::Managed },
                "is a managed memory pool, but this operation needs a pinned host memory pool",
            ),
            (
                IpcError::NotIpcEnabled(Unshareable::PoolKind(PoolKind::Managed)),
                "a managed memory pool is not IPC-enabled: create its pool with an IPC handle type",
            ),
            (IpcError::NotIpcEnabled(Unshareable::BufferView), "a buffer view (it owns no memory) is not IPC-enabled"),
            (
                IpcError::WrongResource { expected: uuid, found: uuid::Uuid::from_u128(5) },
                "belongs to memory resource 00000000-0000-0000-0000-000000000005, not to \
                 00000000-0000-0000-0000-000000001234",
            ),
            (
                IpcError::MessageTooLarge { what: MessageLimit::Payload, actual: 20, limit: 10 },
                "the payload is 20, more than the limit of 10",
            ),
            (
                IpcError::ChannelEnv(ChannelEnvError::NoDescriptor),
                "environment: CUDA_MEM_IPC_CHANNEL_FD is not set, so this process was not given a channel; start \
                 this process with cuda_mem_ipc::spawn_with_channel",
            ),
            (
                IpcError::MisdescribedBuffer { resource: uuid, claimed: 9000, mapped: 8192 },
                "the descriptor claims 9000 bytes but the shared allocation maps only 8192; the peer sent a bad size",
            ),
            (
                IpcError::OutOfDescriptors { kind: 3, fds: 2 },
                "the 2 descriptor(s) of a message of kind 3 could not be received; the message \
                 was dropped and the channel is still usable: close descriptors or raise \
                 RLIMIT_NOFILE",
            ),
            (IpcError::BufferDescriptor(BufferDescriptorError::NilResource), "invalid buffer descriptor: resource"),
            (IpcError::EventDescriptor(EventDescriptorError::NoEventId), "invalid event descriptor: event id is 0"),
            (
                IpcError::NotReceivable { kind: MessageKind::VirtualBuffer, feature: "vmm" },
                "a virtual buffer (message kind 4), which this build cannot receive: enable cuda-mem-ipc's `vmm`",
            ),
            (
                IpcError::EventImport { id: 7, source: cuda_mem_core::Error::EventNotInterprocess },
                "the peer's event (its id 7) could not be opened: ",
            ),
        ];
        for (error, needle) in cases {
            let text = error.to_string();
            assert!(text.contains(needle), "{text:?} should contain {needle:?}");
        }
        assert!(IpcError::UnknownResource(uuid).to_string().contains(&uuid.to_string()));
    }

    /// Every error of a channel says in its message whether the channel goes on, in the same
    /// words, and [`IpcError::channel_usable`] says the same.
    #[test]
    fn every_channel_error_says_whether_the_channel_goes_on() {
        use crate::wire::{BuffersMessageError, FrameError};
        let uuid = uuid::Uuid::from_u128(0x77);
        let driver = || {
            cuda_mem_core::Error::from(cuda_mem_core::sys::DriverError::from_header(
                "cuMemPoolImportFromShareableHandle",
                cuda_mem_core::sys::types::CUresult::CUDA_ERROR_INVALID_VALUE,
            ))
        };
        let eagain = || std::io::Error::from_raw_os_error(11);
        let usable = [
            IpcError::Protocol(ProtocolError::BuffersMessage(BuffersMessageError::NoCount { found: 3 })),
            IpcError::from(MessageError::UnknownKind { kind: 9 }),
            IpcError::Protocol(ProtocolError::EventHandleChanged { id: 4 }),
            IpcError::Timeout { operation: ChannelOperation::Receive, channel_usable: true, source: eagain() },
            IpcError::Timeout { operation: ChannelOperation::Send, channel_usable: true, source: eagain() },
            IpcError::BufferDescriptor(BufferDescriptorError::NilResource),
            IpcError::EventDescriptor(EventDescriptorError::NoEventId),
            IpcError::EventImport { id: 7, source: cuda_mem_core::Error::EventNotInterprocess },
            IpcError::PoolImport { uuid, source: driver() },
            IpcError::BufferImport { resource: uuid, source: driver() },
            IpcError::NotReceivable { kind: MessageKind::VirtualBuffer, feature: "vmm" },
            IpcError::UnexpectedMessage { expected: MessageKind::Buffers, found: MessageKind::Data },
            IpcError::OutOfDescriptors { kind: 3, fds: 2 },
            IpcError::UnknownResource(uuid),
            IpcError::MisdescribedResource { uuid, claimed: PoolKind::Pinned, actual: PoolKind::Managed },
            IpcError::PoolAlreadyImported { uuid, source: driver() },
            IpcError::MisdescribedBuffer { resource: uuid, claimed: 9000, mapped: 8192 },
            IpcError::UuidTakenOnChannel { uuid },
            IpcError::DeviceNotVisible { uuid, sender_ordinal: 3 },
            IpcError::MessageTooLarge { what: MessageLimit::Payload, actual: 20, limit: 10 },
        ];
        let broken = [
            IpcError::PeerClosed,
            IpcError::Protocol(ProtocolError::OutOfStep),
            IpcError::from(FrameError::TruncatedHeader { received: 3, len: 24 }),
            IpcError::Timeout { operation: ChannelOperation::Receive, channel_usable: false, source: eagain() },
            IpcError::ChannelBroken { context: "receiving", source: std::io::Error::from_raw_os_error(12) },
        ];
        for (errors, expected, words, not) in
            [(&usable[..], true, CHANNEL_USABLE, CHANNEL_BROKEN), (&broken[..], false, CHANNEL_BROKEN, CHANNEL_USABLE)]
        {
            for error in errors {
                let text = error.to_string();
                assert_eq!(error.channel_usable(), expected, "{error:?}");
                assert!(text.contains(words) && !text.contains(not), "{error:?} says: {text}");
                assert!(!text.contains("drop this channel"), "the old advice, whatever the error: {text}");
            }
        }
        // A driver error keeps its code through the peer's error.
        let refused = IpcError::PoolImport { uuid, source: driver() };
        assert_eq!(refused.cuda_code(), Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_INVALID_VALUE));
        assert!(std::error::Error::source(&refused).is_some());
        assert!(refused.to_string().contains("the descriptor the peer sent is not an exported memory pool"));
    }

    #[test]
    fn core_errors_convert_transparently() {
        let core = cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::PoolNotIpcEnabled);
        let text = core.to_string();
        let e: IpcError = core.into();
        assert!(matches!(e, IpcError::Core(_)));
        assert_eq!(e.to_string(), text);
        // And back: a core error as it was.
        assert!(matches!(
            cuda_mem_core::Error::from(e),
            cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::PoolNotIpcEnabled)
        ));
    }

    #[test]
    fn other_errors_become_core_resource_errors_kept_whole() {
        let core = cuda_mem_core::Error::from(IpcError::PeerClosed);
        let cuda_mem_core::Error::Resource(source) = &core else { panic!("expected a resource error, got {core:?}") };
        assert!(matches!(source.downcast_ref::<IpcError>(), Some(IpcError::PeerClosed)));
        assert_eq!(core.to_string(), IpcError::PeerClosed.to_string());
    }

    #[test]
    fn the_driver_code_is_found_through_the_chain() {
        use cuda_mem_core::sys::types::CUresult;
        let oom = || {
            cuda_mem_core::Error::from(cuda_mem_core::sys::DriverError::from_header(
                "cuMemPoolImportFromShareableHandle",
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            ))
        };
        assert_eq!(IpcError::Core(oom()).cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let wrapped = IpcError::PoolAlreadyImported { uuid: uuid::Uuid::from_u128(1), source: oom() };
        assert_eq!(wrapped.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        // Through core's resource error and back into a channel error.
        let there_and_back = IpcError::Core(cuda_mem_core::Error::from(IpcError::PoolAlreadyImported {
            uuid: uuid::Uuid::from_u128(2),
            source: oom(),
        }));
        assert_eq!(there_and_back.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(IpcError::PeerClosed.cuda_code(), None);
        assert_eq!(IpcError::io("sending", std::io::Error::from_raw_os_error(32)).cuda_code(), None);
    }

    #[test]
    fn errors_are_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<IpcError>();
    }
}

/// What cannot be shared ([`IpcError::NotIpcEnabled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unshareable {
    /// A resource that is not a memory pool.
    NotAPool,
    /// A memory pool created without an IPC handle type.
    PoolWithoutHandleType,
    /// A pool of a kind that cannot be shared: only device and pinned pools can.
    PoolKind(PoolKind),
    /// A buffer view, which owns no memory.
    BufferView,
}

impl fmt::Display for Unshareable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unshareable::NotAPool => f.write_str("a resource that is not a memory pool"),
            Unshareable::PoolWithoutHandleType => f.write_str("this resource's memory pool"),
            Unshareable::PoolKind(kind) => write!(f, "a {kind}"),
            Unshareable::BufferView => f.write_str("a buffer view (it owns no memory)"),
        }
    }
}
