//! Simulated memory: device allocations, pinned host allocations, and the copies and memsets
//! between them.
//!
//! Device memory has two parts: an address inside the *device arena*, a large `PROT_NONE`
//! reservation that is never made accessible (so host code that dereferences a device pointer
//! faults, as on a GPU), and a separate host mapping that holds the bytes, which only the
//! simulator touches. Arena addresses are handed out next-fit, so a freed address is reused only
//! after the allocator has gone round the whole arena: a stale device pointer is nearly always
//! reported as invalid rather than silently hitting a newer allocation.
//!
//! Pinned host memory is ordinary host memory the simulator also knows about, so it is both
//! host-accessible and a valid device pointer (unified addressing).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};

use cuda_mem_sys::types::CUresult;

use crate::error::{SimResult, ensure, fail};

/// The granularity allocations are rounded to for accounting and arena placement.
pub(crate) const PAGE: u64 = 4096;
/// Unused address space left after each device allocation, so that pointer arithmetic past the
/// end of one allocation never lands in the next.
const GUARD: u64 = 64 << 10;
/// Arena sizes tried, largest first (virtual address space only; nothing is committed).
const ARENA_SIZES: [u64; 4] = [1 << 40, 1 << 38, 1 << 36, 1 << 34];

/// A range of host memory holding an allocation's bytes: an anonymous mapping the simulator
/// owns, or memory the application registered (`cuMemHostRegister`), which it does not.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    origin: Origin,
}

/// Where a [`Mapping`]'s memory came from, and so where it goes when dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Mapped for it: unmapped when dropped.
    Owned,
    /// Mapped for a pool allocation: kept for reuse when dropped (see [`RECYCLED`]).
    Recycled,
    /// A block of a larger mapping (see [`crate::blocks`]), of the class given: given back to it.
    Block(usize),
    /// The application's (`cuMemHostRegister`): left alone.
    Borrowed,
}

/// Host backings of freed pool allocations, kept for the next pool allocation of the same
/// length. A pool keeps its memory (below its release threshold) and hands it out again; and
/// mapping host memory in the caller for every allocation while the stream's thread unmaps the
/// freed ones made the two contend for the process's memory map, so that the simulator's cost
/// per allocate+free pair depended on its caller's pace (BENCHMARKS.md, additivity check). The
/// bytes are not cleared: a pool's reused memory is not either. Bounded by [`RECYCLE_BYTES`].
static RECYCLED: Mutex<Recycled> = Mutex::new(Recycled { by_len: BTreeMap::new(), bytes: 0 });

/// At most this many bytes of freed backings are kept.
const RECYCLE_BYTES: usize = 256 << 20;

/// Freed backings by length.
struct Recycled {
    by_len: BTreeMap<usize, Vec<Backing>>,
    bytes: usize,
}

/// The start of a kept backing, owned by [`RECYCLED`] until handed out again.
struct Backing(NonNull<u8>);

// SAFETY: a kept backing is plain memory that nothing else refers to; whoever takes it out of
// the cache owns it.
unsafe impl Send for Backing {}

fn recycled() -> MutexGuard<'static, Recycled> {
    RECYCLED.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recycled {
    /// A kept backing of `len` bytes, taken out of the cache.
    fn take(&mut self, len: usize) -> Option<Backing> {
        let backing = self.by_len.get_mut(&len).and_then(Vec::pop)?;
        self.bytes -= len;
        Some(backing)
    }

    /// Keeps `backing` (of `len` bytes) if the bound allows; gives it back otherwise.
    fn keep(&mut self, backing: Backing, len: usize) -> Option<Backing> {
        if self.bytes.checked_add(len).is_none_or(|total| total > RECYCLE_BYTES) {
            return Some(backing);
        }
        self.bytes += len;
        self.by_len.entry(len).or_default().push(backing);
        None
    }
}

// SAFETY: the mapping is plain memory owned by this value; access to its bytes is coordinated by
// stream order, as on a GPU.
unsafe impl Send for Mapping {}
// SAFETY: as above; `Mapping` itself has no interior state.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of zeroed, readable and writable memory.
    pub(crate) fn read_write(len: usize) -> SimResult<Mapping> {
        Mapping::new(len, rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE)
    }

    /// `len` bytes of readable and writable memory for a pool allocation: a freed pool
    /// allocation's backing of the same length when one is kept (its old bytes included), else
    /// a new zeroed mapping. Kept again when dropped.
    fn pooled(len: usize) -> SimResult<Mapping> {
        let kept = recycled().take(len);
        let mut mapping = match kept {
            Some(Backing(ptr)) => Mapping { ptr, len, origin: Origin::Owned },
            None => Mapping::read_write(len)?,
        };
        mapping.origin = Origin::Recycled;
        Ok(mapping)
    }

    /// `len` bytes of readable and writable memory for a device pool allocation, which the
    /// application never reaches through this address: a block of a larger mapping for sizes up
    /// to [`blocks::LARGEST`](crate::blocks::LARGEST) (a freed block's old bytes included), else
    /// as [`pooled`](Mapping::pooled).
    fn device_pooled(len: usize) -> SimResult<Mapping> {
        if len > crate::blocks::LARGEST {
            return Mapping::pooled(len);
        }
        let (ptr, class) = crate::blocks::take(len)?;
        Ok(Mapping { ptr, len, origin: Origin::Block(class) })
    }

    /// Reserves `len` bytes of address space that cannot be accessed.
    fn inaccessible(len: usize) -> SimResult<Mapping> {
        Mapping::new(len, rustix::mm::ProtFlags::empty())
    }

    fn new(len: usize, prot: rustix::mm::ProtFlags) -> SimResult<Mapping> {
        let flags = rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE;
        // SAFETY: an anonymous mapping at an address of the kernel's choosing aliases nothing.
        let ptr = unsafe { rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, prot, flags) }
            .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(Mapping { ptr, len, origin: Origin::Owned })
    }

    /// Maps `len` bytes of `file` at `offset`, shared (so other processes mapping the same file
    /// see the same bytes).
    fn shared(file: BorrowedFd<'_>, offset: u64, len: usize) -> SimResult<Mapping> {
        let prot = rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE;
        // SAFETY: a shared mapping of a file the simulator owns, at an address of the kernel's
        // choosing; it aliases only other mappings of the same file, which is the point.
        let ptr =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, rustix::mm::MapFlags::SHARED, file, offset) }
                .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(Mapping { ptr, len, origin: Origin::Owned })
    }

    /// Describes application memory without taking ownership of it.
    fn borrowed(ptr: NonNull<u8>, len: usize) -> Mapping {
        Mapping { ptr, len, origin: Origin::Borrowed }
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match self.origin {
            Origin::Borrowed => {}
            Origin::Block(class) => crate::blocks::give_back(self.ptr, class),
            Origin::Recycled if recycled().keep(Backing(self.ptr), self.len).is_none() => {}
            Origin::Owned | Origin::Recycled => {
                // SAFETY: the range was mapped by `Mapping::new` and is unmapped once, here.
                let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
            }
        }
    }
}

/// What an allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cuMemAlloc` device memory.
    Device,
    /// `cuMemAllocHost` page-locked host memory.
    PinnedHost,
    /// `cuMemHostRegister`ed application memory.
    Registered,
    /// `cuMemAllocManaged` memory.
    Managed,
    /// A graph allocation, mapped by a launch of its graph (see `crate::graph`).
    Graph,
    /// Memory from a pool (`cuMemAllocFromPoolAsync`, `cuMemAllocAsync`).
    Pooled {
        /// The pool's handle.
        pool: usize,
        /// Whether it is host (or managed) memory rather than device memory.
        host: bool,
    },
}

impl Kind {
    /// Whether the memory lives in the device arena (inaccessible to the host).
    pub(crate) fn is_device_memory(self) -> bool {
        matches!(self, Kind::Device | Kind::Graph | Kind::Pooled { host: false, .. })
    }
}

/// One live allocation.
pub(crate) struct Allocation {
    /// Its address (device arena address, or host address for pinned host memory).
    pub base: u64,
    /// The size asked for.
    pub size: usize,
    /// Device or pinned host.
    pub kind: Kind,
    /// The device of the context it was allocated in.
    pub device: usize,
    /// The context it was allocated in.
    pub ctx: usize,
    /// A process-unique id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`).
    pub id: u64,
    /// The bytes.
    pub backing: Arc<Mapping>,
    /// For memory of a shareable pool: where in the pool's shared file the bytes are.
    pub file_offset: Option<u64>,
    /// For managed memory: the range attributes of its pages (`cuMemAdvise`, prefetches).
    pub pages: crate::managed::PageRuns,
}

/// A byte range inside an allocation's backing, kept alive for as long as an operation needs it.
#[derive(Clone)]
pub(crate) struct Span {
    backing: Arc<Mapping>,
    offset: usize,
    /// For VMM memory (the alias arena, which `cuMemUnmap` makes inaccessible again): whether each
    /// mapping the range covers is still mapped. Empty for an allocation's own backing, which the
    /// span keeps alive.
    mapped: Vec<Arc<AtomicBool>>,
}

impl Span {
    /// The first byte of the range, in the simulator's view of the memory.
    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: `offset` was checked against the allocation's size, which the backing covers.
        unsafe { self.backing.as_ptr().add(self.offset) }
    }

    /// Whether it is the same memory as `other` (the same backing at the same offset).
    fn is_same_memory(&self, other: &Span) -> bool {
        Arc::ptr_eq(&self.backing, &other.backing) && self.offset == other.offset
    }
}

/// Taken for reading by every operation touching VMM memory while it touches it, and for writing
/// by `cuMemUnmap` while it unmaps: an unmapping waits for the operations under way, and an
/// operation that comes after it sees its mappings gone (see [`Endpoint::hold`]).
static ALIAS_IN_USE: RwLock<()> = RwLock::new(());

/// What keeps the memory of an operation's endpoints reachable while the operation runs.
pub(crate) struct Held {
    _reading: Option<RwLockReadGuard<'static, ()>>,
}

/// One side of a copy or the target of a memset, as the simulator classified it.
#[derive(Clone)]
pub(crate) enum Endpoint {
    /// Device memory.
    Device(Span),
    /// Pinned host memory the simulator allocated.
    Pinned(Span),
    /// Any other host address (pageable memory), taken on trust as the driver does.
    Pageable(usize),
}

impl Endpoint {
    /// The address the simulator reads or writes.
    pub(crate) fn ptr(&self) -> *mut u8 {
        match self {
            Endpoint::Device(span) | Endpoint::Pinned(span) => span.ptr(),
            Endpoint::Pageable(address) => *address as *mut u8,
        }
    }

    /// Whether it is host memory (pinned or pageable).
    pub(crate) fn is_host(&self) -> bool {
        !matches!(self, Endpoint::Device(_))
    }

    /// Whether it is pageable host memory.
    pub(crate) fn is_pageable(&self) -> bool {
        matches!(self, Endpoint::Pageable(_))
    }

    /// Whether it is the same memory as `other`: the same host address, or the same bytes of the
    /// same backing.
    pub(crate) fn is_same_memory(&self, other: &Endpoint) -> bool {
        match (self, other) {
            (Endpoint::Device(a), Endpoint::Device(b)) | (Endpoint::Pinned(a), Endpoint::Pinned(b)) => {
                a.is_same_memory(b)
            }
            (Endpoint::Pageable(a), Endpoint::Pageable(b)) => a == b,
            _ => false,
        }
    }

    /// Makes the memory of `endpoints` reachable until the result is dropped: `None` if VMM
    /// memory among them has been unmapped since they were classified (an operation must then
    /// not touch it: on a GPU it faults with an illegal address). Holding it keeps `cuMemUnmap`
    /// waiting.
    pub(crate) fn hold(endpoints: &[&Endpoint]) -> Option<Held> {
        let mapped = || endpoints.iter().filter_map(|e| e.span()).flat_map(|span| span.mapped.iter());
        if mapped().next().is_none() {
            return Some(Held { _reading: None });
        }
        let guard = ALIAS_IN_USE.read().unwrap_or_else(PoisonError::into_inner);
        mapped().all(|live| live.load(Ordering::SeqCst)).then_some(Held { _reading: Some(guard) })
    }

    fn span(&self) -> Option<&Span> {
        match self {
            Endpoint::Device(span) | Endpoint::Pinned(span) => Some(span),
            Endpoint::Pageable(_) => None,
        }
    }
}

/// Memory a captured operation touches, as classified at capture time: a launch replays the
/// operation only if the address still holds the same memory.
pub(crate) struct Touch {
    /// Where the range starts.
    pub address: u64,
    /// Its length.
    pub len: usize,
    /// What it was at capture time.
    pub endpoint: Endpoint,
}

/// The address-space reservation that device pointers are carved from.
struct Arena {
    reservation: Mapping,
    /// A second reservation of the same size where the simulator maps VMM memory at the same
    /// offsets as the device addresses it backs, so that any contiguous mapped device range is a
    /// contiguous range here too, however many physical allocations it spans.
    alias: Arc<Mapping>,
    /// Where the next search for free space starts.
    cursor: u64,
    /// Live ranges: start → length (guard included).
    used: BTreeMap<u64, u64>,
}

impl Arena {
    fn new() -> SimResult<Arena> {
        for size in ARENA_SIZES {
            if let (Ok(reservation), Ok(alias)) =
                (Mapping::inaccessible(size as usize), Mapping::inaccessible(size as usize))
            {
                let cursor = reservation.as_ptr() as u64;
                return Ok(Arena { reservation, alias: Arc::new(alias), cursor, used: BTreeMap::new() });
            }
        }
        fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    fn start(&self) -> u64 {
        self.reservation.as_ptr() as u64
    }

    fn end(&self) -> u64 {
        self.start() + self.reservation.len() as u64
    }

    fn contains(&self, address: u64) -> bool {
        (self.start()..self.end()).contains(&address)
    }

    /// Finds `len` bytes of free address space, next-fit from the cursor.
    fn take(&mut self, len: u64) -> SimResult<u64> {
        let found = self.find_from(self.cursor, len).or_else(|| self.find_from(self.start(), len));
        let start = found.ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        self.used.insert(start, len);
        self.cursor = start + len;
        Ok(start)
    }

    fn find_from(&self, from: u64, len: u64) -> Option<u64> {
        let mut candidate = from;
        // A range that starts before `from` may still cover it.
        if let Some((&start, &used)) = self.used.range(..from).next_back()
            && start + used > candidate
        {
            candidate = start + used;
        }
        for (&start, &used) in self.used.range(from..) {
            if candidate.checked_add(len).is_some_and(|end| end <= start) {
                return Some(candidate);
            }
            candidate = candidate.max(start + used);
        }
        candidate.checked_add(len).is_some_and(|end| end <= self.end()).then_some(candidate)
    }

    fn give_back(&mut self, start: u64) {
        self.used.remove(&start);
    }

    /// Takes `[start, start + len)` if it lies in the arena and is free.
    fn take_at(&mut self, start: u64, len: u64) -> bool {
        let end = match start.checked_add(len) {
            Some(end) if start >= self.start() && end <= self.end() => end,
            _ => return false,
        };
        let before = self.used.range(..=start).next_back().is_some_and(|(&s, &l)| s + l > start);
        let inside = self.used.range(start..end).next().is_some();
        if before || inside {
            return false;
        }
        self.used.insert(start, len);
        true
    }

    /// Takes `len` bytes aligned to `align` (a power of two), next-fit.
    fn take_aligned(&mut self, len: u64, align: u64) -> SimResult<u64> {
        // Over-take, then keep the aligned part: the slack is returned at once.
        let start = self.take(len.checked_add(align).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?)?;
        self.used.remove(&start);
        let aligned = start.div_ceil(align) * align;
        self.used.insert(aligned, len);
        self.cursor = aligned + len;
        Ok(aligned)
    }
}

/// A mapping of VMM memory (`cuMemMap`) and the access devices have to it.
pub(crate) struct MappedRange {
    /// Its size.
    pub size: u64,
    /// The physical allocation mapped.
    pub physical: Arc<crate::vmm::Physical>,
    /// Access granted, per device (none until `cuMemSetAccess`).
    pub access: BTreeMap<usize, cuda_mem_sys::types::CUmemAccess_flags>,
    /// Whether it is still mapped (cleared by [`MemoryTable::unmap`]), for operations enqueued
    /// before it was unmapped.
    pub live: Arc<AtomicBool>,
}

/// Every live allocation of the process.
#[derive(Default)]
pub(crate) struct MemoryTable {
    allocations: BTreeMap<u64, Allocation>,
    /// The live allocations of shareable pools by (pool, file offset, address): an import looks
    /// up an earlier import of the same memory here, which a scan of every allocation made
    /// quadratic in a batch of imports.
    shared: BTreeSet<(usize, u64, u64)>,
    arena: Option<Arena>,
    next_id: u64,
    /// VMM address reservations: start → size.
    pub reservations: BTreeMap<u64, u64>,
    /// VMM mappings: start → mapping.
    pub mapped: BTreeMap<u64, MappedRange>,
}

/// An allocation's entry in [`MemoryTable`]'s index of shareable pools' memory, if it has one
/// (memory of a pool, at an offset of the pool's shared file): one definition for adding and
/// removing it.
fn shared_key(kind: Kind, file_offset: Option<u64>, base: u64) -> Option<(usize, u64, u64)> {
    match (kind, file_offset) {
        (Kind::Pooled { pool, .. }, Some(offset)) => Some((pool, offset, base)),
        _ => None,
    }
}

/// Rounds up to the accounting granularity, saturating: a size that does not fit rounded is
/// more than any device has, which the callers' comparisons then refuse.
pub(crate) fn round_up(size: u64) -> u64 {
    size.div_ceil(PAGE).saturating_mul(PAGE)
}

impl MemoryTable {
    /// Allocates `size` bytes of device memory for `device` in context `ctx`.
    pub(crate) fn alloc_device(&mut self, size: usize, device: usize, ctx: usize) -> SimResult<u64> {
        self.alloc(size, Kind::Device, device, ctx)
    }

    /// Allocates `size` bytes of `kind` memory for `device` in context `ctx`: in the device
    /// arena for device memory, as ordinary host memory otherwise.
    pub(crate) fn alloc(&mut self, size: usize, kind: Kind, device: usize, ctx: usize) -> SimResult<u64> {
        ensure(size > 0)?;
        let backing = match kind {
            Kind::Pooled { host: false, .. } => Mapping::device_pooled(size)?,
            Kind::Pooled { host: true, .. } => Mapping::pooled(size)?,
            _ => Mapping::read_write(size)?,
        };
        self.place(size, kind, device, ctx, Arc::new(backing), None)
    }

    /// Records a zero-byte allocation of `kind` (a zero-byte pool allocation): a unique address
    /// that starts no bytes, backed by a private page that nothing can reach, so that freeing it
    /// is checked as any other free and it outlives nothing it should not.
    pub(crate) fn alloc_empty(&mut self, kind: Kind, device: usize, ctx: usize) -> SimResult<u64> {
        let backing = Mapping::inaccessible(1)?;
        self.place(0, kind, device, ctx, Arc::new(backing), None)
    }

    /// Allocates `size` bytes of pinned host memory in context `ctx`.
    pub(crate) fn alloc_pinned(&mut self, size: usize, device: usize, ctx: usize) -> SimResult<u64> {
        self.alloc(size, Kind::PinnedHost, device, ctx)
    }

    /// Records an allocation whose bytes are `size` bytes of the shared file `file` at `offset`
    /// (memory of a pool that can be shared between processes).
    pub(crate) fn alloc_shared(
        &mut self,
        size: usize,
        kind: Kind,
        device: usize,
        ctx: usize,
        file: BorrowedFd<'_>,
        offset: u64,
    ) -> SimResult<u64> {
        ensure(size > 0)?;
        let backing = Arc::new(Mapping::shared(file, offset, size)?);
        self.place(size, kind, device, ctx, backing, Some(offset))
    }

    /// Gives an allocation its address (in the device arena for device memory, the backing's own
    /// address otherwise) and records it.
    fn place(
        &mut self,
        size: usize,
        kind: Kind,
        device: usize,
        ctx: usize,
        backing: Arc<Mapping>,
        file_offset: Option<u64>,
    ) -> SimResult<u64> {
        let base = if kind.is_device_memory() { self.take_device_range(size)? } else { backing.as_ptr() as u64 };
        self.insert(base, size, kind, device, ctx, backing, file_offset);
        Ok(base)
    }

    /// The live allocation of pool `pool` at file offset `offset`, if any (an earlier import of
    /// the same memory).
    pub(crate) fn find_shared(&self, pool: usize, offset: u64) -> Option<&Allocation> {
        let &(_, _, base) = self.shared.range((pool, offset, 0)..=(pool, offset, u64::MAX)).next()?;
        self.allocations.get(&base)
    }

    /// Registers `size` bytes of application memory at `address` as page-locked.
    /// Overlapping an existing registration or allocation is
    /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
    pub(crate) fn register(&mut self, address: u64, size: usize, device: usize, ctx: usize) -> SimResult {
        ensure(size > 0)?;
        let ptr = NonNull::new(address as *mut u8).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let end = address.checked_add(size as u64).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let in_arena = self.arena.as_ref().is_some_and(|arena| arena.contains(address));
        ensure(!in_arena)?;
        let overlaps = self.find(address).is_some() || self.allocations.range(address..end).next().is_some();
        if overlaps {
            return fail(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.insert(address, size, Kind::Registered, device, ctx, Arc::new(Mapping::borrowed(ptr, size)), None);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        base: u64,
        size: usize,
        kind: Kind,
        device: usize,
        ctx: usize,
        backing: Arc<Mapping>,
        file_offset: Option<u64>,
    ) {
        self.next_id += 1;
        let id = self.next_id;
        if let Some(key) = shared_key(kind, file_offset, base) {
            self.shared.insert(key);
        }
        self.allocations.insert(
            base,
            Allocation { base, size, kind, device, ctx, id, backing, file_offset, pages: Default::default() },
        );
    }

    /// Frees the allocation that starts at `base`, which must be of `kind`.
    pub(crate) fn free(&mut self, base: u64, kind: Kind) -> SimResult<Allocation> {
        self.free_if(base, |k| k == kind)
    }

    /// Frees the allocation that starts at `base` if its kind passes `accept`; otherwise (or if
    /// there is none) `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn free_if(&mut self, base: u64, accept: impl Fn(Kind) -> bool) -> SimResult<Allocation> {
        match self.allocations.get(&base) {
            Some(a) if accept(a.kind) => {}
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        let allocation = self.allocations.remove(&base).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if let Some(key) = shared_key(allocation.kind, allocation.file_offset, base) {
            self.shared.remove(&key);
        }
        // A graph allocation's address stays its graph's: it is never handed out again.
        if allocation.kind.is_device_memory()
            && allocation.kind != Kind::Graph
            && let Some(arena) = self.arena.as_mut()
        {
            arena.give_back(base);
        }
        Ok(allocation)
    }

    /// Takes device address space for a graph allocation of `size` bytes, for good: the address
    /// is the allocation node's for the life of the process (it is mapped and unmapped with
    /// [`map_graph`](MemoryTable::map_graph) and [`unmap_graph`](MemoryTable::unmap_graph)).
    pub(crate) fn reserve_graph(&mut self, size: usize) -> SimResult<u64> {
        ensure(size > 0)?;
        self.take_device_range(size)
    }

    /// Device address space for `size` bytes and the guard after them.
    fn take_device_range(&mut self, size: usize) -> SimResult<u64> {
        if self.arena.is_none() {
            self.arena = Some(Arena::new()?);
        }
        let arena = self.arena.as_mut().ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let len = round_up(size as u64).checked_add(GUARD).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        arena.take(len)
    }

    /// Maps a graph allocation: its address becomes a live allocation with its bytes.
    pub(crate) fn map_graph(&mut self, alloc: &crate::graph::GraphAlloc) {
        let backing = Arc::clone(&alloc.backing);
        self.insert(alloc.base, alloc.size, Kind::Graph, alloc.device, alloc.ctx, backing, None);
    }

    /// Whether the graph allocation at `base` is mapped.
    pub(crate) fn is_graph_mapped(&self, base: u64) -> bool {
        self.allocations.get(&base).is_some_and(|a| a.kind == Kind::Graph)
    }

    /// Unmaps the graph allocation at `base`, if it is mapped.
    pub(crate) fn unmap_graph(&mut self, base: u64) -> Option<Allocation> {
        self.free(base, Kind::Graph).ok()
    }

    /// Every live allocation from pool `pool`.
    pub(crate) fn pooled_in(&self, pool: usize) -> impl Iterator<Item = &Allocation> {
        self.allocations.values().filter(move |a| matches!(a.kind, Kind::Pooled { pool: p, .. } if p == pool))
    }

    /// Removes every allocation of context `ctx` (the context is being destroyed).
    pub(crate) fn free_context(&mut self, ctx: usize) -> Vec<Allocation> {
        let bases: Vec<u64> = self
            .allocations
            .values()
            .filter(|a| a.ctx == ctx && !matches!(a.kind, Kind::Pooled { .. }))
            .map(|a| a.base)
            .collect();
        bases.into_iter().filter_map(|base| self.free_if(base, |_| true).ok()).collect()
    }

    /// How many allocations are live.
    pub(crate) fn allocation_count(&self) -> usize {
        self.allocations.len()
    }

    /// The allocation containing `address`, if any.
    pub(crate) fn find(&self, address: u64) -> Option<&Allocation> {
        let (_, allocation) = self.allocations.range(..=address).next_back()?;
        (address < allocation.base + allocation.size as u64).then_some(allocation)
    }

    /// The allocation containing `address`, if any, for changing it.
    pub(crate) fn find_mut(&mut self, address: u64) -> Option<&mut Allocation> {
        let (_, allocation) = self.allocations.range_mut(..=address).next_back()?;
        (address < allocation.base + allocation.size as u64).then_some(allocation)
    }

    /// Classifies `[address, address + len)`: inside one allocation, or pageable host memory.
    /// An address in the device arena that is not inside a live allocation, a range that runs
    /// past its allocation's end, and null are `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn classify(&self, address: u64, len: usize) -> SimResult<Endpoint> {
        ensure(address != 0)?;
        if let Some(allocation) = self.find(address) {
            let offset = (address - allocation.base) as usize;
            ensure(len <= allocation.size - offset)?;
            let span = Span { backing: Arc::clone(&allocation.backing), offset, mapped: Vec::new() };
            return Ok(if allocation.kind.is_device_memory() {
                Endpoint::Device(span)
            } else {
                Endpoint::Pinned(span)
            });
        }
        if let Some(span) = self.mapped_span(address, len) {
            return Ok(Endpoint::Device(span));
        }
        let in_arena = self.arena.as_ref().is_some_and(|arena| arena.contains(address));
        ensure(!in_arena)?;
        Ok(Endpoint::Pageable(address as usize))
    }

    /// The VMM mappings covering `[address, address + len)` without a gap, in order, if they do.
    pub(crate) fn mapped_cover(&self, address: u64, len: u64) -> Option<Vec<(u64, &MappedRange)>> {
        let (&first, range) = self.mapped.range(..=address).next_back()?;
        if address >= first + range.size {
            return None;
        }
        let end = address.checked_add(len.max(1))?;
        let mut cover = vec![(first, range)];
        let mut reached = first + range.size;
        while reached < end {
            let next = self.mapped.get(&reached)?;
            cover.push((reached, next));
            reached += next.size;
        }
        Some(cover)
    }

    /// A span of the alias arena for a contiguous mapped range.
    fn mapped_span(&self, address: u64, len: usize) -> Option<Span> {
        let mapped = self.mapped_cover(address, len as u64)?.into_iter().map(|(_, r)| Arc::clone(&r.live)).collect();
        let arena = self.arena.as_ref()?;
        Some(Span { backing: Arc::clone(&arena.alias), offset: (address - arena.start()) as usize, mapped })
    }

    /// Reserves `size` bytes of device address space (`cuMemAddressReserve`), at `hint` when that
    /// range is free, aligned to `align`. A `refused` hint is not honoured: the range starts
    /// elsewhere, even where the hint's range is free.
    pub(crate) fn reserve(&mut self, size: u64, align: u64, hint: u64, refused: bool) -> SimResult<u64> {
        if self.arena.is_none() {
            self.arena = Some(Arena::new()?);
        }
        let arena = self.arena.as_mut().ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let base = if hint != 0 && !refused && hint.is_multiple_of(align) && arena.take_at(hint, size) {
            hint
        } else {
            let base = arena.take_aligned(size, align)?;
            if refused && base == hint {
                // The next free range is the hint's own: take the one after it instead.
                let elsewhere = arena.take_aligned(size, align);
                arena.give_back(base);
                elsewhere?
            } else {
                base
            }
        };
        self.reservations.insert(base, size);
        Ok(base)
    }

    /// Frees a reservation: `base` and `size` must match one exactly and nothing may be mapped
    /// in it.
    pub(crate) fn free_reservation(&mut self, base: u64, size: u64) -> SimResult {
        ensure(self.reservations.get(&base) == Some(&size))?;
        ensure(self.mapped.range(base..base + size).next().is_none())?;
        self.reservations.remove(&base);
        if let Some(arena) = self.arena.as_mut() {
            arena.give_back(base);
        }
        Ok(())
    }

    /// Maps `physical` at `[base, base + size)`, which must lie inside one reservation and
    /// overlap no mapping.
    pub(crate) fn map(&mut self, base: u64, size: u64, physical: Arc<crate::vmm::Physical>) -> SimResult {
        let inside = self
            .reservations
            .range(..=base)
            .next_back()
            .is_some_and(|(&start, &len)| base.checked_add(size).is_some_and(|end| end <= start + len));
        ensure(inside)?;
        let overlaps = self.mapped.range(..base).next_back().is_some_and(|(&s, r)| s + r.size > base)
            || self.mapped.range(base..base + size).next().is_some();
        ensure(!overlaps)?;
        let arena = self.arena.as_ref().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let alias = arena.alias.as_ptr() as u64 + (base - arena.start());
        physical.map_at(alias, size)?;
        let live = Arc::new(AtomicBool::new(true));
        self.mapped.insert(base, MappedRange { size, physical, access: BTreeMap::new(), live });
        Ok(())
    }

    /// Unmaps `[base, base + size)`, which must be made of whole mappings; returns them.
    pub(crate) fn unmap(&mut self, base: u64, size: u64) -> SimResult<Vec<MappedRange>> {
        let end = base.checked_add(size).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let mut cursor = base;
        while cursor < end {
            let range = self.mapped.get(&cursor).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            cursor += range.size;
        }
        ensure(cursor == end)?;
        let arena = self.arena.as_ref().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let alias = arena.alias.as_ptr() as u64 + (base - arena.start());
        // Operations touching the memory finish first; those after see it unmapped.
        let _no_operation = ALIAS_IN_USE.write().unwrap_or_else(PoisonError::into_inner);
        for range in self.mapped.range(base..end).map(|(_, r)| r) {
            range.live.store(false, Ordering::SeqCst);
        }
        if let Err(code) = crate::vmm::unmap_alias(alias, size) {
            for range in self.mapped.range(base..end).map(|(_, r)| r) {
                range.live.store(true, Ordering::SeqCst);
            }
            return fail(code);
        }
        let starts: Vec<u64> = self.mapped.range(base..end).map(|(&s, _)| s).collect();
        Ok(starts.into_iter().filter_map(|s| self.mapped.remove(&s)).collect())
    }

    /// Classifies memory that must have been allocated by the simulator (a device pointer).
    pub(crate) fn classify_allocated(&self, address: u64, len: usize) -> SimResult<Endpoint> {
        match self.classify(address, len)? {
            Endpoint::Pageable(_) => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
            endpoint => Ok(endpoint),
        }
    }

    /// Classifies memory that must be on the host side (pinned or pageable).
    pub(crate) fn classify_host(&self, address: u64, len: usize) -> SimResult<Endpoint> {
        match self.classify(address, len)? {
            Endpoint::Device(_) => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
            endpoint => Ok(endpoint),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many backings of `len` bytes are kept.
    fn kept(len: usize) -> usize {
        recycled().by_len.get(&len).map_or(0, Vec::len)
    }

    #[test]
    fn freed_pool_backings_are_handed_out_again_as_they_were() {
        // A length no other test uses, so that parallel tests do not take these backings.
        let len = 3 * 4096 + 24;
        let first = Mapping::pooled(len).unwrap();
        let ptr = first.as_ptr();
        // SAFETY: `first` owns `len` writable bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr, 0xa5, len) };
        drop(first);
        assert_eq!(kept(len), 1);
        let again = Mapping::pooled(len).unwrap();
        assert_eq!((again.as_ptr(), kept(len)), (ptr, 0), "the kept backing comes back");
        // SAFETY: `again` owns `len` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(again.as_ptr(), len) };
        assert!(bytes.iter().all(|&b| b == 0xa5), "not cleared, as a pool's reused memory is not");
        // Other kinds of memory are never kept.
        drop(Mapping::read_write(len).unwrap());
        assert_eq!(kept(len), 0);
    }

    #[test]
    fn kept_backings_stay_under_the_bound() {
        let len = (RECYCLE_BYTES / 4) + 4096 * 7;
        let mappings: Vec<Mapping> = (0..6).map(|_| Mapping::pooled(len).unwrap()).collect();
        drop(mappings);
        assert!(kept(len) <= 4, "{} kept", kept(len));
        assert!(recycled().bytes <= RECYCLE_BYTES);
        // Unmap them again, for the other tests.
        loop {
            let Some(Backing(ptr)) = recycled().take(len) else { break };
            drop(Mapping { ptr, len, origin: Origin::Owned });
        }
    }

    #[test]
    fn device_addresses_are_not_reused_until_the_arena_wraps() {
        let mut table = MemoryTable::default();
        let a = table.alloc_device(100, 0, 1).unwrap();
        table.free(a, Kind::Device).unwrap();
        let b = table.alloc_device(100, 0, 1).unwrap();
        assert_ne!(a, b);
        assert!(matches!(table.classify(a, 1), Err(CUresult::CUDA_ERROR_INVALID_VALUE)));
        assert!(matches!(table.classify(b + 50, 50), Ok(Endpoint::Device(_))));
        assert!(matches!(table.classify(b + 50, 51), Err(CUresult::CUDA_ERROR_INVALID_VALUE)));
    }

    #[test]
    fn shared_allocations_are_found_by_pool_and_offset_while_they_live() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(4 * 65536).unwrap();
        let fd = std::os::fd::AsFd::as_fd(&file);
        let mut table = MemoryTable::default();
        let pooled = |pool| Kind::Pooled { pool, host: false };
        let a = table.alloc_shared(100, pooled(7), 0, 1, fd, 0).unwrap();
        let b = table.alloc_shared(100, pooled(7), 0, 1, fd, 65536).unwrap();
        // Another pool's import of the same bytes is not this pool's.
        let c = table.alloc_shared(100, pooled(8), 0, 1, fd, 0).unwrap();
        let found = |table: &MemoryTable, pool, offset| table.find_shared(pool, offset).map(|a| a.base);
        assert_eq!(found(&table, 7, 0), Some(a));
        assert_eq!(found(&table, 7, 65536), Some(b));
        assert_eq!(found(&table, 8, 0), Some(c));
        assert_eq!(found(&table, 8, 65536), None);
        assert_eq!(found(&table, 7, 131072), None);
        table.free(a, pooled(7)).unwrap();
        assert_eq!(found(&table, 7, 0), None, "a freed allocation is not found");
        assert_eq!((found(&table, 7, 65536), found(&table, 8, 0)), (Some(b), Some(c)));
        // A device allocation has no offset and is never found.
        table.alloc_device(100, 0, 1).unwrap();
        assert_eq!(found(&table, 7, 0), None);
    }

    #[test]
    fn frees_check_kind_and_base() {
        let mut table = MemoryTable::default();
        let d = table.alloc_device(10, 0, 1).unwrap();
        let h = table.alloc_pinned(10, 0, 1).unwrap();
        assert!(table.free(d, Kind::PinnedHost).is_err());
        assert!(table.free(h, Kind::Device).is_err());
        assert!(table.free(d + 1, Kind::Device).is_err());
        table.free(d, Kind::Device).unwrap();
        assert!(table.free(d, Kind::Device).is_err());
        assert!(matches!(table.classify(h, 10), Ok(Endpoint::Pinned(_))));
        assert_eq!(table.alloc_device(0, 0, 1), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn next_fit_wraps_and_reuses_space() {
        let mut arena = Arena::new().unwrap();
        let total = arena.end() - arena.start();
        let first = arena.take(total / 2).unwrap();
        let second = arena.take(total / 4).unwrap();
        assert_eq!(second, first + total / 2);
        assert!(arena.take(total / 2).is_err());
        arena.give_back(first);
        assert_eq!(arena.take(total / 2).unwrap(), first);
    }

    #[test]
    fn lengths_that_overflow_the_arena_are_out_of_memory() {
        let out_of_memory = Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let mut arena = Arena::new().unwrap();
        let first = arena.take(4096).unwrap();
        for len in [u64::MAX, u64::MAX - 4096, u64::MAX - first] {
            assert_eq!(arena.take(len), out_of_memory, "{len} bytes");
            assert_eq!(arena.take_aligned(len, 2 << 20), out_of_memory, "{len} bytes aligned");
        }
        assert_eq!(arena.used.len(), 1, "nothing was taken");
        let mut table = MemoryTable::default();
        assert_eq!(table.reserve(u64::MAX - 4095, 2 << 20, 0, false), out_of_memory);
        assert_eq!(table.alloc_device(usize::MAX, 0, 1), out_of_memory);
        assert_eq!(table.allocation_count(), 0);
    }
}
