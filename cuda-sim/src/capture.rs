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
//!
//! Capture modes (`cuThreadExchangeStreamCaptureMode`): a thread whose mode is not relaxed is
//! prohibited from "potentially unsafe API calls" while it has a capture under way that it
//! began in a mode other than relaxed, and (in the global mode) while another thread has a
//! capture under way begun in the global mode. A prohibited call fails with
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the captures that prohibited it; which
//! calls are unsafe is [`crate::conservative`]'s reading. A capture begun in a mode other than
//! relaxed must be ended by the thread that began it (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`).

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::ThreadId;

use cuda_mem_sys::types::{CUresult, CUstreamCaptureMode, CUstreamCaptureStatus};

use crate::context::Context;
use crate::error::{SimResult, fail};
use crate::graph::{GraphAlloc, Node};
use crate::memory::Touch;
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
    /// The mode it was begun in.
    mode: CUstreamCaptureMode,
    /// The thread that began it.
    thread: ThreadId,
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

    /// Starts a sequence in `mode`, begun by this thread; its id, or `None` if one is already
    /// under way.
    pub(crate) fn begin(&self, mode: CUstreamCaptureMode) -> Option<usize> {
        let mut sequence = self.lock();
        if sequence.is_some() {
            return None;
        }
        let id = crate::handle::next();
        let thread = std::thread::current().id();
        let graph = crate::handle::next();
        *sequence = Some(Sequence { id, graph, nodes: Some(Vec::new()), allocs: Vec::new(), mode, thread });
        Some(id)
    }

    /// The id of the sequence under way (active or invalidated).
    fn under_way_id(&self) -> Option<usize> {
        self.lock().as_ref().map(|s| s.id)
    }

    /// Ends the sequence: `CUDA_ERROR_ILLEGAL_STATE` if none was under way, and
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (the sequence goes on) if it was begun in a mode
    /// other than relaxed by another thread.
    pub(crate) fn end(&self) -> SimResult<Ended> {
        let sequence = {
            let mut sequence = self.lock();
            match sequence.as_ref() {
                None => return fail(CUresult::CUDA_ERROR_ILLEGAL_STATE),
                Some(s) if s.mode != RELAXED && s.thread != std::thread::current().id() => {
                    return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
                }
                Some(_) => {}
            }
            sequence.take().ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?
        };
        forget(sequence.id);
        Ok(match sequence.nodes {
            Some(nodes) => Ended::Graph { handle: sequence.graph, nodes, allocs: sequence.allocs },
            None => Ended::Invalidated(sequence.graph, sequence.allocs),
        })
    }

    /// Ends the sequence under way, if any, whatever thread began it (its stream is being
    /// destroyed): its graph's handle and the allocations of its allocation nodes. Its work is
    /// discarded with the returned nodes.
    pub(crate) fn abandon(&self) -> Option<(usize, Vec<Node>, Vec<Arc<GraphAlloc>>)> {
        let sequence = self.lock().take()?;
        forget(sequence.id);
        Some((sequence.graph, sequence.nodes.unwrap_or_default(), sequence.allocs))
    }

    /// Adds `op` to the sequence under way, or gives it back when there is none. An invalidated
    /// sequence swallows it: the callers refuse work on such a stream beforehand
    /// ([`admit_work`]), so only work that raced with the invalidation gets here, and it is
    /// discarded as if it had been captured just before.
    /// `touches` is the simulator's memory the op reads or writes (checked at each launch).
    pub(crate) fn record(&self, op: Op, touches: Vec<Touch>) -> Result<(), Op> {
        self.push(op, |op| Node::Work { op: Mutex::new(op), touches })
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

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;

thread_local! {
    /// This thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`); global
    /// until changed, as `cuda.h` says.
    static THREAD_MODE: Cell<CUstreamCaptureMode> = const { Cell::new(GLOBAL) };
}

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's mode, returning the previous one.
pub(crate) fn exchange_thread_mode(mode: CUstreamCaptureMode) -> CUstreamCaptureMode {
    THREAD_MODE.with(|current| current.replace(mode))
}

/// A capture sequence under way somewhere in the process.
struct Begun {
    /// The sequence's id.
    id: usize,
    /// Its mode.
    mode: CUstreamCaptureMode,
    /// The thread that began it.
    thread: ThreadId,
    /// Its stream.
    stream: Weak<Stream>,
}

/// Every capture sequence under way in the process.
static UNDER_WAY: Mutex<Vec<Begun>> = Mutex::new(Vec::new());

fn under_way() -> MutexGuard<'static, Vec<Begun>> {
    UNDER_WAY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Notes the sequence `id` just begun on `stream` in `mode` by this thread.
pub(crate) fn note_begun(id: usize, mode: CUstreamCaptureMode, stream: &Arc<Stream>) {
    let thread = std::thread::current().id();
    under_way().push(Begun { id, mode, thread, stream: Arc::downgrade(stream) });
}

/// Forgets the sequence `id` (ended).
fn forget(id: usize) {
    under_way().retain(|begun| begun.id != id);
}

/// Checks a "potentially unsafe" call (see [`crate::conservative`] for which): refused with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` when this thread's mode is not relaxed and it began a
/// capture under way in a mode other than relaxed, or its mode is global and another thread
/// began one in the global mode. The captures that prohibit the call are invalidated. Called
/// before the state lock is taken (invalidating drops captured work).
pub(crate) fn refuse_unsafe() -> SimResult {
    let mode = THREAD_MODE.with(Cell::get);
    if mode == RELAXED {
        return Ok(());
    }
    let me = std::thread::current().id();
    let prohibiting: Vec<(usize, Arc<Stream>)> = {
        let mut begun = under_way();
        // A stream destroyed during its capture takes the capture with it.
        begun.retain(|b| b.stream.upgrade().is_some_and(|s| s.capture.under_way_id() == Some(b.id)));
        begun
            .iter()
            .filter(|b| if b.thread == me { b.mode != RELAXED } else { mode == GLOBAL && b.mode == GLOBAL })
            .filter_map(|b| Some((b.id, b.stream.upgrade()?)))
            .collect()
    };
    for (id, stream) in &prohibiting {
        stream.capture.invalidate(Some(*id));
    }
    if prohibiting.is_empty() { Ok(()) } else { fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) }
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

    use cuda_mem_sys::types::CUstreamCaptureStatus as S;

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
        assert!(capture.record(counted(&drops), Vec::new()).is_err(), "no capture: the op comes back");
        assert!(capture.begin(RELAXED).is_some());
        assert!(capture.begin(RELAXED).is_none(), "one sequence at a time");
        let id = capture.active_id().unwrap();
        assert!(capture.record(counted(&drops), Vec::new()).is_ok());
        assert!(!capture.invalidate(Some(id + 1)), "another sequence's id leaves this one alone");
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        let before = drops.load(Ordering::SeqCst);
        assert!(capture.invalidate(Some(id)));
        assert_eq!(drops.load(Ordering::SeqCst), before + 1, "the captured op is discarded");
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        assert_eq!(capture.active_id(), None);
        assert!(capture.record(counted(&drops), Vec::new()).is_ok(), "a racing op is swallowed");
        assert!(capture.is_under_way());
        assert!(matches!(capture.end(), Ok(Ended::Invalidated(_, allocs)) if allocs.is_empty()));
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_NONE);
        assert_eq!(capture.end().err(), Some(CUresult::CUDA_ERROR_ILLEGAL_STATE));
        assert!(capture.begin(GLOBAL).is_some(), "a new sequence after the end");
        assert_ne!(capture.active_id(), Some(id));
        let other_thread = std::thread::scope(|scope| scope.spawn(|| capture.end().err()).join().unwrap());
        assert_eq!(other_thread, Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD));
        assert!(matches!(capture.end(), Ok(Ended::Graph { nodes, .. }) if nodes.is_empty()));
    }
}
