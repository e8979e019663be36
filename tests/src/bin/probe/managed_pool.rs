//! Question 17: advice on managed *pool* memory. cuda.core's `ManagedMemoryResource` allocates
//! from a managed pool (`cuMemPoolCreate` with `CU_MEM_ALLOCATION_TYPE_MANAGED`) and advises
//! and prefetches that memory; `cuda.h` speaks only of `cuMemAllocManaged` memory. The simulator
//! takes advice and prefetches on it (and reads `CU_POINTER_ATTRIBUTE_IS_MANAGED` as false for
//! it). Does the driver?

use std::ffi::c_void;

use cuda_mem_sys::types::{CUmem_advise, CUmem_range_attribute, CUmemAllocationType, CUpointer_attribute};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::owned::{OwnedPool, OwnedStream, PoolAllocation};
use crate::raw::{advise, code, device_location, managed_unsupported, pool_props, prefetch, range_attribute};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "managed-pool-advice",
    question: "Memory from a managed pool (cuMemPoolCreate, CU_MEM_ALLOCATION_TYPE_MANAGED, device 0 preferred): \
               CU_POINTER_ATTRIBUTE_IS_MANAGED, cuMemAdvise (SET_READ_MOSTLY, SET_PREFERRED_LOCATION and \
               SET_ACCESSED_BY device 0), cuMemPrefetchAsync to device 0, and READ_MOSTLY read back",
    run,
    child: None,
};

const SIZE: usize = 2 << 20;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    if let Some(reason) = managed_unsupported()? {
        return Ok(reason);
    }
    let props = pool_props(device_location(0), false, 0);
    let props =
        cuda_mem_sys::types::CUmemPoolProps { allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED, ..props };
    let pool = match OwnedPool::new(&props) {
        Ok(pool) => pool,
        Err(e) => return Ok(format!("not applicable: a managed cuMemPoolCreate is {}", crate::raw::error_code(e))),
    };
    let stream = OwnedStream::new(false)?;
    let mut memory = PoolAllocation::new(pool.raw(), SIZE, &stream)?;
    stream.synchronize()?;
    let ptr = memory.ptr();
    let is_managed = match is_managed(ptr) {
        Ok(flag) => flag.to_string(),
        Err(e) => crate::raw::error_code(e),
    };
    details.put("is_managed", &is_managed);
    let location = device_location(0);
    let mut advice = Vec::new();
    for (name, kind) in [
        ("read-mostly", CUmem_advise::CU_MEM_ADVISE_SET_READ_MOSTLY),
        ("preferred location", CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION),
        ("accessed by", CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY),
    ] {
        let outcome = code(&advise(ptr, SIZE, kind, location));
        details.put(format!("advise.{name}"), &outcome);
        advice.push(format!("{name} {outcome}"));
    }
    let fetched = code(&prefetch(ptr, SIZE, location, stream.raw()));
    details.put("prefetch", &fetched);
    let read_mostly = match range_attribute(ptr, SIZE, CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY) {
        Ok(value) => value.to_string(),
        Err(e) => crate::raw::error_code(e),
    };
    details.put("read_mostly", &read_mostly);
    details.put("free", code(&memory.free().and_then(|()| stream.synchronize())));
    Ok(format!(
        "IS_MANAGED {is_managed}; advice: {}; prefetch {fetched}; READ_MOSTLY reads {read_mostly}",
        advice.join(", ")
    ))
}

/// `CU_POINTER_ATTRIBUTE_IS_MANAGED` of `ptr`.
fn is_managed(ptr: u64) -> Result<bool, CudaError> {
    let d = driver()?;
    // Four zeroed bytes: a driver that writes one byte (as `bool`) or four reads the same.
    let mut value: u32 = 0;
    // SAFETY: `value` is 4 writable bytes, as much as the attribute takes.
    unsafe {
        cu_call!(
            d,
            cuPointerGetAttribute(
                (&raw mut value).cast::<c_void>(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                ptr
            )
        )
    }?;
    Ok(value != 0)
}
