//! The simulator's process-wide state, created by the first `cuInit`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cuda_mem_sys::types::CUresult;

use crate::config::Config;
use crate::context::Context;
use crate::device::DeviceState;
use crate::error::SimResult;
use crate::event::Event;
use crate::memory::MemoryTable;
use crate::pool::{Observed, Pool};
use crate::stream::{Fence, Stream};

/// Everything the simulated driver knows.
pub(crate) struct State {
    /// The simulated machine.
    pub config: Config,
    /// Per-device bookkeeping, by this process's ordinal (as every per-device table here).
    pub devices: Vec<DeviceState>,
    /// Primary context of each device, when active.
    pub primary: Vec<Option<Arc<Context>>>,
    /// Retain count of each device's primary context (kept across a reset).
    pub primary_retains: Vec<u32>,
    /// Flags set with `cuDevicePrimaryCtxSetFlags`, per device.
    pub primary_flags: Vec<u32>,
    /// Live contexts by handle.
    pub contexts: HashMap<usize, Arc<Context>>,
    /// Live created streams by handle.
    pub streams: HashMap<usize, Arc<Stream>>,
    /// Live events by handle.
    pub events: HashMap<usize, Arc<Event>>,
    /// Live allocations.
    pub memory: MemoryTable,
    /// Physical VMM allocations by handle.
    pub physicals: HashMap<u64, PhysicalEntry>,
    /// Captured graphs by handle.
    pub graphs: HashMap<usize, Arc<crate::graph::Body>>,
    /// Executable graphs by handle.
    pub execs: HashMap<usize, Arc<crate::graph::Exec>>,
    /// The user object references each graph holds (a graph still being captured too), by
    /// graph handle.
    pub graph_user_objects: HashMap<usize, crate::user_object::Held>,
    /// User objects by handle (an entry whose object was destroyed stays until the next
    /// `cuUserObjectCreate` sweeps it, so that a stale handle is refused).
    pub user_objects: HashMap<usize, Arc<crate::user_object::UserObject>>,
    /// Each device's graph memory counters.
    pub graph_memory: Vec<Arc<crate::graph::GraphMemory>>,
    /// Live pools by handle.
    pub pools: HashMap<usize, Arc<Pool>>,
    /// Each device's current pool (the one `cuMemAllocAsync` uses).
    pub current_pool: Vec<usize>,
    /// Each device's default pool.
    pub default_pool: Vec<usize>,
    /// Default pools of other kinds (`cuMemGetDefaultMemPool`), keyed by location and kind
    /// (managed or not), created on first use.
    pub other_pools: HashMap<(crate::pool::LocationKey, bool), usize>,
    /// Current pools of other kinds set with `cuMemSetMemPool`, keyed as `other_pools`; a
    /// location and kind not here has its default pool as its current one.
    pub other_current_pools: HashMap<(crate::pool::LocationKey, bool), usize>,
    /// Per device, the handle values of destroyed pools that are gone, each with the peer
    /// access the pool still had, for the next pools created there to reuse
    /// (`CUDA_SIM_POOL_HANDLES=recycle`: the driver's nvbug 5698116, modelled so that code
    /// working around it is tested).
    pub recyclable_pools: HashMap<usize, Vec<(usize, PeerAccess)>>,
    /// Per device, the fences after the work destroyed contexts left pending on their queues:
    /// it still runs, and `cuCtxSynchronize` of any context of the device waits for it (the
    /// device has not finished it). Pruned as it completes.
    pub orphaned_work: Vec<Vec<Fence>>,
    /// How many `cuMemAddressReserve` calls gave a hint (`CUDA_SIM_ADDRESS_HINTS` refuses by
    /// this count).
    pub address_hints_seen: u64,
}

/// A pool's access granted to devices other than its owner (device -> flags).
pub(crate) type PeerAccess = std::collections::BTreeMap<usize, cuda_mem_sys::types::CUmemAccess_flags>;

/// A physical VMM allocation and what refers to it.
pub(crate) struct PhysicalEntry {
    /// The allocation.
    pub physical: Arc<crate::vmm::Physical>,
    /// Handles the application holds (`cuMemCreate`, `cuMemImportFromShareableHandle`,
    /// `cuMemRetainAllocationHandle`, each undone by `cuMemRelease`).
    pub user_refs: u32,
    /// Mappings of it.
    pub maps: u32,
    /// Whether it was imported (its memory is charged to the exporting process).
    pub imported: bool,
}

impl State {
    /// The work destroyed contexts of `device` left that has not completed yet (see
    /// [`orphaned_work`](State::orphaned_work)).
    pub(crate) fn pending_orphaned_work(&mut self, device: usize) -> Vec<Fence> {
        let Some(fences) = self.orphaned_work.get_mut(device) else {
            return Vec::new();
        };
        fences.retain(|fence| !fence.is_reached());
        fences.clone()
    }

    /// The host has observed the progress of the work `observed`: its frees no longer count as outstanding in any pool (see [`crate::pool::PoolState::observe`]).
    pub(crate) fn observe(&mut self, observed: &[Observed]) {
        if observed.is_empty() {
            return;
        }
        for pool in self.pools.values() {
            let mut pool = pool.lock();
            if !pool.unobserved.is_empty() {
                for &seen in observed {
                    pool.observe(seen);
                }
            }
        }
    }

    /// Releases pool memory above each pool's threshold, as the driver does when the
    /// application synchronizes; `observed` is the work whose progress the synchronization
    /// showed the host, whose frees stop counting as outstanding first.
    pub(crate) fn release_pools_at_sync(&mut self, observed: &[Observed]) {
        self.observe(observed);
        for pool in self.pools.values() {
            let released = pool.lock().release_at_sync();
            if let Some(device) = pool.owner() {
                let used = &mut self.devices[device].used;
                *used = used.saturating_sub(released);
            }
        }
    }
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Initializes the simulator (idempotent), reading the configuration from the environment:
/// `CUDA_ERROR_INVALID_VALUE` for a bad `CUDA_SIM_*` setting, `CUDA_ERROR_NO_DEVICE` when
/// `CUDA_VISIBLE_DEVICES` leaves no device visible (nothing is kept: a later `cuInit` reads the
/// environment again).
pub(crate) fn init() -> SimResult {
    if STATE.get().is_some() {
        return Ok(());
    }
    let _guard = INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if STATE.get().is_some() {
        return Ok(());
    }
    let config = Config::from_env().map_err(|message| {
        eprintln!("cuda-sim: {message}");
        CUresult::CUDA_ERROR_INVALID_VALUE
    })?;
    if let Some(note) = &config.visible_note {
        eprintln!("cuda-sim: {note}");
    }
    // As the real driver does when CUDA_VISIBLE_DEVICES hides every GPU.
    if config.devices() == 0 {
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    let devices = config.devices();
    let defaults: Vec<Arc<Pool>> = (0..devices)
        .map(|d| Arc::new(Pool::new(crate::pool::Location::Device(d), crate::pool::PoolKind::Pinned, 0, 0, true)))
        .collect();
    let state = State {
        config,
        devices: (0..devices).map(|_| DeviceState::default()).collect(),
        primary: (0..devices).map(|_| None).collect(),
        primary_retains: vec![0; devices],
        primary_flags: vec![0; devices],
        contexts: HashMap::new(),
        streams: HashMap::new(),
        events: HashMap::new(),
        memory: MemoryTable::default(),
        current_pool: defaults.iter().map(|p| p.handle).collect(),
        default_pool: defaults.iter().map(|p| p.handle).collect(),
        pools: defaults.into_iter().map(|p| (p.handle, p)).collect(),
        other_pools: HashMap::new(),
        other_current_pools: HashMap::new(),
        graphs: HashMap::new(),
        execs: HashMap::new(),
        graph_user_objects: HashMap::new(),
        user_objects: HashMap::new(),
        graph_memory: (0..devices).map(|_| Arc::default()).collect(),
        physicals: HashMap::new(),
        recyclable_pools: HashMap::new(),
        orphaned_work: vec![Vec::new(); devices],
        address_hints_seen: 0,
    };
    let _ = STATE.set(Mutex::new(state));
    Ok(())
}

/// `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`, without taking the lock: for calls that read
/// only per-thread state (the current context), which the real driver answers without locking.
pub(crate) fn ensure_initialized() -> SimResult {
    STATE.get().map(|_| ()).ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)
}

/// The state, locked; `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
pub(crate) fn lock() -> SimResult<MutexGuard<'static, State>> {
    let state = STATE.get().ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)?;
    Ok(state.lock().unwrap_or_else(PoisonError::into_inner))
}
