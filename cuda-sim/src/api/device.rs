//! Device enumeration and properties.

use std::ffi::c_char;

use cuda_sys::types::{CUdevice_attribute, CUuuid};

use crate::device::{attribute as device_attribute, check_ordinal, check_physical, name as device_name, uuid};
use crate::error::{SimResult, ensure, write_out};
use crate::state;

/// `cuDeviceGet`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get(out: *mut i32, ordinal: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_ordinal(&state.config, ordinal)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, device as i32) }
}

/// `cuDeviceGetCount`: the devices `CUDA_VISIBLE_DEVICES` leaves visible.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn count(out: *mut i32) -> SimResult {
    let devices = state::lock()?.config.devices();
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, devices as i32) }
}

/// `cuDeviceGetName`: the physical device's name; writes at most `len` bytes, NUL included.
///
/// # Safety
/// `out` is null or valid for `len` bytes of writes.
pub(crate) unsafe fn name(out: *mut c_char, len: i32, device: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_physical(&state.config, device)?;
    ensure(!out.is_null() && len > 0)?;
    let name = device_name(device);
    let n = name.len().min(len as usize - 1);
    // SAFETY: `out` has room for `len` bytes and `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), out, n);
        out.add(n).write(0);
    }
    Ok(())
}

/// `cuDeviceGetUuid_v2`: the physical device's UUID, the same in every process whatever its
/// ordinal there.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_uuid(out: *mut CUuuid, device: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_physical(&state.config, device)?;
    let bytes = uuid(device).map(|b| b as c_char);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, CUuuid { bytes }) }
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn total_mem(out: *mut usize, device: i32) -> SimResult {
    let state = state::lock()?;
    check_ordinal(&state.config, device)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, state.config.memory as usize) }
}

/// `cuDeviceGetAttribute` (of the physical device: its PCI bus id is the physical one).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_attribute(out: *mut i32, attribute: CUdevice_attribute, device: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_physical(&state.config, device)?;
    let value = device_attribute(device, attribute)?;
    let value = state.config.attribute_override(attribute.0).unwrap_or(value);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, value) }
}

/// `cuDeviceCanAccessPeer`: 1 when the configured topology lets `device` access `peer` (the
/// topology links physical devices; [`Config::can_access`](crate::config::Config::can_access)
/// translates the ordinals).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn can_access_peer(out: *mut i32, device: i32, peer: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    let peer = check_ordinal(&state.config, peer)?;
    let can = i32::from(state.config.can_access(device, peer));
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, can) }
}
