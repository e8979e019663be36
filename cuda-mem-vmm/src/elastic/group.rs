//! `ElasticGroup`: buffers that give their physical memory back together and take it again at
//! the same addresses (vLLM's sleep mode, SGLang's memory saver).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockWriteGuard};

use cuda_mem_core::history::{self, MemoryEventKind, ResourceId};
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{Buffer, DevicePtr, FillPattern, ForeignMemory, PinnedMemoryResource, Stream};

use super::access::{ElasticAccess, Gate};
use super::backing::{Backing, Chunk, exclusive, release_after};
use crate::error::{ElasticMemory, Result, VmmError};
use crate::resource::{VirtualMemoryResource, round_up};

/// What becomes of a group's contents when it sleeps ([`ElasticGroup::sleep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Release {
    /// The contents go with the memory (a KV cache, scratch space): [`ElasticGroup::wake`]
    /// maps new memory, whose contents are what its [`Discarded`] says.
    Discard,
    /// The contents are copied to pinned host memory first, and back at
    /// [`ElasticGroup::wake`] (weights).
    Offload,
}

/// What a discarded buffer holds once its group wakes ([`ElasticGroup::wake`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Discarded {
    /// Whatever the new memory holds (no work is enqueued for it).
    #[default]
    Unspecified,
    /// Zeros, written on the wake's stream.
    Zeroed,
}

/// What [`ElasticGroup::sleep`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SleepReport {
    /// The buffers whose memory went.
    pub buffers: usize,
    /// The physical bytes given back to the device.
    pub released_bytes: usize,
    /// The bytes copied to pinned host memory first ([`Release::Offload`]).
    pub offloaded_bytes: usize,
}

/// What [`ElasticGroup::wake`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WakeReport {
    /// The buffers mapped again.
    pub buffers: usize,
    /// The physical bytes mapped.
    pub mapped_bytes: usize,
    /// The bytes copied back from pinned host memory.
    pub restored_bytes: usize,
    /// The bytes zeroed ([`Discarded::Zeroed`]).
    pub zeroed_bytes: usize,
}

/// A group's figures ([`ElasticGroup::statistics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ElasticStatistics {
    /// Its live buffers.
    pub buffers: usize,
    /// The addresses they reserve (kept while asleep).
    pub reserved_bytes: usize,
    /// The physical memory mapped in them now.
    pub mapped_bytes: usize,
    /// The pinned host memory holding offloaded contents now.
    pub offloaded_bytes: usize,
    /// Sleeps that released memory.
    pub sleeps: u64,
    /// Wakes that mapped memory again.
    pub wakes: u64,
}

/// Whether a group's memory is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Awake,
    Asleep(Release),
}

/// One buffer of a group.
#[derive(Debug)]
struct Slot {
    backing: Backing,
    /// The stream whose work sleeping and dropping wait for.
    stream: Stream,
    /// The contents, while asleep after an offload.
    offloaded: Option<Buffer>,
    /// Whether the contents went (a discard), so that a wake may zero them.
    discarded: bool,
}

/// The buffers of a group, and its counts.
#[derive(Debug, Default)]
struct Slots {
    next: u64,
    live: BTreeMap<u64, Slot>,
    sleeps: u64,
    wakes: u64,
}

/// Buffers whose physical memory is released and restored together, their addresses kept: a
/// model's weights (offloaded to pinned host memory while asleep) or its KV cache (discarded),
/// each a group with a tag of its own.
///
/// Each buffer is an address range reserved for it and one physical allocation mapped there
/// with the resource's access. [`sleep`](ElasticGroup::sleep) unmaps and releases every
/// buffer's physical memory (the device gets it back: `cuMemGetInfo` shows it free), keeping
/// the addresses reserved; [`wake`](ElasticGroup::wake) maps new memory at the same addresses
/// with the same access, and copies offloaded contents back. Pointers taken before a sleep
/// (in kernels' arguments, in captured CUDA graphs) are valid again after the wake.
///
/// # What keeps it safe
///
/// - A buffer's memory is reached through an [`ElasticAccess`] ([`ElasticBuffer::access`]),
///   which an asleep group refuses ([`VmmError::Asleep`]); while any access lives, the group
///   neither sleeps nor wakes ([`VmmError::InUse`], nothing done).
/// - Work queued on a buffer's stream ([`ElasticBuffer::deallocation_stream`]) is waited for
///   before its memory is unmapped: sleeping orders its own stream after each buffer's, then
///   waits for it. Work enqueued through a buffer on other streams must be ordered before its
///   stream, as for dropping a buffer.
/// - A capturing stream (the sleep's, or a buffer's) is refused ([`VmmError::CapturingStream`]):
///   unmapping cannot be captured, and a graph may use the memory later.
/// - The buffers are not exportable, so no other process maps them.
/// - A sleep that fails is undone: the memory unmapped so far is mapped again, contents and all
///   (unmapping keeps each chunk's memory until every one is unmapped). Should mapping it again
///   fail too, the group is left asleep with that memory held, and [`wake`](ElasticGroup::wake)
///   maps it back with its contents. A wake that fails unmaps what it mapped and leaves the
///   group asleep as it was.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, Stream};
/// use cuda_mem_vmm::{Discarded, ElasticGroup, Release, VirtualMemoryResource};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let resource = VirtualMemoryResource::new(device, Default::default())?;
/// let weights = ElasticGroup::new(&resource, "weights");
/// let kv_cache = ElasticGroup::new(&resource, "kv-cache");
///
/// let mut w = weights.allocate(4 << 20, &stream)?;
/// let kv = kv_cache.allocate(64 << 20, &stream)?;
/// w.access_mut()?.view_mut::<u32>()?.copy_from_slice(&[7; 1 << 20], &stream)?;
/// let (w_at, kv_at) = (w.ptr(), kv.ptr());
///
/// let free_before = device.memory_info()?.free;
/// weights.sleep(Release::Offload, &stream)?; // copied to pinned host memory, then released
/// kv_cache.sleep(Release::Discard, &stream)?;
/// assert!(device.memory_info()?.free >= free_before + (68 << 20));
/// assert!(w.access().is_err()); // no access while asleep
///
/// weights.wake(Discarded::Unspecified, &stream)?; // new memory, the contents copied back
/// kv_cache.wake(Discarded::Zeroed, &stream)?;
/// assert_eq!((w.ptr(), kv.ptr()), (w_at, kv_at)); // the same addresses
/// let back = w.access()?.view::<u32>()?.to_vec(&stream)?;
/// assert!(back.iter().all(|&x| x == 7));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ElasticGroup {
    resource: Arc<VirtualMemoryResource>,
    tag: String,
    /// Where offloaded contents go; the current pinned pool when `None`.
    staging: Option<Arc<PinnedMemoryResource>>,
    /// Read by each access; written by sleep and wake (lock order: `gate`, then `slots`).
    gate: RwLock<Phase>,
    slots: Mutex<Slots>,
}

impl ElasticGroup {
    /// A group of buffers allocated with `resource` (its location, handle type and access),
    /// named `tag` in errors and snapshots.
    pub fn new(resource: &Arc<VirtualMemoryResource>, tag: impl Into<String>) -> Arc<ElasticGroup> {
        ElasticGroup::build(resource, tag.into(), None)
    }

    /// A group as [`new`](ElasticGroup::new) makes it, whose offloaded contents go to
    /// `staging` instead of the current pinned pool ([`PinnedMemoryResource::current`]). A
    /// group that sleeps and wakes often gains from a pool that keeps its memory between them
    /// (a release threshold of `u64::MAX`: pinning host memory anew each time costs more than
    /// copying it); the memory is then held while the group is awake too.
    pub fn with_staging(
        resource: &Arc<VirtualMemoryResource>,
        tag: impl Into<String>,
        staging: Arc<PinnedMemoryResource>,
    ) -> Arc<ElasticGroup> {
        ElasticGroup::build(resource, tag.into(), Some(staging))
    }

    fn build(
        resource: &Arc<VirtualMemoryResource>,
        tag: String,
        staging: Option<Arc<PinnedMemoryResource>>,
    ) -> Arc<ElasticGroup> {
        let group = Arc::new(ElasticGroup {
            resource: Arc::clone(resource),
            tag,
            staging,
            gate: RwLock::new(Phase::Awake),
            slots: Mutex::new(Slots::default()),
        });
        cuda_mem_core::snapshot::register(&group);
        group
    }

    /// Calls `f` with each buffer's backing (for snapshots).
    pub(super) fn each_backing(&self, mut f: impl FnMut(&Backing)) {
        for slot in self.slots().live.values() {
            f(&slot.backing);
        }
    }

    /// Records `kind` for every buffer's range in the history (a sleep's unmapping, a wake's
    /// mapping).
    fn record_each(&self, slots: &Slots, kind: MemoryEventKind, stream: &Stream) {
        for slot in slots.live.values() {
            history::record(kind, slot.backing.ptr(), slot.backing.size(), Some(stream), ResourceId::of(self));
        }
    }

    /// Its tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The resource its buffers' memory comes from.
    pub fn resource(&self) -> &Arc<VirtualMemoryResource> {
        &self.resource
    }

    /// How the group released its memory, while it is asleep; `None` while awake.
    pub fn asleep(&self) -> Option<Release> {
        match *self.gate.read().unwrap_or_else(PoisonError::into_inner) {
            Phase::Awake => None,
            Phase::Asleep(release) => Some(release),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gate, for sleeping or waking: refused while an access lives.
    fn exclusive(&self) -> Result<RwLockWriteGuard<'_, Phase>> {
        exclusive(&self.gate, || ElasticMemory::Group { tag: self.tag.clone() })
    }

    /// A buffer of at least `size` bytes (its reservation and memory rounded up to the
    /// resource's granularity; at least one granule), mapped now; sleeping and dropping it wait
    /// for `stream`'s work.
    ///
    /// # Errors
    /// - [`VmmError::Asleep`]: the group is asleep.
    /// - [`VmmError::PhysicalMemoryExhausted`]: the device has no memory for it.
    /// - Driver errors ([`VmmError::Core`]). Nothing stays reserved or mapped on an error.
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<ElasticBuffer> {
        let gate = self.gate.read().unwrap_or_else(PoisonError::into_inner);
        if *gate != Phase::Awake {
            return Err(VmmError::Asleep { tag: self.tag.clone() });
        }
        let chunk = round_up(size.max(1), self.resource.granularity())?;
        let mut backing = Backing::reserve(&self.resource, chunk, chunk)?;
        let mapped = self.mapped_bytes();
        backing
            .map(0, || self.resource.create_chunk(chunk).map_err(VmmError::into_core))
            .map_err(|source| exhausted(source, chunk, mapped))?;
        let ptr = backing.ptr();
        let mut slots = self.slots();
        let id = slots.next;
        slots.next += 1;
        slots.live.insert(id, Slot { backing, stream: stream.clone(), offloaded: None, discarded: false });
        drop(slots);
        drop(gate);
        Ok(ElasticBuffer { group: Arc::clone(self), id, ptr, size })
    }

    /// The bytes mapped in the group's buffers now.
    fn mapped_bytes(&self) -> usize {
        self.slots().live.values().map(|slot| slot.backing.mapped_bytes()).sum()
    }

    /// Its figures now.
    pub fn statistics(&self) -> ElasticStatistics {
        let slots = self.slots();
        let live = slots.live.values();
        ElasticStatistics {
            buffers: slots.live.len(),
            reserved_bytes: live.clone().map(|slot| slot.backing.size()).sum(),
            mapped_bytes: live.clone().map(|slot| slot.backing.mapped_bytes()).sum(),
            offloaded_bytes: live.filter_map(|slot| slot.offloaded.as_ref()).map(Buffer::size).sum(),
            sleeps: slots.sleeps,
            wakes: slots.wakes,
        }
    }

    /// Releases the physical memory of every buffer of the group, keeping their addresses
    /// reserved: with [`Release::Offload`], their contents are copied to pinned host memory
    /// first (on `stream`, one copy per buffer). `stream` is first ordered after each buffer's
    /// stream, and waited for before anything is unmapped. Asleep already, it does nothing.
    ///
    /// # Errors
    /// Nothing changed on any of these (see the type's documentation for a failure partway
    /// through unmapping):
    /// - [`VmmError::InUse`]: an [`ElasticAccess`] of the group lives.
    /// - [`VmmError::CapturingStream`]: `stream` or a buffer's stream is capturing (or its
    ///   status could not be read: that error).
    /// - Driver errors: ordering the streams, allocating pinned memory, copying, waiting, or
    ///   unmapping.
    pub fn sleep(&self, release: Release, stream: &Stream) -> Result<SleepReport> {
        let mut gate = self.exclusive()?;
        if *gate != Phase::Awake {
            return Ok(SleepReport::default());
        }
        let mut slots = self.slots();
        refuse_capturing(std::iter::once(stream).chain(slots.live.values().map(|slot| &slot.stream)))?;
        // The buffers' work first, then the copies, then the wait.
        for slot in slots.live.values() {
            if slot.stream != *stream {
                stream.wait(&slot.stream.record_event()?)?;
            }
        }
        let offloaded = match release {
            Release::Offload => {
                let staging = match &self.staging {
                    Some(staging) => Arc::clone(staging),
                    None => PinnedMemoryResource::current()?,
                };
                offload(&self.resource, &slots, &staging, stream)?
            }
            Release::Discard => BTreeMap::new(),
        };
        stream.synchronize()?;
        // Unmapped, their memory kept, so that a failure part way is undone with the contents.
        let mut unmapped: Vec<(u64, usize)> = Vec::new();
        for (&id, slot) in slots.live.iter_mut() {
            for index in 0..slot.backing.chunks.len() {
                if !slot.backing.is_mapped(index) {
                    continue;
                }
                // SAFETY: the buffer's stream and `stream` were waited for above, and no access
                // lives (the gate is held exclusively), so no work uses the chunk.
                match unsafe { slot.backing.unmap_keeping(index) } {
                    Ok(()) => unmapped.push((id, index)),
                    Err(error) => {
                        self.undo_sleep(&mut slots, &mut gate, unmapped, offloaded, release);
                        return Err(error.into());
                    }
                }
            }
        }
        let mut report = SleepReport { buffers: slots.live.len(), ..SleepReport::default() };
        for slot in slots.live.values_mut() {
            report.released_bytes += slot.backing.release_held();
            slot.discarded = release == Release::Discard;
        }
        for (id, host) in offloaded {
            report.offloaded_bytes += host.size();
            if let Some(slot) = slots.live.get_mut(&id) {
                slot.offloaded = Some(host);
            }
        }
        self.record_each(&slots, MemoryEventKind::SegmentShrink, stream);
        slots.sleeps += 1;
        *gate = Phase::Asleep(release);
        Ok(report)
    }

    /// Maps the chunks a failed sleep unmapped again, last first, with their memory. Should
    /// one fail, the group is left asleep with that memory held (the contents kept: each
    /// buffer's offloaded copy too), for a wake to map back; the failures are recorded.
    fn undo_sleep(
        &self,
        slots: &mut Slots,
        gate: &mut Phase,
        unmapped: Vec<(u64, usize)>,
        mut offloaded: BTreeMap<u64, Buffer>,
        release: Release,
    ) {
        let mut whole = true;
        for (id, index) in unmapped.into_iter().rev() {
            let Some(slot) = slots.live.get_mut(&id) else { continue };
            if let Err(error) = slot.backing.map_held(index) {
                cuda_mem_core::record_drop_error("elastic memory (undoing a failed sleep)", error);
                whole = false;
            }
        }
        if !whole {
            for (id, slot) in slots.live.iter_mut() {
                slot.offloaded = offloaded.remove(id);
            }
            *gate = Phase::Asleep(release);
        }
    }

    /// Maps new physical memory (or the memory a failed sleep held) at every buffer's
    /// addresses, with the resource's access, then, on `stream`, copies offloaded contents back
    /// (the pinned host memory freed after that copy, stream-ordered) or zeroes discarded ones
    /// ([`Discarded::Zeroed`]). Work enqueued on `stream` after it sees the contents; other
    /// streams wait for it. Awake already, it does nothing.
    ///
    /// # Errors
    /// Nothing changed on any of these (the group stays asleep):
    /// - [`VmmError::InUse`]: an [`ElasticAccess`] of the group lives (it cannot while asleep,
    ///   but a concurrent allocation may hold the gate).
    /// - [`VmmError::CapturingStream`]: `stream` is capturing.
    /// - [`VmmError::PhysicalMemoryExhausted`]: the device has not the memory.
    /// - Driver errors: mapping, setting access, copying, zeroing.
    pub fn wake(&self, discarded: Discarded, stream: &Stream) -> Result<WakeReport> {
        let mut gate = self.exclusive()?;
        if *gate == Phase::Awake {
            return Ok(WakeReport::default());
        }
        refuse_capturing([stream])?;
        let mut slots = self.slots();
        let before: usize = slots.live.values().map(|slot| slot.backing.mapped_bytes()).sum();
        let needed: usize = slots.live.values().map(|slot| slot.backing.size()).sum::<usize>() - before;
        // Mapped first (undone without waiting: nothing was enqueued yet), then the contents.
        let mut mapped: Vec<(u64, usize, bool)> = Vec::new();
        for (&id, slot) in slots.live.iter_mut() {
            let chunk = slot.backing.chunk_size();
            for index in 0..slot.backing.chunks.len() {
                let held = match &slot.backing.chunks[index] {
                    Chunk::Mapped(_) => continue,
                    Chunk::Held(_) => true,
                    Chunk::Released => false,
                };
                let resource = &self.resource;
                match slot.backing.map(index, || resource.create_chunk(chunk).map_err(VmmError::into_core)) {
                    Ok(()) => mapped.push((id, index, held)),
                    Err(source) => {
                        undo_wake(&mut slots, mapped);
                        return Err(exhausted(source, needed, before));
                    }
                }
            }
        }
        let mut report = WakeReport { buffers: slots.live.len(), mapped_bytes: needed, ..WakeReport::default() };
        let mut done_with = Vec::new();
        for (&id, slot) in slots.live.iter_mut() {
            let restored = match slot.offloaded.take() {
                Some(host) => {
                    let copied = view(&self.resource, &slot.backing).copy_from(&host, stream);
                    report.restored_bytes += host.size();
                    done_with.push((id, host));
                    copied
                }
                None if slot.discarded && discarded == Discarded::Zeroed => {
                    report.zeroed_bytes += slot.backing.size();
                    view(&self.resource, &slot.backing).fill(FillPattern::U8(0), stream)
                }
                None => Ok(()),
            };
            if let Err(error) = restored {
                // Waited for before unmapping what the earlier copies wrote; the pinned copies
                // go back to their buffers.
                let waited = stream.synchronize();
                give_back(&mut slots, done_with);
                match waited {
                    Ok(()) => undo_wake(&mut slots, mapped),
                    // The copies may still run: mapped it stays, and awake the group is,
                    // with contents that may be incomplete; recorded.
                    Err(wait) => {
                        cuda_mem_core::record_drop_error("elastic memory (undoing a failed wake)", wait);
                        *gate = Phase::Awake;
                    }
                }
                return Err(error.into());
            }
        }
        for (_, mut host) in done_with {
            // Freed after the copy from it, on `stream` (a pinned pool's free is stream-ordered).
            host.set_deallocation_stream(stream);
            drop(host);
        }
        for slot in slots.live.values_mut() {
            slot.discarded = false;
        }
        self.record_each(&slots, MemoryEventKind::SegmentGrow, stream);
        slots.wakes += 1;
        *gate = Phase::Awake;
        Ok(report)
    }

    /// Lets go of a buffer: after its stream's work, its memory is unmapped and its addresses
    /// freed (see `release_after`).
    fn drop_buffer(&self, id: u64) {
        let Some(slot) = self.slots().live.remove(&id) else { return };
        let Slot { backing, stream, offloaded, .. } = slot;
        drop(offloaded);
        release_after(backing, &stream);
    }
}

/// Refuses capturing streams (or those whose status cannot be read).
fn refuse_capturing<'a>(streams: impl IntoIterator<Item = &'a Stream>) -> Result<()> {
    for stream in streams {
        if stream.is_capturing()? {
            return Err(VmmError::CapturingStream);
        }
    }
    Ok(())
}

/// The pinned host copy of each buffer's contents, enqueued on `stream` (after the buffers'
/// work); freed (stream-ordered) if one fails.
fn offload(
    resource: &VirtualMemoryResource,
    slots: &Slots,
    pinned: &Arc<PinnedMemoryResource>,
    stream: &Stream,
) -> Result<BTreeMap<u64, Buffer>> {
    let mut copies = BTreeMap::new();
    for (&id, slot) in &slots.live {
        let mut host = pinned.allocate(slot.backing.size(), stream)?;
        host.copy_from(&view(resource, &slot.backing), stream)?;
        copies.insert(id, host);
    }
    Ok(copies)
}

/// A view of a backing's whole range, for the copies and fills of `sleep` and `wake`.
fn view(resource: &VirtualMemoryResource, backing: &Backing) -> Buffer {
    let memory = ForeignMemory::device_memory(resource.device());
    // SAFETY: the range is mapped (`sleep` copies from mapped buffers; `wake` mapped them just
    // before) and stays so while the view lives: the view lives inside `sleep` or `wake`, which
    // hold the group's gate exclusively, and each waits for the work enqueued through the view
    // before it unmaps anything.
    unsafe { Buffer::from_raw(backing.ptr(), backing.size(), memory) }
}

/// Unmaps what a failed wake mapped (nothing was enqueued on it), last first: memory a failed
/// sleep held is held again, fresh memory released.
fn undo_wake(slots: &mut Slots, mapped: Vec<(u64, usize, bool)>) {
    for (id, index, held) in mapped.into_iter().rev() {
        let Some(slot) = slots.live.get_mut(&id) else { continue };
        // SAFETY: mapped by this wake, and no work was enqueued on it (or it was waited for).
        match unsafe { slot.backing.unmap_keeping(index) } {
            Ok(()) if !held => slot.backing.release_chunk(index),
            Ok(()) => {}
            Err(error) => cuda_mem_core::record_drop_error("elastic memory (undoing a failed wake)", error),
        }
    }
}

/// Puts the pinned copies a failed wake took back into their buffers.
fn give_back(slots: &mut Slots, copies: Vec<(u64, Buffer)>) {
    for (id, host) in copies {
        if let Some(slot) = slots.live.get_mut(&id) {
            slot.offloaded = Some(host);
        }
    }
}

/// A refusal to map `requested` bytes (with `mapped` mapped): typed when the driver ran out of
/// memory.
fn exhausted(source: cuda_mem_core::Error, requested: usize, mapped: usize) -> VmmError {
    if source.cuda_code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
        VmmError::PhysicalMemoryExhausted { requested, mapped, source }
    } else {
        VmmError::Core(source)
    }
}

/// A buffer of an [`ElasticGroup`]: its address and size stay the same across the group's
/// sleeps and wakes; its memory is reached through an [`ElasticAccess`] while the group is
/// awake. Dropping it unmaps its memory (after its stream's work) and frees its addresses.
#[derive(Debug)]
pub struct ElasticBuffer {
    group: Arc<ElasticGroup>,
    id: u64,
    ptr: DevicePtr,
    size: usize,
}

impl ElasticBuffer {
    /// Its address, the same while it lives (asleep or awake).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Its group.
    pub fn group(&self) -> &Arc<ElasticGroup> {
        &self.group
    }

    /// The stream whose work sleeping and dropping wait for.
    pub fn deallocation_stream(&self) -> Stream {
        let slots = self.group.slots();
        slots.live.get(&self.id).map_or_else(|| self.group.resource.device().default_stream(), |s| s.stream.clone())
    }

    /// Makes `stream` the one whose work sleeping and dropping wait for.
    pub fn set_deallocation_stream(&mut self, stream: &Stream) {
        if let Some(slot) = self.group.slots().live.get_mut(&self.id) {
            slot.stream = stream.clone();
        }
    }

    /// Its memory, for reading (copies from it, views, anything that takes a `&Buffer`): the
    /// group stays awake while the access lives.
    ///
    /// # Errors
    /// [`VmmError::Asleep`] while the group is asleep.
    pub fn access(&self) -> Result<ElasticAccess<'_>> {
        let gate = self.group.gate.read().unwrap_or_else(PoisonError::into_inner);
        if *gate != Phase::Awake {
            return Err(VmmError::Asleep { tag: self.group.tag.clone() });
        }
        let memory = ForeignMemory::device_memory(self.group.resource.device());
        // SAFETY: the buffer's range is mapped while the group is awake, and the group neither
        // sleeps nor drops this buffer while the gate is read (the access holds it, and borrows
        // the buffer); work enqueued through the view is waited for before any unmapping, as
        // the buffer's own (see `ElasticGroup`).
        let buffer = unsafe { Buffer::from_raw(self.ptr, self.size, memory) };
        Ok(ElasticAccess::new(Gate::Group { _held: gate }, buffer))
    }

    /// Its memory, for writing ([`ElasticAccess::copy_from`], [`ElasticAccess::fill`],
    /// [`ElasticAccess::view_mut`]) and reading.
    ///
    /// # Errors
    /// [`VmmError::Asleep`] while the group is asleep.
    pub fn access_mut(&mut self) -> Result<ElasticAccess<'_>> {
        self.access()
    }
}

impl Drop for ElasticBuffer {
    fn drop(&mut self) {
        self.group.drop_buffer(self.id);
    }
}
