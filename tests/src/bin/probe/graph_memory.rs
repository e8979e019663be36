//! Question 20: how a device counts graph memory (`cuDeviceGetGraphMemAttribute`). `cuda.h`
//! names the counters but not their unit; the simulator counts in 2 MiB granules, keeps freed
//! graph memory reserved until `cuDeviceGraphMemTrim`, and reads a high-water mark reset to 0 as
//! the current value (as cuda.core's `GraphMemoryResource` documents). For each size, one
//! `cuMemAllocAsync` is captured, the graph instantiated and launched, and the counters read
//! after the launch, after a `cuMemFreeAsync` outside the graph, and after a trim.

use std::ffi::c_void;

use cuda_mem_sys::types::{CUdevice, CUgraphMem_attribute, CUstreamCaptureMode};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::capture::short;
use crate::owned::{OwnedStream, free_async};
use crate::raw::{Call, alloc_async, code, error_code};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "graph-memory-accounting",
    question: "After a captured cuMemAllocAsync of 1 MiB (and of 3 MiB) is launched: the device's graph memory \
               USED_MEM_CURRENT and RESERVED_MEM_CURRENT, then after a cuMemFreeAsync outside the graph, then after \
               cuDeviceGraphMemTrim; and USED_MEM_HIGH read right after resetting it to 0 while the memory is in use",
    run,
    child: None,
};

const MIB: usize = 1 << 20;

/// The sizes allocated, one graph each.
const SIZES: [usize; 2] = [MIB, 3 * MIB];

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let device = device_zero()?;
    // Start from an empty reserve: what earlier questions' graphs left behind goes back.
    details.put("trim_first", code(&trim(device)));
    details.put("before", counters(device));
    let mut phrases = Vec::new();
    let mut high_after_reset = String::from("not read");
    for size in SIZES {
        let key = format!("{}MiB", size / MIB);
        let stream = OwnedStream::new(false)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .map_err(|e| format!("beginning the capture: {e}"))?;
        let captured = alloc_async(size, stream.raw());
        details.put(format!("{key}.captured_alloc"), code(&captured));
        let (ended, graph) = stream.end_capture();
        ended.map_err(|e| format!("ending the capture: {e}"))?;
        let ptr = captured.map_err(|e| format!("capturing cuMemAllocAsync: {e}"))?;
        let exec = graph.instantiate().map_err(|e| format!("instantiating the graph: {e}"))?;
        exec.launch(stream.raw()).and_then(|()| stream.synchronize()).map_err(|e| format!("launching: {e}"))?;
        let launched = counters(device);
        details.put(format!("{key}.after_launch"), &launched);
        if size == SIZES[0] {
            high_after_reset = reset_and_read_used_high(device, details);
        }
        let freed = free_async(ptr, stream.raw()).and_then(|()| stream.synchronize());
        details.put(format!("{key}.free_outside_the_graph"), code(&freed));
        let after_free = counters(device);
        details.put(format!("{key}.after_free"), &after_free);
        let trimmed = trim(device);
        details.put(format!("{key}.trim"), code(&trimmed));
        let after_trim = counters(device);
        details.put(format!("{key}.after_trim"), &after_trim);
        drop(exec);
        drop(graph);
        let free = if freed.is_ok() { String::new() } else { format!(" (cuMemFreeAsync {})", short(&code(&freed))) };
        phrases
            .push(format!("{} MiB: launched {launched}; freed{free} {after_free}; trimmed {after_trim}", size / MIB));
    }
    Ok(format!("{}; USED_MEM_HIGH reset to 0 with 1 MiB in use reads {high_after_reset}", phrases.join("; ")))
}

/// Resets `USED_MEM_HIGH` to 0 and reads it back (both recorded).
fn reset_and_read_used_high(device: CUdevice, details: &mut Details) -> String {
    let high = CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH;
    let reset = set_attribute(device, high, 0);
    details.put("reset_used_high", code(&reset));
    let read = match (reset, read_attribute(device, high)) {
        (Err(e), _) => format!("nothing (the reset returned {})", error_code(e)),
        (Ok(()), Ok(value)) => mib(value),
        (Ok(()), Err(e)) => error_code(e),
    };
    details.put("used_high_after_reset", &read);
    read
}

/// Device 0.
pub(crate) fn device_zero() -> Result<CUdevice, CudaError> {
    let d = driver()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGet(&mut device, 0)) }?;
    Ok(device)
}

/// The current counters, `used=… reserved=…`, in MiB where whole.
pub(crate) fn counters(device: CUdevice) -> String {
    use CUgraphMem_attribute as A;
    let read = |attribute| match read_attribute(device, attribute) {
        Ok(value) => mib(value),
        Err(e) => error_code(e),
    };
    format!(
        "used={} reserved={}",
        read(A::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
        read(A::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    )
}

/// A byte count as `N MiB` when whole, else in bytes.
fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB as u64) { format!("{} MiB", bytes / MIB as u64) } else { format!("{bytes} B") }
}

/// `cuDeviceGetGraphMemAttribute` (every attribute is a `cuuint64_t`).
fn read_attribute(device: CUdevice, attribute: CUgraphMem_attribute) -> Result<u64, CudaError> {
    let d = driver()?;
    let mut value: u64 = 0;
    // SAFETY: `value` is a valid out-pointer for the 64-bit value each attribute is.
    unsafe { cu_call!(d, cuDeviceGetGraphMemAttribute(device, attribute, (&raw mut value).cast::<c_void>())) }?;
    Ok(value)
}

/// `cuDeviceSetGraphMemAttribute` of a 64-bit value.
fn set_attribute(device: CUdevice, attribute: CUgraphMem_attribute, value: u64) -> Call {
    let d = driver()?;
    let mut value = value;
    // SAFETY: `value` is a valid pointer to the 64-bit value each attribute is.
    unsafe { cu_call!(d, cuDeviceSetGraphMemAttribute(device, attribute, (&raw mut value).cast::<c_void>())) }
}

/// `cuDeviceGraphMemTrim`.
pub(crate) fn trim(device: CUdevice) -> Call {
    let d = driver()?;
    // SAFETY: takes the device by value.
    unsafe { cu_call!(d, cuDeviceGraphMemTrim(device)) }
}
