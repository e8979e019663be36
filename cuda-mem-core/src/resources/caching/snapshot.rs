//! [`SegmentSnapshot`]: a [`CachingResource`](super::CachingResource)'s segments and blocks at a
//! moment (`torch.cuda.memory_snapshot`), to see fragmentation and to check the cache.

use super::options::SizeClass;
use crate::device::DevicePtr;
use crate::stream::Stream;

/// One segment held from the upstream resource, and the blocks that tile it, in address order.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SegmentSnapshot {
    /// Its base address.
    pub address: DevicePtr,
    /// Its size in bytes.
    pub size: usize,
    /// The pool it serves.
    pub class: SizeClass,
    /// For an expandable segment, the addresses reserved for it, which it grows into (`size`
    /// is then what is mapped of them); `None` for a segment of fixed size.
    pub expandable_reservation: Option<usize>,
    /// The stream whose bins its free blocks are in: the one it was allocated for, or one that
    /// took it over wholly free.
    pub stream: Stream,
    /// Its blocks: their sizes add up to the segment's.
    pub blocks: Vec<BlockSnapshot>,
}

/// One block of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BlockSnapshot {
    /// Its address.
    pub address: DevicePtr,
    /// Its size in bytes.
    pub size: usize,
    /// Whether it is handed out, free, or waiting for its last use.
    pub state: BlockUse,
}

/// What a block is used for ([`BlockSnapshot::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockUse {
    /// Handed out, for this many bytes asked for.
    Allocated {
        /// The size asked for (the block's is it rounded).
        requested: usize,
    },
    /// Free.
    Free,
    /// Freed on another stream than its segment's, until that stream's work on it is known done.
    Pending,
}
