//! `IpcChannel`, the blocking channel: pools, buffers, events, loans and plain bytes between
//! processes (with features, virtual buffers and memory snapshots), over a [`Channel`]. What it
//! keeps of its peer, and how it receives, is its [`Session`]'s.
//!
//! Documented on [`IpcChannel`]. The bytes of each message are [`crate::wire`]'s.

use std::sync::Arc;

use cuda_mem_core::{Buffer, Event, MemoryResource, ScopedBuffer, Stream};
use uuid::Uuid;

use crate::channel::Channel;
use crate::error::Result;
// Named by the docs' links, and the tests.
#[cfg(any(doc, test))]
use crate::error::IpcError;

use crate::loans::{Held, Outstanding, Unlent};
use crate::mapped::MappedMemoryResource;
use crate::received::Received;
use crate::session::Session;
#[cfg(feature = "vmm")]
use crate::wire::SharedVirtualBuffer;
use crate::wire::{BufferDescriptor, EventDescriptor, MessageKind, encode_buffers};
#[cfg(feature = "snapshot")]
use crate::{
    snapshot::{answer_json, snapshot_json},
    wire::SnapshotRequest,
};
#[cfg(feature = "snapshot")]
use cuda_mem_core::snapshot::MemorySnapshot;
#[cfg(feature = "vmm")]
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource};

/// A channel that carries pools, buffers, events, plain bytes (and, with the feature `vmm`,
/// virtual buffers) between processes, over a [`Channel`].
///
/// Its messages are the kinds of [`MessageKind`] (whose docs have their layouts), each one frame
/// of the channel. One channel carries all of them, in any order. [`IpcChannel::recv`] receives
/// any message; [`IpcChannel::recv_buffers`] receives the buffers of one send.
///
/// # Pools
///
/// Sending a buffer whose pool has not been sent on this channel sends the pool first, so the
/// receiver always knows it. The receiving channel keeps every pool it received, by the UUID
/// the peer named it with, for as long as it lives (or until [`IpcChannel::release_resource`]).
/// A receiver may drop the [`Received::Resource`] it got: the buffers that follow still map.
///
/// Buffers map only through the pools their own channel received, never through the
/// process-wide registry, so a peer can use only the pools it sent itself. The peer's word is
/// checked against the driver's: the memory kind and device a resource message states must be
/// what the imported pool is. A pool sent again on the same channel is the one received first
/// (the duplicate descriptor is closed).
///
/// A pool is imported once per sending process, however many channels it comes on: the import
/// is kept by the process at the channel's other end, as the kernel vouches for it
/// ([`Channel::peer_process_id`]: the socket's peer credentials, or the child
/// [`spawn_with_channel`](crate::spawn_with_channel) started; a process is its id and its start
/// time, so a later process under a reused id is another), and the UUID that process named the
/// pool with. Two workers of one exporter, or one importer with two channels to it, hold one
/// import of each of its pools, whatever the driver answers a second import with. A UUID is
/// never trusted alone: another process that names the same UUID gets an import of the pool it
/// sends itself, or a refusal, never the first process's import. Where the kernel does not
/// vouch for the peer (both ends made in one process with [`Channel::pair`], a peer in a pid
/// namespace this process does not see, one that had hung up already), a UUID this process has
/// imported already is shared only when the driver answers the new import with that import's
/// own handle (the same pool); otherwise the new import stands on its own.
///
/// What the kernel vouches for is the process that created or connected the other end of the
/// socket, not whoever holds it now: a process that hands its end to another lets that one speak
/// for it, and a broker that makes socket pairs and hands out both ends is every such channel's
/// peer. Let each process make its own end (with `spawn_with_channel`, or `connect` to a
/// [`ChannelListener`](crate::ChannelListener)).
///
/// A UUID names one pool on a channel, for the channel's life, and, to a peer the kernel
/// identifies, on every channel to it, for as long as that process lives (it keys its imports
/// by this process and the UUID). A relay that imported two pools under one UUID (from two
/// peers, each naming its own pool so) can send only the first on a given channel, or to a
/// given identified process. The other, and its buffers, are refused with
/// [`IpcError::UuidTakenOnChannel`] before anything of it is sent: send it to another process.
/// The same holds for a pool imported under a UUID once its earlier import, sent on the
/// channel, is gone, unless both imports came from one identified process: this side cannot
/// tell otherwise whether it is the same pool.
///
/// # Events: the receiver's stream waits on the GPU
///
/// The usual hand-off: the sender enqueues work on a stream and records an interprocess event
/// (created with [`EventOptions::interprocess`](cuda_mem_core::EventOptions::interprocess)) on
/// it. It sends the buffers with the event ([`IpcChannel::send_buffers_after`]), or the event
/// alone ([`IpcChannel::send_event`]) to say "what I enqueued so far is yours once done". The
/// receiver opens the event and makes the stream it is given wait for it (`cuStreamWaitEvent`)
/// before it hands over the buffers. Work the receiver then enqueues on that stream runs after
/// the sender's, and neither side waits on the host.
///
/// The sender may record the same event again and send it again. The receiver opens each event
/// once per channel, by the sender's [`Event::id`] (kept until the channel drops, or
/// [`IpcChannel::release_events`]); each wait is for the latest recording. The sender must keep
/// the event alive until the receiver has received it (the driver opens an event only while its
/// exporter holds it). An event it destroyed too early is an [`IpcError::EventImport`] there,
/// after which the channel goes on.
///
/// # Who frees first
///
/// The driver's rule (`cuMemPoolImportPointer`): every process that imported a buffer frees it
/// before its exporter does, and an importer's stream-ordered free must have run by then.
/// Dropping a buffer is its free, and this crate cannot see another process's imports. So the
/// order is the program's: the importer drops its buffers (freed on the stream given to
/// [`IpcChannel::recv`]), waits for that stream or exits, and then says so; the exporter drops
/// its own after hearing it. Memory freed too early goes back to the exporter's pool, whose next
/// allocation may take it while the importer still uses it, silently on a GPU. The simulator
/// (`cuda-sim`) reports such a free on stderr, and the importer then reads `0xdb`.
///
/// # Lending: one pool, many workers
///
/// A server that hands its buffers to workers and takes them back lends them
/// ([`IpcChannel::lend`], [`IpcChannel::lend_after`]): the worker receives plain buffers, and
/// the server's channel keeps the [`Buffer`]s, so the server cannot free what a worker maps. The
/// worker hands them back with [`IpcChannel::give_back`] (its imports freed, the frees run), and
/// the server receives its own buffers again ([`Received::Returned`]). [`IpcChannel::held`] and
/// [`IpcChannel::lent_buffers`] say what the worker holds now.
///
/// When a worker disconnects (or crashes), [`IpcChannel::into_outstanding`] keeps what it still
/// held as an [`Outstanding`]: its buffers come back once the worker's process has exited (the
/// driver then has unmapped its imports), waited for with a pidfd. A channel dropped with
/// buffers lent frees them if the worker has exited, and otherwise keeps them allocated until
/// this process exits (recorded as a drop error): never freed under a running worker.
///
/// # Devices and virtual buffers
///
/// The receiver finds a pool's device by its UUID, not by the sender's ordinal: processes that
/// see different devices (`CUDA_VISIBLE_DEVICES`) number them differently.
///
/// A virtual buffer is imported with the `VirtualMemoryResource` the receiver registered for
/// where its memory lives (`IpcChannel::import_virtual_buffers_into`). A build without the `vmm`
/// feature refuses one saying so, and closes its descriptors.
#[derive(Debug)]
pub struct IpcChannel {
    channel: Channel,
    /// What the channel keeps of its peer, and the protocol's rules for sends and receives.
    pub(crate) session: Session,
}

impl IpcChannel {
    /// Wraps a connected channel.
    pub fn new(channel: Channel) -> IpcChannel {
        let session = Session::new(channel.peer());
        IpcChannel { channel, session }
    }

    /// The underlying channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// The resource received on this channel under `uuid`, if the channel still keeps it.
    pub fn resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.session.resource(uuid)
    }

    /// Lets go of the resource received under `uuid`: the channel no longer keeps it alive (the
    /// buffers mapped through it, and other holders of its `Arc`, still do), and buffers that
    /// name it are refused ([`IpcError::UnknownResource`]) until the peer sends it again.
    /// Returns it, if the channel kept it.
    pub fn release_resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.session.release_resource(uuid)
    }

    /// Lets go of every resource received, as [`IpcChannel::release_resource`] does for one.
    pub fn release_resources(&self) {
        self.session.release_resources();
    }

    /// Lets go of every event of the peer opened on this channel (they are closed once no
    /// [`Received::Event`] holds them either). An event the peer sends again is opened again.
    pub fn release_events(&self) {
        self.session.release_events();
    }

    /// How many of the peer's events this channel keeps open.
    pub fn open_events(&self) -> usize {
        self.session.open_events()
    }

    /// Sends a pool resource (its file descriptor and UUID). Sending it again sends it again;
    /// the receiving channel answers the second one with the resource it received first, kept
    /// by UUID (no driver call), and closes the duplicate descriptor.
    ///
    /// # Errors
    ///
    /// - [`IpcError::NotIpcEnabled`]: the resource cannot be shared.
    /// - [`IpcError::UuidTakenOnChannel`]: another pool was sent under its UUID on this channel (see
    ///   [`IpcChannel`]); nothing is sent.
    /// - As [`Channel::send`].
    pub fn send_resource(&self, resource: &dyn MemoryResource) -> Result<()> {
        let frame = self.session.resource_frame(resource)?;
        // Checked, sent and noted under one lock: two threads sending two pools under one UUID
        // cannot both send theirs, nor note another pool than the one that went first.
        let mut sent = self.session.sent();
        self.session.claim(&sent, &frame)?;
        self.channel.send(MessageKind::Resource.code(), &frame.payload, &[frame.handle.fd()])?;
        Session::note_sent(&mut sent, &frame);
        Ok(())
    }

    /// Sends buffers in one message, sending first each resource not yet sent on this channel.
    ///
    /// # Errors
    ///
    /// - [`IpcError::MessageTooLarge`]: more buffers than one message carries; nothing is sent.
    /// - [`IpcError::NotIpcEnabled`]: a buffer cannot be shared.
    /// - [`IpcError::UuidTakenOnChannel`]: a buffer's pool goes by a UUID another pool was sent
    ///   under on this channel, or that another buffer's pool shares (see [`IpcChannel`]); the
    ///   message is not sent.
    /// - As [`IpcChannel::send_resource`], for the pools sent first, and [`Channel::send`].
    pub fn send_buffers(&self, buffers: &[&ScopedBuffer<'_>]) -> Result<()> {
        let (payload, _) = self.buffers_payload(Vec::new(), buffers)?;
        self.channel.send(MessageKind::Buffers.code(), &payload, &[])
    }

    /// Sends buffers with an interprocess event, in one message: the receiver's stream waits for
    /// the event's latest recording (on the GPU) before the buffers are handed over (see
    /// [`IpcChannel`], *Events*). Record `event` on the stream of the work the receiver must wait
    /// for, then send; keep `event` alive until the receiver has received it.
    ///
    /// # Errors
    ///
    /// Nothing is sent on an error before the message.
    ///
    /// - [`IpcError::Core`] with [`cuda_mem_core::Error::EventNotInterprocess`]: `event` was created
    ///   without [`EventOptions::interprocess`](cuda_mem_core::EventOptions::interprocess).
    /// - As [`IpcChannel::send_buffers`].
    pub fn send_buffers_after(&self, event: &Event, buffers: &[&ScopedBuffer<'_>]) -> Result<()> {
        let descriptor = EventDescriptor::of(event)?;
        let (payload, _) = self.buffers_payload(descriptor.encode().to_vec(), buffers)?;
        self.channel.send(MessageKind::BuffersAfterEvent.code(), &payload, &[])
    }

    /// Sends an interprocess event: the receiver's stream waits for its latest recording (see
    /// [`IpcChannel`], *Events*). Keep `event` alive until the receiver has received it.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Core`] with [`cuda_mem_core::Error::EventNotInterprocess`]: `event` was created
    ///   without [`EventOptions::interprocess`](cuda_mem_core::EventOptions::interprocess).
    /// - As [`Channel::send`].
    pub fn send_event(&self, event: &Event) -> Result<()> {
        let descriptor = EventDescriptor::of(event)?;
        self.channel.send(MessageKind::Event.code(), &descriptor.encode(), &[])
    }

    /// `payload` followed by a buffers message's payload for `buffers`, after sending each
    /// resource not yet sent on this channel; and the buffers' descriptors.
    fn buffers_payload(
        &self,
        mut payload: Vec<u8>,
        buffers: &[&ScopedBuffer<'_>],
    ) -> Result<(Vec<u8>, Vec<BufferDescriptor>)> {
        let plan = self.session.plan_buffers(buffers)?;
        for resource in plan.resources_first {
            // Checked again there: another thread may have sent another pool under its UUID.
            self.send_resource(resource)?;
        }
        encode_buffers(&mut payload, &plan.descriptors);
        Ok((payload, plan.descriptors))
    }

    /// Sends the application's bytes.
    ///
    /// # Errors
    ///
    /// - As [`Channel::send`].
    pub fn send_data(&self, bytes: &[u8]) -> Result<()> {
        self.channel.send(MessageKind::Data.code(), bytes, &[])
    }

    /// Receives one message: imports a resource (kept by the channel, see
    /// [`IpcChannel`]), maps buffers through the resources this channel received (freed on
    /// `stream` when dropped), or returns bytes.
    ///
    /// With the feature `snapshot`, a peer's request for a memory snapshot is returned for the
    /// program to answer (`IpcChannel::answer_snapshot_request`), and a peer's snapshot is read
    /// back.
    ///
    /// With the feature `vmm`, a virtual buffer is imported with the resource registered for
    /// where its memory lives (freed on `stream` when dropped); when it cannot be, the error is
    /// `IpcError::SharedVirtualBuffer`, `IpcError::DeviceNotVisible`,
    /// `IpcError::NoVirtualMemoryResource` or `IpcError::Vmm`, its descriptors are closed and
    /// nothing stays imported.
    ///
    /// # Errors
    ///
    /// - As [`Channel::recv`]: the channel's and the frame's errors.
    /// - [`IpcError::Protocol`]: a message that does not follow its format ([`ProtocolError`](crate::ProtocolError) says
    ///   which check failed), or an event sent again with another handle.
    /// - [`IpcError::BufferDescriptor`], [`IpcError::EventDescriptor`]: a malformed descriptor.
    /// - [`IpcError::UnknownResource`]: a buffer whose resource did not arrive on this channel (or
    ///   was released).
    /// - [`IpcError::DeviceNotVisible`]: a pool of a device this process does not see.
    /// - [`IpcError::MisdescribedResource`]: a pool that is not what the peer says.
    /// - [`IpcError::PoolAlreadyImported`]: a pool this process holds under another UUID.
    /// - [`IpcError::MisdescribedBuffer`]: a buffer larger than the memory its pool shares.
    /// - [`IpcError::EventImport`]: the driver will not open the peer's event.
    /// - [`IpcError::NotReceivable`]: a virtual buffer, without the feature `vmm`; a snapshot
    ///   or snapshot request, without the feature `snapshot`.
    /// - `IpcError::Snapshot` (feature `snapshot`): a snapshot that is not one this build reads.
    /// - [`IpcError::PoolImport`], [`IpcError::BufferImport`]: the driver refused a pool
    ///   descriptor or a buffer the peer sent (the peer's error; the driver's is the source).
    /// - [`IpcError::Core`]: an import failed otherwise (such as out of memory).
    ///
    /// A bad message leaves the process's pools and mappings as they were (nothing half-imported
    /// stays mapped). One thing stays, which changes no memory: when a buffers-after-event message
    /// is refused after its event was opened and `stream` made to wait for it (a buffer the driver
    /// refuses, or larger than its mapping; malformed descriptors and unknown resources are refused
    /// before), the channel keeps the event open, as if it had come alone, and `stream` still waits
    /// for it (the buffers imported before the refusal are unmapped on `stream`, so after the
    /// sender's work).
    pub fn recv(&self, stream: &Stream) -> Result<Received> {
        self.session.receive(self.channel.recv()?, stream)
    }

    /// Receives the buffers of one [`send_buffers`](Self::send_buffers) or
    /// [`send_buffers_after`](Self::send_buffers_after) of the peer: the resource messages sent
    /// before them (their pools, sent the first time on this channel) are received as
    /// [`recv`](Self::recv) receives them, and the channel keeps those pools; then the buffers
    /// are mapped and returned (freed on `stream` when dropped). When they came with an event,
    /// `stream` waits for it first, on the GPU, as with [`recv`](Self::recv) (the channel keeps
    /// the event open).
    ///
    /// Use [`recv`](Self::recv) where other messages (data, an event alone, a virtual buffer)
    /// may come before the buffers.
    ///
    /// ```
    /// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
    /// use cuda_mem_core::{Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream, StreamOptions};
    /// use cuda_mem_ipc::{Channel, IpcChannel};
    ///
    /// let device = Device::new(0)?;
    /// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    /// let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    /// let (here, there) = Channel::pair()?;
    /// let (sender, receiver) = (IpcChannel::new(here), IpcChannel::new(there));
    ///
    /// let (a, b) = (pool.allocate(4096, &stream)?, pool.allocate(64, &stream)?);
    /// sender.send_buffers(&[&a, &b])?; // the pool, then both buffers
    /// let mapped = receiver.recv_buffers(&stream)?;
    /// assert_eq!((mapped[0].size(), mapped[1].size()), (4096, 64));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// - [`IpcError::UnexpectedMessage`]: a message of another kind came first. It was dropped
    ///   unread: nothing of it imported, its descriptors closed. The channel is still in step.
    /// - As [`recv`](Self::recv), for the resource and buffers messages.
    pub fn recv_buffers(&self, stream: &Stream) -> Result<Vec<Buffer>> {
        loop {
            if let Some(buffers) = self.session.receive_for_buffers(self.channel.recv()?, stream)? {
                return Ok(buffers);
            }
        }
    }
}

/// Lending: buffers this process keeps ownership of while a worker maps them (see
/// [`IpcChannel`], *Lending*).
impl IpcChannel {
    /// Lends `buffers` to the peer: sends them as [`send_buffers`](Self::send_buffers) does (the
    /// peer receives plain buffers), and keeps them here until the peer hands them back
    /// ([`Received::Returned`]) or, once the channel has ended, its process exits
    /// ([`into_outstanding`](Self::into_outstanding)). Nothing here can free them meanwhile.
    ///
    /// # Errors
    /// [`Unlent`], with the buffers: as [`send_buffers`](Self::send_buffers). The peer never had
    /// them (it imports no frame it did not receive whole).
    pub fn lend(&self, buffers: Vec<Buffer>) -> std::result::Result<(), Box<Unlent>> {
        self.lend_in(Vec::new(), MessageKind::Buffers, buffers)
    }

    /// Lends `buffers` with an interprocess event, as
    /// [`send_buffers_after`](Self::send_buffers_after) sends them: the peer's stream waits for
    /// the event before it has them.
    ///
    /// # Errors
    /// [`Unlent`], with the buffers: as [`send_buffers_after`](Self::send_buffers_after).
    pub fn lend_after(&self, event: &Event, buffers: Vec<Buffer>) -> std::result::Result<(), Box<Unlent>> {
        match EventDescriptor::of(event) {
            Ok(descriptor) => self.lend_in(descriptor.encode().to_vec(), MessageKind::BuffersAfterEvent, buffers),
            Err(error) => Err(Box::new(Unlent { error: error.into(), buffers })),
        }
    }

    fn lend_in(
        &self,
        prefix: Vec<u8>,
        kind: MessageKind,
        buffers: Vec<Buffer>,
    ) -> std::result::Result<(), Box<Unlent>> {
        let refs: Vec<&ScopedBuffer<'_>> = buffers.iter().collect();
        let (payload, descriptors) = match self.buffers_payload(prefix, &refs) {
            Ok(made) => made,
            Err(error) => return Err(Box::new(Unlent { error, buffers })),
        };
        // Kept before they go: a peer that hands them back at once finds them lent.
        self.session.loans.keep(&descriptors, buffers);
        match self.channel.send(kind.code(), &payload, &[]) {
            Ok(()) => Ok(()),
            Err(error) => {
                Err(Box::new(Unlent { error, buffers: self.session.loans.take(&descriptors).unwrap_or_default() }))
            }
        }
    }

    /// Hands buffers lent by the peer back to it (the borrower's side of
    /// [`lend`](Self::lend)): frees each import on `stream`, waits for `stream` (so the frees
    /// have run, as the driver's rule wants before the exporter frees), then tells the peer,
    /// which receives its buffers as [`Received::Returned`]. Work on the buffers must be on
    /// `stream`, or done, before this.
    ///
    /// # Errors
    /// - [`IpcError::NotReceivedHere`]: a buffer that was not received on this channel; nothing
    ///   is freed or sent.
    /// - [`IpcError::MessageTooLarge`]: more buffers than one message carries; nothing is freed.
    /// - [`IpcError::Core`]: a free or the wait failed; nothing is sent.
    /// - As [`Channel::send`].
    pub fn give_back(&self, buffers: Vec<Buffer>, stream: &Stream) -> Result<()> {
        let descriptors = self.session.free_for_return(buffers, stream)?;
        stream.synchronize()?;
        let mut payload = Vec::new();
        encode_buffers(&mut payload, &descriptors);
        self.channel.send(MessageKind::Returned.code(), &payload, &[])
    }

    /// How much the peer holds of what this channel lent it.
    pub fn held(&self) -> Held {
        self.session.loans.held()
    }

    /// The buffers lent to the peer and not handed back: their addresses and sizes here.
    pub fn lent_buffers(&self) -> Vec<(cuda_mem_core::DevicePtr, usize)> {
        self.session.loans.list()
    }

    /// Ends the channel, keeping what the peer still holds: the buffers come back once its
    /// process has exited ([`Outstanding`]). Dropping the channel does the same and drops the
    /// result: frees the buffers if the peer has exited, keeps them allocated otherwise.
    pub fn into_outstanding(self) -> Outstanding {
        self.session.outstanding()
    }
}

/// Virtual buffers (feature `vmm`; the export and import are in the module `virtual_buffer`).
#[cfg(feature = "vmm")]
impl IpcChannel {
    /// Exports `buffer` and sends it as one message (its chunks' file descriptors beside it,
    /// closed here once sent). The receiver imports it with the resource it registered for
    /// where the memory lives ([`import_virtual_buffers_into`](Self::import_virtual_buffers_into)).
    ///
    /// # Errors
    ///
    /// - As [`SharedVirtualBuffer::export`] and [`Channel::send`](crate::Channel::send).
    pub fn send_virtual_buffer(&self, buffer: &VirtualBuffer) -> Result<()> {
        let shared = SharedVirtualBuffer::export(buffer)?;
        let (bytes, fds) = shared.encode();
        self.channel().send(MessageKind::VirtualBuffer.code(), &bytes, &fds)
    }

    /// Imports the virtual buffers this channel receives whose memory lives where `resource`
    /// allocates (its device, or its host NUMA node) with `resource`: its access settings and
    /// granularity apply, and its handle type must be the sender's. One resource per location;
    /// returns the one registered before for `resource`'s location, which it replaces. See
    /// [`SharedVirtualBuffer`], *The importing resource*, for why the channel does not make one
    /// itself.
    pub fn import_virtual_buffers_into(
        &self,
        resource: Arc<VirtualMemoryResource>,
    ) -> Option<Arc<VirtualMemoryResource>> {
        self.session.virtual_buffer_importers.register(resource)
    }
}

/// Memory snapshots (feature `snapshot`; their messages' contents are made and read in the
/// module `snapshot`).
#[cfg(feature = "snapshot")]
impl IpcChannel {
    /// Asks the peer for a memory snapshot of its process, with at most `max_events` of its
    /// latest recorded events (`None`: every event that fits one message). The answer comes as
    /// [`Received::Snapshot`] when the peer answers it (a Rust peer
    /// with [`answer_snapshot_request`](Self::answer_snapshot_request)).
    ///
    /// # Errors
    /// As [`Channel::send`](crate::Channel::send).
    pub fn request_snapshot(&self, max_events: Option<u32>) -> Result<()> {
        let request = SnapshotRequest::new(max_events);
        self.channel().send(MessageKind::SnapshotRequest.code(), &request.encode(), &[])
    }

    /// Answers a peer's [`Received::SnapshotRequest`] with a
    /// snapshot of this process taken now ([`take_snapshot`](cuda_mem_core::snapshot::take_snapshot)): every registered resource, and
    /// the recorded history's latest events, as many as the request asks and one message holds.
    ///
    /// ```
    /// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
    /// use cuda_mem_core::{Device, DeviceMemoryResource, Stream};
    /// use cuda_mem_ipc::{Channel, IpcChannel, Received};
    ///
    /// let device = Device::new(0)?;
    /// let stream = Stream::new(device, Default::default())?;
    /// let pool = DeviceMemoryResource::new(device, Default::default())?;
    /// let (here, there) = Channel::pair()?;
    /// let (asker, server) = (IpcChannel::new(here), IpcChannel::new(there));
    ///
    /// asker.request_snapshot(Some(1000))?;
    /// if let Received::SnapshotRequest(request) = server.recv(&stream)? {
    ///     server.answer_snapshot_request(&request)?;
    /// }
    /// let Received::Snapshot(snapshot) = asker.recv(&stream)? else { unreachable!() };
    /// assert!(snapshot.resource(cuda_mem_core::history::ResourceId::of(&*pool)).is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`send_snapshot`](Self::send_snapshot).
    pub fn answer_snapshot_request(&self, request: &SnapshotRequest) -> Result<()> {
        let json = answer_json(request)?;
        self.channel().send(MessageKind::Snapshot.code(), json.as_bytes(), &[])
    }

    /// Sends a memory snapshot (one of this process's, or any other) to the peer, which
    /// receives it as [`Received::Snapshot`]. When its JSON would
    /// not fit one message, the oldest events are left out (counted in `dropped_events`).
    ///
    /// # Errors
    /// - [`IpcError::MessageTooLarge`]: without any event, the snapshot is still larger than a
    ///   message ([`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN)).
    /// - [`IpcError::Snapshot`]: it cannot be written as JSON (it can for every snapshot
    ///   this crate takes).
    /// - As [`Channel::send`](crate::Channel::send).
    pub fn send_snapshot(&self, snapshot: &MemorySnapshot) -> Result<()> {
        let json = snapshot_json(snapshot)?;
        self.channel().send(MessageKind::Snapshot.code(), json.as_bytes(), &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::Channel;
    use crate::error::ProtocolError;
    use crate::share::allocation_handle;
    use crate::wire::{BuffersMessageError, EnvelopeError, EventDescriptorError, RESOURCE_MESSAGE_LEN};
    use cuda_mem_core::Device;
    use cuda_mem_core::{
        DeviceMemoryResource, DeviceMemoryResourceOptions, EventOptions, IpcEventHandle, StreamOptions,
    };

    const RESOURCE: u16 = MessageKind::Resource.code();
    const DATA: u16 = MessageKind::Data.code();
    const EVENT: u16 = MessageKind::Event.code();
    const BUFFERS_AFTER_EVENT: u16 = MessageKind::BuffersAfterEvent.code();

    fn setup() -> (Device, Stream, Channel, IpcChannel) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let (raw, receiver) = Channel::pair().unwrap();
        (device, stream, raw, IpcChannel::new(receiver))
    }

    /// The channel is still in step after a refused message: the next one arrives.
    fn still_usable(raw: &Channel, receiver: &IpcChannel, stream: &Stream) {
        raw.send(DATA, b"next", &[]).unwrap();
        assert!(matches!(receiver.recv(stream), Ok(Received::Data(bytes)) if bytes == b"next"));
    }

    #[test]
    fn malformed_event_messages_are_refused_and_the_channel_goes_on() {
        let (device, stream, raw, receiver) = setup();
        let event = Event::new(device, EventOptions::default().interprocess()).unwrap();
        let good = EventDescriptor::of(&event).unwrap().encode();

        raw.send(EVENT, &good[..40], &[]).unwrap();
        let error = receiver.recv(&stream).unwrap_err();
        assert!(
            matches!(error, IpcError::EventDescriptor(EventDescriptorError::Length { expected: 92, found: 40 })),
            "{error:?}"
        );
        assert!(error.to_string().contains("invalid event descriptor"), "{error}");
        still_usable(&raw, &receiver, &stream);

        let mut damaged = good;
        damaged[30] ^= 0xff;
        raw.send(EVENT, &damaged, &[]).unwrap();
        assert!(matches!(
            receiver.recv(&stream),
            Err(IpcError::EventDescriptor(EventDescriptorError::Envelope(EnvelopeError::Checksum { .. })))
        ));
        still_usable(&raw, &receiver, &stream);

        // Shorter than the event it must start with.
        raw.send(BUFFERS_AFTER_EVENT, &good[..10], &[]).unwrap();
        let error = receiver.recv(&stream).unwrap_err();
        assert!(
            matches!(
                error,
                IpcError::Protocol(ProtocolError::BuffersMessage(BuffersMessageError::NoEvent { found: 10, min: 92 }))
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("shorter than its event"), "{error}");
        // A damaged event with well-formed buffers: nothing is imported.
        let mut payload = damaged.to_vec();
        payload.extend_from_slice(&0u32.to_le_bytes());
        raw.send(BUFFERS_AFTER_EVENT, &payload, &[]).unwrap();
        assert!(matches!(receiver.recv(&stream), Err(IpcError::EventDescriptor(_))));
        still_usable(&raw, &receiver, &stream);
        assert_eq!(receiver.open_events(), 0);
    }

    #[test]
    fn an_event_the_driver_will_not_open_is_an_import_error_and_nothing_is_kept() {
        let (device, stream, raw, receiver) = setup();
        // The simulator opens no handle in the process that exported it (nor a forged one): the
        // case of a peer that destroyed its event, or sent bytes that name none.
        let event = Event::new(device, EventOptions::default().interprocess()).unwrap();
        let mut forged = [0x5a; 64];
        forged[0] = 1;
        for descriptor in [
            EventDescriptor::of(&event).unwrap(),
            EventDescriptor { id: 99, handle: IpcEventHandle::from_bytes(forged) },
        ] {
            raw.send(EVENT, &descriptor.encode(), &[]).unwrap();
            let error = receiver.recv(&stream).unwrap_err();
            assert!(matches!(error, IpcError::EventImport { id, .. } if id == descriptor.id), "{error:?}");
            assert_eq!(error.cuda_code(), Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_INVALID_VALUE));
            assert!(error.to_string().contains("could not be opened"), "{error}");
            still_usable(&raw, &receiver, &stream);
        }
        assert_eq!(receiver.open_events(), 0, "nothing half-opened is kept");
        // The buffers that came with such an event are not imported (none is mapped, and the
        // stream still works).
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let buffer = pool.allocate(256, &stream).unwrap();
        let sender = IpcChannel::new(raw);
        sender.send_buffers_after(&event, &[&buffer]).unwrap();
        assert!(matches!(receiver.recv(&stream), Ok(Received::Resource(_))));
        let error = receiver.recv(&stream).unwrap_err();
        assert!(matches!(error, IpcError::EventImport { .. }), "{error:?}");
        assert_eq!(cuda_mem_core::import_holders(buffer.ptr()), 0, "no buffer mapped");
        stream.synchronize().unwrap();
    }

    /// A resource message naming `uuid` for a device pool of `device`, as a peer writes it.
    fn resource_payload(uuid: Uuid, device: Device) -> [u8; RESOURCE_MESSAGE_LEN] {
        let mut payload = [0u8; RESOURCE_MESSAGE_LEN];
        payload[..16].copy_from_slice(uuid.as_bytes());
        payload[17..21].copy_from_slice(&(device.ordinal() as i32).to_le_bytes());
        payload[24..40].copy_from_slice(&device.uuid().unwrap());
        payload
    }

    /// Two receives on one channel, each of a different pool the peer names with one UUID, both
    /// looking the UUID up before either keeps its import: the first kept stands for both, and
    /// the channel keeps that one (not whichever came last, which a buffer would then map
    /// through while the other receive handed out another pool). The imports are held back
    /// until both receives have looked up and are waiting to import, so the interleaving is
    /// the racy one every time.
    #[test]
    fn concurrent_receives_of_one_uuid_keep_the_first_import() {
        let (device, stream, raw, receiver) = setup();
        let options = || DeviceMemoryResourceOptions::default().ipc_enabled(true);
        let first = DeviceMemoryResource::new(device, options()).unwrap();
        let second = DeviceMemoryResource::new(device, options()).unwrap();
        let uuid = Uuid::new_v4();
        for pool in [&first, &second] {
            raw.send(RESOURCE, &resource_payload(uuid, device), &[allocation_handle(pool.as_ref()).unwrap().fd()])
                .unwrap();
        }
        let held = crate::mapped::test_hooks::hold_imports(uuid);
        let (one, other) = std::thread::scope(|scope| {
            let receive = || {
                let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
                match receiver.recv(&stream) {
                    Ok(Received::Resource(resource)) => resource,
                    other => panic!("a resource expected, got {other:?}"),
                }
            };
            let one = scope.spawn(receive);
            let other = scope.spawn(receive);
            crate::mapped::test_hooks::wait_for_importers(2);
            drop(held);
            (one.join().unwrap(), other.join().unwrap())
        });
        assert!(Arc::ptr_eq(&one, &other), "both receives give the resource kept first");
        let kept = receiver.resource(uuid).expect("the channel keeps one");
        assert!(Arc::ptr_eq(&kept, &one), "and it is the one the receives gave");
        still_usable(&raw, &receiver, &stream);
    }

    #[test]
    fn events_that_are_not_interprocess_are_refused_before_anything_is_sent() {
        let (device, stream, raw, receiver) = setup();
        let sender = IpcChannel::new(raw);
        let plain = Event::new(device, Default::default()).unwrap();
        let error = sender.send_event(&plain).unwrap_err();
        assert!(matches!(error, IpcError::Core(cuda_mem_core::Error::EventNotInterprocess)), "{error:?}");
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let buffer = pool.allocate(256, &stream).unwrap();
        let error = sender.send_buffers_after(&plain, &[&buffer]).unwrap_err();
        assert!(matches!(error, IpcError::Core(cuda_mem_core::Error::EventNotInterprocess)), "{error:?}");
        // Nothing went out: the next message is the first.
        sender.send_data(b"first").unwrap();
        assert!(matches!(receiver.recv(&stream), Ok(Received::Data(bytes)) if bytes == b"first"));
    }
}
