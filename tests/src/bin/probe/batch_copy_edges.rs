//! Question 19: the edges of `cuMemcpyBatchAsync` that `cuda.h` leaves open. The simulator
//! (`cuda_sim::conservative`, copies with attributes) refuses a zero-byte copy, copies of one
//! batch that depend on each other and a malformed location hint with
//! `CUDA_ERROR_INVALID_VALUE`, and a batch on a capturing stream with
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` leaving the capture valid. What does a driver do with
//! each? Three device buffers are filled with `0x11`, `0x22` and `0x33`; each batch copies
//! between them on a non-blocking stream, which is then synchronized.

use cuda_mem_sys::types::{
    CUdeviceptr, CUmemLocation, CUmemLocationType, CUmemcpyAttributes, CUmemcpySrcAccessOrder, CUstream,
    CUstreamCaptureMode,
};
use cuda_mem_sys::{cu_call, driver};

use crate::capture::{end_described, short};
use crate::owned::{DeviceAllocation, ManagedAllocation, OwnedStream};
use crate::raw::{
    Call, code, device_location, driver_version, host_numa_location, managed_unsupported, memset_async, memset_sync,
    read_bytes,
};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "batch-copy-edges",
    question: "cuMemcpyBatchAsync with a zero-byte copy; with two copies where one's destination is the other's source \
               (what the second copy read); on a capturing stream (and the capture's status after); with a malformed \
               source location hint (an unknown type, a device ordinal the process lacks, host NUMA node 4096) on \
               managed memory: what does each return?",
    run,
    child: None,
};

/// The CUDA version whose `cuMemcpyBatchAsync` has the signature bound here (CUDA 12.8's had a
/// `failIdx` argument more, which this probe must not call).
const BATCH_VERSION: u32 = 13000;

/// The size of each buffer and copy.
const SIZE: usize = 4096;

/// What each buffer is filled with first.
const FILLS: [u8; 3] = [0x11, 0x22, 0x33];

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let version = driver_version()?;
    if version < BATCH_VERSION {
        return Ok(format!(
            "not applicable: the driver reports CUDA {}.{}, before cuMemcpyBatchAsync's CUDA 13.0 signature",
            version / 1000,
            (version % 1000) / 10
        ));
    }
    let buffers = [DeviceAllocation::new(SIZE)?, DeviceAllocation::new(SIZE)?, DeviceAllocation::new(SIZE)?];
    let [a, b, c] = [buffers[0].ptr(), buffers[1].ptr(), buffers[2].ptr()];
    let fill = || -> Call {
        for (buffer, value) in buffers.iter().zip(FILLS) {
            memset_sync(buffer.ptr(), value, SIZE)?;
        }
        Ok(())
    };
    let stream = OwnedStream::new(false)?;

    fill()?;
    let zero = batch(&[(b, a, 0)], no_hint(), stream.raw()).and_then(|()| stream.synchronize());
    details.put("zero_byte", code(&zero));

    fill()?;
    let dependent = batch(&[(b, a, SIZE), (c, b, SIZE)], no_hint(), stream.raw()).and_then(|()| stream.synchronize());
    details.put("dependent", code(&dependent));
    let second_read = if dependent.is_ok() { what_was_read(c)? } else { "nothing".to_string() };
    details.put("dependent.second_copy_read", &second_read);

    let capture = on_a_capturing_stream(a, b, details)?;
    let hints = malformed_hints(setup, details)?;

    let dependent = match dependent {
        Ok(()) => format!("ok (the second copy read {second_read})"),
        Err(_) => short(&code(&dependent)).to_string(),
    };
    Ok(format!("zero-byte {}; dependent {dependent}; {capture}; malformed hints: {hints}", short(&code(&zero))))
}

/// A batch on a stream capturing in global mode, after a captured memset: the batch's outcome,
/// the capture's status after it, how `cuStreamEndCapture` ends it and the graph's nodes.
fn on_a_capturing_stream(dst: CUdeviceptr, src: CUdeviceptr, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .map_err(|e| format!("beginning the capture: {e}"))?;
    memset_async(src, 0x44, SIZE, stream.raw()).map_err(|e| format!("capturing a memset: {e}"))?;
    let call = code(&batch(&[(dst, src, SIZE)], no_hint(), stream.raw()));
    Ok(format!("on a capturing stream {}", end_described("capturing", &stream, &call, details)))
}

/// One copy of managed memory (device memory where the device has none) per malformed source
/// hint; the outcomes, in one phrase.
fn malformed_hints(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let managed = managed_unsupported()?.is_none();
    details.put("hints.memory", if managed { "managed" } else { "device (no managed memory)" });
    let (src, dst): (Box<dyn Memory>, Box<dyn Memory>) = if managed {
        (Box::new(ManagedAllocation::new(SIZE)?), Box::new(ManagedAllocation::new(SIZE)?))
    } else {
        (Box::new(DeviceAllocation::new(SIZE)?), Box::new(DeviceAllocation::new(SIZE)?))
    };
    let stream = OwnedStream::new(false)?;
    let hints = [
        ("unknown type", CUmemLocation { type_: CUmemLocationType(0x7777), id: 0 }),
        ("absent device", device_location(setup.devices + 7)),
        ("NUMA node 4096", host_numa_location(4096)),
    ];
    let mut outcomes = Vec::new();
    for (name, hint) in hints {
        let attributes = CUmemcpyAttributes { srcLocHint: hint, ..no_hint() };
        let result =
            batch(&[(dst.ptr(), src.ptr(), SIZE)], attributes, stream.raw()).and_then(|()| stream.synchronize());
        details.put(format!("hints.{name}"), code(&result));
        outcomes.push(format!("{name} {}", short(&code(&result))));
    }
    Ok(outcomes.join(", "))
}

/// Memory a batch copies between.
trait Memory {
    fn ptr(&self) -> CUdeviceptr;
}

impl Memory for DeviceAllocation {
    fn ptr(&self) -> CUdeviceptr {
        DeviceAllocation::ptr(self)
    }
}

impl Memory for ManagedAllocation {
    fn ptr(&self) -> CUdeviceptr {
        ManagedAllocation::ptr(self)
    }
}

/// Which fill the buffer at `ptr` holds now: the first's (copied through), the second's (read
/// before the first copy wrote it), or a mix.
fn what_was_read(ptr: CUdeviceptr) -> Result<String, Error> {
    let bytes = read_bytes(ptr, SIZE)?;
    let first = bytes.first().copied().unwrap_or(0);
    Ok(match first {
        _ if bytes.iter().any(|&b| b != first) => "a mix of old and new bytes".to_string(),
        0x11 => "the first copy's result (0x11)".to_string(),
        0x22 => "the old contents (0x22)".to_string(),
        other => format!("{other:#04X} throughout"),
    })
}

/// Attributes with stream-ordered source access and no location hints.
fn no_hint() -> CUmemcpyAttributes {
    CUmemcpyAttributes {
        srcAccessOrder: CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        ..CUmemcpyAttributes::default()
    }
}

/// `cuMemcpyBatchAsync` of `(dst, src, size)` copies, all with `attributes`, on `stream`. Only
/// called on drivers of CUDA 13.0 or later (the signature bound).
fn batch(copies: &[(CUdeviceptr, CUdeviceptr, usize)], attributes: CUmemcpyAttributes, stream: CUstream) -> Call {
    let d = driver()?;
    let mut dsts: Vec<CUdeviceptr> = copies.iter().map(|c| c.0).collect();
    let mut srcs: Vec<CUdeviceptr> = copies.iter().map(|c| c.1).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
    let mut table = [attributes];
    let mut first = [0usize];
    // SAFETY: the three arrays hold `copies.len()` elements, the count passed; the attribute
    // table and its index array hold one, the count passed; the driver checks the ranges, which
    // lie in memory this probe owns until after the stream is synchronized.
    unsafe {
        cu_call!(
            d,
            cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                copies.len(),
                table.as_mut_ptr(),
                first.as_mut_ptr(),
                1,
                stream
            )
        )
    }
}
