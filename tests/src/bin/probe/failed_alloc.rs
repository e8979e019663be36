//! Question 5: whether a failed pool allocation moves the pool's usage counts. The simulator
//! changes nothing on a failure (its high-water marks once rose by the size refused, about
//! 1 TiB after one failure); what does the driver do? A pool with a maximum size is asked for
//! more than its maximum, a pool without one for more than the device has, and for `SIZE_MAX`
//! bytes, each with one live allocation, and the four counts are read before and after.

use crate::owned::{OwnedPool, OwnedStream, PoolAllocation, alloc_from_pool, free_async};
use crate::raw::{code, device_location, memory_info, pool_props, pool_usage};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "failed-alloc-marks",
    question: "A failed cuMemAllocFromPoolAsync (beyond the pool's maximum size, beyond the device's memory, SIZE_MAX): \
               do the pool's reserved and used counts, high-water marks included, change?",
    run,
    child: None,
};

/// The maximum size of the limited pool, and the allocation that stays live in each pool.
const MAX_SIZE: usize = 32 << 20;
const LIVE: usize = 4 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let (_, total) = memory_info()?;
    let stream = OwnedStream::new(false)?;
    let limited = OwnedPool::new(&pool_props(device_location(0), false, MAX_SIZE))?;
    let unlimited = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let over_max = attempt(details, "over_the_pool_maximum", &limited, 2 * MAX_SIZE, &stream)?;
    let over_device = attempt(details, "over_the_device_memory", &unlimited, total.saturating_mul(2), &stream)?;
    let size_max = attempt(details, "size_max", &unlimited, usize::MAX, &stream)?;
    Ok(format!("over the pool's maximum: {over_max}; over the device's memory: {over_device}; SIZE_MAX: {size_max}"))
}

/// One live allocation in `pool`, then one of `size` bytes: the counts before and after the
/// attempt, and what it returned.
fn attempt(
    details: &mut Details,
    name: &str,
    pool: &OwnedPool,
    size: usize,
    stream: &OwnedStream,
) -> Result<String, Error> {
    let _live = PoolAllocation::new(pool.raw(), LIVE, stream)?;
    stream.synchronize()?;
    let before = pool_usage(pool.raw());
    let result = alloc_from_pool(pool.raw(), size, stream.raw());
    let after = pool_usage(pool.raw());
    details.put(format!("{name}.size"), size);
    details.put(format!("{name}.result"), code(&result));
    details.put(format!("{name}.before"), &before);
    details.put(format!("{name}.after"), &after);
    if let Ok(ptr) = result {
        let freed = free_async(ptr, stream.raw()).and_then(|()| stream.synchronize());
        details.put(format!("{name}.free"), code(&freed));
        return Ok(format!("it SUCCEEDED ({size} bytes)"));
    }
    Ok(if before == after {
        format!("{}, counts unchanged", code(&result))
    } else {
        format!("{}, counts CHANGED", code(&result))
    })
}
