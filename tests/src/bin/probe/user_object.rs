//! Question 24: where a user object's destructor runs. `cuda.h`: destructors "may be executed
//! by a shared internal thread" and "cannot make CUDA API calls"; the simulator always runs them
//! on a destructor thread of its own, after the releasing call returns, and refuses driver calls
//! there. Which thread runs one on a driver, does the call that drops the last reference wait
//! for it, and what does a driver call made from it return? Asked in a child process, so
//! that a destructor stuck in a driver call cannot hold up the other questions.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cuda_mem_sys::types::{
    CUcontext, CUdeviceptr, CUstreamCaptureMode, CUuserObject, CUuserObject_flags, CUuserObjectRetain_flags,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::child::{self, Input};
use crate::owned::{DeviceAllocation, OwnedStream};
use crate::raw::{Call, code, memset_async};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "user-object-destructor-thread",
    question: "A user object's destructor, when cuUserObjectRelease drops the last reference and when cuGraphDestroy \
               drops a graph's (moved there with CU_GRAPH_USER_OBJECT_MOVE): which thread runs it, does the call \
               wait for it, and what do cuCtxGetCurrent, cuCtxSetCurrent and cuMemAlloc return in it?",
    run,
    child: Some(child_side),
};

/// How long the child waits for a destructor to finish.
const DESTRUCTOR_WAIT: Duration = Duration::from_secs(10);

/// How long a destructor on another thread waits for the releasing call to return.
const CALL_WAIT: Duration = Duration::from_secs(2);

/// The cases, in the order asked: how the last reference goes.
const CASES: [&str; 2] = ["release", "graph"];

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let seen = child::ask(QUESTION.name, b"", &[])?;
    let get = |key: &str| seen.get(key).unwrap_or("not seen").to_string();
    let mut phrases = Vec::new();
    for case in CASES {
        let what = if case == "release" { "cuUserObjectRelease" } else { "cuGraphDestroy" };
        let phrase = match seen.get(&format!("{case}.thread")) {
            None => format!("{what}: no destructor seen ({})", get(&format!("{case}.waited"))),
            Some(thread) => format!(
                "{what}: runs on {thread}, {}; in it cuCtxGetCurrent {}, cuCtxSetCurrent {}, cuMemAlloc {}",
                get(&format!("{case}.when")),
                get(&format!("{case}.cuCtxGetCurrent")),
                get(&format!("{case}.cuCtxSetCurrent")),
                get(&format!("{case}.cuMemAlloc")),
            ),
        };
        phrases.push(phrase);
    }
    let child_end = get("child");
    details.absorb("child", seen);
    if !child_end.starts_with("finished") {
        phrases.push(format!("the child {child_end}"));
    }
    Ok(phrases.join("; "))
}

/// What the destructor sees, shared with it through its user data (leaked: a destructor that
/// never returns may still read it).
struct Watch {
    /// The thread that drops the last reference.
    releasing: ThreadId,
    /// The probe's context, as an integer, for the destructor to make current.
    context: usize,
    /// Set while the call that drops the last reference runs.
    in_call: AtomicBool,
    /// What the destructor observed, in order.
    log: Mutex<Vec<(&'static str, String)>>,
    /// Set when the destructor returns.
    done: AtomicBool,
}

impl Watch {
    fn note(&self, key: &'static str, value: String) {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).push((key, value));
    }
}

/// The child: each case with a fresh user object, its observations recorded under the case.
fn child_side(_input: &Input, details: &mut Details) -> Result<(), Error> {
    let context = current_context()?;
    let buffer = DeviceAllocation::new(4096)?;
    for case in CASES {
        let watch: &'static Watch = Box::leak(Box::new(Watch {
            releasing: std::thread::current().id(),
            context: context as usize,
            in_call: AtomicBool::new(false),
            log: Mutex::new(Vec::new()),
            done: AtomicBool::new(false),
        }));
        let object = create(watch)?;
        let dropped = if case == "release" {
            watch.in_call.store(true, Ordering::SeqCst);
            let released = release(object);
            watch.in_call.store(false, Ordering::SeqCst);
            released
        } else {
            drop_with_a_graph(object, buffer.ptr(), watch)
        };
        details.put(format!("{case}.last_reference"), code(&dropped));
        let start = Instant::now();
        while !watch.done.load(Ordering::SeqCst) && start.elapsed() < DESTRUCTOR_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        let waited = if watch.done.load(Ordering::SeqCst) { "returned" } else { "had not returned after 10 s" };
        details.put(format!("{case}.waited"), format!("the destructor {waited}"));
        for (key, value) in watch.log.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            details.put(format!("{case}.{key}"), value);
        }
    }
    Ok(())
}

/// A graph (one captured memset) takes the object's only reference, and is destroyed.
fn drop_with_a_graph(object: CUuserObject, ptr: CUdeviceptr, watch: &Watch) -> Call {
    let stream = OwnedStream::new(false)?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)?;
    let captured = memset_async(ptr, 1, 4096, stream.raw());
    let (ended, graph) = stream.end_capture();
    captured.and(ended)?;
    let d = driver()?;
    let moved = CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0;
    // SAFETY: the graph is alive while `graph` is; the object's one reference moves to it.
    let retained = unsafe { cu_call!(d, cuGraphRetainUserObject(graph.raw(), object, 1, moved)) };
    if retained.is_err() {
        // The reference is still the probe's: drop it the plain way.
        let _ = release(object);
        return retained;
    }
    watch.in_call.store(true, Ordering::SeqCst);
    drop(graph);
    watch.in_call.store(false, Ordering::SeqCst);
    Ok(())
}

/// The destructor: notes which thread runs it and when, then tries the driver.
unsafe extern "C" fn destructor(user_data: *mut c_void) {
    // SAFETY: `user_data` is the leaked `Watch` that `create` passed, valid forever and only
    // reached through its atomics and mutex here.
    let watch = unsafe { &*user_data.cast_const().cast::<Watch>() };
    let thread = std::thread::current();
    let same_thread = thread.id() == watch.releasing;
    watch.note("thread", if same_thread { "the releasing thread" } else { "another thread" }.to_string());
    watch.note("thread_name", thread.name().unwrap_or("unnamed").to_string());
    // On another thread, whether the call waits for the destructor: it holds on until the call
    // has returned, for at most CALL_WAIT; a call that waits for it is still running then.
    let when = if same_thread {
        "inside the call"
    } else {
        let start = Instant::now();
        while watch.in_call.load(Ordering::SeqCst) && start.elapsed() < CALL_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
        if watch.in_call.load(Ordering::SeqCst) { "the call waits for it" } else { "the call does not wait for it" }
    };
    watch.note("when", when.to_string());
    let current = match current_context() {
        Ok(c) if c.is_null() => "CUDA_SUCCESS (none current)".to_string(),
        Ok(c) if c as usize == watch.context => "CUDA_SUCCESS (the probe's)".to_string(),
        Ok(_) => "CUDA_SUCCESS (another context)".to_string(),
        Err(e) => code::<()>(&Err(e)),
    };
    watch.note("cuCtxGetCurrent", current);
    let set = set_current(watch.context as CUcontext);
    watch.note("cuCtxSetCurrent", code(&set));
    let allocated = DeviceAllocation::new(4096);
    watch.note("cuMemAlloc", code(&allocated));
    if let Ok(mut memory) = allocated {
        watch.note("cuMemFree", code(&memory.free()));
    }
    watch.done.store(true, Ordering::SeqCst);
}

/// `cuUserObjectCreate` with [`destructor`], one reference, `watch` as its data and
/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC` (`cuda.h`: "currently it is required to pass" it).
fn create(watch: &'static Watch) -> Result<CUuserObject, CudaError> {
    let d = driver()?;
    let mut object: CUuserObject = std::ptr::null_mut();
    let user_data = std::ptr::from_ref(watch).cast_mut().cast::<c_void>();
    let flags = CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0;
    // SAFETY: `object` is a valid out-pointer; `destructor` only reads the `Watch` that
    // `user_data` points to, which lives for the rest of the process.
    unsafe { cu_call!(d, cuUserObjectCreate(&mut object, user_data, Some(destructor), 1, flags)) }?;
    Ok(object)
}

/// `cuUserObjectRelease` of one reference.
fn release(object: CUuserObject) -> Call {
    let d = driver()?;
    // SAFETY: the object is alive; the caller owns the reference it gives up.
    unsafe { cu_call!(d, cuUserObjectRelease(object, 1)) }
}

/// `cuCtxGetCurrent`.
fn current_context() -> Result<CUcontext, CudaError> {
    let d = driver()?;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `context` is a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetCurrent(&mut context)) }?;
    Ok(context)
}

/// `cuCtxSetCurrent`.
fn set_current(context: CUcontext) -> Call {
    let d = driver()?;
    // SAFETY: the context is the child's primary context, retained until the child ends.
    unsafe { cu_call!(d, cuCtxSetCurrent(context)) }
}
