//! Question 14: interprocess events. `cuda.h` names the error of neither exporting an event
//! created without `CU_EVENT_INTERPROCESS` nor opening a handle in the process that exported it,
//! and says nothing of how soon another process sees a recording complete. The simulator answers
//! `CUDA_ERROR_INVALID_HANDLE`, refuses the second (`CUDA_ERROR_INVALID_VALUE`), and lets a
//! waiter in another process poll the event's progress (at most about a millisecond late).
//!
//! The parent records the event behind a host function that holds its stream ([`Gate`]); a child
//! opens the handle, sees the recording pending, enqueues `cuStreamWaitEvent` and a host function
//! that notes the time on a stream of its own, tells the parent (through a pipe) that it is
//! polling with `cuEventQuery`, and notes when the query first succeeds. The parent opens the
//! gate; the delays are measured from the moment the host function let the parent's stream go,
//! on the wall clock both processes read.

use std::ffi::c_void;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuda_mem_sys::types::{CUipcEventHandle, CUresult};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::child::{self, Input};
use crate::gate::Gate;
use crate::owned::{OwnedEvent, OwnedStream};
use crate::raw::{Call, code, stream_wait_event};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "ipc-event",
    question: "Interprocess events: cuIpcGetEventHandle of an event created without CU_EVENT_INTERPROCESS, \
               cuIpcOpenEventHandle in the exporting process, and how soon another process sees a recording \
               complete (cuEventQuery, and a stream waiting with cuStreamWaitEvent; the delays in microseconds are \
               the details query_delay_us and wait_delay_us)",
    run,
    child: Some(child_side),
};

/// How long the gate holds the parent's stream at most (a child that never gets going).
const GATE_LIMIT: Duration = Duration::from_secs(20);
/// How long the parent waits, once the child polls, before it opens the gate: the child's wait
/// is enqueued and its loop running by then.
const SETTLE: Duration = Duration::from_millis(50);
/// How long the child polls at most.
const POLL_LIMIT: Duration = Duration::from_secs(30);
/// The delay the answer tells apart from a longer one. The measurement itself is a detail
/// (`query_delay_us`, `wait_delay_us`): it varies from run to run, and on a loaded machine the
/// simulator's may reach milliseconds, so the answer, which is compared with the simulator's,
/// only says whether the waiter saw the completion and did so within this bound.
const PROMPT: Duration = Duration::from_secs(1);

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let plain = OwnedEvent::new()?;
    let without_flag = code(&plain.ipc_handle());
    details.put("export_without_interprocess", &without_flag);
    drop(plain);
    let event = OwnedEvent::interprocess()?;
    let handle = event.ipc_handle();
    details.put("export", code(&handle));
    let handle = match handle {
        Ok(handle) => handle,
        Err(e) => {
            return Ok(format!(
                "without CU_EVENT_INTERPROCESS: {without_flag}; not applicable past that: an interprocess event's \
                 export is {}",
                crate::raw::error_code(e)
            ));
        }
    };
    let own = open_in_this_process(handle, details);
    let waiter = measure(&event, handle, details)?;
    Ok(format!("without CU_EVENT_INTERPROCESS: {without_flag}; opened in the exporting process: {own}; {waiter}"))
}

/// Opens the handle in the process that exported it; a success is also asked to wait.
fn open_in_this_process(handle: CUipcEventHandle, details: &mut Details) -> String {
    let opened = OwnedEvent::open_ipc(handle);
    details.put("open_in_exporter", code(&opened));
    match opened {
        Ok(event) => {
            details.put("open_in_exporter.query", code(&event.query()));
            "CUDA_SUCCESS".to_string()
        }
        Err(e) => crate::raw::error_code(e),
    }
}

/// Records `event` behind a gate, lets a child wait for it, opens the gate once the child
/// polls, and says how soon the child saw the recording complete.
fn measure(event: &OwnedEvent, handle: CUipcEventHandle, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let gate = Gate::hold(stream.raw(), GATE_LIMIT)?;
    details.put("record", code(&event.record(stream.raw())));
    let (mut ready, ready_writer) = std::io::pipe()?;
    let payload: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
    let waiter = std::thread::scope(|scope| {
        let opener = scope.spawn(|| {
            // One byte: the child polls. End of file: it ended without polling; the gate opens
            // by its limit then.
            let mut byte = [0u8; 1];
            if ready.read_exact(&mut byte).is_ok() {
                std::thread::sleep(SETTLE);
                gate.open();
            }
        });
        let waiter = child::ask(QUESTION.name, &payload, &[ready_writer.as_fd()]);
        drop(ready_writer);
        let _ = opener.join();
        waiter
    })?;
    gate.open();
    details.put("exporter_stream", code(&stream.synchronize()));
    let released = gate.released_at().map(unix_micros);
    let answer = summary(&waiter, released, details);
    details.absorb("waiter", waiter);
    Ok(answer)
}

/// The answer, from the child's observations and when the parent's stream was let go.
fn summary(waiter: &Details, released: Option<i128>, details: &mut Details) -> String {
    let get = |key: &str| waiter.get(key).unwrap_or("not reached").to_string();
    if get("open") != "CUDA_SUCCESS" {
        return format!("another process's cuIpcOpenEventHandle: {} ({})", get("open"), get("child"));
    }
    let Some(released) = released else {
        return "the exporter's host function never let its stream go".to_string();
    };
    let mut delay = |what: &str, key: &str| -> String {
        let Some(seen) = waiter.get(&format!("{key}_seen_at_us")).and_then(|v| v.parse::<i128>().ok()) else {
            return format!("{what} never saw it");
        };
        let micros = seen - released;
        details.put(format!("{key}_delay_us"), micros);
        match micros {
            m if m < 0 => format!("{what} saw it before the exporter's stream was let go"),
            m if m <= PROMPT.as_micros() as i128 => format!("{what} sees it within {} s", PROMPT.as_secs()),
            _ => format!("{what} sees it later than {} s", PROMPT.as_secs()),
        }
    };
    let query = delay("cuEventQuery", "query");
    let wait = delay("cuStreamWaitEvent", "wait");
    format!("another process's view before the recording completes: {}; then {query}, {wait}", get("query_before"))
}

/// A wall-clock time in microseconds since the epoch (what both processes can compare).
fn unix_micros(time: SystemTime) -> i128 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i128)
}

/// When the child's host function ran (microseconds since the epoch; 0 until it has).
struct Stamp(AtomicU64);

/// The host function behind the child's wait: notes the time.
unsafe extern "C" fn stamp(user_data: *mut c_void) {
    // SAFETY: `user_data` is the leaked `Stamp` that `child_side` passed, valid for the rest of
    // the process and only reached atomically.
    let stamp = unsafe { &*user_data.cast_const().cast::<Stamp>() };
    stamp.0.store(unix_micros(SystemTime::now()) as u64, Ordering::Release);
}

/// Enqueues `stamp` on `stream`: the stamp is set once the stream reaches it.
fn launch_stamp(stream: &OwnedStream, stamp_data: &'static Stamp) -> Call {
    let d = driver()?;
    let user_data = std::ptr::from_ref(stamp_data).cast_mut().cast::<c_void>();
    // SAFETY: `stamp` has the host function's signature, calls no driver function and only
    // writes the `Stamp` that `user_data` points to, which lives for the rest of the process;
    // the stream is alive.
    unsafe { cu_call!(d, cuLaunchHostFunc(stream.raw(), Some(stamp), user_data)) }
}

/// The waiting child: opens the handle, checks the recording is pending, enqueues a wait and a
/// stamp, tells the parent it polls, and polls `cuEventQuery`.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let mut handle = CUipcEventHandle { reserved: [0; 64] };
    for (to, from) in handle.reserved.iter_mut().zip(&input.payload) {
        *to = *from as _;
    }
    let event = OwnedEvent::open_ipc(handle);
    details.put("open", code(&event));
    let event = event?;
    details.put("query_before", code(&event.query()));
    let stream = OwnedStream::new(false)?;
    details.put("wait", code(&stream_wait_event(stream.raw(), event.raw())));
    // Leaked: the host function may run after this function returned (a stuck stream).
    let stamp_data: &'static Stamp = Box::leak(Box::new(Stamp(AtomicU64::new(0))));
    details.put("stamp", code(&launch_stamp(&stream, stamp_data)));
    let mut ready = std::fs::File::from(input.fds.first().ok_or("no pipe")?.try_clone()?);
    ready.write_all(&[1])?;
    drop(ready);
    let (seen, polls) = poll(&event);
    details.put("polls", polls);
    match seen {
        Ok(at) => details.put("query_seen_at_us", at),
        Err(e) => details.put("query", crate::raw::error_code(e)),
    }
    details.put("stream", code(&stream.synchronize()));
    match stamp_data.0.load(Ordering::Acquire) {
        0 => details.put("wait_seen_at_us", "never"),
        at => details.put("wait_seen_at_us", at),
    }
    Ok(())
}

/// Polls `cuEventQuery` until it stops answering `CUDA_ERROR_NOT_READY`: when it first
/// succeeded (microseconds since the epoch) or its error, and how many queries it took.
fn poll(event: &OwnedEvent) -> (Result<i128, CudaError>, u64) {
    let start = Instant::now();
    let mut polls = 0u64;
    loop {
        polls += 1;
        match event.query() {
            Ok(()) => return (Ok(unix_micros(SystemTime::now())), polls),
            Err(CudaError::Driver(e)) if e.code == CUresult::CUDA_ERROR_NOT_READY && start.elapsed() < POLL_LIMIT => {
                // Yields rather than spins: a loaded machine still runs the exporter.
                std::thread::yield_now();
            }
            Err(e) => return (Err(e), polls),
        }
    }
}
