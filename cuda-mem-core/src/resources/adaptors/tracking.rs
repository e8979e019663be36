//! [`TrackingAdaptor`]: the live allocations of a resource, to find leaks.

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::Device;
use crate::device::DevicePtr;
use crate::error::Result;
use crate::memory_resource::{MemoryResource, PoolResource};
use crate::pool::MemoryPool;
use crate::stream::Stream;

/// Keeps a record of every allocation made through it and not yet freed: its address, size,
/// stream and device, and, when made with [`with_backtraces`](TrackingAdaptor::with_backtraces),
/// where in the program it was allocated (RMM's `tracking_resource_adaptor`). What is still
/// live when it should not be is a leak: [`report`](TrackingAdaptor::report) lists them. An
/// empty buffer (a request for 0 bytes) holds no memory and has no address of its own to tell
/// it from another, so it is not recorded (a [`StatisticsAdaptor`](crate::StatisticsAdaptor)
/// below or above this one counts it).
///
/// Each allocation and free takes a lock on the records (and, with backtraces, captures one,
/// which costs microseconds): a tool for finding leaks, not for every hot path.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, DeviceMemoryResource, Stream, TrackingAdaptor};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, Default::default())?;
/// let tracked = TrackingAdaptor::with_backtraces(DeviceMemoryResource::current(device)?);
/// let kept = tracked.allocate(4096, &stream)?;
/// drop(tracked.allocate(256, &stream)?);
/// let leaked = tracked.allocate(1024, &stream)?.leak(); // ownership left; nobody frees it
///
/// let report = tracked.report();
/// assert_eq!(report.allocations().len(), 2);
/// assert_eq!(report.total_bytes(), 4096 + 1024);
/// assert!(report.allocations().iter().all(|a| a.backtrace.is_some()));
/// println!("{report}"); // each allocation, oldest first, with where it was made
/// # drop(kept);
/// # unsafe { cuda_mem_core::MemoryResource::deallocate_raw(&*tracked, leaked, 1024, &stream) }?;
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
#[doc(alias = "tracking_resource_adaptor")]
#[derive(Debug)]
pub struct TrackingAdaptor<R: MemoryResource + ?Sized> {
    inner: Arc<R>,
    capture_backtraces: bool,
    /// The live allocations by address, each with its place in allocation order.
    live: Mutex<HashMap<DevicePtr, (u64, LiveAllocation)>>,
    next_sequence: AtomicU64,
}

/// One allocation made through a [`TrackingAdaptor`] and not yet freed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LiveAllocation {
    /// Its address.
    pub ptr: DevicePtr,
    /// Its size in bytes, as asked for.
    pub size: usize,
    /// The stream it was allocated on: its handle (`CUstream`) as an integer, to compare with
    /// [`Stream::handle`].
    pub stream: usize,
    /// The device the memory belongs to (`None` for host memory).
    pub device: Option<Device>,
    /// Where it was allocated, when the adaptor captures backtraces.
    pub backtrace: Option<Arc<Backtrace>>,
}

/// The allocations a [`TrackingAdaptor`] holds live, oldest first
/// ([`TrackingAdaptor::report`]); its `Display` lists them, with their backtraces.
#[derive(Debug, Clone, Default)]
pub struct LeakReport {
    allocations: Vec<LiveAllocation>,
}

impl<R: MemoryResource + ?Sized> TrackingAdaptor<R> {
    /// Tracks the allocations made through the result (not those made from `inner` directly),
    /// without backtraces.
    pub fn new(inner: Arc<R>) -> Arc<Self> {
        TrackingAdaptor::make(inner, false)
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

    /// Tracks the allocations made through the result, each with a backtrace of where it was
    /// allocated (captured whatever `RUST_BACKTRACE` says).
    pub fn with_backtraces(inner: Arc<R>) -> Arc<Self> {
        TrackingAdaptor::make(inner, true)
    }

    fn make(inner: Arc<R>, capture_backtraces: bool) -> Arc<Self> {
        Arc::new(TrackingAdaptor {
            inner,
            capture_backtraces,
            live: Mutex::default(),
            next_sequence: AtomicU64::new(0),
        })
    }

    /// The allocations live now, oldest first.
    #[doc(alias = "get_outstanding_allocations")]
    pub fn report(&self) -> LeakReport {
        let mut live: Vec<(u64, LiveAllocation)> = self.records().values().cloned().collect();
        live.sort_unstable_by_key(|&(sequence, _)| sequence);
        LeakReport { allocations: live.into_iter().map(|(_, allocation)| allocation).collect() }
    }

    /// How many allocations are live.
    pub fn live_count(&self) -> usize {
        self.records().len()
    }

    /// The records, also after a thread panicked holding them (every change to them is a
    /// single insertion or removal, complete or not made).
    fn records(&self) -> MutexGuard<'_, HashMap<DevicePtr, (u64, LiveAllocation)>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LeakReport {
    /// The allocations, oldest first.
    pub fn allocations(&self) -> &[LiveAllocation] {
        &self.allocations
    }

    /// Their bytes, together.
    pub fn total_bytes(&self) -> usize {
        self.allocations.iter().map(|allocation| allocation.size).sum()
    }

    /// Whether nothing is live.
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} live allocation(s), {} bytes", self.allocations.len(), self.total_bytes())?;
        for allocation in &self.allocations {
            write!(f, "\n{} bytes at {:#x} on stream {:#x}", allocation.size, allocation.ptr, allocation.stream)?;
            match allocation.device {
                Some(device) => write!(f, " ({device})")?,
                None => write!(f, " (host memory)")?,
            }
            if let Some(backtrace) = &allocation.backtrace {
                write!(f, ", allocated at:\n{backtrace}")?;
            }
        }
        Ok(())
    }
}

impl<R: PoolResource + ?Sized> PoolResource for TrackingAdaptor<R> {
    fn pool(&self) -> &MemoryPool {
        self.inner.pool()
    }
}

// SAFETY: the memory is the wrapped resource's, handed out and taken back unchanged (each pointer
// comes from `inner.allocate_raw` and goes back to `inner.deallocate_raw` with the same size and
// stream), and it answers every question about the memory as the wrapped resource, its
// `upstream` (the trait's defaults): its guarantees are this one's.
unsafe impl<R: MemoryResource + ?Sized> MemoryResource for TrackingAdaptor<R> {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.inner.allocate_raw(size, stream)?;
        let allocation = LiveAllocation {
            ptr,
            size,
            stream: stream.handle() as usize,
            device: self.inner.device(),
            backtrace: self.capture_backtraces.then(|| Arc::new(Backtrace::force_capture())),
        };
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        self.records().insert(ptr, (sequence, allocation));
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        // Forgotten before it is freed: once freed, another thread may be handed the same address
        // and record it, which removing it afterwards would forget.
        let record = self.records().remove(&ptr);
        // SAFETY: the caller's guarantees for this resource are the inner one's: this resource
        // allocated `ptr` through it.
        let freed = unsafe { self.inner.deallocate_raw(ptr, size, stream) };
        if freed.is_err()
            && let Some(record) = record
        {
            // Not freed: still live.
            self.records().insert(ptr, record);
        }
        freed
    }

    fn upstream(&self) -> Option<&dyn MemoryResource> {
        Some(self.inner.as_dyn_memory_resource())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::setup;
    use super::*;

    #[test]
    fn the_report_lists_exactly_the_live_allocations_oldest_first() {
        let (stream, pool) = setup();
        let tracked = TrackingAdaptor::new(Arc::clone(&pool));
        let first = tracked.allocate(100, &stream).unwrap();
        let freed = tracked.allocate(200, &stream).unwrap();
        let scoped = tracked.allocate_scoped(300, &stream).unwrap();
        let last = tracked.allocate(400, &stream).unwrap();
        drop(freed);
        let report = tracked.report();
        let listed: Vec<(DevicePtr, usize)> = report.allocations().iter().map(|a| (a.ptr, a.size)).collect();
        assert_eq!(listed, [(first.ptr(), 100), (scoped.ptr(), 300), (last.ptr(), 400)]);
        assert_eq!((report.total_bytes(), tracked.live_count()), (800, 3));
        for allocation in report.allocations() {
            assert_eq!(allocation.stream, stream.handle() as usize);
            assert_eq!(allocation.device, Some(stream.device()));
            assert!(allocation.backtrace.is_none(), "none asked for");
        }
        let text = report.to_string();
        assert!(text.starts_with("3 live allocation(s), 800 bytes\n100 bytes at "), "{text}");
        assert!(text.contains(&format!("400 bytes at {:#x} on stream", last.ptr())), "{text}");
        assert!(text.contains("(device 0)") && !text.contains("allocated at"), "{text}");
        drop((first, scoped, last));
        assert!(tracked.report().is_empty());
        assert_eq!(tracked.report().to_string(), "0 live allocation(s), 0 bytes");
    }

    #[test]
    fn backtraces_say_where_a_leak_was_allocated() {
        let (stream, pool) = setup();
        let tracked = TrackingAdaptor::with_backtraces(pool);
        let leaked = tracked.allocate(64, &stream).unwrap().leak();
        let report = tracked.report();
        let [allocation] = report.allocations() else { panic!("one live allocation: {report}") };
        assert_eq!((allocation.ptr, allocation.size), (leaked, 64));
        let backtrace = allocation.backtrace.as_ref().expect("asked for").to_string();
        assert!(backtrace.contains("backtraces_say_where_a_leak_was_allocated"), "{backtrace}");
        assert!(report.to_string().contains("allocated at:\n"), "{report}");
        // SAFETY: the leaked allocation came from this resource, and nothing uses it.
        unsafe { tracked.deallocate_raw(leaked, 64, &stream) }.unwrap();
        assert!(tracked.report().is_empty());
    }

    /// A free the driver refuses leaves the memory allocated: still listed.
    #[test]
    fn a_refused_free_stays_listed() {
        cuda_sim::testing::in_simulated_machine(
            "resources::adaptors::tracking::tests::a_refused_free_stays_listed",
            &[],
            || {
                if !cuda_sim::testing::simulator_only("failing a free") {
                    return;
                }
                let (stream, pool) = setup();
                let tracked = TrackingAdaptor::new(pool);
                let ptr = tracked.allocate_raw(128, &stream).unwrap();
                let driver = cuda_sim::testing::driver().unwrap();
                cuda_sim::testing::inject_failure(driver, c"cuMemFreeAsync", 1).unwrap();
                // SAFETY: allocated just above, used by nothing.
                assert!(unsafe { tracked.deallocate_raw(ptr, 128, &stream) }.is_err());
                assert_eq!(tracked.report().allocations()[0].ptr, ptr);
                // SAFETY: as above; the refused free left it allocated.
                unsafe { tracked.deallocate_raw(ptr, 128, &stream) }.unwrap();
                assert!(tracked.report().is_empty());
            },
        );
    }
}
