//! A context's limits and cache preference: `cuCtxGetLimit`, `cuCtxSetLimit`,
//! `cuCtxGetCacheConfig`, `cuCtxSetCacheConfig`.
//!
//! Each context keeps its own values, starting at an H100's defaults (compute capability 9.0).
//! What `cuda.h` says of each limit is followed where it says something: the device runtime's
//! sync depth is `CUDA_ERROR_UNSUPPORTED_LIMIT` on compute capability 9.0, the L2 fetch
//! granularity is clamped to 0–128 bytes and the persisting L2 size to the device's
//! `MAX_PERSISTING_L2_CACHE_SIZE` (0 here: it is not modelled). The rest is in
//! [`conservative`](crate::conservative).

use std::sync::PoisonError;

use cuda_mem_sys::types::{CUdevice_attribute, CUfunc_cache, CUlimit, CUresult};

use crate::context as ctx;
use crate::error::{SimResult, ensure, fail, write_out};
use crate::state;

/// A context's settable limits and its cache preference.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    stack_size: usize,
    printf_fifo_size: usize,
    malloc_heap_size: usize,
    pending_launch_count: usize,
    max_l2_fetch_granularity: usize,
    persisting_l2_cache_size: usize,
    cache_config: CUfunc_cache,
}

impl Default for Settings {
    /// An H100's defaults.
    fn default() -> Settings {
        Settings {
            stack_size: 1024,
            printf_fifo_size: 1 << 20,
            malloc_heap_size: 8 << 20,
            pending_launch_count: 2048,
            max_l2_fetch_granularity: 64,
            persisting_l2_cache_size: 0,
            cache_config: CUfunc_cache::CU_FUNC_CACHE_PREFER_NONE,
        }
    }
}

/// The largest `CU_LIMIT_MAX_L2_FETCH_GRANULARITY` ("Values can range from 0B to 128B").
const MAX_L2_FETCH_GRANULARITY: usize = 128;

impl Settings {
    /// The slot of a settable limit; `CUDA_ERROR_UNSUPPORTED_LIMIT` for those this context has
    /// no value of (the sync depth on compute capability 9.0, the CIG limits outside a CIG
    /// context), `CUDA_ERROR_INVALID_VALUE` for a value `CUlimit` does not define.
    fn slot(&mut self, limit: CUlimit) -> SimResult<&mut usize> {
        use CUlimit as L;
        match limit {
            L::CU_LIMIT_STACK_SIZE => Ok(&mut self.stack_size),
            L::CU_LIMIT_PRINTF_FIFO_SIZE => Ok(&mut self.printf_fifo_size),
            L::CU_LIMIT_MALLOC_HEAP_SIZE => Ok(&mut self.malloc_heap_size),
            L::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT => Ok(&mut self.pending_launch_count),
            L::CU_LIMIT_MAX_L2_FETCH_GRANULARITY => Ok(&mut self.max_l2_fetch_granularity),
            L::CU_LIMIT_PERSISTING_L2_CACHE_SIZE => Ok(&mut self.persisting_l2_cache_size),
            L::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH | L::CU_LIMIT_SHMEM_SIZE | L::CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED => {
                fail(CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT)
            }
            _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// The value of `limit`.
    fn get(&mut self, limit: CUlimit) -> SimResult<usize> {
        // Not a CIG context: the flag reads 0 (it can only be queried).
        if limit == CUlimit::CU_LIMIT_CIG_ENABLED {
            return Ok(0);
        }
        self.slot(limit).map(|value| *value)
    }

    /// Sets `limit` to `value`, clamped where `cuda.h` says the driver clamps it.
    fn set(&mut self, limit: CUlimit, value: usize, persisting_l2_max: usize) -> SimResult {
        // "Can only be queried, cannot be set."
        ensure(limit != CUlimit::CU_LIMIT_CIG_ENABLED)?;
        let value = match limit {
            CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY => value.min(MAX_L2_FETCH_GRANULARITY),
            CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE => value.min(persisting_l2_max),
            _ => value,
        };
        *self.slot(limit)? = value;
        Ok(())
    }
}

/// `cuCtxGetLimit`: the current context's value of `limit`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_limit(out: *mut usize, limit: CUlimit) -> SimResult {
    ensure(!out.is_null())?;
    let context = ctx::current(&*state::lock()?)?;
    let value = context.settings.lock().unwrap_or_else(PoisonError::into_inner).get(limit)?;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, value) }
}

/// `cuCtxSetLimit`: sets the current context's `limit`.
pub(crate) fn set_limit(limit: CUlimit, value: usize) -> SimResult {
    let state = state::lock()?;
    let context = ctx::current(&state)?;
    let physical = state.config.physical(context.device).ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    drop(state);
    let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE;
    let persisting_l2_max = usize::try_from(crate::device::attribute(physical, attribute)?).unwrap_or(0);
    context.settings.lock().unwrap_or_else(PoisonError::into_inner).set(limit, value, persisting_l2_max)
}

/// `cuCtxGetCacheConfig`: the current context's preference (`CU_FUNC_CACHE_PREFER_NONE` until
/// one is set; an H100's L1 cache and shared memory share their hardware, so a preference set
/// is kept).
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn get_cache_config(out: *mut CUfunc_cache) -> SimResult {
    ensure(!out.is_null())?;
    let context = ctx::current(&*state::lock()?)?;
    let config = context.settings.lock().unwrap_or_else(PoisonError::into_inner).cache_config;
    // SAFETY: forwarded from the caller.
    unsafe { write_out(out, config) }
}

/// `cuCtxSetCacheConfig`: one of the four `CU_FUNC_CACHE_*` preferences.
pub(crate) fn set_cache_config(config: CUfunc_cache) -> SimResult {
    ensure(config.0 <= CUfunc_cache::CU_FUNC_CACHE_PREFER_EQUAL.0)?;
    let context = ctx::current(&*state::lock()?)?;
    context.settings.lock().unwrap_or_else(PoisonError::into_inner).cache_config = config;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_start_at_an_h100s_defaults_and_are_clamped_as_documented() {
        let mut settings = Settings::default();
        assert_eq!(settings.get(CUlimit::CU_LIMIT_STACK_SIZE), Ok(1024));
        assert_eq!(settings.get(CUlimit::CU_LIMIT_CIG_ENABLED), Ok(0));
        settings.set(CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 4096, 0).unwrap();
        assert_eq!(settings.get(CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY), Ok(128));
        settings.set(CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 1 << 20, 4096).unwrap();
        assert_eq!(settings.get(CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE), Ok(4096));
        let unsupported = CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT;
        assert_eq!(settings.set(CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4, 0), Err(unsupported));
        assert_eq!(settings.get(CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH), Err(unsupported));
        let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
        assert_eq!(settings.set(CUlimit::CU_LIMIT_CIG_ENABLED, 1, 0), Err(invalid));
        assert_eq!(settings.get(CUlimit::CU_LIMIT_MAX), Err(invalid));
        assert_eq!(settings.set(CUlimit(u32::MAX), 1, 0), Err(invalid));
    }
}
