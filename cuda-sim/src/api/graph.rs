//! Graphs (`cuGraphInstantiate*`, `cuGraphLaunch`, `cuGraphUpload`, `cuGraphExecDestroy`,
//! `cuGraphDestroy`), their nodes (`cuGraphGetNodes`, `cuGraphNodeGetType`,
//! `cuGraphNodeGetDependencies`), the capture's graph and dependencies
//! (`cuStreamGetCaptureInfo`, `cuStreamUpdateCaptureDependencies`), and graph memory
//! (`cuDeviceGetGraphMemAttribute`, `cuDeviceSetGraphMemAttribute`, `cuDeviceGraphMemTrim`).
//! See [`crate::graph`] for the model.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cuda_mem_sys::types::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphInstantiateResult,
    CUgraphMem_attribute, CUgraphNode, CUgraphNodeType, CUresult, CUstream, CUstreamCaptureStatus,
};

use super::DefaultStream;
use super::stream::{resolve, resolve_for_work};
use crate::capture::{self, Update};
use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::graph::{Body, Exec, Listed, Node, Step, run_steps};
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
/// addresses are live for the calls that follow), and counted as used while associated with
/// the graph (see [`crate::graph`]). An allocation still live from a previous launch is `CUDA_ERROR_INVALID_VALUE`,
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
    let mut charges: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
    for node in &body.nodes {
        match node {
            Node::Alloc(alloc) => {
                if state.memory.is_graph_mapped(alloc.base) {
                    ensure(auto_free)?;
                    still_live.push(Arc::clone(alloc));
                }
                charges.entry(alloc.device).or_default().push((alloc.base, alloc.charge()));
            }
            Node::Free { base, own: false, .. } => ensure(state.memory.is_graph_mapped(*base))?,
            _ => {}
        }
    }
    charge_devices(&mut state, &charges)?;
    let mut steps = Vec::new();
    for alloc in &still_live {
        state.memory.unmap_graph(alloc.base);
        steps.push(Step::Freed(Arc::clone(&alloc.memory), alloc.base));
    }
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
            Node::Free { base, device, own } => {
                if !own {
                    state.memory.unmap_graph(*base);
                }
                steps.push(Step::Freed(Arc::clone(&state.graph_memory[*device]), *base));
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

/// Maps a launch's graph allocations (address, bytes) on each device (see
/// [`GraphMemory::map_for_launch`](crate::graph::GraphMemory::map_for_launch)), growing the
/// reserve (and the device's memory in use) as needed; `CUDA_ERROR_OUT_OF_MEMORY`, with nothing
/// changed, if a device has too little left.
fn charge_devices(state: &mut State, charges: &BTreeMap<usize, Vec<(u64, u64)>>) -> SimResult {
    for (&device, allocs) in charges {
        let available = state.config.memory.saturating_sub(state.devices[device].used);
        ensure_memory(state.graph_memory[device].growth_for(allocs).is_some_and(|growth| growth <= available))?;
    }
    for (&device, allocs) in charges {
        let growth = state.graph_memory[device].map_for_launch(allocs, u64::MAX).unwrap_or(0);
        state.devices[device].used += growth;
    }
    Ok(())
}

/// `CUDA_ERROR_OUT_OF_MEMORY` unless `fits`.
fn ensure_memory(fits: bool) -> SimResult {
    if fits { Ok(()) } else { fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY) }
}

/// `cuStreamGetCaptureInfo_v3`: the status (required), and while a capture is active its id,
/// its graph and the stream's dependency set (the nodes the next captured node will depend on;
/// see [`crate::capture`]), its edge data all default. The array pointers stay valid until the
/// next such call on the stream or the end of the capture, as `cuda.h` says; they are null when
/// the set is empty. Edge data without dependencies is `CUDA_ERROR_INVALID_VALUE`; on the legacy
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
    let info = stream.capture.active_dependencies();
    // SAFETY: forwarded from the caller; the optional pointers are written only when non-null.
    unsafe {
        write_out(status_out, status)?;
        let Some((id, graph, dependencies)) = info else {
            return Ok(());
        };
        if !id_out.is_null() {
            write_out(id_out, id as u64)?;
        }
        if !graph_out.is_null() {
            write_out(graph_out, graph as CUgraph)?;
        }
        if !dependencies_out.is_null() {
            write_out(dependencies_out, dependencies.nodes.cast::<CUgraphNode>())?;
        }
        if !edges_out.is_null() {
            write_out(edges_out, dependencies.edges)?;
        }
        if !count_out.is_null() {
            write_out(count_out, dependencies.count)?;
        }
    }
    Ok(())
}

/// `CU_STREAM_SET_CAPTURE_DEPENDENCIES`, the one flag besides the default (add).
const SET_CAPTURE_DEPENDENCIES: u32 =
    cuda_mem_sys::types::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES.0;

/// `cuStreamUpdateCaptureDependencies_v2`: adds `count` nodes to the stream's dependency set
/// (`CU_STREAM_ADD_CAPTURE_DEPENDENCIES`, or 0) or replaces the set with them
/// (`CU_STREAM_SET_CAPTURE_DEPENDENCIES`). Other flags, a null array with a non-zero count, and
/// a node that is not a node of the capture's graph or is named twice are
/// `CUDA_ERROR_INVALID_VALUE`, and so is edge data other than the default (the simulator has no
/// kernel nodes, the only ones ports and programmatic edges are for; see `conservative`); a
/// stream that does not capture is `CUDA_ERROR_ILLEGAL_STATE`, one whose capture was invalidated
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`.
///
/// # Safety
/// `dependencies` is null or valid for reads of `count` handles; `data` null or valid for reads
/// of `count` edge data.
pub(crate) unsafe fn update_capture_dependencies(
    stream: CUstream,
    dependencies: *const CUgraphNode,
    data: *const CUgraphEdgeData,
    count: usize,
    flags: u32,
    mode: DefaultStream,
) -> SimResult {
    ensure(flags <= SET_CAPTURE_DEPENDENCIES)?;
    ensure(count == 0 || !dependencies.is_null())?;
    let nodes: Vec<usize> = if count == 0 {
        Vec::new()
    } else {
        // SAFETY: non-null and valid for `count` reads by the caller's contract.
        unsafe { std::slice::from_raw_parts(dependencies, count) }.iter().map(|&node| node as usize).collect()
    };
    if !data.is_null() && count > 0 {
        // SAFETY: non-null and valid for `count` reads by the caller's contract.
        let data = unsafe { std::slice::from_raw_parts(data, count) };
        ensure(data.iter().all(|edge| *edge == CUgraphEdgeData::default()))?;
    }
    let (_, stream) = resolve(&*state::lock()?, stream, mode)?;
    let update = if flags == SET_CAPTURE_DEPENDENCIES { Update::Set } else { Update::Add };
    stream.capture.update_dependencies(&nodes, update)
}

/// The nodes the graph API shows of `graph`: a graph captured, or the graph of a capture under
/// way; `CUDA_ERROR_INVALID_VALUE` for any other handle.
fn graph_nodes(state: &State, graph: CUgraph) -> SimResult<Vec<Listed>> {
    if let Some(body) = state.graphs.get(&(graph as usize)) {
        return Ok(body.listed.clone());
    }
    state
        .streams
        .values()
        .find_map(|stream| stream.capture.listed_of(graph as usize))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// The node `node` of any graph, captured or being captured; `CUDA_ERROR_INVALID_VALUE` when no
/// graph has it.
fn find_node(state: &State, node: CUgraphNode) -> SimResult<Listed> {
    let handle = node as usize;
    let in_body = |body: &Arc<Body>| body.listed.iter().find(|listed| listed.handle == handle).cloned();
    if let Some(listed) = state.graphs.values().find_map(in_body) {
        return Ok(listed);
    }
    state
        .streams
        .values()
        .filter_map(|stream| stream.capture.active_info().and_then(|(_, graph)| stream.capture.listed_of(graph)))
        .find_map(|listed| listed.into_iter().find(|l| l.handle == handle))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// Writes `items` the way `cuGraphGetNodes` and `cuGraphNodeGetDependencies` do: with `out`
/// null only the count; otherwise `*count` entries, the first ones, and null ones past the end
/// of `items`, with `*count` lowered to how many were real.
///
/// # Safety
/// `count` is valid for a read and a write; `out` null or valid for `*count` writes; `edges`
/// null or valid for `*count` writes.
unsafe fn write_nodes(
    items: &[usize],
    out: *mut CUgraphNode,
    edges: *mut CUgraphEdgeData,
    count: *mut usize,
) -> SimResult {
    if out.is_null() {
        // SAFETY: forwarded from the caller.
        return unsafe { write_out(count, items.len()) };
    }
    // SAFETY: valid for a read by the caller's contract.
    let room = unsafe { count.read_unaligned() };
    for index in 0..room {
        let item = items.get(index).copied().unwrap_or(0);
        // SAFETY: `out` (and `edges`, when non-null) are valid for `room` writes.
        unsafe {
            out.add(index).write_unaligned(item as CUgraphNode);
            if !edges.is_null() {
                edges.add(index).write_unaligned(CUgraphEdgeData::default());
            }
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { write_out(count, room.min(items.len())) }
}

/// `cuGraphGetNodes`: the nodes of a captured graph, or of the graph a capture is building, in
/// the order they were captured. An unknown graph or a null count is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `count` is null or valid for a read and a write; `nodes` null or valid for `*count` writes.
pub(crate) unsafe fn get_nodes(graph: CUgraph, nodes: *mut CUgraphNode, count: *mut usize) -> SimResult {
    ensure(!count.is_null())?;
    let listed = graph_nodes(&*state::lock()?, graph)?;
    let handles: Vec<usize> = listed.iter().map(|l| l.handle).collect();
    // SAFETY: forwarded from the caller.
    unsafe { write_nodes(&handles, nodes, std::ptr::null_mut(), count) }
}

/// `cuGraphNodeGetType`: an unknown node (or one of a destroyed graph) or a null pointer is
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn node_type(node: CUgraphNode, out: *mut CUgraphNodeType) -> SimResult {
    ensure(!out.is_null())?;
    let listed = find_node(&*state::lock()?, node)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, listed.kind) }
}

/// `cuGraphNodeGetDependencies_v2`: the nodes `node` depends on, with default edge data. An
/// unknown node, a null count, or edge data without a place for the dependencies is
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `count` is null or valid for a read and a write; `dependencies` and `edges` null or valid for
/// `*count` writes.
pub(crate) unsafe fn node_dependencies(
    node: CUgraphNode,
    dependencies: *mut CUgraphNode,
    edges: *mut CUgraphEdgeData,
    count: *mut usize,
) -> SimResult {
    ensure(!count.is_null() && (edges.is_null() || !dependencies.is_null()))?;
    let listed = find_node(&*state::lock()?, node)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_nodes(&listed.deps, dependencies, edges, count) }
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
