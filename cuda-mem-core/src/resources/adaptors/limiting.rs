//! [`LimitingAdaptor`]: a byte budget over a resource.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::DevicePtr;
use crate::error::{Error, Result};
use crate::memory_resource::{MemoryResource, PoolResource};
use crate::pool::MemoryPool;
use crate::stream::Stream;

/// Refuses allocations that would take the bytes allocated through it past a limit, with
/// [`Error::LimitExceeded`], without asking the resource it wraps (RMM's
/// `limiting_resource_adaptor`).
///
/// The budget is exact under concurrency: an allocation reserves its bytes (one
/// compare-and-swap) before the wrapped resource is asked and gives them back if it fails, and
/// a free gives them back once the wrapped resource has taken the memory, so the bytes allocated
/// through the adaptor are never more than the limit, at any moment. Sizes are the ones asked for
/// (the wrapped resource may round them up).
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, DeviceMemoryResource, Error, LimitingAdaptor, Stream};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let limited = LimitingAdaptor::new(DeviceMemoryResource::current(device)?, 1 << 20);
/// let held = limited.allocate(768 << 10, &stream)?;
/// let refused = limited.allocate(512 << 10, &stream).unwrap_err();
/// assert!(matches!(refused, Error::LimitExceeded { requested: 524288, limit: 1048576, in_use: 786432 }));
/// drop(held);
/// assert_eq!(limited.allocate(512 << 10, &stream)?.size(), 512 << 10);
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[doc(alias = "limiting_resource_adaptor")]
#[derive(Debug)]
pub struct LimitingAdaptor<R: MemoryResource + ?Sized> {
    inner: Arc<R>,
    limit: usize,
    /// Bytes reserved: allocated through this adaptor and not yet freed, and those of
    /// allocations under way.
    in_use: AtomicUsize,
}

impl<R: MemoryResource + ?Sized> LimitingAdaptor<R> {
    /// Allocates from `inner` while the bytes allocated through the result and not yet freed
    /// stay within `limit`.
    pub fn new(inner: Arc<R>, limit: usize) -> Arc<Self> {
        Arc::new(LimitingAdaptor { inner, limit, in_use: AtomicUsize::new(0) })
    }

    /// The resource this adaptor allocates from.
    #[doc(alias = "get_upstream_resource")]
    pub fn inner(&self) -> &Arc<R> {
        &self.inner
    }

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this adaptor (and what it wraps) alive
    /// ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) without the import).
    /// A zero-size request makes an empty buffer without asking the resource.
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows this adaptor (and what it wraps) and
    /// the stream ([`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped)
    /// without the import).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(self, size, stream)
    }

    /// The limit, in bytes.
    #[doc(alias = "get_allocation_limit")]
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes allocated through this adaptor and not yet freed (with those of allocations
    /// under way on other threads).
    #[doc(alias = "get_allocated_bytes")]
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Takes `size` bytes of the budget, or says why not.
    fn reserve(&self, size: usize) -> Result<()> {
        let mut in_use = self.in_use.load(Ordering::Relaxed);
        loop {
            let after = in_use.checked_add(size).filter(|&after| after <= self.limit);
            let Some(after) = after else {
                return Err(Error::LimitExceeded { requested: size, limit: self.limit, in_use });
            };
            match self.in_use.compare_exchange_weak(in_use, after, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => in_use = now,
            }
        }
    }

    fn release(&self, size: usize) {
        self.in_use.fetch_sub(size, Ordering::Relaxed);
    }
}

impl<R: PoolResource + ?Sized> PoolResource for LimitingAdaptor<R> {
    fn pool(&self) -> &MemoryPool {
        self.inner.pool()
    }
}

// SAFETY: the memory is the wrapped resource's, handed out and taken back unchanged (each pointer
// comes from `inner.allocate_raw` and goes back to `inner.deallocate_raw` with the same size and
// stream), and it answers every question about the memory as the wrapped resource, its
// `upstream` (the trait's defaults): its guarantees are this one's.
unsafe impl<R: MemoryResource + ?Sized> MemoryResource for LimitingAdaptor<R> {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        self.reserve(size)?;
        self.inner.allocate_raw(size, stream).inspect_err(|_| self.release(size))
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        // SAFETY: the caller's guarantees for this resource are the inner one's: this resource
        // allocated `ptr` through it.
        unsafe { self.inner.deallocate_raw(ptr, size, stream) }?;
        // Only now: until the wrapped resource has the memory back, it still counts.
        self.release(size);
        Ok(())
    }

    fn upstream(&self) -> Option<&dyn MemoryResource> {
        Some(self.inner.as_dyn_memory_resource())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::super::tests::setup;
    use super::*;
    use crate::StatisticsAdaptor;

    /// A refusal asks nothing of the pool (no driver call at all), and a failed allocation of
    /// the pool gives its bytes back. In a process of its own: the driver's call counts and
    /// failure injection are process-wide.
    #[test]
    fn a_refusal_never_reaches_the_inner_resource_and_failures_give_the_budget_back() {
        cuda_sim::testing::in_simulated_machine(
            "resources::adaptors::limiting::tests::a_refusal_never_reaches_the_inner_resource_and_failures_give_the_budget_back",
            &[],
            || {
                if !cuda_sim::testing::simulator_only("counting driver calls, failing one") {
                    return;
                }
                let (stream, pool) = setup();
                let limited = LimitingAdaptor::new(pool, 4096);
                let held = limited.allocate(4000, &stream).unwrap();
                let driver = cuda_sim::testing::driver().unwrap();
                let (refused, calls) =
                    cuda_sim::testing::count_calls(driver, || limited.allocate(97, &stream)).unwrap();
                let error = refused.unwrap_err();
                assert!(matches!(error, Error::LimitExceeded { requested: 97, limit: 4096, in_use: 4000 }), "{error}");
                assert!(error.to_string().contains("97 bytes asked for with 4000 of the limit's 4096 bytes in use"));
                assert_eq!(calls.total(), 0, "{calls:?}");
                assert_eq!(limited.in_use(), 4000);

                drop(held);
                assert_eq!(limited.in_use(), 0);
                cuda_sim::testing::inject_failure(driver, c"cuMemAllocFromPoolAsync", 1).unwrap();
                let failed = limited.allocate(4096, &stream).unwrap_err();
                assert!(!matches!(failed, Error::LimitExceeded { .. }), "{failed}");
                assert_eq!(limited.in_use(), 0, "the failed allocation's bytes are given back");
                assert_eq!(limited.allocate(4096, &stream).unwrap().size(), 4096);
            },
        );
    }

    #[test]
    fn sizes_past_the_address_space_are_refused_not_wrapped() {
        let (stream, pool) = setup();
        let limited = LimitingAdaptor::new(pool, usize::MAX);
        let held = limited.allocate(16, &stream).unwrap();
        let error = limited.allocate_raw(usize::MAX, &stream).unwrap_err();
        assert!(matches!(error, Error::LimitExceeded { requested: usize::MAX, in_use: 16, .. }), "{error}");
        drop(held);
    }

    /// Threads racing for the budget never hold more than it between them: the statistics under
    /// the limit see every allocation the pool made, and their peak stays within the limit.
    #[test]
    fn the_budget_is_exact_under_concurrency() {
        const THREADS: usize = 8;
        const CHUNK: usize = 1000;
        const ROUNDS: usize = 2000;
        let (stream, pool) = setup();
        let counted = StatisticsAdaptor::new(pool);
        let limited = LimitingAdaptor::new(Arc::clone(&counted), 3 * CHUNK + CHUNK / 2);
        let start = Barrier::new(THREADS);
        let refusals: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        start.wait();
                        let mut refusals = 0;
                        for _ in 0..ROUNDS {
                            match limited.allocate(CHUNK, &stream) {
                                // Held a moment, for the others to race past it if they can.
                                Ok(buffer) => {
                                    std::thread::yield_now();
                                    drop(buffer);
                                }
                                Err(Error::LimitExceeded { .. }) => refusals += 1,
                                Err(other) => panic!("{other}"),
                            }
                        }
                        refusals
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).sum()
        });
        let seen = counted.statistics();
        assert!(seen.peak_bytes <= 3 * CHUNK as u64, "{seen:?} over a budget of 3.5 chunks");
        assert_eq!(seen.total_count as usize + refusals, THREADS * ROUNDS);
        assert_eq!((limited.in_use(), seen.current_bytes), (0, 0));
    }
}
