//! `cuPointerGetAttribute(s)`: what unified addressing knows about a pointer.

use std::ffi::c_void;

use cuda_mem_sys::types::{CUcontext, CUdeviceptr, CUmemorytype, CUpointer_attribute, CUresult};

use crate::error::{SimResult, ensure, fail};
use crate::memory::{Allocation, Kind};
use crate::state;

/// One attribute's value, with the C type `cuda.h` documents for it.
enum Value {
    /// `CUcontext`.
    Context(CUcontext),
    /// `unsigned int`.
    U32(u32),
    /// `int`.
    I32(i32),
    /// `CUdeviceptr` or `unsigned long long`.
    U64(u64),
    /// `size_t`.
    Size(usize),
    /// A pointer (`void*`, `CUmemoryPool`).
    Pointer(*mut c_void),
    /// A boolean, written as one byte (C `bool`).
    Bool(bool),
}

impl Value {
    /// Writes the value to `data`.
    ///
    /// # Safety
    /// `data` is valid for a write of the attribute's documented type.
    unsafe fn write(self, data: *mut c_void) {
        // SAFETY: forwarded from the caller; every write is unaligned-safe.
        unsafe {
            match self {
                Value::Context(v) => data.cast::<CUcontext>().write_unaligned(v),
                Value::U32(v) => data.cast::<u32>().write_unaligned(v),
                Value::I32(v) => data.cast::<i32>().write_unaligned(v),
                Value::U64(v) => data.cast::<u64>().write_unaligned(v),
                Value::Size(v) => data.cast::<usize>().write_unaligned(v),
                Value::Pointer(v) => data.cast::<*mut c_void>().write_unaligned(v),
                Value::Bool(v) => data.cast::<u8>().write_unaligned(u8::from(v)),
            }
        }
    }
}

/// The value of `attribute` for a pointer inside `allocation` (or outside any, when `None`:
/// the "null" values `cuPointerGetAttributes` documents).
fn value(attribute: CUpointer_attribute, pointer: CUdeviceptr, allocation: Option<&Allocation>) -> SimResult<Value> {
    use CUpointer_attribute as A;
    // Whether the memory reports as device memory: device and managed memory do (managed memory
    // is host-accessible here, but the driver reports it as device memory).
    let device = allocation.map(|a| a.kind.is_device_memory() || a.kind == Kind::Managed);
    let host_accessible = allocation.is_some_and(|a| !a.kind.is_device_memory());
    Ok(match attribute {
        A::CU_POINTER_ATTRIBUTE_CONTEXT => {
            Value::Context(allocation.map_or(std::ptr::null_mut(), |a| a.ctx as CUcontext))
        }
        A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => Value::U32(match device {
            Some(true) => CUmemorytype::CU_MEMORYTYPE_DEVICE.0,
            Some(false) => CUmemorytype::CU_MEMORYTYPE_HOST.0,
            None => 0,
        }),
        // Unified addressing: the device pointer through which the memory is reached is the
        // pointer itself, as cuda.h says ("will equal the input value").
        A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => Value::U64(allocation.map_or(0, |_| pointer)),
        A::CU_POINTER_ATTRIBUTE_HOST_POINTER => match allocation {
            Some(_) if host_accessible => Value::Pointer(pointer as *mut c_void),
            Some(_) => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
            None => Value::Pointer(std::ptr::null_mut()),
        },
        A::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => Value::Bool(false),
        // Pool-allocated managed memory does not report itself managed (as the driver does not).
        A::CU_POINTER_ATTRIBUTE_IS_MANAGED => Value::Bool(allocation.is_some_and(|a| a.kind == Kind::Managed)),
        A::CU_POINTER_ATTRIBUTE_BUFFER_ID => Value::U64(allocation.map_or(0, |a| a.id)),
        A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => Value::I32(allocation.map_or(-2, |a| a.device as i32)),
        A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE => {
            Value::Bool(allocation.is_some_and(|a| a.kind == Kind::Device))
        }
        A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => Value::U64(allocation.map_or(0, |a| a.base)),
        A::CU_POINTER_ATTRIBUTE_RANGE_SIZE => Value::Size(allocation.map_or(0, |a| a.size)),
        A::CU_POINTER_ATTRIBUTE_MAPPED => Value::Bool(allocation.is_some()),
        // Only cuMemCreate allocations can be exported as handles; none here are.
        A::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => Value::U64(0),
        A::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => Value::Pointer(match allocation.map(|a| a.kind) {
            Some(Kind::Pooled { pool, .. }) => pool as *mut c_void,
            _ => std::ptr::null_mut(),
        }),
        other if other.0 > 0 && other.0 <= A::CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE.0 => {
            return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

/// `cuPointerGetAttribute`: a pointer the simulator did not allocate is
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `data` is null or valid for a write of the attribute's documented type.
pub(crate) unsafe fn get_attribute(
    data: *mut c_void,
    attribute: CUpointer_attribute,
    pointer: CUdeviceptr,
) -> SimResult {
    ensure(!data.is_null())?;
    let state = state::lock()?;
    let allocation = state.memory.find(pointer).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if attribute == CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER {
        crate::context::current(&state)?;
    }
    let value = value(attribute, pointer, Some(allocation))?;
    // SAFETY: forwarded from the caller.
    unsafe { value.write(data) };
    Ok(())
}

/// `cuPointerGetAttributes`: like `cuPointerGetAttribute` for several attributes at once, but an
/// unknown pointer gets the documented null values instead of an error.
///
/// # Safety
/// `attributes` and `data` are valid for `count` elements, each `data[i]` null or valid for a
/// write of `attributes[i]`'s type.
pub(crate) unsafe fn get_attributes(
    count: u32,
    attributes: *const CUpointer_attribute,
    data: *mut *mut c_void,
    pointer: CUdeviceptr,
) -> SimResult {
    ensure(count > 0 && !attributes.is_null() && !data.is_null())?;
    let state = state::lock()?;
    let allocation = state.memory.find(pointer);
    // SAFETY: both arrays hold `count` elements by the caller's contract.
    let (attributes, data) = unsafe {
        (std::slice::from_raw_parts(attributes, count as usize), std::slice::from_raw_parts(data, count as usize))
    };
    let mut values = Vec::with_capacity(attributes.len());
    for &attribute in attributes {
        let value = match value(attribute, pointer, allocation) {
            // A pointer without a host mapping reports a null host pointer here.
            Err(code)
                if code == CUresult::CUDA_ERROR_INVALID_VALUE
                    && attribute == CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER =>
            {
                Value::Pointer(std::ptr::null_mut())
            }
            other => other?,
        };
        values.push(value);
    }
    for (value, &out) in values.into_iter().zip(data) {
        if !out.is_null() {
            // SAFETY: forwarded from the caller.
            unsafe { value.write(out) };
        }
    }
    Ok(())
}
