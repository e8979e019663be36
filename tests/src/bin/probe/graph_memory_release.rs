//! Question 29: when a device's graph memory stops counting as used. `cuda.h` calls
//! `USED_MEM_CURRENT` the memory "currently associated with graphs" and has
//! `cuDeviceGraphMemTrim` free what is "not in use by a graph that is either currently executing
//! or scheduled to execute"; cuda.core's `test_graph_mem_set_attributes`, which passes on GPUs,
//! frees a launched graph's allocation, synchronizes, and expects the usage not reduced yet. The
//! simulator keeps the memory of a freed allocation used while its executable graph exists (its
//! next launch reuses it), until the executable graph is destroyed or a trim unmaps it. Two
//! graphs of one 1 MiB allocation each: A leaves it to be freed outside (`cuMemFreeAsync` after
//! the launch), B frees it in the graph; the counters after each step.

use cuda_mem_sys::types::{CUdevice, CUstreamCaptureMode};

use crate::capture::short;
use crate::graph_memory::{counters, device_zero, trim};
use crate::owned::{OwnedStream, free_async};
use crate::raw::{Call, alloc_async, code};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "graph-memory-release",
    question: "Graph memory USED_MEM_CURRENT and RESERVED_MEM_CURRENT of a graph allocating 1 MiB and freeing it \
               outside (cuMemFreeAsync, synchronized) after each launch: after the launch, after the free, after a \
               second launch and free, after cuGraphExecDestroy; of a graph allocating and freeing 1 MiB in the graph: \
               after its launch, after cuDeviceGraphMemTrim, after a second launch, after cuGraphExecDestroy, after \
               another trim",
    run,
    child: None,
};

/// The size each graph allocates.
const SIZE: usize = 1 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let device = device_zero()?;
    // Start from an empty reserve: what earlier questions' graphs left behind goes back.
    details.put("trim_first", code(&trim(device)));
    details.put("before", counters(device));
    let outside = freed_outside(device, details)?;
    let inside = freed_in_the_graph(device, details)?;
    Ok(format!("freed outside: {outside}; freed in the graph: {inside}"))
}

/// Records the counters under `key` and returns `key counters` for the answer.
fn observe(device: CUdevice, key: &str, details: &mut Details) -> String {
    let now = counters(device);
    details.put(key, &now);
    format!("{} {now}", key.rsplit('.').next().unwrap_or(key).replace('_', " "))
}

/// `what` failed: the step's error, as the answer shows it.
fn failed(what: &str, call: &Call) -> Option<String> {
    call.as_ref().err().map(|_| format!("{what} {}", short(&code(call))))
}

/// Graph A: its allocation freed after each launch, outside the graph.
fn freed_outside(device: CUdevice, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    let captured = alloc_async(SIZE, stream.raw());
    let (ended, graph) = stream.end_capture();
    ended.map_err(|e| format!("ending the capture: {e}"))?;
    let ptr = captured.map_err(|e| format!("capturing cuMemAllocAsync: {e}"))?;
    let exec = graph.instantiate().map_err(|e| format!("instantiating the graph: {e}"))?;
    let mut steps = Vec::new();
    for round in ["first", "second"] {
        let launched = exec.launch(stream.raw()).and_then(|()| stream.synchronize());
        if let Some(error) = failed("launch", &launched) {
            return Ok(error);
        }
        steps.push(observe(device, &format!("outside.{round}.launched"), details));
        let freed = free_async(ptr, stream.raw()).and_then(|()| stream.synchronize());
        if let Some(error) = failed("cuMemFreeAsync", &freed) {
            return Ok(error);
        }
        steps.push(observe(device, &format!("outside.{round}.freed"), details));
    }
    drop(exec);
    steps.push(observe(device, "outside.executable_graph_destroyed", details));
    details.put("outside.trim", code(&trim(device)));
    steps.push(observe(device, "outside.trimmed", details));
    Ok(steps.join(", "))
}

/// Graph B: its allocation freed in the graph.
fn freed_in_the_graph(device: CUdevice, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    let captured = alloc_async(SIZE, stream.raw());
    let freed = match &captured {
        Ok(ptr) => free_async(*ptr, stream.raw()),
        Err(_) => Ok(()),
    };
    let (ended, graph) = stream.end_capture();
    ended.map_err(|e| format!("ending the capture: {e}"))?;
    captured.map_err(|e| format!("capturing cuMemAllocAsync: {e}"))?;
    freed.map_err(|e| format!("capturing cuMemFreeAsync: {e}"))?;
    let exec = graph.instantiate().map_err(|e| format!("instantiating the graph: {e}"))?;
    let mut steps = Vec::new();
    for (round, then_trim) in [("first", true), ("second", false)] {
        let launched = exec.launch(stream.raw()).and_then(|()| stream.synchronize());
        if let Some(error) = failed("launch", &launched) {
            return Ok(error);
        }
        steps.push(observe(device, &format!("inside.{round}.launched"), details));
        if then_trim {
            details.put("inside.trim_with_the_graph", code(&trim(device)));
            steps.push(observe(device, "inside.trimmed_with_the_executable_graph", details));
        }
    }
    drop(exec);
    steps.push(observe(device, "inside.executable_graph_destroyed", details));
    details.put("inside.trim", code(&trim(device)));
    steps.push(observe(device, "inside.trimmed", details));
    Ok(steps.join(", "))
}
