//! `VirtualMemoryResource` as [`ExpandableMemory`]: ranges that a
//! [`CachingResource`](cuda_mem_core::CachingResource) grows its expandable segments in. Each
//! is a reservation of its own with chunks mapped one after another from its start (one chunk per
//! growth, the size asked), and unmapped last to first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cuda_mem_core::{DevicePtr, Error, ExpandableMemory, Stream};

use crate::error::{DeferCause, VmmError};
use crate::pieces::{Mapping, Range, Reservation};
use crate::release::{release_after, release_deferred, wait_for};
use crate::resource::{VirtualMemoryResource, round_up};

/// One expandable range: its reservation and the chunks mapped in it, in address order.
#[derive(Debug)]
struct Expandable {
    reservation: Arc<Reservation>,
    mappings: Vec<Arc<Mapping>>,
}

impl Expandable {
    fn mapped(&self) -> usize {
        self.mappings.iter().map(|mapping| mapping.size()).sum()
    }

    /// Unmaps the chunks that lie wholly from `keep` on, last to first (each gives its addresses
    /// back as it goes, see `pieces`).
    fn unmap_from(&mut self, keep: usize) {
        while let Some(last) = self.mappings.last() {
            // Inside the reservation, whose size is a `usize`: the cast is lossless.
            if ((last.ptr - self.reservation.ptr) as usize) < keep {
                break;
            }
            drop(self.mappings.pop());
        }
    }
}

impl Drop for Expandable {
    fn drop(&mut self) {
        self.unmap_from(0);
    }
}

/// A resource's expandable ranges, by base address; each behind a lock of its own, so that one
/// range's driver calls hold up no other's.
#[derive(Debug, Default)]
pub(crate) struct ExpandableRanges(Mutex<HashMap<DevicePtr, Arc<Mutex<Expandable>>>>);

impl ExpandableRanges {
    /// Each range's base, the bytes mapped in it and the bytes reserved.
    pub(crate) fn views(&self) -> Vec<(DevicePtr, usize, usize)> {
        let ranges: Vec<_> = self.0.lock().unwrap_or_else(PoisonError::into_inner).values().cloned().collect();
        ranges
            .iter()
            .map(|range| {
                let range = range.lock().unwrap_or_else(PoisonError::into_inner);
                (range.reservation.ptr, range.mapped(), range.reservation.size)
            })
            .collect()
    }

    fn get(&self, base: DevicePtr) -> Result<Arc<Mutex<Expandable>>, VmmError> {
        let ranges = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        ranges.get(&base).cloned().ok_or(VmmError::ForeignPointer { ptr: base, size: 0 })
    }
}

/// Waits for `stream`'s work before unmapping, as a buffer's release does; a stream that cannot
/// be waited for now (capturing) refuses, and nothing is unmapped.
fn wait_before_unmapping(stream: &Stream) -> cuda_mem_core::Result<()> {
    wait_for(stream).map_err(|cause| match cause {
        DeferCause::Capturing => Error::CapturingStream,
        DeferCause::CaptureStatus(error) | DeferCause::Synchronize(error) => error,
    })
}

// SAFETY: a range is a reservation of its own (`reserve`), in which this resource alone maps:
// `grow` maps one new chunk of this resource's memory, with its access, right after the chunks
// mapped before (a claim at the reservation's mapped end), and reports their sum; chunks are
// unmapped only by `shrink` (those wholly from `keep` on, after waiting for the stream) and
// `release`, or when the resource, and with it the range, is dropped.
unsafe impl ExpandableMemory for VirtualMemoryResource {
    fn granularity(&self) -> usize {
        VirtualMemoryResource::granularity(self)
    }

    fn reserve(&self, size: usize) -> cuda_mem_core::Result<DevicePtr> {
        release_deferred();
        let size = round_up(size.max(1), VirtualMemoryResource::granularity(self))?;
        let reservation = Reservation::reserve(size, self.alignment(), 0)?;
        let base = reservation.ptr;
        let range = Expandable { reservation, mappings: Vec::new() };
        self.expandable.0.lock().unwrap_or_else(PoisonError::into_inner).insert(base, Arc::new(Mutex::new(range)));
        cuda_mem_core::memory_event!(TRACE, size, ptr = %format_args!("{base:#x}"), "expandable range reserved");
        Ok(base)
    }

    fn grow(&self, base: DevicePtr, size: usize) -> cuda_mem_core::Result<usize> {
        let range = self.expandable.get(base)?;
        let mut range = range.lock().unwrap_or_else(PoisonError::into_inner);
        let mapped = range.mapped();
        let past = |reserved| VmmError::PastReservation { base, mapped, size, reserved };
        let granular = size > 0 && size.is_multiple_of(VirtualMemoryResource::granularity(self));
        if !granular || mapped.checked_add(size).is_none_or(|end| end > range.reservation.size) {
            return Err(past(range.reservation.size).into());
        }
        let physical = self.create_chunk(size)?;
        let reservation = Arc::clone(&range.reservation);
        let mapping = reservation.map_at_end(physical).ok_or_else(|| past(reservation.size))??;
        range.mappings.push(mapping);
        Ok(mapped + size)
    }

    unsafe fn shrink(&self, base: DevicePtr, keep: usize, stream: &Stream) -> cuda_mem_core::Result<usize> {
        let range = self.expandable.get(base)?;
        let mut range = range.lock().unwrap_or_else(PoisonError::into_inner);
        if range.mapped() <= keep {
            return Ok(range.mapped());
        }
        wait_before_unmapping(stream)?;
        range.unmap_from(keep);
        Ok(range.mapped())
    }

    /// Unmapped after `stream`'s work, as a virtual buffer's memory is: where the stream cannot
    /// be waited for now, the release is deferred to a later safe point (recorded as a drop
    /// error, see [`release_deferred`](crate::release_deferred)) and the range is this
    /// resource's to let go of from then on, so this returns `Ok`.
    unsafe fn release(&self, base: DevicePtr, stream: &Stream) -> cuda_mem_core::Result<()> {
        let range = self.expandable.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&base);
        let range = range.ok_or(VmmError::ForeignPointer { ptr: base, size: 0 })?;
        let mappings = std::mem::take(&mut range.lock().unwrap_or_else(PoisonError::into_inner).mappings);
        // The mappings as a buffer's range, let go of last to first once the stream's work is
        // done; each holds the reservation, which goes with the last of them (or now, with none).
        if let Err(deferred) = release_after(Arc::new(Range { base, mappings }), stream) {
            cuda_mem_core::record_drop_error("expandable range (release deferred)", deferred.into_core());
        }
        Ok(())
    }
}
