//! A nearly free driver for `cargo xtask bench --compare`: the entry points an allocate+free
//! pair needs, each doing next to nothing, so that an API's time per pair on it is its own.
//!
//! On the simulator (or a GPU) the driver's time per pair is hundreds of nanoseconds and moves
//! with the machine's load; an API's overhead of tens of nanoseconds is the difference of two
//! such numbers. Here the raw calls take a few nanoseconds, and what an API adds is left.
//! It is a measuring stand-in, not a driver: it keeps no state beyond the current context and
//! hands out the same address every time. `cuGetProcAddress_v2` finds the functions below by
//! name and answers every other name with a function that returns `CUDA_SUCCESS` and writes
//! nothing (so out-parameters keep the zeros their callers put there), which is enough for
//! cuda.core's and our setup paths.
//!
//! xtask compiles it alone with `rustc --crate-type cdylib` and names it `libcuda.so.1` in a
//! folder of its own; it is no part of the workspace.

#![allow(non_snake_case)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

type CUresult = c_int;

thread_local! {
    /// `cuCtxSetCurrent`'s context.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The one primary context.
const CONTEXT: usize = 0x1000;

/// `CUDA_ERROR_INVALID_VALUE`, for a null out-pointer.
const INVALID_VALUE: CUresult = 1;

/// Writes `value` through the out-pointer `out` and returns `CUDA_SUCCESS`, or
/// `CUDA_ERROR_INVALID_VALUE` when `out` is null.
///
/// # Safety
/// `out` is null or valid for a write of `T`, as `cuda.h` requires of every out-parameter.
unsafe fn put<T>(out: *mut T, value: T) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: not null, and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    0
}

/// Every name this driver does not implement.
extern "C" fn succeed() -> CUresult {
    0
}

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    0
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(version, 13000) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(count, 1) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(device, ordinal) }
}

/// Every attribute is 1: every capability present (memory pools included).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, _attribute: c_int, _device: c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(value, 1) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(context: *mut usize, _device: c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(context, CONTEXT) }
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut usize) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(context, CURRENT.with(Cell::get)) }
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(context: usize) -> CUresult {
    CURRENT.with(|c| c.set(context));
    0
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(device, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(stream: *mut usize, _flags: c_uint, _priority: c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(stream, 0x2000) }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut usize, flags: c_uint) -> CUresult {
    // SAFETY: forwarded from the caller.
    unsafe { cuStreamCreateWithPriority(stream, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut usize, _props: *const c_void) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(pool, 0x3000) }
}

/// Every attribute reads as 0, written at its own width: the three reuse flags (1 to 3) are
/// `int`, the others `cuuint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(_pool: usize, attribute: c_int, value: *mut c_void) -> CUresult {
    // SAFETY: the caller passes an out-pointer valid for the attribute's type, as cuda.h requires.
    unsafe {
        if (1..=3).contains(&attribute) { put(value.cast::<c_int>(), 0) } else { put(value.cast::<u64>(), 0) }
    }
}

/// Never capturing.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(_stream: usize, status: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(status, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(ptr: *mut u64, _size: usize, _pool: usize, _stream: usize) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(ptr, 0x1_0000_0000) }
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(_ptr: u64, _stream: usize) -> CUresult {
    0
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(_error: CUresult, text: *mut *const c_char) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(text, c"CUDA_ERROR_UNKNOWN".as_ptr()) }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(_error: CUresult, text: *mut *const c_char) -> CUresult {
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(text, c"an error of the null driver".as_ptr()) }
}

/// The functions above by name; [`succeed`] for any other.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    function: *mut *const c_void,
    _version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    let known: &[(&CStr, *const c_void)] = &[
        (c"cuInit", cuInit as *const c_void),
        (c"cuDriverGetVersion", cuDriverGetVersion as *const c_void),
        (c"cuDeviceGetCount", cuDeviceGetCount as *const c_void),
        (c"cuDeviceGet", cuDeviceGet as *const c_void),
        (c"cuDeviceGetAttribute", cuDeviceGetAttribute as *const c_void),
        (c"cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain as *const c_void),
        (c"cuCtxGetCurrent", cuCtxGetCurrent as *const c_void),
        (c"cuCtxSetCurrent", cuCtxSetCurrent as *const c_void),
        (c"cuCtxGetDevice", cuCtxGetDevice as *const c_void),
        (c"cuStreamCreateWithPriority", cuStreamCreateWithPriority as *const c_void),
        (c"cuStreamCreate", cuStreamCreate as *const c_void),
        (c"cuMemPoolCreate", cuMemPoolCreate as *const c_void),
        (c"cuMemPoolGetAttribute", cuMemPoolGetAttribute as *const c_void),
        (c"cuStreamIsCapturing", cuStreamIsCapturing as *const c_void),
        (c"cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync as *const c_void),
        (c"cuMemFreeAsync", cuMemFreeAsync as *const c_void),
        (c"cuGetErrorName", cuGetErrorName as *const c_void),
        (c"cuGetErrorString", cuGetErrorString as *const c_void),
        (c"cuGetProcAddress", cuGetProcAddress_v2 as *const c_void),
    ];
    if symbol.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a non-null symbol name is NUL-terminated, as cuda.h requires.
    let name = unsafe { CStr::from_ptr(symbol) };
    let found = known.iter().find(|(n, _)| *n == name).map_or(succeed as *const c_void, |&(_, f)| f);
    if !status.is_null() {
        // SAFETY: a non-null status pointer is valid for a write, as cuda.h requires.
        unsafe { status.write(0) };
    }
    // SAFETY: the caller passes a valid out-pointer, as cuda.h requires.
    unsafe { put(function, found) }
}
