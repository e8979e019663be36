//! The owned pieces of a virtual allocation, each undone exactly once by its `Drop`:
//! a physical allocation (`cuMemCreate` → `cuMemRelease`), an address reservation
//! (`cuMemAddressReserve` → `cuMemAddressFree`), a mapping of one into the other (`cuMemMap` +
//! `cuMemSetAccess` → `cuMemUnmap`), and a range: the mappings one buffer spans.
//!
//! A reservation may be larger than what is mapped in it (`ReserveAhead`): it keeps the end of
//! its mapped part, and a range that ends there may claim the addresses after it and map a new
//! chunk in place ([`Range::claim_after`]). Claims move that end with a compare-and-swap, so two
//! growths of the same range never map at the same address: the loser moves instead.
//!
//! Giving addresses back moves that end back, again by compare-and-swap, and only from the last
//! claim: it needs the mappings of a reservation unmapped last to first. That holds because every
//! range's mappings inside a reservation are a prefix of the reservation's mappings (a range maps
//! from the reservation's start, or grows by the claim right after its last chunk), and a range
//! lets go of its mappings last to first (its `Drop`): whoever holds a mapping holds every one
//! before it, and lets go of it first, so the last holder of a mapping lets go of it only after
//! the mapping after it was unmapped and gave its addresses back, on whatever thread.
//!
//! A mapping holds its physical allocation and its reservation, so it is unmapped before the
//! reservation is freed; a range holds its mappings. Unmapping is not stream-ordered: whoever
//! lets go of a range waits for the work that uses it first (see `release`). Any step that
//! fails drops the pieces made before it, so nothing leaks.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle};
use cuda_mem_core::{DevicePtr, Error, Result, driver, record_drop_error};

/// A physical allocation and the access every mapping of it gets.
#[derive(Debug)]
pub(crate) struct Physical {
    pub(crate) handle: CUmemGenericAllocationHandle,
    pub(crate) size: usize,
    pub(crate) access: Vec<CUmemAccessDesc>,
}

impl Physical {
    /// `cuMemCreate`.
    pub(crate) fn create(
        size: usize,
        prop: &CUmemAllocationProp,
        access: Vec<CUmemAccessDesc>,
    ) -> Result<Arc<Physical>> {
        let d = driver()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer and `prop` a fully initialized structure.
        unsafe { cu_call!(d, cuMemCreate(&mut handle, size, prop, 0)) }?;
        Ok(Arc::new(Physical { handle, size, access }))
    }

    /// Takes ownership of an imported handle.
    pub(crate) fn adopt(
        handle: CUmemGenericAllocationHandle,
        size: usize,
        access: Vec<CUmemAccessDesc>,
    ) -> Arc<Physical> {
        Arc::new(Physical { handle, size, access })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        let release = || -> Result<()> {
            let d = driver()?;
            // SAFETY: the handle is this value's own reference, released once, here.
            unsafe { cu_call!(d, cuMemRelease(self.handle)) }?;
            Ok(())
        };
        if let Err(error) = release() {
            record_drop_error("virtual memory physical allocation", error);
        }
    }
}

/// An address reservation, and the end of its mapped part.
#[derive(Debug)]
pub(crate) struct Reservation {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: usize,
    /// The offset every mapping in it ends at or before: mappings are made from the start,
    /// one after another, and this end moves back when the last one is unmapped.
    mapped_end: AtomicUsize,
}

impl Reservation {
    /// `cuMemAddressReserve`.
    pub(crate) fn reserve(size: usize, alignment: usize, hint: DevicePtr) -> Result<Arc<Reservation>> {
        let d = driver()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, alignment, hint, 0)) }?;
        Ok(Arc::new(Reservation { ptr, size, mapped_end: AtomicUsize::new(0) }))
    }

    /// Claims `size` bytes at `offset` when they fit and nothing is mapped (or claimed) from
    /// `offset` on.
    fn claim(&self, offset: usize, size: usize) -> bool {
        let fits = offset.checked_add(size).is_some_and(|end| end <= self.size);
        fits && self.mapped_end.compare_exchange(offset, offset + size, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// The bytes mapped (or claimed) from the start.
    pub(crate) fn mapped_end(&self) -> usize {
        self.mapped_end.load(Ordering::Acquire)
    }

    /// Maps `physical` right after what is mapped in the reservation (an expandable range's
    /// growth): the mapping, or `None` (nothing mapped, `physical` dropped) when it does not fit
    /// or another mapping claimed those addresses first.
    pub(crate) fn map_at_end(self: &Arc<Self>, physical: Arc<Physical>) -> Option<Result<Arc<Mapping>>> {
        let (offset, size) = (self.mapped_end(), physical.size);
        if !self.claim(offset, size) {
            return None;
        }
        let mapped = Mapping::map(self.ptr + offset as DevicePtr, physical, Arc::clone(self));
        if mapped.is_err() {
            // Claimed just above and mapped by no one: given back once, here.
            self.unclaim(offset, size);
        }
        Some(mapped)
    }

    /// Gives back the claim of `size` bytes at `offset` when it is the last one (a claim behind
    /// a later one stays: the addresses are not reused until the reservation goes). Mappings are
    /// unmapped last to first (see the module's documentation), so a claim is the last one when
    /// it is given back, unless a mapping after it could not be unmapped.
    fn unclaim(&self, offset: usize, size: usize) {
        let _ = self.mapped_end.compare_exchange(offset + size, offset, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let free = || -> Result<()> {
            let d = driver()?;
            // SAFETY: the exact range this value reserved, freed once, after every mapping in it
            // (each mapping holds the reservation) was unmapped.
            unsafe { cu_call!(d, cuMemAddressFree(self.ptr, self.size)) }?;
            Ok(())
        };
        if let Err(error) = free() {
            record_drop_error("virtual address reservation", error);
        }
    }
}

/// A physical allocation mapped at an address of a reservation, with its access set.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) ptr: DevicePtr,
    pub(crate) physical: Arc<Physical>,
    reservation: Arc<Reservation>,
}

impl Mapping {
    /// `cuMemMap` of the whole of `physical` at `ptr` (inside `reservation`), then
    /// `cuMemSetAccess` with the allocation's descriptors; unmapped again if that fails. The
    /// addresses stay claimed on a failure: the caller, who claimed them, gives them back once
    /// (a mapping gives its addresses back only when it was made and is dropped: both giving
    /// them back could undo another thread's claim of the same addresses in between).
    fn map(ptr: DevicePtr, physical: Arc<Physical>, reservation: Arc<Reservation>) -> Result<Arc<Mapping>> {
        // SAFETY: the range lies inside `reservation`, claimed for it (`map_contiguously`,
        // `Claim::map` and `Reservation::map_at_end`, the only callers, place it so).
        unsafe { map_physical(ptr, &physical) }?;
        Ok(Arc::new(Mapping { ptr, physical, reservation }))
    }

    /// The mapping's size.
    pub(crate) fn size(&self) -> usize {
        self.physical.size
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the exact range this value mapped, unmapped once; whoever let go of the last
        // range holding it waited for the work using it first (see `release`).
        match unsafe { unmap(self.ptr, self.physical.size) } {
            // The addresses are free again: a growth may map there. (The offset lies inside the
            // reservation, whose size is a `usize`: the cast is lossless.)
            Ok(()) => self.reservation.unclaim((self.ptr - self.reservation.ptr) as usize, self.physical.size),
            Err(error) => record_drop_error("virtual memory mapping", error),
        }
    }
}

/// `cuMemMap` of the whole of `physical` at `ptr`, then `cuMemSetAccess` with its access
/// descriptors; unmapped again if that fails (nothing stays mapped on an error).
///
/// # Safety
/// `ptr..ptr + physical.size` lies inside a reservation this process holds, with nothing mapped
/// there, and stays reserved while mapped.
pub(crate) unsafe fn map_physical(ptr: DevicePtr, physical: &Physical) -> Result<()> {
    let d = driver()?;
    // SAFETY: the caller's range is reserved and unmapped; the handle is live while `physical` is.
    unsafe { cu_call!(d, cuMemMap(ptr, physical.size, 0, physical.handle, 0)) }?;
    if !physical.access.is_empty() {
        let access = &physical.access;
        // SAFETY: `access` holds `access.len()` initialized descriptors; the range was just
        // mapped.
        let set = unsafe { cu_call!(d, cuMemSetAccess(ptr, physical.size, access.as_ptr(), access.len())) };
        if let Err(error) = set {
            // SAFETY: mapped just above and handed to no one: unmapped once, here.
            if let Err(unmap) = unsafe { cu_call!(d, cuMemUnmap(ptr, physical.size)) } {
                record_drop_error("virtual memory mapping (access refused)", unmap.into());
            }
            return Err(error.into());
        }
    }
    Ok(())
}

/// `cuMemUnmap` of `size` bytes at `ptr`.
///
/// # Safety
/// Exactly one mapping of this process lies there, and no work that uses it is queued or
/// running (unmapping is not stream-ordered).
pub(crate) unsafe fn unmap(ptr: DevicePtr, size: usize) -> Result<()> {
    let d = driver()?;
    // SAFETY: as the caller promises.
    unsafe { cu_call!(d, cuMemUnmap(ptr, size)) }?;
    Ok(())
}

/// The contiguous mappings one buffer spans, from `base`; let go of last to first when dropped.
#[derive(Debug)]
pub(crate) struct Range {
    pub(crate) base: DevicePtr,
    pub(crate) mappings: Vec<Arc<Mapping>>,
}

impl Drop for Range {
    /// Lets go of the mappings last to first, so that each one this range held last is unmapped
    /// after the ones behind it and gives its addresses back to its reservation (a `Vec` drops
    /// first to last: the claims of all but the last chunk would stay, and the ranges they grew
    /// from would move at their next growth instead of growing in place).
    fn drop(&mut self) {
        while let Some(mapping) = self.mappings.pop() {
            drop(mapping);
        }
    }
}

impl Range {
    /// A range without memory (of an empty buffer).
    pub(crate) fn empty() -> Range {
        Range { base: 0, mappings: Vec::new() }
    }

    /// The bytes mapped.
    pub(crate) fn mapped_size(&self) -> usize {
        self.mappings.iter().map(|m| m.size()).sum()
    }

    /// Claims the `size` bytes right after the range inside the reservation of its last chunk,
    /// when they fit there and nothing is mapped after the range: where it can grow in place
    /// without asking the driver for an address. `None` otherwise (and for an empty range).
    pub(crate) fn claim_after(&self, size: usize) -> Option<Claim> {
        let last = self.mappings.last()?;
        let reservation = &last.reservation;
        // Inside the reservation, whose size is a `usize`: the cast is lossless.
        let offset = (last.ptr - reservation.ptr) as usize + last.size();
        reservation.claim(offset, size).then(|| Claim {
            reservation: Arc::clone(reservation),
            offset,
            size,
            mapped: false,
        })
    }
}

/// Addresses claimed in a reservation for one new chunk ([`Range::claim_after`]); given back
/// when dropped unless mapped.
#[derive(Debug)]
pub(crate) struct Claim {
    reservation: Arc<Reservation>,
    offset: usize,
    size: usize,
    mapped: bool,
}

impl Claim {
    /// Maps `physical` (of the claimed size) at the claimed addresses: `range` with one more
    /// chunk, at the same base. On a failure the claim is given back (dropped).
    pub(crate) fn map(mut self, range: &Range, physical: Arc<Physical>) -> Result<Range> {
        debug_assert_eq!(physical.size, self.size, "the chunk fills the claim");
        let ptr = self.reservation.ptr + self.offset as DevicePtr;
        let mapping = Mapping::map(ptr, physical, Arc::clone(&self.reservation))?;
        // The mapping gives the addresses back when it is unmapped.
        self.mapped = true;
        let mut mappings = range.mappings.clone();
        mappings.push(mapping);
        Ok(Range { base: range.base, mappings })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.mapped {
            self.reservation.unclaim(self.offset, self.size);
        }
    }
}

/// Mapping the chunk at `index` (from 0, `size` bytes) of [`map_contiguously`] failed with
/// `error`; the chunks before it were unmapped again.
#[derive(Debug)]
pub(crate) struct ChunkMapFailure {
    pub(crate) index: usize,
    pub(crate) size: usize,
    pub(crate) error: Error,
}

/// Maps `chunks` one after another from the start of `reservation`, each with its access: the
/// range of one buffer. The caller reserved at least the chunks' total size. On a failure the
/// chunks mapped so far are unmapped again (the range made so far drops, last to first) and the
/// failure names the chunk.
pub(crate) fn map_contiguously(
    reservation: &Arc<Reservation>,
    chunks: impl IntoIterator<Item = Arc<Physical>>,
) -> Result<Range, ChunkMapFailure> {
    let mut range = Range { base: reservation.ptr, mappings: Vec::new() };
    let mut offset = 0usize;
    for (index, physical) in chunks.into_iter().enumerate() {
        let size = physical.size;
        // A fresh reservation, nothing mapped in it yet: each claim follows the last one.
        let claimed = reservation.claim(offset, size);
        debug_assert!(claimed, "the chunks fit in a fresh reservation");
        let mapping = Mapping::map(reservation.ptr + offset as DevicePtr, physical, Arc::clone(reservation))
            .map_err(|error| ChunkMapFailure { index, size, error })?;
        range.mappings.push(mapping);
        offset += size;
    }
    Ok(range)
}
