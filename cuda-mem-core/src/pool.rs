//! `MemoryPool`: a driver memory pool (owned or not), its attributes, and peer access.
//!
//! The pool resources ([`DeviceMemoryResource`](crate::DeviceMemoryResource),
//! [`PinnedMemoryResource`](crate::PinnedMemoryResource),
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource)) each hold one and expose it through
//! `pool()`.

use std::collections::BTreeSet;
use std::ffi::c_void;

use cuda_sys::cu_call;
use cuda_sys::types::{
    CUmemAccess_flags, CUmemAccessDesc, CUmemLocation, CUmemLocationType, CUmemPool_attribute, CUmemPoolProps,
    CUmemoryPool,
};

use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};
use crate::memory_resource::DevicePtr;
use crate::stream::Stream;

/// A snapshot of a pool's attributes (`cuMemPoolGetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolAttributes {
    /// Reuse memory freed on another stream once the free's event dependencies are met.
    pub reuse_follow_event_dependencies: bool,
    /// Reuse memory freed on another stream when the free is known complete.
    pub reuse_allow_opportunistic: bool,
    /// Reuse memory freed on another stream by inserting dependencies.
    pub reuse_allow_internal_dependencies: bool,
    /// Reserved bytes the pool keeps at synchronization points instead of returning them.
    pub release_threshold: u64,
    /// Bytes the pool holds from the system.
    pub reserved_mem_current: u64,
    /// High-water mark of `reserved_mem_current` since creation or the last reset.
    pub reserved_mem_high: u64,
    /// Bytes in live allocations.
    pub used_mem_current: u64,
    /// High-water mark of `used_mem_current` since creation or the last reset.
    pub used_mem_high: u64,
}

/// One of the pool's reuse policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReusePolicy {
    /// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`.
    FollowEventDependencies,
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`.
    AllowOpportunistic,
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`.
    AllowInternalDependencies,
}

impl ReusePolicy {
    fn attribute(self) -> CUmemPool_attribute {
        match self {
            ReusePolicy::FollowEventDependencies => {
                CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            }
            ReusePolicy::AllowOpportunistic => CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
            ReusePolicy::AllowInternalDependencies => {
                CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
            }
        }
    }
}

/// The access a device has to a pool's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read and write.
    ReadWrite,
    /// Read only.
    Read,
    /// None.
    None,
}

impl Access {
    fn from_raw(flags: CUmemAccess_flags) -> Access {
        match flags {
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE => Access::ReadWrite,
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ => Access::Read,
            _ => Access::None,
        }
    }
}

/// A driver memory pool. An owned pool is destroyed when dropped (after its buffers, which keep
/// their resource, and so the pool, alive), having first revoked every peer's access.
#[derive(Debug)]
pub struct MemoryPool {
    handle: CUmemoryPool,
    owned: bool,
    /// The device whose memory it is, for device pools.
    owner: Option<Device>,
    /// Whether it was created shareable by file descriptor.
    pub(crate) shareable: bool,
    /// Whether it was imported from another process (it then cannot allocate).
    pub(crate) imported: bool,
    /// The shareable handle, exported once on first request (or the one it was imported from).
    pub(crate) handle_once: std::sync::OnceLock<crate::sharing::ShareableHandle>,
}

// SAFETY: the handle is an opaque token that only the driver interprets (Rust never dereferences
// it), and the driver API lets any thread use a pool handle: its pool functions are thread-safe.
// An owned pool is destroyed only in `Drop`, once, which needs the value itself (buffers keep
// their resource, and so the pool, alive until they are freed), so no thread can use the handle
// through this type after that.
unsafe impl Send for MemoryPool {}
// SAFETY: as for `Send`: `&MemoryPool` only passes the handle to thread-safe driver functions;
// the one lazily set field is a `OnceLock`.
unsafe impl Sync for MemoryPool {}

fn device_location(device: Device) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() }
}

impl MemoryPool {
    /// Creates an owned pool.
    pub(crate) fn create(props: &CUmemPoolProps, owner: Option<Device>) -> Result<MemoryPool> {
        let d = driver()?;
        let mut handle: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer and `props` a fully initialized structure.
        unsafe { cu_call!(d, cuMemPoolCreate(&mut handle, props)) }?;
        let shareable = props.handleTypes.0 != 0;
        Ok(MemoryPool::new(handle, true, owner, shareable, false))
    }

    pub(crate) fn new(
        handle: CUmemoryPool,
        owned: bool,
        owner: Option<Device>,
        shareable: bool,
        imported: bool,
    ) -> MemoryPool {
        MemoryPool { handle, owned, owner, shareable, imported, handle_once: std::sync::OnceLock::new() }
    }

    /// Wraps a pool this value does not own (a device's current pool, say).
    pub(crate) fn borrowed(handle: CUmemoryPool, owner: Option<Device>) -> MemoryPool {
        MemoryPool::new(handle, false, owner, false, false)
    }

    /// The raw handle.
    #[inline]
    pub fn handle(&self) -> CUmemoryPool {
        self.handle
    }

    /// Whether dropping this value destroys the pool.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The device whose memory it is, for device pools.
    pub fn owner(&self) -> Option<Device> {
        self.owner
    }

    /// Allocates from the pool on `stream`. A capturing stream is refused: the pool would
    /// allocate outside the graph.
    #[inline]
    pub(crate) fn allocate(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        if self.imported {
            return Err(Error::InvalidState(
                "cannot allocate from a pool imported from another process: allocate in the exporting \
                 process and share the buffer"
                    .to_string(),
            ));
        }
        let d = driver()?;
        stream.bind_if_default()?;
        if stream.is_capturing_bound()? {
            return Err(Error::InvalidState(
                "memory pools cannot allocate on a capturing stream: allocate before capture begins, \
                 or on a stream that is not capturing"
                    .to_string(),
            ));
        }
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the pool and stream handles are live.
        unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut ptr, size, self.handle(), stream.handle())) }?;
        Ok(ptr)
    }

    /// Frees pool memory on `stream`.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate_raw`](crate::MemoryResource::deallocate_raw).
    #[inline]
    pub(crate) unsafe fn deallocate(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        let d = driver()?;
        stream.bind_if_default()?;
        // SAFETY: the caller guarantees `ptr` is a live allocation of this pool, freed once.
        unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream.handle())) }?;
        Ok(())
    }

    fn get(&self, attribute: CUmemPool_attribute) -> Result<u64> {
        let d = driver()?;
        let mut value = 0u64;
        // SAFETY: `value` has room for the largest attribute type (`cuuint64_t`); the 32-bit
        // reuse flags are read from its low bytes below.
        unsafe { cu_call!(d, cuMemPoolGetAttribute(self.handle(), attribute, (&raw mut value).cast::<c_void>())) }?;
        Ok(value)
    }

    fn get_flag(&self, attribute: CUmemPool_attribute) -> Result<bool> {
        // The reuse attributes are `int`: only the first four bytes were written.
        Ok(self.get(attribute)? as u32 != 0)
    }

    fn set_u64(&self, attribute: CUmemPool_attribute, mut value: u64) -> Result<()> {
        let d = driver()?;
        // SAFETY: `value` is a valid `cuuint64_t` for the call's duration.
        unsafe { cu_call!(d, cuMemPoolSetAttribute(self.handle(), attribute, (&raw mut value).cast::<c_void>())) }?;
        Ok(())
    }

    /// Reads every attribute.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn attributes(&self) -> Result<PoolAttributes> {
        use CUmemPool_attribute as A;
        Ok(PoolAttributes {
            reuse_follow_event_dependencies: self.get_flag(A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES)?,
            reuse_allow_opportunistic: self.get_flag(A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC)?,
            reuse_allow_internal_dependencies: self.get_flag(A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)?,
            release_threshold: self.get(A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)?,
            reserved_mem_current: self.get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_mem_high: self.get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used_mem_current: self.get(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_mem_high: self.get(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }

    /// The release threshold: reserved bytes kept at synchronization points.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn release_threshold(&self) -> Result<u64> {
        self.get(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Sets the release threshold (`u64::MAX` keeps everything).
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set_u64(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes)
    }

    /// Turns one reuse policy on or off.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn set_reuse(&self, policy: ReusePolicy, enabled: bool) -> Result<()> {
        let d = driver()?;
        let mut value = i32::from(enabled);
        // SAFETY: the reuse attributes take an `int`, which `value` is.
        unsafe {
            cu_call!(d, cuMemPoolSetAttribute(self.handle(), policy.attribute(), (&raw mut value).cast::<c_void>()))
        }?;
        Ok(())
    }

    /// Resets both high-water marks to the current values.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn reset_peak_usage(&self) -> Result<()> {
        self.set_u64(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
        self.set_u64(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0)
    }

    /// Returns reserved memory to the system until at most `keep` bytes (or what is in use)
    /// remain.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        let d = driver()?;
        // SAFETY: a live pool handle.
        unsafe { cu_call!(d, cuMemPoolTrimTo(self.handle(), keep)) }?;
        Ok(())
    }

    /// The access `device` has to the pool's memory, as the driver reports it now.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn access(&self, device: Device) -> Result<Access> {
        let d = driver()?;
        let mut flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        let mut location = device_location(device);
        // SAFETY: `flags` and `location` are valid for the call.
        unsafe { cu_call!(d, cuMemPoolGetAccess(&mut flags, self.handle(), &mut location)) }?;
        Ok(Access::from_raw(flags))
    }

    fn owner_or_error(&self) -> Result<Device> {
        self.owner.ok_or_else(|| Error::NotSupported("peer access applies to device pools only".to_string()))
    }

    /// The devices other than the owner that have read-write access, read from the driver (so
    /// two wrappers of one shared pool always agree).
    ///
    /// # Errors
    /// [`Error::NotSupported`] for pools that are not device pools; driver errors.
    pub fn peer_accessible_by(&self) -> Result<BTreeSet<Device>> {
        let owner = self.owner_or_error()?;
        let mut peers = BTreeSet::new();
        for device in Device::all()? {
            if device != owner && self.access(device)? == Access::ReadWrite {
                peers.insert(device);
            }
        }
        Ok(peers)
    }

    /// Makes exactly `peers` (the owner ignored) have read-write access, in one driver call that
    /// carries only the changes (none if nothing changes). A device that cannot access the
    /// owner's memory is refused before anything changes, with every such device named.
    ///
    /// # Errors
    /// [`Error::PeerAccess`] naming the devices that cannot be peers; driver errors.
    pub fn set_peer_accessible_by(&self, peers: impl IntoIterator<Item = Device>) -> Result<()> {
        let owner = self.owner_or_error()?;
        let target: BTreeSet<Device> = peers.into_iter().filter(|&p| p != owner).collect();
        let current = self.peer_accessible_by()?;
        let to_add: Vec<Device> = target.difference(&current).copied().collect();
        let to_remove: Vec<Device> = current.difference(&target).copied().collect();
        self.apply(owner, &to_add, &to_remove)
    }

    /// Gives `peer` read-write access (nothing if it is the owner or already has it).
    ///
    /// # Errors
    /// As [`MemoryPool::set_peer_accessible_by`].
    pub fn add_peer(&self, peer: Device) -> Result<()> {
        let owner = self.owner_or_error()?;
        if peer == owner || self.access(peer)? == Access::ReadWrite {
            return Ok(());
        }
        self.apply(owner, &[peer], &[])
    }

    /// Revokes `peer`'s access (nothing if it is the owner or has none).
    ///
    /// # Errors
    /// Driver errors.
    pub fn remove_peer(&self, peer: Device) -> Result<()> {
        let owner = self.owner_or_error()?;
        if peer == owner || self.access(peer)? == Access::None {
            return Ok(());
        }
        self.apply(owner, &[], &[peer])
    }

    fn apply(&self, owner: Device, to_add: &[Device], to_remove: &[Device]) -> Result<()> {
        let mut refused = Vec::new();
        for &peer in to_add {
            if !peer.can_access_peer(owner)? {
                refused.push(peer.ordinal());
            }
        }
        if !refused.is_empty() {
            return Err(Error::PeerAccess { owner: owner.ordinal(), peers: refused });
        }
        self.set_access(
            to_add
                .iter()
                .map(|&p| (p, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
                .chain(to_remove.iter().map(|&p| (p, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE))),
        )
    }

    /// Sets the access of each device in `changes`, in one driver call (none for no change).
    fn set_access(&self, changes: impl IntoIterator<Item = (Device, CUmemAccess_flags)>) -> Result<()> {
        let descs: Vec<CUmemAccessDesc> = changes
            .into_iter()
            .map(|(device, flags)| CUmemAccessDesc { location: device_location(device), flags })
            .collect();
        if descs.is_empty() {
            return Ok(());
        }
        let d = driver()?;
        // SAFETY: `descs` holds `descs.len()` initialized descriptors for the call's duration.
        unsafe { cu_call!(d, cuMemPoolSetAccess(self.handle(), descs.as_ptr(), descs.len())) }?;
        Ok(())
    }

    /// Gives every device read-write access to a pinned host pool's memory (one driver call, for
    /// the devices that lack it). `cuda.h`: a host pool's memory is accessible from the host CPU
    /// only until access is set; a device copy or memset into it fails
    /// (`CUDA_ERROR_INVALID_VALUE`, seen on an H100 with driver 580).
    pub(crate) fn grant_all_devices(&self) -> Result<()> {
        let mut lacking = Vec::new();
        for device in Device::all()? {
            if self.access(device)? != Access::ReadWrite {
                lacking.push((device, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE));
            }
        }
        self.set_access(lacking)
    }

    /// Revokes every peer's access, one call per device (never the owner), so that the driver
    /// does not hand the old access to a pool that reuses this handle (nvbug 5698116).
    fn revoke_all_peers(&self) -> Result<()> {
        let Some(owner) = self.owner else {
            return Ok(());
        };
        let mut first_error = None;
        for device in Device::all()? {
            if device == owner {
                continue;
            }
            let result = self.access(device).and_then(|access| match access {
                Access::None => Ok(()),
                _ => self.apply(owner, &[], &[device]),
            });
            if let Err(error) = result {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
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
        if let Err(error) = self.revoke_all_peers() {
            crate::drop_errors::record("MemoryPool (revoking peer access)", error);
        }
        let destroy = || -> Result<()> {
            let d = driver()?;
            // SAFETY: an owned pool handle, destroyed once, here; every buffer from it is gone
            // (buffers keep their resource, and so this pool, alive).
            unsafe { cu_call!(d, cuMemPoolDestroy(self.handle())) }?;
            Ok(())
        };
        if let Err(error) = destroy() {
            crate::drop_errors::record("MemoryPool", error);
        }
    }
}

/// Implements [`MemoryResource`](crate::MemoryResource) for a pool resource (a struct with a
/// `pool: MemoryPool` field): allocation and freeing go to the pool; the memory is always
/// device-accessible; host accessibility, the device and managedness are given.
macro_rules! pool_resource {
    ($ty:ty, host_accessible: $host:expr, device: |$this:ident| $device:expr $(, managed: $managed:expr)?) => {
        // SAFETY: the pool hands out `size` valid bytes per allocation until they are freed;
        // the accessibility the caller states is the pool's memory's.
        unsafe impl $crate::MemoryResource for $ty {
            fn allocate_raw(&self, size: usize, stream: &$crate::Stream) -> $crate::Result<$crate::DevicePtr> {
                self.pool.allocate(size, stream)
            }

            unsafe fn deallocate_raw(
                &self,
                ptr: $crate::DevicePtr,
                _size: usize,
                stream: &$crate::Stream,
            ) -> $crate::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.pool.deallocate(ptr, stream) }
            }

            fn is_device_accessible(&self) -> bool {
                true
            }

            fn is_host_accessible(&self) -> bool {
                $host
            }

            fn device(&self) -> Option<$crate::Device> {
                let $this = self;
                $device
            }

            $(
                fn is_managed(&self) -> bool {
                    $managed
                }
            )?

            fn pool(&self) -> Option<&$crate::MemoryPool> {
                Some(&self.pool)
            }

            fn may_be_written_externally(&self) -> bool {
                self.pool.is_shareable()
            }
        }
    };
}
pub(crate) use pool_resource;
