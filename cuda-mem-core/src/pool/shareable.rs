//! A pool's shareable file descriptor (exported once) and importing a pool from one: the
//! POSIX-file-descriptor half of sharing pools between processes. Built on Unix only
//! (`std::os::fd` exists there); the driver offers POSIX file descriptors on Linux only (on
//! Windows it would take a Win32 handle, which this crate does not implement).

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUmemAllocationHandleType, CUmemoryPool};

use super::bind_for;
use super::sharing::{HandleClaim, handle_turnover};
use super::{MemoryPool, PoolKind};
use crate::access::Access;
use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result, SharingError};

const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

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

/// The descriptor a successful export wrote. A negative one is none (the slot left as it was):
/// `OwnedFd::from_raw_fd` would panic on -1, so it is an error instead.
///
/// # Safety
/// A non-negative `raw` must be open and owned by the caller, who gives it up.
unsafe fn exported_fd(raw: std::ffi::c_int) -> Result<OwnedFd> {
    if raw < 0 {
        return Err(Error::Io {
            context: "exporting the pool's file descriptor",
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the driver reported success but gave no descriptor ({raw})"),
            ),
        });
    }
    // SAFETY: forwarded from the caller.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
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

impl MemoryPool {
    /// The pool's shareable handle, exported on the first request and the same on every later
    /// one (no new descriptor per call). For an imported pool, the handle it was imported from.
    ///
    /// # Errors
    /// - [`SharingError::PoolNotIpcEnabled`] for a pool created without `ipc_enabled`.
    /// - Driver errors.
    /// - [`Error::Io`] when the driver reports success but gives no descriptor.
    #[doc(alias("allocation_handle", "get_allocation_handle"))]
    pub fn shareable_handle(&self) -> Result<&ShareableHandle> {
        if let Some(handle) = self.handle_once.get() {
            return Ok(handle);
        }
        if !self.shareable {
            return Err(Error::Sharing(SharingError::PoolNotIpcEnabled));
        }
        let d = driver()?;
        let mut raw: std::ffi::c_int = -1;
        // SAFETY: `raw` is a valid out-pointer for the `int` a POSIX-fd export writes.
        unsafe {
            cu_call!(d, cuMemPoolExportToShareableHandle((&raw mut raw).cast::<c_void>(), self.handle(), POSIX_FD, 0))
        }?;
        // SAFETY: the driver returned a new descriptor that the caller owns.
        let fd = unsafe { exported_fd(raw) }?;
        // Another thread may have won the race; its handle is kept and this one closed.
        let handle = self.handle_once.get_or_init(|| ShareableHandle { fd, id: fresh_id() });
        crate::memory_event!(DEBUG, pool = %hex(self.handle()), id = handle.id, kind = %pool_kind(self.kind), "pool exported");
        Ok(handle)
    }

    /// Imports a pool another process exported, taking ownership of `fd` (kept open for the
    /// pool's life); `id` is the exporter's id for it. What memory it holds (its
    /// [`kind`](MemoryPool::kind): device memory of its device, or pinned host memory) is asked
    /// of the driver, not taken from the exporter's word; an imported host pool is given to every
    /// device, as a created one is.
    ///
    /// # Errors
    /// [`SharingError::PoolAlreadyOwned`] when the driver answers with the handle of a pool this process
    /// already owns (a driver may return one handle for every import of a pool): nothing new is
    /// owned, and that pool is left as it was. [`SharingError::UnsupportedImportedPool`] when the pool is neither
    /// a device pool nor a pinned host pool. Driver errors when the driver refuses the
    /// descriptor (not a pool, or a pool it cannot map).
    #[doc(alias = "from_allocation_handle")]
    pub fn import(fd: OwnedFd, id: u128) -> Result<MemoryPool> {
        bind_for(None)?;
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // The driver takes the descriptor as a pointer-sized integer.
        let raw = fd.as_raw_fd() as isize as *mut c_void;
        let claim = {
            // Released before anything below can drop the pool (whose `Drop` takes it).
            let _turnover = handle_turnover();
            // SAFETY: `handle` is a valid out-pointer; `fd` stays open for the call.
            unsafe { cu_call!(d, cuMemPoolImportFromShareableHandle(&mut handle, raw, POSIX_FD, 0)) }?;
            HandleClaim::imported(handle)
        };
        let Some(claim) = claim else {
            return Err(Error::Sharing(SharingError::PoolAlreadyOwned { handle: handle as usize }));
        };
        // Pinned (no owner) until located: nothing reads the kind before.
        let mut pool = MemoryPool::new(d, handle, true, PoolKind::Pinned, false, true);
        pool.claim = Some(claim);
        let _ = pool.handle_once.set(ShareableHandle { fd, id });
        // On an error from here the pool drops, destroying a handle that is this import's own.
        pool.kind = pool.locate_imported()?;
        // An imported host pool, like any host pool, is the host CPU's alone until access is set.
        if pool.kind == PoolKind::Pinned {
            pool.grant_all_devices()?;
        }
        crate::memory_event!(DEBUG, pool = %hex(handle), id, kind = %pool_kind(pool.kind), "pool imported");
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
            _ => Err(Error::Sharing(SharingError::UnsupportedImportedPool { reachable_devices: reachable.len() })),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, IntoRawFd};

    use crate::{Device, DeviceMemoryResource, Error, SharingError};

    /// A driver that reports a successful export and leaves the slot at -1 gave no descriptor:
    /// an error, where `OwnedFd::from_raw_fd(-1)` panicked.
    #[test]
    fn an_export_that_gives_no_descriptor_is_an_error() {
        for raw in [-1, -2] {
            // SAFETY: a negative descriptor is refused before anything owns it.
            let error = unsafe { super::exported_fd(raw) }.unwrap_err();
            let Error::Io { source, .. } = &error else { panic!("expected an I/O error, got {error:?}") };
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidData, "{error}");
        }
        let raw = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        // SAFETY: `raw` was just opened and is given up here.
        let fd = unsafe { super::exported_fd(raw) }.unwrap();
        assert_eq!(fd.as_raw_fd(), raw);
    }

    /// A device pool that another device was granted reaches two devices, as an import that
    /// inherited its exporter's grants would (undocumented either way): neither reading of the
    /// table names one owner, so it is refused rather than guessed. The pool is located here as
    /// an imported one would be.
    #[test]
    fn a_pool_several_devices_reach_is_no_shareable_kind() {
        cuda_sim::testing::in_simulated_machine(
            "pool::shareable::tests::a_pool_several_devices_reach_is_no_shareable_kind",
            &[("CUDA_SIM_DEVICES", "2")],
            || {
                if !cuda_sim::testing::simulator_only("two devices that reach one device pool") {
                    return;
                }
                cuda_sim::testing::driver().expect("the test driver loads");
                let pool = DeviceMemoryResource::new(Device::new(0).unwrap(), Default::default()).unwrap();
                pool.pool().add_peer(Device::new(1).unwrap()).unwrap();
                let error = pool.pool().locate_imported().unwrap_err();
                assert!(
                    matches!(error, Error::Sharing(SharingError::UnsupportedImportedPool { reachable_devices: 2 })),
                    "{error}"
                );
                assert!(error.to_string().contains("share device or pinned memory pools only"), "{error}");
            },
        );
    }
}
