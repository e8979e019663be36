//! The virtual memory management API: reservations, physical allocations, mappings, access,
//! and sharing physical allocations by file descriptor or fabric handle.

use std::ffi::{c_int, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::sync::Arc;

use cuda_mem_sys::types::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationHandleType,
    CUmemAllocationProp, CUmemAllocationType, CUmemFabricHandle, CUmemGenericAllocationHandle, CUmemLocation,
    CUmemLocationType, CUresult,
};

use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::pool::Location;
use crate::state::{self, PhysicalEntry, State};
use crate::vmm::{GRANULARITY, Physical};

const POSIX_FD: u32 = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
const FABRIC: u32 = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
/// Host pages, the unit of reservation sizes.
const PAGE: u64 = 4096;

fn granular(value: u64) -> bool {
    value.is_multiple_of(GRANULARITY)
}

/// Checks allocation properties: pinned memory on a device, the host or host NUMA node 0;
/// POSIX-fd and fabric handles only, and none for host memory (`cuda.h`: "HOST allocations are
/// not IPC capable and ::CUmemAllocationProp::requestedHandleTypes must be 0, any other value will
/// result in ::CUDA_ERROR_INVALID_VALUE"; `cuMemGetAllocationGranularity` refuses them too, see
/// `conservative`); no compression, RDMA or usage flags (the simulated devices support none);
/// zero reserved bytes.
fn check_props(state: &State, prop: &CUmemAllocationProp) -> SimResult<(Location, u32)> {
    ensure(prop.type_ == CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED)?;
    let location = match prop.location.type_ {
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => Location::Device(
            check_ordinal(&state.config, prop.location.id).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
        ),
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST => Location::Host,
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA if prop.location.id == 0 => Location::HostNuma(0),
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let types = prop.requestedHandleTypes.0;
    if location == Location::Host {
        ensure(types == 0)?;
    }
    if types & !(POSIX_FD | FABRIC) != 0 {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let flags = &prop.allocFlags;
    ensure(flags.reserved.iter().all(|&b| b == 0))?;
    if flags.compressionType != 0 || flags.gpuDirectRDMACapable != 0 || flags.usage != 0 {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok((location, types))
}

/// `cuMemAddressReserve`: `size` a positive multiple of the host page, `alignment` zero (the
/// granularity) or a power of two, `flags` zero. A free range at the `addr` hint is taken.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn reserve(
    out: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    hint: CUdeviceptr,
    flags: u64,
) -> SimResult {
    let size = size as u64;
    ensure(!out.is_null() && flags == 0 && size > 0 && size.is_multiple_of(PAGE))?;
    ensure(alignment == 0 || alignment.is_power_of_two())?;
    ensure(hint.is_multiple_of(PAGE))?;
    let align = (alignment as u64).max(GRANULARITY);
    let mut state = state::lock()?;
    // A hint the setting refuses is ignored, as the driver may ignore any (see `conservative`).
    let refused = hint != 0 && {
        state.address_hints_seen += 1;
        state.config.address_hints.refuses(state.address_hints_seen)
    };
    let base = state.memory.reserve(size, align, hint, refused)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, base) }
}

/// `cuMemAddressFree`: the exact range of one reservation, with nothing mapped in it.
pub(crate) fn address_free(ptr: CUdeviceptr, size: usize) -> SimResult {
    state::lock()?.memory.free_reservation(ptr, size as u64)
}

/// `cuMemCreate`: `size` a positive multiple of the granularity, `flags` zero.
///
/// # Safety
/// `out` is null or valid for a write; `prop` is null or valid for a read.
pub(crate) unsafe fn create(
    out: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> SimResult {
    ensure(!out.is_null() && !prop.is_null() && flags == 0)?;
    let size = size as u64;
    ensure(size > 0 && granular(size))?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let prop = unsafe { prop.read_unaligned() };
    let mut state = state::lock()?;
    let (location, handle_types) = check_props(&state, &prop)?;
    // Fabric-shareable memory needs an IMEX channel, which the device attribute does not tell
    // (see `conservative`).
    if handle_types & FABRIC != 0 && state.config.imex_channel.is_none() {
        return fail(CUresult::CUDA_ERROR_NOT_PERMITTED);
    }
    if let Location::Device(device) = location {
        let memory = state.config.memory;
        let used = &mut state.devices[device].used;
        if used.saturating_add(size) > memory {
            return fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        *used += size;
    }
    let physical = match Physical::create(size, location, handle_types, &state.config) {
        Ok(physical) => Arc::new(physical),
        Err(code) => {
            if let Location::Device(device) = location {
                state.devices[device].used -= size;
            }
            return fail(code);
        }
    };
    let handle = physical.handle;
    state.physicals.insert(handle, PhysicalEntry { physical, user_refs: 1, maps: 0, imported: false });
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle) }
}

/// Drops the entry of a physical allocation nothing refers to any more, returning its memory.
fn collect(state: &mut State, handle: u64) {
    let done = state.physicals.get(&handle).is_some_and(|e| e.user_refs == 0 && e.maps == 0);
    if !done {
        return;
    }
    if let Some(entry) = state.physicals.remove(&handle)
        && let (Location::Device(device), false) = (entry.physical.location, entry.imported)
    {
        let used = &mut state.devices[device].used;
        *used = used.saturating_sub(entry.physical.size);
    }
}

/// `cuMemRelease`: a handle released while mapped stays alive until unmapped; releasing a handle
/// with no reference left is `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn release(handle: CUmemGenericAllocationHandle) -> SimResult {
    let mut state = state::lock()?;
    let entry =
        state.physicals.get_mut(&handle).filter(|e| e.user_refs > 0).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    entry.user_refs -= 1;
    collect(&mut state, handle);
    Ok(())
}

/// `cuMemMap`: `offset` must be 0 (as cuda.h says) and `flags` 0; `ptr` and `size` multiples of
/// the granularity; the range inside one reservation, not yet mapped; the handle live.
pub(crate) fn map(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: u64,
) -> SimResult {
    let size = size as u64;
    ensure(offset == 0 && flags == 0 && size > 0 && granular(ptr) && granular(size))?;
    let mut state = state::lock()?;
    let entry = state.physicals.get(&handle).filter(|e| e.user_refs > 0).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(size <= entry.physical.size)?;
    let physical = Arc::clone(&entry.physical);
    state.memory.map(ptr, size, physical)?;
    if let Some(entry) = state.physicals.get_mut(&handle) {
        entry.maps += 1;
    }
    Ok(())
}

/// `cuMemUnmap`: whole mappings only (not synchronized with streams, as in the driver).
pub(crate) fn unmap(ptr: CUdeviceptr, size: usize) -> SimResult {
    ensure(granular(ptr) && granular(size as u64) && size > 0)?;
    let mut state = state::lock()?;
    let removed = state.memory.unmap(ptr, size as u64)?;
    for range in removed {
        let handle = range.physical.handle;
        if let Some(entry) = state.physicals.get_mut(&handle) {
            entry.maps -= 1;
        }
        collect(&mut state, handle);
    }
    Ok(())
}

/// `cuMemSetAccess`: `ptr` and `size` multiples of the granularity, the range mapped throughout
/// and made of whole mappings (`cuda.h`: "a fully mapped address range containing all
/// allocations"; see `conservative`), else `CUDA_ERROR_INVALID_VALUE`. Device locations take
/// read-write, read or none (a device that cannot reach the memory's device cannot be given
/// access: `CUDA_ERROR_INVALID_DEVICE`); a host location is accepted for host memory, a host NUMA
/// one only for host-NUMA memory (`cuda.h`: "Users cannot specify ::CU_MEM_LOCATION_TYPE_HOST_NUMA
/// accessibility for allocations created on with other location types").
///
/// # Safety
/// `descs` is null or valid for `count` reads.
pub(crate) unsafe fn set_access(
    ptr: CUdeviceptr,
    size: usize,
    descs: *const CUmemAccessDesc,
    count: usize,
) -> SimResult {
    let size = size as u64;
    ensure(!descs.is_null() && count > 0 && size > 0 && granular(ptr) && granular(size))?;
    // SAFETY: valid for `count` reads by the caller's contract.
    let descs = unsafe { std::slice::from_raw_parts(descs, count) };
    let mut state = state::lock()?;
    let mappings = state.memory.mapped_cover(ptr, size).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // Whole mappings only: access is kept per mapping, and a grant must not reach past the range.
    let whole = mappings.first().is_some_and(|&(start, _)| start == ptr)
        && mappings.last().is_some_and(|&(start, range)| start + range.size == ptr + size);
    ensure(whole)?;
    let cover: Vec<(u64, Location)> =
        mappings.into_iter().map(|(start, range)| (start, range.physical.location)).collect();
    let mut changes = Vec::new();
    for desc in descs {
        ensure(matches!(desc.flags.0, 0 | 1 | 3))?;
        match desc.location.type_ {
            CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => {
                let device = check_ordinal(&state.config, desc.location.id)?;
                for (_, location) in &cover {
                    if let Location::Device(owner) = location
                        && *owner != device
                        && desc.flags.0 != 0
                        && !state.config.can_access(device, *owner)
                    {
                        return fail(CUresult::CUDA_ERROR_INVALID_DEVICE);
                    }
                }
                changes.push((device, desc.flags));
            }
            CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST => {
                ensure(cover.iter().all(|(_, l)| !matches!(l, Location::Device(_))))?;
            }
            CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA => {
                ensure(cover.iter().all(|(_, l)| matches!(l, Location::HostNuma(_))))?;
            }
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    for (start, _) in cover {
        if let Some(range) = state.memory.mapped.get_mut(&start) {
            for &(device, flags) in &changes {
                if flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE {
                    range.access.remove(&device);
                } else {
                    range.access.insert(device, flags);
                }
            }
        }
    }
    Ok(())
}

/// `cuMemGetAccess`.
///
/// # Safety
/// `out` is null or valid for a write; `location` is null or valid for a read.
pub(crate) unsafe fn get_access(out: *mut u64, location: *const CUmemLocation, ptr: CUdeviceptr) -> SimResult {
    ensure(!out.is_null() && !location.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let location = unsafe { location.read_unaligned() };
    let state = state::lock()?;
    let cover = state.memory.mapped_cover(ptr, 1).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE)?;
    let device = check_ordinal(&state.config, location.id)?;
    let flags = cover[0].1.access.get(&device).map_or(0, |f| u64::from(f.0));
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, flags) }
}

/// Checks that `device` has the access a copy or memset needs to VMM memory at
/// `[address, address + len)` (nothing to check for other memory).
pub(crate) fn check_access(state: &State, address: u64, len: usize, device: usize, write: bool) -> SimResult {
    let Some(cover) = state.memory.mapped_cover(address, len as u64) else { return Ok(()) };
    let allowed = cover.iter().all(|(_, range)| match range.access.get(&device) {
        Some(&CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE) => true,
        Some(&CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ) => !write,
        _ => false,
    });
    ensure(allowed)
}

/// `cuMemGetAllocationGranularity`: 2 MiB, minimum and recommended, on every simulated device.
///
/// # Safety
/// `out` is null or valid for a write; `prop` is null or valid for a read.
pub(crate) unsafe fn granularity(
    out: *mut usize,
    prop: *const CUmemAllocationProp,
    option: CUmemAllocationGranularity_flags,
) -> SimResult {
    ensure(!out.is_null() && !prop.is_null() && option.0 <= 1)?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let prop = unsafe { prop.read_unaligned() };
    check_props(&*state::lock()?, &prop)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, GRANULARITY as usize) }
}

/// `cuMemRetainAllocationHandle`: the handle of the allocation mapped at `addr`, with one more
/// reference the caller must release.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn retain(out: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> SimResult {
    ensure(!out.is_null())?;
    let mut state = state::lock()?;
    let handle =
        state.memory.mapped_cover(addr as u64, 1).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?[0].1.physical.handle;
    let entry = state.physicals.get_mut(&handle).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    entry.user_refs += 1;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle) }
}

/// `cuMemGetAllocationPropertiesFromHandle`: a device location is this process's ordinal, for
/// imported allocations too (translated from the physical index when imported).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn properties(out: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) -> SimResult {
    ensure(!out.is_null())?;
    let state = state::lock()?;
    let entry = state.physicals.get(&handle).filter(|e| e.user_refs > 0).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let physical = &entry.physical;
    let (type_, id) = match physical.location {
        Location::Device(d) => (CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, d as i32),
        Location::HostNuma(n) => (CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, n),
        Location::Host | Location::Unspecified => (CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0),
    };
    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType(physical.handle_types),
        location: CUmemLocation { type_, id },
        ..CUmemAllocationProp::default()
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, prop) }
}

/// `cuMemExportToShareableHandle`: a POSIX file descriptor (written as an `int`, owned by the
/// caller) or a fabric handle (64 bytes), of a type the allocation was created with.
///
/// # Safety
/// `out` is null or valid for a write of the handle type's value.
pub(crate) unsafe fn export(
    out: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: CUmemAllocationHandleType,
    flags: u64,
) -> SimResult {
    ensure(!out.is_null() && flags == 0)?;
    let state = state::lock()?;
    let entry = state.physicals.get(&handle).filter(|e| e.user_refs > 0).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(matches!(handle_type.0, POSIX_FD | FABRIC) && entry.physical.handle_types & handle_type.0 != 0)?;
    if handle_type.0 == FABRIC {
        // Memory made for fabric handles exists only where the process has a channel.
        let channel = state.config.imex_channel.ok_or(CUresult::CUDA_ERROR_NOT_PERMITTED)?;
        let data = entry.physical.fabric_handle(channel);
        // SAFETY: forwarded from the caller.
        return unsafe { write_out(out.cast::<CUmemFabricHandle>(), CUmemFabricHandle { data }) };
    }
    let fd = entry.physical.duplicate()?.into_raw_fd();
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out.cast::<c_int>(), fd) }
}

/// `cuMemImportFromShareableHandle`: `os_handle` is the descriptor (cast to a pointer) or a
/// pointer to a fabric handle. The allocation's header names its device by physical index, which
/// becomes this process's ordinal for it (what `cuMemGetAllocationPropertiesFromHandle` and
/// `cuMemSetAccess` then see). Anything that is not an exported allocation, or one on a device
/// this process does not see (`CUDA_VISIBLE_DEVICES`), is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` is null or valid for a write; for fabric handles, `os_handle` is valid for 64 bytes.
pub(crate) unsafe fn import(
    out: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: CUmemAllocationHandleType,
) -> SimResult {
    ensure(!out.is_null())?;
    let mut state = state::lock()?;
    let physical = match handle_type.0 {
        POSIX_FD => {
            let raw = c_int::try_from(os_handle as isize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
            ensure(raw >= 0)?;
            // SAFETY: the descriptor is only duplicated, which fails cleanly if it is not open.
            Physical::open(unsafe { BorrowedFd::borrow_raw(raw) }, &state.config)?
        }
        FABRIC => {
            ensure(!os_handle.is_null())?;
            // SAFETY: a fabric handle is 64 readable bytes by the caller's contract.
            let data = unsafe { os_handle.cast::<CUmemFabricHandle>().read_unaligned() }.data;
            Physical::open_fabric(&data, &state.config)?
        }
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let handle = physical.handle;
    state
        .physicals
        .insert(handle, PhysicalEntry { physical: Arc::new(physical), user_refs: 1, maps: 0, imported: true });
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle) }
}
