//! Question 10: a zero-byte `cuMemAllocFromPoolAsync`. cuda.core passes 0 to the driver and frees
//! whatever comes back with `cuMemFreeAsync`, and its tests pass on GPUs; the simulator returns a
//! unique non-null pointer that must be freed. Does the driver return null or a pointer, does the
//! free succeed, and does a second free fail?

use crate::owned::{OwnedPool, OwnedStream, alloc_from_pool, free_async};
use crate::raw::{code, device_location, pool_props, pool_usage};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "zero-byte-pool-allocation",
    question: "cuMemAllocFromPoolAsync of 0 bytes: its result, the pointer (null or not, distinct per call), the pool's \
               usage, and cuMemFreeAsync of the pointer (once, twice)",
    run,
    child: None,
};

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let first = alloc_from_pool(pool.raw(), 0, stream.raw());
    let second = alloc_from_pool(pool.raw(), 0, stream.raw());
    details.put("first.result", code(&first));
    details.put("second.result", code(&second));
    details.put("usage", pool_usage(pool.raw()));
    let (Ok(a), Ok(b)) = (first.as_ref().copied(), second.as_ref().copied()) else {
        for ptr in [first, second].into_iter().flatten() {
            details.put("cleanup_free", code(&free_async(ptr, stream.raw())));
        }
        return Ok(format!("refused: {}", details.get("first.result").unwrap_or("?")));
    };
    let pointers = match (a, b) {
        (0, 0) => "null both times".to_string(),
        (a, b) if a == b => "the same non-null pointer twice".to_string(),
        _ if a == 0 || b == 0 => "null once".to_string(),
        _ => "two distinct non-null pointers".to_string(),
    };
    let free = free_async(a, stream.raw());
    let again = free_async(a, stream.raw());
    let other = free_async(b, stream.raw());
    stream.synchronize()?;
    details.put("free", code(&free));
    details.put("free_again", code(&again));
    details.put("free_second", code(&other));
    Ok(format!("succeeds: {pointers}; cuMemFreeAsync {}, again {}", code(&free), code(&again)))
}
