//! Mapping allocations another process exported, counted.
//!
//! The driver does not count imports: importing the same allocation twice in one process gives
//! the same pointer, and the first free unmaps it for both (nvbug 5570902). So the raw driver
//! calls stay private to this module, and every import goes through one process-wide table,
//! keyed by the pool it is mapped through and the driver's export data: the first import maps,
//! later ones share it, and only the last holder's release unmaps, after the work every earlier
//! holder enqueued (an event per stream on which a holder let go). Lookup-or-import and release
//! both run under one lock, so concurrent imports and releases neither race nor double-free.
//! Export data that differs from a held import's yet is mapped where that import lies (bytes
//! the driver ignores, changed by a peer) shares the held mapping: one entry per pointer, so no
//! release can unmap memory another holder still uses.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::CUmemPoolPtrExportData;

use super::MemoryPool;
use super::{EXPORT_DATA_LEN, bind_for};
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::error::{Error, Result, SharingError};
use crate::event::{Event, EventOptions};
use crate::ffi;
use crate::stream::Stream;

/// An import: the pool it was mapped through (the same data imported through another pool is
/// another import, kept alive by that pool) and the export data.
type Key = (usize, [u8; EXPORT_DATA_LEN]);

/// One import and its holders.
#[derive(Debug)]
struct Entry {
    ptr: DevicePtr,
    /// The mapping's size, as the driver reported it when mapped (it does not change while
    /// mapped): later imports check against it without asking again.
    mapped: usize,
    holders: usize,
    /// For each stream a released holder's work was on, an event after that work: the last
    /// holder's unmap waits for them all. Work on one stream is ordered, so a later release on
    /// the same stream records the same event again (the list grows with the streams, not with
    /// the releases); events whose work has completed are dropped as holders let go. The stream
    /// is kept (a clone) so that, while its event stands for it, no new stream can get its
    /// handle and be mistaken for it.
    released: Vec<(Stream, Event)>,
}

#[derive(Debug)]
struct Imports {
    by_key: BTreeMap<Key, Entry>,
    /// Pointer → key, for releases and re-exports.
    by_ptr: BTreeMap<DevicePtr, Key>,
}

static IMPORTS: Mutex<Imports> = Mutex::new(Imports { by_key: BTreeMap::new(), by_ptr: BTreeMap::new() });

fn lock() -> MutexGuard<'static, Imports> {
    // Every operation leaves the table consistent at each step, so a panic cannot corrupt it.
    IMPORTS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn too_large(size: usize, mapped: usize) -> Error {
    Error::SizeMismatch { what: "the size claimed for an imported allocation", expected: mapped, actual: size }
}

impl MemoryPool {
    /// Maps the allocation another process exported as `data` through this imported pool, or
    /// shares this process's earlier mapping of it through the same pool, checking that the
    /// mapping covers `size` bytes. Either way the caller becomes one more holder of the
    /// mapping, and gives its share back once, with [`MemoryPool::release_import`]; the last
    /// holder's release unmaps. On any failure nothing new stays mapped.
    ///
    /// # Errors
    /// - [`SharingError::PoolNotImported`] for a pool that was not imported.
    /// - [`Error::SizeMismatch`] for a `size` of 0 (checked before any driver call: a share taken
    ///   for no bytes would be held by an empty buffer, which releases nothing, so the mapping
    ///   would never go) and when the mapping is smaller than `size` (the size came from the
    ///   exporter and is wrong).
    /// - Driver errors when the driver refuses the data (garbage, or another pool's).
    #[doc(alias = "from_ipc_descriptor")]
    pub fn import_allocation(&self, data: &[u8; EXPORT_DATA_LEN], size: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.import_mapping(data, size, stream)?;
        let pool = crate::history::ResourceId(self.handle() as usize as u64);
        crate::history::record(crate::history::MemoryEventKind::Import, ptr, size, Some(stream), pool);
        Ok(ptr)
    }

    /// [`import_allocation`](MemoryPool::import_allocation) but for the history.
    fn import_mapping(&self, data: &[u8; EXPORT_DATA_LEN], size: usize, stream: &Stream) -> Result<DevicePtr> {
        if !self.imported {
            return Err(Error::Sharing(SharingError::PoolNotImported));
        }
        if size == 0 {
            return Err(Error::SizeMismatch {
                what: "the size claimed for an imported allocation (an allocation has at least one byte)",
                expected: 1,
                actual: 0,
            });
        }
        let key: Key = (self.handle() as usize, *data);
        let mut imports = lock();
        // Mapped already (a buffer sent again while this process holds it): shared without a
        // driver call.
        if let Some(entry) = imports.by_key.get_mut(&key) {
            if size > entry.mapped {
                return Err(too_large(size, entry.mapped));
            }
            entry.holders += 1;
            crate::memory_event!(
                DEBUG,
                size,
                ptr = %hex(entry.ptr),
                pool = %hex(self.handle()),
                holders = entry.holders,
                "allocation imported"
            );
            return Ok(entry.ptr);
        }
        // Binds the pool's device's primary context (a thread that never used CUDA has none),
        // in which the size is asked below.
        let ptr = self.import_pointer(data)?;
        if let Some(&held) = imports.by_ptr.get(&ptr) {
            // The driver mapped this data where an import this process holds already lies: the
            // same allocation under export data that differs where the driver does not look
            // (forged or padded by a peer), or through another handle of the pool. Its imports
            // are not counted, so this one is the held mapping: unmapping it would unmap that
            // too, and a second entry for one pointer would let either holder's release unmap
            // it under the other.
            return self.share_held(&mut imports, held, ptr, size);
        }
        let mapped = match range_size_in_current_context(ptr) {
            Ok(mapped) if size <= mapped => mapped,
            outcome => {
                // SAFETY: just imported, never handed out, unmapped once, here.
                let _ = unsafe { self.free_imported(ptr, stream) };
                return Err(match outcome {
                    Ok(mapped) => too_large(size, mapped),
                    Err(e) => e,
                });
            }
        };
        imports.by_key.insert(key, Entry { ptr, mapped, holders: 1, released: Vec::new() });
        imports.by_ptr.insert(ptr, key);
        crate::memory_event!(DEBUG, size, ptr = %hex(ptr), pool = %hex(self.handle()), holders = 1, "allocation imported");
        Ok(ptr)
    }

    /// The import of `ptr` that the driver answered with a mapping held under `held`: one more
    /// holder of it when it was mapped through this pool (the size checked against it, as for a
    /// key found), else refused; either way nothing is unmapped.
    fn share_held(&self, imports: &mut Imports, held: Key, ptr: DevicePtr, size: usize) -> Result<DevicePtr> {
        let pool = self.handle() as usize;
        let entry = imports.by_key.get_mut(&held).filter(|_| held.0 == pool);
        let Some(entry) = entry else {
            return Err(Error::Sharing(SharingError::ImportHeldElsewhere { ptr }));
        };
        if size > entry.mapped {
            return Err(too_large(size, entry.mapped));
        }
        entry.holders += 1;
        crate::memory_event!(DEBUG, size, ptr = %hex(ptr), pool = %hex(pool), holders = entry.holders, "allocation imported (held already)");
        Ok(ptr)
    }

    /// Gives back one holder's share of the mapping at `ptr`; the last holder's release unmaps
    /// it on `stream`, after the work of every holder that let go before it.
    ///
    /// When the bookkeeping that orders the unmap after this holder's work fails (an event
    /// cannot be created or recorded), `stream` is synchronized instead, and the share is still
    /// given back.
    ///
    /// # Safety
    /// The caller holds a share (from [`MemoryPool::import_allocation`] of this pool) and gives
    /// it back once; nothing uses the memory through it after `stream`'s work so far.
    ///
    /// # Errors
    /// - When `ptr` is not a mapping through this pool.
    /// - Driver errors (the share is then kept, so that the memory is never unmapped under work
    ///   that may still use it).
    pub unsafe fn release_import(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        let mut imports = lock();
        let key = match imports.by_ptr.get(&ptr) {
            Some(&key) if key.0 == self.handle() as usize => key,
            _ => {
                return Err(Error::Sharing(SharingError::NotAnImport { ptr }));
            }
        };
        let Some(entry) = imports.by_key.get_mut(&key) else {
            // The two tables disagree: no holder to give back, so nothing is released.
            return Err(Error::Sharing(SharingError::NotAnImport { ptr }));
        };
        if entry.holders > 1 {
            // Not the last: remember where this holder's work ends, for the last one to wait on.
            note_release(&mut entry.released, stream)?;
            entry.holders -= 1;
            crate::memory_event!(DEBUG, ptr = %hex(ptr), pool = %hex(self.handle()), holders = entry.holders, "import released");
            return Ok(());
        }
        for (_, event) in &entry.released {
            // Cannot order the stream after it: wait on the host instead.
            stream.wait(event).or_else(|_| event.synchronize())?;
        }
        // SAFETY: the last holder is releasing, under the table's lock, so no import can hand
        // the pointer out again before it is unmapped; `stream` waits for every earlier holder's
        // work and the caller's own work is enqueued on it. On failure the entry stays, so the
        // import is not forgotten.
        unsafe { self.free_imported(ptr, stream) }?;
        imports.by_key.remove(&key);
        imports.by_ptr.remove(&ptr);
        crate::memory_event!(DEBUG, ptr = %hex(ptr), pool = %hex(self.handle()), holders = 0, "import released");
        Ok(())
    }

    /// Maps the allocation `data` describes, uncounted: importing the same data twice returns
    /// the same pointer, and one free unmaps it for both.
    fn import_pointer(&self, data: &[u8; EXPORT_DATA_LEN]) -> Result<DevicePtr> {
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
    /// `ptr` came from [`MemoryPool::import_pointer`] and no holder uses it after `stream`'s
    /// work so far; it is not freed again.
    unsafe fn free_imported(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.free_async(ptr, stream) }
    }
}

/// Marks where `stream`'s work ends, for the last holder to wait on: records the event kept for
/// `stream` again, or keeps a new one, after dropping those whose work has completed. When no
/// event can be had, waits for `stream` on the host instead (nothing is then left to wait on).
fn note_release(released: &mut Vec<(Stream, Event)>, stream: &Stream) -> Result<()> {
    let noted = match released.iter().position(|(kept, _)| kept == stream) {
        Some(index) => released[index].1.record(stream).map_err(|e| (Some(index), e)),
        None => {
            // An event whose query fails is kept: waiting on it is the safe side.
            released.retain(|(_, event)| !event.is_complete().unwrap_or(false));
            Event::new(stream.device(), EventOptions::default())
                .and_then(|event| event.record(stream).map(|()| event))
                .map(|event| released.push((stream.clone(), event)))
                .map_err(|e| (None, e))
        }
    };
    match noted {
        Ok(()) => Ok(()),
        Err((kept, _)) => {
            stream.synchronize()?;
            // The work is done; a kept event that failed to record again would still stand for
            // earlier work only, which is done too.
            if let Some(index) = kept {
                released.swap_remove(index);
            }
            Ok(())
        }
    }
}

/// The export data the mapping at `ptr` through `pool` was imported with.
pub(super) fn export_data_of(pool: &MemoryPool, ptr: DevicePtr) -> Option<[u8; EXPORT_DATA_LEN]> {
    lock().by_ptr.get(&ptr).filter(|(handle, _)| *handle == pool.handle() as usize).map(|(_, data)| *data)
}

/// Forgets every import through the pool `handle`, which was destroyed.
pub(super) fn forget_pool(handle: usize) {
    let mut imports = lock();
    if imports.by_key.is_empty() {
        return;
    }
    imports.by_key.retain(|(pool, _), _| *pool != handle);
    imports.by_ptr.retain(|_, (pool, _)| *pool != handle);
}

/// `read` of the entry of the import at `ptr`, or 0 when it is not imported.
fn count_of(ptr: DevicePtr, read: impl FnOnce(&Entry) -> usize) -> usize {
    let imports = lock();
    imports.by_ptr.get(&ptr).and_then(|key| imports.by_key.get(key)).map_or(0, read)
}

/// How many holders the import at `ptr` has (0 when it is not an import of this process).
pub fn import_holders(ptr: DevicePtr) -> usize {
    count_of(ptr, |e| e.holders)
}

/// How many streams the last release of the import at `ptr` will wait on: one per stream on
/// which an earlier holder let go and whose work had not completed when last checked (0 when
/// not imported). For diagnostics and tests.
pub fn import_pending_waits(ptr: DevicePtr) -> usize {
    count_of(ptr, |e| e.released.len())
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
    range_size_in_current_context(ptr)
}

/// [`mapped_range_size`] for a caller that made a context current already (an import, which
/// binds the pool's device to import): one driver call fewer on every first import.
pub(crate) fn range_size_in_current_context(ptr: DevicePtr) -> Result<usize> {
    Ok(ffi::pointer_range_size(driver()?, ptr)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceMemoryResource, DeviceMemoryResourceOptions, StreamOptions};

    /// An import of 0 bytes is refused before anything is mapped or counted: the empty buffer
    /// that would hold its share releases nothing, so the mapping would stay for good (and every
    /// later import of the allocation would share it, never unmapped either).
    #[test]
    fn an_import_of_zero_bytes_is_refused_and_takes_no_share() {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        device.set_current().unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let exporter =
            DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
        let buffer = exporter.allocate(4096, &stream).unwrap();
        let data = exporter.pool().export_pointer(buffer.ptr()).unwrap();
        let handle = exporter.pool().shareable_handle().unwrap();
        let imported = MemoryPool::import(handle.try_clone_fd().unwrap(), handle.id()).unwrap();
        let key: Key = (imported.handle() as usize, data);

        let error = imported.import_allocation(&data, 0, &stream).unwrap_err();
        assert!(matches!(error, Error::SizeMismatch { expected: 1, actual: 0, .. }), "{error:?}");
        assert!(error.to_string().contains("at least one byte"), "{error}");
        assert!(!lock().by_key.contains_key(&key), "nothing mapped, no share taken");

        // A genuine import is the only holder, and its release unmaps.
        let ptr = imported.import_allocation(&data, 4096, &stream).unwrap();
        assert_eq!(import_holders(ptr), 1);
        // SAFETY: the one share just taken, given back once; nothing used the memory.
        unsafe { imported.release_import(ptr, &stream) }.unwrap();
        assert_eq!(import_holders(ptr), 0);
        assert!(!lock().by_key.contains_key(&key));
        stream.synchronize().unwrap();
    }
}
