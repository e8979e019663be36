//! Contexts: the primary context of each device, the per-thread current-context stack, and the
//! ordering rules between a context's streams.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cuda_mem_sys::types::{CUgraphNodeType, CUresult};

use crate::error::{SimResult, fail};
use crate::event::Event;
use crate::memory::Touch;
use crate::state::State;
use crate::stream::{Fence, Op, Queue, Stream, StreamKind};

/// The node type of captured work no other type describes.
const EMPTY: CUgraphNodeType = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;

/// A context: its device, its legacy default stream, and the streams made in it.
pub(crate) struct Context {
    /// The handle the application sees.
    pub handle: usize,
    /// The device ordinal.
    pub device: usize,
    /// The legacy default stream.
    pub legacy: Arc<Stream>,
    /// Every other stream of the context (created and per-thread), for synchronization, kept
    /// after the stream is gone (destroyed, or its thread exited) until its queue has run what
    /// was enqueued on it: the context's work includes it (see [`Context::synchronize`]).
    streams: Mutex<Vec<Registered>>,
    /// Serializes submissions, so that "enqueued before" is one order across the context's
    /// streams and the legacy stream's implicit waits never form a cycle.
    submit_lock: Mutex<()>,
    /// The sticky error of an asynchronous fault, shared with the work that may report one.
    pub fault: Arc<Fault>,
    /// The flags `cuCtxCreate` made it with; `None` for a primary context, whose flags are its
    /// device's (`cuDevicePrimaryCtxSetFlags`).
    pub created_flags: Option<u32>,
    /// Its limits and cache preference (`cuCtxSetLimit`, `cuCtxSetCacheConfig`).
    pub settings: Mutex<crate::api::limits::Settings>,
    /// The event recordings every later submission to the context waits for
    /// (`cuCtxWaitEvent`); `has_barrier` says whether there are any, without the lock.
    barrier: Mutex<Vec<(Arc<Event>, u64)>>,
    has_barrier: AtomicBool,
}

/// A stream made in a context, as the context remembers it.
struct Registered {
    /// The stream, while it has a handle (a created stream not destroyed, a per-thread stream
    /// whose thread has not exited).
    stream: Weak<Stream>,
    /// Its queue, whose work outlives the stream.
    queue: Arc<Queue>,
    /// Whether it synchronizes with the legacy default stream.
    blocking: bool,
}

impl Registered {
    /// Whether the context can forget it: the stream is gone and its work has run.
    fn is_done(&self) -> bool {
        self.stream.strong_count() == 0 && self.queue.is_idle()
    }
}

/// A context's sticky error: once work on the context faulted (touched memory no longer mapped,
/// `CUDA_ERROR_ILLEGAL_ADDRESS` on a GPU), every later call on the context returns the error, as
/// the driver documents for such errors ("the context cannot be used"), until the context is
/// destroyed (for a primary context, reset or released).
#[derive(Default)]
pub(crate) struct Fault(AtomicU32);

impl Fault {
    /// Records `code` as the context's sticky error (the first one stays).
    pub(crate) fn record(&self, code: CUresult) {
        let _ = self.0.compare_exchange(CUresult::CUDA_SUCCESS.0, code.0, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The sticky error, if work has faulted.
    pub(crate) fn check(&self) -> SimResult {
        match self.0.load(Ordering::SeqCst) {
            0 => Ok(()),
            code => fail(CUresult(code)),
        }
    }
}

/// The handles of the contexts not destroyed yet (see [`is_live`]).
static LIVE: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<usize>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether context `handle` has not been destroyed: work still running for a destroyed context
/// (its frees, say) has no context left to observe it. A lock of its own rather than the
/// state's, so that work may ask while it runs.
pub(crate) fn is_live(handle: usize) -> bool {
    live().contains(&handle)
}

impl Context {
    /// A new primary context on `device`, with its legacy default stream running.
    pub(crate) fn start(device: usize) -> SimResult<Arc<Context>> {
        Context::start_with(device, None)
    }

    /// A new context on `device`: a primary one (`created_flags` `None`) or one `cuCtxCreate`
    /// makes with those flags.
    pub(crate) fn start_with(device: usize, created_flags: Option<u32>) -> SimResult<Arc<Context>> {
        let handle = crate::handle::next();
        let legacy = Stream::start(handle, device, 0, 0, StreamKind::Legacy)?;
        live().insert(handle);
        Ok(Arc::new(Context {
            handle,
            device,
            legacy,
            streams: Mutex::new(Vec::new()),
            submit_lock: Mutex::new(()),
            fault: Arc::default(),
            created_flags,
            settings: Mutex::default(),
            barrier: Mutex::new(Vec::new()),
            has_barrier: AtomicBool::new(false),
        }))
    }

    /// Makes every later submission to the context wait for recording `generation` of `event`
    /// (`cuCtxWaitEvent`).
    pub(crate) fn wait_for_event(&self, event: Arc<Event>, generation: u64) {
        let _order = self.submit_lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.barrier.lock().unwrap_or_else(PoisonError::into_inner).push((event, generation));
        self.has_barrier.store(true, Ordering::SeqCst);
    }

    /// The recordings of [`wait_for_event`](Context::wait_for_event) not known to be complete
    /// yet (those that are are forgotten).
    fn barrier(&self) -> Vec<(Arc<Event>, u64)> {
        if !self.has_barrier.load(Ordering::SeqCst) {
            return Vec::new();
        }
        let mut barrier = self.barrier.lock().unwrap_or_else(PoisonError::into_inner);
        barrier.retain(|(event, _)| !event.is_complete());
        if barrier.is_empty() {
            self.has_barrier.store(false, Ordering::SeqCst);
        }
        barrier.clone()
    }

    /// Fences after the work enqueued so far on every queue of the context that has work
    /// pending, those of streams gone since included (what `cuCtxRecordEvent` captures: "all
    /// work" of the context, as [`tails`](Context::tails) is what `cuCtxSynchronize` waits for).
    pub(crate) fn pending_tails(&self) -> Vec<Fence> {
        let mut fences: Vec<Fence> = self.legacy.queue.pending_tail().into_iter().collect();
        fences.extend(self.registered().iter().filter_map(|s| s.queue.pending_tail()));
        fences
    }

    /// Remembers a stream made in this context.
    pub(crate) fn register(&self, stream: &Arc<Stream>) {
        let mut streams = self.registered();
        streams.retain(|s| !s.is_done());
        let (queue, blocking) = (Arc::clone(&stream.queue), stream.is_blocking());
        streams.push(Registered { stream: Arc::downgrade(stream), queue, blocking });
    }

    fn registered(&self) -> std::sync::MutexGuard<'_, Vec<Registered>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every live stream of the context except the legacy one.
    pub(crate) fn live_streams(&self) -> Vec<Arc<Stream>> {
        self.registered().iter().filter_map(|s| s.stream.upgrade()).collect()
    }

    /// The fences after the work enqueued so far on every queue of the context: the legacy
    /// stream's and every other stream's, those of streams gone since included (a destroyed
    /// stream's work still completes, as `cuStreamDestroy` documents, and so does the work a
    /// thread left on its per-thread stream when it exited).
    pub(crate) fn tails(&self) -> Vec<Fence> {
        let mut fences = vec![self.legacy.queue.tail()];
        let mut streams = self.registered();
        streams.retain(|s| !s.is_done());
        fences.extend(streams.iter().map(|s| s.queue.tail()));
        fences
    }

    /// Marks the context destroyed (see [`is_live`]) and returns the fences after the work
    /// still pending on its queues (see [`tails`](Context::tails)): it still runs, and the
    /// device's later synchronizations wait for it.
    pub(crate) fn retire(&self) -> Vec<Fence> {
        live().remove(&self.handle);
        self.pending_tails()
    }

    /// Enqueues `op` on `stream` (a stream of this context), adding the implicit waits of the
    /// legacy default stream: work on it waits for earlier work on every blocking stream, and
    /// work on a blocking stream waits for earlier work on it. A capture makes it an empty node
    /// (for work that has no node type of its own).
    pub(crate) fn submit(&self, stream: &Stream, op: Op) -> Fence {
        self.enqueue(stream, op, Vec::new(), EMPTY, false)
    }

    /// [`submit`](Context::submit) for work that a capture makes a node of type `kind`.
    pub(crate) fn submit_as(&self, stream: &Stream, op: Op, kind: CUgraphNodeType) -> Fence {
        self.enqueue(stream, op, Vec::new(), kind, false)
    }

    /// [`submit_as`](Context::submit_as) for work that touches the simulator's memory
    /// `touches`: captured into a graph, each launch checks that the memory is still there.
    pub(crate) fn submit_touching(&self, stream: &Stream, op: Op, touches: Vec<Touch>, kind: CUgraphNodeType) -> Fence {
        self.enqueue(stream, op, touches, kind, false)
    }

    /// [`submit`](Context::submit), except that on an idle stream that nothing else orders (no
    /// capture, no implicit wait) `op` runs at once on the calling thread: what the stream's
    /// worker would do next anyway, without the round trip through it (a real driver's
    /// stream-ordered free on an idle stream costs no thread switch either). Only for the
    /// simulator's own bookkeeping (returning freed pool memory), which never blocks and runs
    /// no user code.
    pub(crate) fn submit_or_run(&self, stream: &Stream, op: Op) -> Fence {
        self.enqueue(stream, op, Vec::new(), EMPTY, true)
    }

    /// [`submit`](Context::submit), or with `run_if_idle` [`submit_or_run`](Context::submit_or_run).
    fn enqueue(&self, stream: &Stream, op: Op, touches: Vec<Touch>, kind: CUgraphNodeType, run_if_idle: bool) -> Fence {
        let _order = self.submit_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Work on a capturing stream goes into the graph being captured, not into the queue.
        let mut op = match stream.capture.record(op, touches, kind) {
            Ok(()) => return stream.queue.tail(),
            Err(op) => op,
        };
        let waits = self.implicit_waits(stream);
        let barrier = self.barrier();
        if !waits.is_empty() || !barrier.is_empty() {
            return stream.queue.push(Box::new(move || {
                for (event, generation) in &barrier {
                    event.wait_for(*generation);
                }
                for fence in &waits {
                    fence.wait();
                }
                op();
            }));
        }
        if !run_if_idle {
            return stream.queue.push(op);
        }
        // The submission lock, held until the operation has run, keeps every later push out.
        match stream.queue.run_if_idle(op) {
            Ok(fence) => fence,
            Err(op) => stream.queue.push(op),
        }
    }

    /// The pending work that work submitted to `stream` now would wait for besides the stream's
    /// own: the legacy default stream's implicit synchronization.
    fn implicit_waits(&self, stream: &Stream) -> Vec<Fence> {
        let mut waits: Vec<Fence> = Vec::new();
        if stream.kind == StreamKind::Legacy {
            // Streams gone since included: their work was enqueued before.
            let streams = self.registered();
            waits.extend(streams.iter().filter(|s| s.blocking).filter_map(|s| s.queue.pending_tail()));
        } else if stream.is_blocking() {
            waits.extend(self.legacy.queue.pending_tail());
        }
        waits
    }

    /// Waits until an empty operation submitted to `stream` now would have run (what
    /// `cuStreamSynchronize` waits for), without submitting one: an idle stream is then not a
    /// round trip through its worker thread.
    pub(crate) fn wait_as_if_submitted(&self, stream: &Stream) {
        let fences = {
            let _order = self.submit_lock.lock().unwrap_or_else(PoisonError::into_inner);
            let mut fences = self.implicit_waits(stream);
            fences.push(stream.queue.tail());
            fences
        };
        for fence in fences {
            fence.wait();
        }
    }

    /// Waits for all work enqueued so far on every stream of the context, streams gone since
    /// included (see [`tails`](Context::tails)).
    pub(crate) fn synchronize(&self) {
        for fence in self.tails() {
            fence.wait();
        }
    }
}

thread_local! {
    /// This thread's context stack; the top is the current context.
    static CURRENT: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// This thread's per-thread default stream, per context.
    static PER_THREAD: RefCell<HashMap<usize, Arc<Stream>>> = RefCell::new(HashMap::new());
}

/// The handle of the current context, if any (it may have been destroyed since).
pub(crate) fn current_handle() -> Option<usize> {
    CURRENT.with(|stack| stack.borrow().last().copied())
}

/// The current context: `CUDA_ERROR_INVALID_CONTEXT` without one,
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED` when it has been destroyed (a primary context released to
/// zero, or reset), and its sticky error once its work faulted (see [`Fault`]).
pub(crate) fn current(state: &State) -> SimResult<Arc<Context>> {
    let context = match current_handle() {
        None => return fail(CUresult::CUDA_ERROR_INVALID_CONTEXT),
        Some(handle) => state.contexts.get(&handle).cloned().ok_or(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED)?,
    };
    context.fault.check()?;
    Ok(context)
}

/// Replaces the top of the stack (`cuCtxSetCurrent`); `None` pops it.
pub(crate) fn set_current(handle: Option<usize>) {
    CURRENT.with(|stack| {
        let mut stack = stack.borrow_mut();
        stack.pop();
        if let Some(handle) = handle {
            stack.push(handle);
        }
    });
}

/// Pushes a context (`cuCtxPushCurrent`).
pub(crate) fn push_current(handle: usize) {
    CURRENT.with(|stack| stack.borrow_mut().push(handle));
}

/// Pops the current context (`cuCtxPopCurrent`).
pub(crate) fn pop_current() -> Option<usize> {
    CURRENT.with(|stack| stack.borrow_mut().pop())
}

/// This thread's per-thread default stream in `ctx`, started on first use.
pub(crate) fn per_thread_stream(ctx: &Context) -> SimResult<Arc<Stream>> {
    if let Some(stream) = PER_THREAD.with(|map| map.borrow().get(&ctx.handle).cloned()) {
        return Ok(stream);
    }
    let stream = Stream::start(ctx.handle, ctx.device, 0, 0, StreamKind::PerThread)?;
    ctx.register(&stream);
    PER_THREAD.with(|map| map.borrow_mut().insert(ctx.handle, Arc::clone(&stream)));
    Ok(stream)
}
