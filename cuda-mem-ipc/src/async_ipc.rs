//! `AsyncIpcChannel` (feature `tokio`): [`IpcChannel`](crate::IpcChannel)'s messages (pools,
//! buffers, events, loans, virtual buffers, snapshots) over an [`AsyncChannel`], for servers
//! that serve many workers from a few threads. One protocol with the blocking channel (the
//! session of [`crate::session`]), so either end may be either kind, or Python's.

use std::sync::Arc;

use cuda_mem_core::{Buffer, DevicePtr, Event, EventOptions, MemoryResource, ScopedBuffer, Stream};
use uuid::Uuid;

use crate::async_channel::AsyncChannel;
use crate::error::{IpcError, Result};
use crate::loans::{Held, Outstanding, Unlent};
use crate::mapped::MappedMemoryResource;
use crate::received::Received;
use crate::session::Session;
use crate::wire::{BufferDescriptor, EventDescriptor, MessageKind, encode_buffers};

/// An [`IpcChannel`](crate::IpcChannel) whose sends and receives are futures of Tokio's
/// runtime: the same messages, the same rules for pools, events and buffers (see
/// [`IpcChannel`](crate::IpcChannel)), on the same wire.
///
/// # Cancellation
///
/// - [`recv`](Self::recv) and [`recv_buffers`](Self::recv_buffers) lose nothing when dropped:
///   a message is received whole before anything is imported, and the import makes no await.
/// - A send dropped before it returns sent its message whole or not at all (as
///   [`AsyncChannel`]); a pool it sent first may have gone, which the peer answers with the
///   pool it holds if it comes again.
/// - A [`lend`](Self::lend) dropped before it returns keeps the buffers lent if its message
///   began to go out (the peer may import them), and frees them otherwise (the peer never
///   had them).
/// - A [`give_back`](Self::give_back) dropped before it returns has freed the buffers here
///   and may not have told the peer, which then keeps them lent until this process exits
///   (see [`Outstanding`]): never freed under a mapping.
///
/// Sends on one channel go out one message at a time, in the order they were called, so the
/// pools a message needs always go before it.
///
/// Driver calls (imports, frees) run on the task's thread, as any CUDA call from async code;
/// [`give_back`](Self::give_back) waits for its stream's work, when it is not done yet, on the
/// runtime's blocking pool.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// # tokio::runtime::Builder::new_current_thread().enable_io().build()?.block_on(async {
/// use cuda_mem_core::{Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream};
/// use cuda_mem_ipc::{AsyncIpcChannel, Received};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
/// let (server, worker) = AsyncIpcChannel::pair()?;
///
/// let block = pool.allocate(1 << 20, &stream)?;
/// server.lend(vec![block]).await?; // the pool, then the buffer; kept by the server
/// assert_eq!(server.held().buffers, 1);
///
/// let lent = worker.recv_buffers(&stream).await?; // mapped in the worker
/// worker.give_back(lent, &stream).await?;
/// let Received::Returned(back) = server.recv(&stream).await? else { unreachable!() };
/// assert_eq!((back.len(), server.held().buffers), (1, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct AsyncIpcChannel {
    channel: AsyncChannel,
    session: Session,
    /// Held across each send, so that messages go out in call order and a pool noted as sent
    /// went out before any message that relies on it.
    order: tokio::sync::Mutex<()>,
}

impl AsyncIpcChannel {
    /// Wraps a connected channel.
    pub fn new(channel: AsyncChannel) -> AsyncIpcChannel {
        let session = Session::new(channel.peer());
        AsyncIpcChannel { channel, session, order: tokio::sync::Mutex::new(()) }
    }

    /// Two connected channels in this process (as [`AsyncChannel::pair`]).
    ///
    /// # Errors
    /// As [`AsyncChannel::pair`].
    pub fn pair() -> Result<(AsyncIpcChannel, AsyncIpcChannel)> {
        let (a, b) = AsyncChannel::pair()?;
        Ok((AsyncIpcChannel::new(a), AsyncIpcChannel::new(b)))
    }

    /// The underlying channel.
    pub fn channel(&self) -> &AsyncChannel {
        &self.channel
    }

    /// As [`IpcChannel::resource`](crate::IpcChannel::resource).
    pub fn resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.session.resource(uuid)
    }

    /// As [`IpcChannel::release_resource`](crate::IpcChannel::release_resource).
    pub fn release_resource(&self, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.session.release_resource(uuid)
    }

    /// As [`IpcChannel::release_resources`](crate::IpcChannel::release_resources).
    pub fn release_resources(&self) {
        self.session.release_resources();
    }

    /// As [`IpcChannel::release_events`](crate::IpcChannel::release_events).
    pub fn release_events(&self) {
        self.session.release_events();
    }

    /// As [`IpcChannel::open_events`](crate::IpcChannel::open_events).
    pub fn open_events(&self) -> usize {
        self.session.open_events()
    }

    /// As [`IpcChannel::send_resource`](crate::IpcChannel::send_resource).
    ///
    /// # Errors
    /// As [`IpcChannel::send_resource`](crate::IpcChannel::send_resource).
    pub async fn send_resource(&self, resource: &dyn MemoryResource) -> Result<()> {
        let _order = self.order.lock().await;
        self.send_resource_in_order(resource).await
    }

    /// Sends a resource message; the caller holds `order`.
    async fn send_resource_in_order(&self, resource: &dyn MemoryResource) -> Result<()> {
        let frame = self.session.resource_frame(resource)?;
        self.session.claim(&self.session.sent(), &frame)?;
        self.channel.send(MessageKind::Resource.code(), &frame.payload, &[frame.handle.fd()]).await?;
        Session::note_sent(&mut self.session.sent(), &frame);
        Ok(())
    }

    /// As [`IpcChannel::send_buffers`](crate::IpcChannel::send_buffers).
    ///
    /// # Errors
    /// As [`IpcChannel::send_buffers`](crate::IpcChannel::send_buffers).
    pub async fn send_buffers(&self, buffers: &[&ScopedBuffer<'_>]) -> Result<()> {
        let _order = self.order.lock().await;
        let (payload, _) = self.buffers_payload(Vec::new(), buffers).await?;
        self.channel.send(MessageKind::Buffers.code(), &payload, &[]).await
    }

    /// As [`IpcChannel::send_buffers_after`](crate::IpcChannel::send_buffers_after).
    ///
    /// # Errors
    /// As [`IpcChannel::send_buffers_after`](crate::IpcChannel::send_buffers_after).
    pub async fn send_buffers_after(&self, event: &Event, buffers: &[&ScopedBuffer<'_>]) -> Result<()> {
        let descriptor = EventDescriptor::of(event)?;
        let _order = self.order.lock().await;
        let (payload, _) = self.buffers_payload(descriptor.encode().to_vec(), buffers).await?;
        self.channel.send(MessageKind::BuffersAfterEvent.code(), &payload, &[]).await
    }

    /// As [`IpcChannel::send_event`](crate::IpcChannel::send_event).
    ///
    /// # Errors
    /// As [`IpcChannel::send_event`](crate::IpcChannel::send_event).
    pub async fn send_event(&self, event: &Event) -> Result<()> {
        let descriptor = EventDescriptor::of(event)?;
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::Event.code(), &descriptor.encode(), &[]).await
    }

    /// As [`IpcChannel::send_data`](crate::IpcChannel::send_data).
    ///
    /// # Errors
    /// As [`AsyncChannel::send`].
    pub async fn send_data(&self, bytes: &[u8]) -> Result<()> {
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::Data.code(), bytes, &[]).await
    }

    /// `prefix` followed by a buffers message's payload, after sending each resource not yet
    /// sent; and the descriptors. The caller holds `order`.
    async fn buffers_payload(
        &self,
        mut payload: Vec<u8>,
        buffers: &[&ScopedBuffer<'_>],
    ) -> Result<(Vec<u8>, Vec<BufferDescriptor>)> {
        let plan = self.session.plan_buffers(buffers)?;
        for resource in plan.resources_first {
            self.send_resource_in_order(resource).await?;
        }
        encode_buffers(&mut payload, &plan.descriptors);
        Ok((payload, plan.descriptors))
    }

    /// As [`IpcChannel::lend`](crate::IpcChannel::lend). Cancelled, it keeps the buffers lent
    /// if its message began to go out, and frees them otherwise (see the type's docs).
    ///
    /// # Errors
    /// As [`IpcChannel::lend`](crate::IpcChannel::lend).
    pub async fn lend(&self, buffers: Vec<Buffer>) -> std::result::Result<(), Box<Unlent>> {
        self.lend_in(Vec::new(), MessageKind::Buffers, buffers).await
    }

    /// As [`IpcChannel::lend_after`](crate::IpcChannel::lend_after).
    ///
    /// # Errors
    /// As [`IpcChannel::lend_after`](crate::IpcChannel::lend_after).
    pub async fn lend_after(&self, event: &Event, buffers: Vec<Buffer>) -> std::result::Result<(), Box<Unlent>> {
        match EventDescriptor::of(event) {
            Ok(descriptor) => self.lend_in(descriptor.encode().to_vec(), MessageKind::BuffersAfterEvent, buffers).await,
            Err(error) => Err(Box::new(Unlent { error: error.into(), buffers })),
        }
    }

    async fn lend_in(
        &self,
        prefix: Vec<u8>,
        kind: MessageKind,
        buffers: Vec<Buffer>,
    ) -> std::result::Result<(), Box<Unlent>> {
        let _order = self.order.lock().await;
        let made = {
            let refs: Vec<&ScopedBuffer<'_>> = buffers.iter().collect();
            self.buffers_payload(prefix, &refs).await
        };
        let (payload, descriptors) = match made {
            Ok(made) => made,
            Err(error) => return Err(Box::new(Unlent { error, buffers })),
        };
        // Kept before they go: a peer that hands them back at once finds them lent.
        self.session.loans.keep(&descriptors, buffers);
        let mut pending = PendingLend {
            channel: self,
            descriptors: &descriptors,
            begun_before: self.channel.frames_begun(),
            settled: false,
        };
        let sent = self.channel.send(kind.code(), &payload, &[]).await;
        pending.settled = true;
        match sent {
            Ok(()) => Ok(()),
            Err(error) => {
                Err(Box::new(Unlent { error, buffers: self.session.loans.take(&descriptors).unwrap_or_default() }))
            }
        }
    }

    /// As [`IpcChannel::give_back`](crate::IpcChannel::give_back). When `stream`'s work is not
    /// done yet, the wait for it runs on the runtime's blocking pool, on an event that sleeps
    /// rather than spins: no runtime thread is held and no CPU burns while the GPU works.
    ///
    /// # Errors
    /// As [`IpcChannel::give_back`](crate::IpcChannel::give_back), and [`IpcError::Io`] if the
    /// runtime shut down during the wait (the buffers are freed here, and nothing was sent).
    pub async fn give_back(&self, buffers: Vec<Buffer>, stream: &Stream) -> Result<()> {
        let descriptors = self.session.free_for_return(buffers, stream)?;
        let freed = Event::new(stream.device(), EventOptions::default().blocking_sync())?;
        freed.record(stream)?;
        // A query first: a hand-back that finds the work done costs no thread hop.
        // Otherwise a blocking wait, which (unlike a host function on the stream) ends with an
        // error when the context fails, where a host function would never run.
        if !freed.is_complete()? {
            tokio::task::spawn_blocking(move || freed.synchronize()).await.map_err(|join| IpcError::Io {
                context: "waiting for the stream before handing buffers back",
                source: join.into(),
            })??;
        }
        let mut payload = Vec::new();
        encode_buffers(&mut payload, &descriptors);
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::Returned.code(), &payload, &[]).await
    }

    /// As [`IpcChannel::held`](crate::IpcChannel::held).
    pub fn held(&self) -> Held {
        self.session.loans.held()
    }

    /// As [`IpcChannel::lent_buffers`](crate::IpcChannel::lent_buffers).
    pub fn lent_buffers(&self) -> Vec<(DevicePtr, usize)> {
        self.session.loans.list()
    }

    /// As [`IpcChannel::into_outstanding`](crate::IpcChannel::into_outstanding).
    pub fn into_outstanding(self) -> Outstanding {
        self.session.outstanding()
    }

    /// As [`IpcChannel::recv`](crate::IpcChannel::recv). Cancellation-safe.
    ///
    /// # Errors
    /// As [`IpcChannel::recv`](crate::IpcChannel::recv), less the time-outs (bound it with
    /// `tokio::time::timeout`).
    pub async fn recv(&self, stream: &Stream) -> Result<Received> {
        let message = self.channel.recv().await?;
        self.session.receive(message, stream)
    }

    /// As [`IpcChannel::recv_buffers`](crate::IpcChannel::recv_buffers). Cancellation-safe: a
    /// pool received before the cancellation is kept, as it would be.
    ///
    /// # Errors
    /// As [`IpcChannel::recv_buffers`](crate::IpcChannel::recv_buffers).
    pub async fn recv_buffers(&self, stream: &Stream) -> Result<Vec<Buffer>> {
        loop {
            let message = self.channel.recv().await?;
            if let Some(buffers) = self.session.receive_for_buffers(message, stream)? {
                return Ok(buffers);
            }
        }
    }

    /// As [`IpcChannel::send_virtual_buffer`](crate::IpcChannel::send_virtual_buffer)
    /// (feature `vmm`).
    ///
    /// # Errors
    /// As [`IpcChannel::send_virtual_buffer`](crate::IpcChannel::send_virtual_buffer).
    #[cfg(feature = "vmm")]
    pub async fn send_virtual_buffer(&self, buffer: &cuda_mem_vmm::VirtualBuffer) -> Result<()> {
        let shared = crate::SharedVirtualBuffer::export(buffer)?;
        let (bytes, fds) = shared.encode();
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::VirtualBuffer.code(), &bytes, &fds).await
    }

    /// As [`IpcChannel::import_virtual_buffers_into`](crate::IpcChannel::import_virtual_buffers_into)
    /// (feature `vmm`).
    #[cfg(feature = "vmm")]
    pub fn import_virtual_buffers_into(
        &self,
        resource: Arc<cuda_mem_vmm::VirtualMemoryResource>,
    ) -> Option<Arc<cuda_mem_vmm::VirtualMemoryResource>> {
        self.session.virtual_buffer_importers.register(resource)
    }

    /// As [`IpcChannel::request_snapshot`](crate::IpcChannel::request_snapshot) (feature
    /// `snapshot`).
    ///
    /// # Errors
    /// As [`AsyncChannel::send`].
    #[cfg(feature = "snapshot")]
    pub async fn request_snapshot(&self, max_events: Option<u32>) -> Result<()> {
        let request = crate::wire::SnapshotRequest::new(max_events);
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::SnapshotRequest.code(), &request.encode(), &[]).await
    }

    /// As [`IpcChannel::answer_snapshot_request`](crate::IpcChannel::answer_snapshot_request)
    /// (feature `snapshot`).
    ///
    /// # Errors
    /// As [`IpcChannel::answer_snapshot_request`](crate::IpcChannel::answer_snapshot_request).
    #[cfg(feature = "snapshot")]
    pub async fn answer_snapshot_request(&self, request: &crate::wire::SnapshotRequest) -> Result<()> {
        let json = crate::snapshot::answer_json(request)?;
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::Snapshot.code(), json.as_bytes(), &[]).await
    }

    /// As [`IpcChannel::send_snapshot`](crate::IpcChannel::send_snapshot) (feature `snapshot`).
    ///
    /// # Errors
    /// As [`IpcChannel::send_snapshot`](crate::IpcChannel::send_snapshot).
    #[cfg(feature = "snapshot")]
    pub async fn send_snapshot(&self, snapshot: &cuda_mem_core::snapshot::MemorySnapshot) -> Result<()> {
        let json = crate::snapshot::snapshot_json(snapshot)?;
        let _order = self.order.lock().await;
        self.channel.send(MessageKind::Snapshot.code(), json.as_bytes(), &[]).await
    }
}

/// A lend's message on its way out. Dropped unsettled (the lend was cancelled), it frees the
/// buffers if the message never began to go out: the peer cannot have them.
struct PendingLend<'a> {
    channel: &'a AsyncIpcChannel,
    descriptors: &'a [BufferDescriptor],
    /// [`AsyncChannel::frames_begun`] before the send: one more afterwards is this message
    /// (sends go one at a time, under the channel's `order`, still held here).
    begun_before: u64,
    settled: bool,
}

impl Drop for PendingLend<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self.channel.channel.frames_begun() == self.begun_before {
            // Never began: taken back and freed.
            drop(self.channel.session.loans.take(self.descriptors));
        }
    }
}
