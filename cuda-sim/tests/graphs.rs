//! Graphs: instantiating, launching, uploading and destroying captured graphs, the capture's
//! graph (`cuStreamGetCaptureInfo`), graph memory (allocation and free nodes, the device's graph
//! memory attributes, trimming), user objects (their references held by user code, graphs and
//! executable graphs; the destructor), and capture modes across threads
//! (`cuThreadExchangeStreamCaptureMode`, the unsafe calls they prohibit, ending a capture on the
//! wrong thread). Each test runs in a child
//! process: graph memory counters are per process, and a global-mode capture restricts every
//! thread of the process.

mod common;

use std::ffi::c_void;
use std::sync::Mutex;

use common::{
    DeviceBuffer, Gate, Pinned, blocking_stream, code, driver, event, event_query, in_child, memset_async,
    non_blocking_stream, query, record, sync, use_device, wait_event,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUdeviceptr, CUevent, CUevent_flags, CUgraph, CUgraphEdgeData, CUgraphExec,
    CUgraphInstantiateResult, CUgraphMem_attribute, CUgraphNode, CUgraphNodeType, CUmemPoolProps, CUresult, CUstream,
    CUstreamCaptureMode, CUstreamCaptureStatus, CUuserObject,
};

const INVALID_VALUE: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const AUTO_FREE_ON_LAUNCH: u64 = 1;
const UPLOAD: u64 = 2;
const DEVICE_LAUNCH: u64 = 4;
const MIB: usize = 1 << 20;

fn begin(s: CUstream, mode: CUstreamCaptureMode) {
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuStreamBeginCapture_v2(s, mode)) }.unwrap();
}

fn end(s: CUstream) -> CUgraph {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamEndCapture(s, &mut graph)) }.unwrap();
    assert!(!graph.is_null());
    graph
}

fn instantiate_code(graph: CUgraph, flags: u64) -> Result<CUgraphExec, CUresult> {
    let mut exec: CUgraphExec = std::ptr::null_mut();
    // SAFETY: `exec` is a valid out-pointer.
    match unsafe { code!(driver(), cuGraphInstantiateWithFlags(&mut exec, graph, flags)) } {
        CUresult::CUDA_SUCCESS => Ok(exec),
        error => Err(error),
    }
}

fn instantiate(graph: CUgraph) -> CUgraphExec {
    instantiate_code(graph, 0).unwrap()
}

fn launch(exec: CUgraphExec, s: CUstream) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuGraphLaunch(exec, s)) }
}

fn exec_destroy(exec: CUgraphExec) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuGraphExecDestroy(exec)) }
}

/// Instantiates `graph`, launches it once on `stream` and waits for the launch.
fn launch_once(graph: CUgraph, stream: CUstream) -> CUgraphExec {
    let exec = instantiate(graph);
    assert_eq!(launch(exec, stream), CUresult::CUDA_SUCCESS);
    sync(stream);
    exec
}

/// Destroys an executable graph and the graph it came from, each successfully.
fn destroy_both(exec: CUgraphExec, graph: CUgraph) {
    assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
    assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
}

fn graph_destroy(graph: CUgraph) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuGraphDestroy(graph)) }
}

fn memset_code(dst: CUdeviceptr, value: u8, len: usize, s: CUstream) -> CUresult {
    // SAFETY: no host pointers; the range is checked by the driver.
    unsafe { code!(driver(), cuMemsetD8Async(dst, value, len, s)) }
}

fn dtod_async(dst: CUdeviceptr, src: CUdeviceptr, len: usize, s: CUstream) {
    // SAFETY: no host pointers; the ranges are checked by the driver.
    unsafe { cu_call!(driver(), cuMemcpyDtoDAsync_v2(dst, src, len, s)) }.unwrap();
}

fn alloc_async(len: usize, s: CUstream) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocAsync(&mut ptr, len, s)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn free_async(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    // SAFETY: no host pointers.
    unsafe { code!(driver(), cuMemFreeAsync(ptr, s)) }
}

fn graph_attribute(attribute: CUgraphMem_attribute) -> u64 {
    let mut value = u64::MAX;
    // SAFETY: `value` is a valid out-pointer of the attribute's type.
    unsafe { cu_call!(driver(), cuDeviceGetGraphMemAttribute(0, attribute, (&raw mut value).cast::<c_void>())) }
        .unwrap();
    value
}

/// `cuDeviceGraphMemTrim` on device 0.
fn trim() {
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuDeviceGraphMemTrim(0)) }.unwrap();
}

/// (used, used high, reserved, reserved high), in MiB.
fn graph_memory() -> [u64; 4] {
    use CUgraphMem_attribute as A;
    [
        A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT,
        A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
        A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT,
        A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
    ]
    .map(|a| graph_attribute(a) / MIB as u64)
}

/// Captures `record` on a new stream in `mode` and returns the stream and the graph.
fn capture(mode: CUstreamCaptureMode, record: impl FnOnce(CUstream)) -> (CUstream, CUgraph) {
    let s = non_blocking_stream();
    begin(s, mode);
    record(s);
    (s, end(s))
}

/// Launching replays the captured operations in capture order, at every launch, and only then:
/// capturing ran nothing.
#[test]
fn launch_replays_the_captured_work_in_order_each_time() {
    in_child!(&[], || {
        use_device(0);
        let device = DeviceBuffer::new(16);
        let pinned = Pinned::new(16);
        let (s, graph) = capture(RELAXED, |s| {
            memset_async(device.ptr, 7, 16, s);
            memset_async(device.ptr, 8, 4, s);
            dtod_async(pinned.dptr(), device.ptr, 16, s);
            memset_async(pinned.dptr() + 12, 9, 4, s);
        });
        sync(s);
        assert_eq!(pinned.read(), vec![0; 16], "capturing runs nothing");
        let exec = instantiate(graph);
        sync(s);
        assert_eq!(pinned.read(), vec![0; 16], "instantiating runs nothing");
        let expected = [[8; 4], [7; 4], [7; 4], [9; 4]].concat();
        for _ in 0..3 {
            pinned.fill(1);
            assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
            sync(s);
            assert_eq!(pinned.read(), expected);
        }
        // Launched on another stream too; the launches of one executable graph are ordered.
        let other = blocking_stream();
        pinned.fill(1);
        assert_eq!(launch(exec, other), CUresult::CUDA_SUCCESS);
        sync(other);
        assert_eq!(pinned.read(), expected);
        destroy_both(exec, graph);
    });
}

/// An event recorded in a capture is recorded again by each launch, and completes with it.
#[test]
fn a_captured_event_record_records_at_each_launch() {
    in_child!(&[], || {
        use_device(0);
        let e = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let (s, graph) = capture(RELAXED, |s| record(e, s));
        assert_eq!(event_query(e), CUresult::CUDA_ERROR_CAPTURED_EVENT, "last recorded in a capture");
        let exec = launch_once(graph, s);
        assert_eq!(event_query(e), CUresult::CUDA_SUCCESS, "the launch recorded it");
        destroy_both(exec, graph);
    });
}

/// The errors `cuda.h` documents for instantiation, launch and destruction.
#[test]
fn instantiate_launch_and_destroy_refuse_bad_arguments() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(4);
        let (s, graph) = capture(RELAXED, |s| memset_async(pinned.dptr(), 1, 4, s));
        let d = driver();
        // SAFETY: a null out-pointer is refused before any write.
        let null_out = unsafe { code!(d, cuGraphInstantiateWithFlags(std::ptr::null_mut(), graph, 0)) };
        assert_eq!(null_out, INVALID_VALUE);
        assert_eq!(instantiate_code(0x77 as CUgraph, 0).err(), Some(INVALID_VALUE), "unknown graph");
        assert_eq!(instantiate_code(graph, 16).err(), Some(INVALID_VALUE), "unknown flag");
        assert_eq!(instantiate_code(graph, UPLOAD).err(), Some(INVALID_VALUE), "UPLOAD is for WithParams");
        assert_eq!(instantiate_code(graph, DEVICE_LAUNCH | AUTO_FREE_ON_LAUNCH).err(), Some(INVALID_VALUE));
        let exec = instantiate(graph);
        let second = instantiate(graph);
        assert_ne!(exec, second, "a graph without memory nodes has any number of executable graphs");
        assert_eq!(exec_destroy(second), CUresult::CUDA_SUCCESS);
        assert_eq!(exec_destroy(second), INVALID_VALUE, "destroyed twice");
        assert_eq!(launch(second, s), INVALID_VALUE, "a destroyed executable graph");
        assert_eq!(launch(0x77 as CUgraphExec, s), INVALID_VALUE);
        assert_eq!(launch(exec, 0x77 as CUstream), CUresult::CUDA_ERROR_INVALID_HANDLE);
        // SAFETY: no pointers.
        assert_eq!(unsafe { code!(d, cuGraphUpload(exec, s)) }, CUresult::CUDA_SUCCESS);
        // SAFETY: no pointers.
        assert_eq!(unsafe { code!(d, cuGraphUpload(0x77 as CUgraphExec, s)) }, INVALID_VALUE);
        // Into a capturing stream: refused, and the capture goes on.
        let capturing = non_blocking_stream();
        begin(capturing, RELAXED);
        assert_eq!(launch(exec, capturing), CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        let mut status = CUstreamCaptureStatus(99);
        // SAFETY: `status` is a valid out-pointer.
        unsafe { cu_call!(d, cuStreamIsCapturing(capturing, &mut status)) }.unwrap();
        assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        assert_eq!(graph_destroy(end(capturing)), CUresult::CUDA_SUCCESS);
        // The graph's destruction leaves its executable graph working.
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_destroy(graph), INVALID_VALUE, "destroyed twice");
        assert_eq!(instantiate_code(graph, 0).err(), Some(INVALID_VALUE), "a destroyed graph");
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(pinned.read(), vec![1; 4]);
        assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
    });
}

/// `cuGraphInstantiateWithParams` reports the outcome in `result_out` and uploads to the stream
/// it is given.
#[test]
fn instantiate_with_params_reports_its_result() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(4);
        let (s, graph) = capture(RELAXED, |s| memset_async(pinned.dptr(), 3, 4, s));
        let d = driver();
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: the params are plain data; zero is a valid value for each field.
        let mut params: CUDA_GRAPH_INSTANTIATE_PARAMS = unsafe { std::mem::zeroed() };
        params.flags = UPLOAD;
        params.hUploadStream = s;
        params.result_out = CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE;
        // SAFETY: `exec` and `params` are valid for the call.
        unsafe { cu_call!(d, cuGraphInstantiateWithParams(&mut exec, graph, &mut params)) }.unwrap();
        assert_eq!(params.result_out, CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_SUCCESS);
        assert!(params.hErrNode_out.is_null());
        params.flags = 32;
        let mut refused: CUgraphExec = std::ptr::null_mut();
        // SAFETY: as above.
        let result = unsafe { code!(d, cuGraphInstantiateWithParams(&mut refused, graph, &mut params)) };
        assert_eq!(
            (result, params.result_out),
            (INVALID_VALUE, CUgraphInstantiateResult::CUDA_GRAPH_INSTANTIATE_ERROR)
        );
        // SAFETY: a null params pointer is refused before any access.
        let null = unsafe { code!(d, cuGraphInstantiateWithParams(&mut refused, graph, std::ptr::null_mut())) };
        assert_eq!(null, INVALID_VALUE);
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(pinned.read(), vec![3; 4]);
        destroy_both(exec, graph);
    });
}

/// `cuStreamGetCaptureInfo` gives out the graph being captured, which `cuStreamEndCapture`
/// completes, even when it is not given a place to write the graph (as cuda.core's graph builder
/// calls it).
#[test]
fn capture_info_gives_the_graph_before_the_capture_ends() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(4);
        let s = non_blocking_stream();
        let d = driver();
        let mut status = CUstreamCaptureStatus(99);
        let (mut id, mut graph) = (0u64, std::ptr::null_mut());
        let mut count = 99usize;
        // SAFETY: every pointer is valid for a write or null.
        let info = |status: &mut CUstreamCaptureStatus, id: &mut u64, graph: &mut CUgraph, count: &mut usize| unsafe {
            code!(d, cuStreamGetCaptureInfo_v3(s, status, id, graph, std::ptr::null_mut(), std::ptr::null_mut(), count))
        };
        assert_eq!(info(&mut status, &mut id, &mut graph, &mut count), CUresult::CUDA_SUCCESS);
        assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        begin(s, GLOBAL);
        memset_async(pinned.dptr(), 5, 4, s);
        assert_eq!(info(&mut status, &mut id, &mut graph, &mut count), CUresult::CUDA_SUCCESS);
        assert_eq!((status, count), (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, 1), "the memset");
        assert!(id != 0 && !graph.is_null());
        assert_eq!(graph_destroy(graph), INVALID_VALUE, "a graph being captured cannot be destroyed");
        // SAFETY: the status pointer is required; edge data needs a dependencies pointer.
        unsafe {
            let no_status = std::ptr::null_mut();
            let result = code!(
                d,
                cuStreamGetCaptureInfo_v3(
                    s,
                    no_status,
                    &mut id,
                    &mut graph,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut count
                )
            );
            assert_eq!(result, INVALID_VALUE);
            let mut edges = std::ptr::null();
            let result = code!(
                d,
                cuStreamGetCaptureInfo_v3(
                    s,
                    &mut status,
                    &mut id,
                    &mut graph,
                    std::ptr::null_mut(),
                    &mut edges,
                    &mut count
                )
            );
            assert_eq!(result, INVALID_VALUE);
        }
        // SAFETY: a null graph pointer is accepted.
        unsafe { cu_call!(d, cuStreamEndCapture(s, std::ptr::null_mut())) }.unwrap();
        let exec = launch_once(graph, s);
        assert_eq!(pinned.read(), vec![5; 4]);
        destroy_both(exec, graph);
    });
}

/// The capturing stream's dependency set (`cuStreamGetCaptureInfo`): its nodes and edge data.
fn dependencies(s: CUstream) -> Vec<CUgraphNode> {
    let mut status = CUstreamCaptureStatus(99);
    let mut nodes: *const CUgraphNode = std::ptr::null();
    let mut edges: *const CUgraphEdgeData = std::ptr::null();
    let mut count = usize::MAX;
    // SAFETY: valid out-pointers; the id and graph are not asked for.
    unsafe {
        cu_call!(
            driver(),
            cuStreamGetCaptureInfo_v3(
                s,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut nodes,
                &mut edges,
                &mut count
            )
        )
    }
    .unwrap();
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);
    if count == 0 {
        return Vec::new();
    }
    // SAFETY: the driver's arrays hold `count` entries until the next call on the stream.
    let (nodes, edges) =
        unsafe { (std::slice::from_raw_parts(nodes, count), std::slice::from_raw_parts(edges, count)) };
    assert!(edges.iter().all(|e| *e == CUgraphEdgeData::default()), "default edges");
    nodes.to_vec()
}

/// `cuGraphGetNodes`: every node of `graph`, in order.
fn graph_nodes(graph: CUgraph) -> Vec<CUgraphNode> {
    let d = driver();
    let mut count = 0usize;
    // SAFETY: a null array asks for the count only.
    unsafe { cu_call!(d, cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count)) }.unwrap();
    let mut nodes = vec![std::ptr::null_mut(); count + 1];
    let mut room = count + 1;
    // SAFETY: `nodes` has room for `room` handles.
    unsafe { cu_call!(d, cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut room)) }.unwrap();
    assert_eq!(room, count, "one more than there are: the count is lowered");
    assert!(nodes[count].is_null(), "and the extra entry set to NULL");
    nodes.truncate(count);
    nodes
}

/// `cuGraphNodeGetType`.
fn node_type(node: CUgraphNode) -> Result<CUgraphNodeType, CUresult> {
    let mut kind = CUgraphNodeType(99);
    // SAFETY: `kind` is a valid out-pointer.
    match unsafe { code!(driver(), cuGraphNodeGetType(node, &mut kind)) } {
        CUresult::CUDA_SUCCESS => Ok(kind),
        error => Err(error),
    }
}

/// `cuGraphNodeGetDependencies`: the nodes `node` depends on.
fn node_dependencies(node: CUgraphNode) -> Vec<CUgraphNode> {
    let d = driver();
    let mut count = 0usize;
    // SAFETY: a null array asks for the count only.
    unsafe { cu_call!(d, cuGraphNodeGetDependencies_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut count)) }
        .unwrap();
    let mut nodes = vec![std::ptr::null_mut(); count];
    let mut edges = vec![CUgraphEdgeData { type_: 9, ..Default::default() }; count];
    // SAFETY: both arrays have room for `count` entries.
    unsafe { cu_call!(d, cuGraphNodeGetDependencies_v2(node, nodes.as_mut_ptr(), edges.as_mut_ptr(), &mut count)) }
        .unwrap();
    assert!(edges.iter().all(|e| *e == CUgraphEdgeData::default()), "default edges");
    nodes
}

/// `cuStreamUpdateCaptureDependencies` with default edge data.
fn update_dependencies(s: CUstream, nodes: &[CUgraphNode], flags: u32) -> CUresult {
    let mut nodes = nodes.to_vec();
    // SAFETY: `nodes` holds `len` handles; no edge data.
    unsafe {
        code!(
            driver(),
            cuStreamUpdateCaptureDependencies_v2(s, nodes.as_mut_ptr(), std::ptr::null(), nodes.len(), flags)
        )
    }
}

const ADD: u32 = 0;
const SET: u32 = 1;
const MEMSET: CUgraphNodeType = CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET;

/// `cuStreamGetCaptureInfo` reports the capture's frontier: after a captured memset, the memset
/// (a node of the graph being built, as `cuGraphGetNodes` and `cuGraphNodeGetType` agree), and
/// each later node depends on the one before; the handles stay valid in the ended graph.
#[test]
fn capture_info_reports_the_nodes_the_next_node_depends_on() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let device = DeviceBuffer::new(8);
        let s = non_blocking_stream();
        begin(s, GLOBAL);
        assert_eq!(dependencies(s), Vec::<CUgraphNode>::new(), "nothing captured yet");
        memset_async(pinned.dptr(), 1, 8, s);
        let first = dependencies(s);
        assert_eq!(first.len(), 1, "the memset");
        let graph = capturing_graph(s);
        assert_eq!(graph_nodes(graph), first, "a node of the graph being captured");
        assert_eq!(node_type(first[0]), Ok(MEMSET));
        assert_eq!(node_dependencies(first[0]), Vec::<CUgraphNode>::new(), "a root");
        // An event recorded in the capture is no node: the set stays.
        let e = event(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        record(e, s);
        assert_eq!(dependencies(s), first);
        dtod_async(device.ptr + 4, device.ptr, 4, s);
        let second = dependencies(s);
        assert_eq!(second.len(), 1);
        assert_ne!(second, first);
        assert_eq!(node_type(second[0]), Ok(CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY));
        assert_eq!(node_dependencies(second[0]), first, "the copy depends on the memset");
        let ended = end(s);
        assert_eq!(ended, graph);
        assert_eq!(graph_nodes(graph), [first[0], second[0]]);
        assert_eq!(node_dependencies(second[0]), first, "the same handles in the ended graph");
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
        assert_eq!(node_type(first[0]), Err(INVALID_VALUE), "gone with its graph");
        // SAFETY: null pointers are refused.
        unsafe {
            let d = driver();
            assert_eq!(code!(d, cuGraphNodeGetType(second[0], std::ptr::null_mut())), INVALID_VALUE);
            assert_eq!(code!(d, cuGraphGetNodes(graph, std::ptr::null_mut(), std::ptr::null_mut())), INVALID_VALUE);
        }
    });
}

/// A stream that waits for an event recorded in the capture depends on what the event noted
/// (joining, it starts from it); the origin, waiting for the other stream, depends on both
/// streams' last nodes, and so does its next node.
#[test]
fn cross_stream_waits_merge_dependency_sets() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let (origin, forked) = (non_blocking_stream(), non_blocking_stream());
        let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let (fork, join) = (event(flags), event(flags));
        begin(origin, RELAXED);
        memset_async(pinned.dptr(), 1, 8, origin);
        let a = dependencies(origin);
        record(fork, origin);
        wait_event(forked, fork);
        assert_eq!(dependencies(forked), a, "joined from the fork's set");
        memset_async(pinned.dptr(), 2, 4, forked);
        let b = dependencies(forked);
        memset_async(pinned.dptr() + 4, 3, 4, origin);
        let c = dependencies(origin);
        assert_eq!((node_dependencies(b[0]), node_dependencies(c[0])), (a.clone(), a.clone()), "both after the fork");
        record(join, forked);
        wait_event(origin, join);
        assert_eq!(dependencies(origin), [c[0], b[0]], "its own and the joined stream's");
        memset_async(pinned.dptr(), 4, 1, origin);
        let d = dependencies(origin);
        assert_eq!(node_dependencies(d[0]), [c[0], b[0]]);
        let graph = end(origin);
        assert_eq!(graph_nodes(graph), [a[0], b[0], c[0], d[0]], "in capture order");
        let exec = launch_once(graph, origin);
        assert_eq!(pinned.read(), [4, 2, 2, 2, 3, 3, 3, 3]);
        destroy_both(exec, graph);
    });
}

/// `cuStreamUpdateCaptureDependencies`: adds to the set or replaces it, and the next node depends
/// on the result; its errors as `cuda.h` lists them. Nodes taken from another stream join it, as
/// a wait would; nodes removed by a replacement need no rejoin.
#[test]
fn update_capture_dependencies_adds_to_or_replaces_the_set() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let (s, other) = (non_blocking_stream(), non_blocking_stream());
        assert_eq!(update_dependencies(s, &[], ADD), CUresult::CUDA_ERROR_ILLEGAL_STATE, "not capturing");
        begin(other, RELAXED);
        memset_async(pinned.dptr(), 9, 1, other);
        let foreign = dependencies(other);
        begin(s, RELAXED);
        memset_async(pinned.dptr(), 1, 1, s);
        let a = dependencies(s);
        memset_async(pinned.dptr(), 2, 1, s);
        let b = dependencies(s);
        assert_eq!(update_dependencies(s, &a, 2), INVALID_VALUE, "an unknown flag");
        assert_eq!(update_dependencies(s, &foreign, ADD), INVALID_VALUE, "another capture's node");
        assert_eq!(update_dependencies(s, &[a[0], a[0]], ADD), INVALID_VALUE, "a node named twice");
        assert_eq!(update_dependencies(s, &[0x1234 as CUgraphNode], ADD), INVALID_VALUE, "not a node");
        // SAFETY: a null array with a count, and edge data other than the default, are refused
        // before anything is read past the arrays given.
        unsafe {
            let d = driver();
            let null =
                code!(d, cuStreamUpdateCaptureDependencies_v2(s, std::ptr::null_mut(), std::ptr::null(), 1, ADD));
            assert_eq!(null, INVALID_VALUE);
            let mut nodes = a.clone();
            let programmatic = [CUgraphEdgeData { type_: 1, ..Default::default() }];
            let edge =
                code!(d, cuStreamUpdateCaptureDependencies_v2(s, nodes.as_mut_ptr(), programmatic.as_ptr(), 1, ADD));
            assert_eq!(edge, INVALID_VALUE);
            let default = [CUgraphEdgeData::default()];
            let plain = code!(d, cuStreamUpdateCaptureDependencies_v2(s, nodes.as_mut_ptr(), default.as_ptr(), 1, ADD));
            assert_eq!(plain, CUresult::CUDA_SUCCESS, "default edge data is accepted");
        }
        assert_eq!(dependencies(s), [b[0], a[0]], "added");
        assert_eq!(update_dependencies(s, &a, SET), CUresult::CUDA_SUCCESS);
        assert_eq!(dependencies(s), a, "replaced");
        assert_eq!(update_dependencies(s, &[], SET), CUresult::CUDA_SUCCESS);
        assert_eq!(dependencies(s), Vec::<CUgraphNode>::new(), "emptied");
        assert_eq!(update_dependencies(s, &[a[0], b[0]], ADD), CUresult::CUDA_SUCCESS);
        memset_async(pinned.dptr() + 1, 3, 1, s);
        let c = dependencies(s);
        assert_eq!(node_dependencies(c[0]), [a[0], b[0]], "the next node depends on the set");

        // Taking a forked stream's node joins it; a node removed from a set needs no rejoin.
        let (forked, fork) = (non_blocking_stream(), event(CUevent_flags::CU_EVENT_DISABLE_TIMING));
        record(fork, s);
        wait_event(forked, fork);
        memset_async(pinned.dptr() + 2, 4, 1, forked);
        let f = dependencies(forked);
        assert_eq!(update_dependencies(s, &f, ADD), CUresult::CUDA_SUCCESS);
        assert_eq!(dependencies(s), [c[0], f[0]]);
        let graph = end(s);
        assert_eq!(graph_nodes(graph), [a[0], b[0], c[0], f[0]]);
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
        begin(s, RELAXED);
        record(fork, s);
        wait_event(forked, fork);
        memset_async(pinned.dptr() + 3, 5, 1, forked);
        assert_eq!(update_dependencies(forked, &[], SET), CUresult::CUDA_SUCCESS, "its node dropped");
        assert_eq!(graph_destroy(end(s)), CUresult::CUDA_SUCCESS);

        // An invalidated capture: its own error.
        begin(s, RELAXED);
        memset_async(pinned.dptr(), 1, 1, s);
        let a = dependencies(s);
        assert_eq!(query(s), CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(update_dependencies(s, &a, ADD), CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        end_invalidated(s);
        assert_eq!(graph_destroy(end(other)), CUresult::CUDA_SUCCESS);
    });
}

/// Graph memory: an allocation node's address is fixed at capture, live during the capture and
/// after each launch until freed, and not before a launch; an unfreed allocation blocks the next
/// launch; the attributes count it; trimming gives back the reserve not in use.
#[test]
fn an_allocation_node_maps_at_launch_and_lives_until_freed() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let mut address = 0;
        let (s, graph) = capture(RELAXED, |s| {
            address = alloc_async(MIB, s).unwrap();
            memset_async(address, 4, 8, s);
            dtod_async(pinned.dptr(), address, 8, s);
        });
        assert_eq!(memset_code(address, 1, 8, s), INVALID_VALUE, "not mapped before a launch");
        assert_eq!(graph_memory(), [0; 4]);
        let exec = instantiate(graph);
        assert_eq!(instantiate_code(graph, 0).err(), Some(INVALID_VALUE), "one executable graph at a time");
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(pinned.read(), vec![4; 8]);
        assert_eq!(graph_memory(), [2, 2, 2, 2], "1 MiB counts as the 2 MiB granule mapped");
        // Live after the launch: ordinary stream work may use it.
        assert_eq!(memset_code(address, 6, 8, s), CUresult::CUDA_SUCCESS);
        assert_eq!(launch(exec, s), INVALID_VALUE, "relaunched with the allocation unfreed");
        assert_eq!(free_async(address, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(graph_memory(), [2, 2, 2, 2], "freed: still the graph's, for its next launch");
        assert_eq!(memset_code(address, 1, 8, s), INVALID_VALUE, "freed");
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS, "the same address again");
        sync(s);
        assert_eq!(graph_memory(), [2, 2, 2, 2], "the same memory again");
        trim();
        assert_eq!(graph_memory(), [2, 2, 2, 2], "a live allocation is not trimmed");
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemFree_v2(address)) }.unwrap();
        assert_eq!(graph_memory(), [2, 2, 2, 2]);
        trim();
        assert_eq!(graph_memory(), [0, 2, 0, 2], "trimmed");
        assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
        let again = instantiate(graph);
        assert_eq!(exec_destroy(again), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
    });
}

/// Graph memory is its device's: a stream of another device can neither set nor copy it (the
/// simulated allocation nodes give no peer access), `CUDA_ERROR_INVALID_VALUE` as for a device
/// pool's memory without access.
#[test]
fn another_device_reaches_no_graph_memory() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        use_device(0);
        let mut address = 0;
        let (s0, graph) = capture(RELAXED, |s| {
            address = alloc_async(MIB, s).unwrap();
            memset_async(address, 4, 8, s);
        });
        let exec = launch_once(graph, s0);
        use_device(1);
        let s1 = non_blocking_stream();
        let on_one = DeviceBuffer::new(8);
        assert_eq!(memset_code(address, 1, 8, s1), INVALID_VALUE, "a memset from device 1");
        // SAFETY: no host pointers; the ranges are checked by the driver.
        let copy = |dst, src| unsafe { code!(driver(), cuMemcpyDtoDAsync_v2(dst, src, 8, s1)) };
        assert_eq!(copy(on_one.ptr, address), INVALID_VALUE, "a copy out of it on device 1");
        assert_eq!(copy(address, on_one.ptr), INVALID_VALUE, "a copy into it on device 1");
        sync(s1);
        use_device(0);
        let pinned = Pinned::new(8);
        dtod_async(pinned.dptr(), address, 8, s0);
        sync(s0);
        assert_eq!(pinned.read(), vec![4; 8], "untouched by device 1");
        assert_eq!(free_async(address, s0), CUresult::CUDA_SUCCESS);
        sync(s0);
        destroy_both(exec, graph);
    });
}

/// An allocation freed in its own graph is live only inside the launch; relaunching needs no
/// free; `AUTO_FREE_ON_LAUNCH` frees an unfreed allocation at the next launch.
#[test]
fn free_nodes_and_auto_free_release_graph_memory() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let (s, graph) = capture(RELAXED, |s| {
            let address = alloc_async(3 * MIB, s).unwrap();
            memset_async(address, 2, 8, s);
            dtod_async(pinned.dptr(), address, 8, s);
            assert_eq!(free_async(address, s), CUresult::CUDA_SUCCESS);
            assert_eq!(free_async(address, s), INVALID_VALUE, "freed twice in the graph");
            assert_eq!(memset_code(address, 1, 8, s), INVALID_VALUE, "used after its free node");
        });
        let exec = instantiate(graph);
        for _ in 0..2 {
            pinned.fill(0);
            assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
            sync(s);
            assert_eq!(pinned.read(), vec![2; 8]);
            assert_eq!(graph_memory(), [4, 4, 4, 4], "freed in the graph, still the graph's");
        }
        assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_memory(), [0, 4, 4, 4], "its graph destroyed: no longer used, still reserved");
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);

        let mut address = 0;
        let (s, graph) = capture(RELAXED, |s| address = alloc_async(MIB, s).unwrap());
        let exec = instantiate_code(graph, AUTO_FREE_ON_LAUNCH).unwrap();
        for _ in 0..3 {
            assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
            sync(s);
            assert_eq!(graph_memory()[0], 2, "one launch's allocation in use at a time");
        }
        assert_eq!(free_async(address, s), CUresult::CUDA_SUCCESS);
        assert_eq!(free_async(address, s), INVALID_VALUE, "freed twice");
        sync(s);
        assert_eq!(graph_memory()[0], 2, "freed, still the graph's");
        assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_memory()[0], 0);
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
    });
}

/// cuda.core's `test_graph_mem_set_attributes`, which passes on GPUs: graph memory freed (and the
/// device synchronized) is still counted as used ("Free memory, but usage is not reduced yet");
/// the high-water marks stay after a trim. Here also: a trim unmaps it, and destroying the
/// executable graph ends its use (what cuda.h's trim documents: only memory "not in use by a
/// graph that is either currently executing or scheduled to execute" goes back).
#[test]
fn freed_graph_memory_stays_used_until_trimmed_or_its_graph_is_destroyed() {
    in_child!(&[], || {
        use_device(0);
        let mut address = 0;
        let (s, graph) = capture(RELAXED, |s| address = alloc_async(1024, s).unwrap());
        let exec = launch_once(graph, s);
        assert_eq!(graph_memory(), [2, 2, 2, 2]);
        assert_eq!(free_async(address, s), CUresult::CUDA_SUCCESS);
        sync(s);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuCtxSynchronize()) }.unwrap();
        assert_eq!(graph_memory(), [2, 2, 2, 2], "freed and synchronized: usage is not reduced yet");
        trim();
        assert_eq!(graph_memory(), [0, 2, 0, 2], "trimmed; the high-water marks remain");
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS, "mapped again");
        sync(s);
        assert_eq!(graph_memory(), [2, 2, 2, 2]);
        assert_eq!(free_async(address, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_memory(), [0, 2, 2, 2], "its graph destroyed: no longer used, the reserve kept");
        trim();
        assert_eq!(graph_memory(), [0, 2, 0, 2]);
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
    });
}

/// cuda.core's `test_graph_mem_alloc_zero`, which passes on GPUs: a zero-byte `cuMemAllocAsync`
/// (or `cuMemAllocFromPoolAsync`) on a capturing stream makes an allocation node, with a unique
/// non-null address (as a zero-byte pool allocation outside a capture) that counts for no graph
/// memory; the graph instantiates and launches, and the allocation is freed as any other.
#[test]
fn a_zero_byte_allocation_in_a_capture_makes_an_allocation_node() {
    in_child!(&[], || {
        use_device(0);
        let props = CUmemPoolProps {
            allocType: cuda_mem_sys::types::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            location: common::device_location(0),
            ..Default::default()
        };
        let mut pool = std::ptr::null_mut();
        // SAFETY: valid pointers.
        unsafe { cu_call!(driver(), cuMemPoolCreate(&mut pool, &props)) }.unwrap();
        let (mut first, mut second, mut in_graph) = (0, 0, 0);
        let (s, graph) = capture(GLOBAL, |s| {
            first = alloc_async(0, s).unwrap();
            // SAFETY: `second` is a valid out-pointer.
            unsafe { cu_call!(driver(), cuMemAllocFromPoolAsync(&mut second, 0, pool, s)) }.unwrap();
            in_graph = alloc_async(0, s).unwrap();
            assert_eq!(free_async(in_graph, s), CUresult::CUDA_SUCCESS, "freed in the graph");
            assert_eq!(memset_code(first, 1, 1, s), INVALID_VALUE, "no byte to set");
        });
        assert!(first != 0 && second != 0 && in_graph != 0, "non-null");
        assert!(first != second && second != in_graph && first != in_graph, "unique");
        let kinds: Vec<_> = graph_nodes(graph).into_iter().map(|n| node_type(n).unwrap()).collect();
        let (alloc, free) =
            (CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC, CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE);
        assert_eq!(kinds, [alloc, alloc, alloc, free]);
        let exec = launch_once(graph, s);
        assert_eq!(graph_memory(), [0; 4], "zero bytes count for nothing");
        assert_eq!(free_async(first, s), CUresult::CUDA_SUCCESS);
        assert_eq!(free_async(first, s), INVALID_VALUE, "freed twice");
        assert_eq!(free_async(in_graph, s), INVALID_VALUE, "freed in its graph");
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemFree_v2(second)) }.unwrap();
        sync(s);
        destroy_both(exec, graph);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemPoolDestroy(pool)) }.unwrap();
    });
}

/// A free node for another graph's allocation frees it when its graph is launched; a captured
/// free of memory no allocation node made is `CUDA_ERROR_INVALID_VALUE`.
#[test]
fn a_free_node_frees_another_graphs_allocation() {
    in_child!(&[], || {
        use_device(0);
        let mut address = 0;
        let (s, alloc_graph) = capture(RELAXED, |s| address = alloc_async(MIB, s).unwrap());
        let alloc_exec = instantiate(alloc_graph);
        assert_eq!(launch(alloc_exec, s), CUresult::CUDA_SUCCESS);
        let device = DeviceBuffer::new(8);
        let (_, free_graph) = capture(RELAXED, |capturing| {
            assert_eq!(free_async(device.ptr, capturing), INVALID_VALUE, "not graph memory");
            assert_eq!(free_async(address, capturing), CUresult::CUDA_SUCCESS);
        });
        assert_eq!(memset_code(address, 1, 8, s), CUresult::CUDA_SUCCESS, "live until the free graph runs");
        let free_exec = instantiate(free_graph);
        assert_eq!(launch(free_exec, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(memset_code(address, 1, 8, s), INVALID_VALUE);
        assert_eq!(graph_memory()[0], 2, "still the allocating graph's");
        assert_eq!(launch(free_exec, s), INVALID_VALUE, "nothing live to free");
        assert_eq!(launch(alloc_exec, s), CUresult::CUDA_SUCCESS, "freed by the other graph");
        for exec in [alloc_exec, free_exec] {
            assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
        }
        for graph in [alloc_graph, free_graph] {
            assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
        }
        // The allocation outlives its graph until it is freed, and is in use until then.
        assert_eq!(memset_code(address, 1, 8, s), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_memory()[0], 2);
        assert_eq!(free_async(address, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(graph_memory()[0], 0, "freed after its graph was destroyed");
    });
}

/// The attributes' errors, and resetting the high-water marks (only to 0, only those two).
#[test]
fn graph_memory_attributes_reset_only_the_high_marks_to_zero() {
    in_child!(&[], || {
        use CUgraphMem_attribute as A;
        use_device(0);
        let (s, graph) = capture(RELAXED, |s| {
            alloc_async(5 * MIB, s).unwrap();
        });
        let exec = instantiate_code(graph, AUTO_FREE_ON_LAUNCH).unwrap();
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(graph_memory(), [6, 6, 6, 6]);
        let d = driver();
        let set = |attribute: A, mut value: u64| {
            // SAFETY: `value` is valid for a read of a cuuint64_t.
            unsafe { code!(d, cuDeviceSetGraphMemAttribute(0, attribute, (&raw mut value).cast::<c_void>())) }
        };
        assert_eq!(set(A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, 1), INVALID_VALUE);
        assert_eq!(set(A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, 0), INVALID_VALUE);
        assert_eq!(set(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, 0), INVALID_VALUE);
        let mut value = 0u64;
        // SAFETY: `value` is valid for a write; the device and the null pointer are refused.
        unsafe {
            let out = (&raw mut value).cast::<c_void>();
            let bad_device = code!(d, cuDeviceGetGraphMemAttribute(5, A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, out));
            assert_eq!(bad_device, CUresult::CUDA_ERROR_INVALID_DEVICE);
            let null =
                code!(d, cuDeviceGetGraphMemAttribute(0, A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, std::ptr::null_mut()));
            assert_eq!(null, INVALID_VALUE);
            assert_eq!(code!(d, cuDeviceGetGraphMemAttribute(0, A(77), out)), INVALID_VALUE);
            assert_eq!(code!(d, cuDeviceGraphMemTrim(5)), CUresult::CUDA_ERROR_INVALID_DEVICE);
        }
        destroy_both(exec, graph);
        // SAFETY: no pointers.
        unsafe { cu_call!(d, cuDeviceGraphMemTrim(0)) }.unwrap();
        assert_eq!(graph_memory(), [6, 6, 6, 6], "the live allocation is still in use after the graph is gone");
        assert_eq!(set(A::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(set(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_memory(), [6, 6, 6, 6], "reset to the current values");
    });
}

// User objects.

const NO_DESTRUCTOR_SYNC: u32 = 1;
const MOVE: u32 = 1;
const INT_MAX: u32 = i32::MAX as u32;

/// What the destructors of a test's user objects saw: how many ran, on which threads, and what
/// a driver call made from one returned.
static DESTROYED: Mutex<Vec<(usize, std::thread::ThreadId, CUresult)>> = Mutex::new(Vec::new());

/// A destructor: records its pointer, its thread and what a driver call returns there.
unsafe extern "C" fn destroy(ptr: *mut c_void) {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    let call = unsafe { code!(driver(), cuDriverGetVersion(&mut version)) };
    DESTROYED.lock().unwrap().push((ptr as usize, std::thread::current().id(), call));
}

/// The destructors that ran for `ptr` so far.
fn destroyed(ptr: usize) -> Vec<(std::thread::ThreadId, CUresult)> {
    DESTROYED.lock().unwrap().iter().filter(|(p, ..)| *p == ptr).map(|(_, t, c)| (*t, *c)).collect()
}

/// Waits (at most 10 s) for the destructor of `ptr` to have run, and returns what it saw.
fn wait_destroyed(ptr: usize) -> (std::thread::ThreadId, CUresult) {
    let start = std::time::Instant::now();
    loop {
        if let Some(&seen) = destroyed(ptr).first() {
            return seen;
        }
        assert!(start.elapsed() < common::WATCHDOG, "the destructor of {ptr:#x} did not run");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Gives the destructor thread time to run anything queued, then checks that `ptr`'s did not.
fn assert_not_destroyed(ptr: usize, when: &str) {
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(destroyed(ptr).is_empty(), "the destructor ran {when}");
}

fn user_object_code(ptr: usize, initial: u32, flags: u32) -> Result<CUuserObject, CUresult> {
    let mut object: CUuserObject = std::ptr::null_mut();
    // SAFETY: `object` is a valid out-pointer; the destructor ignores its pointer but for its value.
    match unsafe { code!(driver(), cuUserObjectCreate(&mut object, ptr as *mut c_void, Some(destroy), initial, flags)) }
    {
        CUresult::CUDA_SUCCESS => Ok(object),
        error => Err(error),
    }
}

fn user_object(ptr: usize, initial: u32) -> CUuserObject {
    user_object_code(ptr, initial, NO_DESTRUCTOR_SYNC).unwrap()
}

fn user_retain(object: CUuserObject, count: u32) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuUserObjectRetain(object, count)) }
}

fn user_release(object: CUuserObject, count: u32) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuUserObjectRelease(object, count)) }
}

fn graph_retain(graph: CUgraph, object: CUuserObject, count: u32, flags: u32) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuGraphRetainUserObject(graph, object, count, flags)) }
}

fn graph_release(graph: CUgraph, object: CUuserObject, count: u32) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuGraphReleaseUserObject(graph, object, count)) }
}

/// A user object's references: created, retained and released by user code; the destructor
/// runs once, when the last goes, on another thread, where driver calls are refused; the errors
/// `cuda.h` documents, and the simulator's readings for what it leaves undefined.
#[test]
fn a_user_object_is_destroyed_on_another_thread_when_its_last_reference_goes() {
    in_child!(&[], || {
        use_device(0);
        let ptr = 0x1000;
        let object = user_object(ptr, 2);
        assert_eq!(user_retain(object, 1), CUresult::CUDA_SUCCESS);
        assert_eq!(user_release(object, 2), CUresult::CUDA_SUCCESS);
        assert_not_destroyed(ptr, "with a reference left");
        assert_eq!(user_release(object, 2), INVALID_VALUE, "more than user code owns");
        assert_eq!(user_release(object, 1), CUresult::CUDA_SUCCESS);
        let (thread, call) = wait_destroyed(ptr);
        assert_ne!(thread, std::thread::current().id(), "not in the releasing call");
        assert_eq!(call, CUresult::CUDA_ERROR_NOT_PERMITTED, "destructors cannot call the driver");
        assert_eq!(destroyed(ptr).len(), 1, "once");
        assert_eq!(user_retain(object, 1), INVALID_VALUE, "a destroyed object");
        assert_eq!(user_release(object, 1), INVALID_VALUE, "a destroyed object");

        // Arguments.
        assert_eq!(user_object_code(ptr, 1, 0), Err(INVALID_VALUE), "NO_DESTRUCTOR_SYNC is required");
        assert_eq!(user_object_code(ptr, 1, 3), Err(INVALID_VALUE));
        assert_eq!(user_object_code(ptr, 0, NO_DESTRUCTOR_SYNC), Err(INVALID_VALUE), "no reference");
        assert_eq!(user_object_code(ptr, INT_MAX + 1, NO_DESTRUCTOR_SYNC), Err(INVALID_VALUE));
        // SAFETY: null pointers, refused.
        unsafe {
            let mut object: CUuserObject = std::ptr::null_mut();
            let null_out =
                code!(driver(), cuUserObjectCreate(std::ptr::null_mut(), std::ptr::null_mut(), Some(destroy), 1, 1));
            assert_eq!(null_out, INVALID_VALUE);
            let no_destructor = code!(driver(), cuUserObjectCreate(&mut object, std::ptr::null_mut(), None, 1, 1));
            assert_eq!(no_destructor, INVALID_VALUE);
        }
        let big = user_object(0x2000, INT_MAX);
        assert_eq!(user_retain(big, 0), INVALID_VALUE, "a zero count");
        assert_eq!(user_retain(big, INT_MAX + 1), INVALID_VALUE, "above INT_MAX");
        assert_eq!(user_release(big, 0), INVALID_VALUE);
        assert_eq!(user_retain(std::ptr::null_mut(), 1), INVALID_VALUE, "no object");
        assert_eq!(user_release(big, INT_MAX), CUresult::CUDA_SUCCESS);
        wait_destroyed(0x2000);
    });
}

/// A graph's references (new or moved from user code) are released with the graph, and an
/// executable graph holds references of its own, released once it is destroyed and its launch
/// has completed.
#[test]
fn graphs_and_executable_graphs_hold_user_object_references() {
    in_child!(&[], || {
        use_device(0);
        let device = DeviceBuffer::new(16);
        let (s, graph) = capture(RELAXED, |s| memset_async(device.ptr, 3, 16, s));
        let ptr = 0x3000;
        let object = user_object(ptr, 1);
        assert_eq!(graph_retain(graph, object, 1, MOVE), CUresult::CUDA_SUCCESS);
        assert_eq!(user_release(object, 1), INVALID_VALUE, "the reference moved to the graph");
        assert_eq!(graph_retain(graph, object, 2, MOVE), INVALID_VALUE, "user code owns none to move");
        assert_eq!(graph_retain(graph, object, 1, 0), CUresult::CUDA_SUCCESS, "a new reference");
        assert_eq!(graph_release(graph, object, 3), INVALID_VALUE, "more than the graph holds");
        assert_eq!(graph_release(graph, object, 1), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_retain(graph, object, 1, 2), INVALID_VALUE, "an unknown flag");
        assert_eq!(graph_retain(graph, object, 0, 0), INVALID_VALUE, "a zero count");
        assert_eq!(graph_release(graph, object, 0), INVALID_VALUE, "a zero count");
        assert_eq!(graph_retain(std::ptr::null_mut(), object, 1, 0), INVALID_VALUE, "no graph");
        let exec = instantiate(graph);
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_retain(graph, object, 1, 0), INVALID_VALUE, "a destroyed graph");
        assert_not_destroyed(ptr, "while an executable graph holds a reference");
        let (gate, _guard) = Gate::new();
        common::hold(gate, driver(), s);
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        assert_eq!(exec_destroy(exec), CUresult::CUDA_SUCCESS);
        assert_not_destroyed(ptr, "while a launch is pending");
        gate.open();
        sync(s);
        assert_eq!(device.read(), vec![3; 16], "the launch ran");
        wait_destroyed(ptr);

        // A graph with a reference and no executable graph: destroying it destroys the object.
        let (_, graph) = capture(RELAXED, |s| memset_async(device.ptr, 4, 16, s));
        let object = user_object(0x3100, 1);
        assert_eq!(graph_retain(graph, object, 1, MOVE), CUresult::CUDA_SUCCESS);
        assert_not_destroyed(0x3100, "while the graph holds it");
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
        wait_destroyed(0x3100);
    });
}

/// The graph of a capture under way (from `cuStreamGetCaptureInfo`) takes references too; they
/// are its graph's after the capture, and go when an invalidated capture ends without a graph.
#[test]
fn a_capture_s_graph_holds_user_object_references() {
    in_child!(&[], || {
        use_device(0);
        let device = DeviceBuffer::new(16);
        let capturing_graph = |s: CUstream| {
            let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            let mut graph: CUgraph = std::ptr::null_mut();
            // SAFETY: valid out-pointers; the others null.
            unsafe {
                cu_call!(
                    driver(),
                    cuStreamGetCaptureInfo_v3(
                        s,
                        &mut status,
                        std::ptr::null_mut(),
                        &mut graph,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut()
                    )
                )
            }
            .unwrap();
            graph
        };
        let s = non_blocking_stream();
        begin(s, RELAXED);
        memset_async(device.ptr, 5, 16, s);
        let object = user_object(0x4000, 1);
        assert_eq!(graph_retain(capturing_graph(s), object, 1, MOVE), CUresult::CUDA_SUCCESS);
        let graph = end(s);
        assert_not_destroyed(0x4000, "while the captured graph holds it");
        assert_eq!(graph_release(graph, object, 1), CUresult::CUDA_SUCCESS);
        wait_destroyed(0x4000);

        begin(s, RELAXED);
        let object = user_object(0x4100, 1);
        assert_eq!(graph_retain(capturing_graph(s), object, 1, MOVE), CUresult::CUDA_SUCCESS);
        assert_eq!(query(s), CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "invalidates the capture");
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer.
        let ended = unsafe { code!(driver(), cuStreamEndCapture(s, &mut graph)) };
        assert_eq!((ended, graph), (CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, std::ptr::null_mut()));
        wait_destroyed(0x4100);
    });
}

// Capture modes.

const THREAD_LOCAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
const UNSUPPORTED: CUresult = CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;

/// `cuThreadExchangeStreamCaptureMode`: sets `mode` for this thread and returns the previous one.
fn exchange_mode(mode: CUstreamCaptureMode) -> CUstreamCaptureMode {
    let mut swapped = mode;
    // SAFETY: `swapped` is valid for a read and a write.
    unsafe { cu_call!(driver(), cuThreadExchangeStreamCaptureMode(&mut swapped)) }.unwrap();
    swapped
}

/// `cuMemAlloc` (freed at once when it succeeds), a potentially unsafe call.
fn mem_alloc_code() -> CUresult {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    let result = unsafe { code!(driver(), cuMemAlloc_v2(&mut ptr, 4096)) };
    if result == CUresult::CUDA_SUCCESS {
        // SAFETY: memory this function allocated.
        unsafe { cu_call!(driver(), cuMemFree_v2(ptr)) }.unwrap();
    }
    result
}

/// `cuMemPoolCreate` (the pool destroyed at once when it succeeds), another unsafe call.
fn pool_create_code() -> CUresult {
    let props = CUmemPoolProps {
        allocType: cuda_mem_sys::types::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: common::device_location(0),
        ..Default::default()
    };
    let mut pool: cuda_mem_sys::types::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid pointers.
    let result = unsafe { code!(driver(), cuMemPoolCreate(&mut pool, &props)) };
    if result == CUresult::CUDA_SUCCESS {
        // SAFETY: a pool this function created.
        unsafe { cu_call!(driver(), cuMemPoolDestroy(pool)) }.unwrap();
    }
    result
}

/// `f` on a new thread with device 0's context current and capture mode `mode`.
fn on_thread_in_mode<T: Send + 'static>(mode: CUstreamCaptureMode, f: impl FnOnce() -> T + Send + 'static) -> T {
    common::on_fresh_thread(move || {
        use_device(0);
        exchange_mode(mode);
        f()
    })
}

fn status(s: CUstream) -> CUstreamCaptureStatus {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamIsCapturing(s, &mut status)) }.unwrap();
    status
}

/// Ends an invalidated capture.
fn end_invalidated(s: CUstream) {
    // SAFETY: a null graph pointer is accepted.
    let ended = unsafe { code!(driver(), cuStreamEndCapture(s, std::ptr::null_mut())) };
    assert_eq!(ended, CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

const ACTIVE: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
const INVALIDATED: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED;

/// A global-mode capture prohibits unsafe calls on its own thread and on every other thread in
/// the global mode (the call fails and the capture is invalidated), not on threads in the
/// thread-local or relaxed mode; a thread that switches to relaxed may make them.
#[test]
fn a_global_capture_prohibits_unsafe_calls_in_every_global_mode_thread() {
    in_child!(&[], || {
        use_device(0);
        let s = non_blocking_stream();
        begin(s, GLOBAL);
        assert_eq!(on_thread_in_mode(THREAD_LOCAL, mem_alloc_code), CUresult::CUDA_SUCCESS);
        assert_eq!(on_thread_in_mode(RELAXED, pool_create_code), CUresult::CUDA_SUCCESS);
        assert_eq!(status(s), ACTIVE, "allowed calls leave the capture alone");
        assert_eq!(on_thread_in_mode(GLOBAL, pool_create_code), UNSUPPORTED, "another global-mode thread");
        assert_eq!(status(s), INVALIDATED);
        end_invalidated(s);
        assert_eq!(on_thread_in_mode(GLOBAL, mem_alloc_code), CUresult::CUDA_SUCCESS, "after the capture");

        begin(s, GLOBAL);
        assert_eq!(mem_alloc_code(), UNSUPPORTED, "this thread, in the global mode");
        end_invalidated(s);
        begin(s, GLOBAL);
        assert_eq!(exchange_mode(RELAXED), GLOBAL, "the default mode");
        assert_eq!(mem_alloc_code(), CUresult::CUDA_SUCCESS, "this thread, relaxed");
        assert_eq!(exchange_mode(GLOBAL), RELAXED);
        let pinned = {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: `ptr` is a valid out-pointer.
            unsafe { code!(driver(), cuMemAllocHost_v2(&mut ptr, 16)) }
        };
        assert_eq!(pinned, UNSUPPORTED, "cuMemAllocHost");
        end_invalidated(s);
    });
}

/// Thread-local and relaxed captures restrict only their own thread, and a relaxed capture not
/// even that; a thread's mode does not let it make unsafe calls while its own capture forbids
/// them.
#[test]
fn thread_local_and_relaxed_captures_restrict_only_their_thread() {
    in_child!(&[], || {
        use_device(0);
        let s = non_blocking_stream();
        begin(s, THREAD_LOCAL);
        assert_eq!(on_thread_in_mode(GLOBAL, mem_alloc_code), CUresult::CUDA_SUCCESS, "another thread");
        assert_eq!(status(s), ACTIVE);
        exchange_mode(THREAD_LOCAL);
        assert_eq!(pool_create_code(), UNSUPPORTED, "this thread's own capture");
        assert_eq!(status(s), INVALIDATED);
        end_invalidated(s);
        exchange_mode(GLOBAL);

        begin(s, RELAXED);
        assert_eq!(mem_alloc_code(), CUresult::CUDA_SUCCESS, "a relaxed capture forbids nothing");
        assert_eq!(on_thread_in_mode(GLOBAL, pool_create_code), CUresult::CUDA_SUCCESS);
        assert_eq!(status(s), ACTIVE);
        end(s);
    });
}

/// A capture begun in a mode other than relaxed must be ended by its thread
/// (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`, and the capture goes on); a relaxed one may be
/// ended anywhere. `cuThreadExchangeStreamCaptureMode` refuses a null pointer and an unknown
/// mode.
#[test]
fn only_the_beginning_thread_ends_a_non_relaxed_capture() {
    in_child!(&[], || {
        use_device(0);
        let s = non_blocking_stream();
        let end_elsewhere = move || {
            let s = s as usize;
            on_thread_in_mode(GLOBAL, move || {
                let mut graph: CUgraph = std::ptr::null_mut();
                // SAFETY: `graph` is a valid out-pointer.
                let ended = unsafe { code!(driver(), cuStreamEndCapture(s as CUstream, &mut graph)) };
                (ended, graph as usize)
            })
        };
        for mode in [GLOBAL, THREAD_LOCAL] {
            begin(s, mode);
            assert_eq!(end_elsewhere(), (CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 0), "{mode:?}");
            assert_eq!(status(s), ACTIVE, "{mode:?}: the capture goes on");
            graph_destroy(end(s));
        }
        begin(s, RELAXED);
        let (ended, graph) = end_elsewhere();
        assert_eq!(ended, CUresult::CUDA_SUCCESS);
        assert_eq!(graph_destroy(graph as CUgraph), CUresult::CUDA_SUCCESS);

        // SAFETY: a null pointer, refused.
        let null = unsafe { code!(driver(), cuThreadExchangeStreamCaptureMode(std::ptr::null_mut())) };
        assert_eq!(null, INVALID_VALUE);
        let mut unknown = CUstreamCaptureMode(3);
        // SAFETY: `unknown` is valid for a read and a write.
        let refused = unsafe { code!(driver(), cuThreadExchangeStreamCaptureMode(&mut unknown)) };
        assert_eq!((refused, unknown), (INVALID_VALUE, CUstreamCaptureMode(3)), "unchanged");
        assert_eq!(exchange_mode(RELAXED), GLOBAL, "the mode is unchanged too");
    });
}

// Replays over memory gone since the capture, captured pageable copies, captures ended by their
// stream's destruction, counted objects, and a context's graph memory.

const ILLEGAL_ADDRESS: CUresult = CUresult::CUDA_ERROR_ILLEGAL_ADDRESS;
const VMM_GRANULE: usize = 2 << 20;

/// `VMM_GRANULE` bytes of VMM memory on device 0, mapped read-write for it: (address, handle).
fn vmm_memory() -> (CUdeviceptr, cuda_mem_sys::types::CUmemGenericAllocationHandle) {
    use cuda_mem_sys::types::{
        CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationProp, CUmemAllocationType, CUmemLocation, CUmemLocationType,
    };
    let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 };
    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        location,
        ..CUmemAllocationProp::default()
    };
    let desc = CUmemAccessDesc { location, flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    let (mut handle, mut ptr) = (0, 0);
    // SAFETY: valid out-pointers, one valid descriptor.
    unsafe {
        cu_call!(driver(), cuMemCreate(&mut handle, VMM_GRANULE, &prop, 0)).unwrap();
        cu_call!(driver(), cuMemAddressReserve(&mut ptr, VMM_GRANULE, 0, 0, 0)).unwrap();
        cu_call!(driver(), cuMemMap(ptr, VMM_GRANULE, 0, handle, 0)).unwrap();
        cu_call!(driver(), cuMemSetAccess(ptr, VMM_GRANULE, &desc, 1)).unwrap();
    }
    (ptr, handle)
}

fn vmm_unmap(ptr: CUdeviceptr) -> CUresult {
    // SAFETY: plain values.
    unsafe { code!(driver(), cuMemUnmap(ptr, VMM_GRANULE)) }
}

/// Releases what [`vmm_memory`] made (once unmapped).
fn vmm_release(ptr: CUdeviceptr, handle: cuda_mem_sys::types::CUmemGenericAllocationHandle) {
    // SAFETY: plain values.
    unsafe {
        cu_call!(driver(), cuMemRelease(handle)).unwrap();
        cu_call!(driver(), cuMemAddressFree(ptr, VMM_GRANULE)).unwrap();
    }
}

/// [`vmm_memory`], and a graph of a memset into it captured on a new stream and instantiated:
/// the memory, its handle, the stream and the executable graph.
fn memset_graph_over_vmm() -> (CUdeviceptr, cuda_mem_sys::types::CUmemGenericAllocationHandle, CUstream, CUgraphExec) {
    let (ptr, handle) = vmm_memory();
    let (s, graph) = capture(RELAXED, |s| memset_async(ptr, 7, 64, s));
    (ptr, handle, s, instantiate(graph))
}

fn stream_sync_code(s: CUstream) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuStreamSynchronize(s)) }
}

fn ctx_sync_code() -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuCtxSynchronize()) }
}

/// After a fault, the context's synchronizing calls and later calls on it return the sticky
/// error; the primary context's reset recovers the device.
fn assert_sticky_illegal_address(s: CUstream) {
    assert_eq!(stream_sync_code(s), ILLEGAL_ADDRESS, "the stream's synchronization reports the fault");
    assert_eq!(ctx_sync_code(), ILLEGAL_ADDRESS, "and the context's");
    assert_eq!(query(s), ILLEGAL_ADDRESS, "sticky: every later call on the context");
    let mut other: CUstream = std::ptr::null_mut();
    // SAFETY: `other` is a valid out-pointer.
    assert_eq!(unsafe { code!(driver(), cuStreamCreate(&mut other, 0)) }, ILLEGAL_ADDRESS);
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuDevicePrimaryCtxReset_v2(0)) }.unwrap();
    use_device(0);
    assert_eq!(ctx_sync_code(), CUresult::CUDA_SUCCESS, "a new context is clean");
}

/// A memset captured into VMM memory that is unmapped before the launch faults on the device
/// (the simulator used to crash touching the unmapped alias): the launch succeeds, the fault is
/// the context's sticky `CUDA_ERROR_ILLEGAL_ADDRESS`.
#[test]
fn replaying_over_unmapped_vmm_memory_is_an_illegal_address() {
    in_child!(&[], || {
        use_device(0);
        let (ptr, handle, s, exec) = memset_graph_over_vmm();
        assert_eq!(vmm_unmap(ptr), CUresult::CUDA_SUCCESS);
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS, "the fault is asynchronous");
        assert_sticky_illegal_address(s);
        vmm_release(ptr, handle);
    });
}

/// The calls on an event of a faulted context report the sticky error too (`cuda.h`: each "may
/// also return error codes from previous, asynchronous launches"), an event completed before the
/// fault included; its destruction destroys it all the same.
#[test]
fn events_of_a_faulted_context_report_the_sticky_error() {
    in_child!(&[], || {
        use_device(0);
        let (ptr, handle, s, exec) = memset_graph_over_vmm();
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; plain values.
        unsafe {
            cu_call!(driver(), cuEventCreate(&mut event, 0)).unwrap();
            cu_call!(driver(), cuEventRecord(event, s)).unwrap();
            cu_call!(driver(), cuEventSynchronize(event)).unwrap();
        }
        assert_eq!(vmm_unmap(ptr), CUresult::CUDA_SUCCESS);
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        assert_eq!(stream_sync_code(s), ILLEGAL_ADDRESS);
        let mut ms = 0f32;
        // SAFETY: a valid out-pointer; plain values.
        unsafe {
            assert_eq!(code!(driver(), cuEventQuery(event)), ILLEGAL_ADDRESS, "a query");
            assert_eq!(code!(driver(), cuEventSynchronize(event)), ILLEGAL_ADDRESS, "a wait");
            assert_eq!(code!(driver(), cuEventElapsedTime_v2(&mut ms, event, event)), ILLEGAL_ADDRESS, "timing");
            assert_eq!(code!(driver(), cuEventDestroy_v2(event)), ILLEGAL_ADDRESS, "the destruction reports it");
            assert_eq!(code!(driver(), cuEventQuery(event)), CUresult::CUDA_ERROR_INVALID_HANDLE, "and destroyed it");
        }
        assert_sticky_illegal_address(s);
        vmm_release(ptr, handle);
    });
}

/// The same for a `cuMemAlloc` buffer freed between the capture and the launch: the launch's
/// memset faults instead of writing memory that is no longer the application's.
#[test]
fn replaying_over_freed_device_memory_is_an_illegal_address() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let device = DeviceBuffer::new(64);
        let (s, graph) = capture(RELAXED, |s| {
            memset_async(device.ptr, 9, 64, s);
            dtod_async(pinned.dptr(), device.ptr, 8, s);
        });
        let exec = launch_once(graph, s);
        assert_eq!(pinned.read(), vec![9; 8], "live memory: the replay runs");
        let freed = device.ptr;
        drop(device);
        pinned.fill(0);
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        assert_sticky_illegal_address(s);
        assert_eq!(pinned.read(), vec![0; 8], "nothing ran from memory gone: {freed:#x}");
    });
}

/// Stream work (not captured) enqueued on VMM memory that is unmapped before the work runs
/// faults too (the simulator used to crash); `cuMemUnmap` waits for work touching the memory.
#[test]
fn work_on_vmm_memory_unmapped_before_it_runs_is_an_illegal_address() {
    in_child!(&[], || {
        use_device(0);
        let (ptr, handle) = vmm_memory();
        let s = non_blocking_stream();
        let (gate, _guard) = Gate::new();
        common::hold(gate, driver(), s);
        memset_async(ptr, 3, 64, s);
        assert_eq!(vmm_unmap(ptr), CUresult::CUDA_SUCCESS);
        gate.open();
        assert_sticky_illegal_address(s);
        vmm_release(ptr, handle);
    });
}

/// A copy from pageable host memory captured into a graph reads its source when a launch runs
/// it (as a memcpy node does), not the bytes it held at capture time; `cuda.h` does not refuse
/// pageable memory in a capture.
#[test]
fn a_captured_pageable_copy_reads_its_source_at_each_launch() {
    in_child!(&[], || {
        use_device(0);
        let device = DeviceBuffer::new(16);
        let mut source = [1u8; 16];
        let (s, graph) = capture(RELAXED, |s| {
            // SAFETY: `source` outlives every launch (synchronized below).
            unsafe { cu_call!(driver(), cuMemcpyHtoDAsync_v2(device.ptr, source.as_ptr().cast(), 16, s)) }.unwrap();
        });
        source.fill(2);
        let exec = launch_once(graph, s);
        assert_eq!(device.read(), vec![2; 16], "the source as it is at the launch");
        source.fill(3);
        assert_eq!(launch(exec, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(device.read(), vec![3; 16], "and at the next");
        destroy_both(exec, graph);
    });
}

/// The graph handle of a capture under way (`cuStreamGetCaptureInfo`).
fn capturing_graph(s: CUstream) -> CUgraph {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the others null.
    unsafe {
        cu_call!(
            driver(),
            cuStreamGetCaptureInfo_v3(
                s,
                &mut status,
                std::ptr::null_mut(),
                &mut graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            )
        )
    }
    .unwrap();
    graph
}

/// A stream destroyed during its capture ends the capture without a graph: the user object
/// references its graph was given are released (the destructor runs), its graph handle is gone.
#[test]
fn destroying_a_capturing_stream_releases_its_graph_s_user_objects() {
    in_child!(&[], || {
        use_device(0);
        let device = DeviceBuffer::new(16);
        let s = non_blocking_stream();
        begin(s, GLOBAL);
        memset_async(device.ptr, 5, 16, s);
        let graph = capturing_graph(s);
        let object = user_object(0x5000, 1);
        assert_eq!(graph_retain(graph, object, 1, MOVE), CUresult::CUDA_SUCCESS);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuStreamDestroy_v2(s)) }.unwrap();
        wait_destroyed(0x5000);
        assert_eq!(graph_retain(graph, object, 1, 0), INVALID_VALUE, "the capture's graph is gone");
        assert_eq!(mem_alloc_code(), CUresult::CUDA_SUCCESS, "the global capture no longer prohibits calls");
    });
}

/// `live_objects` counts user objects, graphs and executable graphs, so leak checks see them.
#[test]
fn live_objects_count_user_objects_and_graphs() {
    in_child!(&[], || {
        use cuda_sim::testing::live_objects;
        use_device(0);
        let device = DeviceBuffer::new(16);
        let before = live_objects(driver()).unwrap();
        let object = user_object(0x6000, 1);
        let (_, graph) = capture(RELAXED, |s| memset_async(device.ptr, 1, 16, s));
        let exec = instantiate(graph);
        let during = live_objects(driver()).unwrap();
        assert_eq!(
            (during.user_objects, during.graphs, during.executable_graphs),
            (before.user_objects + 1, before.graphs + 1, before.executable_graphs + 1)
        );
        destroy_both(exec, graph);
        assert_eq!(user_release(object, 1), CUresult::CUDA_SUCCESS);
        wait_destroyed(0x6000);
        assert_eq!(live_objects(driver()).unwrap(), before);
    });
}

/// Destroying a context (resetting a primary one) unmaps its graph allocations, which stop
/// counting as used graph memory.
#[test]
fn destroying_a_context_releases_its_graph_memory() {
    in_child!(&[], || {
        use_device(0);
        let (s, graph) = capture(RELAXED, |s| {
            alloc_async(MIB, s).unwrap();
        });
        launch_once(graph, s);
        assert_eq!(graph_memory(), [2, 2, 2, 2]);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuDevicePrimaryCtxReset_v2(0)) }.unwrap();
        assert_eq!(graph_memory(), [0, 2, 2, 2], "no longer used; reserved until trimmed");
    });
}

/// The capture id a stream reports (`cuStreamGetCaptureInfo`), if it captures.
fn capture_id(s: CUstream) -> Option<u64> {
    let mut status = CUstreamCaptureStatus(99);
    let mut id = 0u64;
    // SAFETY: valid out-pointers; the others are null, which the call allows.
    unsafe {
        cu_call!(
            driver(),
            cuStreamGetCaptureInfo_v3(
                s,
                &mut status,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            )
        )
    }
    .unwrap();
    (status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE).then_some(id)
}

/// `cuStreamEndCapture`'s code, and the graph it gave (destroyed here).
fn end_code(s: CUstream) -> (CUresult, bool) {
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer.
    let code = unsafe { code!(driver(), cuStreamEndCapture(s, &mut graph)) };
    let made = !graph.is_null();
    if made {
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);
    }
    (code, made)
}

/// Cross-stream capture: a stream that waits for an event recorded in a capture joins it (its
/// work goes into the same graph, replayed by each launch), is ended with it, and must have
/// rejoined its origin first.
#[test]
fn a_stream_waiting_for_a_captured_event_joins_the_capture_and_must_rejoin() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(8);
        let (origin, forked) = (non_blocking_stream(), non_blocking_stream());
        let (fork, join) =
            (event(CUevent_flags::CU_EVENT_DISABLE_TIMING), event(CUevent_flags::CU_EVENT_DISABLE_TIMING));
        begin(origin, RELAXED);
        memset_async(pinned.dptr(), 1, 8, origin);
        record(fork, origin);
        assert_eq!(status(forked), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        wait_event(forked, fork);
        assert_eq!(status(forked), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "joined");
        assert_eq!(capture_id(forked), capture_id(origin), "the same capture");
        memset_async(pinned.dptr() + 4, 2, 4, forked);
        // Only the origin ends it, and not before the forked stream rejoined.
        assert_eq!(end_code(forked), (CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, false));
        // SAFETY: no pointers.
        let begun_again = unsafe { code!(driver(), cuStreamBeginCapture_v2(forked, RELAXED)) };
        assert_eq!(begun_again, CUresult::CUDA_ERROR_ILLEGAL_STATE, "it captures already");
        record(join, forked);
        wait_event(origin, join);
        let graph = end(origin);
        assert_eq!(status(forked), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, "ended with its origin");
        sync(forked);
        assert_eq!(pinned.read(), vec![0; 8], "captured, not run");
        let exec = launch_once(graph, origin);
        assert_eq!(pinned.read(), [[1; 4], [2; 4]].concat(), "both streams' work in the graph");
        destroy_both(exec, graph);

        // Work after the last rejoin: unjoined, no graph.
        begin(origin, RELAXED);
        record(fork, origin);
        wait_event(forked, fork);
        record(join, forked);
        wait_event(origin, join);
        memset_async(pinned.dptr(), 3, 4, forked);
        assert_eq!(end_code(origin), (CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED, false));
        assert_eq!(status(forked), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        // A joined stream with no work of its own must rejoin too (the conservative reading).
        begin(origin, RELAXED);
        record(fork, origin);
        wait_event(forked, fork);
        assert_eq!(end_code(origin), (CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED, false));
        sync(forked);
        sync(origin);
        assert_eq!(pinned.read(), [[1; 4], [2; 4]].concat(), "nothing of the failed captures ran");
    });
}

/// Rejoining through another stream of the capture counts: the origin follows what the stream
/// it waited for followed. A stream capturing one sequence cannot wait for another's event.
/// `CU_EVENT_WAIT_EXTERNAL` is refused outside a capture; the default streams cannot join.
#[test]
fn a_capture_rejoins_through_its_streams_and_two_captures_do_not_merge() {
    in_child!(&[], || {
        use_device(0);
        let pinned = Pinned::new(4);
        let (origin, a, b) = (non_blocking_stream(), non_blocking_stream(), non_blocking_stream());
        let flags = CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let (fork, from_b, from_a) = (event(flags), event(flags), event(flags));
        begin(origin, RELAXED);
        record(fork, origin);
        wait_event(a, fork);
        wait_event(b, fork);
        memset_async(pinned.dptr(), 5, 4, b);
        record(from_b, b);
        wait_event(a, from_b);
        record(from_a, a);
        wait_event(origin, from_a);
        let graph = end(origin);
        assert_eq!(graph_destroy(graph), CUresult::CUDA_SUCCESS);

        // `CU_EVENT_WAIT_EXTERNAL` is for captures only.
        let plain = event(flags);
        record(plain, a);
        // SAFETY: no pointers.
        let external = unsafe { code!(driver(), cuStreamWaitEvent(a, plain, 0x1)) };
        assert_eq!(external, CUresult::CUDA_ERROR_INVALID_VALUE, "outside a capture");

        let other = non_blocking_stream();
        begin(origin, RELAXED);
        // SAFETY: no pointers.
        let external = unsafe { code!(driver(), cuStreamWaitEvent(origin, plain, 0x1)) };
        assert_eq!(external, CUresult::CUDA_SUCCESS, "in a capture");
        begin(other, RELAXED);
        record(fork, origin);
        // SAFETY: no pointers.
        let merged = unsafe { code!(driver(), cuStreamWaitEvent(other, fork, 0)) };
        assert_eq!(merged, CUresult::CUDA_ERROR_STREAM_CAPTURE_MERGE);
        // The default streams cannot capture, so they cannot join either.
        for (default, refused) in [
            (0x1 as CUstream, CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
            (0x2 as CUstream, CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        ] {
            // SAFETY: no pointers.
            let joined = unsafe { code!(driver(), cuStreamWaitEvent(default, fork, 0)) };
            assert_eq!(joined, refused, "{default:?}");
            assert_eq!(status(default), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        }
        assert!(capture_id(other).is_some(), "its own capture goes on");
        assert_ne!(capture_id(other), capture_id(origin));
        assert_eq!(graph_destroy(end(other)), CUresult::CUDA_SUCCESS);
        assert_eq!(graph_destroy(end(origin)), CUresult::CUDA_SUCCESS);
    });
}
