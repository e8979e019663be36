//! Stream-ordered memory pools: properties, peer access, and the accounting the pool attributes
//! report.
//!
//! Accounting model (the driver documents the attributes, not how it reserves):
//! - `used` is the sum of the sizes of live allocations, updated when an allocation is made and
//!   when its `cuMemFreeAsync` is reached in stream order;
//! - `reserved` grows in whole [`CHUNK`]s when `used` outgrows it, and shrinks only at
//!   synchronization points (`cuStreamSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize`),
//!   down to the release threshold but never below what is in use, or on `cuMemPoolTrimTo`;
//!   bytes freed in stream order count as in use for both until the host observes their
//!   stream's progress (`cuStreamSynchronize` or a successful `cuStreamQuery` of it,
//!   `cuEventSynchronize` or a successful `cuEventQuery` of an event last recorded on it,
//!   `cuCtxSynchronize` of its context), as `cuMemPoolTrimTo`'s note allows;
//! - the high-water marks follow both, and setting one to 0 resets it to the current value;
//! - an allocation that fails changes none of them: it is planned ([`PoolState::plan`]) without
//!   touching the state, and committed ([`PoolState::commit`]) only once it has succeeded. A
//!   size whose accounting does not fit in 64 bits is `CUDA_ERROR_OUT_OF_MEMORY`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::types::{CUmemAccess_flags, CUmemPool_attribute, CUresult};

use crate::error::{SimResult, ensure, fail};
use crate::shared::SharedArena;

/// The granularity in which a pool reserves memory.
pub(crate) const CHUNK: u64 = 2 << 20;

/// Rounds up to whole chunks; `None` when that does not fit in 64 bits.
pub(crate) fn chunks(bytes: u64) -> Option<u64> {
    bytes.div_ceil(CHUNK).checked_mul(CHUNK)
}

/// Where a pool's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// On a device.
    Device(usize),
    /// Host memory, no NUMA preference.
    Host,
    /// Host memory on a NUMA node.
    HostNuma(i32),
    /// Managed memory with no preferred location.
    Unspecified,
}

/// A location as a hashable key (for the table of current pools per location).
pub(crate) type LocationKey = (u8, i32);

impl Location {
    /// The location as a key.
    pub(crate) fn key(self) -> LocationKey {
        match self {
            Location::Device(d) => (0, d as i32),
            Location::Host => (1, -1),
            Location::HostNuma(n) => (2, n),
            Location::Unspecified => (3, -1),
        }
    }

    /// Whether the memory is host memory (accessible from the host).
    pub(crate) fn is_host(self) -> bool {
        !matches!(self, Location::Device(_))
    }
}

/// What kind of memory a pool hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolKind {
    /// Ordinary (pinned) memory at the pool's location.
    Pinned,
    /// Managed memory, accessible from the host and every device.
    Managed,
}

/// One pool.
pub(crate) struct Pool {
    /// The handle the application sees.
    pub handle: usize,
    /// Where its memory lives.
    pub location: Location,
    /// Pinned or managed.
    pub kind: PoolKind,
    /// Shareable handle types it was created with (`CUmemAllocationHandleType` bits).
    pub handle_types: u32,
    /// The most it may reserve (0: the device's memory).
    pub max_size: u64,
    /// Whether it is a device's (or the host's) default pool, which cannot be destroyed.
    pub is_default: bool,
    /// The shared file, for shareable and imported pools.
    pub shared: Option<SharedArena>,
    destroyed: AtomicBool,
    state: Mutex<PoolState>,
}

/// A planned allocation: its bytes, and how much more the pool must reserve for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Growth {
    /// The allocation's size.
    pub size: u64,
    /// The bytes the pool's reserve grows by (whole chunks; 0 when it already has room).
    pub grown: u64,
}

/// Work whose completion the host has observed: a stream's so far, or every stream's of a
/// context (destroyed ones included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    /// A stream, by handle.
    Stream(usize),
    /// A stream's frees that ran before a recording of an event on it completed: those noted
    /// with a mark up to `mark` (see [`crate::stream::Stream::marks`]).
    StreamUpTo {
        /// The stream's handle.
        stream: usize,
        /// The stream's count of completed recordings before that one.
        mark: u64,
    },
    /// A context, by handle.
    Context(usize),
}

/// Where and when a stream-ordered free ran: the stream's handle, its context's, and the
/// stream's count of completed event recordings (its [`marks`](crate::stream::Stream::marks)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreedOn {
    /// The stream's handle.
    pub stream: usize,
    /// Its context's handle.
    pub ctx: usize,
    /// The stream's mark as the free ran.
    pub mark: u64,
}

/// Bytes freed on one stream that the host has not seen freed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unobserved {
    /// The stream's handle.
    pub stream: usize,
    /// Its context's handle: synchronizing the context observes it, even once the stream is
    /// destroyed.
    pub ctx: usize,
    /// The stream's count of completed event recordings when these frees ran (the largest, for
    /// frees merged from several counts).
    pub mark: u64,
    /// The bytes.
    pub bytes: u64,
}

/// At most this many counts of unobserved frees are kept per stream and pool; beyond it the two
/// oldest are merged under the later mark, which only keeps memory outstanding longer.
const UNOBSERVED_PER_STREAM: usize = 16;

/// The mutable part of a pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolState {
    /// Bytes in live allocations.
    pub used: u64,
    /// High-water mark of `used` since the last reset.
    pub used_high: u64,
    /// Bytes reserved.
    pub reserved: u64,
    /// High-water mark of `reserved` since the last reset.
    pub reserved_high: u64,
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub release_threshold: u64,
    /// The three reuse policies, in attribute order.
    pub reuse: [bool; 3],
    /// Access granted to devices other than the owner (device → flags).
    pub access: BTreeMap<usize, CUmemAccess_flags>,
    /// Bytes freed in stream order whose completion the host has not observed yet, by the
    /// stream they were freed on (its handle). `cuda.h` (`cuMemPoolTrimTo`): such frees "can
    /// count as outstanding", so they keep their memory reserved until a synchronization with
    /// their stream (see [`PoolState::observe`]).
    pub unobserved: Vec<Unobserved>,
}

impl Pool {
    /// A new pool; its reuse policies start enabled, as the driver's do.
    pub(crate) fn new(location: Location, kind: PoolKind, handle_types: u32, max_size: u64, is_default: bool) -> Pool {
        Pool::with_shared(location, kind, handle_types, max_size, is_default, None)
    }

    /// A pool whose memory is a shared file (shareable pools, and pools imported from another
    /// process).
    pub(crate) fn with_shared(
        location: Location,
        kind: PoolKind,
        handle_types: u32,
        max_size: u64,
        is_default: bool,
        shared: Option<SharedArena>,
    ) -> Pool {
        Pool {
            handle: crate::handle::next(),
            location,
            kind,
            handle_types,
            max_size,
            is_default,
            shared,
            destroyed: AtomicBool::new(false),
            state: Mutex::new(PoolState { reuse: [true; 3], ..PoolState::default() }),
        }
    }

    /// Whether the pool was imported from another process (and so cannot allocate).
    pub(crate) fn is_imported(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.imported)
    }

    /// Accounts for a freed allocation of this pool: its bytes, and, for a shareable pool of
    /// this process, its place in the shared file.
    pub(crate) fn release(&self, allocation: &crate::memory::Allocation) {
        self.release_on(allocation, None);
    }

    /// [`release`](Pool::release) of an allocation whose free `stream` reached (the stream's
    /// handle, its context's and its mark): outstanding until the host observes that stream (see
    /// [`PoolState::free_unobserved`]); `None` for a free the host has observed as it happened.
    pub(crate) fn release_on(&self, allocation: &crate::memory::Allocation, stream: Option<FreedOn>) {
        match stream {
            // The check and the record under the pool's lock: a context destroyed meanwhile
            // settles this pool's frees after marking itself so (see `destroy_primary`).
            Some(on) => {
                let mut state = self.lock();
                if crate::context::is_live(on.ctx) {
                    state.free_unobserved(allocation.size as u64, on);
                } else {
                    // A destroyed context's free: no synchronization can observe it any more,
                    // and the context's allocations are gone with it (`cuDevicePrimaryCtxReset`).
                    state.free(allocation.size as u64);
                }
            }
            None => self.lock().free(allocation.size as u64),
        }
        if let (Some(shared), Some(offset)) = (&self.shared, allocation.file_offset) {
            if shared.imported {
                shared.release_import(offset, allocation.size as u64);
            } else {
                shared.give_back(offset, allocation.size as u64);
            }
        }
    }

    /// Whether `cuMemPoolDestroy` was called (its handle is then invalid, though allocations
    /// still live keep their memory until freed).
    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// Marks the pool destroyed.
    pub(crate) fn mark_destroyed(&self) {
        self.destroyed.store(true, Ordering::Release);
    }

    /// The pool's state, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The device that owns it, for device pools.
    pub(crate) fn owner(&self) -> Option<usize> {
        match self.location {
            Location::Device(d) => Some(d),
            _ => None,
        }
    }

    /// Whether the memory is host memory.
    pub(crate) fn is_host_memory(&self) -> bool {
        self.kind == PoolKind::Managed || self.location.is_host()
    }

    /// The access `device` has to the pool's memory: the owner and managed pools always
    /// read-write; others, pinned host pools included, as granted (`cuda.h`: a host pool's
    /// memory is accessible from the host CPU by default, so a device has none until given it).
    pub(crate) fn access(&self, device: usize) -> CUmemAccess_flags {
        if self.kind == PoolKind::Managed || self.owner() == Some(device) {
            return CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
        self.lock().access.get(&device).copied().unwrap_or(CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE)
    }
}

impl PoolState {
    /// What an allocation of `size` bytes would do to the pool, without doing it:
    /// `CUDA_ERROR_OUT_OF_MEMORY` past `max_size` (0: no limit of the pool's own) or when the
    /// accounting would not fit in 64 bits.
    pub(crate) fn plan(&self, size: u64, max_size: u64) -> SimResult<Growth> {
        let out_of_memory = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        let used = self.used.checked_add(size).ok_or(out_of_memory)?;
        let needed = chunks(used).ok_or(out_of_memory)?.max(self.reserved);
        // A limit too large to round is no limit this pool can reach.
        if max_size > 0 && chunks(max_size).is_some_and(|limit| needed > limit) {
            return fail(out_of_memory);
        }
        Ok(Growth { size, grown: needed - self.reserved })
    }

    /// Applies a planned allocation that succeeded. Relative to the state now: frees reached
    /// since the plan only lowered `used`, so the planned growth still covers it.
    pub(crate) fn commit(&mut self, growth: Growth) {
        self.used = self.used.saturating_add(growth.size);
        self.reserved = self.reserved.saturating_add(growth.grown);
        self.used_high = self.used_high.max(self.used);
        self.reserved_high = self.reserved_high.max(self.reserved);
    }

    /// [`plan`](PoolState::plan) and [`commit`](PoolState::commit) at once; returns how many
    /// more bytes were reserved.
    pub(crate) fn allocate(&mut self, size: u64, max_size: u64) -> SimResult<u64> {
        let growth = self.plan(size, max_size)?;
        self.commit(growth);
        Ok(growth.grown)
    }

    /// Accounts for a freed allocation.
    pub(crate) fn free(&mut self, size: u64) {
        self.used = self.used.saturating_sub(size);
    }

    /// Accounts for an allocation freed when a stream reached its free (`on`): no longer used,
    /// but outstanding until the host observes that stream's progress up to the free.
    pub(crate) fn free_unobserved(&mut self, size: u64, on: FreedOn) {
        self.free(size);
        let FreedOn { stream, ctx, mark } = on;
        if let Some(unobserved) = self.unobserved.iter_mut().find(|u| u.stream == stream && u.mark == mark) {
            unobserved.bytes = unobserved.bytes.saturating_add(size);
            return;
        }
        self.unobserved.push(Unobserved { stream, ctx, mark, bytes: size });
        if self.unobserved.iter().filter(|u| u.stream == stream).count() > UNOBSERVED_PER_STREAM {
            // Rarely: the stream's counts listed, oldest first, only to merge the first two.
            let mut counts: Vec<usize> =
                (0..self.unobserved.len()).filter(|&i| self.unobserved[i].stream == stream).collect();
            counts.sort_by_key(|&i| self.unobserved[i].mark);
            let (oldest, next) = (counts[0], counts[1]);
            self.unobserved[next].bytes = self.unobserved[next].bytes.saturating_add(self.unobserved[oldest].bytes);
            self.unobserved.swap_remove(oldest);
        }
    }

    /// The host has observed the completion of the work `seen`: its frees no longer count as
    /// outstanding.
    pub(crate) fn observe(&mut self, seen: Observed) {
        self.unobserved.retain(|u| match seen {
            Observed::Stream(stream) => u.stream != stream,
            Observed::StreamUpTo { stream, mark } => u.stream != stream || u.mark > mark,
            Observed::Context(ctx) => u.ctx != ctx,
        });
    }

    /// Bytes a trim must keep: those in use, and those freed but not yet observed.
    fn outstanding(&self) -> u64 {
        self.unobserved.iter().fold(self.used, |total, u| total.saturating_add(u.bytes))
    }

    /// Releases reserved memory down to `keep` (but never below what is in use or freed
    /// unobserved); returns the bytes released.
    pub(crate) fn release_to(&mut self, keep: u64) -> u64 {
        // What is outstanding never exceeds `reserved`, which is whole chunks; a `keep` too
        // large to round keeps everything.
        let in_use = chunks(self.outstanding()).unwrap_or(self.reserved).min(self.reserved);
        let kept = chunks(keep).map_or(self.reserved, |keep| keep.min(self.reserved));
        let floor = in_use.max(kept);
        let released = self.reserved.saturating_sub(floor);
        self.reserved -= released;
        released
    }

    /// The release a synchronization point performs.
    pub(crate) fn release_at_sync(&mut self) -> u64 {
        if self.reserved > self.release_threshold {
            let threshold = self.release_threshold;
            // Down to the threshold, rounded down to whole chunks.
            self.release_to(threshold / CHUNK * CHUNK)
        } else {
            0
        }
    }

    /// Reads an attribute (as a `u64`; the reuse flags are 0 or 1).
    pub(crate) fn get(&self, attribute: CUmemPool_attribute) -> SimResult<u64> {
        use CUmemPool_attribute as A;
        Ok(match attribute {
            A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => u64::from(self.reuse[0]),
            A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => u64::from(self.reuse[1]),
            A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => u64::from(self.reuse[2]),
            A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => self.release_threshold,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => self.reserved,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => self.reserved_high,
            A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT => self.used,
            A::CU_MEMPOOL_ATTR_USED_MEM_HIGH => self.used_high,
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// Sets an attribute: the reuse flags and the threshold take any value; the high-water marks
    /// only 0 (a reset to the current value); the current values cannot be set.
    pub(crate) fn set(&mut self, attribute: CUmemPool_attribute, value: u64) -> SimResult {
        use CUmemPool_attribute as A;
        match attribute {
            A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES => self.reuse[0] = value != 0,
            A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC => self.reuse[1] = value != 0,
            A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => self.reuse[2] = value != 0,
            A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => self.release_threshold = value,
            A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => {
                ensure(value == 0)?;
                self.reserved_high = self.reserved;
            }
            A::CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
                ensure(value == 0)?;
                self.used_high = self.used;
            }
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }

    /// Whether an attribute is 32-bit (`int`) rather than 64-bit (`cuuint64_t`).
    pub(crate) fn is_int_attribute(attribute: CUmemPool_attribute) -> bool {
        use CUmemPool_attribute as A;
        matches!(
            attribute,
            A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
                | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
                | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_grows_in_chunks_and_shrinks_to_the_threshold() {
        let mut s = PoolState::default();
        assert_eq!(s.allocate(100, 0), Ok(CHUNK));
        assert_eq!((s.used, s.reserved), (100, CHUNK));
        assert_eq!(s.allocate(CHUNK, 0), Ok(CHUNK));
        assert_eq!(s.reserved, 2 * CHUNK);
        s.free(CHUNK);
        s.free(100);
        assert_eq!((s.used, s.reserved, s.used_high), (0, 2 * CHUNK, CHUNK + 100));
        s.release_threshold = CHUNK + 1;
        assert_eq!(s.release_at_sync(), CHUNK);
        assert_eq!(s.reserved, CHUNK);
        s.release_threshold = u64::MAX;
        assert_eq!(s.release_at_sync(), 0);
        assert_eq!(s.release_to(0), CHUNK);
        assert_eq!(s.reserved, 0);
    }

    #[test]
    fn max_size_and_high_water_resets() {
        let mut s = PoolState::default();
        assert_eq!(s.allocate(3 * CHUNK, 2 * CHUNK), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(s.used, 0);
        s.allocate(CHUNK, 2 * CHUNK).unwrap();
        s.free(CHUNK);
        assert_eq!(s.get(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH), Ok(CHUNK));
        assert_eq!(
            s.set(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 5),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        s.set(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0).unwrap();
        assert_eq!(s.used_high, 0);
        assert!(s.set(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0).is_err());
    }

    /// The accounting fields, to compare before and after.
    fn accounting(s: &PoolState) -> [u64; 4] {
        [s.used, s.used_high, s.reserved, s.reserved_high]
    }

    #[test]
    fn sizes_whose_accounting_overflows_are_out_of_memory_and_change_nothing() {
        let mut s = PoolState::default();
        s.allocate(100, 0).unwrap();
        let before = accounting(&s);
        for size in [u64::MAX, u64::MAX - 99, u64::MAX - 100, u64::MAX - CHUNK] {
            assert_eq!(s.allocate(size, 0), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{size} bytes");
            assert_eq!(s.allocate(size, u64::MAX), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{size} bytes");
            assert_eq!(accounting(&s), before, "{size} bytes");
        }
        // The largest size that still rounds is accounted exactly.
        let largest = u64::MAX / CHUNK * CHUNK - 100;
        assert_eq!(s.allocate(largest, 0), Ok(largest + 100 - CHUNK));
        assert_eq!((s.used, s.reserved), (largest + 100, largest + 100));
        // A threshold or trim too large to round keeps everything.
        assert_eq!(s.release_to(u64::MAX), 0);
    }

    #[test]
    fn a_planned_allocation_changes_nothing_until_committed() {
        let mut s = PoolState::default();
        s.allocate(CHUNK, 0).unwrap();
        s.free(CHUNK);
        s.set(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0).unwrap();
        let before = accounting(&s);
        let growth = s.plan(3 * CHUNK, 0).unwrap();
        assert_eq!(growth, Growth { size: 3 * CHUNK, grown: 2 * CHUNK });
        assert_eq!(accounting(&s), before, "a plan that is dropped leaves no mark");
        s.commit(growth);
        assert_eq!(accounting(&s), [3 * CHUNK, 3 * CHUNK, 3 * CHUNK, 3 * CHUNK]);
        assert_eq!(s.plan(CHUNK, 3 * CHUNK), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "past max_size");
    }
}
