//! [`CachingResource`]: the caching memory resource over an upstream resource.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::options::{CachingOptions, SizeClass};
use super::segments::{Arena, BlockState, Segment};
use super::snapshot::{BlockSnapshot, BlockUse, SegmentSnapshot};
use super::statistics::{CachingStatistics, Counters, StreamStatistics};
use super::stream_state::{LastUse, Locked, StreamState, Taken, quiet};
use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::DevicePtr;
use crate::drop_errors::on_drop;
use crate::error::{CachingError, CachingOutOfMemory, Error, Result};
use crate::history::{self, MemoryEventKind, ResourceId};
use crate::memory_resource::MemoryResource;
use crate::pool::MemoryPool;
use crate::resources::expandable::ExpandableMemory;
use crate::stream::Stream;

/// A memory resource that keeps what is freed and hands it out again without asking the
/// upstream resource (PyTorch's CUDA caching allocator, RMM's pool resource), over any resource
/// of this crate: a pool resource, an adaptor, an `Arc<dyn MemoryResource>`.
///
/// # How it caches
///
/// Memory comes from the upstream resource in *segments* (one upstream allocation each) that
/// are split into *blocks*; the sizes follow [`CachingOptions`] (PyTorch's policy by default:
/// requests rounded to 512 B; small ones, up to 1 MiB, from 2 MiB segments; large ones from
/// 20 MiB segments or a segment of their own; large blocks not split into slivers). Small and
/// large blocks never share a segment.
///
/// Each stream has its own state, behind its own lock: the segments first allocated for it (or
/// taken over, below) and the bins of their free blocks, by size class. A block freed on its
/// segment's stream goes back to that stream's bins, merged with its free neighbours, and the
/// next allocation on the stream takes the best fit from them: no driver call, and of the locks
/// other streams take, only the read lock of the streams' registry (new streams and
/// [`empty_cache`](CachingResource::empty_cache) write it).
/// The block a stream freed last waits, unmerged, in a short list in front of the bins: a
/// request of its size on that stream takes it back with one lookup (the common pair of a free
/// and an allocation of the same size); anything else merges the list first.
/// Segments go back upstream only through [`empty_cache`](CachingResource::empty_cache) and
/// [`trim`](CachingResource::trim), when an allocation would otherwise fail, and on drop.
///
/// # Expandable segments
///
/// Made with [`with_expandable_segments`](CachingResource::with_expandable_segments) over an
/// [`ExpandableMemory`] upstream (`cuda-mem-vmm`'s `VirtualMemoryResource`), a stream's segment
/// is a range of addresses reserved once, mapped as the stream needs more: a request no free
/// block serves grows it at its end instead of adding a segment (PyTorch's
/// `expandable_segments`), and [`trim`](CachingResource::trim) unmaps its free end. One
/// segment serves every size (or one per size class, with
/// [`CachingOptions::expandable_small_pool`]).
///
/// # Streams
///
/// A block is never handed to a stream that is not ordered after its last use:
///
/// - freed on its segment's stream (where a [`Buffer`] frees it after ordering every other
///   stream it was used on before that stream's next work), it is reused by that stream at
///   once;
/// - freed on another stream, an event is recorded there at the free, and no stream takes the
///   block before that event has completed (asked without waiting);
/// - another stream that finds nothing in its own bins may take a free block of another
///   stream's once an event recorded on that stream after the block's free has completed;
///   otherwise it takes a new segment ([`CachingOptions::cross_stream_reuse`] turns this off).
///   When the block it takes is a whole segment (nothing of it handed out or pending), it takes
///   the segment over: the segment is its stream's from then on, and its frees there are
///   same-stream frees (a new stream that lives on from the old streams' memory does not pay
///   for an event at every free and reuse).
///
/// # Graph capture
///
/// An allocation on a capturing stream is passed through to the upstream resource (a pool
/// refuses it with [`Error::CapturingStream`]; a
/// [`GraphMemoryResource`](crate::GraphMemoryResource) makes it graph memory) and its free
/// passes through too: it is never served from the cache nor cached, so no replay of a graph can
/// race with a block another stream reuses. Blocks are not given back upstream on a capturing
/// stream.
///
/// # Out of memory
///
/// When the upstream refuses a new segment, the cached segments that are wholly free go back
/// upstream and the upstream is asked once more ([`CachingStatistics::retries`]); if it refuses
/// again, the allocation fails with [`CachingError::OutOfMemory`]: what was asked, what is
/// allocated, reserved and cached, and the largest free block
/// ([`CachingStatistics::out_of_memory`]).
///
/// # Sharing
///
/// A block is part of a larger upstream allocation, which the driver would export whole: the
/// resource names no pool ([`MemoryResource::memory_pool`] is `None`), and
/// [`MemoryPool::export_buffer`] refuses its buffers with
/// [`SharingError::CachedBlock`](crate::SharingError::CachedBlock).
///
/// # Drop
///
/// Every segment goes back upstream, on its stream, after the last uses of its blocks freed on
/// other streams (that stream waits for their events). Errors are recorded
/// ([`take_drop_errors`](crate::take_drop_errors)); a segment that cannot be ordered after its
/// uses is left allocated rather than freed under them.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{CachingOptions, CachingResource, Device, DeviceMemoryResource, Stream};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let cache = CachingResource::new(DeviceMemoryResource::new(device, Default::default())?, CachingOptions::default())?;
/// let first = cache.allocate(64 << 10, &stream)?;
/// let address = first.ptr();
/// drop(first);
/// // The same block again, without a driver call.
/// assert_eq!(cache.allocate(64 << 10, &stream)?.ptr(), address);
/// let stats = cache.statistics();
/// assert_eq!((stats.small.segments.current, stats.small.reserved_bytes.current), (1, 2 << 20));
/// assert_eq!((stats.all.allocated_bytes.current, stats.all.allocated_bytes.peak), (0, 64 << 10));
/// cache.empty_cache()?;
/// assert_eq!(cache.statistics().all.reserved_bytes.current, 0);
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[doc(alias = "CUDACachingAllocator")]
#[doc(alias = "pool_memory_resource")]
#[derive(Debug)]
pub struct CachingResource {
    /// This resource among every one made in the process (never reused): what a thread's
    /// [`RECENT`] state is checked against.
    id: u64,
    upstream: Arc<dyn MemoryResource>,
    /// The upstream as expandable memory, and the addresses each expandable segment reserves:
    /// segments grow in place ([`with_expandable_segments`](CachingResource::with_expandable_segments)).
    expandable: Option<(Arc<dyn ExpandableMemory>, usize)>,
    options: CachingOptions,
    /// Every stream's state; a new stream's is added under the write lock.
    streams: RwLock<Vec<Arc<StreamState>>>,
    /// Allocations passed through (capturing streams), by address, with their sizes.
    passed: Mutex<BTreeMap<DevicePtr, usize>>,
    /// How many are in `passed`: a free checks the map only when some are.
    passed_count: AtomicUsize,
    counters: Arc<Counters>,
    /// Held while segments go back upstream from every state (trim, out of memory).
    releasing: Mutex<()>,
}

impl CachingResource {
    /// A cache over `upstream` with the policy `options`.
    ///
    /// # Errors
    /// [`CachingError::InvalidOption`] when the options make no policy.
    pub fn new(upstream: Arc<dyn MemoryResource>, options: CachingOptions) -> Result<Arc<CachingResource>> {
        Self::build(upstream, None, options)
    }

    /// A cache over `upstream` whose segments grow in place (PyTorch's `expandable_segments`):
    /// each stream has a segment that is a range of addresses reserved up front
    /// ([`CachingOptions::expandable_reservation`]; the device's memory by default), into which
    /// the upstream maps memory as the cache needs more. One segment serves every size, unless
    /// [`CachingOptions::expandable_small_pool`] keeps a second one for small requests (as
    /// PyTorch does). A request that no free block
    /// serves grows the segment at its end by what it lacks, rounded up to 2 MiB
    /// ([`CachingOptions::small_segment`] or [`CachingOptions::large_segment_rounding`]), and a
    /// free block at the end joins the growth: instead of a new segment per shortfall, one
    /// segment that fits what the stream uses, and little memory kept in segments too small for
    /// the next request when sizes change step to step. [`trim`](CachingResource::trim) and
    /// [`empty_cache`](CachingResource::empty_cache) unmap a segment's free end (in the pieces
    /// it was mapped in) as well as give back wholly free segments. `cuda-mem-vmm`'s
    /// `VirtualMemoryResource` is such an upstream.
    ///
    /// # Errors
    /// [`CachingError::InvalidOption`] when the options make no policy, or when no reservation
    /// is set and the upstream names no device to take its size from; the driver's error when
    /// the device's memory cannot be read.
    pub fn with_expandable_segments(
        upstream: Arc<dyn ExpandableMemory>,
        options: CachingOptions,
    ) -> Result<Arc<CachingResource>> {
        let invalid =
            |option: &'static str, value: usize| Error::Caching(CachingError::InvalidOption { option, value });
        let reservation = match options.expandable_reservation_bytes() {
            Some(bytes) => bytes,
            None => upstream
                .device()
                .ok_or_else(|| invalid("expandable_reservation (to be set: the upstream names no device)", 0))?
                .total_memory()?,
        };
        let granularity = upstream.granularity().max(1);
        let reservation = reservation
            .max(1)
            .checked_next_multiple_of(granularity)
            .ok_or_else(|| invalid("expandable_reservation (at most the address space)", reservation))?;
        let resource: Arc<dyn MemoryResource> = Arc::clone(&upstream) as Arc<dyn MemoryResource>;
        Self::build(resource, Some((upstream, reservation)), options)
    }

    fn build(
        upstream: Arc<dyn MemoryResource>,
        expandable: Option<(Arc<dyn ExpandableMemory>, usize)>,
        options: CachingOptions,
    ) -> Result<Arc<CachingResource>> {
        options.validate()?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let resource = Arc::new(CachingResource {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            upstream,
            expandable,
            options,
            streams: RwLock::default(),
            passed: Mutex::default(),
            passed_count: AtomicUsize::new(0),
            counters: Arc::default(),
            releasing: Mutex::new(()),
        });
        crate::snapshot::register(&resource);
        Ok(resource)
    }

    /// The resource segments come from.
    #[doc(alias = "get_upstream_resource")]
    pub fn inner(&self) -> &Arc<dyn MemoryResource> {
        &self.upstream
    }

    /// The policy.
    pub fn options(&self) -> &CachingOptions {
        &self.options
    }

    /// The pool a rounded request is served from: as the options say, but with expandable
    /// segments and no [separate small pool](CachingOptions::expandable_small_pool), always the
    /// large one.
    #[inline]
    fn size_class(&self, rounded: usize) -> SizeClass {
        if self.expandable.is_some() && !self.options.has_expandable_small_pool() {
            SizeClass::Large
        } else {
            self.options.size_class(rounded)
        }
    }

    /// Records a segment's event in the memory history (when it is recorded).
    fn note(&self, kind: MemoryEventKind, address: DevicePtr, size: usize, stream: &Stream) {
        history::record(kind, address, size, Some(stream), ResourceId::of(self));
    }

    /// Whether segments grow in place
    /// ([`with_expandable_segments`](CachingResource::with_expandable_segments)).
    pub fn has_expandable_segments(&self) -> bool {
        self.expandable.is_some()
    }

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this resource (and
    /// its upstream) alive ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate)
    /// without the import). A zero-size request makes an empty buffer without asking the
    /// resource.
    ///
    /// # Errors
    /// As [`MemoryResource::allocate_raw`] of this resource.
    #[inline]
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows this resource and
    /// the stream ([`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped)
    /// without the import).
    ///
    /// # Errors
    /// As [`MemoryResource::allocate_raw`] of this resource.
    #[inline]
    pub fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(self, size, stream)
    }

    /// Everything counted so far.
    #[doc(alias = "memory_stats")]
    ///
    /// The current values are exact, and so are the peaks of segments and reserved bytes. Each
    /// stream counts its blocks under its own lock (the common path writes nothing other streams
    /// share), so a block figure's peak is the sum of the streams' peaks: exact where one stream
    /// allocates, at least the true peak where several do.
    pub fn statistics(&self) -> CachingStatistics {
        let locals: Vec<_> = self.states().iter().map(|state| state.lock().arena().local().clone()).collect();
        self.counters.read(&locals)
    }

    /// What `stream` holds: its blocks and the segments in its bins (`None` for a stream the
    /// cache keeps nothing for: it never allocated here, or
    /// [`empty_cache`](CachingResource::empty_cache) forgot it, having nothing left). The
    /// figures of every stream add up to [`statistics`](CachingResource::statistics)'s current
    /// values.
    pub fn stream_statistics(&self, stream: &Stream) -> Option<StreamStatistics> {
        let state = self.find_state(stream)?;
        let mut locked = state.lock();
        Some(locked.arena().local().read())
    }

    /// Starts every peak again from the current value.
    #[doc(alias = "reset_peak_memory_stats")]
    pub fn reset_peaks(&self) {
        for state in self.states() {
            state.lock().arena().reset_peaks();
        }
        self.counters.reset_peaks();
    }

    /// Gives every wholly free segment back upstream, and forgets the streams left without
    /// segments (their states hold them). Returns the bytes given back.
    ///
    /// # Errors
    /// The upstream's refusal to take a segment back (that segment stays cached).
    pub fn empty_cache(&self) -> Result<usize> {
        let released = self.trim(0)?;
        self.write_streams().retain(|state| {
            // Retired under its lock: an allocation that holds the state meanwhile sees it when
            // it adds its segment, and adds it to the stream's new state instead.
            !state.retire_if_empty(&mut state.lock())
        });
        Ok(released)
    }

    /// Gives wholly free segments back upstream until the bytes reserved and not allocated are
    /// at most `keep` (or no wholly free segment is left). Returns the bytes given back.
    /// Segments of a capturing stream stay.
    ///
    /// # Errors
    /// The upstream's refusal to take a segment back (that segment stays cached).
    pub fn trim(&self, keep: usize) -> Result<usize> {
        let _releasing = self.releasing.lock().unwrap_or_else(PoisonError::into_inner);
        let mut released = 0;
        // Read once: the states are locked one at a time below.
        let all = self.statistics().all;
        let (mut reserved, allocated) = (all.reserved_bytes.current, all.allocated_bytes.current);
        for state in self.states() {
            let mut locked = state.lock();
            locked.poll_pending();
            let Some(stream) = locked.stream.clone().filter(quiet) else { continue };
            for (base, segment) in locked.arena().releasable() {
                if reserved.saturating_sub(allocated) <= keep as u64 {
                    return Ok(released);
                }
                locked.arena().remove_segment(base);
                // SAFETY: the segment is wholly free (no block of it is handed out), and every
                // block's last use is ordered before `stream`'s next work (freed there, or
                // settled: its event done).
                if let Err(error) = unsafe { self.release_segment(base, segment, &stream) } {
                    locked.arena().add_segment(base, segment);
                    return Err(error);
                }
                crate::memory_event!(DEBUG, size = segment.size, ptr = %hex(base), "cache segment released");
                self.note(MemoryEventKind::SegmentFree, base, segment.size, &stream);
                released += segment.size;
                reserved -= segment.size as u64;
            }
            let Some((memory, _)) = &self.expandable else { continue };
            for (base, free_from) in locked.arena().shrinkable() {
                if reserved.saturating_sub(allocated) <= keep as u64 {
                    return Ok(released);
                }
                let Some(before) = locked.arena().segment(base).map(|segment| segment.size) else { continue };
                // SAFETY: the bytes from `free_from` on are the segment's free last block, whose
                // last use is ordered before `stream`'s next work (as above).
                let mapped = unsafe { memory.shrink(base, free_from, &stream) }?;
                locked.arena().shrink_segment(base, mapped);
                let unmapped = before.saturating_sub(mapped);
                if unmapped > 0 {
                    crate::memory_event!(DEBUG, size = unmapped, ptr = %hex(base), mapped, "cache segment shrunk");
                    self.note(MemoryEventKind::SegmentShrink, base + mapped as DevicePtr, unmapped, &stream);
                }
                released += unmapped;
                reserved = reserved.saturating_sub(unmapped as u64);
            }
        }
        Ok(released)
    }

    /// Gives a segment back upstream: an allocation, or an expandable range whole.
    ///
    /// # Safety
    /// The segment is this resource's, removed from its arena, and nothing uses it after the
    /// work enqueued on `stream` so far.
    unsafe fn release_segment(&self, base: DevicePtr, segment: Segment, stream: &Stream) -> Result<()> {
        match &self.expandable {
            // SAFETY: forwarded from the caller; the range was reserved for this segment.
            Some((memory, _)) if segment.is_expandable() => unsafe { memory.release(base, stream) },
            // SAFETY: forwarded from the caller; the segment came from `allocate_raw` of the
            // upstream with this size.
            _ => unsafe { self.upstream.deallocate_raw(base, segment.size, stream) },
        }
    }

    /// The segments and their blocks, now (`torch.cuda.memory_snapshot`).
    #[doc(alias = "memory_snapshot")]
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut segments = Vec::new();
        for state in self.states() {
            let mut locked = state.lock();
            let Some(stream) = locked.stream.clone() else { continue };
            let arena = locked.arena();
            for (address, segment) in arena.segments() {
                let blocks = arena
                    .blocks_of(address)
                    .map(|(ptr, block)| BlockSnapshot {
                        address: ptr,
                        size: block.size,
                        state: match block.state {
                            BlockState::Allocated { requested } => BlockUse::Allocated { requested },
                            BlockState::Free { .. } => BlockUse::Free,
                            BlockState::Pending(_) => BlockUse::Pending,
                        },
                    })
                    .collect();
                segments.push(SegmentSnapshot {
                    address,
                    size: segment.size,
                    class: segment.class,
                    expandable_reservation: segment.is_expandable().then_some(segment.reserved),
                    stream: stream.clone(),
                    blocks,
                });
            }
        }
        segments.sort_by_key(|segment| segment.address);
        segments
    }

    /// Whether `resource` is a caching resource or adapts one (through
    /// [`upstream`](MemoryResource::upstream)): its buffers are then blocks of larger segments,
    /// which must not be shared as allocations of a pool.
    pub fn serves(resource: &dyn MemoryResource) -> bool {
        let mut next = Some(resource);
        while let Some(resource) = next {
            if (resource as &dyn std::any::Any).is::<CachingResource>() {
                return true;
            }
            next = resource.upstream();
        }
        false
    }

    fn states(&self) -> Vec<Arc<StreamState>> {
        self.streams.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn write_streams(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<StreamState>>> {
        self.streams.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state of `stream` in the registry, if it has one (never a forgotten one, which a
    /// thread's [`RECENT`] state may still name).
    fn find_state(&self, stream: &Stream) -> Option<Arc<StreamState>> {
        let streams = self.streams.read().unwrap_or_else(PoisonError::into_inner);
        let key = stream.key();
        streams.iter().find(|s| s.key == key).cloned()
    }

    /// `f` of the state of `stream`, if it has one. The common path (a thread on the stream it
    /// used last) finds it through the thread's [`RECENT`] state, writing only that state's
    /// reference count, which no other thread's stream shares: no lock or counter all threads
    /// write. A state forgotten meanwhile ([`empty_cache`](CachingResource::empty_cache)) has
    /// no segment: it finds no block, and the caller goes on to [`state_for`](Self::state_for).
    #[inline]
    fn with_state<R>(&self, stream: &Stream, f: impl FnOnce(&Arc<StreamState>) -> R) -> Option<R> {
        let key = stream.key();
        let mut f = Some(f);
        let hit = RECENT
            .try_with(|recent| {
                let recent = recent.try_borrow().ok()?;
                match &*recent {
                    Some((id, state)) if *id == self.id && state.key == key && !state.is_retired() => {
                        f.take().map(|f| f(state))
                    }
                    _ => None,
                }
            })
            .ok()
            .flatten();
        if hit.is_some() {
            return hit;
        }
        let f = f?;
        let state = self.find_state(stream)?;
        // The thread's most recent (resource, stream) from now on. Failing to note it (the
        // thread is ending, or the slot is in use) only makes the next call look again.
        let _ = RECENT.try_with(|recent| {
            if let Ok(mut recent) = recent.try_borrow_mut() {
                *recent = Some((self.id, Arc::clone(&state)));
            }
        });
        Some(f(&state))
    }

    /// A free block of `state`'s own, for its stream (settling what is pending first if none).
    fn take_own(&self, state: &StreamState, class: SizeClass, rounded: usize, requested: usize) -> Option<DevicePtr> {
        let mut locked = state.lock();
        // The common pair: the block this stream freed last, of this size.
        if let Some(ptr) = locked.take_recent(&self.options, class, rounded, requested) {
            return Some(ptr);
        }
        if let Some(ptr) = locked.arena().take(&self.options, class, rounded, requested, u64::MAX) {
            return Some(ptr);
        }
        if !locked.arena().has_pending() {
            return None;
        }
        locked.poll_pending();
        locked.arena().take(&self.options, class, rounded, requested, u64::MAX)
    }

    /// The state of `stream`, made if it has none.
    fn state_for(&self, stream: &Stream) -> Arc<StreamState> {
        if let Some(state) = self.find_state(stream) {
            return state;
        }
        let mut streams = self.write_streams();
        if let Some(state) = streams.iter().find(|s| s.key == stream.key()) {
            return Arc::clone(state);
        }
        let state = Arc::new(StreamState::new(stream.clone(), Arena::new(Arc::clone(&self.counters))));
        streams.push(Arc::clone(&state));
        state
    }

    /// An allocation on a capturing stream, from the upstream and never cached.
    #[cold]
    fn pass_through(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.upstream.allocate_raw(size, stream)?;
        self.passed.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr, size);
        self.passed_count.fetch_add(1, Ordering::Release);
        self.counters.passed_through.add(size as u64);
        Ok(ptr)
    }

    /// A free block of another stream's, once its last use is known done.
    fn take_from_others(
        &self,
        own: &Arc<StreamState>,
        stream: &Stream,
        class: SizeClass,
        rounded: usize,
        requested: usize,
    ) -> Option<DevicePtr> {
        let taken = self.states().into_iter().filter(|state| !Arc::ptr_eq(state, own)).find_map(|state| {
            let mut locked = state.lock();
            let theirs = locked.stream.clone()?;
            locked.take_for_other(&theirs, &self.options, class, rounded, requested)
        })?;
        match taken {
            Taken::Block(ptr) => Some(ptr),
            Taken::Segment(base, segment) => self.with_live_state(Arc::clone(own), stream, |locked| {
                // Wholly free and its last use done: this stream's from now on, its blocks'
                // frees here same-stream ones. Taken at once, so no other stream can take it
                // first; the take cannot fail (the segment's one block fits).
                locked.arena().attach_segment(base, segment);
                locked.arena().take(&self.options, class, rounded, requested, u64::MAX)
            }),
        }
    }

    /// `f` of the locked state of `stream` (whose state `state` is): `state`, or, when it was
    /// retired meanwhile (the stream's state had no segment left at an
    /// [`empty_cache`](CachingResource::empty_cache)), the stream's state now.
    fn with_live_state<R>(&self, state: Arc<StreamState>, stream: &Stream, f: impl FnOnce(&mut Locked) -> R) -> R {
        let mut state = state;
        let mut locked = state.lock();
        while state.is_retired() {
            drop(locked);
            state = self.state_for(stream);
            locked = state.lock();
        }
        f(&mut locked)
    }

    /// A new segment for `state`'s stream, and the block from it; with expandable segments, the
    /// stream's segment grown (or a new one).
    fn grow(
        &self,
        state: Arc<StreamState>,
        stream: &Stream,
        class: SizeClass,
        rounded: usize,
        requested: usize,
    ) -> Result<DevicePtr> {
        if let Some((memory, reservation)) = &self.expandable {
            let expand = || {
                self.with_live_state(Arc::clone(&state), stream, |locked| {
                    self.expand(locked, &**memory, *reservation, stream, class, rounded, requested)
                })
            };
            return expand().or_else(|refused| self.retry(refused, requested, rounded, expand));
        }
        let size = self.options.segment_size(rounded).ok_or_else(|| self.out_of_memory(requested, rounded, None))?;
        let allocate = || self.upstream.allocate_raw(size, stream);
        let base = allocate().or_else(|refused| self.retry(refused, requested, rounded, allocate))?;
        crate::memory_event!(DEBUG, size, ptr = %hex(base), stream = %hex(stream.handle()), "cache segment allocated");
        self.note(MemoryEventKind::SegmentAllocate, base, size, stream);
        let taken = self.with_live_state(state, stream, |locked| {
            locked.arena().add_segment(base, Segment::fixed(size, class));
            locked.arena().take(&self.options, class, rounded, requested, u64::MAX)
        });
        taken.ok_or_else(|| self.out_of_memory(requested, rounded, None))
    }

    /// The block for `rounded` bytes from an expandable segment of the locked state's: one of
    /// its segments grown at its end, or a new one reserved (of `reservation` bytes, or the
    /// request's if larger) with what the request needs mapped.
    #[allow(clippy::too_many_arguments)]
    fn expand(
        &self,
        locked: &mut Locked,
        memory: &dyn ExpandableMemory,
        reservation: usize,
        stream: &Stream,
        class: SizeClass,
        rounded: usize,
        requested: usize,
    ) -> Result<DevicePtr> {
        let too_large = || self.out_of_memory(requested, rounded, None);
        let step = self.options.expansion_step(class, memory.granularity()).ok_or_else(too_large)?;
        if let Some((base, free_at_end)) = locked.arena().growable(class, rounded) {
            let segment = locked.arena().segment(base).ok_or_else(too_large)?;
            // What the request lacks, in steps, within what the reservation has left (a multiple
            // of the granularity, as is the step, and at least what is lacking).
            let lacking = rounded - free_at_end;
            let added =
                lacking.checked_next_multiple_of(step).ok_or_else(too_large)?.min(segment.reserved - segment.size);
            let mapped = memory.grow(base, added)?;
            debug_assert_eq!(mapped, segment.size + added);
            locked.arena().expand_segment(base, added);
            crate::memory_event!(DEBUG, size = added, ptr = %hex(base), mapped, stream = %hex(stream.handle()), "cache segment grown");
            self.note(MemoryEventKind::SegmentGrow, base + segment.size as DevicePtr, added, stream);
        } else {
            let first = rounded.checked_next_multiple_of(step).ok_or_else(too_large)?;
            let reserved = reservation.max(first);
            let base = memory.reserve(reserved)?;
            if let Err(refused) = memory.grow(base, first) {
                // SAFETY: reserved just above, nothing mapped in it, handed to no one.
                let released = unsafe { memory.release(base, stream) };
                crate::drop_errors::on_drop("CachingResource (an expandable range left reserved)", || released);
                return Err(refused);
            }
            locked.arena().add_segment(base, Segment { size: first, class, reserved });
            crate::memory_event!(DEBUG, size = first, ptr = %hex(base), reserved, stream = %hex(stream.handle()), "cache segment allocated");
            self.note(MemoryEventKind::SegmentAllocate, base, first, stream);
        }
        locked.arena().take(&self.options, class, rounded, requested, u64::MAX).ok_or_else(too_large)
    }

    /// After the upstream `refused` memory for a request: the wholly free segments go back (and
    /// expandable segments' free ends are unmapped), and `again` asks once more.
    #[cold]
    fn retry(
        &self,
        refused: Error,
        requested: usize,
        rounded: usize,
        again: impl FnOnce() -> Result<DevicePtr>,
    ) -> Result<DevicePtr> {
        if !is_out_of_memory(&refused) {
            return Err(refused);
        }
        let released = self.trim(0).unwrap_or(0);
        if released == 0 {
            return Err(self.failed(requested, rounded, refused));
        }
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        again().map_err(|refused| self.failed(requested, rounded, refused))
    }

    /// The error of an allocation the upstream refused: out of memory when it ran out (or a
    /// limit did), its own otherwise.
    fn failed(&self, requested: usize, rounded: usize, refused: Error) -> Error {
        if is_out_of_memory(&refused) { self.out_of_memory(requested, rounded, Some(refused)) } else { refused }
    }

    #[cold]
    fn out_of_memory(&self, requested: usize, rounded: usize, source: Option<Error>) -> Error {
        self.counters.out_of_memory.fetch_add(1, Ordering::Relaxed);
        history::record(MemoryEventKind::OutOfMemory, 0, requested, None, ResourceId::of(self));
        let all = self.statistics().all;
        let largest_free_block =
            self.states().iter().map(|state| state.lock().arena().largest_free()).max().unwrap_or(0) as u64;
        let (allocated, reserved) = (all.allocated_bytes.current, all.reserved_bytes.current);
        Error::Caching(CachingError::OutOfMemory(Box::new(CachingOutOfMemory {
            requested,
            rounded,
            allocated,
            reserved,
            cached: reserved.saturating_sub(allocated),
            largest_free_block,
            source,
        })))
    }

    /// Frees a block that `stream`'s state does not hold: a pass-through, or a block of another
    /// stream's segment (pending until `stream`'s work so far is done).
    #[cold]
    fn free_elsewhere(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        if self.passed_count.load(Ordering::Acquire) > 0 {
            let passed = self.passed.lock().unwrap_or_else(PoisonError::into_inner).remove(&ptr);
            if let Some(passed) = passed {
                // SAFETY: the upstream allocated `ptr` with this size for this resource, and the
                // caller's guarantees are the upstream's.
                if let Err(error) = unsafe { self.upstream.deallocate_raw(ptr, passed, stream) } {
                    self.passed.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr, passed);
                    return Err(error);
                }
                self.passed_count.fetch_sub(1, Ordering::Release);
                self.counters.passed_through.subtract(passed as u64);
                return Ok(());
            }
        }
        for state in self.states() {
            let mut locked = state.lock();
            if locked.arena().allocated_size(ptr).is_some() {
                let freed = locked.arena().free_pending(ptr, LastUse::on(stream));
                debug_assert!(freed.is_ok());
                return Ok(());
            }
        }
        Err(Error::Caching(CachingError::NotACachedBlock { ptr, size }))
    }
}

/// Whether the upstream refused for want of memory: the driver ran out (a pool's refusal, or
/// any driver call's, a mapping's say), a limit did, or a cache below this one did.
fn is_out_of_memory(refused: &Error) -> bool {
    matches!(
        refused,
        Error::OutOfMemory(_) | Error::LimitExceeded { .. } | Error::Caching(CachingError::OutOfMemory(_))
    ) || refused.cuda_code() == Some(crate::sys::types::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

thread_local! {
    /// The state this thread used last, and of which resource: held, so that the common path
    /// writes no reference count. A state lets go of its stream when it is retired or its
    /// resource dropped, and its segments are the resource's to release, so all a thread that
    /// moved on keeps is an empty state.
    static RECENT: RefCell<Option<(u64, Arc<StreamState>)>> = const { RefCell::new(None) };
}

// SAFETY: every block lies in one segment that the upstream allocated and that stays allocated
// until it is wholly free (the arena tiles segments with blocks, each handed out once until
// freed), so `allocate_raw` returns `size` valid bytes until `deallocate_raw`; the memory is the
// upstream's, and every question about it is answered as the upstream answers (the trait's
// defaults), but for the pool, which it does not name (a block is no allocation of it).
unsafe impl MemoryResource for CachingResource {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        stream.bind_if_default()?;
        if stream.refuses_allocation()? {
            return self.pass_through(size, stream);
        }
        let Some(rounded) = self.options.round(size) else {
            return Err(self.out_of_memory(size, usize::MAX, None));
        };
        let class = self.size_class(rounded);
        if let Some(Some(ptr)) = self.with_state(stream, |state| self.take_own(state, class, rounded, size)) {
            return Ok(ptr);
        }
        let state = self.state_for(stream);
        if let Some(ptr) = self.take_own(&state, class, rounded, size) {
            return Ok(ptr);
        }
        if self.options.is_cross_stream_reuse()
            && let Some(ptr) = self.take_from_others(&state, stream, class, rounded, size)
        {
            return Ok(ptr);
        }
        self.grow(state, stream, class, rounded, size)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        if self.with_state(stream, |state| state.lock().free_recent(ptr)) == Some(true) {
            return Ok(());
        }
        self.free_elsewhere(ptr, size, stream)
    }

    fn upstream(&self) -> Option<&dyn MemoryResource> {
        Some(&*self.upstream)
    }

    /// `None`: a block is part of a segment, not an allocation of the upstream's pool, and
    /// must not be shared as one.
    fn memory_pool(&self) -> Option<&MemoryPool> {
        None
    }
}

impl Drop for CachingResource {
    fn drop(&mut self) {
        for state in self.states() {
            let mut locked = state.lock();
            locked.poll_pending();
            // Let go of with the resource: a thread that still names the state keeps no stream.
            let Some(stream) = locked.stream.take() else { continue };
            let segments: Vec<_> = locked.arena().segments().collect();
            for (base, segment) in segments {
                if locked.arena().blocks_of(base).any(|(_, block)| matches!(block.state, BlockState::Allocated { .. }))
                {
                    // Still handed out (its owner gave up ownership and never freed it): left
                    // to it.
                    continue;
                }
                let released = (|| {
                    let free_on = release_stream(&stream)?;
                    for last_use in locked.arena().pending_in(base) {
                        last_use.order_before(&free_on)?;
                    }
                    // SAFETY: the segment is this resource's and no block of it is handed out;
                    // `free_on` follows every block's last use (its own frees, and the events
                    // of the others').
                    unsafe { self.release_segment(base, segment, &free_on) }
                })();
                let failed = released.is_err();
                on_drop("CachingResource (a cached segment; left allocated)", || released);
                if !failed {
                    crate::memory_event!(DEBUG, size = segment.size, ptr = %hex(base), "cache segment released");
                    self.note(MemoryEventKind::SegmentFree, base, segment.size, &stream);
                }
                locked.arena().remove_segment(base);
            }
        }
    }
}

/// The stream a segment of `stream`'s goes back upstream on at drop: `stream` itself, or, when
/// it cannot be named here, the calling thread's once the device is idle.
fn release_stream(stream: &Stream) -> Result<std::borrow::Cow<'_, Stream>> {
    if quiet(stream) {
        return Ok(std::borrow::Cow::Borrowed(stream));
    }
    if matches!(stream.capture_state(), crate::stream::CaptureState::Capturing(_)) {
        return Err(Error::CapturingStream);
    }
    stream.device().synchronize()?;
    Ok(stream.on_calling_thread())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceMemoryResource};

    const MIB: usize = 1 << 20;

    fn setup() -> (Stream, Arc<CachingResource>) {
        cuda_sim::testing::driver().unwrap();
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, Default::default()).unwrap();
        let cache = CachingResource::new(
            DeviceMemoryResource::new(device, Default::default()).unwrap(),
            CachingOptions::default(),
        );
        (stream, cache.unwrap())
    }

    /// Trimming stops once the cached bytes are within what is kept; peaks restart from the
    /// current values.
    #[test]
    fn trim_keeps_what_it_is_asked_to_and_peaks_reset() {
        let (stream, cache) = setup();
        let held: Vec<_> = (0..3).map(|_| cache.allocate(MIB + 512, &stream).unwrap()).collect();
        let small: Vec<_> = (0..6).map(|_| cache.allocate(MIB, &stream).unwrap()).collect();
        drop(small);
        let stats = cache.statistics();
        assert_eq!(stats.small.reserved_bytes.current, 6 * MIB as u64, "three small segments, free");
        let large_free = stats.large.reserved_bytes.current - stats.large.allocated_bytes.current;
        assert_eq!(cache.trim(2 * MIB + large_free as usize).unwrap(), 4 * MIB);
        assert_eq!(cache.statistics().small.segments.current, 1);
        cache.reset_peaks();
        let stats = cache.statistics();
        assert_eq!(stats.all.allocated_bytes.peak, stats.all.allocated_bytes.current);
        assert_eq!(stats.small.reserved_bytes.peak, 2 * MIB as u64);
        drop(held);
        assert_eq!(cache.empty_cache().unwrap(), 22 * MIB);
        assert_eq!(cache.statistics().all.reserved_bytes.current, 0);
    }

    /// In a process of its own: a callsite first reached by another test's thread, with no
    /// subscriber, may be cached as uninteresting before this test's subscriber is set.
    #[cfg(feature = "tracing")]
    #[test]
    fn segment_growth_and_release_are_traced() {
        cuda_sim::testing::in_simulated_machine(
            "resources::caching::resource::tests::segment_growth_and_release_are_traced",
            &[],
            || {
                use crate::trace::capture::{capture, named};
                let (stream, cache) = setup();
                let ((), events) = capture(|| {
                    drop(cache.allocate(4096, &stream).unwrap());
                    drop(cache.allocate(4096, &stream).unwrap());
                    cache.empty_cache().unwrap();
                });
                let grown: Vec<_> = named(&events, "cache segment allocated").collect();
                let released: Vec<_> = named(&events, "cache segment released").collect();
                assert_eq!((grown.len(), released.len()), (1, 1), "{events:#?}");
                assert_eq!(grown[0].fields["size"], (2 * MIB).to_string());
                assert_eq!(grown[0].fields["ptr"], released[0].fields["ptr"]);
            },
        );
    }
}
