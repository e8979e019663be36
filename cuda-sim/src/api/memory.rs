//! Allocation, copies and memsets.
//!
//! Copies and memsets follow the host-synchronization rules the CUDA documentation gives
//! ("API synchronization behavior"), so code that relies on more synchronization than the
//! driver promises gets a wrong result here too:
//!
//! | call | pageable host involved | otherwise |
//! |---|---|---|
//! | sync host→device | waits for the stream, stages the source, returns before the copy lands | pinned source: returns when done |
//! | sync device→host, host→host | returns when done | returns when done |
//! | sync device→device | — | returns at once |
//! | async host→device | stages the source at the call, returns at once | returns at once |
//! | async device→host | returns when done | returns at once |
//! | async host→host | returns when done | returns at once |
//! | sync memset | — | device memory: returns at once; pinned host: returns when done |

use std::ffi::c_void;

use cuda_mem_sys::types::{CUcontext, CUdeviceptr, CUgraphNodeType, CUresult, CUstream};

use super::DefaultStream;
use super::pool::Reach;
use super::stream::resolve_for_work;
use crate::capture;
use crate::context as ctx;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::memory::{Endpoint, Kind, Touch, round_up};
use crate::state;

/// The node type of a captured copy.
const MEMCPY: CUgraphNodeType = CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY;

/// `cuMemAlloc_v2`: `CUDA_ERROR_INVALID_VALUE` for 0 bytes, `CUDA_ERROR_OUT_OF_MEMORY` past the
/// device's `CUDA_SIM_MEMORY`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn alloc(out: *mut CUdeviceptr, size: usize) -> SimResult {
    capture::refuse_unsafe()?;
    ensure(!out.is_null() && size > 0)?;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let charge = round_up(size as u64);
    let memory = state.config.memory;
    let used = &mut state.devices[context.device].used;
    if used.saturating_add(charge) > memory {
        return fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    }
    *used += charge;
    match state.memory.alloc_device(size, context.device, context.handle) {
        // SAFETY: forwarded from the caller.
        Ok(address) => unsafe { write_out(out, address) },
        Err(code) => {
            state.devices[context.device].used -= charge;
            fail(code)
        }
    }
}

/// `cuMemFree_v2`: the pointer must be the start of a live `cuMemAlloc`, `cuMemAllocManaged`
/// or pool allocation; freeing twice, freeing null, or freeing host memory is
/// `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn free(address: CUdeviceptr) -> SimResult {
    capture::refuse_unsafe()?;
    let mut state = state::lock()?;
    let allocation = state
        .memory
        .free_if(address, |kind| matches!(kind, Kind::Device | Kind::Managed | Kind::Pooled { .. } | Kind::Graph))?;
    if allocation.kind == Kind::Graph {
        // Graph memory: no implicit synchronization either (cuda.h lists cuMemFree among the
        // ways to free it).
        state.graph_memory[allocation.device].freed(allocation.base);
        return Ok(());
    }
    if let Kind::Pooled { pool, .. } = allocation.kind {
        // No implicit synchronization for stream-ordered memory, as cuda.h says: the caller
        // guarantees its accesses are done.
        super::pool::release_allocation(&mut state, pool, &allocation);
        return Ok(());
    }
    if allocation.kind == Kind::Device {
        let used = &mut state.devices[allocation.device].used;
        *used = used.saturating_sub(round_up(allocation.size as u64));
    }
    Ok(())
}

/// `cuMemAllocHost_v2`: page-locked host memory, also a valid device pointer.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn alloc_host(out: *mut *mut c_void, size: usize) -> SimResult {
    capture::refuse_unsafe()?;
    ensure(!out.is_null() && size > 0)?;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let address = state.memory.alloc_pinned(size, context.device, context.handle)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, address as *mut c_void) }
}

/// Every `cuMemHostAlloc` flag: `CU_MEMHOSTALLOC_PORTABLE`, `_DEVICEMAP`, `_WRITECOMBINED`.
const HOST_ALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4;

/// `cuMemHostAlloc`: page-locked host memory as `cuMemAllocHost` gives it, whatever the flags
/// (see [`conservative`](crate::conservative)); an unknown flag is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn host_alloc(out: *mut *mut c_void, size: usize, flags: u32) -> SimResult {
    ensure(flags & !HOST_ALLOC_FLAGS == 0)?;
    // SAFETY: forwarded from the caller.
    unsafe { alloc_host(out, size) }
}

/// `cuMemFreeHost`: the pointer must come from `cuMemAllocHost` or `cuMemHostAlloc`.
pub(crate) fn free_host(address: *mut c_void) -> SimResult {
    capture::refuse_unsafe()?;
    state::lock()?.memory.free(address as u64, Kind::PinnedHost).map(drop)
}

/// `cuMemGetInfo_v2`: free and total memory of the current context's device.
///
/// # Safety
/// Both pointers are null or valid for a write.
pub(crate) unsafe fn get_info(free: *mut usize, total: *mut usize) -> SimResult {
    ensure(!free.is_null() && !total.is_null())?;
    let state = state::lock()?;
    let context = ctx::current(&state)?;
    let memory = state.config.memory;
    let used = state.devices[context.device].used;
    // SAFETY: forwarded from the caller.
    unsafe {
        write_out(free, memory.saturating_sub(used) as usize)?;
        write_out(total, memory as usize)
    }
}

/// `cuMemGetAddressRange_v2`: the allocation containing a device pointer. In memory mapped
/// through the VMM API (of which `cuda.h` says nothing here), the mapping containing it: GPUs
/// answer with the one physical allocation mapped there, not the whole reservation or the run of
/// mappings around it (UCX and libfabric work around exactly that for buffers of several
/// `cuMemCreate` handles).
///
/// # Safety
/// Each pointer is null (not wanted) or valid for a write.
pub(crate) unsafe fn address_range(base: *mut CUdeviceptr, size: *mut usize, address: CUdeviceptr) -> SimResult {
    let state = state::lock()?;
    ctx::current(&state)?;
    let (start, len) = match state.memory.find(address) {
        Some(allocation) => (allocation.base, allocation.size),
        None => {
            let mapped = state.memory.mapped_cover(address, 1).ok_or(CUresult::CUDA_ERROR_NOT_FOUND)?;
            let (start, range) = mapped[0];
            (start, usize::try_from(range.size).map_err(|_| CUresult::CUDA_ERROR_NOT_FOUND)?)
        }
    };
    // SAFETY: each pointer is written only when non-null, as cuda.h allows.
    unsafe {
        if !base.is_null() {
            write_out(base, start)?;
        }
        if !size.is_null() {
            write_out(size, len)?;
        }
    }
    Ok(())
}

/// `CU_CTX_SYNC_MEMOPS`: synchronous memory operations always synchronize.
const CTX_SYNC_MEMOPS: u32 = 0x80;

/// Whether the context was created with `CU_CTX_SYNC_MEMOPS` (a primary context: its device's
/// primary context flags have it).
fn syncs_memops(state: &state::State, context: &ctx::Context) -> bool {
    context.created_flags.unwrap_or(state.primary_flags[context.device]) & CTX_SYNC_MEMOPS != 0
}

/// Which kind of memory each side of a copy must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// `cuMemcpyHtoD*`.
    HostToDevice,
    /// `cuMemcpyDtoH*`.
    DeviceToHost,
    /// `cuMemcpyDtoD*`.
    DeviceToDevice,
    /// `cuMemcpy*`: whatever unified addressing says each pointer is.
    Any,
    /// `cuMemcpyPeer*`: device memory, each side reached by the device of the context the call
    /// names for it (see [`copy_peer`]).
    Peer {
        /// The destination context's device.
        dst_device: usize,
        /// The source context's device.
        src_device: usize,
    },
}

/// How long the calling thread waits for a copy.
enum Wait {
    /// Returns once the copy is enqueued.
    No,
    /// Waits for earlier work on the stream, copies the source aside, enqueues the rest.
    StageAfterStream,
    /// Copies the source aside, enqueues the rest.
    Stage,
    /// Returns once the copy is done.
    UntilDone,
}

fn wait_rule(dst: &Endpoint, src: &Endpoint, asynchronous: bool) -> Wait {
    let to_device = !dst.is_host();
    match (asynchronous, src.is_pageable() && to_device) {
        (false, true) => Wait::StageAfterStream,
        (true, true) => Wait::Stage,
        (false, false) if dst.is_host() || src.is_host() => Wait::UntilDone,
        (false, false) => Wait::No,
        (true, false) if dst.is_host() && (dst.is_pageable() || src.is_pageable()) => Wait::UntilDone,
        (true, false) => Wait::No,
    }
}

/// A raw address moved into a stream operation.
pub(crate) struct Address(pub(crate) *mut u8);
// SAFETY: the address points into simulator-owned memory kept alive by the operation's spans, or
// into caller-owned host memory the caller keeps valid until the copy completes (the driver's
// contract for asynchronous copies).
unsafe impl Send for Address {}

/// Checks that `device`, running a copy of `len` bytes from `src` to `dst`, can reach both
/// (pool memory's access grants, VMM mappings' access).
pub(crate) fn check_copy_access(state: &state::State, dst: u64, src: u64, len: usize, device: usize) -> SimResult {
    super::pool::check_access(state, dst, device, true, Reach::Copy)?;
    super::pool::check_access(state, src, device, false, Reach::Copy)?;
    super::vmm::check_access(state, dst, len, device, true)?;
    super::vmm::check_access(state, src, len, device, false)
}

/// Checks that `device` can reach one side of a copy, `len` bytes at `address` (written when
/// `write`).
fn check_side_access(state: &state::State, address: u64, len: usize, device: usize, write: bool) -> SimResult {
    super::pool::check_access(state, address, device, write, Reach::Copy)?;
    super::vmm::check_access(state, address, len, device, write)
}

/// `cuMemcpyPeer` and `cuMemcpyPeerAsync`: a device-to-device copy where each side is reached
/// by the device of the context named for it, not by the stream's: pool memory needs no access
/// grant for the context of its own device (see [`conservative`](crate::conservative)). Both
/// contexts must be live (`CUDA_ERROR_INVALID_CONTEXT`: null, unknown, destroyed); otherwise as
/// `cuMemcpyDtoD`/`cuMemcpyDtoDAsync`.
///
/// # Safety
/// As [`copy`].
#[allow(clippy::too_many_arguments)] // the driver's own arguments, one for one
pub(crate) unsafe fn copy_peer(
    dst: CUdeviceptr,
    dst_context: CUcontext,
    src: CUdeviceptr,
    src_context: CUcontext,
    len: usize,
    stream: CUstream,
    mode: DefaultStream,
    asynchronous: bool,
) -> SimResult {
    let (dst_device, src_device) = {
        let state = state::lock()?;
        let device = |context: CUcontext| {
            let context = state.contexts.get(&(context as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
            context.fault.check().map(|()| context.device)
        };
        (device(dst_context)?, device(src_context)?)
    };
    // SAFETY: forwarded from the caller.
    unsafe { copy(dst, src, len, Direction::Peer { dst_device, src_device }, stream, mode, asynchronous) }
}

/// Every `cuMemcpy*` function.
///
/// # Safety
/// Host pointers must be valid for `len` bytes (reads for sources, writes for destinations)
/// until the copy completes, as the driver requires.
pub(crate) unsafe fn copy(
    dst: u64,
    src: u64,
    len: usize,
    direction: Direction,
    stream: CUstream,
    mode: DefaultStream,
    asynchronous: bool,
) -> SimResult {
    let (dst_address, src_address) = (dst, src);
    let state = state::lock()?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    let (dst, src) = match direction {
        Direction::HostToDevice => (state.memory.classify_allocated(dst, len)?, state.memory.classify_host(src, len)?),
        Direction::DeviceToHost => (state.memory.classify_host(dst, len)?, state.memory.classify_allocated(src, len)?),
        Direction::DeviceToDevice | Direction::Peer { .. } => {
            (state.memory.classify_allocated(dst, len)?, state.memory.classify_allocated(src, len)?)
        }
        Direction::Any => (state.memory.classify(dst, len)?, state.memory.classify(src, len)?),
    };
    match direction {
        Direction::Peer { dst_device, src_device } => {
            check_side_access(&state, dst_address, len, dst_device, true)?;
            check_side_access(&state, src_address, len, src_device, false)?;
        }
        _ => check_copy_access(&state, dst_address, src_address, len, stream.device)?,
    }
    let sync_memops = syncs_memops(&state, &context);
    drop(state);
    if len == 0 {
        return Ok(());
    }
    let touches = touches([(dst_address, &dst), (src_address, &src)], len);
    let fault = std::sync::Arc::clone(&context.fault);
    let wait = if stream.capture.is_under_way() {
        // A captured copy reads its source when a launch runs it, as a GPU's memcpy node does:
        // nothing is staged, nothing is waited for (see `conservative`).
        Wait::No
    } else if !asynchronous && sync_memops {
        Wait::UntilDone
    } else {
        wait_rule(&dst, &src, asynchronous)
    };
    if matches!(wait, Wait::StageAfterStream) {
        context.submit(&stream, Box::new(|| {})).wait();
    }
    let to = Address(dst.ptr());
    let fence = if matches!(wait, Wait::Stage | Wait::StageAfterStream) {
        // SAFETY: the caller guarantees the source is readable for `len` bytes now.
        let staged = unsafe { std::slice::from_raw_parts(src.ptr(), len) }.to_vec();
        context.submit_touching(
            &stream,
            Box::new(move || {
                let to = &to;
                let Some(_held) = Endpoint::hold(&[&dst]) else {
                    return fault.record(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                };
                // SAFETY: `to` is valid for `len` bytes (checked at the call; kept alive by
                // `dst`, and mapped while `_held` lives); `staged` is a private buffer of `len`
                // bytes.
                unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), to.0, len) };
            }),
            touches,
            MEMCPY,
        )
    } else {
        let from = Address(src.ptr());
        context.submit_touching(
            &stream,
            Box::new(move || {
                let Some(_held) = Endpoint::hold(&[&dst, &src]) else {
                    return fault.record(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                };
                let (to, from) = (&to, &from);
                // SAFETY: both ranges are valid for `len` bytes (checked at the call, or
                // guaranteed by the caller for host memory), kept alive by `dst` and `src` and
                // mapped while `_held` lives; they may overlap, hence a memmove.
                unsafe { std::ptr::copy(from.0, to.0, len) };
            }),
            touches,
            MEMCPY,
        )
    };
    if matches!(wait, Wait::UntilDone) {
        fence.wait();
    }
    Ok(())
}

/// Every `cuMemsetD8/D16/D32` function: `count` elements of `width` bytes.
pub(crate) fn memset(
    dst: CUdeviceptr,
    value: u32,
    width: usize,
    count: usize,
    stream: CUstream,
    mode: DefaultStream,
    asynchronous: bool,
) -> SimResult {
    let len = count.checked_mul(width).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(dst.is_multiple_of(width as u64))?;
    let state = state::lock()?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    let target = state.memory.classify_allocated(dst, len)?;
    super::pool::check_access(&state, dst, stream.device, true, Reach::Memset)?;
    super::vmm::check_access(&state, dst, len, stream.device, true)?;
    let sync_memops = syncs_memops(&state, &context);
    drop(state);
    if count == 0 {
        return Ok(());
    }
    let pinned = target.is_host();
    let to = Address(target.ptr());
    let touches = touches([(dst, &target)], len);
    let fault = std::sync::Arc::clone(&context.fault);
    let fence = context.submit_touching(
        &stream,
        Box::new(move || {
            let to = &to;
            let Some(_held) = Endpoint::hold(&[&target]) else {
                return fault.record(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            };
            // SAFETY: `to` is valid and `width`-aligned for `count` elements (checked at the
            // call; the backing is page-aligned), kept alive by `target` and mapped while
            // `_held` lives.
            unsafe { fill(to.0, value, width, count) };
        }),
        touches,
        CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET,
    );
    if !asynchronous && (pinned || sync_memops) {
        fence.wait();
    }
    Ok(())
}

/// The simulator's memory among `endpoints` (each with its address), `len` bytes each: what a
/// launch of a captured copy or memset checks (pageable host memory is the application's).
fn touches<const N: usize>(endpoints: [(u64, &Endpoint); N], len: usize) -> Vec<Touch> {
    endpoints
        .into_iter()
        .filter(|(_, endpoint)| !endpoint.is_pageable())
        .map(|(address, endpoint)| Touch { address, len, endpoint: endpoint.clone() })
        .collect()
}

/// Writes `count` copies of the low `width` bytes of `value` from `to`.
///
/// # Safety
/// `to` is valid and aligned for `count * width` bytes of writes.
unsafe fn fill(to: *mut u8, value: u32, width: usize, count: usize) {
    // SAFETY: forwarded from the caller for each width.
    unsafe {
        match width {
            1 => std::ptr::write_bytes(to, value as u8, count),
            2 => std::slice::from_raw_parts_mut(to.cast::<u16>(), count).fill(value as u16),
            _ => std::slice::from_raw_parts_mut(to.cast::<u32>(), count).fill(value),
        }
    }
}
