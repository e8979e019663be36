//! Contexts: the primary context of each device, the per-thread current-context stack, and the
//! ordering rules between a context's streams.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cuda_mem_sys::types::CUresult;

use crate::error::{SimResult, fail};
use crate::event::Event;
use crate::memory::Touch;
use crate::state::State;
use crate::stream::{Fence, Op, Stream, StreamKind};

/// A context: its device, its legacy default stream, and the streams made in it.
pub(crate) struct Context {
    /// The handle the application sees.
    pub handle: usize,
    /// The device ordinal.
    pub device: usize,
    /// The legacy default stream.
    pub legacy: Arc<Stream>,
    /// Every other stream of the context (created and per-thread), for synchronization.
    streams: Mutex<Vec<Weak<Stream>>>,
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

    /// Fences after the work enqueued so far on every stream of the context that has work
    /// pending (what `cuCtxRecordEvent` captures).
    pub(crate) fn pending_tails(&self) -> Vec<Fence> {
        let mut fences: Vec<Fence> = self.legacy.queue.pending_tail().into_iter().collect();
        fences.extend(self.live_streams().iter().filter_map(|s| s.queue.pending_tail()));
        fences
    }

    /// Remembers a stream made in this context.
    pub(crate) fn register(&self, stream: &Arc<Stream>) {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.retain(|s| s.strong_count() > 0);
        streams.push(Arc::downgrade(stream));
    }

    /// Every live stream of the context except the legacy one.
    pub(crate) fn live_streams(&self) -> Vec<Arc<Stream>> {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.iter().filter_map(Weak::upgrade).collect()
    }

    /// Enqueues `op` on `stream` (a stream of this context), adding the implicit waits of the
    /// legacy default stream: work on it waits for earlier work on every blocking stream, and
    /// work on a blocking stream waits for earlier work on it.
    pub(crate) fn submit(&self, stream: &Stream, op: Op) -> Fence {
        self.enqueue(stream, op, Vec::new(), false)
    }

    /// [`submit`](Context::submit) for work that touches the simulator's memory `touches`:
    /// captured into a graph, each launch checks that the memory is still there.
    pub(crate) fn submit_touching(&self, stream: &Stream, op: Op, touches: Vec<Touch>) -> Fence {
        self.enqueue(stream, op, touches, false)
    }

    /// [`submit`](Context::submit), except that on an idle stream that nothing else orders (no
    /// capture, no implicit wait) `op` runs at once on the calling thread: what the stream's
    /// worker would do next anyway, without the round trip through it (a real driver's
    /// stream-ordered free on an idle stream costs no thread switch either). Only for the
    /// simulator's own bookkeeping (returning freed pool memory), which never blocks and runs
    /// no user code.
    pub(crate) fn submit_or_run(&self, stream: &Stream, op: Op) -> Fence {
        self.enqueue(stream, op, Vec::new(), true)
    }

    /// [`submit`](Context::submit), or with `run_if_idle` [`submit_or_run`](Context::submit_or_run).
    fn enqueue(&self, stream: &Stream, op: Op, touches: Vec<Touch>, run_if_idle: bool) -> Fence {
        let _order = self.submit_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // Work on a capturing stream goes into the graph being captured, not into the queue.
        let mut op = match stream.capture.record(op, touches) {
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
            waits.extend(self.live_streams().iter().filter(|s| s.is_blocking()).filter_map(|s| s.queue.pending_tail()));
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

    /// Waits for all work enqueued so far on every stream of the context.
    pub(crate) fn synchronize(&self) {
        let mut fences = vec![self.legacy.queue.tail()];
        fences.extend(self.live_streams().iter().map(|s| s.queue.tail()));
        for fence in fences {
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
