//! Memory pools (`cuMemPool*`, `cuMemAllocAsync`, `cuMemFreeAsync`), managed memory and host
//! registration.

use std::ffi::c_void;
use std::os::fd::AsFd;
use std::sync::Arc;

use cuda_mem_sys::types::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation,
    CUmemLocationType, CUmemPool_attribute, CUmemPoolProps, CUmemoryPool, CUresult, CUstream,
};

use super::DefaultStream;
use super::stream::{resolve, resolve_for_work};
use crate::capture;
use crate::config::Config;
use crate::context::{self as ctx, Context};
use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::graph::{GraphAlloc, Node};
use crate::memory::Kind;
use crate::pool::{FreedOn, Location, Pool, PoolKind, PoolState};
use crate::shared::SharedArena;
use crate::state::{self, State};
use crate::stream::Stream;

/// `CU_MEM_ATTACH_GLOBAL` and `CU_MEM_ATTACH_HOST`.
const ATTACH_GLOBAL: u32 = 0x1;
const ATTACH_HOST: u32 = 0x2;
/// Every `cuMemHostRegister` flag (portable, device map, I/O memory, read-only).
const HOST_REGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8;

fn as_handle(pool: CUmemoryPool) -> usize {
    pool as usize
}

fn as_pool(handle: usize) -> CUmemoryPool {
    handle as CUmemoryPool
}

/// A live pool; an unknown or destroyed handle is `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn find(state: &State, pool: CUmemoryPool) -> SimResult<Arc<Pool>> {
    match state.pools.get(&as_handle(pool)) {
        Some(pool) if !pool.is_destroyed() => Ok(Arc::clone(pool)),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Reads a `CUmemLocation` for a pool of `kind`.
fn location(config: &Config, location: &CUmemLocation, kind: PoolKind) -> SimResult<Location> {
    match location.type_ {
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => {
            check_ordinal(config, location.id).map(Location::Device).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
        }
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST => Ok(Location::Host),
        // The simulated host has one NUMA node, 0.
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA if location.id == 0 => Ok(Location::HostNuma(0)),
        CUmemLocationType::CU_MEM_LOCATION_TYPE_NONE if kind == PoolKind::Managed => Ok(Location::Unspecified),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn pool_kind(allocation_type: CUmemAllocationType) -> SimResult<PoolKind> {
    match allocation_type {
        CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED => Ok(PoolKind::Pinned),
        CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED => Ok(PoolKind::Managed),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemPoolCreate`. Reserved bytes must be zero; a host pool takes no handle type (`cuda.h`:
/// "Pools created with the type ::CU_MEM_LOCATION_TYPE_HOST are not IPC capable and
/// ::CUmemPoolProps::handleTypes must be 0, any other values will result in
/// ::CUDA_ERROR_INVALID_VALUE"); POSIX-fd handles need a device or host-NUMA location and pinned
/// memory (a managed pool with one is not supported, which `cuda.h` does not address); other
/// handle types and usage flags are not supported.
///
/// # Safety
/// `out` is null or valid for a write; `props` is null or valid for a read.
pub(crate) unsafe fn create(out: *mut CUmemoryPool, props: *const CUmemPoolProps) -> SimResult {
    capture::refuse_unsafe()?;
    ensure(!out.is_null() && !props.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let props = unsafe { props.read_unaligned() };
    ensure(props.reserved.iter().all(|&b| b == 0))?;
    let mut state = state::lock()?;
    let kind = pool_kind(props.allocType)?;
    let location = location(&state.config, &props.location, kind)?;
    let handle_types = props.handleTypes.0;
    if location == Location::Host {
        ensure(handle_types == 0)?;
    }
    let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
    if handle_types & !posix != 0 || props.usage != 0 {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    if handle_types != 0 && (kind == PoolKind::Managed || location == Location::Unspecified) {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let shared = if handle_types != 0 {
        let capacity = if props.maxSize > 0 { props.maxSize as u64 } else { state.config.memory };
        Some(SharedArena::create(location, kind, capacity, &state.config)?)
    } else {
        None
    };
    let mut pool = Pool::with_shared(location, kind, handle_types, props.maxSize as u64, false, shared);
    if let Location::Device(device) = location
        && let Some((handle, access)) = state.recyclable_pools.get_mut(&device).and_then(Vec::pop)
    {
        pool.handle = handle;
        pool.lock().access = access;
    }
    let pool = Arc::new(pool);
    let handle = pool.handle;
    state.pools.insert(handle, pool);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_pool(handle)) }
}

/// `cuMemPoolDestroy`: default pools cannot be destroyed. Allocations still live keep their
/// memory until freed; the handle is invalid at once. A device's current pool reverts to its
/// default.
pub(crate) fn destroy(pool: CUmemoryPool) -> SimResult {
    let mut state = state::lock()?;
    let pool = find(&state, pool)?;
    ensure(!pool.is_default)?;
    pool.mark_destroyed();
    if let Some(device) = pool.owner() {
        if state.current_pool[device] == pool.handle {
            state.current_pool[device] = state.default_pool[device];
        }
        let released = pool.lock().release_to(0);
        let used = &mut state.devices[device].used;
        *used = used.saturating_sub(released);
    }
    // A location's current pool reverts to its default (which cannot be destroyed).
    state.other_current_pools.retain(|_, handle| *handle != pool.handle);
    forget_if_destroyed(&mut state, pool.handle);
    Ok(())
}

/// `cuDeviceGetDefaultMemPool` and `cuDeviceGetMemPool`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn device_pool(out: *mut CUmemoryPool, device: i32, current: bool) -> SimResult {
    let state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    let handle = if current { state.current_pool[device] } else { state.default_pool[device] };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_pool(handle)) }
}

/// `cuDeviceSetMemPool`: the pool must be a pinned pool located on that device.
pub(crate) fn set_device_pool(device: i32, pool: CUmemoryPool) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    let pool = find(&state, pool)?;
    ensure(pool.location == Location::Device(device) && pool.kind == PoolKind::Pinned && !pool.is_imported())?;
    state.current_pool[device] = pool.handle;
    Ok(())
}

/// Reads the location and allocation type of `cuMemGetDefaultMemPool`, `cuMemGetMemPool` and
/// `cuMemSetMemPool` (`CUDA_ERROR_INVALID_VALUE` for any other combination).
///
/// # Safety
/// `location` is null or valid for a read.
unsafe fn location_and_kind(
    state: &State,
    location: *const CUmemLocation,
    kind: CUmemAllocationType,
) -> SimResult<(Location, PoolKind)> {
    ensure(!location.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let location = unsafe { location.read_unaligned() };
    let kind = pool_kind(kind)?;
    Ok((self::location(&state.config, &location, kind)?, kind))
}

/// The default pool of a location and kind: a device's own for pinned memory on a device, else
/// one created on first use.
fn default_pool_of(state: &mut State, location: Location, kind: PoolKind) -> usize {
    if let (Location::Device(device), PoolKind::Pinned) = (location, kind) {
        return state.default_pool[device];
    }
    let key = (location.key(), kind == PoolKind::Managed);
    if let Some(&handle) = state.other_pools.get(&key) {
        return handle;
    }
    let pool = Arc::new(Pool::new(location, kind, 0, 0, true));
    let handle = pool.handle;
    state.pools.insert(handle, pool);
    state.other_pools.insert(key, handle);
    handle
}

/// `cuMemGetDefaultMemPool` (CUDA 13): the default pool for a location and allocation type
/// (a device ordinal the process does not have is `CUDA_ERROR_INVALID_DEVICE`, which `cuda.h`
/// lists for this call alone).
///
/// # Safety
/// `out` is null or valid for a write; `location` is null or valid for a read.
pub(crate) unsafe fn default_mem_pool(
    out: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: CUmemAllocationType,
) -> SimResult {
    ensure(!out.is_null() && !location.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let raw = unsafe { location.read_unaligned() };
    let mut state = state::lock()?;
    if raw.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE {
        check_ordinal(&state.config, raw.id)?;
    }
    // SAFETY: forwarded from the caller.
    let (location, kind) = unsafe { location_and_kind(&state, location, kind) }?;
    let handle = default_pool_of(&mut state, location, kind);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_pool(handle)) }
}

/// `cuMemGetMemPool` (CUDA 13): the current pool for a location and allocation type, the one
/// last set (`cuMemSetMemPool`, or `cuDeviceSetMemPool` for pinned memory on a device), else
/// the default one.
///
/// # Safety
/// `out` is null or valid for a write; `location` is null or valid for a read.
pub(crate) unsafe fn current_pool(
    out: *mut CUmemoryPool,
    location: *mut CUmemLocation,
    kind: CUmemAllocationType,
) -> SimResult {
    ensure(!out.is_null())?;
    let mut state = state::lock()?;
    // SAFETY: forwarded from the caller.
    let (location, kind) = unsafe { location_and_kind(&state, location, kind) }?;
    let handle = match (location, kind) {
        (Location::Device(device), PoolKind::Pinned) => state.current_pool[device],
        _ => match state.other_current_pools.get(&(location.key(), kind == PoolKind::Managed)) {
            Some(&handle) => handle,
            None => default_pool_of(&mut state, location, kind),
        },
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, as_pool(handle)) }
}

/// `cuMemSetMemPool` (CUDA 13): makes `pool` the current pool of a location and allocation
/// type, which must be the pool's own (`CUDA_ERROR_INVALID_VALUE` otherwise, as for a pool
/// imported from another process, which allocates nothing). Pinned memory on a device is
/// `cuDeviceSetMemPool`.
///
/// # Safety
/// `location` is null or valid for a read.
pub(crate) unsafe fn set_mem_pool(
    location: *mut CUmemLocation,
    kind: CUmemAllocationType,
    pool: CUmemoryPool,
) -> SimResult {
    let mut state = state::lock()?;
    // SAFETY: forwarded from the caller.
    let (location, kind) = unsafe { location_and_kind(&state, location, kind) }?;
    let pool = find(&state, pool)?;
    ensure(pool.location == location && pool.kind == kind && !pool.is_imported())?;
    match (location, kind) {
        (Location::Device(device), PoolKind::Pinned) => state.current_pool[device] = pool.handle,
        _ => {
            state.other_current_pools.insert((location.key(), kind == PoolKind::Managed), pool.handle);
        }
    }
    Ok(())
}

/// `cuMemPoolGetAttribute`: reuse flags are `int`, the rest `cuuint64_t`.
///
/// # Safety
/// `value` is null or valid for a write of the attribute's type.
pub(crate) unsafe fn get_attribute(
    pool: CUmemoryPool,
    attribute: CUmemPool_attribute,
    value: *mut c_void,
) -> SimResult {
    ensure(!value.is_null())?;
    let pool = find(&*state::lock()?, pool)?;
    let v = pool.lock().get(attribute)?;
    // SAFETY: forwarded from the caller.
    unsafe {
        if PoolState::is_int_attribute(attribute) {
            write_out(value.cast::<i32>(), v as i32)
        } else {
            write_out(value.cast::<u64>(), v)
        }
    }
}

/// `cuMemPoolSetAttribute`.
///
/// # Safety
/// `value` is null or valid for a read of the attribute's type.
pub(crate) unsafe fn set_attribute(
    pool: CUmemoryPool,
    attribute: CUmemPool_attribute,
    value: *mut c_void,
) -> SimResult {
    ensure(!value.is_null())?;
    let pool = find(&*state::lock()?, pool)?;
    // SAFETY: non-null and valid for a read of the attribute's type by the caller's contract.
    let v = unsafe {
        if PoolState::is_int_attribute(attribute) {
            u64::from(value.cast::<i32>().read_unaligned() != 0)
        } else {
            value.cast::<u64>().read_unaligned()
        }
    };
    pool.lock().set(attribute, v)
}

/// `cuMemPoolTrimTo`: releases reserved memory down to `keep` bytes, never below what is in use.
pub(crate) fn trim_to(pool: CUmemoryPool, keep: usize) -> SimResult {
    let mut state = state::lock()?;
    let pool = find(&state, pool)?;
    let released = pool.lock().release_to(keep as u64);
    if let Some(device) = pool.owner() {
        let used = &mut state.devices[device].used;
        *used = used.saturating_sub(released);
    }
    Ok(())
}

/// `cuMemPoolSetAccess`: every descriptor is checked before any is applied. Locations must be
/// devices; the owner cannot be given anything but read-write (`CUDA_ERROR_INVALID_DEVICE`, as
/// the driver answers); a device that cannot access the owner cannot be granted access
/// (`CUDA_ERROR_INVALID_DEVICE`).
///
/// # Safety
/// `descs` is null or valid for `count` reads.
pub(crate) unsafe fn set_access(pool: CUmemoryPool, descs: *const CUmemAccessDesc, count: usize) -> SimResult {
    ensure(!descs.is_null() && count > 0)?;
    // SAFETY: valid for `count` reads by the caller's contract.
    let descs = unsafe { std::slice::from_raw_parts(descs, count) };
    let state = state::lock()?;
    let pool = find(&state, pool)?;
    let mut changes = Vec::with_capacity(count);
    for desc in descs {
        ensure(desc.location.type_ == CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE)?;
        let device = check_ordinal(&state.config, desc.location.id)?;
        ensure(desc.flags.0 <= CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE.0 && desc.flags.0 != 2)?;
        let none = desc.flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        if let Some(owner) = pool.owner() {
            if owner == device && desc.flags != CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE {
                return fail(CUresult::CUDA_ERROR_INVALID_DEVICE);
            }
            if owner != device && !none && !state.config.can_access(device, owner) {
                return fail(CUresult::CUDA_ERROR_INVALID_DEVICE);
            }
        }
        changes.push((device, desc.flags));
    }
    let owner = pool.owner();
    let mut pool_state = pool.lock();
    for (device, flags) in changes {
        if Some(device) == owner {
            continue;
        }
        if flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE {
            pool_state.access.remove(&device);
        } else {
            pool_state.access.insert(device, flags);
        }
    }
    Ok(())
}

/// `cuMemPoolGetAccess`: for a device location, its access; for the host, read-write on host
/// pools and none on device pools.
///
/// # Safety
/// `flags` is null or valid for a write; `location` is null or valid for a read.
pub(crate) unsafe fn get_access(
    flags: *mut CUmemAccess_flags,
    pool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> SimResult {
    ensure(!flags.is_null() && !location.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let location = unsafe { location.read_unaligned() };
    let state = state::lock()?;
    let pool = find(&state, pool)?;
    let access = match location.type_ {
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => pool.access(check_ordinal(&state.config, location.id)?),
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST | CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA => {
            if pool.is_host_memory() {
                CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            } else {
                CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
            }
        }
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(flags, access) }
}

/// Allocates from `pool` in the order of `stream`. 0 bytes succeeds with a unique pointer that
/// addresses no bytes and must be freed as any other (see [`conservative`](crate::conservative));
/// past the pool's `maxSize` or the device's
/// memory, or a size whose accounting overflows, is `CUDA_ERROR_OUT_OF_MEMORY`. A failed
/// allocation leaves the pool and the device as they were, high-water marks included.
fn allocate(state: &mut State, pool: &Arc<Pool>, size: usize, stream: CUstream, mode: DefaultStream) -> SimResult<u64> {
    // "Imported memory pools do not support creating new allocations."
    ensure(!pool.is_imported())?;
    let (context, stream) = resolve_for_work(state, stream, mode)?;
    if stream.capture.is_under_way() {
        return capture_alloc_from_pool(state, &context, &stream, pool, size);
    }
    let bytes = u64::try_from(size).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    let growth = pool.lock().plan(bytes, pool.max_size)?;
    let owner = pool.owner();
    if let Some(device) = owner {
        let memory = state.config.memory;
        let used = &mut state.devices[device].used;
        *used = used
            .checked_add(growth.grown)
            .filter(|&total| total <= memory)
            .ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    }
    let kind = Kind::Pooled { pool: pool.handle, host: pool.is_host_memory() };
    let device = owner.unwrap_or(context.device);
    let result = match &pool.shared {
        // Takes nothing from a shared pool's file: there is nothing to share.
        _ if size == 0 => state.memory.alloc_empty(kind, device, context.handle),
        Some(shared) => shared.take(bytes).and_then(|offset| {
            let placed = state.memory.alloc_shared(size, kind, device, context.handle, shared.file.as_fd(), offset);
            if placed.is_err() {
                shared.give_back(offset, bytes);
            }
            placed
        }),
        None => state.memory.alloc(size, kind, device, context.handle),
    };
    match result {
        Ok(_) => pool.lock().commit(growth),
        Err(_) => {
            if let Some(device) = owner {
                state.devices[device].used -= growth.grown;
            }
        }
    }
    result
}

/// `cuMemAllocFromPoolAsync`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn alloc_from_pool(
    out: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    ensure(!out.is_null())?;
    let mut state = state::lock()?;
    let pool = find(&state, pool)?;
    let address = allocate(&mut state, &pool, size, stream, mode)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, address) }
}

/// `cuMemAllocAsync`: from the current pool of the stream's device.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn alloc_async(
    out: *mut CUdeviceptr,
    size: usize,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    ensure(!out.is_null())?;
    let mut state = state::lock()?;
    let (context, s) = resolve(&state, stream, mode)?;
    let address = if s.capture.is_under_way() {
        capture_alloc(&mut state, &context, &s, size)?
    } else {
        let pool = state.pools.get(&state.current_pool[s.device]).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        allocate(&mut state, &pool, size, stream, mode)?
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, address) }
}

/// `cuMemAllocFromPoolAsync` on a capturing stream: `cuda.h` says it "results in the creation of
/// an allocation node", owned by the graph, the pool's properties setting the node's. Those of
/// an allocation node must name a device and no shareable handle type ("IPC is not supported",
/// `CUDA_MEM_ALLOC_NODE_PARAMS`): a pool that does not fit is `CUDA_ERROR_NOT_SUPPORTED` (see
/// [`conservative`](crate::conservative)). The pool itself lends nothing: its usage is unchanged.
fn capture_alloc_from_pool(
    state: &mut State,
    context: &Context,
    stream: &Stream,
    pool: &Arc<Pool>,
    size: usize,
) -> SimResult<u64> {
    let device = match pool.owner() {
        Some(device) if pool.kind == PoolKind::Pinned && pool.handle_types == 0 => device,
        _ => return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED),
    };
    capture_alloc_on(state, context, stream, device, size)
}

/// `cuMemAllocAsync` on a capturing stream: an allocation node (see [`crate::graph`]). Its
/// address is live until the capture ends, so that the captured work can use it; launches map it
/// again. 0 bytes makes an allocation node too, with a unique address that addresses no bytes and
/// counts for no graph memory, as a zero-byte pool allocation outside a capture (see
/// [`conservative`](crate::conservative)).
fn capture_alloc(state: &mut State, context: &Context, stream: &Stream, size: usize) -> SimResult<u64> {
    capture_alloc_on(state, context, stream, stream.device, size)
}

/// An allocation node of `size` bytes on `device`, in `stream`'s capture.
fn capture_alloc_on(
    state: &mut State,
    context: &Context,
    stream: &Stream,
    device: usize,
    size: usize,
) -> SimResult<u64> {
    capture::admit_work(context, stream)?;
    // A zero-byte allocation gets a page nothing can reach (its size is 0), and address space of
    // its own, so that its address is unique.
    let backing = Arc::new(crate::memory::Mapping::read_write(size.max(1))?);
    let base = state.memory.reserve_graph(size.max(1))?;
    let memory = Arc::clone(&state.graph_memory[device]);
    let alloc = GraphAlloc::new(base, size, device, context.handle, backing, memory);
    state.memory.map_graph(&alloc);
    if stream.capture.record_node(Node::Alloc(alloc)).is_err() {
        // The capture ended meanwhile (on another thread).
        state.memory.unmap_graph(base);
        return fail(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    }
    Ok(base)
}

/// `cuMemFreeAsync` on a capturing stream: a free node, for an allocation node of the same
/// capture not freed yet (its address stops being live at once) or for another graph's live
/// allocation (unmapped when the graph is launched). Anything else is `CUDA_ERROR_INVALID_VALUE`
/// (`cuGraphAddMemFreeNode`: "an address that was not returned by an allocation node", or an
/// allocation freed twice).
fn capture_free(state: &mut State, stream: &Stream, address: CUdeviceptr) -> SimResult {
    let node = match stream.capture.own_alloc(address) {
        Some(alloc) => {
            ensure(alloc.mark_freed_in_graph())?;
            state.memory.unmap_graph(address);
            Node::Free { base: address, device: alloc.device, own: true }
        }
        None => {
            ensure(state.memory.is_graph_mapped(address))?;
            let allocation = state.memory.find(address).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            Node::Free { base: address, device: allocation.device, own: false }
        }
    };
    stream.capture.record_node(node).map_err(|_| CUresult::CUDA_ERROR_ILLEGAL_STATE)
}

/// `cuMemFreeAsync`: the pointer must start a live pool allocation (freeing it twice, or
/// freeing `cuMemAlloc` memory, is `CUDA_ERROR_INVALID_VALUE`). The pointer is invalid for new
/// calls at once; the pool's `used` drops when the stream reaches the free.
pub(crate) fn free_async(address: CUdeviceptr, stream: CUstream, mode: DefaultStream) -> SimResult {
    let mut state = state::lock()?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    if stream.capture.is_under_way() {
        return capture_free(&mut state, &stream, address);
    }
    let allocation = state.memory.free_if(address, |kind| matches!(kind, Kind::Pooled { .. } | Kind::Graph))?;
    if allocation.kind == Kind::Graph {
        // Graph memory: freed when the stream reaches the free (see `GraphMemory::freed`).
        let memory = Arc::clone(&state.graph_memory[allocation.device]);
        let base = allocation.base;
        drop(state);
        context.submit_or_run(&stream, Box::new(move || memory.freed(base)));
        return Ok(());
    }
    let Kind::Pooled { pool: handle, .. } = allocation.kind else {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    let pool = state.pools.get(&handle).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    drop(state);
    // Never captured (a capture makes a free node instead), so it runs once.
    let mut allocation = Some(allocation);
    let (handle_of_stream, ctx, marks) = (stream.handle, stream.ctx, Arc::clone(&stream.marks));
    context.submit_or_run(
        &stream,
        Box::new(move || {
            let Some(allocation) = allocation.take() else {
                return;
            };
            // The stream's count of completed recordings as the free runs, in its order.
            let mark = marks.load(std::sync::atomic::Ordering::Acquire);
            pool.release_on(&allocation, Some(FreedOn { stream: handle_of_stream, ctx, mark }));
            drop(allocation);
            // A destroyed pool stays in the table until its last free has run, so that its
            // reserve goes back to the device then (no state lock is held while work runs).
            if pool.is_destroyed()
                && let Ok(mut state) = state::lock()
            {
                forget_if_destroyed(&mut state, handle);
            }
        }),
    );
    Ok(())
}

/// Accounts for a pool allocation freed at once (`cuMemFree` of stream-ordered memory).
pub(crate) fn release_allocation(state: &mut State, pool: usize, allocation: &crate::memory::Allocation) {
    if let Some(pool) = state.pools.get(&pool) {
        pool.release(allocation);
    }
    forget_if_destroyed(state, pool);
}

/// Once a destroyed pool's last allocation is gone and its last free has run (`cuda.h`: its
/// resources are "released automatically once there are no more outstanding allocations"),
/// gives what it still reserves back to its device and drops it from the table.
fn forget_if_destroyed(state: &mut State, pool: usize) {
    let Some(entry) = state.pools.get(&pool) else {
        return;
    };
    if !entry.is_destroyed() || state.memory.pooled_in(pool).next().is_some() {
        return;
    }
    let mut accounts = entry.lock();
    if accounts.used > 0 {
        // A `cuMemFreeAsync` the stream has not reached yet.
        return;
    }
    // cuda.h (cuMemPoolDestroy): released "once there are no more outstanding allocations",
    // whether or not the host has seen the last free complete.
    accounts.unobserved.clear();
    let released = accounts.release_to(0);
    let access = std::mem::take(&mut accounts.access);
    drop(accounts);
    if let Some(device) = entry.owner() {
        let used = &mut state.devices[device].used;
        *used = used.saturating_sub(released);
        // Gone: its handle value may be reused, and with it the access it still had.
        if state.config.recycle_pool_handles && !entry.is_imported() {
            state.recyclable_pools.entry(device).or_default().push((pool, access));
        }
    }
    state.pools.remove(&pool);
}

/// `cuMemAllocManaged`: exactly one of `CU_MEM_ATTACH_GLOBAL` and `CU_MEM_ATTACH_HOST`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn alloc_managed(out: *mut CUdeviceptr, size: usize, flags: u32) -> SimResult {
    capture::refuse_unsafe()?;
    ensure(!out.is_null() && size > 0 && (flags == ATTACH_GLOBAL || flags == ATTACH_HOST))?;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let address = state.memory.alloc(size, Kind::Managed, context.device, context.handle)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, address) }
}

/// `cuMemHostRegister_v2`.
pub(crate) fn host_register(address: *mut c_void, size: usize, flags: u32) -> SimResult {
    ensure(flags & !HOST_REGISTER_FLAGS == 0)?;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    state.memory.register(address as u64, size, context.device, context.handle)
}

/// `cuMemHostUnregister`: `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED` unless `address` starts a
/// registration.
pub(crate) fn host_unregister(address: *mut c_void) -> SimResult {
    let mut state = state::lock()?;
    ctx::current(&state)?;
    state
        .memory
        .free(address as u64, Kind::Registered)
        .map(drop)
        .map_err(|_| CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
}

/// How a device reaches memory in a copy or memset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// A copy (`cuMemcpy*`), which the copy engine carries out.
    Copy,
    /// A memset, which writes from the device.
    Memset,
}

/// Checks that the device running a copy or memset can reach pool memory at `address`: a
/// device pool's memory needs access granted to other devices (read for a source, read-write
/// for a destination), or `CUDA_ERROR_INVALID_VALUE`. A pinned host pool's memory is reached by
/// copies without any grant (cuda.core copies into and out of it without one, and its tests pass
/// on GPUs), while a memset into it needs the device's read-write access, as an H100 refuses one
/// without (`CUDA_ERROR_INVALID_VALUE`; see [`conservative`](crate::conservative)).
///
/// Another device's `cuMemAlloc` memory is reached by copies (the driver stages a copy between
/// devices without peer access) but not by memsets, which would need the context peer access the
/// simulator does not model (`cuCtxEnablePeerAccess` is not exported); another device's graph
/// memory is reached by neither, as a device pool's without a grant (the simulated allocation
/// nodes give no peer access). Both are `CUDA_ERROR_INVALID_VALUE`, as for pools.
pub(crate) fn check_access(state: &State, address: u64, device: usize, write: bool, reach: Reach) -> SimResult {
    let Some(allocation) = state.memory.find(address) else {
        return Ok(());
    };
    let (pool, host) = match allocation.kind {
        Kind::Pooled { pool, host } => (pool, host),
        Kind::Device => return ensure(allocation.device == device || reach == Reach::Copy),
        Kind::Graph => return ensure(allocation.device == device),
        Kind::PinnedHost | Kind::Registered | Kind::Managed => return Ok(()),
    };
    let Some(pool) = state.pools.get(&pool) else {
        return Ok(());
    };
    if host && reach == Reach::Copy {
        return Ok(());
    }
    let access = pool.access(device);
    let allowed = if write {
        access == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    } else {
        access != CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE
    };
    ensure(allowed)
}
