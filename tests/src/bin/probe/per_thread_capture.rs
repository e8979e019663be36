//! Question 8: another thread's per-thread default stream while a stream captures. In the
//! global mode `cuda.h` forbids "potentially unsafe" calls to every thread while a capture
//! runs, without listing them; the simulator refuses the calls `cuda_sim::conservative` lists.
//! `cuda-mem-core` checks `cuStreamIsCapturing` before every pool allocation and allocates on
//! per-thread default streams, and creates pools: does each call work from another thread, and
//! does it disturb the capture? (On an H100, a global-mode capture in one test refused
//! `cuMemPoolCreate` in tests running on other threads.)

use cuda_mem_sys::types::{CUdeviceptr, CUmemoryPool};

use crate::capture::{MODES, join_modes, short};
use crate::owned::{DeviceAllocation, OwnedPool, OwnedStream, PrimaryContext, alloc_from_pool, free_async};
use crate::raw::{
    LEGACY, PER_THREAD, capture_status, code, device_location, memset_async, pool_props, stream_synchronize,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "per-thread-stream-during-capture",
    question: "While a stream captures in global (and relaxed) mode: from another thread, cuStreamIsCapturing and \
               cuMemAllocFromPoolAsync on that thread's per-thread default stream, cuMemAlloc and cuMemPoolCreate: \
               what do they return, and is the capture still active after?",
    run,
    child: None,
};

/// The size of each allocation and of the captured memset.
const SIZE: usize = 1 << 20;

/// What the other thread saw, and what it could not release while the capture ran.
#[derive(Default)]
struct Seen {
    calls: Vec<(&'static str, String)>,
    /// Pool memory whose free was refused, freed by the main thread after the capture.
    unfreed_pool_memory: Option<CUdeviceptr>,
    /// `cuMemAlloc` memory whose free was refused, likewise.
    unfreed_memory: Option<DeviceAllocation>,
    /// A pool the other thread created, destroyed after the capture.
    created_pool: Option<OwnedPool>,
}

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let buffer = DeviceAllocation::new(SIZE)?;
    let mut summaries = Vec::new();
    for (mode_name, mode) in MODES {
        let stream = OwnedStream::new(true)?;
        stream.begin_capture(mode).map_err(|e| format!("beginning the capture: {e}"))?;
        memset_async(buffer.ptr(), 1, SIZE, stream.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
        details.put(format!("{mode_name}.this_thread.cuStreamIsCapturing(per-thread)"), capture_status(PER_THREAD));
        let pool_handle = pool.raw() as usize;
        let seen = std::thread::scope(|scope| scope.spawn(|| other_thread(setup.context, pool_handle)).join())
            .map_err(|_| "the other thread panicked")?;
        let status = capture_status(stream.raw());
        let (ended, _graph) = stream.end_capture();
        for (call, outcome) in &seen.calls {
            details.put(format!("{mode_name}.other_thread.{call}"), outcome);
        }
        details.put(format!("{mode_name}.capture_status_after"), &status);
        details.put(format!("{mode_name}.end_capture"), code(&ended));
        let outcome = |call: &str| {
            seen.calls.iter().find(|(c, _)| *c == call).map_or("not reached", |(_, outcome)| short(outcome)).to_string()
        };
        summaries.push((
            mode_name,
            format!(
                "another thread's cuStreamIsCapturing(per-thread) {}, cuMemAllocFromPoolAsync(per-thread) {}, \
                 cuMemAlloc {}, cuMemPoolCreate {}; the capture then {status}",
                outcome("cuStreamIsCapturing(per-thread)"),
                outcome("cuMemAllocFromPoolAsync(per-thread)"),
                outcome("cuMemAlloc"),
                outcome("cuMemPoolCreate"),
            ),
        ));
        release_after_the_capture(details, mode_name, seen);
    }
    Ok(join_modes(&summaries))
}

/// Frees what the other thread could not while the capture ran.
fn release_after_the_capture(details: &mut Details, mode: &str, seen: Seen) {
    if let Some(ptr) = seen.unfreed_pool_memory {
        let freed = free_async(ptr, LEGACY).and_then(|()| stream_synchronize(LEGACY));
        details.put(format!("{mode}.pool_memory_freed_after_the_capture"), code(&freed));
    }
    if let Some(mut memory) = seen.unfreed_memory {
        details.put(format!("{mode}.memory_freed_after_the_capture"), code(&memory.free()));
    }
    if let Some(mut pool) = seen.created_pool {
        details.put(format!("{mode}.pool_destroyed_after_the_capture"), code(&pool.destroy()));
    }
}

/// The other thread: the context made current, then its per-thread default stream asked
/// whether it captures, a pool allocation on it (freed, and the stream synchronized), a
/// `cuMemAlloc` (freed) and a `cuMemPoolCreate` (the pool destroyed after the capture).
fn other_thread(context: &PrimaryContext, pool: usize) -> Seen {
    let mut seen = Seen::default();
    seen.calls.push(("cuCtxSetCurrent", code(&context.make_current())));
    seen.calls.push(("cuStreamIsCapturing(per-thread)", capture_status(PER_THREAD)));
    let allocation = alloc_from_pool(pool as CUmemoryPool, SIZE, PER_THREAD);
    seen.calls.push(("cuMemAllocFromPoolAsync(per-thread)", code(&allocation)));
    if let Ok(ptr) = allocation {
        let freed = free_async(ptr, PER_THREAD);
        seen.calls.push(("cuMemFreeAsync(per-thread)", code(&freed)));
        if freed.is_err() {
            seen.unfreed_pool_memory = Some(ptr);
        }
        seen.calls.push(("cuStreamSynchronize(per-thread)", code(&stream_synchronize(PER_THREAD))));
    }
    let memory = DeviceAllocation::new(SIZE);
    seen.calls.push(("cuMemAlloc", code(&memory)));
    if let Ok(mut memory) = memory {
        let freed = memory.free();
        seen.calls.push(("cuMemFree", code(&freed)));
        if freed.is_err() {
            seen.unfreed_memory = Some(memory);
        }
    }
    let created = OwnedPool::new(&pool_props(device_location(0), false, 0));
    seen.calls.push(("cuMemPoolCreate", code(&created)));
    seen.created_pool = created.ok();
    seen
}
