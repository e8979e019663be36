//! Question 37: work left on a stream that has no handle any more: a thread's per-thread default
//! stream after the thread exited, and a stream destroyed with work pending. `cuStreamDestroy`
//! says the stream's resources are released "once the device has completed all work" in it;
//! `cuCtxSynchronize` "blocks until the current context has completed all preceding requested
//! tasks". The simulator (`cuda_sim::conservative`) makes `cuCtxSynchronize` wait for both.
//!
//! Each stream is held by a host function ([`Gate`]) that lets go by itself after two seconds,
//! with a memset of a device buffer behind it; the stream's handle then goes, and the main
//! thread times `cuCtxSynchronize` and reads the buffer.

use std::time::{Duration, Instant};

use cuda_mem_sys::types::{CUdeviceptr, CUstream};
use cuda_mem_sys::{cu_call, driver};

use crate::gate::Gate;
use crate::owned::DeviceAllocation;
use crate::raw::{PER_THREAD, code, context_synchronize, memset_async, memset_sync, read_byte};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "gone-stream-work",
    question: "A memset queued behind a held host function on a thread's per-thread default stream, the thread then \
               exiting; and on a created stream then destroyed: does cuCtxSynchronize wait for it, and has the \
               memset run when it returns?",
    run,
    child: None,
};

/// How long each gate holds its stream.
const HOLD: Duration = Duration::from_secs(2);
/// The buffer's size and what the memset writes.
const SIZE: usize = 4096;
const VALUE: u8 = 0x5A;

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let per_thread = per_thread_stream(setup, details)?;
    let destroyed = destroyed_stream(details)?;
    Ok(format!("exited thread's per-thread stream: {per_thread}; destroyed stream: {destroyed}"))
}

/// The per-thread stream of a thread that exits with its work held.
fn per_thread_stream(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let buffer = DeviceAllocation::new(SIZE)?;
    memset_sync(buffer.ptr(), 0, SIZE)?;
    let ptr = buffer.ptr();
    let context = setup.context;
    let start = Instant::now();
    let queued = std::thread::scope(|scope| {
        scope
            .spawn(move || -> Result<String, String> {
                context.make_current().map_err(|e| e.to_string())?;
                hold_then_memset(PER_THREAD, ptr).map_err(|e| e.to_string())
            })
            .join()
            .map_err(|_| "the thread panicked".to_string())?
    })?;
    details.put("per_thread.queued", &queued);
    Ok(synchronize_and_read(start, ptr, details, "per_thread"))
}

/// A created stream destroyed with its work held.
fn destroyed_stream(details: &mut Details) -> Result<String, Error> {
    let buffer = DeviceAllocation::new(SIZE)?;
    memset_sync(buffer.ptr(), 0, SIZE)?;
    let d = driver()?;
    let mut stream: CUstream = std::ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer; 1 is CU_STREAM_NON_BLOCKING.
    unsafe { cu_call!(d, cuStreamCreate(&mut stream, 1)) }?;
    let start = Instant::now();
    let queued = hold_then_memset(stream, buffer.ptr())?;
    details.put("destroyed.queued", &queued);
    // SAFETY: the stream created above, destroyed once; its work is the driver's to finish.
    let destroyed = unsafe { cu_call!(d, cuStreamDestroy_v2(stream)) };
    details.put("destroyed.cuStreamDestroy", code(&destroyed));
    Ok(synchronize_and_read(start, buffer.ptr(), details, "destroyed"))
}

/// Holds `stream` with a gate left to open by itself, then queues the memset: the outcome.
fn hold_then_memset(stream: CUstream, ptr: CUdeviceptr) -> Result<String, Error> {
    // Forgotten, so that it opens only at its time limit, after the stream's handle is gone.
    std::mem::forget(Gate::hold(stream, HOLD)?);
    Ok(code(&memset_async(ptr, VALUE, SIZE, stream)))
}

/// `cuCtxSynchronize`, timed from `start` (when the gate began to hold), then the buffer's
/// first byte: the answer's phrase.
fn synchronize_and_read(start: Instant, ptr: CUdeviceptr, details: &mut Details, key: &str) -> String {
    let synchronized = context_synchronize();
    let waited = start.elapsed() >= HOLD.mul_f32(0.9);
    details.put(format!("{key}.cuCtxSynchronize"), code(&synchronized));
    details.put(format!("{key}.seconds"), format!("{:.3}", start.elapsed().as_secs_f64()));
    let ran = match read_byte(ptr) {
        Ok(VALUE) => "the memset had run".to_string(),
        Ok(_) => "the memset had not run".to_string(),
        Err(e) => format!("reading the buffer: {}", crate::raw::error_code(e)),
    };
    details.put(format!("{key}.after"), &ran);
    // Whatever cuCtxSynchronize did, let the gate's time pass so that the buffer is not freed
    // under the memset.
    if let Some(rest) = HOLD.checked_sub(start.elapsed()) {
        std::thread::sleep(rest + Duration::from_millis(100));
    }
    let when = if waited { "waited for it" } else { "returned at once" };
    format!("cuCtxSynchronize {} {when}, {ran}", code(&synchronized))
}
