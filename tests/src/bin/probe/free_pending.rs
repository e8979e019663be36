//! Question 13: does `cuMemFree` wait for work still using the memory? `cuda.h`: no implicit
//! synchronization for stream-ordered memory, "may" for other memory. The simulator never waits.
//! A stream is held by a host function, a memset into the memory is enqueued behind it, and
//! `cuMemFree` is timed, for `cuMemAlloc` memory and for pool memory.

use std::time::{Duration, Instant};

use crate::gate::Gate;
use crate::owned::{DeviceAllocation, OwnedPool, OwnedStream, alloc_from_pool};
use crate::raw::{code, device_location, memset_async, pool_props, stream_query};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};
use cuda_mem_sys::{cu_call, driver};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "free-with-pending-work",
    question: "cuMemFree of memory a pending memset (held behind a host function) still uses, for cuMemAlloc and for \
               pool memory: does it return before the stream is released?",
    run,
    child: None,
};

/// How long the host function holds the stream: a free that waits takes this long.
const HOLD: Duration = Duration::from_millis(500);

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let plain = DeviceAllocation::new(4096)?;
    let plain_ptr = plain.ptr();
    // Freed below by cuMemFree itself.
    std::mem::forget(plain);
    let pooled = alloc_from_pool(pool.raw(), 4096, stream.raw())?;
    stream.synchronize()?;
    let mut answers = Vec::new();
    for (name, ptr) in [("cuMemAlloc", plain_ptr), ("pool", pooled)] {
        let gate = Gate::hold(stream.raw(), HOLD)?;
        memset_async(ptr, 1, 4096, stream.raw())?;
        let d = driver()?;
        let started = Instant::now();
        // SAFETY: the allocation is live and freed once.
        let freed = unsafe { cu_call!(d, cuMemFree_v2(ptr)) };
        let took = started.elapsed();
        let pending = code(&stream_query(stream.raw()));
        gate.open();
        stream.synchronize()?;
        let waited = took >= HOLD / 2;
        details.put(format!("{name}.free"), code(&freed));
        details.put(format!("{name}.took_ms"), took.as_millis());
        details.put(format!("{name}.stream_after_free"), &pending);
        answers.push(format!("{name}: {} {}", code(&freed), if waited { "waited" } else { "returned at once" }));
    }
    Ok(answers.join("; "))
}
