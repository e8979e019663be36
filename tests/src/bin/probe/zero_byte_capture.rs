//! Question 28: zero bytes allocated on a capturing stream. cuda.core's `GraphMemoryResource`
//! passes 0 to `cuMemAllocAsync` while a graph is being built, and its `test_graph_mem_alloc_zero`
//! (which launches that graph) passes on GPUs; the simulator makes an allocation node with a
//! unique non-null address that counts for no graph memory (`cuda-sim/src/conservative.rs`). For
//! `cuMemAllocAsync` and `cuMemAllocFromPoolAsync` (an explicit pool), each in a fresh global-mode
//! capture: the call's result, the pointer, the captured graph's nodes, then the graph
//! instantiated, launched and synchronized, and the pointer freed with `cuMemFreeAsync` after.

use cuda_mem_sys::CudaError;
use cuda_mem_sys::types::{CUdeviceptr, CUstream, CUstreamCaptureMode};

use crate::capture::short;
use crate::owned::{OwnedPool, OwnedStream, alloc_from_pool, free_async};
use crate::raw::{alloc_async, code, device_location, graph_node_types, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "zero-byte-allocation-in-capture",
    question: "On a stream capturing in global mode, cuMemAllocAsync of 0 bytes (and cuMemAllocFromPoolAsync of 0 \
               bytes from an explicit pool): the result, the pointer (null or not), the captured graph's nodes, \
               launching the graph, and cuMemFreeAsync of the pointer after the launch",
    run,
    child: None,
};

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let device_pool = case("cuMemAllocAsync", |stream| alloc_async(0, stream), details)?;
    let from_pool = case("cuMemAllocFromPoolAsync", |stream| alloc_from_pool(pool.raw(), 0, stream), details)?;
    Ok(format!("cuMemAllocAsync {device_pool}; cuMemAllocFromPoolAsync {from_pool}"))
}

/// One zero-byte allocation in a fresh capture, then the graph launched and the pointer freed.
fn case(
    name: &str,
    allocate: impl FnOnce(CUstream) -> Result<CUdeviceptr, CudaError>,
    details: &mut Details,
) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    let allocated = allocate(stream.raw());
    let pointer = match allocated {
        Ok(0) => "null",
        Ok(_) => "non-null",
        Err(_) => "none",
    };
    let (ended, graph) = stream.end_capture();
    let nodes = if graph.is_null() { "no graph".to_string() } else { graph_node_types(graph.raw()) };
    details.put(format!("{name}.result"), code(&allocated));
    details.put(format!("{name}.pointer"), pointer);
    details.put(format!("{name}.end"), code(&ended));
    details.put(format!("{name}.nodes"), &nodes);
    let mut phrase =
        format!("{}, pointer {pointer}, end {} (nodes: {nodes})", short(&code(&allocated)), short(&code(&ended)));
    if graph.is_null() {
        return Ok(phrase);
    }
    let (exec, launched) = match graph.instantiate() {
        Ok(exec) => {
            let launched = exec.launch(stream.raw()).and_then(|()| stream.synchronize());
            (Some(exec), launched)
        }
        Err(e) => (None, Err(e)),
    };
    details.put(format!("{name}.launch"), code(&launched));
    phrase.push_str(&format!("; launched {}", short(&code(&launched))));
    if let Ok(ptr) = allocated {
        let freed = free_async(ptr, stream.raw()).and_then(|()| stream.synchronize());
        details.put(format!("{name}.free_after_the_launch"), code(&freed));
        phrase.push_str(&format!(", cuMemFreeAsync after {}", short(&code(&freed))));
    }
    drop(exec);
    Ok(phrase)
}
