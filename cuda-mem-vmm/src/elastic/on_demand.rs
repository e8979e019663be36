//! `OnDemandRange`: a reservation much larger than memory whose pages are mapped as what is
//! used grows and unmapped as it shrinks (kvcached's KV cache).

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::access::{ElasticAccess, Gate};

use cuda_mem_core::history::{self, MemoryEventKind, ResourceId};
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{Buffer, DevicePtr, ForeignMemory, Stream};

use super::backing::{Backing, exclusive, release_after};
use crate::error::{DeferCause, ElasticMemory, Result, VmmError};
use crate::release::wait_for;
use crate::resource::{VirtualMemoryResource, round_up};

/// An on-demand range's figures ([`OnDemandRange::statistics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OnDemandStatistics {
    /// The bytes of a page.
    pub page_size: usize,
    /// The range's pages.
    pub pages: usize,
    /// The pages mapped now.
    pub mapped_pages: usize,
    /// The bytes mapped now.
    pub mapped_bytes: usize,
    /// The most bytes mapped at once.
    pub peak_mapped_bytes: usize,
    /// Pages mapped, in all.
    pub pages_mapped: u64,
    /// Pages unmapped (their memory given back to the device), in all.
    pub pages_unmapped: u64,
    /// [`map`](OnDemandRange::map) calls refused for want of physical memory.
    pub failed_maps: u64,
}

/// A reservation of many pages (each a multiple of the resource's granularity), mapped and
/// unmapped one run of pages at a time: the addresses stay the same, and only the pages in use
/// hold physical memory. A KV cache reserves the most it could ever hold and maps pages as
/// requests come; kernels index the whole range, and only mapped pages may be touched.
///
/// [`map`](OnDemandRange::map) is immediate (not stream-ordered): work enqueued after it may use
/// the pages. [`unmap`](OnDemandRange::unmap) waits for the stream whose work used them, then
/// gives their memory back to the device. Host-side copies go through an [`ElasticAccess`]
/// ([`access`](OnDemandRange::access)), which covers mapped pages only and holds off unmapping
/// while it lives. Dropping the range waits for its stream, unmaps every page and frees the
/// addresses.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, Stream};
/// use cuda_mem_vmm::{OnDemandRange, VirtualMemoryResource};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let resource = VirtualMemoryResource::new(device, Default::default())?;
/// // 64 GiB of addresses, 2 MiB pages: nothing mapped yet.
/// let kv = OnDemandRange::new(&resource, 64 << 30, 2 << 20, &stream)?;
/// assert_eq!(kv.statistics().mapped_bytes, 0);
///
/// kv.map(0..4)?; // 8 MiB, at the range's start
/// kv.access(0, 4096)?.view_mut::<u8>()?.copy_from_slice(&[1; 4096], &stream)?;
/// assert_eq!(kv.statistics().mapped_bytes, 8 << 20);
/// assert!(kv.access(8 << 20, 1).is_err()); // page 4 is not mapped
///
/// let returned = kv.unmap(0..4, &stream)?; // after the stream's work
/// assert_eq!(returned, 8 << 20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct OnDemandRange {
    resource: Arc<VirtualMemoryResource>,
    /// The first address (the reservation's, fixed for the range's life).
    ptr: DevicePtr,
    /// Read by each access; written by map and unmap.
    backing: RwLock<Backing>,
    /// The stream whose work unmapping at drop waits for.
    stream: Stream,
    counters: Mutex<OnDemandStatistics>,
}

impl OnDemandRange {
    /// Reserves `capacity` bytes (rounded up to whole pages) in pages of `page_size` bytes
    /// (rounded up to the resource's granularity), none mapped. Dropping it waits for
    /// `stream`'s work.
    ///
    /// # Errors
    /// [`VmmError::SizeOverflow`] for sizes that do not round up; the driver's refusal to
    /// reserve the addresses.
    pub fn new(
        resource: &Arc<VirtualMemoryResource>,
        capacity: usize,
        page_size: usize,
        stream: &Stream,
    ) -> Result<Arc<OnDemandRange>> {
        let page = round_up(page_size.max(1), resource.granularity())?;
        let backing = Backing::reserve(resource, round_up(capacity.max(1), page)?, page)?;
        let (ptr, pages) = (backing.ptr(), backing.chunks.len());
        let range = Arc::new(OnDemandRange {
            resource: Arc::clone(resource),
            ptr,
            backing: RwLock::new(backing),
            stream: stream.clone(),
            counters: Mutex::new(OnDemandStatistics { page_size: page, pages, ..OnDemandStatistics::default() }),
        });
        cuda_mem_core::snapshot::register(&range);
        Ok(range)
    }

    /// The resource its pages' memory comes from.
    pub fn resource(&self) -> &Arc<VirtualMemoryResource> {
        &self.resource
    }

    /// `f` of the backing (for snapshots).
    pub(super) fn with_backing<T>(&self, f: impl FnOnce(&Backing) -> T) -> T {
        f(&self.read())
    }

    /// Records `kind` for `pages` (runs of them: a map's or an unmap's) in the history.
    fn record(&self, backing: &Backing, kind: MemoryEventKind, pages: &[usize], stream: Option<&Stream>) {
        let page = backing.chunk_size();
        for &index in pages {
            let at = backing.ptr() + (index * page) as DevicePtr;
            history::record(kind, at, page, stream, ResourceId::of(self));
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Backing> {
        self.backing.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backing, for mapping or unmapping: refused while an access lives.
    fn exclusive(&self) -> Result<RwLockWriteGuard<'_, Backing>> {
        exclusive(&self.backing, || ElasticMemory::OnDemandRange { ptr: self.ptr })
    }

    fn counters(&self) -> MutexGuard<'_, OnDemandStatistics> {
        self.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The first address (the same for the range's life).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The bytes reserved (whole pages).
    pub fn size(&self) -> usize {
        self.read().size()
    }

    /// The bytes of a page.
    pub fn page_size(&self) -> usize {
        self.read().chunk_size()
    }

    /// The pages.
    pub fn page_count(&self) -> usize {
        self.read().chunks.len()
    }

    /// Whether page `page` is mapped (`false` past the end).
    pub fn is_mapped(&self, page: usize) -> bool {
        let backing = self.read();
        page < backing.chunks.len() && backing.is_mapped(page)
    }

    /// The mapped pages, as runs in order.
    pub fn mapped_pages(&self) -> Vec<Range<usize>> {
        let backing = self.read();
        let mut runs: Vec<Range<usize>> = Vec::new();
        for page in (0..backing.chunks.len()).filter(|&page| backing.is_mapped(page)) {
            match runs.last_mut() {
                Some(run) if run.end == page => run.end += 1,
                _ => runs.push(page..page + 1),
            }
        }
        runs
    }

    /// Its figures now.
    pub fn statistics(&self) -> OnDemandStatistics {
        let backing = self.read();
        let mut figures = *self.counters();
        figures.mapped_bytes = backing.mapped_bytes();
        figures.mapped_pages = figures.mapped_bytes / backing.chunk_size();
        figures
    }

    /// Checks that `pages` lie in the range.
    fn check(&self, backing: &Backing, pages: &Range<usize>) -> Result<()> {
        let count = backing.chunks.len();
        if pages.start > pages.end || pages.end > count {
            return Err(VmmError::PagesOutOfRange { first: pages.start, end: pages.end, count });
        }
        Ok(())
    }

    /// Maps every unmapped page of `pages` (a page's memory is one physical allocation, with
    /// the resource's access), and returns how many it mapped. All or nothing: on an error the
    /// pages this call mapped are unmapped again.
    ///
    /// # Errors
    /// - [`VmmError::PagesOutOfRange`].
    /// - [`VmmError::InUse`]: an [`ElasticAccess`] lives.
    /// - [`VmmError::PhysicalMemoryExhausted`]: the device has not the memory (counted in
    ///   [`OnDemandStatistics::failed_maps`]).
    /// - Driver errors.
    pub fn map(&self, pages: Range<usize>) -> Result<usize> {
        let mut backing = self.exclusive()?;
        self.check(&backing, &pages)?;
        let page = backing.chunk_size();
        let before = backing.mapped_bytes();
        let mut mapped = Vec::new();
        for index in pages.clone() {
            if backing.is_mapped(index) {
                continue;
            }
            let resource = &self.resource;
            if let Err(source) = backing.map(index, || resource.create_chunk(page).map_err(VmmError::into_core)) {
                for done in mapped.into_iter().rev() {
                    // SAFETY: mapped just now by this call; no work was told of it.
                    match unsafe { backing.unmap_keeping(done) } {
                        Ok(()) => backing.release_chunk(done),
                        Err(error) => cuda_mem_core::record_drop_error("on-demand page (undoing a map)", error),
                    }
                }
                let requested = pages.filter(|&index| !backing.is_mapped(index)).count() * page;
                return Err(if source.cuda_code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
                    self.counters().failed_maps += 1;
                    VmmError::PhysicalMemoryExhausted { requested, mapped: before, source }
                } else {
                    VmmError::Core(source)
                });
            }
            mapped.push(index);
        }
        self.record(&backing, MemoryEventKind::SegmentGrow, &mapped, None);
        let mut counters = self.counters();
        counters.pages_mapped += mapped.len() as u64;
        counters.peak_mapped_bytes = counters.peak_mapped_bytes.max(backing.mapped_bytes());
        Ok(mapped.len())
    }

    /// Unmaps every mapped page of `pages` once `stream`'s work is done (the work that used
    /// them: synchronized first), gives their memory back to the device, and returns how many
    /// bytes it gave. All or nothing: should an unmapping fail, the pages unmapped before it
    /// are mapped again with their memory.
    ///
    /// # Errors
    /// - [`VmmError::PagesOutOfRange`].
    /// - [`VmmError::InUse`]: an [`ElasticAccess`] lives.
    /// - [`VmmError::CapturingStream`]: `stream` is capturing (unmapping cannot be captured).
    /// - [`VmmError::Core`]: reading its capture status, or waiting for it, failed.
    /// - Driver errors.
    pub fn unmap(&self, pages: Range<usize>, stream: &Stream) -> Result<usize> {
        let mut backing = self.exclusive()?;
        self.check(&backing, &pages)?;
        // Nothing is unmapped unless the stream's work is known to be done.
        match wait_for(stream) {
            Ok(()) => {}
            Err(DeferCause::Capturing) => return Err(VmmError::CapturingStream),
            Err(DeferCause::CaptureStatus(error) | DeferCause::Synchronize(error)) => {
                return Err(VmmError::Core(error));
            }
        }
        let mut unmapped = Vec::new();
        for index in pages.rev() {
            if !backing.is_mapped(index) {
                continue;
            }
            // SAFETY: `stream`, whose work used the page, was waited for, and no access lives
            // (the backing is held exclusively).
            if let Err(error) = unsafe { backing.unmap_keeping(index) } {
                for done in unmapped.into_iter().rev() {
                    if let Err(again) = backing.map_held(done) {
                        cuda_mem_core::record_drop_error("on-demand page (undoing an unmap)", again);
                    }
                }
                return Err(error.into());
            }
            unmapped.push(index);
        }
        self.record(&backing, MemoryEventKind::SegmentShrink, &unmapped, Some(stream));
        let returned = backing.release_held();
        self.counters().pages_unmapped += unmapped.len() as u64;
        Ok(returned)
    }

    /// `len` bytes at `offset`, all in mapped pages, as a [`Buffer`] (through `Deref`) for
    /// copies and views; the pages stay mapped while the access lives.
    ///
    /// # Errors
    /// - [`VmmError::NotMapped`]: a page of them is not mapped (or they pass the range's end:
    ///   the page past it).
    /// - Driver errors are none: no driver call is made.
    pub fn access(&self, offset: usize, len: usize) -> Result<ElasticAccess<'_>> {
        let backing = self.read();
        let page = backing.chunk_size();
        let end = offset.saturating_add(len);
        let pages = offset / page..end.div_ceil(page).max(offset / page + 1);
        if let Some(missing) = pages.clone().find(|&index| index >= backing.chunks.len() || !backing.is_mapped(index)) {
            return Err(VmmError::NotMapped { offset, len, page: missing });
        }
        let memory = ForeignMemory::device_memory(self.resource.device());
        // SAFETY: every page the bytes lie in is mapped, and stays so while the access lives:
        // it holds the backing for reading, which unmapping needs exclusively; work enqueued
        // through it is waited for by unmapping (its stream) or is ordered before that stream,
        // as the type's documentation asks.
        let buffer = unsafe { Buffer::from_raw(backing.ptr() + offset as DevicePtr, len, memory) };
        Ok(ElasticAccess::new(Gate::Pages { _held: backing }, buffer))
    }
}

impl Drop for OnDemandRange {
    /// Unmaps every page after the range's stream's work; a stream that cannot be waited for
    /// keeps them mapped (recorded), as a virtual buffer's release does.
    fn drop(&mut self) {
        let owned = self.backing.get_mut().unwrap_or_else(PoisonError::into_inner);
        let hollow = owned.hollow();
        release_after(std::mem::replace(owned, hollow), &self.stream);
    }
}
