//! `IpcChannel`: pools, buffers and plain bytes between processes, over a [`Channel`], and what
//! a channel keeps of them (the pools sent and received, the peer's events).
//!
//! Documented on [`IpcChannel`]. The bytes of each message are [`crate::wire`]'s.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cuda_mem_core::{Buffer, Device, Event, MemoryResource, PoolKind, ScopedBuffer, Stream};
use uuid::Uuid;

use crate::channel::{Channel, RawMessage};
use crate::error::{IpcError, MessageLimit, ProtocolError, Result};
use crate::mapped::{ImportOrigin, MappedMemoryResource};
use crate::peer::PeerId;
use crate::share::{Unshareable, allocation_handle, buffer_descriptor};
use crate::wire::{
    BufferDescriptor, EventDescriptor, MAX_BUFFERS_PER_MESSAGE, MessageError, MessageKind, PoolMemory, ResourceMessage,
    WireDevice, buffer_descriptors, encode_buffers, expect_fds, split_event,
};

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
}

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
    /// The resources sent on this channel: by UUID, which pool went under it. Held while a
    /// resource is sent, so that a UUID is in here only once its resource has gone (buffers
    /// that name it then follow it on the wire), and only one pool ever goes under it.
    sent: Mutex<HashMap<Uuid, SentPool>>,
    /// The resources received on this channel, by the UUID the peer named them with: buffers
    /// map through these only, and they live as long as the channel (or until released).
    received: Mutex<HashMap<Uuid, Arc<MappedMemoryResource>>>,
    /// The peer's events opened on this channel, by the peer's id of each.
    events: Mutex<HashMap<u64, Arc<Event>>>,
    /// The resources virtual buffers are imported with, one per location.
    #[cfg(feature = "vmm")]
    pub(crate) virtual_buffer_importers: crate::virtual_buffer::VirtualBufferImporters,
}

impl IpcChannel {
    /// Wraps a connected channel.
    pub fn new(channel: Channel) -> IpcChannel {
        IpcChannel {
            channel,
            sent: Mutex::new(HashMap::new()),
            received: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            #[cfg(feature = "vmm")]
            virtual_buffer_importers: Default::default(),
        }
    }

    /// The underlying channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, SentPool>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn received(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<MappedMemoryResource>>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.received.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The resource received on this channel under `uuid`, if the channel still keeps it.
    pub fn resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.received().get(&uuid).cloned()
    }

    /// Lets go of the resource received under `uuid`: the channel no longer keeps it alive (the
    /// buffers mapped through it, and other holders of its `Arc`, still do), and buffers that
    /// name it are refused ([`IpcError::UnknownResource`]) until the peer sends it again.
    /// Returns it, if the channel kept it.
    pub fn release_resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.received().remove(&uuid)
    }

    /// Lets go of every resource received, as [`IpcChannel::release_resource`] does for one.
    pub fn release_resources(&self) {
        // Dropped outside the lock: a resource's drop does not come back here, but need not
        // wait for it either.
        let released = std::mem::take(&mut *self.received());
        drop(released);
    }

    /// Lets go of every event of the peer opened on this channel (they are closed once no
    /// [`Received::Event`] holds them either). An event the peer sends again is opened again.
    pub fn release_events(&self) {
        let released = std::mem::take(&mut *self.events());
        drop(released);
    }

    /// How many of the peer's events this channel keeps open.
    pub fn open_events(&self) -> usize {
        self.events().len()
    }

    fn events(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Event>>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The peer's event `descriptor` names, opened on `stream`'s device the first time it
    /// arrives (then kept by the peer's id), and `stream` made to wait for it.
    fn wait_for_event(&self, descriptor: EventDescriptor, stream: &Stream) -> Result<Arc<Event>> {
        let event = {
            let mut events = self.events();
            match events.get(&descriptor.id) {
                Some(event) if event.ipc_handle().ok() == Some(descriptor.handle) => Arc::clone(event),
                Some(_) => return Err(ProtocolError::EventHandleChanged { id: descriptor.id }.into()),
                None => {
                    // Another id with the same handle names an event the peer has destroyed
                    // since (the driver gave its handle to this new one): let it go.
                    events.retain(|_, event| event.ipc_handle().ok() != Some(descriptor.handle));
                    let opened = Event::from_ipc_handle(stream.device(), &descriptor.handle)
                        .map_err(|source| IpcError::EventImport { id: descriptor.id, source })?;
                    let opened = Arc::new(opened);
                    events.insert(descriptor.id, Arc::clone(&opened));
                    opened
                }
            }
        };
        stream.wait(&event)?;
        Ok(event)
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
        let handle = allocation_handle(resource)?;
        let pool = SentPool::of(resource);
        let memory = match handle.kind() {
            PoolKind::Device(device) => PoolMemory::Device(wire_device(device)?),
            PoolKind::Pinned => PoolMemory::Pinned,
            // Only device and pinned pools can be created shareable (or imported).
            other => return Err(IpcError::NotIpcEnabled(Unshareable::PoolKind(other))),
        };
        let payload = ResourceMessage { pool: handle.uuid(), memory }.encode();
        // Checked, sent and noted under one lock: two threads sending two pools under one UUID
        // cannot both send theirs, nor note another pool than the one that went first.
        let mut sent = self.sent();
        check_not_taken(&sent, handle.uuid(), pool)?;
        // The peer's other channels: the UUID is claimed for this pool before it goes out (a
        // claim whose send then fails only keeps the UUID for the same pool).
        if let Some(peer) = self.channel.peer() {
            sent_to_peers().claim(peer, handle.uuid(), pool)?;
        }
        self.channel.send(MessageKind::Resource.code(), &payload, &[handle.fd()])?;
        sent.insert(handle.uuid(), pool);
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
        let payload = self.buffers_payload(Vec::new(), buffers)?;
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
        let payload = self.buffers_payload(descriptor.encode().to_vec(), buffers)?;
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
    /// resource not yet sent on this channel.
    fn buffers_payload(&self, mut payload: Vec<u8>, buffers: &[&ScopedBuffer<'_>]) -> Result<Vec<u8>> {
        if buffers.len() > MAX_BUFFERS_PER_MESSAGE {
            return Err(IpcError::MessageTooLarge {
                what: MessageLimit::Buffers,
                actual: buffers.len(),
                limit: MAX_BUFFERS_PER_MESSAGE,
            });
        }
        let descriptors = buffers.iter().map(|b| buffer_descriptor(b)).collect::<Result<Vec<_>>>()?;
        // The resources to send first, each once; a UUID that would stand for two pools (one
        // sent before, or two in this message) is refused before any of them is sent.
        let mut unsent: HashMap<Uuid, SentPool> = HashMap::new();
        let mut to_send: Vec<&dyn MemoryResource> = Vec::new();
        {
            let sent = self.sent();
            // The pool of the buffer before: a batch is usually of one pool, whose checks below
            // give the same answer for every buffer after its first (three hash lookups each).
            let mut checked: Option<(Uuid, SentPool)> = None;
            for (buffer, descriptor) in buffers.iter().zip(&descriptors) {
                let Some(resource) = buffer.memory_resource() else { continue };
                let pool = SentPool::of(resource);
                if checked == Some((descriptor.resource, pool)) {
                    continue;
                }
                checked = Some((descriptor.resource, pool));
                check_not_taken(&sent, descriptor.resource, pool)?;
                if let Some(peer) = self.channel.peer() {
                    sent_to_peers().check(peer, descriptor.resource, pool)?;
                }
                match unsent.get(&descriptor.resource) {
                    Some(&other) if other != pool => {
                        return Err(IpcError::UuidTakenOnChannel { uuid: descriptor.resource });
                    }
                    Some(_) => {}
                    None if sent.contains_key(&descriptor.resource) => {}
                    None => {
                        unsent.insert(descriptor.resource, pool);
                        to_send.push(resource);
                    }
                }
            }
        }
        for resource in to_send {
            // Checked again there: another thread may have sent another pool under its UUID.
            self.send_resource(resource)?;
        }
        encode_buffers(&mut payload, &descriptors);
        Ok(payload)
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
    /// - [`IpcError::Protocol`]: a message that does not follow its format ([`ProtocolError`] says
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
        let (kind, message) = self.next_message()?;
        match kind {
            MessageKind::Resource => self.receive_resource(message).map(Received::Resource),
            MessageKind::Buffers | MessageKind::BuffersAfterEvent => {
                self.receive_buffers(kind, &message.payload, stream).map(Received::Buffers)
            }
            MessageKind::Event => {
                let event = EventDescriptor::decode(&message.payload)?;
                self.wait_for_event(event, stream).map(Received::Event)
            }
            MessageKind::Data => Ok(Received::Data(message.payload)),
            #[cfg(feature = "vmm")]
            MessageKind::VirtualBuffer => {
                self.virtual_buffer_importers.receive(message, stream).map(Received::VirtualBuffer)
            }
            #[cfg(not(feature = "vmm"))]
            MessageKind::VirtualBuffer => Err(IpcError::NotReceivable { kind, feature: "vmm" }),
            #[cfg(feature = "snapshot")]
            MessageKind::SnapshotRequest => {
                Ok(Received::SnapshotRequest(crate::wire::SnapshotRequest::decode(&message.payload)?))
            }
            #[cfg(feature = "snapshot")]
            MessageKind::Snapshot => crate::snapshot::read(&message.payload).map(Received::Snapshot),
            #[cfg(not(feature = "snapshot"))]
            MessageKind::SnapshotRequest | MessageKind::Snapshot => {
                Err(IpcError::NotReceivable { kind, feature: "snapshot" })
            }
        }
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
            let (kind, message) = self.next_message()?;
            match kind {
                MessageKind::Resource => drop(self.receive_resource(message)?),
                MessageKind::Buffers | MessageKind::BuffersAfterEvent => {
                    return self.receive_buffers(kind, &message.payload, stream);
                }
                found => return Err(IpcError::UnexpectedMessage { expected: MessageKind::Buffers, found }),
            }
        }
    }

    /// The next message and its kind, once the kind is known and the message carries the
    /// number of file descriptors its kind does.
    fn next_message(&self) -> Result<(MessageKind, RawMessage)> {
        let message = self.channel.recv()?;
        let kind = MessageKind::of(message.kind).map_err(ProtocolError::from)?;
        expect_fds(kind, message.fds.len()).map_err(ProtocolError::from)?;
        Ok((kind, message))
    }

    /// Imports (or finds) the pool of a resource message: kept by the channel under the UUID the
    /// peer named, and process-wide by the peer and that UUID (see [`IpcChannel`], *Pools*). The
    /// memory kind and device the message claims must be the imported pool's, as the driver
    /// reports them.
    fn receive_resource(&self, mut message: RawMessage) -> Result<Arc<MappedMemoryResource>> {
        let ResourceMessage { pool: uuid, memory } = ResourceMessage::decode(&message.payload)?;
        let kind = match memory {
            PoolMemory::Device(device) => PoolKind::Device(visible_device(device)?),
            PoolMemory::Pinned => PoolKind::Pinned,
        };
        // One, as `next_message` checked.
        let fd: OwnedFd = message.fds.pop().ok_or(ProtocolError::Message(MessageError::FdCount {
            kind: MessageKind::Resource,
            expected: 1,
            found: 0,
        }))?;
        // Sent again on this channel: the first one stands (the duplicate descriptor closes here).
        let resource = match self.resource(uuid) {
            Some(received) => received,
            None => {
                let imported = MappedMemoryResource::from_peer(fd, uuid, self.channel.peer())?;
                // Another `recv` on this channel may have kept one under `uuid` while this one
                // imported (the look-up above let go of the lock): the one kept first stands,
                // checked below, and this import drops (after the lock, declared after it). An
                // import is kept only when it is the kind of memory the message claims.
                let mut received = self.received();
                match received.entry(uuid) {
                    Entry::Occupied(kept) => Arc::clone(kept.get()),
                    Entry::Vacant(slot) if imported.kind() == kind => Arc::clone(slot.insert(imported)),
                    Entry::Vacant(_) => imported,
                }
            }
        };
        if resource.kind() != kind {
            return Err(IpcError::MisdescribedResource { uuid, claimed: kind, actual: resource.kind() });
        }
        Ok(resource)
    }

    /// Maps the buffers a buffers message's `payload` describes; for a buffers-after-event
    /// message, makes `stream` wait for its event first.
    fn receive_buffers(&self, kind: MessageKind, payload: &[u8], stream: &Stream) -> Result<Vec<Buffer>> {
        let (event, payload) = match kind {
            MessageKind::BuffersAfterEvent => {
                let (event, buffers) = split_event(payload)?;
                (Some(EventDescriptor::decode(event)?), buffers)
            }
            _ => (None, payload),
        };
        // Decode everything, and find every resource, before importing anything.
        let descriptors =
            buffer_descriptors(payload)?.map(BufferDescriptor::decode).collect::<std::result::Result<Vec<_>, _>>()?;
        let resources = {
            let received = self.received();
            let mut resources: Vec<Arc<MappedMemoryResource>> = Vec::with_capacity(descriptors.len());
            for d in &descriptors {
                // A batch is usually of one pool: the one before is found without a lookup.
                let resource = match resources.last() {
                    Some(last) if last.uuid() == d.resource => Arc::clone(last),
                    _ => received.get(&d.resource).cloned().ok_or(IpcError::UnknownResource(d.resource))?,
                };
                resources.push(resource);
            }
            resources
        };
        if let Some(event) = event {
            self.wait_for_event(event, stream)?;
        }
        let mut buffers = Vec::with_capacity(descriptors.len());
        for (descriptor, resource) in descriptors.iter().zip(&resources) {
            // On an error the buffers imported so far drop here and are released.
            buffers.push(resource.import_buffer(descriptor, stream)?);
        }
        Ok(buffers)
    }
}

/// Which pool a resource sent on a channel is, where its UUID may not tell: a pool created in
/// this process has a UUID of its own (made at random when it is first shared), but an imported
/// one has the UUID its exporter named it with, which another import may share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SentPool {
    /// A pool of this process (through any adaptors).
    Local,
    /// An import ([`MappedMemoryResource::origin`]).
    Imported(ImportOrigin),
}

impl SentPool {
    fn of(resource: &dyn MemoryResource) -> SentPool {
        let any: &dyn Any = resource;
        any.downcast_ref::<MappedMemoryResource>().map_or(SentPool::Local, |mapped| SentPool::Imported(mapped.origin()))
    }
}

/// Refuses `pool` under `uuid` when another pool was sent under it.
fn check_not_taken(sent: &HashMap<Uuid, SentPool>, uuid: Uuid, pool: SentPool) -> Result<()> {
    match sent.get(&uuid) {
        Some(&earlier) if earlier != pool => Err(IpcError::UuidTakenOnChannel { uuid }),
        _ => Ok(()),
    }
}

/// The pools sent to each identified peer, on any channel, by the UUID they went under: the
/// peer keys its imports by this process and the UUID, so one UUID must name one pool to it on
/// every channel. Entries of peers that have exited are swept out as the map grows.
struct SentToPeers {
    entries: BTreeMap<(PeerId, Uuid), SentPool>,
    sweep_at: usize,
}

/// Sweep out the entries of exited peers when a claim makes [`SentToPeers`] this large (at least).
const MIN_PEER_SWEEP: usize = 64;

static SENT_TO_PEERS: Mutex<SentToPeers> =
    Mutex::new(SentToPeers { entries: BTreeMap::new(), sweep_at: MIN_PEER_SWEEP });

fn sent_to_peers() -> MutexGuard<'static, SentToPeers> {
    // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
    SENT_TO_PEERS.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SentToPeers {
    /// Refuses `pool` under `uuid` to `peer` when another pool went to it under that UUID.
    fn check(&self, peer: PeerId, uuid: Uuid, pool: SentPool) -> Result<()> {
        match self.entries.get(&(peer, uuid)) {
            Some(&earlier) if earlier != pool => Err(IpcError::UuidTakenOnChannel { uuid }),
            _ => Ok(()),
        }
    }

    /// As [`SentToPeers::check`], then keeps `uuid` for `pool` to `peer`.
    fn claim(&mut self, peer: PeerId, uuid: Uuid, pool: SentPool) -> Result<()> {
        self.check(peer, uuid, pool)?;
        if self.entries.insert((peer, uuid), pool).is_none() && self.entries.len() >= self.sweep_at {
            // A peer that exited holds no import any more: what it was sent no longer binds.
            let mut alive: BTreeMap<PeerId, bool> = BTreeMap::new();
            self.entries.retain(|(peer, _), _| *alive.entry(*peer).or_insert_with(|| peer.is_alive()));
            self.sweep_at = (self.entries.len() * 2).max(MIN_PEER_SWEEP);
        }
        Ok(())
    }
}

/// How the wire names `device`: its UUID, and its ordinal here for messages.
///
/// # Errors
///
/// - [`IpcError::Core`]: reading the device's UUID failed.
pub(crate) fn wire_device(device: Device) -> Result<WireDevice> {
    let sender_ordinal = i32::try_from(device.ordinal()).unwrap_or(i32::MAX);
    Ok(WireDevice { uuid: Uuid::from_bytes(device.uuid()?), sender_ordinal })
}

/// This process's device with the UUID a peer named.
///
/// # Errors
///
/// - [`IpcError::DeviceNotVisible`]: this process does not see it.
/// - [`IpcError::Core`]: the driver failed to list the devices.
pub(crate) fn visible_device(device: WireDevice) -> Result<Device> {
    let WireDevice { uuid, sender_ordinal } = device;
    Device::with_uuid(*uuid.as_bytes())?.ok_or(IpcError::DeviceNotVisible { uuid, sender_ordinal })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BuffersMessageError, EnvelopeError, EventDescriptorError, RESOURCE_MESSAGE_LEN};
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
