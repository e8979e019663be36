//! The driver side of sharing pools between processes: a pool's shareable file descriptor
//! (exported once), importing a pool from one, and exporting single allocations. Which pool
//! handles this process owns is kept here too: a driver may answer a second import of one pool
//! with the handle of the first, and a second owner of it would destroy it under the first.
//! `cuda-mem-ipc` builds descriptors and the fd-passing channel on top.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_sys::cu_call;
use cuda_sys::types::{CUmemAllocationHandleType, CUmemPoolPtrExportData, CUmemoryPool, CUpointer_attribute};

use super::{MemoryPool, PoolKind, imports};
use crate::access::Access;
use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::memory_resource::DevicePtr;

const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// The size of the driver's export data for one allocation (`CUmemPoolPtrExportData`).
pub const EXPORT_DATA_LEN: usize = 64;

/// A pool's shareable handle: an owned file descriptor and an id that names the pool (the
/// exporting resource) in every process that imports it.
#[doc(alias = "IPCAllocationHandle")]
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
    /// [`Error::Io`] when the descriptor cannot be duplicated (the process is out of file
    /// descriptors, say).
    pub fn try_clone_fd(&self) -> Result<OwnedFd> {
        self.fd.try_clone().map_err(|source| Error::Io { context: "duplicating the pool's file descriptor", source })
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
    fn imported(handle: CUmemoryPool) -> Option<HandleClaim> {
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

    /// The pool's shareable handle, exported on the first request and the same on every later
    /// one (no new descriptor per call). For an imported pool, the handle it was imported from.
    ///
    /// # Errors
    /// [`Error::PoolNotIpcEnabled`] for a pool created without `ipc_enabled`; driver errors.
    #[doc(alias("allocation_handle", "get_allocation_handle"))]
    pub fn shareable_handle(&self) -> Result<&ShareableHandle> {
        if let Some(handle) = self.handle_once.get() {
            return Ok(handle);
        }
        if !self.shareable {
            return Err(Error::PoolNotIpcEnabled);
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
        let handle = self.handle_once.get_or_init(|| ShareableHandle { fd, id: fresh_id() });
        crate::memory_event!(DEBUG, pool = self.handle() as usize, id = handle.id, kind = ?self.kind, "pool exported");
        Ok(handle)
    }

    /// Imports a pool another process exported, taking ownership of `fd` (kept open for the
    /// pool's life); `id` is the exporter's id for it. What memory it holds (its
    /// [`kind`](MemoryPool::kind): device memory of its device, or pinned host memory) is asked
    /// of the driver, not taken from the exporter's word; an imported host pool is given to every
    /// device, as a created one is.
    ///
    /// # Errors
    /// [`Error::PoolAlreadyOwned`] when the driver answers with the handle of a pool this process
    /// already owns (a driver may return one handle for every import of a pool): nothing new is
    /// owned, and that pool is left as it was. [`Error::UnsupportedImportedPool`] when the pool is neither
    /// a device pool nor a pinned host pool. Driver errors when the driver refuses the
    /// descriptor (not a pool, or a pool it cannot map).
    #[doc(alias = "from_allocation_handle")]
    pub fn import(fd: OwnedFd, id: u128) -> Result<MemoryPool> {
        bind_for(None)?;
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // The driver takes the descriptor as a pointer-sized integer.
        let raw = fd.as_raw_fd() as isize as *mut c_void;
        // SAFETY: `handle` is a valid out-pointer; `fd` stays open for the call.
        unsafe { cu_call!(d, cuMemPoolImportFromShareableHandle(&mut handle, raw, POSIX_FD, 0)) }?;
        let Some(claim) = HandleClaim::imported(handle) else {
            return Err(Error::PoolAlreadyOwned { handle: handle as usize });
        };
        // Pinned (no owner) until located: nothing reads the kind before.
        let mut pool = MemoryPool::new(handle, true, PoolKind::Pinned, false, true);
        pool.claim = Some(claim);
        let _ = pool.handle_once.set(ShareableHandle { fd, id });
        // On an error from here the pool drops, destroying a handle that is this import's own.
        pool.kind = pool.locate_imported()?;
        // An imported host pool, like any host pool, is the host CPU's alone until access is set.
        if pool.kind == PoolKind::Pinned {
            pool.grant_all_devices()?;
        }
        crate::memory_event!(DEBUG, pool = handle as usize, id, kind = ?pool.kind, "pool imported");
        Ok(pool)
    }

    /// Where an imported pool's memory lives, from the driver's access table. Only host memory
    /// is read-write for the host CPU, so a pool that answers so for the host location is a
    /// pinned pool, whatever devices it was granted (whether an import inherits the exporter's
    /// grants is not documented). Otherwise it is a device pool, reachable read-write from its
    /// own device; a driver that refuses the host query is read the same way, as it has no host
    /// pool to offer. Both readings are among the GPU bundle's open driver questions.
    fn locate_imported(&self) -> Result<PoolKind> {
        if matches!(self.host_access(), Ok(Access::ReadWrite)) {
            return Ok(PoolKind::Pinned);
        }
        let mut reachable = Vec::new();
        for device in Device::all()? {
            if self.access(device)? == Access::ReadWrite {
                reachable.push(device);
            }
        }
        match reachable[..] {
            [device] => Ok(PoolKind::Device(device)),
            _ => Err(Error::UnsupportedImportedPool { reachable_devices: reachable.len() }),
        }
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

#[cfg(test)]
mod tests {
    use crate::{Device, DeviceMemoryResource, Error};

    /// A device pool that another device was granted reaches two devices, as an import that
    /// inherited its exporter's grants would (undocumented either way): neither reading of the
    /// table names one owner, so it is refused rather than guessed. The pool is located here as
    /// an imported one would be.
    #[test]
    fn a_pool_several_devices_reach_is_no_shareable_kind() {
        cuda_sim::testing::in_simulated_machine(
            "pool::sharing::tests::a_pool_several_devices_reach_is_no_shareable_kind",
            &[("CUDA_SIM_DEVICES", "2")],
            || {
                if !cuda_sim::testing::simulator_only("two devices that reach one device pool") {
                    return;
                }
                cuda_sim::testing::driver().expect("the test driver loads");
                let pool = DeviceMemoryResource::new(Device::new(0).unwrap(), Default::default()).unwrap();
                pool.pool().add_peer(Device::new(1).unwrap()).unwrap();
                let error = pool.pool().locate_imported().unwrap_err();
                assert!(matches!(error, Error::UnsupportedImportedPool { reachable_devices: 2 }), "{error}");
                assert!(error.to_string().contains("share device or pinned memory pools only"), "{error}");
            },
        );
    }
}
