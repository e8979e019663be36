//! The host bytes of small device pool allocations, carved from larger mappings.
//!
//! A device pool allocation's bytes live in host memory only the simulator touches (its address
//! is in the device arena, which the host cannot read; see `crate::memory`). Mapping those bytes
//! one allocation at a time cost a `mmap` for every new length (and a `munmap` once freed
//! backings passed their bound), so that tests allocating many sizes paid a system call per
//! allocation. Here sizes up to [`LARGEST`] are rounded up to a power-of-two class of at least a
//! page, and each class hands out blocks from [`CHUNK`]-sized mappings: a freed block goes to its
//! class's free list and is handed out again, bytes as they were (as reused pool memory is on a
//! GPU, `crate::conservative`).
//!
//! What the application sees does not change: device addresses still come from the arena (never
//! reused until it wraps, a guard after each), and copies are still checked against the
//! allocation's size in the memory table, not against its block. A block is given back only when
//! the last [`Span`](crate::memory::Span) holding its allocation's backing is dropped, so work
//! enqueued before a free never sees a later allocation's bytes.
//!
//! Memory: address space is kept for the process's life (at most the peak of live blocks per
//! class, rounded up to chunks); the pages of freed blocks beyond [`KEPT_BYTES`] are given back
//! to the kernel (`MADV_DONTNEED`), so they read as zero when handed out again.

use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::types::CUresult;

use crate::error::SimResult;
use crate::memory::PAGE;

/// The smallest class (one page).
const SMALLEST: usize = PAGE as usize;
/// The largest size carved from chunks; larger allocations get mappings of their own.
pub(crate) const LARGEST: usize = 1 << 20;
/// The size of each mapping blocks are carved from.
const CHUNK: usize = 2 << 20;
/// How many classes there are (4 KiB, 8 KiB, … [`LARGEST`]).
const CLASSES: usize = (LARGEST / SMALLEST).trailing_zeros() as usize + 1;
/// At most this many bytes of freed blocks keep their pages.
const KEPT_BYTES: usize = 256 << 20;

/// A block's start, owned by [`BLOCKS`] while free.
struct Free(NonNull<u8>);

// SAFETY: a free block is plain memory nothing else refers to; whoever takes it owns it.
unsafe impl Send for Free {}

/// One class: its free blocks, and what is left of the chunk it carves from.
struct Class {
    free: Vec<Free>,
    /// The next unused byte of the current chunk, and the end of that chunk.
    bump: Option<(NonNull<u8>, usize)>,
}

/// Every class, and how many bytes their free lists hold with their pages.
struct Blocks {
    classes: [Class; CLASSES],
    kept: usize,
}

// SAFETY: the bump pointers are into chunks this value owns for the process's life.
unsafe impl Send for Blocks {}

static BLOCKS: Mutex<Blocks> =
    Mutex::new(Blocks { classes: [const { Class { free: Vec::new(), bump: None } }; CLASSES], kept: 0 });

fn blocks() -> MutexGuard<'static, Blocks> {
    BLOCKS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The class of a block for `len` bytes (`len` ≤ [`LARGEST`]).
fn class_of(len: usize) -> usize {
    len.max(SMALLEST).next_power_of_two().trailing_zeros() as usize - SMALLEST.trailing_zeros() as usize
}

/// The length of a block of class `class`.
pub(crate) fn block_len(class: usize) -> usize {
    SMALLEST << class
}

/// A block of at least `len` bytes (1 ≤ `len` ≤ [`LARGEST`]), readable and writable, and its
/// class (to give it back with [`give_back`]): a freed block of the class (old bytes included),
/// else a new one, zeroed.
pub(crate) fn take(len: usize) -> SimResult<(NonNull<u8>, usize)> {
    let class = class_of(len);
    let size = block_len(class);
    let mut blocks = blocks();
    if let Some(Free(ptr)) = blocks.classes[class].free.pop() {
        blocks.kept = blocks.kept.saturating_sub(size);
        return Ok((ptr, class));
    }
    let entry = &mut blocks.classes[class];
    let (next, end) = match entry.bump {
        Some((next, end)) if next.as_ptr() as usize + size <= end => (next, end),
        _ => {
            let chunk = map_chunk()?;
            (chunk, chunk.as_ptr() as usize + CHUNK)
        }
    };
    // SAFETY: `next + size` is at most `end`, inside the same chunk.
    let after = unsafe { next.add(size) };
    entry.bump = Some((after, end));
    Ok((next, class))
}

/// Gives back a block [`take`] handed out; it may be handed out again at once.
pub(crate) fn give_back(ptr: NonNull<u8>, class: usize) {
    let size = block_len(class);
    let mut blocks = blocks();
    if blocks.kept + size > KEPT_BYTES {
        // SAFETY: the block is `size` bytes of a private anonymous chunk that nothing refers to
        // any more; dropping its pages only makes it read as zero.
        let _ = unsafe { rustix::mm::madvise(ptr.as_ptr().cast(), size, rustix::mm::Advice::LinuxDontNeed) };
    } else {
        blocks.kept += size;
    }
    blocks.classes[class].free.push(Free(ptr));
}

/// Maps a chunk; it is kept for the process's life.
fn map_chunk() -> SimResult<NonNull<u8>> {
    let prot = rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE;
    let flags = rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE;
    // SAFETY: an anonymous mapping at an address of the kernel's choosing aliases nothing.
    let ptr = unsafe { rustix::mm::mmap_anonymous(std::ptr::null_mut(), CHUNK, prot, flags) }
        .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    NonNull::new(ptr.cast::<u8>()).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_from_a_page_to_the_largest() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(SMALLEST), 0);
        assert_eq!(class_of(SMALLEST + 1), 1);
        assert_eq!(class_of(LARGEST), CLASSES - 1);
        assert_eq!(block_len(CLASSES - 1), LARGEST);
        for len in [1, 100, 4096, 4097, 65_536, 65_537, 700_000, LARGEST] {
            let class = class_of(len);
            assert!(block_len(class) >= len && (class == 0 || block_len(class - 1) < len), "{len}");
        }
    }

    #[test]
    fn blocks_of_a_chunk_do_not_overlap_and_freed_ones_come_back() {
        // A class no other unit test of this module uses.
        let len = 3 * SMALLEST;
        let taken: Vec<(NonNull<u8>, usize)> =
            (0..CHUNK / block_len(class_of(len)) + 3).map(|_| take(len).unwrap()).collect();
        let mut starts: Vec<usize> = taken.iter().map(|(p, _)| p.as_ptr() as usize).collect();
        starts.sort_unstable();
        assert!(starts.windows(2).all(|w| w[1] - w[0] >= block_len(class_of(len))), "no overlap");
        let (ptr, class) = taken[0];
        // SAFETY: the block is `len` writable bytes this test owns.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0x5a, len) };
        for &(p, c) in taken.iter().rev() {
            give_back(p, c);
        }
        let (again, _) = take(len).unwrap();
        assert_eq!(again, ptr, "the last block given back is the first handed out");
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(again.as_ptr(), len) };
        assert!(bytes.iter().all(|&b| b == 0x5a), "not cleared, as a pool's reused memory is not");
        give_back(again, class);
    }
}
