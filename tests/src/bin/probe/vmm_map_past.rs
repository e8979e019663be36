//! Question 36: `cuMemMap` of more bytes than the physical allocation holds. `cuda-mem-vmm`
//! checks a shared virtual buffer's claimed chunk sizes so: mapping a chunk at its claimed size
//! plus one granule must fail, or the chunk is larger than claimed. `cuda.h` documents
//! `CUDA_ERROR_INVALID_VALUE` for `cuMemMap`'s bad arguments without naming this one; the
//! simulator returns it.

use cuda_mem_sys::types::{CUdeviceptr, CUmemGenericAllocationHandle};
use cuda_mem_sys::{cu_call, driver};

use crate::address_hint::granularity;
use crate::address_range::{create_physical, release};
use crate::owned::{Reservation, note_cleanup};
use crate::raw::{Call, code};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "vmm-map-past-the-allocation",
    question: "cuMemMap of two granules of a one-granule cuMemCreate allocation (offset 0), and of one granule at \
               offset one granule: what does each return?",
    run,
    child: None,
};

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let granule = granularity()?;
    let reservation = Reservation::new(2 * granule, 0, 0)?;
    let handle = create_physical(granule)?;
    let past_end = map(reservation.ptr(), 2 * granule, 0, handle);
    details.put("two_granules", code(&past_end));
    if past_end.is_ok() {
        note_cleanup("unmapping", unmap(reservation.ptr(), 2 * granule));
    }
    let offset = map(reservation.ptr(), granule, granule, handle);
    details.put("offset_one_granule", code(&offset));
    if offset.is_ok() {
        note_cleanup("unmapping", unmap(reservation.ptr(), granule));
    }
    note_cleanup("releasing a physical allocation", release(handle));
    drop(reservation);
    Ok(format!("two granules {}; at offset one granule {}", code(&past_end), code(&offset)))
}

fn map(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle) -> Call {
    let d = driver()?;
    // SAFETY: the range lies in a reservation the caller holds, with nothing mapped there; the
    // question is whether the driver refuses a size or offset past the allocation.
    unsafe { cu_call!(d, cuMemMap(ptr, size, offset, handle, 0)) }
}

fn unmap(ptr: CUdeviceptr, size: usize) -> Call {
    let d = driver()?;
    // SAFETY: the mapping `map` made, unmapped once.
    unsafe { cu_call!(d, cuMemUnmap(ptr, size)) }
}
