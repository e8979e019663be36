//! Device enumeration and properties.

use std::ffi::c_char;

use cuda_mem_sys::types::{CUdevice_attribute, CUuuid};

use crate::device::{
    attribute as device_attribute, check_known, check_ordinal, check_physical, name as device_name, uuid,
};
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

/// `cuDeviceGetUuid_v2`, and CUDA 9.2's `cuDeviceGetUuid` (same arguments): the physical
/// device's UUID, the same in every process whatever its ordinal there. The two differ only for a
/// MIG instance (`_v2` gives the instance's own UUID), which the simulator does not have.
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

/// The room `cuDeviceGetPCIBusId` needs: `cuda.h` asks for 13 characters, NUL included
/// (`dddd:bb:dd.f`).
const PCI_BUS_ID_LEN: usize = 13;

/// `cuDeviceGetPCIBusId`: `domain:bus:device.function` in hexadecimal (`0000:01:00.0`), the same
/// numbers `cuDeviceGetAttribute` reports as `PCI_DOMAIN_ID`, `PCI_BUS_ID` and `PCI_DEVICE_ID`
/// for the physical device. Room for fewer than 13 characters (`cuda.h`: "should be large enough
/// to store 13 characters including the NULL-terminator"), a negative length or a null buffer is
/// `CUDA_ERROR_INVALID_VALUE`: the string is never cut short.
///
/// # Safety
/// `out` is null or valid for `len` bytes of writes.
pub(crate) unsafe fn pci_bus_id(out: *mut c_char, len: i32, device: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_physical(&state.config, device)?;
    ensure(!out.is_null() && usize::try_from(len).is_ok_and(|len| len >= PCI_BUS_ID_LEN))?;
    let text = bus_id_text(device)?;
    // SAFETY: `out` has room for at least 13 bytes and the text is 12 plus its NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), out, text.len());
        out.add(text.len()).write(0);
    }
    Ok(())
}

/// The bus id of physical device `physical`, from its PCI attributes.
fn bus_id_text(physical: usize) -> SimResult<String> {
    let read = |attribute| device_attribute(physical, attribute);
    let domain = read(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = read(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let slot = read(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Ok(format!("{domain:04x}:{bus:02x}:{slot:02x}.0"))
}

/// Reads a PCI bus id in one of the forms `cuda.h` lists (`domain:bus:device.function`,
/// `domain:bus:device`, `bus:device.function`; hexadecimal, either case) as
/// `(domain, bus, device, function)`; `None` for anything else.
fn parse_bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let hex = |part: &str| {
        (!part.is_empty() && part.len() <= 8 && part.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(part, 16).ok())
            .flatten()
    };
    let parts: Vec<&str> = text.split(':').collect();
    let (domain, bus, rest) = match parts.as_slice() {
        [domain, bus, rest] => (hex(domain)?, hex(bus)?, *rest),
        [bus, rest] if rest.contains('.') => (0, hex(bus)?, *rest),
        _ => return None,
    };
    let (device, function) = match rest.split_once('.') {
        Some((device, function)) => (hex(device)?, hex(function)?),
        None => (hex(rest)?, 0),
    };
    Some((domain, bus, device, function))
}

/// `cuDeviceGetByPCIBusId`: the visible device whose bus id matches (function 0: each simulated
/// GPU is function 0 of its slot). A null or malformed string is `CUDA_ERROR_INVALID_VALUE`; a
/// well-formed one that names no device this process sees is `CUDA_ERROR_INVALID_DEVICE`.
///
/// # Safety
/// `out` is null or valid for a write; `text` is null or a NUL-terminated string.
pub(crate) unsafe fn by_pci_bus_id(out: *mut i32, text: *const c_char) -> SimResult {
    ensure(!out.is_null() && !text.is_null())?;
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { std::ffi::CStr::from_ptr(text) };
    let wanted =
        text.to_str().ok().and_then(parse_bus_id).ok_or(cuda_mem_sys::types::CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let state = state::lock()?;
    let found = (0..state.config.devices()).find(|&ordinal| {
        state.config.physical(ordinal).and_then(|physical| bus_id_text(physical).ok()).and_then(|t| parse_bus_id(&t))
            == Some(wanted)
    });
    let ordinal = found.ok_or(cuda_mem_sys::types::CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, ordinal as i32) }
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

/// `cuDeviceGetAttribute` (of the physical device: its PCI bus id is the physical one). An
/// attribute newer than the driver the simulator pretends to be (`CUDA_SIM_DRIVER_VERSION`) is
/// `CUDA_ERROR_INVALID_VALUE`, as that driver answers an attribute it does not know, even where
/// `CUDA_SIM_DEVICE_ATTRIBUTES` would report a value for it.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_attribute(out: *mut i32, attribute: CUdevice_attribute, device: i32) -> SimResult {
    let state = state::lock()?;
    let device = check_physical(&state.config, device)?;
    check_known(attribute, super::init::reported_version()?)?;
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
