//! [`StatisticsAdaptor`]: how much a resource hands out, now, at most and in all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::DevicePtr;
use crate::error::Result;
use crate::memory_resource::{MemoryResource, PoolResource};
use crate::pool::MemoryPool;
use crate::stream::Stream;

/// Counts what flows through the resource it wraps: bytes and allocations, current, peak and
/// total (RMM's `statistics_resource_adaptor`). Lock-free: each allocation and free adds a few
/// atomic operations to the wrapped resource's own cost.
///
/// Sizes are the ones asked for (the wrapped resource may round them up). An allocation is
/// counted once the wrapped resource has made it, a free once it has taken the memory back (a
/// free it refuses leaves the memory counted, as it is still allocated). Every buffer handed out
/// counts, empty ones too: a request for 0 bytes is an allocation of 0 bytes (no memory, so the
/// wrapped resource is only told of it,
/// [`note_empty_allocation`](MemoryResource::note_empty_allocation)), and its drop a free.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, DeviceMemoryResource, StatisticsAdaptor, Stream};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let counted = StatisticsAdaptor::new(DeviceMemoryResource::new(device, Default::default())?);
/// let a = counted.allocate(1000, &stream)?;
/// drop(counted.allocate(3000, &stream)?);
/// let empty = counted.allocate(0, &stream)?;
/// let stats = counted.statistics();
/// assert_eq!((stats.current_bytes, stats.peak_bytes, stats.total_bytes), (1000, 4000, 4000));
/// assert_eq!((stats.current_count, stats.peak_count, stats.total_count), (2, 2, 3));
/// # drop((a, empty));
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[doc(alias = "statistics_resource_adaptor")]
#[derive(Debug)]
pub struct StatisticsAdaptor<R: MemoryResource + ?Sized> {
    inner: Arc<R>,
    bytes: Counter,
    allocations: Counter,
}

/// What a [`StatisticsAdaptor`] counted, read at once ([`StatisticsAdaptor::statistics`]).
///
/// Each field is exact; under concurrent allocation they are read one after another, so they
/// may come from moments a few operations apart (the peaks are never below the current values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AllocationStatistics {
    /// Bytes allocated and not yet freed.
    pub current_bytes: u64,
    /// The most bytes allocated at once (since the adaptor was made or its peaks were reset).
    pub peak_bytes: u64,
    /// Bytes allocated in all.
    pub total_bytes: u64,
    /// Allocations not yet freed (empty buffers not yet dropped included).
    pub current_count: u64,
    /// The most allocations live at once (since the adaptor was made or its peaks were reset).
    pub peak_count: u64,
    /// Allocations made in all (empty buffers included).
    pub total_count: u64,
}

/// A quantity's current value, its peak and its total (what was ever added).
#[derive(Debug, Default)]
struct Counter {
    current: AtomicU64,
    peak: AtomicU64,
    total: AtomicU64,
}

impl Counter {
    fn add(&self, amount: u64) {
        let now = self.current.fetch_add(amount, Ordering::Relaxed) + amount;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.total.fetch_add(amount, Ordering::Relaxed);
    }

    fn subtract(&self, amount: u64) {
        self.current.fetch_sub(amount, Ordering::Relaxed);
    }

    /// Current, peak and total. The current value is read first: a concurrent `add` may have
    /// raised it and not yet the peak, which is at least what was read, so it is raised to that.
    fn read(&self) -> (u64, u64, u64) {
        let current = self.current.load(Ordering::Relaxed);
        let peak = self.peak.load(Ordering::Relaxed).max(current);
        (current, peak, self.total.load(Ordering::Relaxed))
    }

    fn reset_peak(&self) {
        self.peak.store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl<R: MemoryResource + ?Sized> StatisticsAdaptor<R> {
    /// Counts the allocations made through the result (not those made from `inner` directly),
    /// from zero.
    pub fn new(inner: Arc<R>) -> Arc<Self> {
        Arc::new(StatisticsAdaptor { inner, bytes: Counter::default(), allocations: Counter::default() })
    }

    /// The resource this adaptor allocates from.
    #[doc(alias = "get_upstream_resource")]
    pub fn inner(&self) -> &Arc<R> {
        &self.inner
    }

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this adaptor (and what it wraps) alive
    /// ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) without the import).
    /// A zero-size request makes an empty buffer without asking the wrapped resource for
    /// memory; it is counted as an allocation of 0 bytes.
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

    /// Everything counted so far.
    #[doc(alias = "get_bytes_counter")]
    #[doc(alias = "get_allocations_counter")]
    pub fn statistics(&self) -> AllocationStatistics {
        let (current_bytes, peak_bytes, total_bytes) = self.bytes.read();
        let (current_count, peak_count, total_count) = self.allocations.read();
        AllocationStatistics { current_bytes, peak_bytes, total_bytes, current_count, peak_count, total_count }
    }

    /// Starts the peaks again from the current values (of bytes and of allocations), to watch
    /// the high-water mark of one phase of a program. Under concurrent allocation the new peak
    /// is the current value at some moment during the call.
    pub fn reset_peaks(&self) {
        self.bytes.reset_peak();
        self.allocations.reset_peak();
    }
}

impl<R: PoolResource + ?Sized> PoolResource for StatisticsAdaptor<R> {
    fn pool(&self) -> &MemoryPool {
        self.inner.pool()
    }
}

// SAFETY: the memory is the wrapped resource's, handed out and taken back unchanged (each pointer
// comes from `inner.allocate_raw` and goes back to `inner.deallocate_raw` with the same size and
// stream), and it answers every question about the memory as the wrapped resource, its
// `upstream` (the trait's defaults): its guarantees are this one's.
unsafe impl<R: MemoryResource + ?Sized> MemoryResource for StatisticsAdaptor<R> {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.inner.allocate_raw(size, stream)?;
        self.bytes.add(size as u64);
        self.allocations.add(1);
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        // SAFETY: the caller's guarantees for this resource are the inner one's: this resource
        // allocated `ptr` through it.
        unsafe { self.inner.deallocate_raw(ptr, size, stream) }?;
        self.bytes.subtract(size as u64);
        self.allocations.subtract(1);
        Ok(())
    }

    fn upstream(&self) -> Option<&dyn MemoryResource> {
        Some(self.inner.as_dyn_memory_resource())
    }

    fn note_empty_allocation(&self) {
        self.inner.note_empty_allocation();
        self.allocations.add(1);
    }

    fn note_empty_deallocation(&self) {
        self.inner.note_empty_deallocation();
        self.allocations.subtract(1);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::setup;
    use super::*;
    use crate::{Error, LimitingAdaptor};

    fn stats(current: (u64, u64), peak: (u64, u64), total: (u64, u64)) -> AllocationStatistics {
        AllocationStatistics {
            current_bytes: current.0,
            current_count: current.1,
            peak_bytes: peak.0,
            peak_count: peak.1,
            total_bytes: total.0,
            total_count: total.1,
        }
    }

    #[test]
    fn counts_and_bytes_follow_allocations_and_frees() {
        let (stream, pool) = setup();
        let counted = StatisticsAdaptor::new(pool);
        assert_eq!(counted.statistics(), AllocationStatistics::default());
        let a = counted.allocate(100, &stream).unwrap();
        let b = counted.allocate(200, &stream).unwrap();
        let c = counted.allocate_scoped(300, &stream).unwrap();
        assert_eq!(counted.statistics(), stats((600, 3), (600, 3), (600, 3)));
        drop((b, c));
        let d = counted.allocate(50, &stream).unwrap();
        assert_eq!(counted.statistics(), stats((150, 2), (600, 3), (650, 4)));
        drop((a, d));
        assert_eq!(counted.statistics(), stats((0, 0), (600, 3), (650, 4)));
    }

    /// An empty buffer is an allocation of 0 bytes, counted when made and when dropped, however
    /// it is made, freed or handed on.
    #[test]
    fn empty_buffers_count_as_allocations_of_zero_bytes() {
        let (stream, pool) = setup();
        let counted = StatisticsAdaptor::new(pool);
        let a = counted.allocate(0, &stream).unwrap();
        let b = counted.allocate_scoped(0, &stream).unwrap();
        let c = Buffer::allocate(Arc::clone(&counted) as Arc<dyn MemoryResource>, 0, &stream).unwrap();
        let d = counted.allocate(64, &stream).unwrap();
        assert_eq!(counted.statistics(), stats((64, 4), (64, 4), (64, 4)));
        drop((a, b));
        assert_eq!(counted.statistics(), stats((64, 2), (64, 4), (64, 4)));
        // Closed, then dropped: one free.
        c.close(None).unwrap();
        assert_eq!(counted.statistics(), stats((64, 1), (64, 4), (64, 4)));
        // Its parts handed out own it (no free), and taken back are freed once.
        let raw = counted.allocate(0, &stream).unwrap().into_raw().unwrap();
        assert_eq!(counted.statistics(), stats((64, 2), (64, 4), (64, 5)));
        // SAFETY: the parts of an empty buffer of this resource, taken back once.
        drop(unsafe { Buffer::from_raw_owned(raw.ptr, raw.size, raw.resource, &raw.stream) });
        assert_eq!(counted.statistics(), stats((64, 1), (64, 4), (64, 5)));
        // An adaptor above passes the notices on, as it passes allocations.
        let limited = LimitingAdaptor::new(Arc::clone(&counted), 16);
        let e = limited.allocate(0, &stream).unwrap();
        assert_eq!(counted.statistics(), stats((64, 2), (64, 4), (64, 6)));
        drop((e, d));
        assert_eq!(counted.statistics(), stats((0, 0), (64, 4), (64, 6)));
    }

    #[test]
    fn peaks_reset_to_the_current_values() {
        let (stream, pool) = setup();
        let counted = StatisticsAdaptor::new(pool);
        let kept = counted.allocate(1000, &stream).unwrap();
        drop(counted.allocate(5000, &stream).unwrap());
        assert_eq!(counted.statistics().peak_bytes, 6000);
        counted.reset_peaks();
        assert_eq!(counted.statistics(), stats((1000, 1), (1000, 1), (6000, 2)));
        drop(counted.allocate(10, &stream).unwrap());
        assert_eq!(counted.statistics(), stats((1000, 1), (1010, 2), (6010, 3)));
        drop(kept);
    }

    #[test]
    fn what_the_inner_resource_refuses_is_not_counted() {
        let (stream, pool) = setup();
        let counted = StatisticsAdaptor::new(LimitingAdaptor::new(pool, 1000));
        let kept = counted.allocate(800, &stream).unwrap();
        assert!(matches!(counted.allocate(800, &stream), Err(Error::LimitExceeded { .. })));
        assert_eq!(counted.statistics(), stats((800, 1), (800, 1), (800, 1)));
        drop(kept);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Allocate(usize),
        /// Frees the live buffer at this index (modulo how many there are), if any.
        Free(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        // Empty buffers among them, about one allocation in four (as in the run that found them
        // uncounted).
        let size = prop_oneof![1 => Just(0usize), 3 => 1usize..=1 << 16];
        prop_oneof![size.prop_map(Step::Allocate), any::<usize>().prop_map(Step::Free)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// current = total allocated − total freed, peak ≥ current, and every field is what a
        /// plain model of the sequence says.
        #[test]
        fn statistics_match_a_model_of_any_sequence(steps in proptest::collection::vec(step(), 1..40)) {
            let (stream, pool) = setup();
            let counted = StatisticsAdaptor::new(pool);
            let mut live = Vec::new();
            let (mut allocated, mut freed, mut peak, mut peak_count, mut count) = (0u64, 0u64, 0u64, 0u64, 0u64);
            for step in steps {
                match step {
                    Step::Allocate(size) => {
                        live.push(counted.allocate(size, &stream).unwrap());
                        allocated += size as u64;
                        count += 1;
                    }
                    Step::Free(index) if !live.is_empty() => {
                        let buffer = live.swap_remove(index % live.len());
                        freed += buffer.size() as u64;
                        drop(buffer);
                    }
                    Step::Free(_) => {}
                }
                let current = allocated - freed;
                peak = peak.max(current);
                peak_count = peak_count.max(live.len() as u64);
                let seen = counted.statistics();
                prop_assert_eq!(seen.current_bytes, current);
                prop_assert!(seen.peak_bytes >= seen.current_bytes && seen.peak_count >= seen.current_count);
                prop_assert_eq!(seen, stats((current, live.len() as u64), (peak, peak_count), (allocated, count)));
            }
        }
    }
}
