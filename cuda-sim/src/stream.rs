//! Streams: a queue of operations run in order by a worker thread of its own.
//!
//! Ordering between streams comes from [`Fence`]s: an operation may first wait until another
//! queue has completed a given number of operations. The legacy default stream uses them to
//! synchronize with blocking streams (see [`crate::context::Context::submit`]); events use the
//! same worker model.

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::types::{CUresult, CUstream_flags};

use crate::capture::Capture;
use crate::error::SimResult;

/// One unit of stream work. `FnMut`, not `FnOnce`: work captured into a graph runs again at each
/// launch of the graph (a queue runs each operation it is given once).
pub(crate) type Op = Box<dyn FnMut() + Send + 'static>;

/// What kind of stream this is, which decides how it synchronizes with others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamKind {
    /// The context's legacy default stream (handle 0 or `CU_STREAM_LEGACY`).
    Legacy,
    /// A thread's per-thread default stream (`CU_STREAM_PER_THREAD`, or 0 in `_ptsz` functions).
    PerThread,
    /// A stream made by `cuStreamCreate*`.
    Created,
}

/// A stream: its identity and its queue.
pub(crate) struct Stream {
    /// The handle the application sees (for the default streams, a private value).
    pub handle: usize,
    /// The context handle it belongs to.
    pub ctx: usize,
    /// The device of that context.
    pub device: usize,
    /// `CU_STREAM_*` flags it was created with.
    pub flags: u32,
    /// Its priority, already clamped to the device's range.
    pub priority: i32,
    /// Legacy, per-thread or created.
    pub kind: StreamKind,
    /// The work queue.
    pub queue: Arc<Queue>,
    /// Its graph capture sequence, if one is under way.
    pub capture: Capture,
    /// How many event recordings on it have completed: a stream-ordered free notes the count
    /// as it runs, and a recording's completion the count before it, so that waiting for the
    /// event observes the frees that ran before it and no later ones (see
    /// [`crate::pool::Observed::StreamUpTo`]).
    pub marks: Arc<AtomicU64>,
}

impl Stream {
    /// Starts a stream with its worker thread.
    pub(crate) fn start(
        ctx: usize,
        device: usize,
        flags: u32,
        priority: i32,
        kind: StreamKind,
    ) -> SimResult<Arc<Stream>> {
        let handle = crate::handle::next();
        let queue = Queue::start(handle)?;
        let (capture, marks) = (Capture::default(), Arc::default());
        Ok(Arc::new(Stream { handle, ctx, device, flags, priority, kind, queue, capture, marks }))
    }

    /// Whether it synchronizes with the legacy default stream: every stream except the legacy
    /// one itself and those created with `CU_STREAM_NON_BLOCKING`.
    pub(crate) fn is_blocking(&self) -> bool {
        self.kind != StreamKind::Legacy && self.flags & CUstream_flags::CU_STREAM_NON_BLOCKING.0 == 0
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The worker finishes what was enqueued, then exits: as the driver documents for
        // cuStreamDestroy, work already in the stream still completes.
        self.queue.shutdown();
    }
}

/// A queue of operations and the counters that order them.
pub(crate) struct Queue {
    inner: Mutex<Inner>,
    work: Condvar,
    done: Condvar,
}

struct Inner {
    ops: VecDeque<Op>,
    submitted: u64,
    completed: u64,
    shutdown: bool,
    /// Threads blocked in [`Fence::wait`]: completing an operation wakes them only if there are
    /// any (a condition variable's notify is a system call even with nobody waiting).
    waiting: usize,
}

/// A point in a queue: done once the queue has completed `seq` operations.
#[derive(Clone)]
pub(crate) struct Fence {
    queue: Arc<Queue>,
    seq: u64,
}

impl Fence {
    /// Whether the fence has been reached.
    pub(crate) fn is_reached(&self) -> bool {
        self.queue.lock().completed >= self.seq
    }

    /// Blocks until the fence is reached.
    pub(crate) fn wait(&self) {
        let mut inner = self.queue.lock();
        inner.waiting += 1;
        while inner.completed < self.seq {
            inner = self.queue.done.wait(inner).unwrap_or_else(PoisonError::into_inner);
        }
        inner.waiting -= 1;
    }
}

impl Queue {
    fn start(handle: usize) -> SimResult<Arc<Queue>> {
        let queue = Arc::new(Queue {
            inner: Mutex::new(Inner { ops: VecDeque::new(), submitted: 0, completed: 0, shutdown: false, waiting: 0 }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let worker = Arc::clone(&queue);
        std::thread::Builder::new()
            .name(format!("cuda-sim-stream-{handle:x}"))
            .spawn(move || worker.run())
            .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(queue)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends an operation; returns the fence reached when it has run.
    pub(crate) fn push(self: &Arc<Self>, op: Op) -> Fence {
        let mut inner = self.lock();
        inner.ops.push_back(op);
        inner.submitted += 1;
        let seq = inner.submitted;
        drop(inner);
        self.work.notify_one();
        Fence { queue: Arc::clone(self), seq }
    }

    /// Runs `op` on the calling thread if the queue is idle, as its worker would run it next,
    /// and returns the fence after it; gives `op` back if work is pending. The caller must keep
    /// every other push out until this returns (the context's submission lock does), so that
    /// nothing enqueued later can run before `op` has.
    pub(crate) fn run_if_idle(self: &Arc<Self>, op: Op) -> Result<Fence, Op> {
        let seq = {
            let mut inner = self.lock();
            if inner.completed != inner.submitted || inner.shutdown {
                return Err(op);
            }
            inner.submitted += 1;
            inner.submitted
        };
        self.execute(op);
        Ok(Fence { queue: Arc::clone(self), seq })
    }

    /// The fence after everything enqueued so far.
    pub(crate) fn tail(self: &Arc<Self>) -> Fence {
        let seq = self.lock().submitted;
        Fence { queue: Arc::clone(self), seq }
    }

    /// The tail fence, if some enqueued work has not completed yet.
    pub(crate) fn pending_tail(self: &Arc<Self>) -> Option<Fence> {
        let inner = self.lock();
        (inner.completed < inner.submitted).then(|| Fence { queue: Arc::clone(self), seq: inner.submitted })
    }

    /// Whether all enqueued work has completed.
    pub(crate) fn is_idle(&self) -> bool {
        let inner = self.lock();
        inner.completed == inner.submitted
    }

    fn shutdown(&self) {
        self.lock().shutdown = true;
        self.work.notify_all();
    }

    fn run(self: Arc<Self>) {
        loop {
            let op = {
                let mut inner = self.lock();
                loop {
                    if let Some(op) = inner.ops.pop_front() {
                        break op;
                    }
                    if inner.shutdown {
                        return;
                    }
                    inner = self.work.wait(inner).unwrap_or_else(PoisonError::into_inner);
                }
            };
            self.execute(op);
        }
    }

    /// Runs an operation (one the worker took off the queue, or one
    /// [`run_if_idle`](Queue::run_if_idle) runs in its place), counts it completed and wakes the
    /// fences' waiters, if there are any. One that panicked must still count as completed, or
    /// every waiter on this queue would hang; the simulator's own operations do not panic.
    fn execute(&self, op: Op) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(op));
        let waiting = {
            let mut inner = self.lock();
            inner.completed += 1;
            inner.waiting > 0
        };
        if waiting {
            self.done.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn operations_run_in_order_and_fences_wait() {
        let stream = Stream::start(1, 0, 0, 0, StreamKind::Created).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut last = None;
        for i in 0..100 {
            let log = Arc::clone(&log);
            last = Some(stream.queue.push(Box::new(move || log.lock().unwrap().push(i))));
        }
        last.unwrap().wait();
        assert_eq!(*log.lock().unwrap(), (0..100).collect::<Vec<_>>());
        assert!(stream.queue.is_idle());
        assert!(stream.queue.pending_tail().is_none());
    }

    #[test]
    fn work_enqueued_before_drop_still_runs() {
        let count = Arc::new(AtomicUsize::new(0));
        let stream = Stream::start(1, 0, 0, 0, StreamKind::Created).unwrap();
        let queue = Arc::clone(&stream.queue);
        for _ in 0..10 {
            let count = Arc::clone(&count);
            queue.push(Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            }));
        }
        let tail = queue.tail();
        drop(stream);
        tail.wait();
        assert_eq!(count.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn blocking_flags() {
        let s = Stream::start(1, 0, CUstream_flags::CU_STREAM_NON_BLOCKING.0, 0, StreamKind::Created).unwrap();
        assert!(!s.is_blocking());
        let s = Stream::start(1, 0, 0, 0, StreamKind::PerThread).unwrap();
        assert!(s.is_blocking());
        let s = Stream::start(1, 0, 0, 0, StreamKind::Legacy).unwrap();
        assert!(!s.is_blocking());
    }
}
