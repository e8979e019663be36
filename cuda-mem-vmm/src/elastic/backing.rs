//! `Backing`: an address reservation cut into chunks of one size, each backed by physical
//! memory or not, which the elastic types map and unmap one by one. The reservation outlives
//! every mapping in it: dropping a backing unmaps what is mapped first.

use std::sync::Arc;

use std::sync::{RwLock, RwLockWriteGuard, TryLockError};

use cuda_mem_core::{DevicePtr, Result, Stream, record_drop_error};

use crate::error::{DeferCause, ElasticMemory, VmmError};
use crate::pieces::{Physical, Reservation, map_physical, unmap};
use crate::release::wait_for;
use crate::resource::VirtualMemoryResource;

/// What one chunk holds.
#[derive(Debug)]
pub(crate) enum Chunk {
    /// Mapped, backed by this memory.
    Mapped(Arc<Physical>),
    /// Unmapped, its memory kept (an unmapping undone only partway): mapped again as it is.
    Held(Arc<Physical>),
    /// Unmapped, with no memory.
    Released,
}

/// A reservation of `chunks.len()` chunks of `chunk` bytes.
#[derive(Debug)]
pub(crate) struct Backing {
    /// Freed when dropped, after the mappings (see `Drop`).
    reservation: Arc<Reservation>,
    chunk: usize,
    pub(crate) chunks: Vec<Chunk>,
}

impl Backing {
    /// Reserves `size` bytes (a multiple of `chunk`, itself a multiple of the resource's
    /// granularity) as chunks of `chunk` bytes, none mapped.
    pub(crate) fn reserve(resource: &VirtualMemoryResource, size: usize, chunk: usize) -> crate::Result<Backing> {
        let reservation = Reservation::reserve(size, resource.alignment(), resource.options().address_hint)?;
        Ok(Backing { reservation, chunk, chunks: (0..size / chunk).map(|_| Chunk::Released).collect() })
    }

    /// A backing of the same reservation with no chunks: what an owner leaves in place of the
    /// backing it moves out (its drop unmaps nothing; the addresses are freed with the last
    /// backing holding them).
    pub(crate) fn hollow(&self) -> Backing {
        Backing { reservation: Arc::clone(&self.reservation), chunk: self.chunk, chunks: Vec::new() }
    }

    /// The first address.
    pub(crate) fn ptr(&self) -> DevicePtr {
        self.reservation.ptr
    }

    /// The bytes reserved.
    pub(crate) fn size(&self) -> usize {
        self.reservation.size
    }

    /// The bytes of a chunk.
    pub(crate) fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// The address of chunk `index`.
    fn chunk_ptr(&self, index: usize) -> DevicePtr {
        // Inside the reservation, whose size is a `usize`: lossless.
        self.reservation.ptr + (index * self.chunk) as DevicePtr
    }

    /// Whether chunk `index` is mapped.
    pub(crate) fn is_mapped(&self, index: usize) -> bool {
        matches!(self.chunks[index], Chunk::Mapped(_))
    }

    /// The bytes mapped.
    pub(crate) fn mapped_bytes(&self) -> usize {
        self.chunks.iter().filter(|chunk| matches!(chunk, Chunk::Mapped(_))).count() * self.chunk
    }

    /// Maps chunk `index` (unmapped): with its held memory, or with `fresh()`'s. On an error
    /// the chunk is as it was.
    pub(crate) fn map(&mut self, index: usize, fresh: impl FnOnce() -> Result<Arc<Physical>>) -> Result<()> {
        match std::mem::replace(&mut self.chunks[index], Chunk::Released) {
            Chunk::Mapped(physical) => {
                self.chunks[index] = Chunk::Mapped(physical);
                Ok(())
            }
            Chunk::Held(physical) => self.map_with(index, physical, true),
            Chunk::Released => self.map_with(index, fresh()?, false),
        }
    }

    /// Maps chunk `index` again with the memory it holds (undoing an unmapping); a chunk that
    /// holds none is left as it is. On an error it still holds it.
    pub(crate) fn map_held(&mut self, index: usize) -> Result<()> {
        match std::mem::replace(&mut self.chunks[index], Chunk::Released) {
            Chunk::Held(physical) => self.map_with(index, physical, true),
            other => {
                self.chunks[index] = other;
                Ok(())
            }
        }
    }

    /// Maps `physical` as chunk `index` (unmapped, its state taken out). On an error, memory it
    /// `held` stays held (its contents are kept); fresh memory goes.
    fn map_with(&mut self, index: usize, physical: Arc<Physical>, held: bool) -> Result<()> {
        let ptr = self.chunk_ptr(index);
        // SAFETY: the chunk lies inside this backing's reservation and is unmapped (its state
        // says so, and only this value maps there).
        match unsafe { map_physical(ptr, &physical) } {
            Ok(()) => {
                self.chunks[index] = Chunk::Mapped(physical);
                Ok(())
            }
            Err(error) => {
                if held {
                    self.chunks[index] = Chunk::Held(physical);
                }
                Err(error)
            }
        }
    }

    /// Unmaps chunk `index` (mapped) and keeps its memory: the chunk is then held, and its
    /// memory goes with [`release_held`](Backing::release_held) (or comes back with
    /// [`map`](Backing::map)). On an error it stays mapped.
    ///
    /// # Safety
    /// No work that uses the chunk is queued or running.
    pub(crate) unsafe fn unmap_keeping(&mut self, index: usize) -> Result<()> {
        let ptr = self.chunk_ptr(index);
        let Chunk::Mapped(physical) = std::mem::replace(&mut self.chunks[index], Chunk::Released) else {
            return Ok(());
        };
        // SAFETY: mapped by this value at `ptr` with its size; idle, as the caller promises.
        match unsafe { unmap(ptr, physical.size) } {
            Ok(()) => {
                self.chunks[index] = Chunk::Held(physical);
                Ok(())
            }
            Err(error) => {
                self.chunks[index] = Chunk::Mapped(physical);
                Err(error)
            }
        }
    }

    /// Releases the memory chunk `index` holds (unmapped), if any.
    pub(crate) fn release_chunk(&mut self, index: usize) {
        if let Chunk::Held(_) = self.chunks[index] {
            self.chunks[index] = Chunk::Released;
        }
    }

    /// Releases the memory of every held chunk (`cuMemRelease`; a failure is recorded by the
    /// physical allocation's drop) and returns how many bytes went.
    pub(crate) fn release_held(&mut self) -> usize {
        let mut released = 0;
        for chunk in &mut self.chunks {
            match std::mem::replace(chunk, Chunk::Released) {
                Chunk::Held(physical) => released += physical.size,
                other => *chunk = other,
            }
        }
        released
    }
}

impl Drop for Backing {
    /// Unmaps what is mapped, last chunk first, then the reservation is freed (its own drop).
    fn drop(&mut self) {
        for index in (0..self.chunks.len()).rev() {
            if let Chunk::Mapped(physical) = &self.chunks[index] {
                let size = physical.size;
                // SAFETY: mapped by this value; its owner waited for the work using it before
                // letting go of it (see the owners' drops).
                if let Err(error) = unsafe { unmap(self.chunk_ptr(index), size) } {
                    record_drop_error("elastic memory mapping", error);
                    // Still mapped: the addresses must not be freed under it.
                    std::mem::forget(Arc::clone(&self.reservation));
                }
            }
            self.chunks[index] = Chunk::Released;
        }
    }
}

/// Lets go of `backing` once `stream`'s work is done. A stream that cannot be waited for keeps it
/// mapped: inside a capture of this crate's, until the capture's graphs go; otherwise for the
/// process's life (recorded): unmapping memory that may be in use is never the fallback.
pub(crate) fn release_after(backing: Backing, stream: &Stream) {
    let why = match wait_for(stream) {
        Ok(()) => return drop(backing),
        Err(DeferCause::Capturing) => match stream.keep_alive_in_capture(backing) {
            Ok(()) => return,
            Err(kept) => return kept_forever(kept, VmmError::CapturingStream),
        },
        Err(cause) => VmmError::ReleaseDeferred { ptr: backing.ptr(), size: backing.mapped_bytes(), cause },
    };
    kept_forever(backing, why);
}

/// Memory that cannot be let go of safely: kept mapped for the process's life, the reason
/// recorded.
fn kept_forever(backing: Backing, why: VmmError) {
    record_drop_error("elastic memory (kept mapped: its stream cannot be waited for)", why.into_core());
    std::mem::forget(backing);
}

/// `lock` for writing, for a map, an unmap, a sleep or a wake: refused, as
/// [`VmmError::InUse`] naming `memory()`, while an access holds it for reading (waiting could
/// deadlock a thread that holds one).
pub(crate) fn exclusive<'a, T>(
    lock: &'a RwLock<T>,
    memory: impl FnOnce() -> ElasticMemory,
) -> crate::Result<RwLockWriteGuard<'a, T>> {
    match lock.try_write() {
        Ok(guard) => Ok(guard),
        Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => Err(VmmError::InUse { memory: memory() }),
    }
}
