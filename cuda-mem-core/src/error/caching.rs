//! [`CachingError`]: why a [`CachingResource`](crate::CachingResource) refused.

use super::Error;
use crate::device::DevicePtr;

/// A [`CachingResource`](crate::CachingResource) refused (inside
/// [`Error::Caching`](crate::Error::Caching)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CachingError {
    /// No memory for a request, even after the cached segments not in use went back upstream
    /// and the upstream was asked once more: what was asked, and what the cache held.
    #[error(transparent)]
    OutOfMemory(Box<CachingOutOfMemory>),
    /// A [`CachingOptions`](crate::CachingOptions) knob that makes no policy.
    #[error("invalid caching option: {option} cannot be {value}")]
    InvalidOption {
        /// The knob, and what it must be.
        option: &'static str,
        /// The value given.
        value: usize,
    },
    /// A free of memory that is no live block of this resource (nothing was freed).
    #[error("{ptr:#x} ({size} bytes) is not a live allocation of this caching resource")]
    NotACachedBlock {
        /// The address given.
        ptr: DevicePtr,
        /// The size given.
        size: usize,
    },
}

/// An allocation a [`CachingResource`](crate::CachingResource) could not serve
/// ([`CachingError::OutOfMemory`]). The figures are the cache's at the failure, after it gave
/// back what it could: `reserved - allocated` bytes are cached, and the largest of the free
/// blocks among them shows how fragmented they are.
#[derive(Debug, thiserror::Error)]
#[error(
    "out of memory in the caching resource: {requested} bytes asked for ({rounded} rounded), with {allocated} bytes \
     allocated and {reserved} reserved ({cached} cached, the largest free block {largest_free_block} bytes){}",
    if .source.is_some() { ": the upstream resource refused a new segment" } else { "" }
)]
#[non_exhaustive]
pub struct CachingOutOfMemory {
    /// The bytes asked for.
    pub requested: usize,
    /// The request rounded to the block size it needs (`usize::MAX`: it cannot be rounded).
    pub rounded: usize,
    /// Bytes in blocks handed out and not yet freed.
    pub allocated: u64,
    /// Bytes of segments held from the upstream resource.
    pub reserved: u64,
    /// Bytes reserved and not allocated: free blocks, and blocks whose last use is not yet known
    /// to be done.
    pub cached: u64,
    /// The largest free block, in bytes.
    pub largest_free_block: u64,
    /// The upstream resource's refusal of the new segment (`None`: the request was past what
    /// any segment could hold, and the upstream was not asked).
    #[source]
    pub source: Option<Error>,
}
