//! Question 22: allocating on a capturing stream. `cuMemAllocAsync` there makes a graph
//! allocation node; so does `cuMemAllocFromPoolAsync` from an explicit pool, `cuda.h` notes ("the
//! allocation is owned by the graph instead of the memory pool. The memory pool's properties are
//! used to set the node's creation parameters"), and so the simulator makes one, on the pool's
//! device, leaving the pool's usage alone (a pool no allocation node can take is
//! `CUDA_ERROR_NOT_SUPPORTED`). Each allocation is freed in the same capture, so the graph owns
//! nothing afterwards; the graph is not launched. The pool's usage after says whether the pool or
//! the graph counted the allocation. Zero-byte allocations are question 28
//! ([`crate::zero_byte_capture`]).

use cuda_mem_sys::CudaError;
use cuda_mem_sys::types::{CUdeviceptr, CUstreamCaptureMode};

use crate::capture::end_described;
use crate::owned::{OwnedPool, OwnedStream, alloc_from_pool, free_async};
use crate::raw::{alloc_async, code, device_location, pool_props, pool_usage};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "pool-alloc-in-capture",
    question: "On a stream capturing in global mode: cuMemAllocFromPoolAsync from an explicit pool, and \
               cuMemAllocAsync, each freed with cuMemFreeAsync in the capture: the results, the capture's status, and \
               the captured graph's nodes",
    run,
    child: None,
};

/// The size allocated.
const SIZE: usize = 1 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let from_pool = case("cuMemAllocFromPoolAsync", |stream| alloc_from_pool(pool.raw(), SIZE, stream), details)?;
    details.put("pool_usage_after", pool_usage(pool.raw()));
    let device_pool = case("cuMemAllocAsync", |stream| alloc_async(SIZE, stream), details)?;
    Ok(format!("cuMemAllocFromPoolAsync {from_pool}; cuMemAllocAsync {device_pool}"))
}

/// One allocation in a fresh capture, freed in it: the outcomes, the status and the nodes.
fn case(
    name: &str,
    allocate: impl FnOnce(cuda_mem_sys::types::CUstream) -> Result<CUdeviceptr, CudaError>,
    details: &mut Details,
) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    let allocated = allocate(stream.raw());
    let outcome = code(&allocated);
    if let Ok(ptr) = allocated {
        // Freed before the status is read: a free node, or the free's own refusal.
        details.put(format!("{name}.free_in_the_capture"), code(&free_async(ptr, stream.raw())));
    }
    Ok(end_described(name, &stream, &outcome, details))
}
