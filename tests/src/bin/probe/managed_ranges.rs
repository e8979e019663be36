//! Question 15: advice and prefetches over ranges that are not one managed allocation's.
//! `cuda.h` says the range must be managed memory but names no error for a range that leaves its
//! allocation; the simulator answers `CUDA_ERROR_INVALID_VALUE` for a range past the end of a
//! managed allocation (by a page), one spanning two allocations, `cuMemAlloc` memory and 0 bytes.
//! What does the driver answer for `cuMemAdvise` (read-mostly, whose location is ignored, and a
//! preferred location) and `cuMemPrefetchAsync` (to device 0)?

use cuda_mem_sys::types::CUmem_advise;

use crate::owned::{DeviceAllocation, ManagedAllocation, OwnedStream};
use crate::raw::{advise, code, device_location, managed_unsupported, prefetch};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "managed-range-errors",
    question: "cuMemAdvise (SET_READ_MOSTLY, SET_PREFERRED_LOCATION device 0) and cuMemPrefetchAsync (to device 0) of a \
               managed allocation, of a range one page past its end, of a range spanning two managed allocations, \
               of cuMemAlloc memory, and of 0 bytes: each call's result",
    run,
    child: None,
};

/// The size of each managed allocation (a multiple of the 2 MiB large page).
const SIZE: usize = 2 << 20;
/// The CPU page past which a range leaves the allocation.
const PAGE: usize = 4096;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    if let Some(reason) = managed_unsupported()? {
        return Ok(reason);
    }
    let first = ManagedAllocation::new(SIZE)?;
    let second = ManagedAllocation::new(SIZE)?;
    let device = DeviceAllocation::new(SIZE)?;
    let stream = OwnedStream::new(false)?;
    let (low, high) = if first.ptr() < second.ptr() { (&first, &second) } else { (&second, &first) };
    let gap = high.ptr() - low.ptr() - SIZE as u64;
    details.put("gap_between_the_two_allocations", gap);
    // From the middle of the lower allocation to the middle of the higher, the gap included.
    let spanning = (low.ptr() + (SIZE / 2) as u64, (high.ptr() - low.ptr()) as usize);
    let cases = [
        ("managed", first.ptr(), SIZE),
        ("one page past the end", first.ptr(), SIZE + PAGE),
        ("spanning two", spanning.0, spanning.1),
        ("cuMemAlloc", device.ptr(), SIZE),
        ("0 bytes", first.ptr(), 0),
    ];
    let mut read_mostly = Vec::new();
    let mut preferred = Vec::new();
    let mut prefetched = Vec::new();
    for (name, ptr, count) in cases {
        let location = device_location(0);
        let mostly = code(&advise(ptr, count, CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY, location));
        let prefer = code(&advise(ptr, count, CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, location));
        let fetch = code(&prefetch(ptr, count, location, stream.raw()));
        details.put(format!("{name}.set_read_mostly"), &mostly);
        details.put(format!("{name}.set_preferred_location"), &prefer);
        details.put(format!("{name}.prefetch"), &fetch);
        read_mostly.push(format!("{name} {mostly}"));
        preferred.push(format!("{name} {prefer}"));
        prefetched.push(format!("{name} {fetch}"));
    }
    // A failed prefetch may leave the stream in error; what it reads now is part of the answer.
    details.put("stream_after", code(&stream.synchronize()));
    Ok(format!(
        "read-mostly: {}; preferred location: {}; prefetch: {}",
        read_mostly.join(", "),
        preferred.join(", "),
        prefetched.join(", ")
    ))
}
