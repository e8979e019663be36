//! Question 38: copies that name memory of the wrong kind, each asked in a child process of its
//! own because a driver may take the pointer at its word and fault, or poison the context. The
//! simulator (`cuda_sim::conservative`) refuses `cuMemcpyHtoD` whose host source is a device
//! pointer and `cuMemcpyDtoH` whose host destination is one (`CUDA_ERROR_INVALID_VALUE`: the
//! direction must match the memory), and a copy from a `cuMemAlloc` pointer already freed
//! (`CUDA_ERROR_INVALID_VALUE`, a pointer inside no live allocation), after which the context
//! is unharmed (`cuCtxSynchronize` succeeds). A GPU driver with unified addressing may instead
//! copy device to device, or fault: what the child ended with is then the answer.

use std::ffi::c_void;

use cuda_mem_sys::types::CUdeviceptr;
use cuda_mem_sys::{cu_call, driver};

use crate::capture::short;
use crate::child::{self, Input, SIGNAL_KEY};
use crate::owned::DeviceAllocation;
use crate::raw::{Call, code, context_synchronize};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "unsafe-edges",
    question: "Each in a child process of its own: cuMemcpyHtoD whose host source is a cuMemAlloc device pointer; \
               cuMemcpyDtoH whose host destination is one; cuMemcpyDtoH from a cuMemAlloc pointer already freed with \
               cuMemFree, then cuCtxSynchronize: what does each return, or how does the child end?",
    run,
    child: Some(child_side),
};

/// The cases, by the name the child is handed, and the observations each makes, in order.
const CASES: [(&str, &[&str]); 3] = [
    ("htod-device-source", &["copy"]),
    ("dtoh-device-destination", &["copy"]),
    ("freed-pointer-copy", &["copy", "cuCtxSynchronize"]),
];

/// The bytes each copy covers.
const SIZE: usize = 4096;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let mut phrases = Vec::new();
    for (case, keys) in CASES {
        let observed = child::ask(QUESTION.name, case.as_bytes(), &[])?;
        phrases.push(format!("{case}: {}", described(keys, &observed)));
        details.absorb(case, observed);
    }
    Ok(phrases.join("; "))
}

/// The codes a case's child observed (`keys`, in order), and how it ended if it did not finish.
fn described(keys: &[&str], observed: &Details) -> String {
    let mut seen: Vec<String> = Vec::new();
    for key in keys {
        if let Some(value) = observed.get(key) {
            let value = short(value);
            seen.push(if seen.is_empty() { value.to_string() } else { format!("{key} {value}") });
        }
    }
    let child = observed.get("child").unwrap_or("no word of the child");
    let ending = match observed.get(SIGNAL_KEY) {
        Some(signal) => format!("crashed: signal {signal}"),
        None if child.starts_with("finished") && seen.len() == keys.len() => return seen.join(", then "),
        None => child.to_string(),
    };
    if seen.is_empty() { ending } else { format!("{}, then {ending}", seen.join(", then ")) }
}

/// The child: the case its payload names, in the primary context made current for it.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    match input.payload.as_slice() {
        b"htod-device-source" => {
            let (dst, src) = (DeviceAllocation::new(SIZE)?, DeviceAllocation::new(SIZE)?);
            details.put("copy", code(&copy_h_to_d(dst.ptr(), src.ptr())));
        }
        b"dtoh-device-destination" => {
            let (dst, src) = (DeviceAllocation::new(SIZE)?, DeviceAllocation::new(SIZE)?);
            details.put("copy", code(&copy_d_to_h(dst.ptr() as *mut c_void, src.ptr())));
        }
        b"freed-pointer-copy" => {
            let mut memory = DeviceAllocation::new(SIZE)?;
            let freed = memory.ptr();
            memory.free()?;
            let mut host = vec![0u8; SIZE];
            details.put("copy", code(&copy_d_to_h(host.as_mut_ptr().cast(), freed)));
            details.put("cuCtxSynchronize", code(&context_synchronize()));
        }
        other => return Err(format!("no case named {:?}", String::from_utf8_lossy(other)).into()),
    }
    Ok(())
}

/// `cuMemcpyHtoD_v2` of [`SIZE`] bytes whose "host" source is the device address `src`.
fn copy_h_to_d(dst: CUdeviceptr, src: CUdeviceptr) -> Call {
    let d = driver()?;
    // SAFETY: the source is a device address handed to the driver as host memory on purpose (the
    // question): a driver that reads it from the CPU faults this child process only. Both
    // allocations hold `SIZE` bytes.
    unsafe { cu_call!(d, cuMemcpyHtoD_v2(dst, src as *const c_void, SIZE)) }
}

/// `cuMemcpyDtoH_v2` of [`SIZE`] bytes from `src` to `dst` ("host" memory: a device address in
/// one case, a live buffer in the other).
fn copy_d_to_h(dst: *mut c_void, src: CUdeviceptr) -> Call {
    let d = driver()?;
    // SAFETY: `dst` is a host buffer of `SIZE` bytes, or a device address of an allocation of
    // that size handed over as host memory on purpose (the question), as `src` may be a freed
    // address: a driver that faults on either faults this child process only.
    unsafe { cu_call!(d, cuMemcpyDtoH_v2(dst, src, SIZE)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(items: &[(&str, &str)]) -> Details {
        let mut details = Details::default();
        for (key, value) in items {
            details.put(*key, value);
        }
        details
    }

    const BOTH: &[&str] = &["copy", "cuCtxSynchronize"];

    #[test]
    fn a_finished_child_answers_with_its_codes() {
        let finished = observed(&[
            ("copy", "CUDA_ERROR_INVALID_VALUE"),
            ("cuCtxSynchronize", "CUDA_SUCCESS"),
            ("child", "finished; exit status: 0"),
        ]);
        assert_eq!(described(BOTH, &finished), "INVALID_VALUE, then cuCtxSynchronize ok");
    }

    #[test]
    fn a_crash_is_the_answer_after_what_came_before_it() {
        let after_the_copy = observed(&[
            ("copy", "CUDA_SUCCESS"),
            ("child", "stopped before the end (closed); signal: 11 (SIGSEGV)"),
            (SIGNAL_KEY, "11"),
        ]);
        assert_eq!(described(BOTH, &after_the_copy), "ok, then crashed: signal 11");
        let at_once =
            observed(&[("child", "stopped before the end (closed); signal: 11 (SIGSEGV)"), (SIGNAL_KEY, "11")]);
        assert_eq!(described(&["copy"], &at_once), "crashed: signal 11");
    }

    #[test]
    fn a_child_that_failed_otherwise_says_how() {
        let failed = observed(&[("child", "error: no case named \"x\"; exit status: 1")]);
        assert_eq!(described(&["copy"], &failed), "error: no case named \"x\"; exit status: 1");
    }
}
