//! Graphs (`cuGraphInstantiate*`, `cuGraphLaunch`, `cuGraphUpload`, `cuGraphExecDestroy`,
//! `cuGraphDestroy`), the capture's graph (`cuStreamGetCaptureInfo`), and graph memory
//! (`cuDeviceGetGraphMemAttribute`, `cuDeviceSetGraphMemAttribute`, `cuDeviceGraphMemTrim`).
//! See [`crate::graph`] for the model.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cuda_mem_sys::types::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphInstantiateResult,
    CUgraphMem_attribute, CUgraphNode, CUresult, CUstream, CUstreamCaptureStatus,
};

use super::DefaultStream;
use super::stream::{resolve, resolve_for_work};
use crate::capture;
use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::graph::{Exec, Node, Step, charge, run_steps};
use crate::memory::Touch;
use crate::state::{self, State};
use crate::user_object::Held;

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
const AUTO_FREE_ON_LAUNCH: u64 = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`.
const UPLOAD: u64 = 2;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`.
const DEVICE_LAUNCH: u64 = 4;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`.
const USE_NODE_PRIORITY: u64 = 8;

/// `cuGraphDestroy`: the graph's live allocations stay live (graph destruction "does not
/// automatically free any live graph-allocated memory"); its executable graphs keep working,
/// and the user object references it held are released.
/// A graph still being captured is not in the table yet: `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn destroy(graph: CUgraph) -> SimResult {
    let mut state = state::lock()?;
    state.graphs.remove(&(graph as usize)).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    state.graph_user_objects.remove(&(graph as usize));
    Ok(())
}

/// Checks instantiation flags and the graph, and makes the executable graph. `UPLOAD` is only
/// for `cuGraphInstantiateWithParams` (`with_params`); `DEVICE_LAUNCH` cannot go with
/// `AUTO_FREE_ON_LAUNCH`, nor with allocation, free or event nodes (a device-launched graph may
/// hold only kernel, memcpy, memset and child graph nodes); a graph with allocation or free
/// nodes has one executable graph at a time. All of these are `CUDA_ERROR_INVALID_VALUE`.
fn instantiate_in(state: &mut State, graph: CUgraph, flags: u64, with_params: bool) -> SimResult<usize> {
    let known = AUTO_FREE_ON_LAUNCH | DEVICE_LAUNCH | USE_NODE_PRIORITY | if with_params { UPLOAD } else { 0 };
    ensure(flags & !known == 0)?;
    let device_launch = flags & DEVICE_LAUNCH != 0;
    ensure(!(device_launch && flags & AUTO_FREE_ON_LAUNCH != 0))?;
    let body = state.graphs.get(&(graph as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if device_launch {
        ensure(body.nodes.iter().all(|node| matches!(node, Node::Work { .. })))?;
    }
    if body.has_memory_nodes() && body.instantiated.swap(true, Ordering::SeqCst) {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let handle = crate::handle::next();
    let user_objects =
        Arc::new(state.graph_user_objects.get(&(graph as usize)).map(Held::duplicate).unwrap_or_default());
    let exec = Arc::new(Exec { body, flags, last_launch: Mutex::new(None), user_objects });
    state.execs.insert(handle, exec);
    Ok(handle)
}

/// `cuGraphInstantiateWithFlags` (what `cuda.h` 13.0 maps `cuGraphInstantiate` to).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn instantiate(out: *mut CUgraphExec, graph: CUgraph, flags: u64) -> SimResult {
    ensure(!out.is_null())?;
    let handle = instantiate_in(&mut *state::lock()?, graph, flags, false)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle as CUgraphExec) }
}

/// `cuGraphInstantiateWithParams`: as [`instantiate`], with `result_out` and `hErrNode_out`
/// filled in (`CUDA_GRAPH_INSTANTIATE_ERROR` with the error returned, no error node); with
/// `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD` the graph is uploaded to `hUploadStream`.
///
/// # Safety
/// `out` is null or valid for a write; `params` is null or valid for a read and a write.
pub(crate) unsafe fn instantiate_with_params(
    out: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
    mode: DefaultStream,
) -> SimResult {
    ensure(!out.is_null() && !params.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let mut given = unsafe { params.read_unaligned() };
    let result = (|| {
        let mut state = state::lock()?;
        if given.flags & UPLOAD != 0 {
            resolve_for_work(&state, given.hUploadStream, mode)?;
        }
        instantiate_in(&mut state, graph, given.flags, true)
    })();
    given.hErrNode_out = std::ptr::null_mut::<std::ffi::c_void>() as CUgraphNode;
    given.result_out = if result.is_ok() {
        CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS
    } else {
        CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR
    };
    // SAFETY: valid for a write by the caller's contract.
    unsafe { params.write_unaligned(given) };
    let handle = result?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, handle as CUgraphExec) }
}

/// `cuGraphExecDestroy`: a launch still in flight completes (it holds the nodes, and the user
/// object references, which are released when the last launch completes).
pub(crate) fn exec_destroy(exec: CUgraphExec) -> SimResult {
    state::lock()?.execs.remove(&(exec as usize)).map(drop).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// A live executable graph; an unknown or destroyed handle is `CUDA_ERROR_INVALID_VALUE`.
fn find_exec(state: &State, exec: CUgraphExec) -> SimResult<Arc<Exec>> {
    state.execs.get(&(exec as usize)).cloned().ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// `cuGraphUpload`: checks the graph and the stream; there is nothing to upload to a simulated
/// device.
pub(crate) fn upload(exec: CUgraphExec, stream: CUstream, mode: DefaultStream) -> SimResult {
    let state = state::lock()?;
    find_exec(&state, exec)?;
    let (_, stream) = resolve_for_work(&state, stream, mode)?;
    refuse_capturing(&stream)
}

/// Launching or uploading into a capturing stream is refused (see `conservative`).
fn refuse_capturing(stream: &crate::stream::Stream) -> SimResult {
    if stream.capture.is_under_way() { fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) } else { Ok(()) }
}

/// `cuGraphLaunch`: replays the graph's nodes in order as one piece of work on `stream`, after
/// the previous launch of the same executable graph. Graph memory is mapped at the call (the
/// addresses are live for the calls that follow), and counted as used until its free is
/// reached. An allocation still live from a previous launch is `CUDA_ERROR_INVALID_VALUE`,
/// unless the graph was instantiated with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`
/// (then it is freed first, as by `cuMemFreeAsync`), and so is a free node for another graph's
/// allocation that is not live; nothing happens then.
pub(crate) fn launch(exec: CUgraphExec, stream: CUstream, mode: DefaultStream) -> SimResult {
    let mut state = state::lock()?;
    let exec = find_exec(&state, exec)?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    refuse_capturing(&stream)?;
    let body = Arc::clone(&exec.body);
    let user_objects = Arc::clone(&exec.user_objects);
    let auto_free = exec.flags & AUTO_FREE_ON_LAUNCH != 0;
    // Everything is checked before anything changes.
    let mut still_live = Vec::new();
    let mut charges: BTreeMap<usize, u64> = BTreeMap::new();
    for node in &body.nodes {
        match node {
            Node::Alloc(alloc) => {
                if state.memory.is_graph_mapped(alloc.base) {
                    ensure(auto_free)?;
                    still_live.push(Arc::clone(alloc));
                }
                *charges.entry(alloc.device).or_default() += charge(alloc.size);
            }
            Node::Free { base, own: false, .. } => ensure(state.memory.is_graph_mapped(*base))?,
            _ => {}
        }
    }
    let mut steps = Vec::new();
    for alloc in &still_live {
        state.memory.unmap_graph(alloc.base);
        steps.push(Step::Release(Arc::clone(&state.graph_memory[alloc.device]), charge(alloc.size)));
    }
    charge_devices(&mut state, &charges)?;
    for (index, node) in body.nodes.iter().enumerate() {
        match node {
            Node::Work { touches, .. } => {
                let mapped = touches.iter().all(|touch| is_still_mapped(&state, &body, touch));
                steps.push(if mapped { Step::Work(index) } else { Step::Fault(Arc::clone(&context.fault)) });
            }
            Node::Record(event) => steps.push(Step::Complete(Arc::clone(event), event.begin_record())),
            Node::Alloc(alloc) => {
                if !alloc.is_freed_in_graph() {
                    state.memory.map_graph(alloc);
                }
            }
            Node::Free { base, size, device, own } => {
                if !own {
                    state.memory.unmap_graph(*base);
                }
                steps.push(Step::Release(Arc::clone(&state.graph_memory[*device]), charge(*size)));
            }
        }
    }
    drop(state);
    let mut last = exec.last_launch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let previous = last.take();
    let fence = context.submit(
        &stream,
        Box::new(move || {
            if let Some(previous) = &previous {
                previous.wait();
            }
            run_steps(&body, &steps);
            // The executable graph's user objects live until its launches complete (this work
            // is dropped once it has run).
            let _ = &user_objects;
        }),
    );
    *last = Some(fence);
    Ok(())
}

/// Whether the memory a captured operation touches is still what it was at capture time: an
/// allocation of the graph itself (mapped by the launch), or the same live memory (the same
/// allocation, or a VMM range still mapped).
fn is_still_mapped(state: &State, body: &crate::graph::Body, touch: &Touch) -> bool {
    let own = body.nodes.iter().any(|node| {
        matches!(node, Node::Alloc(alloc) if (alloc.base..alloc.base + alloc.size as u64).contains(&touch.address))
    });
    own || state.memory.classify(touch.address, touch.len).is_ok_and(|now| now.is_same_memory(&touch.endpoint))
}

/// Counts a launch's graph memory as used on each device, growing the reserve (and the device's
/// memory in use) as needed; `CUDA_ERROR_OUT_OF_MEMORY`, with nothing changed, if a device has
/// too little left.
fn charge_devices(state: &mut State, charges: &BTreeMap<usize, u64>) -> SimResult {
    for (&device, &bytes) in charges {
        let available = state.config.memory.saturating_sub(state.devices[device].used);
        ensure_memory(state.graph_memory[device].growth_for(bytes).is_some_and(|growth| growth <= available))?;
    }
    for (&device, &bytes) in charges {
        let growth = state.graph_memory[device].use_bytes(bytes, u64::MAX).unwrap_or(0);
        state.devices[device].used += growth;
    }
    Ok(())
}

/// `CUDA_ERROR_OUT_OF_MEMORY` unless `fits`.
fn ensure_memory(fits: bool) -> SimResult {
    if fits { Ok(()) } else { fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY) }
}

/// `cuStreamGetCaptureInfo_v3`: the status (required), and while a capture is active its id and
/// graph; the dependencies are always none (captures here are a chain the simulator does not
/// expose as nodes). Edge data without dependencies is `CUDA_ERROR_INVALID_VALUE`; on the legacy
/// stream while a blocking stream captures, `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`.
///
/// # Safety
/// Each pointer is null or valid for a write.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn capture_info(
    stream: CUstream,
    status_out: *mut CUstreamCaptureStatus,
    id_out: *mut u64,
    graph_out: *mut CUgraph,
    dependencies_out: *mut *const CUgraphNode,
    edges_out: *mut *const CUgraphEdgeData,
    count_out: *mut usize,
    mode: DefaultStream,
) -> SimResult {
    ensure(!status_out.is_null() && (edges_out.is_null() || !dependencies_out.is_null()))?;
    let (context, stream) = resolve(&*state::lock()?, stream, mode)?;
    capture::refuse_legacy_status(&context, &stream)?;
    let status = stream.capture.status();
    let info = stream.capture.active_info();
    // SAFETY: forwarded from the caller; the optional pointers are written only when non-null.
    unsafe {
        write_out(status_out, status)?;
        let Some((id, graph)) = info else {
            return Ok(());
        };
        if !id_out.is_null() {
            write_out(id_out, id as u64)?;
        }
        if !graph_out.is_null() {
            write_out(graph_out, graph as CUgraph)?;
        }
        if !dependencies_out.is_null() {
            write_out(dependencies_out, std::ptr::null())?;
        }
        if !edges_out.is_null() {
            write_out(edges_out, std::ptr::null())?;
        }
        if !count_out.is_null() {
            write_out(count_out, 0)?;
        }
    }
    Ok(())
}

/// `cuDeviceGetGraphMemAttribute`: each attribute is a `cuuint64_t`.
///
/// # Safety
/// `value` is null or valid for a write of a `cuuint64_t`.
pub(crate) unsafe fn get_mem_attribute(device: i32, attribute: CUgraphMem_attribute, value: *mut c_void) -> SimResult {
    use CUgraphMem_attribute as A;
    let state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    ensure(!value.is_null())?;
    let counters = state.graph_memory[device].read();
    let v = match attribute {
        A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT => counters.used,
        A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => counters.used_high,
        A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT => counters.reserved,
        A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => counters.reserved_high,
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_out(value.cast::<u64>(), v) }
}

/// `cuDeviceSetGraphMemAttribute`: only the two high-water marks, and only to 0 ("High
/// watermark can only be reset to zero"), which resets them to the current value; anything else
/// is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `value` is null or valid for a read of a `cuuint64_t`.
pub(crate) unsafe fn set_mem_attribute(device: i32, attribute: CUgraphMem_attribute, value: *mut c_void) -> SimResult {
    use CUgraphMem_attribute as A;
    let state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    ensure(!value.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let v = unsafe { value.cast::<u64>().read_unaligned() };
    ensure(v == 0)?;
    let reserved = match attribute {
        A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH => false,
        A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => true,
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    state.graph_memory[device].reset_high(reserved);
    Ok(())
}

/// `cuDeviceGraphMemTrim`: the reserve not in use goes back to the device.
pub(crate) fn trim(device: i32) -> SimResult {
    let mut state = state::lock()?;
    let device = check_ordinal(&state.config, device)?;
    let released = state.graph_memory[device].trim();
    let used = &mut state.devices[device].used;
    *used = used.saturating_sub(released);
    Ok(())
}
