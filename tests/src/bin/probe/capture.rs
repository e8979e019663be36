//! Question 4: the calls that conflict with a graph capture. `cuda.h` documents the statuses
//! and errors but not which calls invalidate a capture; the simulator takes the CUDA
//! programming guide's list (`cuda-sim/src/capture.rs`). Each case starts a capture on a fresh
//! stream (blocking unless the case says otherwise), captures a memset, makes one call, and
//! records the call's outcome, the capture's status after it, and how `cuStreamEndCapture` ends
//! it; in both the global and the relaxed mode.

use cuda_mem_sys::types::CUstreamCaptureMode;

use crate::owned::{DeviceAllocation, OwnedEvent, OwnedPool, OwnedStream, alloc_from_pool, free_async};
use crate::raw::{
    LEGACY, capture_status, code, context_synchronize, device_location, event_synchronize, graph_node_types,
    memset_async, memset_sync, pool_props, stream_query, stream_synchronize, stream_wait_event,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "capture-conflicts",
    question: "While a stream captures (global and relaxed modes): what do cuStreamSynchronize and cuStreamQuery on \
               it, cuEventQuery and cuEventSynchronize on an event recorded in the capture, cuCtxSynchronize, uses of \
               the legacy stream (while a blocking or a non-blocking stream captures), cuMemAllocFromPoolAsync, \
               cuMemAlloc and cuMemPoolCreate, and another stream's wait on the captured event (joined back, not joined \
               back, not joined back after work there: how does the capture end?), and the capturing stream's wait \
               on an event recorded outside the capture return, and what is the capture's status after each?",
    run,
    child: None,
};

/// The size of the memory the captured memsets write.
const SIZE: usize = 1 << 20;

/// The call a case makes during the capture.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    StreamSynchronize,
    StreamQuery,
    EventQuery,
    EventSynchronize,
    ContextSynchronize,
    LegacyQuery,
    LegacySynchronize,
    LegacyIsCapturing,
    LegacyMemsetAsync,
    LegacyMemset,
    PoolAlloc,
    MemAlloc,
    PoolCreate,
    CrossStreamWait,
    /// Another stream waits for the captured event and is not joined back.
    ForkNotJoined,
    /// The same, after a memset on the other stream.
    ForkWithWorkNotJoined,
    /// The capturing stream waits for an event recorded outside any capture.
    WaitUncaptured,
}

/// One case: a name, whether the capturing stream is blocking, and the call.
struct Case {
    name: &'static str,
    blocking: bool,
    action: Action,
}

const fn case(name: &'static str, action: Action) -> Case {
    Case { name, blocking: true, action }
}

/// Every case, in order.
const CASES: [Case; 18] = [
    case("cuStreamSynchronize", Action::StreamSynchronize),
    case("cuStreamQuery", Action::StreamQuery),
    case("cuEventQuery(captured)", Action::EventQuery),
    case("cuEventSynchronize(captured)", Action::EventSynchronize),
    case("cuCtxSynchronize", Action::ContextSynchronize),
    case("cuStreamQuery(legacy)", Action::LegacyQuery),
    case("cuStreamSynchronize(legacy)", Action::LegacySynchronize),
    case("cuStreamIsCapturing(legacy)", Action::LegacyIsCapturing),
    case("cuMemsetD8Async(legacy)", Action::LegacyMemsetAsync),
    case("cuMemsetD8", Action::LegacyMemset),
    Case { name: "cuStreamQuery(legacy),non-blocking-capture", blocking: false, action: Action::LegacyQuery },
    case("cuMemAllocFromPoolAsync", Action::PoolAlloc),
    case("cuMemAlloc", Action::MemAlloc),
    case("cuMemPoolCreate", Action::PoolCreate),
    case("cuStreamWaitEvent(other,captured)", Action::CrossStreamWait),
    case("cuStreamWaitEvent(other,captured),not-joined-back", Action::ForkNotJoined),
    case("cuStreamWaitEvent(other,captured),memset-there,not-joined-back", Action::ForkWithWorkNotJoined),
    case("cuStreamWaitEvent(capturing,uncaptured)", Action::WaitUncaptured),
];

/// The capture modes asked about (here and in [`crate::per_thread_capture`]).
pub(crate) const MODES: [(&str, CUstreamCaptureMode); 2] = [
    ("global", CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL),
    ("relaxed", CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED),
];

/// What one case observed.
struct Outcome {
    /// The call's outcome.
    call: String,
    /// The capture's status right after it.
    status: String,
    /// `cuStreamEndCapture`'s outcome and whether it gave a graph.
    end: String,
    /// Further observations of the case.
    extras: Vec<(&'static str, String)>,
}

impl Outcome {
    fn describe(&self) -> String {
        let mut text = format!("call={} status_after={} end={}", self.call, self.status, self.end);
        for (key, value) in &self.extras {
            text.push_str(&format!(" {key}={value}"));
        }
        text
    }
}

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let buffer = DeviceAllocation::new(SIZE)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let mut summaries = Vec::new();
    for (mode_name, mode) in MODES {
        let mut outcomes = Vec::new();
        for case in &CASES {
            let described = match run_case(case, mode, &buffer, &pool) {
                Ok(outcome) => {
                    let text = outcome.describe();
                    outcomes.push((case.name, outcome));
                    text
                }
                Err(e) => format!("error: {e}"),
            };
            details.put(format!("{mode_name}.{}", case.name), described);
        }
        summaries.push((mode_name, grouped(outcomes.iter().map(|(n, o)| (*n, o.call.as_str(), o.status.as_str())))));
    }
    Ok(join_modes(&summaries))
}

/// Answers per capture mode in one line: once, when both modes answer alike.
pub(crate) fn join_modes(answers: &[(&str, String)]) -> String {
    match answers {
        [(_, global), (_, relaxed)] if global == relaxed => format!("both modes: {global}"),
        _ => answers.iter().map(|(mode, text)| format!("{mode}: {text}")).collect::<Vec<_>>().join(" | "),
    }
}

/// Cases grouped by what the call returned and the status it left: `RESULT→STATUS: case, case`,
/// from `(case, call outcome, status)` triples.
pub(crate) fn grouped<'a>(outcomes: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for (name, call, status) in outcomes {
        let key = format!("{}→{status}", short(call));
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, names)) => names.push(name),
            None => groups.push((key, vec![name])),
        }
    }
    groups.iter().map(|(key, names)| format!("{key}: {}", names.join(", "))).collect::<Vec<_>>().join("; ")
}

/// A code without its `CUDA_ERROR_` prefix; success as `ok`.
pub(crate) fn short(code: &str) -> &str {
    if code == "CUDA_SUCCESS" { "ok" } else { code.strip_prefix("CUDA_ERROR_").unwrap_or(code) }
}

/// One case in one mode.
fn run_case(
    case: &Case,
    mode: CUstreamCaptureMode,
    buffer: &DeviceAllocation,
    pool: &OwnedPool,
) -> Result<Outcome, Error> {
    // Memory `cuMemAlloc` gives, and a pool `cuMemPoolCreate` gives, during the capture are
    // released after the capture ends (declared first, they are dropped after the streams).
    let mut allocated: Option<DeviceAllocation> = None;
    let mut created: Option<OwnedPool> = None;
    let stream = OwnedStream::new(case.blocking)?;
    let other = OwnedStream::new(false)?;
    let event = OwnedEvent::new()?;
    let joined = OwnedEvent::new()?;
    stream.begin_capture(mode).map_err(|e| format!("beginning the capture: {e}"))?;
    memset_async(buffer.ptr(), 1, SIZE, stream.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
    let mut extras = Vec::new();
    let call = match case.action {
        Action::StreamSynchronize => code(&stream.synchronize()),
        Action::StreamQuery => code(&stream_query(stream.raw())),
        Action::EventQuery => {
            event.record(stream.raw())?;
            code(&event.query())
        }
        Action::EventSynchronize => {
            event.record(stream.raw())?;
            code(&event_synchronize(event.raw()))
        }
        Action::ContextSynchronize => code(&context_synchronize()),
        Action::LegacyQuery => code(&stream_query(LEGACY)),
        Action::LegacySynchronize => code(&stream_synchronize(LEGACY)),
        Action::LegacyIsCapturing => capture_status(LEGACY),
        Action::LegacyMemsetAsync => code(&memset_async(buffer.ptr(), 2, SIZE, LEGACY)),
        Action::LegacyMemset => code(&memset_sync(buffer.ptr(), 2, SIZE)),
        Action::PoolAlloc => {
            let result = alloc_from_pool(pool.raw(), SIZE, stream.raw());
            if let Ok(ptr) = result {
                extras.push(("free_in_the_capture", code(&free_async(ptr, stream.raw()))));
            }
            code(&result)
        }
        Action::MemAlloc => {
            let result = DeviceAllocation::new(SIZE);
            let outcome = code(&result);
            allocated = result.ok();
            outcome
        }
        Action::PoolCreate => {
            let result = OwnedPool::new(&pool_props(device_location(0), false, 0));
            let outcome = code(&result);
            created = result.ok();
            outcome
        }
        Action::CrossStreamWait => {
            event.record(stream.raw())?;
            let outcome = code(&stream_wait_event(other.raw(), event.raw()));
            extras.push(("other_stream_status", capture_status(other.raw())));
            let join = joined.record(other.raw()).and_then(|()| stream_wait_event(stream.raw(), joined.raw()));
            extras.push(("join_back", code(&join)));
            outcome
        }
        Action::WaitUncaptured => {
            // Recorded on the other stream, outside any capture (what `cuda-mem-core` does to
            // order a buffer's free after another stream's use).
            joined.record(other.raw())?;
            code(&stream_wait_event(stream.raw(), joined.raw()))
        }
        Action::ForkNotJoined | Action::ForkWithWorkNotJoined => {
            event.record(stream.raw())?;
            let outcome = code(&stream_wait_event(other.raw(), event.raw()));
            if case.action == Action::ForkWithWorkNotJoined {
                extras.push(("memset_there", code(&memset_async(buffer.ptr(), 3, SIZE, other.raw()))));
            }
            extras.push(("other_stream_status", capture_status(other.raw())));
            let (ended, graph) = other.end_capture();
            extras.push(("end_on_the_other_stream", format!("{}({})", code(&ended), graph_or_none(&graph))));
            outcome
        }
    };
    let status = capture_status(stream.raw());
    let (ended, graph) = stream.end_capture();
    let end = format!("{}({})", code(&ended), graph_or_none(&graph));
    if matches!(case.action, Action::ForkNotJoined | Action::ForkWithWorkNotJoined) {
        extras.push(("other_stream_status_after_the_end", capture_status(other.raw())));
    }
    if matches!(case.action, Action::EventQuery | Action::EventSynchronize) {
        extras.push(("event_query_after_the_end", code(&event.query())));
    }
    if let Some(memory) = &mut allocated {
        extras.push(("free_after_the_end", code(&memory.free())));
    }
    if let Some(pool) = &mut created {
        extras.push(("destroy_after_the_end", code(&pool.destroy())));
    }
    Ok(Outcome { call, status, end, extras })
}

/// What `cuStreamEndCapture` gave, in words.
fn graph_or_none(graph: &crate::owned::CapturedGraph) -> &'static str {
    if graph.is_null() { "no graph" } else { "a graph" }
}

/// Ends the capture on `stream` after a case's call (whose outcome is `call`), records the
/// call, the capture's status before the end, the end's outcome and the graph's nodes under
/// `name`, and returns them in a phrase: `RESULT, the capture then STATUS, end RESULT (nodes: …)`.
pub(crate) fn end_described(name: &str, stream: &OwnedStream, call: &str, details: &mut Details) -> String {
    let status = capture_status(stream.raw());
    let (ended, graph) = stream.end_capture();
    let nodes = if graph.is_null() { "no graph".to_string() } else { graph_node_types(graph.raw()) };
    details.put(format!("{name}.call"), call);
    details.put(format!("{name}.status_after"), &status);
    details.put(format!("{name}.end"), code(&ended));
    details.put(format!("{name}.nodes"), &nodes);
    format!("{}, the capture then {status}, end {} (nodes: {nodes})", short(call), short(&code(&ended)))
}
