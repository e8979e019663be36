//! `MappedMemoryResource`: a pool imported from another process.
//!
//! Documented on [`MappedMemoryResource`].

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use cuda_mem_core::{Buffer, Device, DevicePtr, MemoryPool, MemoryResource, PoolKind, PoolResource, Stream};
use uuid::Uuid;

use crate::error::{IpcError, ProtocolError, Result};
use crate::peer::PeerId;
use crate::registry::Registry;
use crate::wire::BufferDescriptor;

/// A pool imported from another process.
///
/// It cannot allocate; it maps the allocations the exporting process shares (counted by its
/// pool, [`MemoryPool::import_allocation`]) into buffers that keep it, and so its file
/// descriptor, alive. It may be dropped before those buffers.
///
/// One pool has one importer per process: a driver may answer a second import of a pool with
/// the handle of the first, and two owners of one handle would destroy it under each other. So
/// [`MappedMemoryResource::from_fd`] returns the existing import of a UUID (one a peer named on
/// a channel only when the driver confirms it is the same pool), and an import the driver
/// answers with a pool this process already owns under another UUID is refused
/// ([`IpcError::PoolAlreadyImported`]). A pool that one process sends on several channels is
/// imported once: imports from peers are kept by the sending process (as the kernel vouches
/// for it, see [`IpcChannel`](crate::IpcChannel), *Pools*) and the UUID it named the pool with.
/// What kind of memory the pool holds, and on which device, is asked of the driver, not taken
/// from the exporter.
#[derive(Debug)]
pub struct MappedMemoryResource {
    pool: MemoryPool,
    uuid: Uuid,
    /// Registered because a peer named it `uuid` on a channel, not by this program's own import:
    /// a UUID is the peer's claim, so [`MappedMemoryResource::from_owned_fd`] trusts such an
    /// entry only when the driver confirms it is the same pool.
    named_by_peer: bool,
    /// This import's number in the process, never reused: two imports that a peer (or two
    /// peers) named with one UUID are two pools, and a channel that sends one of them must not
    /// take the other for it (a pool handle could be reused once its import is gone).
    serial: u64,
    /// The process that sent the pool under `uuid`, where the kernel vouches for it: every
    /// import from it under `uuid` is of the pool it names so.
    exporter: Option<PeerId>,
}

/// The pools imported from peers the kernel identifies, by that process and the UUID it named
/// each with: one import per pool, whichever of the process's channels it comes on.
static PEER_IMPORTS: Mutex<PeerImports> = Mutex::new(PeerImports { entries: BTreeMap::new(), sweep_at: MIN_SWEEP });

/// Sweep out dead entries of [`PEER_IMPORTS`] when an insertion makes it this large (at least).
const MIN_SWEEP: usize = 16;

/// [`PEER_IMPORTS`]' map: weak, so that it keeps no import alive.
struct PeerImports {
    entries: BTreeMap<(PeerId, Uuid), Weak<MappedMemoryResource>>,
    sweep_at: usize,
}

impl PeerImports {
    /// The live import `exporter` sent under `uuid`.
    fn get(&self, exporter: PeerId, uuid: Uuid) -> Option<Arc<MappedMemoryResource>> {
        self.entries.get(&(exporter, uuid)).and_then(Weak::upgrade)
    }

    /// Keeps `resource` as what `exporter` sent under `uuid`.
    fn insert(&mut self, exporter: PeerId, uuid: Uuid, resource: &Arc<MappedMemoryResource>) {
        self.entries.insert((exporter, uuid), Arc::downgrade(resource));
        if self.entries.len() >= self.sweep_at {
            self.entries.retain(|_, weak| weak.strong_count() > 0);
            self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
        }
    }

    /// A live import from a peer under `uuid` whose pool handle is `handle`.
    fn with_handle(&self, uuid: Uuid, handle: usize) -> Option<Arc<MappedMemoryResource>> {
        self.entries
            .iter()
            .filter(|((_, u), _)| *u == uuid)
            .filter_map(|(_, weak)| weak.upgrade())
            .find(|resource| resource.pool.handle() as usize == handle)
    }
}

fn peer_imports() -> MutexGuard<'static, PeerImports> {
    // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
    PEER_IMPORTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every mapped resource of the process, by the UUID of the resource it maps.
static REGISTRY: Registry<MappedMemoryResource> = Registry::new();

/// The process-wide registry of mapped resources: the first live import of each UUID (an entry
/// goes when its resource goes).
#[doc(alias = "register")]
pub fn registry() -> &'static Registry<MappedMemoryResource> {
    &REGISTRY
}

/// The registered mapped resource with this UUID, which must hold the `expected` kind of memory
/// (device memory of the expected device, or pinned host memory), as the driver reports it.
///
/// The entry is this program's own import ([`MappedMemoryResource::from_fd`]), or the first
/// import of a pool a peer sent on a channel under this UUID (the peer's claim: a program that
/// takes pools from peers it does not trust imports them with `from_fd`, which a peer's entry
/// does not survive unconfirmed).
///
/// # Errors
///
/// - [`IpcError::UnknownResource`]: none is registered (or it was dropped).
/// - [`IpcError::WrongResourceKind`]: it holds another kind of memory, or another device's.
#[doc(alias = "from_registry")]
pub fn lookup(uuid: Uuid, expected: PoolKind) -> Result<Arc<MappedMemoryResource>> {
    let resource = registry().get(uuid)?;
    let found = resource.kind();
    if found != expected {
        return Err(IpcError::WrongResourceKind { uuid, expected, found });
    }
    Ok(resource)
}

/// Held while importing a pool, so that two threads importing one pool cannot both own it.
fn importing() -> MutexGuard<'static, ()> {
    static IMPORTING: Mutex<()> = Mutex::new(());
    IMPORTING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A failed import of `uuid` as this crate reports it: a pool this process owns already is the
/// peer's (or caller's) doing, named as such.
fn refused(error: cuda_mem_core::Error, uuid: Uuid) -> IpcError {
    match error {
        already @ cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::PoolAlreadyOwned { .. }) => {
            IpcError::PoolAlreadyImported { uuid, source: already }
        }
        other => other.into(),
    }
}

/// Whether the driver refused what a peer sent as such: the descriptor or export data is not
/// what it must be (`CUDA_ERROR_INVALID_VALUE`, `CUDA_ERROR_INVALID_HANDLE`), rather than this
/// process's state (out of memory, no context, a driver that lacks the call).
fn refuses_the_peers_data(error: &cuda_mem_core::Error) -> bool {
    use cuda_mem_core::sys::types::CUresult;
    // Only a driver error's own code: one of the core library's own refusals that carries a
    // driver error deeper in its chain (as `PoolAlreadyOwned` does not) is not the peer's data.
    let cuda_mem_core::Error::Cuda(failed) = error else { return false };
    matches!(failed.code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_INVALID_HANDLE))
}

/// A failed import of a pool a peer sent under `uuid`, as this crate reports it: a descriptor
/// the driver refuses is the peer's error ([`IpcError::PoolImport`]); otherwise as [`refused`].
fn refused_from_peer(error: cuda_mem_core::Error, uuid: Uuid) -> IpcError {
    if refuses_the_peers_data(&error) { IpcError::PoolImport { uuid, source: error } } else { refused(error, uuid) }
}

impl MappedMemoryResource {
    /// Imports the pool behind `fd` (which this takes), exported by the resource `uuid`, and
    /// registers it; or, when this process has a live import of `uuid` already, returns that one
    /// (and closes `fd`). Device or pinned memory, and the device, are the driver's word.
    ///
    /// An import a peer registered by naming it `uuid` on a channel is returned only when the
    /// driver confirms `fd` is the same pool (it answers the import with that pool's handle);
    /// otherwise this import replaces it in the registry (the peer's channel keeps its own), so
    /// a peer that names another pool's UUID first never captures it.
    ///
    /// # Errors
    ///
    /// - [`IpcError::PoolAlreadyImported`]: the driver answers with a pool this process already
    ///   holds under another UUID (or its own pool).
    /// - [`IpcError::Core`]: the driver refuses the descriptor (it is not a pool, or of a kind this
    ///   process cannot map).
    #[doc(alias = "from_allocation_handle")]
    pub fn from_owned_fd(fd: OwnedFd, uuid: Uuid) -> Result<Arc<MappedMemoryResource>> {
        let _importing = importing();
        let registered = registry().get(uuid).ok();
        if let Some(existing) = registered.as_ref().filter(|r| !r.named_by_peer) {
            return Ok(Arc::clone(existing));
        }
        match (MappedMemoryResource::import(fd, uuid, false, None), registered) {
            // The driver answered with the peer-named import's own handle: the same pool.
            (
                Err(cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::PoolAlreadyOwned { handle })),
                Some(registered),
            ) if registered.pool.handle() as usize == handle => Ok(registered),
            (Ok(resource), registered) => {
                if registered.is_some() {
                    // Unconfirmed: this program's word outranks a peer's claim.
                    registry().remove(uuid);
                }
                Ok(registry().register(uuid, resource))
            }
            (Err(error), _) => Err(refused(error, uuid)),
        }
    }

    /// Imports the pool behind `fd`, duplicating it: the caller keeps the original. As
    /// [`MappedMemoryResource::from_owned_fd`], an existing import of `uuid` is returned.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: no descriptor can be duplicated.
    /// - As [`MappedMemoryResource::from_owned_fd`].
    #[doc(alias = "from_allocation_handle")]
    pub fn from_fd(fd: BorrowedFd<'_>, uuid: Uuid) -> Result<Arc<MappedMemoryResource>> {
        let owned = fd
            .try_clone_to_owned()
            .map_err(|source| IpcError::Io { context: "duplicating a pool's file descriptor", source })?;
        MappedMemoryResource::from_owned_fd(owned, uuid)
    }

    /// Imports the pool behind `fd` for a peer that named it `uuid`.
    ///
    /// Where the kernel vouches for the process that sent it (`exporter`), the import that
    /// process sent under `uuid` before (on any channel), while it lives, is the pool: it is
    /// returned and `fd` closed, with no driver call. Otherwise the pool is imported, trusting
    /// another import of `uuid` (this process's registered one, or one another peer sent) only
    /// when the driver confirms it is the same pool (the import answers with its handle). An
    /// import the driver cannot confirm (it gave this import a handle of its own) is left alone:
    /// the new import is returned, unregistered if another is registered, so a peer never
    /// reaches a pool another party sent under the same UUID.
    pub(crate) fn from_peer(fd: OwnedFd, uuid: Uuid, exporter: Option<PeerId>) -> Result<Arc<MappedMemoryResource>> {
        #[cfg(test)]
        test_hooks::waiting_to_import(uuid);
        let _importing = importing();
        if let Some(known) = exporter.and_then(|exporter| peer_imports().get(exporter, uuid)) {
            return Ok(known);
        }
        let registered = registry().get(uuid).ok();
        let resource = match (MappedMemoryResource::import(fd, uuid, true, exporter), registered) {
            // A handle of its own: whatever is registered stays, unconfirmed, and unused here.
            (Ok(resource), Some(_)) => resource,
            (Ok(resource), None) => registry().register(uuid, resource),
            // The driver answered with the handle of an import of `uuid` here: the same pool.
            (
                Err(cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::PoolAlreadyOwned { handle })),
                Some(registered),
            ) if registered.pool.handle() as usize == handle => registered,
            (
                Err(error @ cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::PoolAlreadyOwned { handle })),
                _,
            ) => peer_imports().with_handle(uuid, handle).ok_or_else(|| refused(error, uuid))?,
            (Err(error), _) => return Err(refused_from_peer(error, uuid)),
        };
        if let Some(exporter) = exporter {
            peer_imports().insert(exporter, uuid, &resource);
        }
        Ok(resource)
    }

    /// Imports the pool behind `fd` as `uuid`, unregistered; `named_by_peer` says who named it,
    /// and `exporter` which process sent it, if the kernel vouches for one.
    fn import(
        fd: OwnedFd,
        uuid: Uuid,
        named_by_peer: bool,
        exporter: Option<PeerId>,
    ) -> cuda_mem_core::Result<Arc<MappedMemoryResource>> {
        static SERIALS: AtomicU64 = AtomicU64::new(0);
        let pool = MemoryPool::import(fd, uuid.as_u128())?;
        cuda_mem_core::memory_event!(
            DEBUG,
            uuid = %uuid,
            pool = %hex(pool.handle()),
            kind = %pool_kind(pool.kind()),
            "resource imported"
        );
        let serial = SERIALS.fetch_add(1, Ordering::Relaxed);
        let resource = Arc::new(MappedMemoryResource { pool, uuid, named_by_peer, serial, exporter });
        cuda_mem_core::snapshot::register(&resource);
        Ok(resource)
    }

    /// Which pool this import is, where two imports share a UUID: the process that sent it, if
    /// the kernel vouches for one (every import it sent under this UUID is its one pool so
    /// named), else this import's number in the process (never reused).
    pub(crate) fn origin(&self) -> ImportOrigin {
        self.exporter.map_or(ImportOrigin::Serial(self.serial), ImportOrigin::Exporter)
    }

    /// The UUID of the exporting resource.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// Device or pinned memory, as the driver reports it
    /// ([`MemoryPool::kind`] of the imported pool).
    pub fn kind(&self) -> PoolKind {
        self.pool.kind()
    }

    /// The imported pool (it keeps the file descriptor it was imported from).
    #[doc(alias = "handle")]
    pub fn imported_pool(&self) -> &MemoryPool {
        &self.pool
    }

    /// Maps the buffer `descriptor` describes, as a buffer that keeps this resource alive and
    /// unmaps (when no other import of it in this process remains) when dropped, on `stream`.
    ///
    /// # Errors
    ///
    /// Nothing stays mapped on failure.
    ///
    /// - [`IpcError::BufferDescriptor`]: [`BufferDescriptor::validate`] refuses the descriptor (its
    ///   fields are public, so one may have been changed after decoding: a size of 0, or beyond
    ///   [`MAX_BUFFER_SIZE`](crate::MAX_BUFFER_SIZE), or the nil UUID); checked before any driver
    ///   call.
    /// - [`IpcError::WrongResource`]: the descriptor belongs to another resource.
    /// - [`IpcError::MisdescribedBuffer`]: its size exceeds the shared allocation.
    /// - [`IpcError::Protocol`]: its size is beyond this machine's address space.
    /// - [`IpcError::BufferImport`]: the driver refuses the export data (`CUDA_ERROR_INVALID_VALUE`
    ///   or `CUDA_ERROR_INVALID_HANDLE`: not a live allocation of this pool).
    /// - [`IpcError::Core`]: the driver fails otherwise (such as out of memory).
    #[doc(alias = "from_ipc_descriptor")]
    pub fn import_buffer(self: &Arc<Self>, descriptor: &BufferDescriptor, stream: &Stream) -> Result<Buffer> {
        // A buffer of 0 bytes would never give its share back (an empty buffer frees nothing),
        // so the import would stay mapped for good.
        descriptor.validate()?;
        if descriptor.resource != self.uuid {
            return Err(IpcError::WrongResource { expected: self.uuid, found: descriptor.resource });
        }
        let size = usize::try_from(descriptor.size)
            .map_err(|_| ProtocolError::BufferBeyondAddressSpace { size: descriptor.size })?;
        let ptr = self.pool.import_allocation(&descriptor.export_data, size, stream).map_err(|error| match error {
            // The descriptor's size against the mapping (the other size it checks, 0, was
            // refused above).
            cuda_mem_core::Error::SizeMismatch { expected, actual, .. } => {
                IpcError::MisdescribedBuffer { resource: self.uuid, claimed: actual, mapped: expected }
            }
            refusal if refuses_the_peers_data(&refusal) => {
                IpcError::BufferImport { resource: self.uuid, source: refusal }
            }
            other => other.into(),
        })?;
        cuda_mem_core::memory_event!(DEBUG, uuid = %self.uuid, size, ptr = %hex(ptr), pool = %hex(self.pool.handle()), "buffer imported");
        let resource: Arc<dyn MemoryResource> = Arc::clone(self) as Arc<dyn MemoryResource>;
        // SAFETY: not memory from `allocate_raw` (which refuses), but what `from_raw_owned` also
        // takes: memory the resource's `deallocate_raw` releases exactly once. The pointer is one
        // holder's share of an import whose mapping covers `size` bytes (checked, and `size` is
        // not 0, so the buffer's drop does call `deallocate_raw`), and the buffer gives it back
        // once, through `deallocate_raw` below (`release_import`); nothing else releases it.
        Ok(unsafe { Buffer::from_raw_owned(ptr, size, resource, stream) })
    }
}

// SAFETY: buffers come only from `import_buffer`, whose mapping covers the size (checked
// against the driver's range size); the memory is reported as not host-accessible, because
// another process may write it at any time.
unsafe impl MemoryResource for MappedMemoryResource {
    /// Refused: [`cuda_mem_core::SharingError::ImportedPoolAllocation`] (the pool only maps what its
    /// exporter allocates).
    fn allocate_raw(&self, _size: usize, _stream: &Stream) -> cuda_mem_core::Result<DevicePtr> {
        Err(cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::ImportedPoolAllocation))
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, _size: usize, stream: &Stream) -> cuda_mem_core::Result<()> {
        // SAFETY: forwarded from the caller (a buffer releasing its one share, from
        // `import_buffer`'s `import_allocation`).
        unsafe { self.pool.release_import(ptr, stream) }
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        // Even pinned memory: the exporting process may write it at any time, so no safe host
        // slice can be lent; copy it to local memory instead.
        false
    }

    fn may_be_written_externally(&self) -> bool {
        // The exporting process (and every other importer) may write it at any time.
        true
    }

    fn device(&self) -> Option<Device> {
        self.pool.owner()
    }

    fn memory_pool(&self) -> Option<&MemoryPool> {
        Some(&self.pool)
    }
}

impl PoolResource for MappedMemoryResource {
    fn pool(&self) -> &MemoryPool {
        &self.pool
    }
}

/// Which pool an import is, beyond its UUID ([`MappedMemoryResource::origin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImportOrigin {
    /// What this process sent under the import's UUID.
    Exporter(PeerId),
    /// This import, by its number in the process.
    Serial(u64),
}

/// For tests: holding every pool import of the process back, and seeing when receivers have
/// come to import a given UUID (they looked it up on their channel and found nothing).
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
    use std::time::Duration;

    use uuid::Uuid;

    /// The UUID watched, and how many imports of it came to the import lock since.
    static WATCHED: Mutex<Option<(Uuid, usize)>> = Mutex::new(None);
    static ARRIVED: Condvar = Condvar::new();

    /// Called by `from_peer` before it takes the import lock.
    pub(crate) fn waiting_to_import(uuid: Uuid) {
        let mut watched = WATCHED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((watched, count)) = watched.as_mut()
            && *watched == uuid
        {
            *count += 1;
            ARRIVED.notify_all();
        }
    }

    /// Holds every pool import of the process back until the guard drops, and watches `uuid`.
    pub(crate) fn hold_imports(uuid: Uuid) -> MutexGuard<'static, ()> {
        *WATCHED.lock().unwrap_or_else(PoisonError::into_inner) = Some((uuid, 0));
        super::importing()
    }

    /// Waits until `count` imports of the watched UUID wait for the import lock.
    pub(crate) fn wait_for_importers(count: usize) {
        let watched = WATCHED.lock().unwrap_or_else(PoisonError::into_inner);
        let (watched, timed_out) = ARRIVED
            .wait_timeout_while(watched, Duration::from_secs(60), |w| w.is_none_or(|(_, n)| n < count))
            .unwrap_or_else(PoisonError::into_inner);
        assert!(!timed_out.timed_out(), "{count} imports expected, {watched:?} came");
    }
}

#[cfg(test)]
mod tests {
    use cuda_mem_core::{DeviceMemoryResource, DeviceMemoryResourceOptions, StreamOptions, import_holders};

    use super::*;
    use crate::wire::{BufferDescriptorError, MAX_BUFFER_SIZE};
    use crate::{allocation_handle, buffer_descriptor};

    /// A descriptor changed after decoding (its fields are public) is checked as decoding checks
    /// it, before any driver call: a size of 0 would take a share of the mapping that the empty
    /// buffer never gives back, so the allocation would stay mapped for good.
    #[test]
    fn descriptors_that_decoding_would_refuse_are_refused_and_take_no_share() {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let buffer = pool.allocate(4096, &stream).unwrap();
        let handle = allocation_handle(pool.as_ref()).unwrap();
        let mapped = MappedMemoryResource::from_fd(handle.fd(), handle.uuid()).unwrap();
        let good = buffer_descriptor(&buffer).unwrap();

        let refusals = [
            (BufferDescriptor { size: 0, ..good }, BufferDescriptorError::ZeroSize { max: MAX_BUFFER_SIZE }),
            (
                BufferDescriptor { size: MAX_BUFFER_SIZE + 1, ..good },
                BufferDescriptorError::SizeTooLarge { size: MAX_BUFFER_SIZE + 1, max: MAX_BUFFER_SIZE },
            ),
        ];
        for (descriptor, expected) in refusals {
            let error = mapped.import_buffer(&descriptor, &stream).unwrap_err();
            assert!(matches!(&error, IpcError::BufferDescriptor(found) if *found == expected), "{error:?}");
        }
        // No share was taken: a genuine import is the only holder, and its drop unmaps.
        let imported = mapped.import_buffer(&good, &stream).unwrap();
        let ptr = imported.ptr();
        assert_eq!(import_holders(ptr), 1);
        drop(imported);
        assert_eq!(import_holders(ptr), 0, "unmapped");
        stream.synchronize().unwrap();
    }
}

/// An imported pool in memory snapshots: its figures (the driver's, every process's), and the
/// process it came from.
impl cuda_mem_core::snapshot::SnapshotSource for MappedMemoryResource {
    fn snapshot(&self) -> cuda_mem_core::snapshot::ResourceSnapshot {
        let id = cuda_mem_core::history::ResourceId::of(self);
        let mut snapshot = cuda_mem_core::snapshot::pool_snapshot(id, &self.pool);
        snapshot.kind = cuda_mem_core::snapshot::ResourceKind::ImportedPool;
        let from = self.exporter.map_or_else(|| "a peer".to_owned(), |peer| format!("process {}", peer.pid()));
        snapshot.name = format!("pool {:#x} imported from {from} as {}", self.pool.handle() as usize, self.uuid);
        snapshot
    }
}
