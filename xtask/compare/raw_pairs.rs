//! Native allocate+free pairs for cuda.core's side of `cargo xtask bench --compare`.
//!
//! cuda.core's overhead is its time per pair minus the raw driver calls' time, and the raw time
//! must come from the same process, on the same pool and stream, under the same load: measured
//! in another process it drifts by more than the overhead. Python cannot make the raw calls
//! without interpreter costs of its own, so this tiny library makes them natively, in a loop,
//! through the driver's own entry points (which the script takes from `libcuda.so.1`).
//!
//! xtask compiles it alone with `rustc --crate-type cdylib`; it is no part of the workspace.

use std::ffi::{c_int, c_void};

/// `cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)`.
type AllocFromPoolAsync = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> c_int;
/// `cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)`.
type FreeAsync = unsafe extern "C" fn(u64, *mut c_void) -> c_int;

/// Makes `pairs` allocate+free pairs of `size` bytes from `pool` on `stream`; returns 0
/// (`CUDA_SUCCESS`) or the first failing call's result (-1 for a missing entry point).
///
/// # Safety
/// `alloc` and `free` are the driver's `cuMemAllocFromPoolAsync` and `cuMemFreeAsync`; `pool`
/// and `stream` are live handles of the current context.
#[no_mangle]
pub unsafe extern "C" fn raw_pairs(
    alloc: Option<AllocFromPoolAsync>,
    free: Option<FreeAsync>,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
    pairs: usize,
) -> c_int {
    let (Some(alloc), Some(free)) = (alloc, free) else {
        return -1;
    };
    for _ in 0..pairs {
        let mut ptr = 0u64;
        // SAFETY: `ptr` is a valid out-pointer; the caller vouches for the function and handles.
        let result = unsafe { alloc(&mut ptr, size, pool, stream) };
        if result != 0 {
            return result;
        }
        // SAFETY: `ptr` was just allocated on `stream` and is freed once.
        let result = unsafe { free(ptr, stream) };
        if result != 0 {
            return result;
        }
    }
    0
}
