//! What an IPC channel keeps of its peer, whatever carries its frames: the pools sent and
//! received, the peer's events, the resources virtual buffers are imported with; and how each
//! message is received, and the frames of a send are made. [`IpcChannel`](crate::IpcChannel)
//! (blocking) and `AsyncIpcChannel` (feature `tokio`) each put one over their transport, so they
//! speak one protocol.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cuda_mem_core::{Buffer, Event, MemoryResource, PoolKind, ScopedBuffer, Stream};
use uuid::Uuid;

use crate::assembly::RawMessage;
use crate::device_naming::{visible_device, wire_device};
use crate::error::{IpcError, MessageLimit, ProtocolError, Result, Unshareable};
use crate::loans::{Loans, Outstanding};
use crate::mapped::{ImportOrigin, MappedMemoryResource};
use crate::peer::PeerId;
use crate::received::Received;
use crate::share::{AllocationHandle, allocation_handle, buffer_descriptor};
use crate::wire::{
    BufferDescriptor, EventDescriptor, MAX_BUFFERS_PER_MESSAGE, MessageError, MessageKind, PoolMemory, ResourceMessage,
    buffer_descriptors, expect_fds, split_event,
};

/// What a channel keeps of its peer (see [`IpcChannel`](crate::IpcChannel)).
#[derive(Debug)]
pub(crate) struct Session {
    /// The process at the other end, where the kernel vouches for it.
    peer: Option<PeerId>,
    /// The resources sent on this channel: by UUID, which pool went under it. A UUID is in here
    /// only once its resource has gone (buffers that name it then follow it on the wire), and
    /// only one pool ever goes under it.
    sent: Mutex<HashMap<Uuid, SentPool>>,
    /// The resources received on this channel, by the UUID the peer named them with: buffers
    /// map through these only, and they live as long as the channel (or until released).
    received: Mutex<HashMap<Uuid, Arc<MappedMemoryResource>>>,
    /// The peer's events opened on this channel, by the peer's id of each.
    events: Mutex<HashMap<u64, Arc<Event>>>,
    /// The resources virtual buffers are imported with, one per location.
    #[cfg(feature = "vmm")]
    pub(crate) virtual_buffer_importers: crate::virtual_buffer::VirtualBufferImporters,
    /// The buffers lent to the peer, kept until it hands them back or exits.
    pub(crate) loans: Loans,
}

/// A resource message, checked and encoded, with the pool's descriptor to send beside it.
pub(crate) struct ResourceFrame<'r> {
    pub(crate) handle: AllocationHandle<'r>,
    uuid: Uuid,
    pool: SentPool,
    pub(crate) payload: Vec<u8>,
}

/// What a buffers message needs: the resources to send before it (each not yet sent on the
/// channel, once), and the buffers' descriptors.
pub(crate) struct BuffersPlan<'b> {
    pub(crate) resources_first: Vec<&'b dyn MemoryResource>,
    pub(crate) descriptors: Vec<BufferDescriptor>,
}

impl Session {
    /// A session with `peer` (where the kernel vouches for it), nothing sent or received yet.
    pub(crate) fn new(peer: Option<PeerId>) -> Session {
        Session {
            peer,
            sent: Mutex::new(HashMap::new()),
            received: Mutex::new(HashMap::new()),
            events: Mutex::new(HashMap::new()),
            #[cfg(feature = "vmm")]
            virtual_buffer_importers: Default::default(),
            loans: Loans::default(),
        }
    }

    /// What is still lent, taken out: the buffers come back when the peer exits.
    pub(crate) fn outstanding(&self) -> Outstanding {
        Outstanding::new(self.peer, self.loans.take_all())
    }

    /// The descriptors of `buffers`, once each is checked to come from the peer (as
    /// [`returnable`](Self::returnable)) and freed on `stream`; the caller then waits for
    /// `stream` before it tells the peer. Nothing is freed when a check fails.
    pub(crate) fn free_for_return(&self, buffers: Vec<Buffer>, stream: &Stream) -> Result<Vec<BufferDescriptor>> {
        check_batch(buffers.len())?;
        let descriptors = self.returnable(&buffers)?;
        for buffer in buffers {
            buffer.close(Some(stream)).map_err(|refused| IpcError::Core(refused.into_parts().1))?;
        }
        Ok(descriptors)
    }

    /// Checks that each of `buffers` was received on this channel (mapped through a pool it
    /// received), and returns the descriptor each came with.
    pub(crate) fn returnable(&self, buffers: &[Buffer]) -> Result<Vec<BufferDescriptor>> {
        buffers
            .iter()
            .map(|buffer| {
                let not_here = IpcError::NotReceivedHere { ptr: buffer.ptr() };
                let Some(resource) = buffer.resource() else { return Err(not_here) };
                let any: &dyn Any = resource.as_ref();
                let Some(mapped) = any.downcast_ref::<MappedMemoryResource>() else { return Err(not_here) };
                match self.resource(mapped.uuid()) {
                    Some(kept) if std::ptr::eq(Arc::as_ptr(&kept), mapped) => buffer_descriptor(buffer),
                    _ => Err(not_here),
                }
            })
            .collect()
    }

    pub(crate) fn sent(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, SentPool>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn received(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<MappedMemoryResource>>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.received.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The resource received on this channel under `uuid`, if the channel still keeps it.
    pub(crate) fn resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.received().get(&uuid).cloned()
    }

    /// Lets go of the resource received under `uuid`: the channel no longer keeps it alive (the
    /// buffers mapped through it, and other holders of its `Arc`, still do), and buffers that
    /// name it are refused ([`IpcError::UnknownResource`]) until the peer sends it again.
    /// Returns it, if the channel kept it.
    pub(crate) fn release_resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.received().remove(&uuid)
    }

    /// Lets go of every resource received, as `release_resource` does for one.
    pub(crate) fn release_resources(&self) {
        // Dropped outside the lock: a resource's drop does not come back here, but need not
        // wait for it either.
        let released = std::mem::take(&mut *self.received());
        drop(released);
    }

    /// Lets go of every event of the peer opened on this channel (they are closed once no
    /// [`Received::Event`] holds them either). An event the peer sends again is opened again.
    pub(crate) fn release_events(&self) {
        let released = std::mem::take(&mut *self.events());
        drop(released);
    }

    /// How many of the peer's events this channel keeps open.
    pub(crate) fn open_events(&self) -> usize {
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

    /// The resource message for `resource`, checked to be shareable (nothing is claimed yet).
    pub(crate) fn resource_frame<'r>(&self, resource: &'r dyn MemoryResource) -> Result<ResourceFrame<'r>> {
        let handle = allocation_handle(resource)?;
        let pool = SentPool::of(resource);
        let memory = match handle.kind() {
            PoolKind::Device(device) => PoolMemory::Device(wire_device(device)?),
            PoolKind::Pinned => PoolMemory::Pinned,
            // Only device and pinned pools can be created shareable (or imported).
            other => return Err(IpcError::NotIpcEnabled(Unshareable::PoolKind(other))),
        };
        let payload = ResourceMessage { pool: handle.uuid(), memory }.encode().to_vec();
        Ok(ResourceFrame { uuid: handle.uuid(), pool, payload, handle })
    }

    /// Checks that `frame`'s UUID is free for its pool on this channel (`sent`, this session's
    /// [`sent`](Self::sent)), and claims it with the peer process for that pool before it goes
    /// out (a claim whose send then fails only keeps the UUID for the same pool).
    pub(crate) fn claim(&self, sent: &HashMap<Uuid, SentPool>, frame: &ResourceFrame<'_>) -> Result<()> {
        check_not_taken(sent, frame.uuid, frame.pool)?;
        if let Some(peer) = self.peer {
            sent_to_peers().claim(peer, frame.uuid, frame.pool)?;
        }
        Ok(())
    }

    /// Notes that `frame` went out: buffers of its pool now follow it without it.
    pub(crate) fn note_sent(sent: &mut HashMap<Uuid, SentPool>, frame: &ResourceFrame<'_>) {
        sent.insert(frame.uuid, frame.pool);
    }

    /// The descriptors of `buffers`, and the resources to send before them (see
    /// [`BuffersPlan`]); a UUID that would stand for two pools (one sent before, or two in this
    /// message) is refused before anything is sent.
    pub(crate) fn plan_buffers<'b>(&self, buffers: &[&'b ScopedBuffer<'_>]) -> Result<BuffersPlan<'b>> {
        check_batch(buffers.len())?;
        let descriptors = buffers.iter().map(|b| buffer_descriptor(b)).collect::<Result<Vec<_>>>()?;
        // The resources to send first, each once; a UUID that would stand for two pools (one
        // sent before, or two in this message) is refused before any of them is sent.
        let mut unsent: HashMap<Uuid, SentPool> = HashMap::new();
        let mut resources_first: Vec<&'b dyn MemoryResource> = Vec::new();
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
                if let Some(peer) = self.peer {
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
                        resources_first.push(resource);
                    }
                }
            }
        }
        Ok(BuffersPlan { resources_first, descriptors })
    }

    /// Receives `message` (see [`IpcChannel::recv`](crate::IpcChannel::recv)).
    pub(crate) fn receive(&self, message: RawMessage, stream: &Stream) -> Result<Received> {
        let kind = checked_kind(&message)?;
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
            MessageKind::Returned => {
                let descriptors = buffer_descriptors(&message.payload)?
                    .map(BufferDescriptor::decode)
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                self.loans.take(&descriptors).map(Received::Returned)
            }
        }
    }

    /// Receives `message` where buffers are awaited (see
    /// [`IpcChannel::recv_buffers`](crate::IpcChannel::recv_buffers)): a resource is kept and
    /// `None` returned (the buffers are still to come); buffers are mapped.
    pub(crate) fn receive_for_buffers(&self, message: RawMessage, stream: &Stream) -> Result<Option<Vec<Buffer>>> {
        match checked_kind(&message)? {
            MessageKind::Resource => self.receive_resource(message).map(|_| None),
            kind @ (MessageKind::Buffers | MessageKind::BuffersAfterEvent) => {
                self.receive_buffers(kind, &message.payload, stream).map(Some)
            }
            found => Err(IpcError::UnexpectedMessage { expected: MessageKind::Buffers, found }),
        }
    }

    /// Imports (or finds) the pool of a resource message: kept by the channel under the UUID the
    /// peer named, and process-wide by the peer and that UUID (see [`IpcChannel`](crate::IpcChannel), *Pools*). The
    /// memory kind and device the message claims must be the imported pool's, as the driver
    /// reports them.
    fn receive_resource(&self, mut message: RawMessage) -> Result<Arc<MappedMemoryResource>> {
        let ResourceMessage { pool: uuid, memory } = ResourceMessage::decode(&message.payload)?;
        let kind = match memory {
            PoolMemory::Device(device) => PoolKind::Device(visible_device(device)?),
            PoolMemory::Pinned => PoolKind::Pinned,
        };
        // One, as `checked_kind` checked.
        let fd: OwnedFd = message.fds.pop().ok_or(ProtocolError::Message(MessageError::FdCount {
            kind: MessageKind::Resource,
            expected: 1,
            found: 0,
        }))?;
        // Sent again on this channel: the first one stands (the duplicate descriptor closes here).
        let resource = match self.resource(uuid) {
            Some(received) => received,
            None => {
                let imported = MappedMemoryResource::from_peer(fd, uuid, self.peer)?;
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

/// Refuses more buffers than one message carries.
fn check_batch(count: usize) -> Result<()> {
    if count > MAX_BUFFERS_PER_MESSAGE {
        return Err(IpcError::MessageTooLarge {
            what: MessageLimit::Buffers,
            actual: count,
            limit: MAX_BUFFERS_PER_MESSAGE,
        });
    }
    Ok(())
}

/// The kind of `message`, once it is known and the message carries the number of file
/// descriptors its kind does.
fn checked_kind(message: &RawMessage) -> Result<MessageKind> {
    let kind = MessageKind::of(message.kind).map_err(ProtocolError::from)?;
    expect_fds(kind, message.fds.len()).map_err(ProtocolError::from)?;
    Ok(kind)
}
impl Drop for Session {
    fn drop(&mut self) {
        // Freed only if the peer has exited; kept allocated (and recorded) otherwise.
        drop(self.outstanding());
    }
}

/// Which pool a resource sent on a channel is, where its UUID may not tell: a pool created in
/// this process has a UUID of its own (made at random when it is first shared), but an imported
/// one has the UUID its exporter named it with, which another import may share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentPool {
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
