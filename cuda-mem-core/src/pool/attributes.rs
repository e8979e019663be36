//! A pool's attributes (`cuMemPoolGetAttribute`/`cuMemPoolSetAttribute`): usage and its
//! high-water marks, the release threshold, the reuse policies, and trimming.

use std::ffi::c_void;

use cuda_sys::cu_call;
use cuda_sys::types::CUmemPool_attribute;

use super::MemoryPool;
use crate::driver::driver;
use crate::error::Result;

/// A snapshot of a pool's attributes (`cuMemPoolGetAttribute`).
#[doc(alias = "_MemPoolAttributes")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolAttributes {
    /// Reuse memory freed on another stream once the free's event dependencies are met.
    pub reuse_follow_event_dependencies: bool,
    /// Reuse memory freed on another stream when the free is known complete.
    pub reuse_allow_opportunistic: bool,
    /// Reuse memory freed on another stream by inserting dependencies.
    pub reuse_allow_internal_dependencies: bool,
    /// Reserved bytes the pool keeps at synchronization points instead of returning them.
    pub release_threshold: u64,
    /// Bytes the pool holds from the system.
    pub reserved_mem_current: u64,
    /// High-water mark of `reserved_mem_current` since creation or the last reset.
    pub reserved_mem_high: u64,
    /// Bytes in live allocations.
    pub used_mem_current: u64,
    /// High-water mark of `used_mem_current` since creation or the last reset.
    pub used_mem_high: u64,
}

/// One of the pool's reuse policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReusePolicy {
    /// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`.
    FollowEventDependencies,
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`.
    AllowOpportunistic,
    /// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`.
    AllowInternalDependencies,
}

impl ReusePolicy {
    fn attribute(self) -> CUmemPool_attribute {
        match self {
            ReusePolicy::FollowEventDependencies => {
                CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            }
            ReusePolicy::AllowOpportunistic => CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
            ReusePolicy::AllowInternalDependencies => {
                CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES
            }
        }
    }
}

impl MemoryPool {
    fn get(&self, attribute: CUmemPool_attribute) -> Result<u64> {
        let d = driver()?;
        let mut value = 0u64;
        // SAFETY: `value` has room for the largest attribute type (`cuuint64_t`); the 32-bit
        // reuse flags are read from its low bytes below.
        unsafe { cu_call!(d, cuMemPoolGetAttribute(self.handle(), attribute, (&raw mut value).cast::<c_void>())) }?;
        Ok(value)
    }

    fn get_flag(&self, attribute: CUmemPool_attribute) -> Result<bool> {
        // The reuse attributes are `int`: only the first four bytes were written.
        Ok(self.get(attribute)? as u32 != 0)
    }

    fn set_u64(&self, attribute: CUmemPool_attribute, mut value: u64) -> Result<()> {
        let d = driver()?;
        // SAFETY: `value` is a valid `cuuint64_t` for the call's duration.
        unsafe { cu_call!(d, cuMemPoolSetAttribute(self.handle(), attribute, (&raw mut value).cast::<c_void>())) }?;
        Ok(())
    }

    /// Reads every attribute.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn attributes(&self) -> Result<PoolAttributes> {
        use CUmemPool_attribute as A;
        Ok(PoolAttributes {
            reuse_follow_event_dependencies: self.get_flag(A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES)?,
            reuse_allow_opportunistic: self.get_flag(A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC)?,
            reuse_allow_internal_dependencies: self.get_flag(A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES)?,
            release_threshold: self.get(A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)?,
            reserved_mem_current: self.get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_mem_high: self.get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used_mem_current: self.get(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_mem_high: self.get(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }

    /// The release threshold: reserved bytes kept at synchronization points.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn release_threshold(&self) -> Result<u64> {
        self.get(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Sets the release threshold (`u64::MAX` keeps everything).
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set_u64(CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes)
    }

    /// Turns one reuse policy on or off.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn set_reuse(&self, policy: ReusePolicy, enabled: bool) -> Result<()> {
        let d = driver()?;
        let mut value = i32::from(enabled);
        // SAFETY: the reuse attributes take an `int`, which `value` is.
        unsafe {
            cu_call!(d, cuMemPoolSetAttribute(self.handle(), policy.attribute(), (&raw mut value).cast::<c_void>()))
        }?;
        Ok(())
    }

    /// Resets both high-water marks to the current values.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn reset_peak_usage(&self) -> Result<()> {
        self.set_u64(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
        self.set_u64(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0)
    }

    /// Returns reserved memory to the system until at most `keep` bytes (or what is in use)
    /// remain.
    ///
    /// # Errors
    /// If the driver call fails.
    #[doc(alias = "trim")]
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        let d = driver()?;
        // SAFETY: a live pool handle.
        unsafe { cu_call!(d, cuMemPoolTrimTo(self.handle(), keep)) }?;
        Ok(())
    }
}
