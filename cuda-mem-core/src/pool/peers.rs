//! Who can reach a pool's memory: each device's access (`cuMemPoolGetAccess`), the peer set of a
//! device pool (`cuMemPoolSetAccess`), a pinned pool's grant to every device, and the revocation
//! an owned pool makes before it is destroyed.

use std::collections::BTreeSet;

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUmemAccess_flags, CUmemAccessDesc, CUmemLocation, CUmemLocationType};

use super::MemoryPool;
use crate::access::Access;
use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, Result};

fn device_location(device: Device) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() }
}

impl MemoryPool {
    /// The access `location` has to the pool's memory, as the driver reports it now.
    fn access_from(&self, mut location: CUmemLocation) -> Result<Access> {
        let d = driver()?;
        let mut flags = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE;
        // SAFETY: `flags` and `location` are valid for the call.
        unsafe { cu_call!(d, cuMemPoolGetAccess(&mut flags, self.handle(), &mut location)) }?;
        Ok(Access::from_raw(flags))
    }

    /// The access `device` has to the pool's memory, as the driver reports it now.
    ///
    /// # Errors
    /// If the driver call fails.
    #[doc(alias = "DMR_mempool_get_access")]
    pub fn access(&self, device: Device) -> Result<Access> {
        self.access_from(device_location(device))
    }

    /// The access the host CPU has to the pool's memory (read-write for host pools).
    #[cfg(unix)]
    pub(super) fn host_access(&self) -> Result<Access> {
        self.access_from(CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 })
    }

    fn owner_or_error(&self) -> Result<Device> {
        self.owner().ok_or(Error::PeerAccessNeedsDevicePool)
    }

    /// The devices other than the owner that have read-write access, read from the driver (so
    /// two wrappers of one shared pool always agree).
    ///
    /// # Errors
    /// - [`Error::PeerAccessNeedsDevicePool`] for pools that are not device pools.
    /// - Driver errors.
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
    /// - [`Error::PeerAccess`] naming the devices that cannot be peers.
    /// - Driver errors.
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
            to_add.iter().map(|&p| (p, Access::ReadWrite)).chain(to_remove.iter().map(|&p| (p, Access::None))),
        )
    }

    /// Sets the access of each device in `changes`, in one driver call (none for no change).
    fn set_access(&self, changes: impl IntoIterator<Item = (Device, Access)>) -> Result<()> {
        let descs: Vec<CUmemAccessDesc> = changes
            .into_iter()
            .map(|(device, access)| CUmemAccessDesc { location: device_location(device), flags: access.raw() })
            .collect();
        if descs.is_empty() {
            return Ok(());
        }
        let d = driver()?;
        // SAFETY: `descs` holds `descs.len()` initialized descriptors for the call's duration.
        unsafe { cu_call!(d, cuMemPoolSetAccess(self.handle(), descs.as_ptr(), descs.len())) }?;
        for _desc in &descs {
            crate::memory_event!(
                DEBUG,
                pool = %hex(self.handle()),
                device = _desc.location.id,
                access = ?Access::from_raw(_desc.flags),
                "peer access changed"
            );
        }
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
                lacking.push((device, Access::ReadWrite));
            }
        }
        self.set_access(lacking)
    }

    /// Revokes every peer's access, one call per device (never the owner), so that the driver
    /// does not hand the old access to a pool that reuses this handle (nvbug 5698116).
    pub(super) fn revoke_all_peers(&self) -> Result<()> {
        let Some(owner) = self.owner() else {
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
