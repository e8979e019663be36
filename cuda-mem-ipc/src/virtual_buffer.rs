//! Virtual buffers between processes (feature `vmm`): exporting one as a
//! [`SharedVirtualBuffer`] and finding where a received one lives, and the resources a channel
//! imports them with. The [`IpcChannel`](crate::IpcChannel) methods that send and register them
//! are beside the channel's others.
//!
//! The encoding is [`crate::wire`]'s; the driver calls are `cuda-mem-vmm`'s.

use std::sync::{Arc, Mutex, PoisonError};

use cuda_mem_core::{Location, Stream};
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource, VmmError};

use crate::assembly::RawMessage;
use crate::device_naming::{visible_device, wire_device};
use crate::error::{IpcError, Result};
use crate::wire::{SharedVirtualBuffer, WireLocation};

impl SharedVirtualBuffer {
    /// Exports `buffer` ([`VirtualBuffer::export`]: one handle per chunk, file descriptors
    /// owned here) with where its memory lives.
    ///
    /// # Errors
    /// - [`IpcError::Vmm`]: the export failed (an imported buffer, a resource without an
    ///   exportable handle type, too many chunks, a chunk the driver did not export).
    /// - [`IpcError::Core`]: reading the device's UUID failed.
    pub fn export(buffer: &VirtualBuffer) -> Result<SharedVirtualBuffer> {
        let descriptor = buffer.export()?;
        let resource = buffer.resource();
        let location = match resource.location() {
            Location::Device(device) => WireLocation::Device(wire_device(device)?),
            Location::HostNuma(node) => WireLocation::HostNuma(node),
            // Plain host memory cannot carry an exportable handle type (the resource refuses the
            // options), so its export failed above; no other location exports.
            _ => return Err(VmmError::NotExportable.into()),
        };
        Ok(SharedVirtualBuffer { location, descriptor })
    }

    /// Where the memory lives, in this process: the device with the UUID the sender named (asked
    /// of the driver), or the host NUMA node.
    ///
    /// # Errors
    /// - [`IpcError::DeviceNotVisible`]: this process does not see the device.
    /// - [`IpcError::Core`]: the driver failed to list the devices.
    pub fn location(&self) -> Result<Location> {
        Ok(match self.location {
            WireLocation::Device(device) => Location::Device(visible_device(device)?),
            WireLocation::HostNuma(node) => Location::HostNuma(node),
        })
    }
}

/// The resources a channel imports virtual buffers with, one per location.
#[derive(Debug, Default)]
pub(crate) struct VirtualBufferImporters(Mutex<Vec<Arc<VirtualMemoryResource>>>);

impl VirtualBufferImporters {
    fn resources(&self) -> std::sync::MutexGuard<'_, Vec<Arc<VirtualMemoryResource>>> {
        // Every operation leaves the list consistent, so a panic elsewhere cannot corrupt it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `resource` for its location; returns the one it replaces.
    pub(crate) fn register(&self, resource: Arc<VirtualMemoryResource>) -> Option<Arc<VirtualMemoryResource>> {
        let mut resources = self.resources();
        let location = resource.location();
        match resources.iter_mut().find(|r| r.location() == location) {
            Some(registered) => Some(std::mem::replace(registered, resource)),
            None => {
                resources.push(resource);
                None
            }
        }
    }

    /// The resource registered for `location`.
    fn find(&self, location: Location) -> Option<Arc<VirtualMemoryResource>> {
        self.resources().iter().find(|r| r.location() == location).cloned()
    }

    /// Receives a message of kind [`MessageKind::VirtualBuffer`](crate::wire::MessageKind::VirtualBuffer): decodes it (owning its file descriptors,
    /// closed on any error), finds where its memory lives and the resource registered for that,
    /// and imports it.
    pub(crate) fn receive(&self, message: RawMessage, stream: &Stream) -> Result<VirtualBuffer> {
        let RawMessage { payload, fds, .. } = message;
        let shared = SharedVirtualBuffer::decode(&payload, fds)?;
        let location = shared.location()?;
        let resource = self.find(location).ok_or(IpcError::NoVirtualMemoryResource { location })?;
        Ok(resource.import(shared.descriptor, stream)?)
    }
}
