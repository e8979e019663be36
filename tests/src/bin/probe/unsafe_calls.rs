//! Question 23: a "potentially unsafe" call during a global-mode capture. `cuda.h` prohibits
//! them (to the capturing thread, and to every thread while a global capture runs) without
//! listing them or saying what becomes of the capture; the simulator refuses the synchronous
//! allocations and frees and `cuMemPoolCreate` with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and
//! invalidates the capture (`cuda_sim::conservative`). Question 8
//! (`per-thread-stream-during-capture`) makes several calls from one thread and reads the
//! status once at the end; here each call gets a capture of its own, from the capturing thread
//! and from another, so that the status after it is the call's doing.

use crate::capture::grouped;
use crate::owned::{DeviceAllocation, HostAllocation, ManagedAllocation, OwnedPool, OwnedStream, PrimaryContext};
use crate::raw::{capture_status, code, device_location, memset_async, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

use cuda_mem_sys::types::CUstreamCaptureMode;

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "unsafe-call-invalidates",
    question: "During a global-mode capture, from the capturing thread and from another: cuMemAlloc, cuMemFree (of \
               memory allocated before), cuMemAllocHost, cuMemAllocManaged, cuMemPoolCreate: each call's result and \
               the capture's status after it (one capture per call)",
    run,
    child: None,
};

/// The size of each allocation and of the captured memset.
const SIZE: usize = 1 << 20;

/// The calls asked about.
#[derive(Clone, Copy)]
enum Action {
    MemAlloc,
    MemFree,
    MemAllocHost,
    MemAllocManaged,
    PoolCreate,
}

const ACTIONS: [(&str, Action); 5] = [
    ("cuMemAlloc", Action::MemAlloc),
    ("cuMemFree", Action::MemFree),
    ("cuMemAllocHost", Action::MemAllocHost),
    ("cuMemAllocManaged", Action::MemAllocManaged),
    ("cuMemPoolCreate", Action::PoolCreate),
];

/// What a call made or could not release, released once its capture has ended.
type Leftover = Option<Box<dyn Send>>;

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let buffer = DeviceAllocation::new(SIZE)?;
    let mut summaries = Vec::new();
    for (thread, other_thread) in [("this thread", false), ("another thread", true)] {
        let mut outcomes: Vec<(&str, String, String)> = Vec::new();
        for (name, action) in ACTIONS {
            let victim = match action {
                Action::MemFree => Some(DeviceAllocation::new(SIZE)?),
                _ => None,
            };
            let stream = OwnedStream::new(false)?;
            stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
                .map_err(|e| format!("beginning the capture: {e}"))?;
            memset_async(buffer.ptr(), 1, SIZE, stream.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
            let (call, leftover) = if other_thread {
                let context = setup.context;
                std::thread::scope(|scope| scope.spawn(move || on_another_thread(context, action, victim)).join())
                    .map_err(|_| "the other thread panicked")?
            } else {
                act(action, victim)
            };
            let status = capture_status(stream.raw());
            let (ended, _graph) = stream.end_capture();
            drop(leftover);
            let key = if other_thread { "other_thread" } else { "this_thread" };
            details.put(format!("{key}.{name}"), format!("call={call} status_after={status} end={}", code(&ended)));
            outcomes.push((name, call, status));
        }
        summaries.push(format!("{thread}: {}", grouped(outcomes.iter().map(|(n, c, s)| (*n, c.as_str(), s.as_str())))));
    }
    Ok(summaries.join(" | "))
}

/// [`act`] on a thread of its own, with the context made current there.
fn on_another_thread(context: &PrimaryContext, action: Action, victim: Option<DeviceAllocation>) -> (String, Leftover) {
    if let Err(e) = context.make_current() {
        return (format!("cuCtxSetCurrent {}", code::<()>(&Err(e))), victim.map(|v| Box::new(v) as Box<dyn Send>));
    }
    act(action, victim)
}

/// Makes the call: its outcome, and what to release after the capture.
fn act(action: Action, victim: Option<DeviceAllocation>) -> (String, Leftover) {
    fn kept<T: Send + 'static>(result: Result<T, cuda_mem_sys::CudaError>) -> (String, Leftover) {
        let outcome = code(&result);
        (outcome, result.ok().map(|value| Box::new(value) as Box<dyn Send>))
    }
    match action {
        Action::MemAlloc => kept(DeviceAllocation::new(SIZE)),
        Action::MemFree => match victim {
            Some(mut memory) => {
                let outcome = code(&memory.free());
                (outcome, Some(Box::new(memory)))
            }
            None => ("nothing to free".to_string(), None),
        },
        Action::MemAllocHost => kept(HostAllocation::new(SIZE)),
        Action::MemAllocManaged => kept(ManagedAllocation::new(SIZE)),
        Action::PoolCreate => kept(OwnedPool::new(&pool_props(device_location(0), false, 0))),
    }
}
