//! Question 39: how the driver reads `CUDA_VISIBLE_DEVICES`. The CUDA documentation gives
//! examples (indices, `GPU-` UUIDs as `nvidia-smi` prints them, a unique prefix) and says an
//! invalid entry hides itself and every entry after it; what is invalid it does not list. The
//! simulator (`cuda_sim::conservative`) reads the examples as narrowly as they are written: a
//! space, uppercase hex, a UUID without `GPU-`, a bare `GPU-` and a second mention of a device
//! are each invalid. Each value is asked of a child process started with it, which counts the
//! devices it sees before any context exists.

use cuda_mem_sys::types::{CUdevice, CUuuid};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::capture::short;
use crate::child::{self, Input};
use crate::raw::{code, error_code};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "visible-devices",
    question: "With CUDA_VISIBLE_DEVICES set to: 0; device 0's GPU-UUID; its first 8 hex digits after GPU-; ' 0' (a \
               leading space); the UUID in uppercase hex; the UUID without GPU-; a bare GPU-; 0,0; x,0; the empty \
               string: what do cuInit and cuDeviceGetCount say in a new process?",
    run,
    child: Some(child_side),
};

/// The environment variable asked about.
const VISIBLE: &str = "CUDA_VISIBLE_DEVICES";

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let uuid = uuid_text(0)?;
    details.put("device0_uuid", &uuid);
    let hex = uuid.trim_start_matches("GPU-");
    let prefix = format!("GPU-{}", hex.get(..8).unwrap_or(hex));
    let cases = [
        ("0", "0".to_string()),
        ("the GPU-UUID", uuid.clone()),
        ("an 8-digit prefix", prefix),
        ("' 0'", " 0".to_string()),
        ("uppercase", format!("GPU-{}", hex.to_uppercase())),
        ("no GPU-", hex.to_string()),
        ("bare GPU-", "GPU-".to_string()),
        ("0,0", "0,0".to_string()),
        ("x,0", "x,0".to_string()),
        ("empty", String::new()),
    ];
    let mut phrases = Vec::new();
    for (name, value) in cases {
        let seen = child::ask_with_env(QUESTION.name, b"", &[], &[(VISIBLE, &value)])?;
        let answer = match (seen.get("cuInit"), seen.get("devices")) {
            (Some("CUDA_SUCCESS"), Some(count)) => format!("{count} device(s)"),
            (Some(init), _) => format!("cuInit {}", short(init)),
            (None, _) => format!("the child did not answer ({})", seen.get("child").unwrap_or("?")),
        };
        details.absorb(name, seen);
        phrases.push(format!("{name}: {answer}"));
    }
    Ok(phrases.join("; "))
}

/// The child: `cuInit` and, when it succeeds, `cuDeviceGetCount`.
fn child_side(_input: &Input, details: &mut Details) -> Result<(), Error> {
    let d = driver()?;
    // SAFETY: cuInit takes no pointers; flags must be 0.
    let init = unsafe { cu_call!(d, cuInit(0)) };
    details.put("cuInit", code(&init));
    if init.is_ok() {
        let mut count = 0;
        // SAFETY: `count` is a valid out-pointer.
        let counted = unsafe { cu_call!(d, cuDeviceGetCount(&mut count)) };
        details.put("devices", counted.map_or_else(error_code, |()| count.to_string()));
    }
    Ok(())
}

/// Device `ordinal`'s UUID as `nvidia-smi` prints it: `GPU-` and 32 lowercase hex digits in
/// groups of 8, 4, 4, 4 and 12.
fn uuid_text(ordinal: i32) -> Result<String, CudaError> {
    let d = driver()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer.
    unsafe { cu_call!(d, cuDeviceGet(&mut device, ordinal)) }?;
    let mut uuid = CUuuid::default();
    // SAFETY: `uuid` is a valid out-pointer; `device` came from the driver.
    unsafe { cu_call!(d, cuDeviceGetUuid_v2(&mut uuid, device)) }?;
    let hex: String = uuid.bytes.iter().map(|&b| format!("{:02x}", b.cast_unsigned())).collect();
    let part = |from: usize, to: usize| hex.get(from..to).unwrap_or("");
    Ok(format!("GPU-{}-{}-{}-{}-{}", part(0, 8), part(8, 12), part(12, 16), part(16, 20), part(20, 32)))
}
