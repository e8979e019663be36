//! The process-wide duplicate-import cache.
//!
//! The driver does not count imports: importing the same allocation twice in one process gives
//! the same pointer, and the first free unmaps it for both (nvbug 5570902). So every import goes
//! through this cache, keyed by the driver's export data: the first import maps, later ones share
//! it, and only the last holder's release unmaps. Lookup-or-import and release both run under
//! one lock, so concurrent imports and drops neither race nor double-free.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_core::{DevicePtr, EXPORT_DATA_LEN, MemoryPool, Stream};

use crate::error::{IpcError, Result};

#[derive(Default)]
struct Cache {
    /// Export data → (pointer, holders).
    by_data: HashMap<[u8; EXPORT_DATA_LEN], (DevicePtr, usize)>,
    /// Pointer → export data, for releases and re-exports.
    by_ptr: HashMap<DevicePtr, [u8; EXPORT_DATA_LEN]>,
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

/// Imports the allocation `data` describes from `pool`, or shares an earlier import of it,
/// checking that the mapping covers `size` bytes; one more holder either way. On any failure
/// nothing new stays mapped (a fresh import is released on `stream`).
pub(crate) fn acquire(
    pool: &MemoryPool,
    data: &[u8; EXPORT_DATA_LEN],
    size: usize,
    stream: &Stream,
) -> Result<DevicePtr> {
    // The driver calls below need a current context, which a thread that never used CUDA lacks:
    // bind the stream's device's primary context, as cuda-mem-core does before its calls.
    stream.device().set_current()?;
    let mut guard = lock();
    let cache = guard.get_or_insert_with(Cache::default);
    if let Some((ptr, holders)) = cache.by_data.get_mut(data) {
        let mapped = cuda_mem_core::mapped_range_size(*ptr)?;
        if size > mapped {
            return Err(too_large(size, mapped));
        }
        *holders += 1;
        return Ok(*ptr);
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
    cache.by_data.insert(*data, (ptr, 1));
    cache.by_ptr.insert(ptr, *data);
    Ok(ptr)
}

/// Drops one holder of the import at `ptr`; the last one unmaps it on `stream`.
///
/// # Safety
/// The caller is a holder (from [`acquire`]) releasing once, and the memory is not used after
/// `stream`'s work so far if it is the last holder.
pub(crate) unsafe fn release(pool: &MemoryPool, ptr: DevicePtr, stream: &Stream) -> Result<()> {
    let mut guard = lock();
    let cache = guard.get_or_insert_with(Cache::default);
    let data =
        cache.by_ptr.get(&ptr).copied().ok_or_else(|| local(format!("{ptr:#x} is not an import of this process")))?;
    let Some((_, holders)) = cache.by_data.get_mut(&data) else {
        return Err(local(format!("the import cache has no holders for {ptr:#x}")));
    };
    *holders -= 1;
    if *holders > 0 {
        return Ok(());
    }
    cache.by_data.remove(&data);
    cache.by_ptr.remove(&ptr);
    // SAFETY: the last holder released, under the cache lock, so no import can hand the pointer
    // out again before it is unmapped; the caller guarantees nothing uses it afterwards.
    unsafe { pool.free_imported(ptr, stream) }?;
    Ok(())
}

/// The export data an imported allocation was mapped from (to re-export it, A→B→C).
pub(crate) fn export_data_of(ptr: DevicePtr) -> Option<[u8; EXPORT_DATA_LEN]> {
    lock().as_ref().and_then(|cache| cache.by_ptr.get(&ptr).copied())
}

/// How many holders the import at `ptr` has (0 when not imported).
pub fn holders(ptr: DevicePtr) -> usize {
    lock().as_ref().and_then(|cache| cache.by_ptr.get(&ptr).and_then(|d| cache.by_data.get(d))).map_or(0, |(_, n)| *n)
}
