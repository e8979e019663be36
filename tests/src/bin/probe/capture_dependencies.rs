//! Question 30: a capture's dependencies. `cuda.h` defines the set `cuStreamGetCaptureInfo`
//! reports (the nodes the next captured node will depend on) and `cuStreamUpdateCaptureDependencies`,
//! but not which calls make nodes or which updates are refused; the simulator's readings are in
//! `cuda-sim/src/conservative.rs`: an event recorded in a capture makes no node, a wait for an
//! event recorded outside a capture makes a `WAIT_EVENT` node (with or without
//! `CU_EVENT_WAIT_EXTERNAL`), and an update naming a node twice, another graph's node, or
//! edge data other than the default is `CUDA_ERROR_INVALID_VALUE`.

use cuda_mem_sys::types::{CUevent, CUgraphEdgeData, CUgraphNode, CUgraphNodeType, CUstream, CUstreamCaptureMode};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::capture::short;
use crate::owned::{DeviceAllocation, OwnedEvent, OwnedStream};
use crate::raw::{Call, code, error_code, graph_node_types, memset_async, node_type_name, stream_wait_event};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "capture-dependencies",
    question: "During a global-mode capture, the dependency set cuStreamGetCaptureInfo reports: after a captured \
               memset, after cuEventRecord on the capturing stream, on another stream waiting for that event, after a \
               wait for an event recorded outside the capture (without, then with CU_EVENT_WAIT_EXTERNAL); \
               cuStreamUpdateCaptureDependencies with flags 2, a node named twice, another capture's node, programmatic \
               edge data, replacing the set with none, and on a stream not capturing; the captured graph's nodes",
    run,
    child: None,
};

/// The size of the memory the memsets write.
const SIZE: usize = 1 << 20;
/// `CU_EVENT_WAIT_EXTERNAL`.
const WAIT_EXTERNAL: u32 = 0x1;
/// `CU_STREAM_SET_CAPTURE_DEPENDENCIES`.
const SET: u32 = 0x1;
const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let buffer = DeviceAllocation::new(SIZE)?;
    let (stream, other, unrelated, idle) =
        (OwnedStream::new(false)?, OwnedStream::new(false)?, OwnedStream::new(false)?, OwnedStream::new(false)?);
    let (captured, joined, outside) = (OwnedEvent::new()?, OwnedEvent::new()?, OwnedEvent::new()?);
    outside.record(idle.raw())?;
    // Another capture, whose node the update is given.
    unrelated.begin_capture(GLOBAL)?;
    memset_async(buffer.ptr(), 9, SIZE, unrelated.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
    let foreign = dependencies(unrelated.raw()).map_err(|e| format!("the other capture's set: {e}"))?;

    stream.begin_capture(GLOBAL)?;
    memset_async(buffer.ptr(), 1, SIZE, stream.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
    let memset = dependencies(stream.raw()).map_err(|e| format!("the set after a memset: {e}"))?;
    let mut phrases = vec![format!("after a memset {}", record(details, "memset", &Ok(memset.clone())))];
    captured.record(stream.raw())?;
    let after_record = dependencies(stream.raw());
    phrases.push(format!("after cuEventRecord {}", compared(details, "event_record", &after_record, &memset)));
    let waited = stream_wait_event(other.raw(), captured.raw());
    details.put("other_stream.wait", code(&waited));
    let other_set = dependencies(other.raw());
    phrases.push(format!("the stream waiting for it {}", compared(details, "other_stream", &other_set, &memset)));
    // The other stream rejoins, so that the capture can end with a graph.
    details.put(
        "other_stream.rejoin",
        code(&joined.record(other.raw()).and_then(|()| stream_wait_event(stream.raw(), joined.raw()))),
    );
    let plain = wait(stream.raw(), outside.raw(), 0);
    details.put("wait_outside.call", code(&plain));
    phrases.push(format!(
        "after a wait for an event recorded outside {}",
        record(details, "wait_outside", &dependencies(stream.raw()))
    ));
    let external = wait(stream.raw(), outside.raw(), WAIT_EXTERNAL);
    details.put("wait_external.call", code(&external));
    phrases
        .push(format!("with CU_EVENT_WAIT_EXTERNAL {}", record(details, "wait_external", &dependencies(stream.raw()))));

    let mut updates = Vec::new();
    let mut try_update = |name: &str, nodes: &[CUgraphNode], edges: Option<CUgraphEdgeData>, flags: u32| {
        let call = update(stream.raw(), nodes, edges, flags);
        details.put(format!("update.{name}"), code(&call));
        updates.push(format!("{name} {}", short(&code(&call))));
    };
    try_update("flags 2", &memset, None, 2);
    try_update("a node twice", &[memset[0], memset[0]], None, 0);
    try_update("another capture's node", &foreign, None, 0);
    try_update("programmatic edge data", &memset, Some(CUgraphEdgeData { type_: 1, ..Default::default() }), 0);
    try_update("set to none", &[], None, SET);
    let emptied = dependencies(stream.raw());
    updates.push(format!("then {}", record(details, "update.after_set_none", &emptied)));
    let (ended, graph) = stream.end_capture();
    let nodes = if graph.is_null() { "no graph".to_string() } else { graph_node_types(graph.raw()) };
    details.put("end", code(&ended));
    details.put("nodes", &nodes);
    let (unrelated_end, _unrelated_graph) = unrelated.end_capture();
    details.put("other_capture.end", code(&unrelated_end));
    let not_capturing = update(idle.raw(), &[], None, 0);
    details.put("update.not_capturing", code(&not_capturing));
    updates.push(format!("not capturing {}", short(&code(&not_capturing))));
    Ok(format!(
        "{}; cuStreamUpdateCaptureDependencies: {}; end {} (nodes: {nodes})",
        phrases.join(", "),
        updates.join(", "),
        short(&code(&ended))
    ))
}

/// A set as the answer shows it: its nodes' types (`none`), recorded under `key`.
fn record(details: &mut Details, key: &str, set: &Result<Vec<CUgraphNode>, CudaError>) -> String {
    let text = match set {
        Ok(nodes) if nodes.is_empty() => "none".to_string(),
        Ok(nodes) => nodes.iter().map(|&n| node_type(n)).collect::<Vec<_>>().join("+"),
        Err(e) => format!("not read ({})", failure(e)),
    };
    details.put(key, &text);
    format!("[{text}]")
}

/// A set compared with `earlier`: `the same` when it holds the same nodes, else its types.
fn compared(
    details: &mut Details,
    key: &str,
    set: &Result<Vec<CUgraphNode>, CudaError>,
    earlier: &[CUgraphNode],
) -> String {
    match set {
        Ok(nodes) if nodes == earlier => {
            details.put(key, "the same nodes");
            "[the same]".to_string()
        }
        _ => record(details, key, set),
    }
}

/// A failed call's outcome as the answer shows it.
fn failure(error: &CudaError) -> String {
    match error {
        CudaError::Driver(e) => short(&e.name).to_string(),
        CudaError::Load(e) => format!("unavailable ({e})"),
    }
}

/// A node's type name, or the error `cuGraphNodeGetType` returned.
fn node_type(node: CUgraphNode) -> String {
    let kind = (|| {
        let d = driver()?;
        let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `kind` is a valid out-pointer; the node is one the driver reported.
        unsafe { cu_call!(d, cuGraphNodeGetType(node, &mut kind)) }?;
        Ok::<_, CudaError>(kind)
    })();
    match kind {
        Ok(kind) => node_type_name(kind),
        Err(e) => error_code(e),
    }
}

/// The dependency set `cuStreamGetCaptureInfo` reports for a capturing stream.
fn dependencies(stream: CUstream) -> Result<Vec<CUgraphNode>, CudaError> {
    let d = driver()?;
    let mut status = cuda_mem_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut nodes: *const CUgraphNode = std::ptr::null();
    let mut count = 0usize;
    // SAFETY: valid out-pointers; the id, graph and edge data are not asked for.
    unsafe {
        cu_call!(
            d,
            cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut nodes,
                std::ptr::null_mut(),
                &mut count
            )
        )
    }?;
    if count == 0 || nodes.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the driver's array holds `count` handles until the next call on the stream.
    Ok(unsafe { std::slice::from_raw_parts(nodes, count) }.to_vec())
}

/// `cuStreamUpdateCaptureDependencies` with `nodes`, each with `edges` when given.
fn update(stream: CUstream, nodes: &[CUgraphNode], edges: Option<CUgraphEdgeData>, flags: u32) -> Call {
    let d = driver()?;
    let mut nodes = nodes.to_vec();
    let edges: Option<Vec<CUgraphEdgeData>> = edges.map(|edge| vec![edge; nodes.len()]);
    let edges_ptr = edges.as_ref().map_or(std::ptr::null(), |e| e.as_ptr());
    // SAFETY: `nodes` (and the edge data, when given) hold `len` entries; the stream is alive.
    unsafe {
        cu_call!(d, cuStreamUpdateCaptureDependencies_v2(stream, nodes.as_mut_ptr(), edges_ptr, nodes.len(), flags))
    }
}

/// `cuStreamWaitEvent` with `flags`.
fn wait(stream: CUstream, event: CUevent, flags: u32) -> Call {
    let d = driver()?;
    // SAFETY: the stream and the event are the caller's, alive.
    unsafe { cu_call!(d, cuStreamWaitEvent(stream, event, flags)) }
}
