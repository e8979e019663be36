//! [`ExpandableMemory`]: a memory resource whose allocations can be address space reserved up
//! front, with physical memory mapped into it from its start and unmapped from its end: what a
//! [`CachingResource`](crate::CachingResource) grows its expandable segments with (PyTorch's
//! `expandable_segments`). `cuda-mem-vmm`'s `VirtualMemoryResource` is one; the driver's pools
//! are not (their allocations cannot grow in place).

use crate::device::DevicePtr;
use crate::error::Result;
use crate::memory_resource::MemoryResource;
use crate::stream::Stream;

/// A memory resource that can also hand out *expandable ranges*: addresses reserved once
/// ([`reserve`](ExpandableMemory::reserve)), mapped with memory piece by piece at their end
/// ([`grow`](ExpandableMemory::grow)), unmapped from their end
/// ([`shrink`](ExpandableMemory::shrink)) and let go of whole
/// ([`release`](ExpandableMemory::release)). A range never moves, so what lies in its mapped
/// part keeps its address while the range grows and shrinks around it.
///
/// The memory mapped is the resource's: [`MemoryResource`]'s answers (where it lives, who can
/// access it) hold for it.
///
/// # Safety
/// Implementing it promises: [`reserve`](ExpandableMemory::reserve) returns addresses that
/// nothing else maps until [`release`](ExpandableMemory::release); after
/// [`grow`](ExpandableMemory::grow) returns `Ok(mapped)`, the first `mapped` bytes of the range
/// are memory as [`MemoryResource`]'s answers describe, usable by any work enqueued after the
/// call, and they stay mapped until [`shrink`](ExpandableMemory::shrink) or
/// [`release`](ExpandableMemory::release) unmaps them; `shrink` never unmaps a byte below the
/// `keep` it is given, and reports what stays mapped exactly.
pub unsafe trait ExpandableMemory: MemoryResource {
    /// What every size mapped is a multiple of (bytes).
    fn granularity(&self) -> usize;

    /// Reserves a range of `size` bytes of addresses (a multiple of the
    /// [granularity](ExpandableMemory::granularity)), nothing mapped yet: its base.
    ///
    /// # Errors
    /// When the addresses cannot be had.
    fn reserve(&self, size: usize) -> Result<DevicePtr>;

    /// Maps `size` more bytes of new memory (a multiple of the granularity) right after what is
    /// mapped at the start of the range at `base`: the bytes mapped from `base` now.
    ///
    /// # Errors
    /// When `base` is no range of this resource's, the bytes do not fit in it, or the memory
    /// cannot be had (nothing is mapped then).
    fn grow(&self, base: DevicePtr, size: usize) -> Result<usize>;

    /// Unmaps what is mapped in the range at `base` from `keep` bytes on, once the work enqueued
    /// on `stream` so far is done: the bytes still mapped. Memory is unmapped in the pieces it was
    /// mapped in, so a piece that straddles `keep` stays, and more than `keep` may stay mapped.
    ///
    /// # Safety
    /// Nothing uses the bytes of the range from `keep` on after the work enqueued on `stream` so
    /// far.
    ///
    /// # Errors
    /// When `base` is no range of this resource's, or the unmapping cannot be ordered after
    /// `stream`'s work (a capturing stream): nothing is unmapped then.
    unsafe fn shrink(&self, base: DevicePtr, keep: usize, stream: &Stream) -> Result<usize>;

    /// Unmaps everything mapped in the range at `base`, once the work enqueued on `stream` so far
    /// is done, and lets go of its addresses.
    ///
    /// # Safety
    /// Nothing uses the range after the work enqueued on `stream` so far.
    ///
    /// # Errors
    /// As [`shrink`](ExpandableMemory::shrink): the range stays whole then.
    unsafe fn release(&self, base: DevicePtr, stream: &Stream) -> Result<()>;
}
