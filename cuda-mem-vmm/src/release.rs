//! Letting go of a range after the work that uses it, without ever disturbing a stream capture.
//!
//! Unmapping is not stream-ordered, so a range is let go of only once its stream has finished
//! the work enqueued on it: the stream is synchronized first. A capturing stream must not be
//! synchronized (on a GPU that invalidates the capture), and the work it records may still use
//! the memory when the graph runs, so then nothing is unmapped. When the capture was begun
//! through [`Stream::begin_capture`](cuda_mem_core::Stream::begin_capture), the range is handed
//! to it ([`Stream::keep_alive_in_capture`](cuda_mem_core::Stream::keep_alive_in_capture)): it
//! stays mapped as long as the graph and every executable graph made from it live, and until
//! their launches are done. A buffer that work captured on another stream used, released during
//! that capture, goes to that capture the same way (`cuda-mem-core`'s buffer hands its free over
//! before this is reached). A capture this crate cannot follow (begun through a raw handle, or a
//! stream that joined another's capture) cannot keep it: the range is kept, in one process-wide
//! list, and let go of at a later safe point, once its stream is no longer capturing: the next
//! allocation, growth, import or release of any virtual memory resource, the drop of one, or
//! [`release_deferred`]. That is the limit of what can be done without knowing the capture: a
//! graph from it launched after that point finds the memory unmapped, so begin captures that
//! use virtual memory through `Stream::begin_capture`. The capture status is read before any synchronizing
//! call; a failure to read it keeps the range too (unmapping memory that may be in use is never
//! the fallback). A stream that fails to synchronize is waited for through an event recorded at
//! its end instead; only when that fails too is the range kept.

use std::sync::{Arc, Mutex, PoisonError};

use cuda_mem_core::Stream;
use cuda_mem_core::sys::types::CUresult;

use crate::error::{DeferCause, VmmError};
use crate::pieces::Range;

/// A range kept mapped until its stream can be waited for.
#[derive(Debug)]
struct Deferred {
    range: Arc<Range>,
    stream: Stream,
    /// The failures already recorded for it (the deferral's own cause, recorded by whoever
    /// deferred it, included): a safe point records a failure only the first time it sees it, so
    /// that an entry that keeps failing the same way does not fill the recorded drop errors.
    reported: Vec<FailureKind>,
}

/// What tells one failure to wait for a stream from another: the cause, and the driver's code.
type FailureKind = (std::mem::Discriminant<DeferCause>, Option<CUresult>);

/// The [`FailureKind`] of `cause`.
fn kind(cause: &DeferCause) -> FailureKind {
    (std::mem::discriminant(cause), cause.cuda_code())
}

/// The ranges whose release waits, process-wide: any resource's safe point may release them.
static DEFERRED: Mutex<Vec<Deferred>> = Mutex::new(Vec::new());

fn deferred() -> std::sync::MutexGuard<'static, Vec<Deferred>> {
    DEFERRED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits for `stream`'s work, unless it is capturing (or its status cannot be read). When
/// synchronizing the stream fails, waits for an event recorded at its end instead (waiting for
/// the whole device would disturb captures on its other streams); only when that fails too is
/// there no safe order.
pub(crate) fn wait_for(stream: &Stream) -> Result<(), DeferCause> {
    match stream.is_capturing() {
        Ok(false) => stream.synchronize().or_else(|error| {
            stream.record_event().and_then(|event| event.synchronize()).map_err(|_| DeferCause::Synchronize(error))
        }),
        Ok(true) => Err(DeferCause::Capturing),
        Err(error) => Err(DeferCause::CaptureStatus(error)),
    }
}

/// Lets go of `range` (unmapping the mappings no other range holds) once `stream`'s work is
/// done; first releases what was deferred before, where that can be done now.
///
/// # Errors
/// [`VmmError::ReleaseDeferred`] when `stream` is capturing, its status cannot be read or it
/// cannot be synchronized: the range stays mapped, kept for a later safe point.
pub(crate) fn release_after(range: Arc<Range>, stream: &Stream) -> Result<(), VmmError> {
    release_deferred();
    match wait_for(stream) {
        Ok(()) => {
            drop(range);
            Ok(())
        }
        Err(DeferCause::Capturing) => {
            // A capture begun through `Stream::begin_capture` takes the range: it stays mapped
            // while the graph, or any executable graph made from it, may use it.
            stream.keep_alive_in_capture(range).map_err(|range| defer(range, stream, DeferCause::Capturing))
        }
        Err(cause) => Err(defer(range, stream, cause)),
    }
}

/// Keeps `range` in the process-wide list until `stream` can be waited for. The error returned
/// is the caller's to report (it is, as a drop error): [`release_deferred`] does not report the
/// same cause again.
fn defer(range: Arc<Range>, stream: &Stream, cause: DeferCause) -> VmmError {
    let (ptr, size) = (range.base, range.mapped_size());
    deferred().push(Deferred { range, stream: stream.clone(), reported: vec![kind(&cause)] });
    VmmError::ReleaseDeferred { ptr, size, cause }
}

/// Releases the memory whose release was deferred (a virtual buffer dropped while its stream
/// was capturing, or whose stream could not be waited for), where its stream can now be waited
/// for, and returns how many ranges are still kept mapped. Virtual memory resources call it at
/// each allocation, growth, import and release and when dropped; call it after ending a capture
/// to release such memory at once.
///
/// A failure other than a capture still going on is recorded
/// ([`cuda_mem_core::record_drop_error`]) and the range kept. Each range's failure is recorded
/// once: the first time its release fails that way (the same cause and driver code), its
/// deferral included, not again at every later safe point, where it would push every other
/// recorded drop error out.
pub fn release_deferred() -> usize {
    // Taken out, so that no driver call (nor a drop-error hook) runs under the lock.
    let pending = std::mem::take(&mut *deferred());
    if pending.is_empty() {
        return 0;
    }
    let mut kept = Vec::new();
    for mut entry in pending {
        match wait_for(&entry.stream) {
            Ok(()) => drop(entry),
            Err(DeferCause::Capturing) => kept.push(entry),
            Err(cause) => {
                let failure = kind(&cause);
                if !entry.reported.contains(&failure) {
                    entry.reported.push(failure);
                    let (ptr, size) = (entry.range.base, entry.range.mapped_size());
                    let error = VmmError::ReleaseDeferred { ptr, size, cause };
                    cuda_mem_core::record_drop_error("virtual memory (deferred release)", error.into_core());
                }
                kept.push(entry);
            }
        }
    }
    let mut list = deferred();
    list.extend(kept);
    list.len()
}
