//! User objects (`cuUserObjectCreate`, `cuUserObjectRetain`, `cuUserObjectRelease`) and the
//! references graphs hold to them (`cuGraphRetainUserObject`, `cuGraphReleaseUserObject`).
//! See [`crate::user_object`] for the model.

use std::ffi::c_void;
use std::sync::Arc;

use cuda_mem_sys::types::{CUgraph, CUhostFn, CUresult, CUuserObject};

use crate::error::{SimResult, ensure, fail, write_out};
use crate::state::{self, State};
use crate::user_object::{MAX_COUNT, UserObject};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, which `cuUserObjectCreate` requires.
const NO_DESTRUCTOR_SYNC: u32 = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const MOVE: u32 = 1;

/// A reference count a call may name: "nonzero and not larger than INT_MAX".
fn check_count(count: u32) -> SimResult {
    ensure(count != 0 && count <= MAX_COUNT)
}

/// `cuUserObjectCreate`: `flags` must be `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`; a null destructor
/// and an initial count of 0 (or above `INT_MAX`) are refused (see `conservative`). All
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn create(
    out: *mut CUuserObject,
    ptr: *mut c_void,
    destroy: CUhostFn,
    initial: u32,
    flags: u32,
) -> SimResult {
    let mut state = state::lock()?;
    ensure(!out.is_null() && flags == NO_DESTRUCTOR_SYNC)?;
    check_count(initial)?;
    let destroy = destroy.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    state.user_objects.retain(|_, object| object.is_alive());
    let handle = crate::handle::next();
    state.user_objects.insert(handle, UserObject::new(ptr, destroy, initial));
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle as CUuserObject) }
}

/// A user object with references left; an unknown or destroyed handle is
/// `CUDA_ERROR_INVALID_VALUE`.
fn find(state: &State, object: CUuserObject) -> SimResult<Arc<UserObject>> {
    match state.user_objects.get(&(object as usize)) {
        Some(found) if found.is_alive() => Ok(Arc::clone(found)),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuUserObjectRetain`.
pub(crate) fn retain(object: CUuserObject, count: u32) -> SimResult {
    check_count(count)?;
    let object = find(&*state::lock()?, object)?;
    object.retain(count)
}

/// `cuUserObjectRelease`: more than user code owns is `CUDA_ERROR_INVALID_VALUE` (see
/// `conservative`). The destructor runs on the destructor thread, after this returns.
pub(crate) fn release(object: CUuserObject, count: u32) -> SimResult {
    check_count(count)?;
    let object = find(&*state::lock()?, object)?;
    object.release(count)
}

/// Whether `graph` is a graph: a captured one not destroyed, or the graph of a capture under way
/// (`cuStreamGetCaptureInfo` gives its handle out before the capture ends).
fn is_graph(state: &State, graph: CUgraph) -> bool {
    let graph = graph as usize;
    state.graphs.contains_key(&graph)
        || state.streams.values().any(|s| s.capture.active_info().is_some_and(|(_, g)| g == graph))
}

/// `cuGraphRetainUserObject`: `count` new references owned by `graph`, or with
/// `CU_GRAPH_USER_OBJECT_MOVE` references moved from user code (more than it owns is
/// `CUDA_ERROR_INVALID_VALUE`, see `conservative`). Executable graphs instantiated later hold
/// references of their own.
pub(crate) fn graph_retain(graph: CUgraph, object: CUuserObject, count: u32, flags: u32) -> SimResult {
    check_count(count)?;
    ensure(flags & !MOVE == 0)?;
    let mut state = state::lock()?;
    ensure(is_graph(&state, graph))?;
    let found = find(&state, object)?;
    let held = state.graph_user_objects.entry(graph as usize).or_default();
    held.retain(object as usize, &found, count, flags & MOVE != 0)
}

/// `cuGraphReleaseUserObject`: releasing more references than `graph` holds is
/// `CUDA_ERROR_INVALID_VALUE` (see `conservative`).
pub(crate) fn graph_release(graph: CUgraph, object: CUuserObject, count: u32) -> SimResult {
    check_count(count)?;
    let mut state = state::lock()?;
    ensure(is_graph(&state, graph))?;
    find(&state, object)?;
    let held = state.graph_user_objects.get_mut(&(graph as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    held.release(object as usize, count)
}
