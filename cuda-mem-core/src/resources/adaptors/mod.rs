//! Memory-resource adaptors, the RMM way: each wraps an `Arc` of any [`MemoryResource`](crate::MemoryResource) (a pool
//! resource, an `Arc<dyn MemoryResource>`, another adaptor) and is a `MemoryResource` itself, so
//! they stack: a [`LimitingAdaptor`] over a [`StatisticsAdaptor`] over a pool. One file each:
//!
//! - [`statistics`]: [`StatisticsAdaptor`], current, peak and total bytes and allocation counts
//!   (empty buffers included, as allocations of 0 bytes), read at once as
//!   [`AllocationStatistics`] (RMM's `statistics_resource_adaptor`);
//! - [`limiting`]: [`LimitingAdaptor`], refuses allocations past a byte budget with
//!   [`Error::LimitExceeded`](crate::Error::LimitExceeded) (RMM's `limiting_resource_adaptor`);
//! - [`tracking`]: [`TrackingAdaptor`], the live allocations, each with a backtrace when asked,
//!   so leaks can be found ([`LeakReport`]; RMM's `tracking_resource_adaptor`).
//!
//! An empty buffer (0 bytes) holds no memory, so no adaptor's `allocate_raw` sees it; each
//! adaptor passes the notice of it on instead
//! ([`MemoryResource::note_empty_allocation`](crate::MemoryResource::note_empty_allocation)), for
//! a statistics adaptor anywhere in the stack to count. It takes nothing of a limiting
//! adaptor's budget, and a tracking adaptor records only memory.
//!
//! An adaptor answers every question about the memory (`is_device_accessible`,
//! `is_host_accessible`, `device`, `is_managed`, `may_be_written_externally`) as the resource it
//! wraps, which stays reachable through `inner()` and
//! [`MemoryResource::upstream`](crate::MemoryResource::upstream). A buffer
//! allocated through an adaptor holds the adaptor, which holds what it wraps: the whole stack
//! lives as long as the buffer. An adaptor over a pool resource is a
//! [`PoolResource`](crate::PoolResource) (its
//! `pool()` is the pool's) and [`MemoryResource::memory_pool`](crate::MemoryResource::memory_pool) sees through it, so such a pool and
//! its buffers are shared with other processes as the bare pool's are; what other processes do
//! with the memory is not counted (an adaptor sees this process's calls only).

pub mod limiting;
pub mod statistics;
pub mod tracking;

pub use limiting::LimitingAdaptor;
pub use statistics::{AllocationStatistics, StatisticsAdaptor};
pub use tracking::{LeakReport, LiveAllocation, TrackingAdaptor};

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Error, MemoryResource, PinnedMemoryResource,
        PoolResource, Stream,
    };

    /// Device 0, a stream on it and a pool of its own (so that other tests' buffers are not in it).
    pub(crate) fn setup() -> (Stream, Arc<DeviceMemoryResource>) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, Default::default()).unwrap();
        (stream, DeviceMemoryResource::new(device, Default::default()).unwrap())
    }

    #[test]
    fn adaptors_stack_and_their_buffers_keep_the_whole_stack_alive() {
        let (stream, pool) = setup();
        let tracked = TrackingAdaptor::new(Arc::clone(&pool));
        let counted = StatisticsAdaptor::new(Arc::clone(&tracked));
        let limited = LimitingAdaptor::new(Arc::clone(&counted), 10_000);
        let pool_alive = Arc::downgrade(&pool);
        let mut buffer = limited.allocate(4000, &stream).unwrap();
        let refused = limited.allocate(8000, &stream).unwrap_err();
        assert!(matches!(refused, Error::LimitExceeded { requested: 8000, limit: 10_000, in_use: 4000 }), "{refused}");
        assert_eq!(counted.statistics().current_bytes, 4000, "the refusal reached nothing below the limit");
        assert_eq!(tracked.report().allocations()[0].ptr, buffer.ptr());

        let (counted_alive, tracked_alive) = (Arc::downgrade(&counted), Arc::downgrade(&tracked));
        drop((limited, counted, tracked, pool));
        assert!(pool_alive.upgrade().is_some() && counted_alive.upgrade().is_some(), "the buffer holds the stack");
        buffer.fill(crate::FillPattern::U8(7), &stream).unwrap();
        assert_eq!(buffer.to_vec::<u8>(&stream).unwrap(), [7; 4000]);
        drop(buffer);
        assert!(
            pool_alive.upgrade().is_none() && counted_alive.upgrade().is_none() && tracked_alive.upgrade().is_none()
        );
    }

    #[test]
    fn adaptors_answer_as_what_they_wrap_and_see_through_to_the_pool() {
        let (_stream, pool) = setup();
        let pinned = PinnedMemoryResource::current().unwrap();
        let as_dyn: Arc<dyn MemoryResource> = pinned.clone();
        let over_pinned = LimitingAdaptor::new(StatisticsAdaptor::new(TrackingAdaptor::new(as_dyn)), 1 << 20);
        let over_device = StatisticsAdaptor::new(Arc::clone(&pool));
        for (adapted, bare) in
            [(&*over_pinned as &dyn MemoryResource, &*pinned as &dyn MemoryResource), (&*over_device, &*pool)]
        {
            assert_eq!(adapted.is_device_accessible(), bare.is_device_accessible());
            assert_eq!(adapted.is_host_accessible(), bare.is_host_accessible());
            assert_eq!(adapted.device(), bare.device());
            assert_eq!(adapted.is_managed(), bare.is_managed());
            assert_eq!(adapted.may_be_written_externally(), bare.may_be_written_externally());
            assert!(std::ptr::eq(adapted.memory_pool().unwrap(), bare.memory_pool().unwrap()), "seen through adaptors");
        }
        assert!(over_pinned.is_host_accessible() && !over_device.is_host_accessible());
        assert!(std::ptr::eq(over_device.pool(), pool.pool()), "an adaptor of a pool resource is one");
        assert!(Arc::ptr_eq(over_device.inner(), &pool));
        let upstream = over_device.upstream().unwrap();
        assert!(std::ptr::eq(upstream as *const dyn MemoryResource as *const u8, Arc::as_ptr(&pool) as *const u8));
        assert!(pool.upstream().is_none());
    }

    /// A shared pool stays shareable behind adaptors: its handle and its buffers' export data are
    /// the bare pool's, and host slices of memory others may write are still refused.
    #[test]
    fn an_adapted_shared_pool_exports_its_buffers_and_lends_no_host_slices() {
        let (stream, _) = setup();
        let device = Device::new(0).unwrap();
        let options = DeviceMemoryResourceOptions::default().ipc_enabled(true);
        let shared = StatisticsAdaptor::new(DeviceMemoryResource::new(device, options).unwrap());
        let buffer: Buffer = shared.allocate(4096, &stream).unwrap();
        let pool = buffer.memory_resource().unwrap().memory_pool().expect("the pool behind the buffer's adaptor");
        assert!(pool.shareable_handle().is_ok());
        assert!(pool.export_pointer(buffer.ptr()).is_ok());
        assert!(shared.may_be_written_externally());

        let pinned_options =
            crate::PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap());
        let pinned = TrackingAdaptor::new(PinnedMemoryResource::new(pinned_options).unwrap());
        let host = pinned.allocate(64, &stream).unwrap();
        assert!(matches!(host.host_slice(), Err(Error::WritableElsewhere { .. })));
    }
}
