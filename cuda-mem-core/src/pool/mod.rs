//! `MemoryPool`: a driver memory pool (owned or not), one file per concern:
//!
//! - here: the type, creating it (or finding a current pool), destroying it, allocating and
//!   freeing;
//! - [`kind`]: [`PoolKind`], what memory a pool holds (device, pinned or managed);
//! - [`attributes`]: usage, high-water marks, release threshold, reuse policies, trimming;
//! - [`peers`]: each device's access and the peer set of a device pool;
//! - [`sharing`]: which pool handles this process owns, exporting an allocation;
//! - `shareable` (Unix only): the shareable file descriptor, importing a pool from one (and
//!   where an imported pool's memory lives);
//! - [`imports`]: mapping another process's allocations, counted, since the driver does not
//!   count them, and the size of a mapped range;
//! - [`live_count`]: the live allocations made through a pool, counted per thread.
//!
//! The pool resources ([`DeviceMemoryResource`](crate::DeviceMemoryResource),
//! [`PinnedMemoryResource`](crate::PinnedMemoryResource),
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource)) each hold one and expose it through
//! `pool()`; [`MemoryResource::memory_pool`](crate::MemoryResource::memory_pool) finds it behind
//! any resource. A buffer's cached export data, and [`MemoryPool::export_buffer`] which reads
//! it, are the buffer's (`buffer/export.rs`): the pool knows nothing of buffers.

mod attributes;
mod imports;
mod kind;
mod live_count;
mod peers;
#[cfg(unix)]
mod shareable;
mod sharing;

use cuda_mem_sys::types::{CUmemLocation, CUmemPoolProps, CUmemoryPool};
use cuda_mem_sys::{Driver, cu_call};

pub use attributes::{PoolAttributes, PoolUsage, ReusePolicy};
pub use imports::{import_holders, import_pending_waits, mapped_range_size};
pub use kind::PoolKind;
#[cfg(unix)]
pub use shareable::ShareableHandle;

use crate::device::Device;
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::drop_errors::on_drop;
use crate::error::{Error, Result, SharingError};
use crate::ffi;
use crate::stream::Stream;

/// The size of the driver's export data for one allocation (`CUmemPoolPtrExportData`).
pub const EXPORT_DATA_LEN: usize = 64;

/// Makes a context current for calls that need one but take no stream: the pool's device's, or
/// device 0's for host pools (any context serves them).
fn bind_for(owner: Option<Device>) -> Result<()> {
    let device = match owner {
        Some(device) => device,
        None => Device::new(0)?,
    };
    crate::context::bind(device)
}

/// A driver memory pool. An owned pool is destroyed when dropped (after its buffers, which keep
/// their resource, and so the pool, alive), having first revoked every peer's access.
#[derive(Debug)]
pub struct MemoryPool {
    handle: CUmemoryPool,
    owned: bool,
    /// The driver it came from, kept so that allocating and freeing need not look it up.
    driver: &'static Driver,
    /// What memory it holds (for an imported pool, as the driver reports it).
    kind: PoolKind,
    /// Whether it was created shareable by file descriptor.
    pub(crate) shareable: bool,
    /// Whether it was imported from another process (it then cannot allocate).
    pub(crate) imported: bool,
    /// The shareable handle, exported once on first request (or the one it was imported from).
    #[cfg(unix)]
    pub(crate) handle_once: std::sync::OnceLock<ShareableHandle>,
    /// This process's claim on the handle, for owned pools (see [`sharing`]): no second value
    /// may own it. Let go right after the pool is destroyed, under the same lock.
    claim: Option<sharing::HandleClaim>,
    /// The cap it was created with (`None`: none of its own, or not created here), for the
    /// out-of-memory error.
    max_size: Option<usize>,
    /// Allocations made through this value and not yet freed: the one cost [`MemoryPool::usage`]
    /// adds to allocation and freeing (a per-thread slot, no locked instruction; see
    /// [`live_count`]), as the driver does not count them.
    live_allocations: live_count::LiveCount,
}

// SAFETY: the handle is an opaque token that only the driver interprets (Rust never dereferences
// it), and the driver API lets any thread use a pool handle: its pool functions are thread-safe.
// An owned pool is destroyed only in `Drop`, once, which needs the value itself (buffers keep
// their resource, and so the pool, alive until they are freed), so no thread can use the handle
// through this type after that.
unsafe impl Send for MemoryPool {}
// SAFETY: as for `Send`: `&MemoryPool` only passes the handle to thread-safe driver functions;
// the lazily set fields are a `OnceLock` and the claim, set before the value is shared.
unsafe impl Sync for MemoryPool {}

impl MemoryPool {
    /// Creates an owned pool.
    pub(crate) fn create(props: &CUmemPoolProps, kind: PoolKind) -> Result<MemoryPool> {
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        let claim = {
            let _turnover = sharing::handle_turnover();
            // SAFETY: `handle` is a valid out-pointer and `props` a fully initialized structure.
            unsafe { cu_call!(d, cuMemPoolCreate(&mut handle, props)) }?;
            sharing::HandleClaim::created(handle)
        };
        let shareable = props.handleTypes.0 != 0;
        let mut pool = MemoryPool::new(d, handle, true, kind, shareable, false);
        pool.claim = Some(claim);
        pool.max_size = (props.maxSize != 0).then_some(props.maxSize);
        crate::memory_event!(
            DEBUG,
            pool = %hex(handle),
            kind = %pool_kind(kind),
            max_size = pool.max_size,
            ipc_enabled = shareable,
            "pool created"
        );
        Ok(pool)
    }

    pub(crate) fn new(
        driver: &'static Driver,
        handle: CUmemoryPool,
        owned: bool,
        kind: PoolKind,
        shareable: bool,
        imported: bool,
    ) -> MemoryPool {
        MemoryPool {
            handle,
            owned,
            driver,
            kind,
            shareable,
            imported,
            #[cfg(unix)]
            handle_once: std::sync::OnceLock::new(),
            claim: None,
            max_size: None,
            live_allocations: live_count::LiveCount::default(),
        }
    }

    /// Wraps a pool this value does not own.
    fn borrowed(driver: &'static Driver, handle: CUmemoryPool, kind: PoolKind) -> MemoryPool {
        MemoryPool::new(driver, handle, false, kind, false, false)
    }

    /// The device's current pool (`cuDeviceGetMemPool`), not owned: shared with every other
    /// user of it in the process.
    pub(crate) fn current_of_device(device: Device) -> Result<MemoryPool> {
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGetMemPool(&mut handle, device.raw())) }?;
        Ok(MemoryPool::borrowed(d, handle, PoolKind::Device(device)))
    }

    /// The current pool of `kind`'s memory at `location` (`cuMemGetMemPool`, CUDA 13), not
    /// owned: shared with every other user of it in the process.
    pub(crate) fn current(mut location: CUmemLocation, kind: PoolKind) -> Result<MemoryPool> {
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `handle` and `location` are valid for the call.
        unsafe { cu_call!(d, cuMemGetMemPool(&mut handle, &mut location, kind.allocation_type())) }?;
        Ok(MemoryPool::borrowed(d, handle, kind))
    }

    /// The raw handle.
    #[inline]
    pub fn handle(&self) -> CUmemoryPool {
        self.handle
    }

    /// Whether dropping this value destroys the pool.
    #[doc(alias = "is_handle_owned")]
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// What memory the pool holds: device memory of its device, pinned host memory, or managed
    /// memory. For an imported pool, what the driver reports, not what the exporter said.
    pub fn kind(&self) -> PoolKind {
        self.kind
    }

    /// The device whose memory it is, for device pools.
    pub fn owner(&self) -> Option<Device> {
        self.kind.device()
    }

    /// Allocates from the pool on `stream`. A capturing stream is refused: the pool would
    /// allocate outside the graph.
    #[inline(always)]
    pub(crate) fn allocate(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        if self.imported {
            return Err(Error::Sharing(SharingError::ImportedPoolAllocation));
        }
        let d = self.driver;
        stream.bind_if_default()?;
        if stream.refuses_allocation()? {
            return Err(Error::CapturingStream);
        }
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the pool and stream handles are live.
        let allocated = unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut ptr, size, self.handle(), stream.handle())) };
        if let Err(error) = allocated {
            return Err(self.allocation_failed(error, size));
        }
        self.live_allocations.add();
        crate::memory_event!(
            TRACE,
            size,
            ptr = %hex(ptr),
            pool = %hex(self.handle),
            stream = %hex(stream.handle()),
            "allocate"
        );
        Ok(ptr)
    }

    /// Frees pool memory on `stream`.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate_raw`](crate::MemoryResource::deallocate_raw).
    #[inline(always)]
    pub(crate) unsafe fn deallocate(&self, ptr: DevicePtr, _size: usize, stream: &Stream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_async(ptr, stream) }?;
        self.live_allocations.sub();
        crate::memory_event!(
            TRACE,
            size = _size,
            ptr = %hex(ptr),
            pool = %hex(self.handle),
            stream = %hex(stream.handle()),
            "free"
        );
        Ok(())
    }

    /// Frees (or, for an import, unmaps) pool memory on `stream`, uncounted.
    ///
    /// # Safety
    /// `ptr` is live memory of this pool (allocated or imported through it) that nothing uses
    /// after `stream`'s work so far, freed once.
    #[inline(always)]
    unsafe fn free_async(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        let d = self.driver;
        stream.bind_if_default()?;
        // SAFETY: the caller guarantees `ptr` is live memory of this pool, freed once.
        unsafe { ffi::mem_free_async(d, ptr, stream.handle()) }?;
        Ok(())
    }
}

impl Drop for MemoryPool {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // A failed revocation is recorded and the pool destroyed all the same: leaving it would
        // keep its memory for the life of the process, a worse outcome than the stale access
        // the revocation guards against.
        on_drop("MemoryPool (revoking peer access)", || self.revoke_all_peers());
        on_drop("MemoryPool", || self.destroy());
    }
}

impl MemoryPool {
    /// Destroys the owned pool, once (from `Drop`), and lets go of the claim on its handle under
    /// the same lock: the handle may name the next pool as soon as it is destroyed (see
    /// `sharing::handle_turnover`).
    fn destroy(&mut self) -> Result<()> {
        let turnover = sharing::handle_turnover();
        // SAFETY: an owned pool handle, destroyed once, here; every buffer from it is gone
        // (buffers keep their resource, and so this pool, alive).
        let destroyed = driver().and_then(|d| Ok(unsafe { cu_call!(d, cuMemPoolDestroy(self.handle)) }?));
        drop(self.claim.take());
        drop(turnover);
        destroyed?;
        crate::memory_event!(DEBUG, pool = %hex(self.handle), "pool destroyed");
        Ok(())
    }
}
