//! How the wire names a device, and which device of this process a peer's name means: by UUID,
//! the one name two processes share (ordinals differ with `CUDA_VISIBLE_DEVICES`).

use cuda_mem_core::Device;
use uuid::Uuid;

use crate::error::{IpcError, Result};
use crate::wire::WireDevice;

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
