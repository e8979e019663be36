//! The driver side of sharing pools between processes, on every platform: exporting single
//! allocations, and which pool handles this process owns (a driver may answer a second import
//! of one pool with the handle of the first, and a second owner of it would destroy it under the
//! first). The pool's shareable file descriptor, and importing a pool from one, are in
//! [`shareable`](super::shareable) (Unix only). `cuda-mem-ipc` builds descriptors and the
//! fd-passing channel on top.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUmemPoolPtrExportData, CUmemoryPool};

use super::{EXPORT_DATA_LEN, MemoryPool, bind_for, imports};
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::error::{Error, Result, SharingError};

/// The handles of the pools this process owns (created or imported), each with how many values
/// claim it (one: creations, imports and destructions take [`handle_turnover`]; the count is
/// kept for a pool a future path might claim outside it).
static OWNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// Held across each change of which pool a handle names: a creation or an import (the driver's
/// call, then the claim) and a destruction (the driver's call, then the claim let go). A driver
/// may hand a destroyed pool's handle to the next pool at once (a handle is an address it
/// reuses), so without it an import could get the handle of a pool still being dropped on
/// another thread, find it claimed, and be refused as a pool this process owns (the new pool
/// then never destroyed); or claim a handle whose pool is destroyed right after.
static TURNOVER: Mutex<()> = Mutex::new(());

/// Takes [`TURNOVER`]. Held only across the driver's call and the claim: never while a pool
/// drops (whose `Drop` takes it) or any other lock of this crate is taken after it but
/// [`owned`]'s and the imports' table's.
pub(super) fn handle_turnover() -> MutexGuard<'static, ()> {
    // Nothing is left half-done under it by a panic elsewhere: the guarded state is the driver's.
    TURNOVER.lock().unwrap_or_else(PoisonError::into_inner)
}

fn owned() -> MutexGuard<'static, BTreeMap<usize, usize>> {
    // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An owned pool's claim on its handle, let go (after the pool is destroyed) when dropped.
#[derive(Debug)]
pub(super) struct HandleClaim {
    handle: usize,
}

impl HandleClaim {
    /// Claims the handle of a pool just created.
    pub(super) fn created(handle: CUmemoryPool) -> HandleClaim {
        *owned().entry(handle as usize).or_insert(0) += 1;
        HandleClaim { handle: handle as usize }
    }

    /// Claims the handle an import returned, unless this process owns that pool already.
    #[cfg(unix)]
    pub(super) fn imported(handle: CUmemoryPool) -> Option<HandleClaim> {
        let mut owned = owned();
        if owned.contains_key(&(handle as usize)) {
            return None;
        }
        owned.insert(handle as usize, 1);
        Some(HandleClaim { handle: handle as usize })
    }
}

impl Drop for HandleClaim {
    fn drop(&mut self) {
        {
            let mut owned = owned();
            if let Some(count) = owned.get_mut(&self.handle) {
                *count -= 1;
                if *count == 0 {
                    owned.remove(&self.handle);
                }
            }
        }
        // Imports through a destroyed pool are gone with it (a release that failed left them).
        imports::forget_pool(self.handle);
    }
}

impl MemoryPool {
    /// Whether the pool was created shareable by file descriptor (`ipc_enabled`), or imported.
    pub fn is_shareable(&self) -> bool {
        self.shareable || self.imported
    }

    /// Whether the pool was imported from another process (a "mapped" pool: it cannot
    /// allocate; it maps allocations another process exports).
    #[doc(alias = "is_mapped")]
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// The driver's export data for the allocation that starts at `ptr`. For a pool imported
    /// from another process, the data the allocation was imported with, so it can be passed on
    /// (A→B→C).
    ///
    /// # Errors
    /// - [`SharingError::NotAnImport`] for an imported pool when `ptr` is not an allocation this
    ///   process imported through it.
    /// - Driver errors when `ptr` is not an allocation of a shareable pool.
    #[doc(alias = "ipc_descriptor")]
    pub fn export_pointer(&self, ptr: DevicePtr) -> Result<[u8; EXPORT_DATA_LEN]> {
        if self.imported {
            return imports::export_data_of(self, ptr).ok_or(Error::Sharing(SharingError::NotAnImport { ptr }));
        }
        bind_for(self.owner())?;
        let d = driver()?;
        let mut data = CUmemPoolPtrExportData::default();
        // SAFETY: `data` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, ptr)) }?;
        crate::memory_event!(DEBUG, ptr = %hex(ptr), pool = %hex(self.handle()), "allocation exported");
        Ok(data.reserved)
    }
}

#[cfg(all(test, unix, feature = "tracing"))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use crate::{DeviceMemoryResource, DeviceMemoryResourceOptions, MemoryPool, Stream, StreamOptions};

    /// A subscriber that, at the event "pool destroyed", says so and waits for a go (or a
    /// time-out): a pool's drop held there, right after the driver destroyed it.
    struct PauseAtDestroy {
        paused: mpsc::SyncSender<()>,
        go: std::sync::Mutex<mpsc::Receiver<()>>,
    }

    /// Whether an event's message is "pool destroyed".
    struct IsDestroyed(bool);

    impl Visit for IsDestroyed {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" && format!("{value:?}") == "pool destroyed" {
                self.0 = true;
            }
        }
    }

    impl Subscriber for PauseAtDestroy {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }

        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }

        fn record(&self, _: &Id, _: &Record<'_>) {}

        fn record_follows_from(&self, _: &Id, _: &Id) {}

        fn event(&self, event: &Event<'_>) {
            let mut destroyed = IsDestroyed(false);
            event.record(&mut destroyed);
            if destroyed.0 {
                let _ = self.paused.send(());
                let go = self.go.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let _ = go.recv_timeout(Duration::from_secs(2));
            }
        }

        fn enter(&self, _: &Id) {}

        fn exit(&self, _: &Id) {}
    }

    /// The driver may give a destroyed pool's handle to the next pool at once
    /// (`CUDA_SIM_POOL_HANDLES=recycle`): an import made while a pool's drop is held right after
    /// its destruction gets that handle, and must own it, not find it claimed by the pool being
    /// dropped (refused as `PoolAlreadyOwned`, the imported pool never destroyed).
    #[test]
    fn an_import_given_the_handle_of_a_pool_being_dropped_owns_it() {
        let name = "pool::sharing::tests::an_import_given_the_handle_of_a_pool_being_dropped_owns_it";
        cuda_sim::testing::in_simulated_machine(name, &[("CUDA_SIM_POOL_HANDLES", "recycle")], || {
            if !cuda_sim::testing::simulator_only("recycled pool handles") {
                return;
            }
            cuda_sim::testing::driver().expect("the test driver loads");
            let device = crate::Device::new(0).unwrap();
            let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
            let exporter =
                DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
            drop(exporter.allocate(64, &stream).unwrap());
            let shared = exporter.pool().shareable_handle().unwrap();
            let doomed = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
            let doomed_handle = doomed.pool().handle() as usize;

            let (paused_tx, paused) = mpsc::sync_channel(1);
            let (go, go_rx) = mpsc::sync_channel(1);
            let subscriber = PauseAtDestroy { paused: paused_tx, go: std::sync::Mutex::new(go_rx) };
            std::thread::scope(|scope| {
                let dropping = scope.spawn(move || tracing::subscriber::with_default(subscriber, || drop(doomed)));
                paused.recv_timeout(Duration::from_secs(5)).expect("the drop reaches the destruction");
                let (done_tx, done) = mpsc::sync_channel(1);
                let importing = scope.spawn(move || {
                    let imported = MemoryPool::import(shared.try_clone_fd().unwrap(), shared.id());
                    let _ = done_tx.send(());
                    imported
                });
                // The import may wait for the drop to finish; let it finish after a while.
                let _ = done.recv_timeout(Duration::from_millis(300));
                let _ = go.send(());
                dropping.join().unwrap();
                let imported = importing.join().unwrap();
                let imported = imported.unwrap_or_else(|e| panic!("the import owns the recycled handle: {e}"));
                assert_eq!(imported.handle() as usize, doomed_handle, "the driver recycled the handle");
            });
        });
    }
}
