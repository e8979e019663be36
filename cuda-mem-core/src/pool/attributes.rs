//! A pool's attributes (`cuMemPoolGetAttribute`/`cuMemPoolSetAttribute`): usage and its
//! high-water marks, the release threshold, the reuse policies, and trimming.

use std::ffi::c_void;

use cuda_mem_sys::types::CUmemPool_attribute;
use cuda_mem_sys::{CudaError, cu_call};

use super::MemoryPool;
use crate::driver::driver;
use crate::error::{Error, PoolHoldings, Result};

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

/// A pool's usage at a glance ([`MemoryPool::usage`]): its bytes, their high-water marks and
/// its live allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PoolUsage {
    /// Bytes in live allocations (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`): every process's, for a
    /// pool shared between processes.
    pub used_bytes: u64,
    /// High-water mark of `used_bytes` since creation or the last
    /// [`reset_peak_usage`](MemoryPool::reset_peak_usage).
    pub used_bytes_high: u64,
    /// Bytes the pool holds from the system (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`): live
    /// allocations and what it keeps cached.
    pub reserved_bytes: u64,
    /// High-water mark of `reserved_bytes`, as `used_bytes_high`.
    pub reserved_bytes_high: u64,
    /// Allocations this process made through this pool value (the resource) and has not freed
    /// yet. The driver does not count allocations, so this is counted here, in a slot per
    /// thread (a load and a store per allocation and per free, no locked instruction): exact
    /// for every allocation and free that happened before the read (the same thread, a joined
    /// one, one synchronized with); one racing with it on another thread may not be counted yet.
    pub live_allocations: u64,
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

    /// Its usage at a glance: used and reserved bytes with their high-water marks (four
    /// attribute reads) and the allocations made through this value that are still live.
    ///
    /// # Errors
    /// If a driver call fails.
    #[doc(alias("used_mem_current", "reserved_mem_current"))]
    pub fn usage(&self) -> Result<PoolUsage> {
        use CUmemPool_attribute as A;
        Ok(PoolUsage {
            used_bytes: self.get(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_bytes_high: self.get(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved_bytes: self.get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_bytes_high: self.get(A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            live_allocations: self.live_allocations.get(),
        })
    }

    /// The error for a failed allocation of `requested` bytes: out of memory, with the pool's
    /// cap and what it held (read now, on the failure path only; a read that fails leaves its
    /// field empty rather than hide the driver's error), or the driver's error.
    #[cold]
    pub(super) fn allocation_failed(&self, source: CudaError, requested: usize) -> Error {
        let mut error = Error::allocation(source, requested);
        if let Error::OutOfMemory(refused) = &mut error {
            let pool = crate::history::ResourceId(self.handle() as usize as u64);
            crate::history::record(crate::history::MemoryEventKind::OutOfMemory, 0, requested, None, pool);
            refused.pool = Some(PoolHoldings {
                max_size: self.max_size,
                reserved: self.get(CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).ok(),
                used: self.get(CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT).ok(),
            });
        }
        error
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
    /// Memory of buffers dropped on a stream may still count as in use until this thread has
    /// synchronized with that stream (`cuda.h`: frees whose completion the host has not observed
    /// "can count as outstanding"): synchronize the streams the buffers were freed on first
    /// ([`Stream::synchronize`](crate::Stream::synchronize)) to give back all that can be.
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

#[cfg(test)]
mod tests {
    use cuda_mem_sys::types::CUresult;

    use crate::{
        Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Error, PoolResource, Stream, StreamOptions,
    };

    fn device_and_stream() -> (Device, Stream) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        (device, Stream::new(device, StreamOptions::default().non_blocking()).unwrap())
    }

    #[test]
    fn usage_counts_bytes_marks_and_live_allocations() {
        let (device, stream) = device_and_stream();
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
        assert_eq!(pool.usage().unwrap(), crate::PoolUsage::default());
        let a = pool.allocate(1000, &stream).unwrap();
        let b = pool.allocate(3000, &stream).unwrap();
        let during = pool.usage().unwrap();
        let attributes = pool.attributes().unwrap();
        assert_eq!(during.live_allocations, 2);
        assert_eq!(during.used_bytes, attributes.used_mem_current);
        assert!(during.used_bytes >= 4000, "{during:?}");
        assert!(during.reserved_bytes >= during.used_bytes, "{during:?}");
        assert_eq!(during.reserved_bytes, attributes.reserved_mem_current);
        drop(a);
        let one_left = pool.usage().unwrap();
        assert_eq!(one_left.live_allocations, 1);
        drop(b);
        stream.synchronize().unwrap();
        let after = pool.usage().unwrap();
        assert_eq!((after.live_allocations, after.used_bytes), (0, 0));
        assert_eq!(after.used_bytes_high, during.used_bytes_high);
        assert_eq!(after.reserved_bytes_high, attributes.reserved_mem_high);
        assert!(after.used_bytes_high >= 4000, "{after:?}");
    }

    /// Buffers allocated on one thread and freed on others (which then exit) are counted out:
    /// once those threads are joined, the count is exact.
    #[test]
    fn live_allocations_freed_on_other_threads_are_counted_out() {
        let (device, stream) = device_and_stream();
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
        let buffers: Vec<_> = (0..4).map(|_| pool.allocate(256, &stream).unwrap()).collect();
        assert_eq!(pool.usage().unwrap().live_allocations, 4);
        let freeing: Vec<_> = buffers.into_iter().map(|buffer| std::thread::spawn(move || drop(buffer))).collect();
        for thread in freeing {
            thread.join().unwrap();
        }
        assert_eq!(pool.usage().unwrap().live_allocations, 0);
        let kept = pool.allocate(256, &stream).unwrap();
        assert_eq!(pool.usage().unwrap().live_allocations, 1);
        drop(kept);
    }

    /// A pool at its cap refuses with the bytes asked for, the cap and what it holds, and keeps
    /// the driver's error as the source.
    #[test]
    fn out_of_memory_names_the_request_the_cap_and_the_holdings() {
        let (device, stream) = device_and_stream();
        let cap = 4 << 20;
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().max_size(cap)).unwrap();
        let held = pool.allocate(2 << 20, &stream).unwrap();
        let error = pool.allocate(64 << 20, &stream).unwrap_err();
        let usage = pool.usage().unwrap();
        let Error::OutOfMemory(ref refused) = error else { panic!("not an out-of-memory error: {error:?}") };
        let (Some(holdings), source) = (refused.pool, &refused.source) else { panic!("no holdings: {error:?}") };
        assert_eq!((refused.requested, holdings.max_size), (64 << 20, Some(cap)));
        assert_eq!((holdings.reserved, holdings.used), (Some(usage.reserved_bytes), Some(usage.used_bytes)));
        assert!(holdings.used >= Some(2 << 20), "{error}");
        assert_eq!(source.code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let text = error.to_string();
        for part in [
            format!("{} bytes were asked of a pool capped at {cap} bytes (max_size)", 64 << 20),
            format!("{} bytes reserved, {} of them in use", usage.reserved_bytes, usage.used_bytes),
            "create the pool with a larger max_size".to_owned(),
            "cuMemAllocFromPoolAsync".to_owned(),
        ] {
            assert!(text.contains(&part), "{text:?} lacks {part:?}");
        }
        assert!(std::error::Error::source(&error).is_some_and(|s| s.is::<cuda_mem_sys::CudaError>()));
        drop(held);
    }

    /// Without a cap of its own the pool still says what it holds; an allocation larger than
    /// the device says how much was asked for.
    #[test]
    fn out_of_memory_without_a_cap_says_what_the_pool_holds() {
        let (device, stream) = device_and_stream();
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default()).unwrap();
        let too_much = device.total_memory().unwrap() + 1;
        let error = pool.allocate(too_much, &stream).unwrap_err();
        assert!(
            matches!(&error, Error::OutOfMemory(refused) if refused.requested == too_much
                && refused.pool.is_some_and(|held| held.max_size.is_none() && held.reserved.is_some() && held.used.is_some())),
            "{error:?}"
        );
        assert!(error.to_string().contains("and the device has no more"), "{error}");
        let legacy = crate::SynchronousMemoryResource::new(device).allocate(too_much, &stream).unwrap_err();
        assert!(
            matches!(&legacy, Error::OutOfMemory(refused) if refused.requested == too_much && refused.pool.is_none()),
            "{legacy:?}"
        );
        assert_eq!(legacy.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    }
}
