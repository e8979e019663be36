//! The process-wide duplicate-import cache.
//!
//! The driver does not count imports: importing the same allocation twice in one process gives
//! the same pointer, and the first free unmaps it for both (nvbug 5570902). So every import goes
//! through this cache, keyed by the pool it is mapped through and the driver's export data: the
//! first import maps, later ones share it, and only the last holder's release unmaps, after the
//! work every earlier holder enqueued (an event per stream on which a holder let go). Lookup-or-import and
//! release both run under one lock, so concurrent imports and drops neither race nor
//! double-free.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_core::{DevicePtr, EXPORT_DATA_LEN, Event, EventOptions, MemoryPool, Stream};

use crate::error::{IpcError, Result};

/// An import: the pool it was mapped through (the same data imported through another pool is
/// another import, kept alive by that pool) and the export data.
type Key = (usize, [u8; EXPORT_DATA_LEN]);

/// One import and its holders.
struct Entry {
    ptr: DevicePtr,
    holders: usize,
    /// For each stream a released holder's work was on, an event after that work: the last
    /// holder's unmap waits for them all. Work on one stream is ordered, so a later release on
    /// the same stream records the same event again (the list grows with the streams, not with
    /// the releases); events whose work has completed are dropped as holders let go. The stream
    /// is kept (a clone) so that, while its event stands for it, no new stream can get its
    /// handle and be mistaken for it.
    released: Vec<(Stream, Event)>,
}

#[derive(Default)]
struct Cache {
    by_key: HashMap<Key, Entry>,
    /// Pointer → key, for releases and re-exports.
    by_ptr: HashMap<DevicePtr, Key>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<Cache>> {
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An inconsistency inside this process (not the peer's doing).
fn local(message: String) -> IpcError {
    IpcError::Core(cuda_mem_core::Error::InvalidState(message))
}

fn too_large(size: usize, mapped: usize) -> IpcError {
    IpcError::Protocol(format!(
        "the descriptor claims {size} bytes but the shared allocation maps only {mapped}; the peer sent a bad size"
    ))
}

/// Imports the allocation `data` describes from `pool`, or shares an earlier import of it
/// through the same pool, checking that the mapping covers `size` bytes; one more holder either
/// way. On any failure nothing new stays mapped (a fresh import is released on `stream`).
pub(crate) fn acquire(
    pool: &MemoryPool,
    data: &[u8; EXPORT_DATA_LEN],
    size: usize,
    stream: &Stream,
) -> Result<DevicePtr> {
    // The driver calls below need a current context, which a thread that never used CUDA lacks:
    // bind the stream's device's primary context, as cuda-mem-core does before its calls.
    stream.device().set_current()?;
    let key: Key = (pool.handle() as usize, *data);
    let mut guard = lock();
    let cache = guard.get_or_insert_with(Cache::default);
    if let Some(entry) = cache.by_key.get_mut(&key) {
        let mapped = cuda_mem_core::mapped_range_size(entry.ptr)?;
        if size > mapped {
            return Err(too_large(size, mapped));
        }
        entry.holders += 1;
        return Ok(entry.ptr);
    }
    let ptr = pool.import_pointer(data)?;
    match cuda_mem_core::mapped_range_size(ptr) {
        Ok(mapped) if size <= mapped => {}
        outcome => {
            // SAFETY: just imported, never handed out, released once, here.
            let _ = unsafe { pool.free_imported(ptr, stream) };
            return Err(match outcome {
                Ok(mapped) => too_large(size, mapped),
                Err(e) => e.into(),
            });
        }
    }
    cache.by_key.insert(key, Entry { ptr, holders: 1, released: Vec::new() });
    cache.by_ptr.insert(ptr, key);
    Ok(ptr)
}

/// Drops one holder of the import at `ptr`; the last one unmaps it on `stream`, after the work
/// of every holder that let go before it.
///
/// # Safety
/// The caller is a holder (from [`acquire`]) releasing once, and nothing uses the memory through
/// it after `stream`'s work so far.
pub(crate) unsafe fn release(pool: &MemoryPool, ptr: DevicePtr, stream: &Stream) -> Result<()> {
    let mut guard = lock();
    let cache = guard.get_or_insert_with(Cache::default);
    let key = *cache.by_ptr.get(&ptr).ok_or_else(|| local(format!("{ptr:#x} is not an import of this process")))?;
    let Some(entry) = cache.by_key.get_mut(&key) else {
        return Err(local(format!("the import cache has no holders for {ptr:#x}")));
    };
    if entry.holders > 1 {
        // Not the last: remember where this holder's work ends, for the last one to wait on.
        note_release(&mut entry.released, stream)?;
        entry.holders -= 1;
        return Ok(());
    }
    for (_, event) in &entry.released {
        stream.wait(event)?;
    }
    // SAFETY: the last holder is releasing, under the cache lock, so no import can hand the
    // pointer out again before it is unmapped; `stream` waits for every earlier holder's work and
    // the caller's own work is enqueued on it. On failure the entry stays, so the import is not
    // forgotten.
    unsafe { pool.free_imported(ptr, stream) }?;
    cache.by_key.remove(&key);
    cache.by_ptr.remove(&ptr);
    Ok(())
}

/// Marks where `stream`'s work ends, for the last holder to wait on: records the event kept for
/// `stream` again, or keeps a new one, after dropping those whose work has completed.
fn note_release(released: &mut Vec<(Stream, Event)>, stream: &Stream) -> Result<()> {
    if let Some((_, event)) = released.iter().find(|(kept, _)| kept == stream) {
        event.record(stream)?;
        return Ok(());
    }
    // An event whose query fails is kept: waiting on it is the safe side.
    released.retain(|(_, event)| !event.is_complete().unwrap_or(false));
    let event = Event::new(stream.device(), EventOptions::default())?;
    event.record(stream)?;
    released.push((stream.clone(), event));
    Ok(())
}

/// The export data an imported allocation was mapped from (to re-export it, A→B→C).
pub(crate) fn export_data_of(ptr: DevicePtr) -> Option<[u8; EXPORT_DATA_LEN]> {
    lock().as_ref().and_then(|cache| cache.by_ptr.get(&ptr).map(|(_, data)| *data))
}

/// `read` of the entry of the import at `ptr`, or 0 when it is not imported.
fn count_of(ptr: DevicePtr, read: impl FnOnce(&Entry) -> usize) -> usize {
    lock().as_ref().and_then(|cache| cache.by_ptr.get(&ptr).and_then(|key| cache.by_key.get(key))).map_or(0, read)
}

/// How many holders the import at `ptr` has (0 when not imported).
pub fn holders(ptr: DevicePtr) -> usize {
    count_of(ptr, |e| e.holders)
}

/// How many streams the last release of the import at `ptr` will wait on: one per stream on
/// which an earlier holder let go and whose work had not completed when last checked (0 when
/// not imported). For diagnostics and tests.
pub fn pending_waits(ptr: DevicePtr) -> usize {
    count_of(ptr, |e| e.released.len())
}
