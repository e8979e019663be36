//! Sharing pools between processes: `cuMemPoolExportToShareableHandle`,
//! `cuMemPoolImportFromShareableHandle`, `cuMemPoolExportPointer`, `cuMemPoolImportPointer`.

use std::ffi::{c_int, c_void};
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::sync::Arc;

use cuda_mem_sys::types::{CUdeviceptr, CUmemAllocationHandleType, CUmemPoolPtrExportData, CUmemoryPool, CUresult};

use super::pool::find;
use crate::context as ctx;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::memory::Kind;
use crate::pool::{Location, Pool};
use crate::shared::SharedArena;
use crate::state;

const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// `cuMemPoolExportToShareableHandle`: a new file descriptor (the caller owns it) for a pool
/// created with the POSIX-fd handle type. Other pools, other handle types and non-zero flags
/// are `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` is null or valid for a write of an `int`.
pub(crate) unsafe fn export_pool(
    out: *mut c_void,
    pool: CUmemoryPool,
    handle_type: CUmemAllocationHandleType,
    flags: u64,
) -> SimResult {
    ensure(!out.is_null() && handle_type == POSIX_FD && flags == 0)?;
    let pool = find(&*state::lock()?, pool)?;
    let shared = pool.shared.as_ref().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(pool.handle_types & POSIX_FD.0 != 0)?;
    let fd = shared.duplicate()?.into_raw_fd();
    // SAFETY: forwarded from the caller; on failure the fd is closed below.
    if let Err(code) = unsafe { write_out(out.cast::<c_int>(), fd) } {
        // SAFETY: `fd` was just created here and is owned by nothing else.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        return fail(code);
    }
    Ok(())
}

/// `cuMemPoolImportFromShareableHandle`: `handle` is the file descriptor (as the driver takes
/// it, cast to a pointer); the caller keeps it. The pool's header names its device by physical
/// index, which becomes this process's ordinal for it (the imported pool's owner, and the
/// device of pointers imported from it). A descriptor that is not an exported pool, or a device
/// pool on a device this process does not see (`CUDA_VISIBLE_DEVICES`), is
/// `CUDA_ERROR_INVALID_VALUE`. Each import gets a handle of its own, unless
/// `CUDA_SIM_POOL_IMPORT=same-handle` asks for the other reading (see `conservative`): then a
/// pool this process has imported already answers with the first import's handle, uncounted.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn import_pool(
    out: *mut CUmemoryPool,
    handle: *mut c_void,
    handle_type: CUmemAllocationHandleType,
    flags: u64,
) -> SimResult {
    ensure(!out.is_null() && handle_type == POSIX_FD && flags == 0)?;
    let raw = c_int::try_from(handle as isize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(raw >= 0)?;
    let mut state = state::lock()?;
    // SAFETY: the descriptor is only duplicated (fcntl), which fails cleanly with EBADF when the
    // number is not an open descriptor; nothing is read through it before that succeeds.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    let (arena, location, kind) = SharedArena::open(borrowed, &state.config)?;
    if state.config.same_handle_imports
        && let Some(first) = state.pools.values().find(|p| {
            !p.is_destroyed() && p.shared.as_ref().is_some_and(|first| first.imported && first.id == arena.id)
        })
    {
        // SAFETY: forwarded from the caller.
        return unsafe { write_out(out, first.handle as CUmemoryPool) };
    }
    let mut pool = Pool::with_shared(location, kind, POSIX_FD.0, 0, false, Some(arena));
    // A gone pool's handle value may come back from an import as from a creation
    // (`CUDA_SIM_POOL_HANDLES=recycle`): a driver's handles are addresses it reuses.
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
    unsafe { write_out(out, handle as CUmemoryPool) }
}

/// `cuMemPoolExportPointer`: `ptr` must start a live allocation of a shareable pool (exported
/// or imported here).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn export_pointer(out: *mut CUmemPoolPtrExportData, ptr: CUdeviceptr) -> SimResult {
    ensure(!out.is_null())?;
    let state = state::lock()?;
    let allocation = state.memory.find(ptr).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(allocation.base == ptr)?;
    let Kind::Pooled { pool, .. } = allocation.kind else { return fail(CUresult::CUDA_ERROR_INVALID_VALUE) };
    let pool = state.pools.get(&pool).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let (Some(shared), Some(offset)) = (&pool.shared, allocation.file_offset) else {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    let data = shared.export_pointer(offset, allocation.size as u64);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, CUmemPoolPtrExportData { reserved: data }) }
}

/// `cuMemPoolImportPointer`: maps the allocation `data` describes from the imported `pool`.
/// Garbage, data from another pool, or an importing pool that was not imported is
/// `CUDA_ERROR_INVALID_VALUE`. Importing the same allocation twice returns the same pointer,
/// without counting: as with the driver, one free unmaps it for both.
///
/// # Safety
/// `out` is null or valid for a write; `data` is null or valid for a read.
pub(crate) unsafe fn import_pointer(
    out: *mut CUdeviceptr,
    pool: CUmemoryPool,
    data: *mut CUmemPoolPtrExportData,
) -> SimResult {
    ensure(!out.is_null() && !data.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let data = unsafe { data.read_unaligned() }.reserved;
    let mut state = state::lock()?;
    let context = ctx::current(&state)?;
    let pool = find(&state, pool)?;
    let shared = pool.shared.as_ref().filter(|s| s.imported).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let (offset, size, tag) = shared.check_pointer(&data)?;
    shared.check_exporter_holds(offset, tag)?;
    if let Some(existing) = state.memory.find_shared(pool.handle, offset) {
        let address = existing.base;
        // SAFETY: forwarded from the caller.
        return unsafe { write_out(out, address) };
    }
    let size = usize::try_from(size).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let kind = Kind::Pooled { pool: pool.handle, host: pool.is_host_memory() };
    let device = pool.owner().unwrap_or(context.device);
    let address = state.memory.alloc_shared(size, kind, device, context.handle, shared.file_as_fd(), offset)?;
    shared.hold_import(offset, size as u64);
    let _ = pool.lock().allocate(size as u64, 0);
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, address) }
}
