//! A process-wide map from UUIDs to live shared resources.
//!
//! Documented on [`Registry`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use uuid::Uuid;

use crate::error::{IpcError, Result};

/// A thread-safe map from UUIDs to weakly held resources: a process-wide map from UUIDs to live
/// shared resources.
///
/// A process that imports a pool registers it under the exporter's UUID (the first import of
/// each UUID; [`MappedMemoryResource::from_fd`](crate::MappedMemoryResource::from_fd) returns
/// it rather than importing the pool again); a [`BufferDescriptor`](crate::BufferDescriptor)
/// names that UUID, and code that imports buffers itself looks the pool up
/// ([`lookup`](crate::lookup)). An [`IpcChannel`](crate::IpcChannel) does not: it maps a peer's
/// buffers only through the pools that peer sent on it. The registry holds [`Weak`] references
/// only: it never keeps a resource alive, and an entry whose resource was dropped counts as
/// absent (and is pruned when met).
///
/// [`Registry::new`] is `const`, so a registry can be a `static`:
///
/// ```
/// use std::sync::Arc;
/// use cuda_mem_ipc::Registry;
///
/// struct ImportedPool { name: &'static str }
/// static POOLS: Registry<ImportedPool> = Registry::new();
///
/// let id = uuid::Uuid::new_v4();
/// let pool = POOLS.register(id, Arc::new(ImportedPool { name: "pool A" }));
/// assert_eq!(POOLS.get(id)?.name, "pool A");
/// drop(pool);
/// assert!(POOLS.get(id).is_err()); // gone with the last Arc
/// # Ok::<(), cuda_mem_ipc::IpcError>(())
/// ```
pub struct Registry<T> {
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    entries: BTreeMap<Uuid, Weak<T>>,
    /// Sweep out dead entries when a registration makes the map this large.
    sweep_at: usize,
}

const MIN_SWEEP: usize = 16;

impl<T> Inner<T> {
    fn sweep(&mut self) {
        self.entries.retain(|_, weak| weak.strong_count() > 0);
        self.sweep_at = (self.entries.len() * 2).max(MIN_SWEEP);
    }
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Registry<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        let live: Vec<&Uuid> = inner.entries.iter().filter(|(_, w)| w.strong_count() > 0).map(|(id, _)| id).collect();
        f.debug_struct("Registry").field("live", &live).finish()
    }
}

impl<T> Registry<T> {
    /// An empty registry.
    pub const fn new() -> Self {
        Registry { inner: Mutex::new(Inner { entries: BTreeMap::new(), sweep_at: MIN_SWEEP }) }
    }

    /// The map, even if a thread panicked while holding the lock: every operation leaves the map
    /// consistent at each step, so a panic cannot corrupt it.
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `resource` under `uuid`, unless a live resource is registered there already.
    ///
    /// Returns the registered resource: `resource` itself, or the one already there, in which
    /// case `resource` is dropped (after the registry's lock is released, so its `Drop` may use
    /// the registry). Of concurrent registrations of one UUID, exactly one wins and all get the
    /// same `Arc`.
    pub fn register(&self, uuid: Uuid, resource: Arc<T>) -> Arc<T> {
        let mut inner = self.lock();
        if let Some(existing) = inner.entries.get(&uuid).and_then(Weak::upgrade) {
            drop(inner);
            drop(resource);
            return existing;
        }
        inner.entries.insert(uuid, Arc::downgrade(&resource));
        if inner.entries.len() >= inner.sweep_at {
            inner.sweep();
        }
        resource
    }

    /// The live resource registered under `uuid`.
    ///
    /// # Errors
    ///
    /// - [`IpcError::UnknownResource`]: nothing is registered under `uuid`, or its resource has
    ///   been dropped (the dead entry is then removed).
    pub fn get(&self, uuid: Uuid) -> Result<Arc<T>> {
        let mut inner = self.lock();
        match inner.entries.get(&uuid).map(Weak::upgrade) {
            Some(Some(live)) => Ok(live),
            Some(None) => {
                inner.entries.remove(&uuid);
                Err(IpcError::UnknownResource(uuid))
            }
            None => Err(IpcError::UnknownResource(uuid)),
        }
    }

    /// Removes the entry for `uuid` and returns its resource, if it was still live.
    ///
    /// The resource itself lives on as long as other `Arc`s hold it; it is only no longer found.
    pub fn remove(&self, uuid: Uuid) -> Option<Arc<T>> {
        let removed = self.lock().entries.remove(&uuid);
        removed.and_then(|weak| weak.upgrade())
    }

    /// The number of live resources registered (dead entries are pruned first).
    pub fn len(&self) -> usize {
        let mut inner = self.lock();
        inner.sweep();
        inner.entries.len()
    }

    /// Whether no live resource is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn register_then_get() {
        let r = Registry::new();
        let a = r.register(id(1), Arc::new("a"));
        assert_eq!(*a, "a");
        assert!(Arc::ptr_eq(&r.get(id(1)).unwrap(), &a));
        assert_eq!(r.len(), 1);
        assert!(!r.is_empty());
    }

    #[test]
    fn a_miss_is_unknown_resource() {
        let r: Registry<u32> = Registry::new();
        match r.get(id(42)) {
            Err(IpcError::UnknownResource(u)) => assert_eq!(u, id(42)),
            other => panic!("expected UnknownResource, got {other:?}"),
        }
        assert!(r.is_empty());
    }

    #[test]
    fn entries_go_with_their_resource() {
        let r = Registry::new();
        let a = r.register(id(1), Arc::new(1));
        let b = r.register(id(2), Arc::new(2));
        assert_eq!(r.len(), 2);
        drop(a);
        assert_eq!(r.len(), 1);
        assert!(matches!(r.get(id(1)), Err(IpcError::UnknownResource(_))));
        assert_eq!(*r.get(id(2)).unwrap(), 2);
        drop(b);
        assert!(r.is_empty());
    }

    #[test]
    fn the_registry_does_not_keep_resources_alive() {
        let r = Registry::new();
        let a = Arc::new(7);
        let weak = Arc::downgrade(&a);
        let _ = r.register(id(1), a);
        assert!(weak.upgrade().is_none(), "dropped with its last Arc");
    }

    #[test]
    fn registering_a_live_uuid_returns_the_existing_resource() {
        let r = Registry::new();
        let first = r.register(id(1), Arc::new(String::from("first")));
        let second = Arc::new(String::from("second"));
        let weak_second = Arc::downgrade(&second);
        let got = r.register(id(1), second);
        assert!(Arc::ptr_eq(&got, &first));
        assert!(weak_second.upgrade().is_none(), "the newcomer was dropped");
    }

    #[test]
    fn a_dead_entry_is_replaced() {
        let r = Registry::new();
        drop(r.register(id(1), Arc::new(1)));
        let fresh = r.register(id(1), Arc::new(2));
        assert_eq!(*fresh, 2);
        assert!(Arc::ptr_eq(&r.get(id(1)).unwrap(), &fresh));
    }

    #[test]
    fn remove_forgets_but_does_not_drop() {
        let r = Registry::new();
        let a = r.register(id(1), Arc::new(5));
        let removed = r.remove(id(1)).unwrap();
        assert!(Arc::ptr_eq(&removed, &a));
        assert!(r.get(id(1)).is_err());
        assert!(r.remove(id(1)).is_none());
        drop(a);
        drop(r.register(id(2), Arc::new(6)));
        assert!(r.remove(id(2)).is_none(), "dead: nothing to return");
    }

    #[test]
    fn dead_entries_do_not_accumulate() {
        let r = Registry::new();
        let keep = r.register(id(0), Arc::new(0));
        for n in 1..10_000 {
            drop(r.register(id(n), Arc::new(n)));
        }
        let stored = r.lock().entries.len();
        assert!(stored <= 2 * MIN_SWEEP, "{stored} entries stored for 1 live");
        assert_eq!(r.len(), 1);
        drop(keep);
    }

    #[test]
    fn drop_of_a_losing_newcomer_may_use_the_registry() {
        static R: Registry<Reentrant> = Registry::new();
        struct Reentrant(Uuid);
        impl Drop for Reentrant {
            fn drop(&mut self) {
                // Would deadlock if dropped under the registry's lock.
                let _ = R.get(self.0);
                let _ = R.remove(self.0);
            }
        }
        let u = Uuid::new_v4();
        let first = R.register(u, Arc::new(Reentrant(u)));
        let got = R.register(u, Arc::new(Reentrant(u)));
        assert!(Arc::ptr_eq(&got, &first));
    }

    #[test]
    fn concurrent_registration_yields_one_shared_arc() {
        const THREADS: usize = 8;
        static CREATED: AtomicUsize = AtomicUsize::new(0);
        static DROPPED: AtomicUsize = AtomicUsize::new(0);
        struct Counted;
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPPED.fetch_add(1, Ordering::SeqCst);
            }
        }
        for round in 0..50u128 {
            let r = Registry::new();
            let barrier = Barrier::new(THREADS);
            let winners: Vec<Arc<Counted>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|_| {
                        s.spawn(|| {
                            CREATED.fetch_add(1, Ordering::SeqCst);
                            let mine = Arc::new(Counted);
                            barrier.wait();
                            r.register(id(round + 1), mine)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(
                winners.iter().all(|w| Arc::ptr_eq(w, &winners[0])),
                "round {round}: every thread got the same Arc"
            );
            assert_eq!(Arc::strong_count(&winners[0]), THREADS);
            assert!(Arc::ptr_eq(&r.get(id(round + 1)).unwrap(), &winners[0]));
            drop(winners);
            assert_eq!(
                CREATED.load(Ordering::SeqCst),
                DROPPED.load(Ordering::SeqCst),
                "every resource was dropped exactly once"
            );
        }
    }

    #[test]
    fn usable_as_a_static() {
        static R: Registry<u8> = Registry::new();
        let v = R.register(Uuid::new_v4(), Arc::new(3));
        assert_eq!(*v, 3);
        assert!(format!("{R:?}").contains("live"));
    }
}
