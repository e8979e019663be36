//! Question 31: the edges of single calls where `cuda.h` is silent and the simulator
//! (`cuda_sim::conservative`) takes the strict reading: a null pointer to `cuMemFree` and
//! `cuMemFreeHost`, a zero-byte `cuMemAllocHost`, a misaligned `cuMemsetD16`/`D32`,
//! `cuMemFreeAsync` of `cuMemAlloc` memory, a zero-length memset and copy at an allocation's
//! one-past-the-end pointer, a pool allocation of `SIZE_MAX` bytes, a managed pool with a
//! shareable handle type, and how many bytes a boolean pointer attribute writes.
//!
//! Each is asked with memory that stays valid whatever the driver answers, so no answer can
//! fault the context the later questions use. Not asked, for that reason: a destroyed
//! default stream, a primary context released without a retain, and a copy direction that
//! names device memory as host memory (a driver that believed it would read device memory from
//! the CPU).

use std::ffi::c_void;

use cuda_mem_sys::types::{CUdeviceptr, CUmemAllocationType, CUmemPoolProps, CUmemoryPool, CUpointer_attribute};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::capture::short;
use crate::owned::{OwnedPool, OwnedStream, alloc_from_pool, free_async};
use crate::raw::{Call, POSIX_FD, code, device_location, driver_version, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "call-edges",
    question: "cuMemFree(0); cuMemFreeHost(NULL); cuMemAllocHost of 0 bytes; cuMemsetD16 at an odd address and \
               cuMemsetD32 at one not a multiple of 4; cuMemFreeAsync of cuMemAlloc memory; a zero-length cuMemsetD8 \
               and cuMemcpyDtoD at an allocation's one-past-the-end pointer; cuMemAllocFromPoolAsync of SIZE_MAX \
               bytes; cuMemPoolCreate of a managed pool with a POSIX fd handle type; how many bytes \
               cuPointerGetAttribute(IS_MANAGED) writes: what does each return?",
    run,
    child: None,
};

/// The size of the allocations the calls are made at (one 2 MiB granule, so that its end is a
/// granule's end on a GPU too).
const SIZE: usize = 2 << 20;

/// The CUDA version whose pool properties can ask for managed memory.
const MANAGED_POOL_VERSION: u32 = 13000;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let mut phrases = Vec::new();
    let mut ask = |key: &str, outcome: String| {
        details.put(key, &outcome);
        phrases.push(format!("{key} {}", short(&outcome)));
    };
    ask("cuMemFree(0)", code(&free(0)));
    ask("cuMemFreeHost(NULL)", code(&free_host(std::ptr::null_mut())));
    ask("cuMemAllocHost(0)", zero_byte_host_allocation());
    let memory = Allocation::new(SIZE)?;
    ask("cuMemsetD16(odd)", code(&memset_d16(memory.ptr + 1, 0x1234, 8)));
    ask("cuMemsetD32(ptr+2)", code(&memset_d32(memory.ptr + 2, 0x1234_5678, 4)));
    let end = memory.ptr + SIZE as CUdeviceptr;
    ask("cuMemsetD8(end, 0 bytes)", code(&memset_d8(end, 0)));
    ask("cuMemcpyDtoD(end, 0 bytes)", code(&copy_d_to_d(end, memory.ptr, 0)));
    ask("cuPointerGetAttribute(IS_MANAGED) writes", boolean_attribute_width(memory.ptr));
    drop(memory);
    ask("cuMemFreeAsync(cuMemAlloc memory)", free_async_of_plain_allocation()?);
    ask("cuMemAllocFromPoolAsync(SIZE_MAX)", size_max_pool_allocation()?);
    ask("managed pool with POSIX fd handles", managed_shareable_pool()?);
    Ok(phrases.join("; "))
}

/// `cuMemAlloc` memory, freed on drop unless the probe gave it away.
struct Allocation {
    ptr: CUdeviceptr,
}

impl Allocation {
    fn new(size: usize) -> Result<Allocation, CudaError> {
        let d = driver()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAlloc_v2(&mut ptr, size)) }?;
        Ok(Allocation { ptr })
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        crate::owned::note_cleanup("freeing a cuMemAlloc allocation", free(self.ptr));
    }
}

fn free(ptr: CUdeviceptr) -> Call {
    let d = driver()?;
    // SAFETY: `ptr` is 0 or an allocation the caller gives up, freed once.
    unsafe { cu_call!(d, cuMemFree_v2(ptr)) }
}

fn free_host(ptr: *mut c_void) -> Call {
    let d = driver()?;
    // SAFETY: `ptr` is NULL or pinned memory the caller gives up, freed once.
    unsafe { cu_call!(d, cuMemFreeHost(ptr)) }
}

fn memset_d16(ptr: CUdeviceptr, value: u16, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: the `count` elements from `ptr` lie inside an allocation the caller holds.
    unsafe { cu_call!(d, cuMemsetD16_v2(ptr, value, count)) }
}

fn memset_d32(ptr: CUdeviceptr, value: u32, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: as in `memset_d16`.
    unsafe { cu_call!(d, cuMemsetD32_v2(ptr, value, count)) }
}

fn memset_d8(ptr: CUdeviceptr, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: `count` is 0 here: no byte is written.
    unsafe { cu_call!(d, cuMemsetD8_v2(ptr, 0, count)) }
}

fn copy_d_to_d(dst: CUdeviceptr, src: CUdeviceptr, count: usize) -> Call {
    let d = driver()?;
    // SAFETY: `count` is 0 here: no byte is read or written.
    unsafe { cu_call!(d, cuMemcpyDtoD_v2(dst, src, count)) }
}

/// `cuMemAllocHost` of 0 bytes: its result, whether the pointer is null, and its free's.
fn zero_byte_host_allocation() -> String {
    let allocate = || -> Result<*mut c_void, CudaError> {
        let d = driver()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAllocHost_v2(&mut ptr, 0)) }?;
        Ok(ptr)
    };
    match allocate() {
        Err(e) => crate::raw::error_code(e),
        Ok(ptr) if ptr.is_null() => "CUDA_SUCCESS with NULL".to_string(),
        Ok(ptr) => format!("CUDA_SUCCESS with a pointer (cuMemFreeHost {})", code(&free_host(ptr))),
    }
}

/// Writes the boolean attribute `IS_MANAGED` of `ptr` into eight bytes of `0xFF` and counts
/// those it changed (the attribute is false for `cuMemAlloc` memory, so each written byte is 0).
fn boolean_attribute_width(ptr: CUdeviceptr) -> String {
    let mut out = [0xFF_u8; 8];
    let mut read = || -> Call {
        let d = driver()?;
        let attribute = CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED;
        // SAFETY: `out` is eight writable bytes, more than any attribute of this kind takes.
        unsafe { cu_call!(d, cuPointerGetAttribute(out.as_mut_ptr().cast(), attribute, ptr)) }
    };
    match read() {
        Err(e) => crate::raw::error_code(e),
        Ok(()) => format!("{} byte(s)", out.iter().filter(|&&b| b != 0xFF).count()),
    }
}

/// `cuMemFreeAsync` of `cuMemAlloc` memory; a driver that accepts it has freed the memory, so
/// it is not freed again.
fn free_async_of_plain_allocation() -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let memory = Allocation::new(SIZE)?;
    let outcome = free_async(memory.ptr, stream.raw()).and_then(|()| stream.synchronize());
    if outcome.is_ok() {
        std::mem::forget(memory);
    }
    Ok(code(&outcome))
}

/// `cuMemAllocFromPoolAsync` of `SIZE_MAX` bytes from a new device pool.
fn size_max_pool_allocation() -> Result<String, Error> {
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let outcome = alloc_from_pool(pool.raw(), usize::MAX, stream.raw());
    if let Ok(ptr) = outcome {
        crate::owned::note_cleanup("freeing a SIZE_MAX pool allocation", free_async(ptr, stream.raw()));
    }
    Ok(code(&outcome))
}

/// `cuMemPoolCreate` of a managed pool on device 0 shareable by POSIX file descriptor.
fn managed_shareable_pool() -> Result<String, Error> {
    let version = driver_version()?;
    if version < MANAGED_POOL_VERSION {
        return Ok(format!("not applicable: CUDA {}.{} has no managed pools", version / 1000, (version % 1000) / 10));
    }
    let props = CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
        handleTypes: POSIX_FD,
        ..pool_props(device_location(0), false, 0)
    };
    let d = driver()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `props` a valid description.
    let created = unsafe { cu_call!(d, cuMemPoolCreate(&mut pool, &props)) };
    if created.is_ok() {
        // SAFETY: the pool was created just now and is destroyed once.
        let destroyed = unsafe { cu_call!(d, cuMemPoolDestroy(pool)) };
        crate::owned::note_cleanup("destroying a managed shareable pool", destroyed);
    }
    Ok(code(&created))
}
