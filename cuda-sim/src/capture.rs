//! Graph capture: the capture sequence of a stream, and the calls that conflict with one.
//!
//! Between `cuStreamBeginCapture` and `cuStreamEndCapture` work enqueued on the stream goes into
//! the sequence instead of running (graphs are not launched here). A call that would need the
//! captured work to have run, or that would make other work depend on it, *invalidates* the
//! sequence: its work is discarded, `cuStreamIsCapturing` reports
//! `CU_STREAM_CAPTURE_STATUS_INVALIDATED`, further work on the stream is refused with
//! `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, and `cuStreamEndCapture` ends the sequence with that
//! error and a NULL graph. What invalidates (see [`crate::conservative`] for what `cuda.h`
//! leaves open):
//!
//! - waiting for or querying the capturing stream (`cuStreamSynchronize`, `cuStreamQuery`):
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`;
//! - waiting for or querying an event last recorded in a capture (`cuEventSynchronize`,
//!   `cuEventQuery`): `CUDA_ERROR_CAPTURED_EVENT`;
//! - waiting for the whole context (`cuCtxSynchronize`) while one of its streams captures:
//!   `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, every such capture invalidated (as `cuda.h`
//!   documents for `cuCtxRecordEvent` and `cuCtxWaitEvent`);
//! - any use of the legacy default stream (work, waits, queries) while a blocking stream of its
//!   context captures, since the legacy stream would depend on the captured work:
//!   `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, those captures invalidated (`cuda.h`: "the legacy
//!   stream is in an unusable state until the blocking stream capture is terminated");
//!   `cuStreamIsCapturing` on it returns the same error without invalidating, as documented.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cuda_sys::types::{CUresult, CUstreamCaptureStatus};

use crate::context::Context;
use crate::error::{SimResult, fail};
use crate::graph::{GraphAlloc, Node};
use crate::stream::{Op, Stream, StreamKind};

/// The capture sequence of one stream, if it has one.
#[derive(Default)]
pub(crate) struct Capture {
    sequence: Mutex<Option<Sequence>>,
}

/// One capture sequence.
struct Sequence {
    /// Unique for the life of the process, so that an event recorded in one sequence never
    /// invalidates a later one on the same stream.
    id: usize,
    /// The handle of the graph being captured (`cuStreamGetCaptureInfo` gives it out before the
    /// capture ends).
    graph: usize,
    /// The nodes captured so far (never run here); `None` once the sequence is invalidated, its
    /// work discarded.
    nodes: Option<Vec<Node>>,
    /// The allocations its allocation nodes made, invalidated or not: their addresses are live
    /// only until the capture ends.
    allocs: Vec<Arc<GraphAlloc>>,
}

/// How `cuStreamEndCapture` ends a sequence.
pub(crate) enum Ended {
    /// The captured graph: its handle and nodes.
    Graph {
        /// The handle given out at the beginning.
        handle: usize,
        /// The nodes.
        nodes: Vec<Node>,
        /// The allocations of its allocation nodes.
        allocs: Vec<Arc<GraphAlloc>>,
    },
    /// The sequence had been invalidated: the handle its graph had, and the allocations its
    /// allocation nodes had made.
    Invalidated(usize, Vec<Arc<GraphAlloc>>),
}

impl Capture {
    fn lock(&self) -> MutexGuard<'_, Option<Sequence>> {
        self.sequence.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The status `cuStreamIsCapturing` reports.
    pub(crate) fn status(&self) -> CUstreamCaptureStatus {
        match self.lock().as_ref() {
            None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(Sequence { nodes: Some(_), .. }) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
            Some(Sequence { nodes: None, .. }) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        }
    }

    /// Whether a sequence is under way (active or invalidated, until it is ended).
    pub(crate) fn is_under_way(&self) -> bool {
        self.lock().is_some()
    }

    /// The id of the active sequence, if there is one (not when it was invalidated).
    pub(crate) fn active_id(&self) -> Option<usize> {
        self.lock().as_ref().filter(|s| s.nodes.is_some()).map(|s| s.id)
    }

    /// The id and graph handle of the active sequence (`cuStreamGetCaptureInfo`).
    pub(crate) fn active_info(&self) -> Option<(usize, usize)> {
        self.lock().as_ref().filter(|s| s.nodes.is_some()).map(|s| (s.id, s.graph))
    }

    /// Starts a sequence; its id, or `None` if one is already under way.
    pub(crate) fn begin(&self) -> Option<usize> {
        let mut sequence = self.lock();
        if sequence.is_some() {
            return None;
        }
        let id = crate::handle::next();
        *sequence = Some(Sequence { id, graph: crate::handle::next(), nodes: Some(Vec::new()), allocs: Vec::new() });
        Some(id)
    }

    /// Ends the sequence (`None` if none was under way).
    pub(crate) fn end(&self) -> Option<Ended> {
        let sequence = self.lock().take()?;
        Some(match sequence.nodes {
            Some(nodes) => Ended::Graph { handle: sequence.graph, nodes, allocs: sequence.allocs },
            None => Ended::Invalidated(sequence.graph, sequence.allocs),
        })
    }

    /// Adds `op` to the sequence under way, or gives it back when there is none. An invalidated
    /// sequence swallows it: the callers refuse work on such a stream beforehand
    /// ([`admit_work`]), so only work that raced with the invalidation gets here, and it is
    /// discarded as if it had been captured just before.
    pub(crate) fn record(&self, op: Op) -> Result<(), Op> {
        self.push(op, |op| Node::Work(Mutex::new(op)))
    }

    /// Adds `node` to the sequence under way (see [`record`](Capture::record)), or gives it back
    /// when there is none.
    pub(crate) fn record_node(&self, node: Node) -> Result<(), Node> {
        self.push(node, |node| node)
    }

    /// Adds `item`, made a node by `into`, to the sequence under way, or gives it back.
    fn push<T>(&self, item: T, into: impl FnOnce(T) -> Node) -> Result<(), T> {
        let mut sequence = self.lock();
        match sequence.as_mut() {
            Some(Sequence { nodes: Some(nodes), allocs, .. }) => {
                let node = into(item);
                if let Node::Alloc(alloc) = &node {
                    allocs.push(Arc::clone(alloc));
                }
                nodes.push(node);
                Ok(())
            }
            Some(Sequence { nodes: None, .. }) => {
                drop(sequence);
                drop(item);
                Ok(())
            }
            None => Err(item),
        }
    }

    /// The allocation an allocation node of the sequence under way made at `base`, if any.
    pub(crate) fn own_alloc(&self, base: u64) -> Option<Arc<GraphAlloc>> {
        self.lock().as_ref()?.allocs.iter().find(|a| a.base == base).cloned()
    }

    /// Invalidates the active sequence (only the one with id `only`, when given), discarding its
    /// work. Returns whether a sequence was under way, active or already invalidated.
    pub(crate) fn invalidate(&self, only: Option<usize>) -> bool {
        let discarded = {
            let mut sequence = self.lock();
            match sequence.as_mut() {
                None => return false,
                Some(s) if only.is_some_and(|id| id != s.id) => return false,
                Some(s) => s.nodes.take(),
            }
        };
        // Captured work may hold memory; it is released outside the lock.
        drop(discarded);
        true
    }
}

/// The blocking streams of `context` with a capture under way: the legacy default stream
/// depends on them.
fn blocking_captures(context: &Context) -> Vec<std::sync::Arc<Stream>> {
    context.live_streams().into_iter().filter(|s| s.is_blocking() && s.capture.is_under_way()).collect()
}

/// Refuses the use of the legacy default stream while a blocking stream of its context
/// captures: those captures are invalidated, and the call gets
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
fn refuse_implicit(context: &Context, stream: &Stream) -> SimResult {
    if stream.kind != StreamKind::Legacy {
        return Ok(());
    }
    let captures = blocking_captures(context);
    for capturing in &captures {
        capturing.capture.invalidate(None);
    }
    if captures.is_empty() { Ok(()) } else { fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) }
}

/// Checks a call that enqueues work on `stream` (of `context`): refused with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when the stream's capture was invalidated, and with
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` on the legacy stream while a blocking stream captures.
pub(crate) fn admit_work(context: &Context, stream: &Stream) -> SimResult {
    if stream.capture.status() == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED {
        return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    refuse_implicit(context, stream)
}

/// Checks a call that waits for or queries `stream` (`cuStreamSynchronize`, `cuStreamQuery`):
/// on a capturing stream it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
/// capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` once it is invalidated); on the legacy
/// stream while a blocking stream captures, `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
pub(crate) fn admit_wait(context: &Context, stream: &Stream) -> SimResult {
    match stream.capture.status() {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => {
            stream.capture.invalidate(None);
            fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        }
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
            fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        }
        _ => refuse_implicit(context, stream),
    }
}

/// Checks `cuCtxSynchronize`: while any stream of the context captures, every such capture is
/// invalidated and the call is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub(crate) fn admit_context_wait(context: &Context) -> SimResult {
    let mut capturing = false;
    for stream in context.live_streams() {
        capturing |= stream.capture.invalidate(None);
    }
    if capturing { fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) } else { Ok(()) }
}

/// `cuStreamIsCapturing` on the legacy stream while a blocking stream of its context captures:
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, without invalidating anything (as `cuda.h` says).
pub(crate) fn refuse_legacy_status(context: &Context, stream: &Stream) -> SimResult {
    let implicit = stream.kind == StreamKind::Legacy && !blocking_captures(context).is_empty();
    if implicit { fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use cuda_sys::types::CUstreamCaptureStatus as S;

    /// An operation that counts its drops, to see captured work discarded.
    fn counted(drops: &Arc<AtomicUsize>) -> Op {
        struct Tracker(Arc<AtomicUsize>);
        impl Drop for Tracker {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let tracker = Tracker(Arc::clone(drops));
        Box::new(move || {
            let _ = &tracker;
        })
    }

    #[test]
    fn invalidation_discards_the_work_and_ends_without_a_graph() {
        let capture = Capture::default();
        let drops = Arc::new(AtomicUsize::new(0));
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_NONE);
        assert!(capture.record(counted(&drops)).is_err(), "no capture: the op comes back");
        assert!(capture.begin().is_some());
        assert!(capture.begin().is_none(), "one sequence at a time");
        let id = capture.active_id().unwrap();
        assert!(capture.record(counted(&drops)).is_ok());
        assert!(!capture.invalidate(Some(id + 1)), "another sequence's id leaves this one alone");
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        let before = drops.load(Ordering::SeqCst);
        assert!(capture.invalidate(Some(id)));
        assert_eq!(drops.load(Ordering::SeqCst), before + 1, "the captured op is discarded");
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        assert_eq!(capture.active_id(), None);
        assert!(capture.record(counted(&drops)).is_ok(), "a racing op is swallowed");
        assert!(capture.is_under_way());
        assert!(matches!(capture.end(), Some(Ended::Invalidated(_, allocs)) if allocs.is_empty()));
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_NONE);
        assert!(capture.end().is_none());
        assert!(capture.begin().is_some(), "a new sequence after the end");
        assert_ne!(capture.active_id(), Some(id));
        assert!(matches!(capture.end(), Some(Ended::Graph { nodes, .. }) if nodes.is_empty()));
    }
}
