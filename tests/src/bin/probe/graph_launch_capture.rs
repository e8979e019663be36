//! Question 21: launching a graph into a capturing stream. `cuda.h` does not say whether
//! `cuGraphLaunch` (or `cuGraphUpload`) may be captured; the simulator refuses both with
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and leaves the capture valid, where a GPU may add a
//! child graph node. A graph of one memset is captured and instantiated; another stream begins
//! a capture, captures a memset, then launches (or uploads) the executable graph.

use cuda_mem_sys::types::CUstreamCaptureMode;

use crate::capture::end_described;
use crate::owned::{DeviceAllocation, OwnedGraphExec, OwnedStream};
use crate::raw::{Call, code, memset_async};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "graph-launch-into-capture",
    question: "cuGraphLaunch (and cuGraphUpload) of an executable graph on a stream that is capturing (global mode): \
               the call's result, the capture's status after, and the captured graph's nodes",
    run,
    child: None,
};

/// The size of the memory the memsets write.
const SIZE: usize = 1 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let buffer = DeviceAllocation::new(SIZE)?;
    let source = OwnedStream::new(false)?;
    source.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    memset_async(buffer.ptr(), 1, SIZE, source.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
    let (ended, graph) = source.end_capture();
    ended.map_err(|e| format!("ending the first capture: {e}"))?;
    let exec = graph.instantiate().map_err(|e| format!("instantiating the graph: {e}"))?;
    let launch = case("launch", &exec, OwnedGraphExec::launch, buffer.ptr(), details)?;
    let upload = case("upload", &exec, OwnedGraphExec::upload, buffer.ptr(), details)?;
    Ok(format!("cuGraphLaunch {launch}; cuGraphUpload {upload}"))
}

/// One call into a fresh capture: its outcome, the status after and the captured nodes.
fn case(
    name: &str,
    exec: &OwnedGraphExec,
    call: fn(&OwnedGraphExec, cuda_mem_sys::types::CUstream) -> Call,
    ptr: cuda_mem_sys::types::CUdeviceptr,
    details: &mut Details,
) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    memset_async(ptr, 2, SIZE, stream.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
    let outcome = code(&call(exec, stream.raw()));
    Ok(end_described(name, &stream, &outcome, details))
}
