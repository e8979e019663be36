//! Question 2: one exported allocation imported through two handles of the same imported pool.
//! The driver does not count imports through one pool (the same pointer comes back, and the
//! first free unmaps it for both: nvbug 5570902, modelled by the simulator); `cuda-mem-core`
//! counts them per pool handle and treats an import through another handle as another mapping.
//! Does the driver? The parent also asks what importing into the exporting pool itself does
//! (the simulator refuses it).

use std::os::fd::AsFd;

use cuda_mem_sys::types::{CUdeviceptr, CUmemPoolPtrExportData, CUmemoryPool, CUpointer_attribute};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::child::{self, Input};
use crate::owned::{OwnedPool, OwnedStream, PoolAllocation, free_async};
use crate::raw::{code, destroy_pool, device_location, import_pool, memset_async, pool_props, read_byte};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "pointer-import-two-pools",
    question: "One exported pointer imported through two imported-pool handles of the same pool: the same address? \
               Are the imports counted separately (does freeing one unmap the other)? And through one handle twice?",
    run,
    child: Some(child_side),
};

/// The size of the shared allocation, and the byte written into it.
const SIZE: usize = 2 << 20;
const PATTERN: u8 = 0x5A;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), true, 0))?;
    let allocation = PoolAllocation::new(pool.raw(), SIZE, &stream)?;
    memset_async(allocation.ptr(), PATTERN, SIZE, stream.raw())?;
    stream.synchronize()?;
    let data = export_pointer(allocation.ptr())?;
    let own = import_pointer(pool.raw(), data);
    details.put("import_into_the_exporting_pool", code(&own));
    if let Ok(ptr) = own {
        details.put("import_into_the_exporting_pool_address", same_or_other(ptr, allocation.ptr()));
        if ptr != allocation.ptr() {
            details.put("free_of_that_import", code(&free_async(ptr, stream.raw())));
        }
    }
    let fd = pool.export()?;
    let importer = child::ask(QUESTION.name, &data.reserved, &[fd.as_fd()])?;
    let answer = summary(&importer, details.get("import_into_the_exporting_pool").unwrap_or("not asked"));
    details.absorb("importer", importer);
    Ok(answer)
}

/// The answer, from what the importing child observed.
fn summary(importer: &Details, own: &str) -> String {
    let get = |key: &str| importer.get(key).unwrap_or("not reached").to_string();
    if get("pool_import_1") != "CUDA_SUCCESS" || get("pointer_via_1") != "CUDA_SUCCESS" {
        return format!(
            "the child could not import (pool {}, pointer {}; {})",
            get("pool_import_1"),
            get("pointer_via_1"),
            get("child")
        );
    }
    let second_pool = importer.get("pool_import_2_handle").unwrap_or("refused");
    let via_2 = match importer.get("pointer_via_2") {
        Some("CUDA_SUCCESS") => get("pointer_via_2_address"),
        Some(code) => format!("refused ({code})"),
        None => "not reached".to_string(),
    };
    let counted = match importer.get("via_2_after_freeing_via_1") {
        Some("CUDA_SUCCESS") => "freeing the first import leaves it mapped".to_string(),
        Some(code) => format!("freeing the first import unmaps it ({code})"),
        None => "not reached".to_string(),
    };
    format!(
        "second pool import: {second_pool}; through it: {via_2}, {counted}; through one handle twice: {}, second free \
         {}; into the exporting pool: {own}",
        get("pointer_via_1_again_address"),
        get("free_via_1_again")
    )
}

/// The importing child: the pool imported twice, the pointer through the first handle twice
/// and through the second once, each read, then freed one by one.
fn child_side(input: &Input, details: &mut Details) -> Result<(), Error> {
    let data = CUmemPoolPtrExportData {
        reserved: input.payload.as_slice().try_into().map_err(|_| "the export data is not 64 bytes")?,
    };
    let stream = OwnedStream::new(false)?;
    let fd = input.fd(0)?;
    let first = import_pool(fd);
    details.put("pool_import_1", code(&first));
    let first = first?;
    let second = import_pool(fd);
    details.put("pool_import_2", code(&second));
    if let Ok(pool) = second {
        details.put("pool_import_2_handle", if pool == first { "the first import's handle" } else { "a new handle" });
    }
    let via_1 = import_pointer(first, data);
    details.put("pointer_via_1", code(&via_1));
    let via_1 = via_1?;
    let via_1_again = import_pointer(first, data);
    details.put("pointer_via_1_again", code(&via_1_again));
    if let Ok(ptr) = via_1_again {
        details.put("pointer_via_1_again_address", same_or_other(ptr, via_1));
    }
    let via_2 = second.as_ref().ok().map(|&pool| import_pointer(pool, data));
    if let Some(result) = &via_2 {
        details.put("pointer_via_2", code(result));
        if let Ok(ptr) = result {
            details.put("pointer_via_2_address", same_or_other(*ptr, via_1));
        }
    }
    details.put("reads_via_1", read(via_1));
    if let Some(Ok(ptr)) = via_2 {
        details.put("reads_via_2", read(ptr));
    }
    details.put("free_via_1", code(&free_and_wait(via_1, &stream)));
    if let Some(Ok(ptr)) = via_2 {
        details.put("via_2_after_freeing_via_1", code(&range_size(ptr)));
    }
    if let Ok(ptr) = via_1_again {
        details.put("free_via_1_again", code(&free_and_wait(ptr, &stream)));
    }
    if let Some(Ok(ptr)) = via_2 {
        details.put("free_via_2", code(&free_and_wait(ptr, &stream)));
    }
    if let Ok(pool) = second
        && pool != first
    {
        details.put("destroy_pool_2", code(&destroy_pool(pool)));
    }
    details.put("destroy_pool_1", code(&destroy_pool(first)));
    Ok(())
}

/// "the same address" or "another address" than `reference`.
fn same_or_other(ptr: CUdeviceptr, reference: CUdeviceptr) -> &'static str {
    if ptr == reference { "the same address" } else { "another address" }
}

/// The byte at `ptr`, as the report shows it (the pattern, another byte, or the error).
fn read(ptr: CUdeviceptr) -> String {
    match read_byte(ptr) {
        Ok(PATTERN) => "the exporter's pattern".to_string(),
        Ok(other) => format!("{other:#04x}, not the exporter's pattern"),
        Err(e) => crate::raw::error_code(e),
    }
}

/// `cuMemPoolExportPointer` (question 26 exports with it too).
pub(crate) fn export_pointer(ptr: CUdeviceptr) -> Result<CUmemPoolPtrExportData, CudaError> {
    let d = driver()?;
    let mut data = CUmemPoolPtrExportData::default();
    // SAFETY: `data` is a valid out-pointer; `ptr` starts a live allocation of a shareable pool.
    unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, ptr)) }?;
    Ok(data)
}

/// `cuMemPoolImportPointer` through `pool` (question 26 imports with it too).
pub(crate) fn import_pointer(pool: CUmemoryPool, mut data: CUmemPoolPtrExportData) -> Result<CUdeviceptr, CudaError> {
    let d = driver()?;
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer and `data` valid for a read; the pool is alive.
    unsafe { cu_call!(d, cuMemPoolImportPointer(&mut ptr, pool, &mut data)) }?;
    Ok(ptr)
}

/// Whether the driver still knows `ptr` (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`).
fn range_size(ptr: CUdeviceptr) -> Result<usize, CudaError> {
    let d = driver()?;
    let mut size: usize = 0;
    // SAFETY: the attribute is a size_t, written to `size`.
    unsafe {
        cu_call!(
            d,
            cuPointerGetAttribute((&raw mut size).cast(), CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr)
        )
    }?;
    Ok(size)
}

/// Frees an imported pointer on `stream` and waits for the free (question 26's too).
pub(crate) fn free_and_wait(ptr: CUdeviceptr, stream: &OwnedStream) -> crate::raw::Call {
    free_async(ptr, stream.raw())?;
    stream.synchronize()
}
