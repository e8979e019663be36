//! User objects (`cuUserObjectCreate`): a destructor callback and a reference count, whose
//! references are owned by user code, by graphs and by the executable graphs instantiated from
//! them.
//!
//! The count is split in two: the references user code owns (created, retained and released
//! with `cuUserObjectRetain`/`cuUserObjectRelease`, or moved to a graph) and those graphs and
//! executable graphs hold ([`Held`]). When both reach zero the destructor is queued for the
//! simulator's destructor thread ("executed by a shared internal thread", never in the
//! releasing call), where driver calls are refused as in a host function ("Destructor callbacks
//! cannot make CUDA API calls"). Releasing more references than user code (or a graph) owns, and
//! using a handle once its object is destroyed, are refused with `CUDA_ERROR_INVALID_VALUE`
//! (`cuda.h` calls both undefined; see [`crate::conservative`]).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cuda_mem_sys::types::CUresult;

use crate::error::{SimResult, fail};

/// The destructor callback: a `CUhostFn` that is not null.
pub(crate) type Destructor = unsafe extern "C" fn(*mut c_void);

/// A user object.
pub(crate) struct UserObject {
    /// The pointer passed to the destructor.
    ptr: usize,
    /// The destructor.
    destroy: Destructor,
    /// Its references.
    counts: Mutex<Counts>,
}

/// A user object's references.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    /// Owned by user code.
    user: u64,
    /// Held by graphs and executable graphs.
    held: u64,
}

/// The largest count a single call may name ("not larger than INT_MAX").
pub(crate) const MAX_COUNT: u32 = i32::MAX as u32;

impl UserObject {
    /// A new object with `initial` references owned by user code.
    pub(crate) fn new(ptr: *mut c_void, destroy: Destructor, initial: u32) -> Arc<UserObject> {
        let counts = Mutex::new(Counts { user: u64::from(initial), held: 0 });
        Arc::new(UserObject { ptr: ptr as usize, destroy, counts })
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any reference remains (the handle may be used).
    pub(crate) fn is_alive(&self) -> bool {
        let counts = self.lock();
        counts.user + counts.held > 0
    }

    /// Changes the counts with `change`, under the lock; `CUDA_ERROR_INVALID_VALUE` if the
    /// object is already destroyed or `change` refuses. Queues the destructor if nothing is
    /// left.
    fn update(self: &Arc<Self>, change: impl FnOnce(&mut Counts) -> Option<()>) -> SimResult {
        let destroyed = {
            let mut counts = self.lock();
            if counts.user + counts.held == 0 {
                return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            let mut changed = *counts;
            change(&mut changed).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            *counts = changed;
            changed.user + changed.held == 0
        };
        if destroyed {
            run_destructor(self);
        }
        Ok(())
    }

    /// `cuUserObjectRetain`: `count` more references for user code.
    pub(crate) fn retain(self: &Arc<Self>, count: u32) -> SimResult {
        self.update(|c| {
            c.user = c.user.checked_add(u64::from(count))?;
            Some(())
        })
    }

    /// `cuUserObjectRelease`: user code gives back `count` references it owns.
    pub(crate) fn release(self: &Arc<Self>, count: u32) -> SimResult {
        self.update(|c| {
            c.user = c.user.checked_sub(u64::from(count))?;
            Some(())
        })
    }

    /// A graph takes `count` references: new ones, or (`moved`) ones user code owned.
    fn hold(self: &Arc<Self>, count: u64, moved: bool) -> SimResult {
        self.update(|c| {
            if moved {
                c.user = c.user.checked_sub(count)?;
            }
            c.held = c.held.checked_add(count)?;
            Some(())
        })
    }

    /// A graph gives back `count` references it held.
    fn unhold(self: &Arc<Self>, count: u64) {
        // A holder gives back only what it took: this cannot be refused.
        let _ = self.update(|c| {
            c.held = c.held.checked_sub(count)?;
            Some(())
        });
    }
}

/// The references one graph or executable graph holds, by object handle; released when it is
/// dropped.
#[derive(Default)]
pub(crate) struct Held {
    refs: BTreeMap<usize, (Arc<UserObject>, u64)>,
}

impl Held {
    /// `cuGraphRetainUserObject`: `count` references to `object` (handle `handle`), new or
    /// (`moved`) moved from user code.
    pub(crate) fn retain(&mut self, handle: usize, object: &Arc<UserObject>, count: u32, moved: bool) -> SimResult {
        object.hold(u64::from(count), moved)?;
        self.refs.entry(handle).or_insert_with(|| (Arc::clone(object), 0)).1 += u64::from(count);
        Ok(())
    }

    /// `cuGraphReleaseUserObject`: gives back `count` of the references it holds to `handle`;
    /// `CUDA_ERROR_INVALID_VALUE` if it holds fewer.
    pub(crate) fn release(&mut self, handle: usize, count: u32) -> SimResult {
        let count = u64::from(count);
        let Some((object, held)) = self.refs.get_mut(&handle) else {
            return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if *held < count {
            return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        *held -= count;
        let object = Arc::clone(object);
        if *held == 0 {
            self.refs.remove(&handle);
        }
        object.unhold(count);
        Ok(())
    }

    /// New references to everything this holds, for an executable graph instantiated from it
    /// (the graph keeps its own).
    pub(crate) fn duplicate(&self) -> Held {
        let mut copy = Held::default();
        for (&handle, (object, count)) in &self.refs {
            // The object is alive: this holds references to it.
            if object.hold(*count, false).is_ok() {
                copy.refs.insert(handle, (Arc::clone(object), *count));
            }
        }
        copy
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for (object, count) in std::mem::take(&mut self.refs).into_values() {
            object.unhold(count);
        }
    }
}

/// One destructor to run.
struct Job {
    destroy: Destructor,
    ptr: usize,
}

/// Queues the destructor of `object` for the destructor thread (started on first use); if the
/// thread cannot be started, it runs on a thread of its own.
fn run_destructor(object: &UserObject) {
    static QUEUE: OnceLock<Option<Mutex<Sender<Job>>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (send, receive) = channel::<Job>();
        let spawned = std::thread::Builder::new().name("cuda-sim user object destructors".into()).spawn(move || {
            for job in receive {
                call(&job);
            }
        });
        spawned.ok().map(|_| Mutex::new(send))
    });
    let job = Job { destroy: object.destroy, ptr: object.ptr };
    let sent = match queue {
        Some(send) => send.lock().unwrap_or_else(PoisonError::into_inner).send(job).map_err(|e| e.0),
        None => Err(job),
    };
    if let Err(job) = sent {
        std::thread::spawn(move || call(&job));
    }
}

/// Runs one destructor, with driver calls refused.
fn call(job: &Job) {
    crate::api::as_host_function(|| {
        // SAFETY: `cuUserObjectCreate`'s caller gave this function and pointer to be called
        // once, when the last reference goes.
        unsafe { (job.destroy)(job.ptr as *mut c_void) }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count_run(_ptr: *mut c_void) {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }

    fn wait_for_runs(n: usize) {
        let start = Instant::now();
        while RUNS.load(Ordering::SeqCst) < n {
            assert!(start.elapsed() < Duration::from_secs(10), "the destructor did not run");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_destructor_runs_once_when_user_and_graph_references_are_gone() {
        let object = UserObject::new(std::ptr::null_mut(), count_run, 2);
        let mut graph = Held::default();
        graph.retain(7, &object, 1, true).unwrap();
        assert_eq!(*object.lock(), Counts { user: 1, held: 1 });
        assert!(graph.retain(7, &object, 2, true).is_err(), "moving more than user code owns");
        assert!(graph.release(7, 2).is_err(), "releasing more than the graph holds");
        let exec = graph.duplicate();
        assert_eq!(*object.lock(), Counts { user: 1, held: 2 });
        drop(graph);
        assert!(object.release(2).is_err(), "releasing more than user code owns");
        object.release(1).unwrap();
        assert!(object.is_alive(), "the executable graph still holds it");
        assert_eq!(RUNS.load(Ordering::SeqCst), 0);
        drop(exec);
        wait_for_runs(1);
        assert!(!object.is_alive());
        assert!(object.retain(1).is_err(), "a destroyed object cannot be retained");
    }
}
