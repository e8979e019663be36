//! [`CopyError`]: why a copy with options, or a batch of copies, was refused before any driver
//! call; [`OverlapKind`], how two copies of a batch overlap.

/// Which bytes two copies of a batch both touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapKind {
    /// Both write them.
    Destinations,
    /// The first copy writes what the second reads.
    DestinationAndSource,
}

/// A copy refused before any driver call (inside [`Error::Copy`](crate::Error::Copy)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CopyError {
    /// The legacy default stream, which `cuMemcpyBatchAsync` and `cuMemcpyWithAttributesAsync`
    /// reject.
    #[error(
        "{operation} does not take the legacy default stream (the driver rejects it): use a created stream or the \
         per-thread default stream"
    )]
    LegacyStream {
        /// `"copy_batch"`, `"copy_to_with"`, ….
        operation: &'static str,
    },
    /// A capturing stream: no graph node represents these copies.
    #[error(
        "{operation} cannot be captured into a graph: copy without options (copy_to, copy_from) while the stream \
         captures"
    )]
    Capturing {
        /// The operation refused.
        operation: &'static str,
    },
    /// Two copies of a batch touch the same bytes, one of them writing: the driver runs a
    /// batch's copies in no particular order.
    #[error(
        "copies {first} and {second} of the batch overlap ({kind:?}: copy {first} writes bytes copy {second} {}): \
         the copies of a batch run in any order, so put them in separate batches",
        if matches!(kind, OverlapKind::Destinations) { "writes too" } else { "reads" }
    )]
    Overlap {
        /// The copy that writes.
        first: usize,
        /// The other copy.
        second: usize,
        /// What the other copy does with the bytes.
        kind: OverlapKind,
    },
    /// A copy whose source and destination share bytes: the driver's result is undefined.
    #[error(
        "copy {copy} of the batch reads bytes it also writes (its source and destination overlap): copy through a \
         second buffer, or split it into copies whose ranges do not meet"
    )]
    SelfOverlap {
        /// The copy, by its index in the batch.
        copy: usize,
    },
    /// A copy inside one buffer ([`copy_batch_within`](crate::copy_batch_within)) that reaches
    /// past the buffer's end.
    #[error("copy {copy} reaches bytes {start}..{end} of a buffer of {size} bytes: keep each range within 0..{size}")]
    OutOfRange {
        /// The copy, by its index in the batch.
        copy: usize,
        /// The first byte it reaches (`usize::MAX` when the bound overflowed).
        start: usize,
        /// One past the last byte it reaches (`usize::MAX` when the bound overflowed).
        end: usize,
        /// The buffer's size.
        size: usize,
    },
    /// Per-copy options, not one per copy.
    #[error("{options} options for {copies} copies: give one CopyOptions for all (BatchOptions::Same) or one per copy")]
    OptionsLengthMismatch {
        /// How many copies.
        copies: usize,
        /// How many options.
        options: usize,
    },
}
