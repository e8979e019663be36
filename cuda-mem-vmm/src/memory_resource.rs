//! `VirtualMemoryResource` as a [`MemoryResource`]: every buffer it hands out (through the trait,
//! or inside a [`VirtualBuffer`](crate::VirtualBuffer)) is an owning [`Buffer`] whose memory
//! comes back through `deallocate_raw`, which finds its range again by pointer and size and lets
//! go of it after the stream's work (see `release`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cuda_mem_core::{Buffer, Device, DevicePtr, Location, MemoryResource, Stream};

use crate::error::VmmError;
use crate::options::AllocationType;
use crate::pieces::Range;
use crate::release::{release_after, release_deferred};
use crate::resource::VirtualMemoryResource;

/// The ranges of the buffers a resource handed out, by pointer and size.
///
/// Several buffers may share a pointer and a size (a buffer grown to a size it already covers
/// aliases its range), so each key holds a range per buffer. Ranges that start at the same
/// address are prefixes of one another (two mappings cannot hold one address), so any range
/// under a key covers the bytes of every buffer under it: which one a release takes does not
/// matter.
#[derive(Debug, Default)]
pub(crate) struct LiveRanges(Mutex<RangesByBuffer>);

/// A range per buffer, under the buffer's pointer and size.
type RangesByBuffer = HashMap<(DevicePtr, usize), Vec<Arc<Range>>>;

impl LiveRanges {
    fn insert(&self, ptr: DevicePtr, size: usize, range: Arc<Range>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).entry((ptr, size)).or_default().push(range);
    }

    fn take(&self, ptr: DevicePtr, size: usize) -> Option<Arc<Range>> {
        let mut live = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ranges = live.get_mut(&(ptr, size))?;
        let range = ranges.pop();
        if ranges.is_empty() {
            live.remove(&(ptr, size));
        }
        range
    }
}

impl VirtualMemoryResource {
    /// An owning buffer of `size` bytes of `range` (from its start), freed through this
    /// resource's `deallocate_raw` on `stream`, which then lets go of `range`.
    pub(crate) fn adopt(self: &Arc<Self>, range: Arc<Range>, size: usize, stream: &Stream) -> Buffer {
        let ptr = range.base;
        if size > 0 {
            self.live.insert(ptr, size, range);
        }
        let resource: Arc<dyn MemoryResource> = Arc::clone(self) as _;
        // SAFETY: `deallocate_raw` accepts exactly what is registered here, as for memory from
        // `allocate_raw`: `size` bytes (at most the range's) at `ptr`, mapped while the range
        // registered with them lives, which `deallocate_raw` takes out once. A buffer of 0 bytes
        // is never given back.
        unsafe { Buffer::from_raw_owned(ptr, size, resource, stream) }
    }
}

// SAFETY: `allocate_raw` returns the start of a range of at least `size` mapped bytes, kept in
// `live` until `deallocate_raw` takes it out, and unmapped only after that, once the stream's work
// is done; the memory is never host-accessible (no access descriptor names the host) and devices
// access it through the access descriptors set on every mapping.
unsafe impl MemoryResource for VirtualMemoryResource {
    /// A chunk, a reservation and a mapping of at least `size` bytes (rounded up to the
    /// granularity); not stream-ordered, so usable by any work enqueued after this call.
    fn allocate_raw(&self, size: usize, _stream: &Stream) -> cuda_mem_core::Result<DevicePtr> {
        release_deferred();
        let range = self.map_new(size).map_err(VmmError::into_core)?;
        let ptr = range.base;
        self.live.insert(ptr, size, Arc::new(range));
        Ok(ptr)
    }

    /// Lets go of the range after `stream`'s work: synchronizes `stream` and unmaps what no
    /// other buffer maps. If `stream` is capturing (or cannot be waited for), nothing is
    /// synchronized and nothing unmapped: the release is deferred (see
    /// [`release_deferred`](crate::release_deferred)) and recorded as a drop error
    /// ([`cuda_mem_core::take_drop_errors`]). A deferral is not a failure to free: the range is
    /// this resource's to release from then on, so the caller must not free it again (the
    /// trait's `Err` means "still yours").
    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> cuda_mem_core::Result<()> {
        let range =
            self.live.take(ptr, size).ok_or(VmmError::ForeignPointer { ptr, size }).map_err(VmmError::into_core)?;
        if let Err(deferred) = release_after(range, stream) {
            cuda_mem_core::record_drop_error("virtual memory (release deferred)", deferred.into_core());
        }
        Ok(())
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        false
    }

    fn device(&self) -> Option<Device> {
        matches!(self.location(), Location::Device(_)).then(|| VirtualMemoryResource::device(self))
    }

    fn is_managed(&self) -> bool {
        self.options().allocation_type == AllocationType::Managed
    }
}

impl LiveRanges {
    /// Each live buffer's pointer and size, and the bytes its range maps.
    pub(crate) fn views(&self) -> Vec<(DevicePtr, usize, usize)> {
        let live = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        live.iter()
            .flat_map(|(&(ptr, size), ranges)| ranges.iter().map(move |range| (ptr, size, range.mapped_size())))
            .collect()
    }
}
