//! The driver side of sharing pools between processes, on every platform: exporting single
//! allocations, and which pool handles this process owns (a driver may answer a second import
//! of one pool with the handle of the first, and a second owner of it would destroy it under the
//! first). The pool's shareable file descriptor, and importing a pool from one, are in
//! [`shareable`](super::shareable) (Unix only). `cuda-mem-ipc` builds descriptors and the
//! fd-passing channel on top.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUmemPoolPtrExportData, CUmemoryPool, CUpointer_attribute};

use super::{MemoryPool, imports};
use crate::buffer::ScopedBuffer;
use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::memory_resource::DevicePtr;

/// The size of the driver's export data for one allocation (`CUmemPoolPtrExportData`).
pub const EXPORT_DATA_LEN: usize = 64;

/// A buffer's export data, kept in the buffer once made: the pool it was exported through (by
/// handle: the buffer keeps its pool alive, so the handle cannot name another pool meanwhile)
/// and the data.
#[derive(Debug)]
pub(crate) struct CachedExport {
    pool: usize,
    data: [u8; EXPORT_DATA_LEN],
}

/// Makes a context current for calls that need one but take no stream: the pool's device's, or
/// device 0's for host pools (any context serves them).
pub(super) fn bind_for(owner: Option<Device>) -> Result<()> {
    let device = match owner {
        Some(device) => device,
        None => Device::new(0)?,
    };
    crate::context::bind(device)
}

/// The handles of the pools this process owns (created or imported), each with how many values
/// claim it (more than one only if the driver reuses a destroyed handle while its old claim is
/// being let go).
static OWNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

fn owned() -> MutexGuard<'static, BTreeMap<usize, usize>> {
    // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An owned pool's claim on its handle, let go (after the pool is destroyed) when dropped.
#[derive(Debug)]
pub(super) struct HandleClaim {
    handle: usize,
}

impl HandleClaim {
    /// Claims the handle of a pool just created.
    pub(super) fn created(handle: CUmemoryPool) -> HandleClaim {
        *owned().entry(handle as usize).or_insert(0) += 1;
        HandleClaim { handle: handle as usize }
    }

    /// Claims the handle an import returned, unless this process owns that pool already.
    #[cfg(unix)]
    pub(super) fn imported(handle: CUmemoryPool) -> Option<HandleClaim> {
        let mut owned = owned();
        if owned.contains_key(&(handle as usize)) {
            return None;
        }
        owned.insert(handle as usize, 1);
        Some(HandleClaim { handle: handle as usize })
    }
}

impl Drop for HandleClaim {
    fn drop(&mut self) {
        {
            let mut owned = owned();
            if let Some(count) = owned.get_mut(&self.handle) {
                *count -= 1;
                if *count == 0 {
                    owned.remove(&self.handle);
                }
            }
        }
        // Imports through a destroyed pool are gone with it (a release that failed left them).
        imports::forget_pool(self.handle);
    }
}

impl MemoryPool {
    /// Whether the pool was created shareable by file descriptor (`ipc_enabled`), or imported.
    pub fn is_shareable(&self) -> bool {
        self.shareable || self.imported
    }

    /// Whether the pool was imported from another process (a "mapped" pool: it cannot
    /// allocate; it maps allocations another process exports).
    #[doc(alias = "is_mapped")]
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// The driver's export data for the allocation that starts at `ptr`. For a pool imported
    /// from another process, the data the allocation was imported with, so it can be passed on
    /// (A→B→C).
    ///
    /// # Errors
    /// [`Error::NotAnImport`] for an imported pool when `ptr` is not an allocation this process
    /// imported through it; driver errors when `ptr` is not an allocation of a shareable pool.
    #[doc(alias = "ipc_descriptor")]
    pub fn export_pointer(&self, ptr: DevicePtr) -> Result<[u8; EXPORT_DATA_LEN]> {
        if self.imported {
            return imports::export_data_of(self, ptr).ok_or(Error::NotAnImport { ptr });
        }
        bind_for(self.owner())?;
        let d = driver()?;
        let mut data = CUmemPoolPtrExportData::default();
        // SAFETY: `data` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, ptr)) }?;
        crate::memory_event!(DEBUG, ptr, pool = self.handle() as usize, "allocation exported");
        Ok(data.reserved)
    }

    /// The export data of `buffer`, an allocation of this pool: as
    /// [`MemoryPool::export_pointer`] of its address the first time, then the same data again,
    /// kept in the buffer, without a driver call. The data describes the allocation, which does
    /// not change while the buffer lives; it goes with the buffer, so a later allocation at the
    /// same address starts without it (as cuda.core keeps a buffer's IPC descriptor once made).
    ///
    /// A view (a buffer that owns no memory) is exported each time, as its address is.
    ///
    /// # Errors
    /// As [`MemoryPool::export_pointer`] (a failed export keeps nothing).
    #[doc(alias = "get_ipc_descriptor")]
    pub fn export_buffer(&self, buffer: &ScopedBuffer<'_>) -> Result<[u8; EXPORT_DATA_LEN]> {
        let pool = self.handle() as usize;
        if buffer.memory_resource().is_none() {
            return self.export_pointer(buffer.ptr());
        }
        let slot = buffer.export_slot();
        if let Some(cached) = slot.get() {
            if cached.pool == pool {
                return Ok(cached.data);
            }
            // Asked of another pool than the first time: its own answer, not kept.
            return self.export_pointer(buffer.ptr());
        }
        let data = self.export_pointer(buffer.ptr())?;
        // Two threads exporting at once both got the same data; the first one set is kept.
        let _ = slot.set(Box::new(CachedExport { pool, data }));
        Ok(data)
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
