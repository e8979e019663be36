//! The simulator's process-wide state, created by the first `cuInit`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cuda_sys::types::CUresult;

use crate::config::Config;
use crate::context::Context;
use crate::device::DeviceState;
use crate::error::SimResult;
use crate::event::Event;
use crate::memory::MemoryTable;
use crate::stream::Stream;

/// Everything the simulated driver knows.
pub(crate) struct State {
    /// The simulated machine.
    pub config: Config,
    /// Per-device bookkeeping.
    pub devices: Vec<DeviceState>,
    /// Primary context of each device, with its retain count, when active.
    pub primary: Vec<Option<(Arc<Context>, u32)>>,
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
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// Initializes the simulator (idempotent), reading the configuration from the environment.
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
    let devices = config.devices;
    let state = State {
        config,
        devices: (0..devices).map(|_| DeviceState::default()).collect(),
        primary: (0..devices).map(|_| None).collect(),
        primary_flags: vec![0; devices],
        contexts: HashMap::new(),
        streams: HashMap::new(),
        events: HashMap::new(),
        memory: MemoryTable::default(),
    };
    let _ = STATE.set(Mutex::new(state));
    Ok(())
}

/// The state, locked; `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`.
pub(crate) fn lock() -> SimResult<MutexGuard<'static, State>> {
    let state = STATE.get().ok_or(CUresult::CUDA_ERROR_NOT_INITIALIZED)?;
    Ok(state.lock().unwrap_or_else(PoisonError::into_inner))
}
