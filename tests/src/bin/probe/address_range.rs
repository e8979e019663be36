//! Question 34: what `cuMemGetAddressRange` calls an allocation. `cuda-mem-core`'s DLPack
//! import checks a tensor's bytes against it: a tensor must lie inside one allocation, except
//! that VMM memory may go on into the next mapping when `cuMemRetainAllocationHandle` says it
//! is VMM memory. `cuda.h` says the call returns "the base address and size of the allocation
//! ... that contains the input pointer"; for pool, pinned, managed and VMM memory it does not
//! say what that allocation is. The simulator answers with the allocation itself, and for VMM
//! memory with the one mapping the address lies in.

use std::ffi::c_void;

use cuda_mem_sys::types::{
    CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationProp, CUmemAllocationType,
    CUmemGenericAllocationHandle,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::address_hint::granularity;
use crate::owned::{DeviceAllocation, ManagedAllocation, OwnedPool, OwnedStream, PoolAllocation, Reservation};
use crate::raw::{Call, code, device_location, error_code, managed_unsupported, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "address-range",
    question: "cuMemGetAddressRange of a pointer 16 bytes into: cuMemAlloc memory, a pool allocation, cuMemAllocHost \
               memory, managed memory, and each of two VMM mappings side by side in one reservation: the allocation \
               itself, or what? And cuMemRetainAllocationHandle of cuMemAlloc memory and of a VMM mapping",
    run,
    child: None,
};

/// The size of each allocation (the VMM mappings take the granularity).
const SIZE: usize = 1 << 20;
/// How far into each allocation the pointer asked about lies.
const INTO: CUdeviceptr = 16;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let mut phrases = Vec::new();
    let mut put = |key: &str, answer: String| {
        details.put(key, &answer);
        phrases.push(format!("{key}: {answer}"));
    };
    let plain = DeviceAllocation::new(SIZE)?;
    put("cuMemAlloc", range_of(plain.ptr(), SIZE));
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(device_location(0), false, 0))?;
    let pooled = PoolAllocation::new(pool.raw(), SIZE, &stream)?;
    stream.synchronize()?;
    put("pool", range_of(pooled.ptr(), SIZE));
    put("cuMemAllocHost", pinned_range()?);
    if managed_unsupported()?.is_none() {
        let managed = ManagedAllocation::new(SIZE)?;
        put("managed", range_of(managed.ptr(), SIZE));
    } else {
        put("managed", "not asked (no managed memory)".to_string());
    }
    put("VMM", vmm_ranges()?);
    put("retain cuMemAlloc", retain_code(plain.ptr() + INTO));
    drop(pooled);
    Ok(phrases.join("; "))
}

/// Where `cuMemGetAddressRange` of `start + INTO` says the allocation of `size` bytes at
/// `start` is: itself, or its base and size relative to it.
fn range_of(start: CUdeviceptr, size: usize) -> String {
    match address_range(start + INTO) {
        Err(e) => error_code(e),
        Ok((base, len)) if base == start && len == size => "the allocation".to_string(),
        Ok((base, len)) => format!("base {:+} bytes from the allocation's, {len} bytes", base as i128 - start as i128),
    }
}

fn address_range(ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize), CudaError> {
    let d = driver()?;
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(d, cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) }?;
    Ok((base, size))
}

/// `cuMemAllocHost` memory asked about by its (unified) address.
fn pinned_range() -> Result<String, Error> {
    let d = driver()?;
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: `host` is a valid out-pointer.
    unsafe { cu_call!(d, cuMemAllocHost_v2(&mut host, SIZE)) }?;
    let answer = range_of(host as CUdeviceptr, SIZE);
    // SAFETY: the allocation made above, freed once.
    crate::owned::note_cleanup("freeing pinned memory", unsafe { cu_call!(d, cuMemFreeHost(host)) });
    Ok(answer)
}

/// Two physical allocations of one granule mapped side by side, readable and writable by
/// device 0: the range of a pointer into each, and `cuMemRetainAllocationHandle` of one.
fn vmm_ranges() -> Result<String, Error> {
    let granule = granularity()?;
    let reservation = Reservation::new(2 * granule, 0, 0)?;
    let first = Mapping::new(reservation.ptr(), granule)?;
    let second = Mapping::new(reservation.ptr() + granule as CUdeviceptr, granule)?;
    let answer = format!(
        "first mapping {}, second mapping {}, cuMemRetainAllocationHandle {}",
        range_of(first.ptr, granule),
        range_of(second.ptr, granule),
        retain_code(second.ptr + INTO)
    );
    drop((second, first));
    drop(reservation);
    Ok(answer)
}

/// `cuMemRetainAllocationHandle` of `ptr`: its outcome (a handle it gives is released).
fn retain_code(ptr: CUdeviceptr) -> String {
    let retain = || -> Result<CUmemGenericAllocationHandle, CudaError> {
        let d = driver()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer; the address is only looked up.
        unsafe { cu_call!(d, cuMemRetainAllocationHandle(&mut handle, ptr as *mut c_void)) }?;
        Ok(handle)
    };
    let outcome = retain();
    if let Ok(handle) = outcome {
        crate::owned::note_cleanup("releasing a retained handle", release(handle));
    }
    code(&outcome)
}

/// `cuMemRelease`: gives up one reference to a physical allocation the probe holds.
pub(crate) fn release(handle: CUmemGenericAllocationHandle) -> Call {
    let d = driver()?;
    // SAFETY: releases one reference the probe holds, once.
    unsafe { cu_call!(d, cuMemRelease(handle)) }
}

/// `cuMemCreate` of `size` bytes of device 0's memory (a multiple of the granularity).
pub(crate) fn create_physical(size: usize) -> Result<CUmemGenericAllocationHandle, CudaError> {
    let d = driver()?;
    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: device_location(0),
        ..CUmemAllocationProp::default()
    };
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is a valid out-pointer, `prop` a valid description.
    unsafe { cu_call!(d, cuMemCreate(&mut handle, size, &prop, 0)) }?;
    Ok(handle)
}

/// A physical allocation on device 0 mapped at an address of a reservation, with access for
/// device 0; unmapped and released on drop.
struct Mapping {
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
}

impl Mapping {
    fn new(ptr: CUdeviceptr, size: usize) -> Result<Mapping, CudaError> {
        let d = driver()?;
        let handle = create_physical(size)?;
        // SAFETY: the range lies in a reservation the caller holds, with nothing mapped there.
        if let Err(e) = unsafe { cu_call!(d, cuMemMap(ptr, size, 0, handle, 0)) } {
            crate::owned::note_cleanup("releasing an unmapped allocation", release(handle));
            return Err(e);
        }
        let mapping = Mapping { ptr, size, handle };
        let access = CUmemAccessDesc {
            location: device_location(0),
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one descriptor for the whole mapping made above.
        unsafe { cu_call!(d, cuMemSetAccess(ptr, size, &access, 1)) }?;
        Ok(mapping)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let unmap = || -> Call {
            let d = driver()?;
            // SAFETY: the whole mapping this value made, unmapped once.
            unsafe { cu_call!(d, cuMemUnmap(self.ptr, self.size)) }
        };
        crate::owned::note_cleanup("unmapping", unmap());
        crate::owned::note_cleanup("releasing a physical allocation", release(self.handle));
    }
}
