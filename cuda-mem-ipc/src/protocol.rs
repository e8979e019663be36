//! `IpcChannel`: pools, buffers and plain bytes between processes, over a [`Channel`].
//!
//! Documented on [`IpcChannel`]: its messages and what the receiving side keeps.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use cuda_mem_core::{Buffer, Device, MemoryResource, PoolKind, ScopedBuffer, Stream};
use uuid::Uuid;

use crate::channel::{Channel, RawMessage};
use crate::descriptor::{BufferDescriptor, ENCODED_LEN};
use crate::error::{IpcError, Result};
use crate::mapped::MappedMemoryResource;
use crate::share::{allocation_handle, buffer_descriptor};

/// Message kinds on the wire.
const RESOURCE: u16 = 1;
const BUFFERS: u16 = 2;
const DATA: u16 = 3;
pub(crate) const VIRTUAL_BUFFER: u16 = 4;
const RESOURCE_LEN: usize = 40;
/// The most buffers one message may carry.
pub const MAX_BUFFERS_PER_MESSAGE: usize = 65_536;

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
    /// A virtual buffer (feature `vmm`), mapped with the resource registered for where its
    /// memory lives.
    #[cfg(feature = "vmm")]
    VirtualBuffer(cuda_mem_vmm::VirtualBuffer),
}

/// A channel that carries pools, buffers, plain bytes (and, with the feature `vmm`, virtual
/// buffers) between processes, over a [`Channel`].
///
/// Messages (each one frame of the channel):
///
/// | kind | payload | file descriptors |
/// |---|---|---|
/// | 1, resource | UUID (16 bytes), memory kind (u8: 0 device, 1 pinned), the sender's device ordinal (i32 LE, -1 for pinned), 3 zero bytes, device UUID (16 bytes, zero for pinned) | the pool's |
/// | 2, buffers | count (u32 LE), then `count` encoded [`BufferDescriptor`]s | none |
/// | 3, data | the application's bytes | none |
/// | 4, virtual buffer (feature `vmm`) | an encoded `SharedVirtualBuffer` (its layout: `SharedVirtualBuffer`'s docs) | one per chunk (POSIX-fd handles), none (fabric handles) |
///
/// One channel carries all of them, in any order. A virtual buffer is imported with the
/// `VirtualMemoryResource` the receiver registered for where its memory lives
/// (`IpcChannel::import_virtual_buffers_into`); a build without the `vmm` feature refuses kind 4
/// saying so, and closes its descriptors.
///
/// The receiver finds the pool's device by its UUID, not by the sender's ordinal: processes
/// that see different devices (`CUDA_VISIBLE_DEVICES`) number them differently.
///
/// Sending a buffer whose resource has not been sent on this channel sends the resource first,
/// so the receiver always knows it.
///
/// The receiving channel keeps every resource it received, by the UUID the peer named it with,
/// for as long as the channel lives (or until [`IpcChannel::release_resource`]): a receiver may
/// drop the [`Received::Resource`] it got, and the buffers that follow still map. Buffers are
/// resolved only against the resources their own channel received, never against the
/// process-wide registry, so a peer can use only the pools it sent itself. The peer's word is
/// checked against the driver's: the memory kind and device a resource message states must be
/// what the imported pool is (asked of the driver); a UUID this process has imported already is
/// shared only when the driver answers the new import with that import's own handle (the same
/// pool); otherwise the new import stands on its own. A resource sent again on the same channel
/// is the one received first (the duplicate descriptor is closed).
#[derive(Debug)]
pub struct IpcChannel {
    channel: Channel,
    /// The UUIDs of the resources sent on this channel.
    sent: Mutex<HashSet<Uuid>>,
    /// The resources received on this channel, by the UUID the peer named them with: buffers
    /// map through these only, and they live as long as the channel (or until released).
    received: Mutex<HashMap<Uuid, Arc<MappedMemoryResource>>>,
    /// The resources virtual buffers are imported with, one per location.
    #[cfg(feature = "vmm")]
    pub(crate) virtual_buffer_importers: crate::virtual_buffer::VirtualBufferImporters,
}

impl IpcChannel {
    /// Wraps a connected channel.
    pub fn new(channel: Channel) -> IpcChannel {
        IpcChannel {
            channel,
            sent: Mutex::new(HashSet::new()),
            received: Mutex::new(HashMap::new()),
            #[cfg(feature = "vmm")]
            virtual_buffer_importers: Default::default(),
        }
    }

    /// The underlying channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
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

    /// Sends a pool resource (its file descriptor and UUID). Sending it again sends it again;
    /// the receiver's registry turns the second one into a hit.
    ///
    /// # Errors
    /// [`IpcError::NotIpcEnabled`] for resources that cannot be shared; channel errors.
    pub fn send_resource(&self, resource: &dyn MemoryResource) -> Result<()> {
        let handle = allocation_handle(resource)?;
        let mut payload = [0u8; RESOURCE_LEN];
        payload[..16].copy_from_slice(handle.uuid().as_bytes());
        let (kind, ordinal, device_uuid) = match handle.kind() {
            PoolKind::Device(device) => (0u8, device.ordinal() as i32, device.uuid()?),
            PoolKind::Pinned => (1u8, -1, [0; 16]),
            // Only device and pinned pools can be created shareable (or imported).
            other => return Err(IpcError::NotIpcEnabled(format!("a {other}"))),
        };
        payload[16] = kind;
        payload[17..21].copy_from_slice(&ordinal.to_le_bytes());
        payload[24..40].copy_from_slice(&device_uuid);
        self.channel.send(RESOURCE, &payload, &[handle.fd()])?;
        self.sent.lock().unwrap_or_else(PoisonError::into_inner).insert(handle.uuid());
        Ok(())
    }

    /// Sends buffers in one message, sending first each resource not yet sent on this channel.
    ///
    /// # Errors
    /// [`IpcError::MessageTooLarge`] for more buffers than one message carries (nothing is
    /// sent); [`IpcError::NotIpcEnabled`] for buffers that cannot be shared; channel errors.
    pub fn send_buffers(&self, buffers: &[&ScopedBuffer<'_>]) -> Result<()> {
        if buffers.len() > MAX_BUFFERS_PER_MESSAGE {
            return Err(IpcError::MessageTooLarge {
                what: "number of buffers",
                actual: buffers.len(),
                limit: MAX_BUFFERS_PER_MESSAGE,
            });
        }
        let descriptors = buffers.iter().map(|b| buffer_descriptor(b)).collect::<Result<Vec<_>>>()?;
        for (buffer, descriptor) in buffers.iter().zip(&descriptors) {
            let known = self.sent.lock().unwrap_or_else(PoisonError::into_inner).contains(&descriptor.resource);
            if !known && let Some(resource) = buffer.memory_resource() {
                self.send_resource(resource)?;
            }
        }
        let mut payload = Vec::with_capacity(4 + descriptors.len() * ENCODED_LEN);
        payload.extend_from_slice(&(descriptors.len() as u32).to_le_bytes());
        for descriptor in &descriptors {
            payload.extend_from_slice(&descriptor.encode());
        }
        self.channel.send(BUFFERS, &payload, &[])
    }

    /// Sends the application's bytes.
    ///
    /// # Errors
    /// Channel errors.
    pub fn send_data(&self, bytes: &[u8]) -> Result<()> {
        self.channel.send(DATA, bytes, &[])
    }

    /// Receives one message: imports a resource (kept by the channel, see
    /// [`IpcChannel`]), maps buffers through the resources this channel received (freed on
    /// `stream` when dropped), or returns bytes.
    ///
    /// With the feature `vmm`, a virtual buffer is imported with the resource registered for
    /// where its memory lives (freed on `stream` when dropped); when it cannot be, the error is
    /// `IpcError::VirtualBufferDecode`, `IpcError::DeviceNotVisible`,
    /// `IpcError::NoVirtualMemoryResource` or `IpcError::Vmm`, its descriptors are closed and
    /// nothing stays imported.
    ///
    /// # Errors
    /// Channel errors; protocol errors for malformed messages; [`IpcError::UnknownResource`]
    /// for a buffer whose resource did not arrive on this channel (or was released);
    /// [`IpcError::MisdescribedResource`] for a pool that is not what the peer says;
    /// [`IpcError::PoolAlreadyImported`] for a pool this process holds under another UUID;
    /// [`IpcError::MisdescribedBuffer`] for a buffer larger than the memory its pool shares;
    /// [`IpcError::NotReceivable`] for a virtual buffer without the feature `vmm`; driver errors
    /// from importing. A bad message leaves the process and its pools as they were (nothing
    /// half-imported stays mapped).
    pub fn recv(&self, stream: &Stream) -> Result<Received> {
        let message = self.channel.recv()?;
        match message.kind {
            RESOURCE => self.receive_resource(message).map(Received::Resource),
            BUFFERS => self.receive_buffers(&message, stream).map(Received::Buffers),
            DATA => {
                expect_no_fds(&message)?;
                Ok(Received::Data(message.payload))
            }
            #[cfg(feature = "vmm")]
            VIRTUAL_BUFFER => self.virtual_buffer_importers.receive(message, stream).map(Received::VirtualBuffer),
            #[cfg(not(feature = "vmm"))]
            VIRTUAL_BUFFER => {
                Err(IpcError::NotReceivable { what: "virtual buffer", kind: VIRTUAL_BUFFER, feature: "vmm" })
            }
            other => Err(IpcError::Protocol(format!("unknown message kind {other}"))),
        }
    }

    fn receive_resource(&self, mut message: RawMessage) -> Result<Arc<MappedMemoryResource>> {
        let payload = &message.payload;
        if payload.len() != RESOURCE_LEN || message.fds.len() != 1 {
            return Err(IpcError::Protocol(format!(
                "a resource message has {RESOURCE_LEN} bytes and 1 file descriptor; got {} bytes and {}",
                payload.len(),
                message.fds.len()
            )));
        }
        if payload[21..24].iter().any(|&b| b != 0) {
            return Err(IpcError::Protocol("a resource message's reserved bytes are not zero".to_string()));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&payload[..16]);
        let uuid = Uuid::from_bytes(uuid);
        if uuid.is_nil() {
            return Err(IpcError::Protocol("a resource message names the nil UUID".to_string()));
        }
        let ordinal = i32::from_le_bytes([payload[17], payload[18], payload[19], payload[20]]);
        let mut device_uuid = [0u8; 16];
        device_uuid.copy_from_slice(&payload[24..40]);
        let kind = match payload[16] {
            0 => {
                if ordinal < 0 {
                    return Err(IpcError::Protocol(format!("device ordinal {ordinal} in a resource message")));
                }
                if device_uuid == [0; 16] {
                    return Err(IpcError::Protocol("a device pool's resource message has no device UUID".to_string()));
                }
                PoolKind::Device(visible_device(Uuid::from_bytes(device_uuid), ordinal)?)
            }
            1 if ordinal != -1 || device_uuid != [0; 16] => {
                return Err(IpcError::Protocol(
                    "a pinned pool's resource message names a device (ordinal -1 and a zero UUID expected)".to_string(),
                ));
            }
            1 => PoolKind::Pinned,
            other => return Err(IpcError::Protocol(format!("memory kind {other} in a resource message"))),
        };
        let fd: OwnedFd = message.fds.remove(0);
        // Sent again on this channel: the first one stands (the duplicate descriptor closes here).
        let resource = match self.resource(uuid) {
            Some(received) => received,
            None => MappedMemoryResource::from_peer(fd, uuid)?,
        };
        if resource.kind() != kind {
            return Err(IpcError::MisdescribedResource { uuid, claimed: kind, actual: resource.kind() });
        }
        self.received().insert(uuid, Arc::clone(&resource));
        Ok(resource)
    }

    fn receive_buffers(&self, message: &RawMessage, stream: &Stream) -> Result<Vec<Buffer>> {
        expect_no_fds(message)?;
        let payload = &message.payload;
        let count = payload
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| IpcError::Protocol("a buffers message shorter than its count".to_string()))?
            as usize;
        if count > MAX_BUFFERS_PER_MESSAGE {
            return Err(IpcError::Protocol(format!(
                "a buffers message for {count} buffers; the most one message may carry is {MAX_BUFFERS_PER_MESSAGE}"
            )));
        }
        if payload.len() != 4 + count * ENCODED_LEN {
            return Err(IpcError::Protocol(format!(
                "a buffers message for {count} buffers must have {} bytes; it has {}",
                4 + count * ENCODED_LEN,
                payload.len()
            )));
        }
        // Decode everything, and find every resource, before importing anything.
        let descriptors = payload[4..]
            .chunks_exact(ENCODED_LEN)
            .map(BufferDescriptor::decode)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let resources = {
            let received = self.received();
            descriptors
                .iter()
                .map(|d| received.get(&d.resource).cloned().ok_or(IpcError::UnknownResource(d.resource)))
                .collect::<Result<Vec<_>>>()?
        };
        let mut buffers = Vec::with_capacity(count);
        for (descriptor, resource) in descriptors.iter().zip(&resources) {
            // On an error the buffers imported so far drop here and are released.
            buffers.push(resource.import_buffer(descriptor, stream)?);
        }
        Ok(buffers)
    }
}

/// This process's device with the UUID a peer named (its ordinal there is `sender_ordinal`).
///
/// # Errors
/// [`IpcError::DeviceNotVisible`] when this process does not see it; driver errors.
pub(crate) fn visible_device(uuid: Uuid, sender_ordinal: i32) -> Result<Device> {
    Device::with_uuid(*uuid.as_bytes())?.ok_or(IpcError::DeviceNotVisible { uuid, sender_ordinal })
}

fn expect_no_fds(message: &RawMessage) -> Result<()> {
    if message.fds.is_empty() {
        Ok(())
    } else {
        Err(IpcError::Protocol(format!("{} unexpected file descriptors with a message", message.fds.len())))
    }
}
