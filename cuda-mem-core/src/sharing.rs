//! The driver side of sharing pools between processes: a pool's shareable file descriptor
//! (exported once), importing a pool from one, and exporting and importing single allocations.
//! `cuda-mem-ipc` builds descriptors, the import cache and the fd-passing channel on top.

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cuda_sys::cu_call;
use cuda_sys::types::{CUmemAllocationHandleType, CUmemPoolPtrExportData, CUmemoryPool, CUpointer_attribute};

use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::memory_resource::DevicePtr;
use crate::pool::MemoryPool;
use crate::stream::Stream;

const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// The size of the driver's export data for one allocation (`CUmemPoolPtrExportData`).
pub const EXPORT_DATA_LEN: usize = 64;

/// A pool's shareable handle: an owned file descriptor and an id that names the pool (the
/// exporting resource) in every process that imports it.
#[derive(Debug)]
pub struct ShareableHandle {
    fd: OwnedFd,
    id: u128,
}

impl ShareableHandle {
    /// The file descriptor (send it to another process; it stays owned here).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The pool's id.
    pub fn id(&self) -> u128 {
        self.id
    }

    /// A new descriptor for the same pool, owned by the caller.
    ///
    /// # Errors
    /// When the process is out of file descriptors.
    pub fn try_clone_fd(&self) -> Result<OwnedFd> {
        self.fd.try_clone().map_err(|e| Error::InvalidState(format!("duplicating the pool's file descriptor: {e}")))
    }
}

/// A random id (not cryptographic: it only has to be unique among the pools of cooperating
/// processes).
fn fresh_id() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    let state = RandomState::new();
    let high = state.hash_one((std::process::id(), std::time::SystemTime::now()));
    let low = RandomState::new().hash_one((high, std::thread::current().id()));
    (u128::from(high) << 64) | u128::from(low)
}

/// Makes a context current for calls that need one but take no stream: the pool's device's, or
/// device 0's for host pools (any context serves them).
fn bind_for(owner: Option<Device>) -> Result<()> {
    let device = match owner {
        Some(device) => device,
        None => Device::new(0)?,
    };
    crate::context::bind(device)
}

impl MemoryPool {
    /// Whether the pool was created shareable by file descriptor (`ipc_enabled`), or imported.
    pub fn is_shareable(&self) -> bool {
        self.shareable || self.imported
    }

    /// Whether the pool was imported from another process (a "mapped" pool: it cannot
    /// allocate; it maps allocations another process exports).
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// The pool's shareable handle, exported on the first request and the same on every later
    /// one (no new descriptor per call). For an imported pool, the handle it was imported from.
    ///
    /// # Errors
    /// [`Error::NotSupported`] for a pool created without `ipc_enabled`; driver errors.
    pub fn shareable_handle(&self) -> Result<&ShareableHandle> {
        if let Some(handle) = self.handle_once.get() {
            return Ok(handle);
        }
        if !self.shareable {
            return Err(Error::NotSupported(
                "this memory pool is not IPC-enabled: create it with ipc_enabled(true) to share it".to_string(),
            ));
        }
        let d = driver()?;
        let mut raw: std::ffi::c_int = -1;
        // SAFETY: `raw` is a valid out-pointer for the `int` a POSIX-fd export writes.
        unsafe {
            cu_call!(d, cuMemPoolExportToShareableHandle((&raw mut raw).cast::<c_void>(), self.handle(), POSIX_FD, 0))
        }?;
        // SAFETY: the driver returned a new descriptor that the caller owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Another thread may have won the race; its handle is kept and this one closed.
        Ok(self.handle_once.get_or_init(|| ShareableHandle { fd, id: fresh_id() }))
    }

    /// Imports a pool another process exported, taking ownership of `fd` (kept open for the
    /// pool's life). `id` is the exporter's id for it; `owner` its device, for device pools.
    ///
    /// # Errors
    /// When the driver refuses the descriptor (not a pool, or a pool it cannot map).
    pub fn import(fd: OwnedFd, id: u128, owner: Option<Device>) -> Result<MemoryPool> {
        bind_for(owner)?;
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // The driver takes the descriptor as a pointer-sized integer.
        let raw = fd.as_raw_fd() as isize as *mut c_void;
        // SAFETY: `handle` is a valid out-pointer; `fd` stays open for the call.
        unsafe { cu_call!(d, cuMemPoolImportFromShareableHandle(&mut handle, raw, POSIX_FD, 0)) }?;
        let pool = MemoryPool::new(handle, true, owner, false, true);
        let _ = pool.handle_once.set(ShareableHandle { fd, id });
        // An imported host pool, like any host pool, is the host CPU's alone until access is set.
        if owner.is_none() {
            pool.grant_all_devices()?;
        }
        Ok(pool)
    }

    /// The driver's export data for the allocation that starts at `ptr`.
    ///
    /// # Errors
    /// When `ptr` is not an allocation of a shareable pool.
    pub fn export_pointer(&self, ptr: DevicePtr) -> Result<[u8; EXPORT_DATA_LEN]> {
        bind_for(self.owner())?;
        let d = driver()?;
        let mut data = CUmemPoolPtrExportData::default();
        // SAFETY: `data` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, ptr)) }?;
        Ok(data.reserved)
    }

    /// Maps the allocation `data` describes from this (imported) pool. Importing the same data
    /// twice in one process returns the same pointer and the driver does not count it: free it
    /// once (the `cuda-mem-ipc` import cache does the counting).
    ///
    /// # Errors
    /// When the driver refuses the data (garbage, another pool's, not an imported pool).
    pub fn import_pointer(&self, data: &[u8; EXPORT_DATA_LEN]) -> Result<DevicePtr> {
        bind_for(self.owner())?;
        let d = driver()?;
        let mut raw = CUmemPoolPtrExportData { reserved: *data };
        let mut ptr: DevicePtr = 0;
        // SAFETY: valid out-pointer and export data for the call.
        unsafe { cu_call!(d, cuMemPoolImportPointer(&mut ptr, self.handle(), &mut raw)) }?;
        Ok(ptr)
    }

    /// Unmaps an imported allocation on `stream`.
    ///
    /// # Safety
    /// `ptr` came from [`MemoryPool::import_pointer`] and is not used after `stream`'s work so
    /// far, nor freed again.
    ///
    /// # Errors
    /// Driver errors.
    pub unsafe fn free_imported(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.deallocate(ptr, stream) }
    }
}

/// The size of the allocation containing `ptr`, as the driver maps it
/// (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`), for checking a size another process claims.
///
/// # Errors
/// When `ptr` is not a known allocation.
pub fn mapped_range_size(ptr: DevicePtr) -> Result<usize> {
    if crate::context::current_is_none()? {
        bind_for(None)?;
    }
    let d = driver()?;
    let mut size: usize = 0;
    // SAFETY: RANGE_SIZE writes a `size_t`, which `size` is.
    unsafe {
        cu_call!(
            d,
            cuPointerGetAttribute(
                (&raw mut size).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr
            )
        )
    }?;
    Ok(size)
}
