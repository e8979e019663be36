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
//!
//! Cross-stream capture: a stream that waits for an event recorded in an active capture joins
//! that capture (`cuStreamIsCapturing` says active, `cuStreamGetCaptureInfo` gives the same id
//! and graph), and its work goes into the same graph, in the order it is enqueued (a linear
//! order that keeps every dependency). The stream that began the capture (its origin) ends it;
//! `cuStreamEndCapture` on a joined stream is `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`. Each stream of
//! the capture must have rejoined the origin (the origin waited, directly or through other
//! streams of the capture, for an event recorded after the stream's last work there), or the end
//! is `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` with a NULL graph; a stream that joined counts as
//! having work until then (see [`crate::conservative`]). A stream capturing one sequence that
//! waits for an event of another is `CUDA_ERROR_STREAM_CAPTURE_MERGE`. Once the capture ends,
//! its joined streams capture nothing.
//!
//! Dependencies: each stream of a sequence has a dependency set, the nodes its next captured
//! node will depend on (`cuStreamGetCaptureInfo` reports it). It starts empty; each node the
//! graph API shows (see [`crate::graph::Listed`]) depends on the set and replaces it; an event
//! recorded in the capture notes the set, and a stream waiting for that event adds it to its own
//! (a stream joining the capture starts from it); `cuStreamUpdateCaptureDependencies` adds to it
//! or replaces it. Nodes a stream gets from another this way also count as a rejoin: the
//! stream follows the work before them, as after a wait for an event recorded there.

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::ThreadId;

use cuda_mem_sys::types::{CUgraphEdgeData, CUgraphNodeType, CUresult, CUstreamCaptureMode, CUstreamCaptureStatus};

use crate::context::Context;
use crate::error::{SimResult, ensure, fail};
use crate::graph::{GraphAlloc, Listed, Node};
use crate::memory::Touch;
use crate::stream::{Op, Stream, StreamKind};

/// The capture sequence of one stream, if it has one, or the sequence of another stream it
/// joined.
pub(crate) struct Capture {
    /// This stream's identity within a sequence: unique for the life of the process, so that a
    /// new stream never passes for a destroyed one that had joined a sequence still under way.
    key: usize,
    sequence: Mutex<Option<Sequence>>,
    /// The sequence this stream joined by waiting for an event captured in it: its origin
    /// stream and the sequence's id. Stale (and ignored) once that sequence ended.
    joined: Mutex<Option<(Weak<Stream>, usize)>>,
}

/// Where a captured event was recorded: the stream, the sequence, and the work of each stream of
/// the sequence that precedes the recording (for the joins).
#[derive(Clone)]
pub(crate) struct CapturePoint {
    /// The stream it was recorded on.
    pub(crate) stream: Weak<Stream>,
    /// The sequence's id.
    pub(crate) sequence: usize,
    /// For each stream of the sequence (by its capture's key), how much of its work precedes.
    covers: Vec<(usize, u64)>,
    /// The stream's dependency set at the recording.
    frontier: Vec<usize>,
}

impl CapturePoint {
    /// Whether the sequence it was recorded in is still under way.
    pub(crate) fn is_under_way(&self) -> bool {
        self.stream.upgrade().is_some_and(|stream| stream.capture.under_way_id() == Some(self.sequence))
    }
}

/// One stream's part in a sequence.
struct Member {
    /// The stream's capture's key.
    key: usize,
    /// How many operations it has put into the sequence (a joined stream starts at 1: it must
    /// rejoin even with no work of its own).
    work: u64,
    /// How much of its work the origin must follow for the sequence to end with a graph: all of
    /// it, unless `cuStreamUpdateCaptureDependencies` replaced its dependency set (then what
    /// the new set holds of it).
    owed: u64,
    /// How much of each stream's work its next operation follows (its own excluded).
    covers: Vec<(usize, u64)>,
    /// Its dependency set: the nodes its next node will depend on.
    frontier: Vec<usize>,
    /// The copy of the dependency set the last `cuStreamGetCaptureInfo` gave out (its pointer
    /// stays valid until the next call on the stream, as `cuda.h` says), with zeroed edge data.
    reported: (Box<[usize]>, Box<[CUgraphEdgeData]>),
}

impl Member {
    /// Adds `covers` to what this member follows.
    fn follow(&mut self, covers: &[(usize, u64)]) {
        for &(key, work) in covers {
            if key == self.key {
                continue;
            }
            match self.covers.iter_mut().find(|(k, _)| *k == key) {
                Some((_, known)) => *known = (*known).max(work),
                None => self.covers.push((key, work)),
            }
        }
    }

    /// How much of the work of the stream `key` this member follows.
    fn follows(&self, key: usize) -> u64 {
        self.covers.iter().find(|(k, _)| *k == key).map_or(0, |&(_, work)| work)
    }

    /// A member for the stream `key`, with no work.
    fn new(key: usize) -> Member {
        Member {
            key,
            work: 0,
            owed: 0,
            covers: Vec::new(),
            frontier: Vec::new(),
            reported: (Box::default(), Box::default()),
        }
    }

    /// Adds `nodes` to its dependency set (each once).
    fn depend_on(&mut self, nodes: &[usize]) {
        for &node in nodes {
            if !self.frontier.contains(&node) {
                self.frontier.push(node);
            }
        }
    }
}

/// A node the graph API shows, as the capture made it.
struct Made {
    /// The node.
    listed: Listed,
    /// The stream that captured it (its capture's key) and its index in that stream's work.
    by: (usize, u64),
    /// How much of each other stream's work it follows.
    covers: Vec<(usize, u64)>,
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
    /// The nodes the graph API shows, in capture order.
    made: Vec<Made>,
    /// The allocations its allocation nodes made, invalidated or not: their addresses are live
    /// only until the capture ends.
    allocs: Vec<Arc<GraphAlloc>>,
    /// The mode it was begun in.
    mode: CUstreamCaptureMode,
    /// The thread that began it.
    thread: ThreadId,
    /// Its streams: the origin first, then the ones that joined.
    members: Vec<Member>,
}

impl Sequence {
    /// The part of the stream `key`, made on its first use.
    fn member(&mut self, key: usize) -> &mut Member {
        let index = match self.members.iter().position(|m| m.key == key) {
            Some(index) => index,
            None => {
                self.members.push(Member::new(key));
                self.members.len() - 1
            }
        };
        &mut self.members[index]
    }

    /// Whether every stream of the sequence has rejoined its origin (the first member).
    fn all_joined(&self) -> bool {
        let Some((origin, others)) = self.members.split_first() else { return true };
        others.iter().all(|m| origin.follows(m.key) >= m.owed)
    }

    /// The node `handle` of this sequence's graph, if it is one.
    fn made(&self, handle: usize) -> Option<&Made> {
        self.made.iter().find(|made| made.listed.handle == handle)
    }

    /// The nodes the graph API shows.
    fn listed(&self) -> Vec<Listed> {
        self.made.iter().map(|made| made.listed.clone()).collect()
    }
}

/// How `cuStreamUpdateCaptureDependencies` changes a stream's dependency set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Update {
    /// `CU_STREAM_ADD_CAPTURE_DEPENDENCIES`: the nodes are added to the set.
    Add,
    /// `CU_STREAM_SET_CAPTURE_DEPENDENCIES`: the nodes replace the set.
    Set,
}

/// How `cuStreamEndCapture` ends a sequence.
pub(crate) enum Ended {
    /// The captured graph: its handle and nodes.
    Graph {
        /// The handle given out at the beginning.
        handle: usize,
        /// The nodes.
        nodes: Vec<Node>,
        /// The nodes the graph API shows, with their dependencies.
        listed: Vec<Listed>,
        /// The allocations of its allocation nodes.
        allocs: Vec<Arc<GraphAlloc>>,
    },
    /// The sequence had been invalidated: the handle its graph had, and the allocations its
    /// allocation nodes had made.
    Invalidated(usize, Vec<Arc<GraphAlloc>>),
    /// A stream that joined the sequence had not rejoined its origin: no graph, as for an
    /// invalidated sequence.
    Unjoined(usize, Vec<Arc<GraphAlloc>>),
}

impl Default for Capture {
    fn default() -> Self {
        Capture { key: crate::handle::next(), sequence: Mutex::default(), joined: Mutex::default() }
    }
}

impl Capture {
    fn lock(&self) -> MutexGuard<'_, Option<Sequence>> {
        self.sequence.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_joined(&self) -> MutexGuard<'_, Option<(Weak<Stream>, usize)>> {
        self.joined.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the sequence this stream's work goes to: the sequence it joined while that one
    /// is under way, else its own (`None` when it has neither). Never holds two streams' locks at
    /// once.
    fn with_sequence<R>(&self, f: impl FnOnce(Option<&mut Sequence>) -> R) -> R {
        let joined = self.lock_joined().clone();
        if let Some((origin, id)) = joined {
            if let Some(origin) = origin.upgrade() {
                let mut sequence = origin.capture.lock();
                if let Some(sequence) = sequence.as_mut().filter(|s| s.id == id) {
                    return f(Some(sequence));
                }
            }
            // That sequence ended: this stream captures no more.
            let mut current = self.lock_joined();
            if current.as_ref().is_some_and(|(_, current)| *current == id) {
                *current = None;
            }
        }
        f(self.lock().as_mut())
    }

    /// The status `cuStreamIsCapturing` reports.
    pub(crate) fn status(&self) -> CUstreamCaptureStatus {
        self.with_sequence(|sequence| match sequence {
            None => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
            Some(Sequence { nodes: Some(_), .. }) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
            Some(Sequence { nodes: None, .. }) => CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
        })
    }

    /// Whether a sequence is under way (active or invalidated, until it is ended).
    pub(crate) fn is_under_way(&self) -> bool {
        self.with_sequence(|sequence| sequence.is_some())
    }

    /// The id of the active sequence, if there is one (not when it was invalidated).
    pub(crate) fn active_id(&self) -> Option<usize> {
        self.with_sequence(|sequence| sequence.filter(|s| s.nodes.is_some()).map(|s| s.id))
    }

    /// The id and graph handle of the active sequence (`cuStreamGetCaptureInfo`).
    pub(crate) fn active_info(&self) -> Option<(usize, usize)> {
        self.with_sequence(|sequence| sequence.filter(|s| s.nodes.is_some()).map(|s| (s.id, s.graph)))
    }

    /// `cuStreamGetCaptureInfo`'s view of the active sequence: its id, its graph, and this
    /// stream's dependency set with as many zeroed edge data, as pointers (null when empty) that
    /// stay valid until the next call of this kind on the stream or the end of the sequence.
    pub(crate) fn active_dependencies(&self) -> Option<(usize, usize, Dependencies)> {
        self.with_sequence(|sequence| {
            let sequence = sequence.filter(|s| s.nodes.is_some())?;
            let (id, graph) = (sequence.id, sequence.graph);
            let member = sequence.member(self.key);
            let nodes: Box<[usize]> = member.frontier.clone().into_boxed_slice();
            let edges: Box<[CUgraphEdgeData]> = vec![CUgraphEdgeData::default(); nodes.len()].into_boxed_slice();
            member.reported = (nodes, edges);
            let (nodes, edges) = &member.reported;
            let dependencies = if nodes.is_empty() {
                Dependencies { nodes: std::ptr::null(), edges: std::ptr::null(), count: 0 }
            } else {
                Dependencies { nodes: nodes.as_ptr(), edges: edges.as_ptr(), count: nodes.len() }
            };
            Some((id, graph, dependencies))
        })
    }

    /// The nodes the graph API shows of the active sequence whose graph is `graph`, if this
    /// stream captures it.
    pub(crate) fn listed_of(&self, graph: usize) -> Option<Vec<Listed>> {
        self.with_sequence(|sequence| sequence.filter(|s| s.nodes.is_some() && s.graph == graph).map(|s| s.listed()))
    }

    /// `cuStreamUpdateCaptureDependencies`: adds `nodes` to this stream's dependency set or
    /// replaces the set with them. `CUDA_ERROR_ILLEGAL_STATE` when the stream does not capture,
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when its capture was invalidated,
    /// `CUDA_ERROR_INVALID_VALUE` (nothing changed) when a node is not a node of the capture's
    /// graph or is named twice. The stream follows the work before each node, as after a wait
    /// for an event recorded right after it; after a replacement it owes its origin only what
    /// the new set holds of its own work (`cuda.h`: the nodes removed "do not result in
    /// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`").
    pub(crate) fn update_dependencies(&self, nodes: &[usize], update: Update) -> SimResult {
        self.with_sequence(|sequence| {
            let Some(sequence) = sequence else { return fail(CUresult::CUDA_ERROR_ILLEGAL_STATE) };
            if sequence.nodes.is_none() {
                return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            for (index, node) in nodes.iter().enumerate() {
                ensure(sequence.made(*node).is_some() && !nodes[..index].contains(node))?;
            }
            let mut follows: Vec<(usize, u64)> = Vec::new();
            let mut own = 0;
            for node in nodes {
                let Some(made) = sequence.made(*node) else { continue };
                follows.extend_from_slice(&made.covers);
                follows.push(made.by);
                if made.by.0 == self.key {
                    own = own.max(made.by.1);
                }
            }
            let member = sequence.member(self.key);
            member.follow(&follows);
            if update == Update::Set {
                member.frontier.clear();
                member.owed = own;
            }
            member.depend_on(nodes);
            Ok(())
        })
    }

    /// Starts a sequence in `mode`, begun by this thread; its id, or `None` if one is already
    /// under way (its own, or one it joined).
    pub(crate) fn begin(&self, mode: CUstreamCaptureMode) -> Option<usize> {
        if self.is_under_way() {
            return None;
        }
        let mut sequence = self.lock();
        if sequence.is_some() {
            return None;
        }
        let id = crate::handle::next();
        let thread = std::thread::current().id();
        let graph = crate::handle::next();
        let members = vec![Member::new(self.key)];
        *sequence = Some(Sequence {
            id,
            graph,
            nodes: Some(Vec::new()),
            made: Vec::new(),
            allocs: Vec::new(),
            mode,
            thread,
            members,
        });
        Some(id)
    }

    /// The id of the sequence under way (active or invalidated).
    fn under_way_id(&self) -> Option<usize> {
        self.with_sequence(|sequence| sequence.map(|s| s.id))
    }

    /// Ends the sequence: `CUDA_ERROR_ILLEGAL_STATE` if none was under way,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` on a stream that joined another's,
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (the sequence goes on) if it was begun in a mode
    /// other than relaxed by another thread; [`Ended::Unjoined`] if a stream that joined it has
    /// not rejoined.
    pub(crate) fn end(&self) -> SimResult<Ended> {
        if self.lock().is_none() && self.is_under_way() {
            return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
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
        let joined = sequence.all_joined();
        let listed = sequence.listed();
        Ok(match sequence.nodes {
            Some(nodes) if joined => Ended::Graph { handle: sequence.graph, nodes, listed, allocs: sequence.allocs },
            // The work of an unjoined capture is discarded, as an invalidated one's.
            Some(nodes) => {
                drop(nodes);
                Ended::Unjoined(sequence.graph, sequence.allocs)
            }
            None => Ended::Invalidated(sequence.graph, sequence.allocs),
        })
    }

    /// Where an event recorded on this stream now stands, if the stream captures (after the
    /// event's record node was added): the sequence and the work that precedes the recording.
    pub(crate) fn point(&self, stream: &Arc<Stream>) -> Option<CapturePoint> {
        self.with_sequence(|sequence| {
            let sequence = sequence.filter(|s| s.nodes.is_some())?;
            let id = sequence.id;
            let member = sequence.member(self.key);
            let mut covers = member.covers.clone();
            covers.push((self.key, member.work));
            let frontier = member.frontier.clone();
            Some(CapturePoint { stream: Arc::downgrade(stream), sequence: id, covers, frontier })
        })
    }

    /// This stream waits for an event recorded at `point`: a stream of that sequence now follows
    /// the work before it; a stream that captures nothing joins the sequence (if it is still
    /// under way); a stream that captures another sequence is `CUDA_ERROR_STREAM_CAPTURE_MERGE`.
    pub(crate) fn wait_for_point(&self, point: &CapturePoint) -> SimResult {
        let outcome = self.with_sequence(|sequence| match sequence {
            Some(sequence) if sequence.id == point.sequence => {
                let member = sequence.member(self.key);
                member.follow(&point.covers);
                member.depend_on(&point.frontier);
                Ok(true)
            }
            Some(_) => fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_MERGE),
            None => Ok(false),
        })?;
        if outcome {
            return Ok(());
        }
        // Not capturing: join the sequence through the stream it was recorded on, if it is
        // still under way there.
        let Some(recorder) = point.stream.upgrade() else { return Ok(()) };
        let Some(origin) = recorder.capture.origin(&recorder) else { return Ok(()) };
        let mut sequence = origin.capture.lock();
        let Some(sequence) = sequence.as_mut().filter(|s| s.id == point.sequence) else { return Ok(()) };
        let member = sequence.member(self.key);
        member.work = member.work.max(1);
        member.owed = member.owed.max(1);
        member.follow(&point.covers);
        member.depend_on(&point.frontier);
        *self.lock_joined() = Some((Arc::downgrade(&origin), point.sequence));
        Ok(())
    }

    /// The stream whose sequence this stream's work goes to: `stream` itself (this capture's
    /// own) or the origin of the sequence it joined; `None` when it captures nothing.
    fn origin(&self, stream: &Arc<Stream>) -> Option<Arc<Stream>> {
        let joined = self.lock_joined().clone();
        if let Some((origin, id)) = joined
            && let Some(origin) = origin.upgrade()
            && origin.capture.lock().as_ref().is_some_and(|s| s.id == id)
        {
            return Some(origin);
        }
        self.lock().is_some().then(|| Arc::clone(stream))
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
    /// `touches` is the simulator's memory the op reads or writes (checked at each launch);
    /// `kind` is the node type the graph API reports for it.
    pub(crate) fn record(&self, op: Op, touches: Vec<Touch>, kind: CUgraphNodeType) -> Result<(), Op> {
        self.push(op, |op| Node::Work { op: Mutex::new(op), touches, kind })
    }

    /// Adds `node` to the sequence under way (see [`record`](Capture::record)), or gives it back
    /// when there is none.
    pub(crate) fn record_node(&self, node: Node) -> Result<(), Node> {
        self.push(node, |node| node)
    }

    /// Adds `item`, made a node by `into`, to the sequence under way, or gives it back.
    fn push<T>(&self, item: T, into: impl FnOnce(T) -> Node) -> Result<(), T> {
        let swallowed = self.with_sequence(|sequence| {
            let Some(sequence) = sequence else { return Err(item) };
            let Some(nodes) = sequence.nodes.as_mut() else { return Ok(Some(item)) };
            let node = into(item);
            if let Node::Alloc(alloc) = &node {
                sequence.allocs.push(Arc::clone(alloc));
            }
            let kind = node.listed_kind();
            nodes.push(node);
            let member = sequence.member(self.key);
            member.work += 1;
            member.owed = member.work;
            if let Some(kind) = kind {
                // A node the graph API shows: it depends on the stream's set, and becomes it.
                let handle = crate::handle::next();
                let deps = std::mem::replace(&mut member.frontier, vec![handle]);
                let (by, covers) = ((self.key, member.work), member.covers.clone());
                sequence.made.push(Made { listed: Listed { handle, kind, deps }, by, covers });
            }
            Ok(None)
        })?;
        // Dropped outside the lock: captured work may hold memory.
        drop(swallowed);
        Ok(())
    }

    /// The allocation an allocation node of the sequence under way made at `base`, if any.
    pub(crate) fn own_alloc(&self, base: u64) -> Option<Arc<GraphAlloc>> {
        self.with_sequence(|sequence| sequence?.allocs.iter().find(|a| a.base == base).cloned())
    }

    /// Invalidates the active sequence (only the one with id `only`, when given), discarding its
    /// work. Returns whether a sequence was under way, active or already invalidated.
    pub(crate) fn invalidate(&self, only: Option<usize>) -> bool {
        let Some(discarded) = self.with_sequence(|sequence| match sequence {
            None => None,
            Some(s) if only.is_some_and(|id| id != s.id) => None,
            Some(s) => Some(s.nodes.take()),
        }) else {
            return false;
        };
        // Captured work may hold memory; it is released outside the lock.
        drop(discarded);
        true
    }
}

/// A stream's dependency set as `cuStreamGetCaptureInfo` gives it out.
pub(crate) struct Dependencies {
    /// The nodes (null when there are none).
    pub nodes: *const usize,
    /// Their edge data, all default (null when there are none).
    pub edges: *const CUgraphEdgeData,
    /// How many.
    pub count: usize,
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

    const MEMSET: CUgraphNodeType = CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET;

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
        assert!(capture.record(counted(&drops), Vec::new(), MEMSET).is_err(), "no capture: the op comes back");
        assert!(capture.begin(RELAXED).is_some());
        assert!(capture.begin(RELAXED).is_none(), "one sequence at a time");
        let id = capture.active_id().unwrap();
        assert!(capture.record(counted(&drops), Vec::new(), MEMSET).is_ok());
        assert!(!capture.invalidate(Some(id + 1)), "another sequence's id leaves this one alone");
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        let before = drops.load(Ordering::SeqCst);
        assert!(capture.invalidate(Some(id)));
        assert_eq!(drops.load(Ordering::SeqCst), before + 1, "the captured op is discarded");
        assert_eq!(capture.status(), S::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
        assert_eq!(capture.active_id(), None);
        assert!(capture.record(counted(&drops), Vec::new(), MEMSET).is_ok(), "a racing op is swallowed");
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
