//! The memory history: a bounded record of what the process's memory resources did (PyTorch's
//! `torch.cuda.memory._record_memory_history`), for snapshots and the viewer to show.
//!
//! Off by default: every allocation then pays one relaxed atomic load. [`start_recording`]
//! keeps the last [`HistoryOptions::capacity`] events in a ring, each with its time, size,
//! address, stream, resource and thread, and with [`HistoryOptions::backtraces`], the stack it
//! came from, captured without resolving symbols (resolved only when the history is written
//! out). [`history`] reads the ring; [`stop_recording`] stops and keeps what was recorded.
//!
//! ```
//! # cuda_sim::testing::driver()?; // the tests run this example on the simulator
//! # let _serial = cuda_mem_core::history::tests_serial(); // one recording at a time, in tests
//! use cuda_mem_core::history::{self, HistoryOptions, MemoryEventKind, ResourceId};
//! use cuda_mem_core::{Device, DeviceMemoryResource, MemoryResourceExt, Stream};
//!
//! let device = Device::new(0)?;
//! let stream = Stream::new(device, Default::default())?;
//! let pool = DeviceMemoryResource::new(device, Default::default())?;
//! history::start_recording(HistoryOptions::default().free_completions(true));
//! drop(pool.allocate(4096, &stream)?);
//! stream.synchronize()?; // the free completes once the stream's work before it is done
//! history::stop_recording();
//! // This pool's events (other threads' may be recorded too).
//! let ours: Vec<_> =
//!     history::history().events.into_iter().filter(|event| event.resource == ResourceId::of(&*pool)).collect();
//! let kinds: Vec<_> = ours.iter().map(|event| event.kind).collect();
//! assert_eq!(kinds, [MemoryEventKind::Allocate, MemoryEventKind::FreeRequested, MemoryEventKind::FreeCompleted]);
//! assert_eq!((ours[0].size, ours[0].address), (4096, ours[2].address));
//! # Ok::<(), cuda_mem_core::Error>(())
//! ```

use std::backtrace::Backtrace;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::device::DevicePtr;
use crate::stream::Stream;

/// What a [`MemoryEvent`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryEventKind {
    /// A buffer was allocated (a `Buffer` or `ScopedBuffer`, from any resource).
    Allocate,
    /// A buffer's memory was given back to its resource, in the order of its stream (the
    /// memory is free for reuse once the stream's work so far is done).
    FreeRequested,
    /// The stream a buffer was freed on finished the work enqueued before the free: the memory
    /// is free now (recorded from the driver's callback thread, after the stream's work, with
    /// [`HistoryOptions::free_completions`]).
    FreeCompleted,
    /// A caching resource took a segment from its upstream (or mapped a new expandable one).
    SegmentAllocate,
    /// A caching resource gave a segment back upstream.
    SegmentFree,
    /// An expandable segment grew by `size` bytes at its end.
    SegmentGrow,
    /// An expandable segment's free end (`size` bytes) was unmapped.
    SegmentShrink,
    /// Memory was exported for another process.
    Export,
    /// Memory of another process's was imported.
    Import,
    /// An allocation of `size` bytes failed for want of memory.
    OutOfMemory,
}

impl MemoryEventKind {
    /// Every kind, in declaration order.
    pub const ALL: [MemoryEventKind; 10] = [
        MemoryEventKind::Allocate,
        MemoryEventKind::FreeRequested,
        MemoryEventKind::FreeCompleted,
        MemoryEventKind::SegmentAllocate,
        MemoryEventKind::SegmentFree,
        MemoryEventKind::SegmentGrow,
        MemoryEventKind::SegmentShrink,
        MemoryEventKind::Export,
        MemoryEventKind::Import,
        MemoryEventKind::OutOfMemory,
    ];

    /// Its name in the snapshot schema and the viewer (`"allocate"`, `"free_requested"`, …).
    pub fn name(self) -> &'static str {
        match self {
            MemoryEventKind::Allocate => "allocate",
            MemoryEventKind::FreeRequested => "free_requested",
            MemoryEventKind::FreeCompleted => "free_completed",
            MemoryEventKind::SegmentAllocate => "segment_allocate",
            MemoryEventKind::SegmentFree => "segment_free",
            MemoryEventKind::SegmentGrow => "segment_grow",
            MemoryEventKind::SegmentShrink => "segment_shrink",
            MemoryEventKind::Export => "export",
            MemoryEventKind::Import => "import",
            MemoryEventKind::OutOfMemory => "out_of_memory",
        }
    }

    /// The kind [`name`](MemoryEventKind::name) names.
    pub fn from_name(name: &str) -> Option<MemoryEventKind> {
        MemoryEventKind::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// One thing a memory resource did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MemoryEvent {
    /// When, since the process's first recording began.
    pub time: Duration,
    /// What.
    pub kind: MemoryEventKind,
    /// The memory's address (0 for an out-of-memory failure).
    pub address: DevicePtr,
    /// Its size in bytes (for a failure, the size asked for).
    pub size: usize,
    /// The handle of the stream it was ordered on (0: none, or the legacy default stream).
    pub stream: u64,
    /// The resource that did it: the [`ResourceId`] a snapshot names it by.
    pub resource: ResourceId,
    /// The thread that did it, numbered from 1 in the order threads first recorded.
    pub thread: u64,
    /// The stack it came from, when recorded with [`HistoryOptions::backtraces`] (resolved to
    /// symbols only when displayed).
    pub backtrace: Option<Arc<Backtrace>>,
}

/// A memory resource, as events and snapshots name it: the address of the resource object, which
/// is unique among the resources alive at one time. (A driver pool's own out-of-memory failures,
/// exports and imports name the pool by its handle.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ResourceId(pub u64);

impl ResourceId {
    /// The id of `resource` (any value whose address identifies it).
    pub fn of<T: ?Sized>(resource: &T) -> ResourceId {
        ResourceId(std::ptr::from_ref(resource).cast::<()>() as usize as u64)
    }
}

/// How to record ([`start_recording`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryOptions {
    capacity: usize,
    backtraces: bool,
    free_completions: bool,
}

impl Default for HistoryOptions {
    /// The last 100,000 events, without backtraces or free completions.
    fn default() -> Self {
        HistoryOptions { capacity: 100_000, backtraces: false, free_completions: false }
    }
}

impl HistoryOptions {
    /// Keep the last `events` events (at least 1): older ones are dropped, and counted.
    pub fn capacity(mut self, events: usize) -> Self {
        self.capacity = events.max(1);
        self
    }

    /// Capture the stack of every event (unresolved; a few microseconds each).
    pub fn backtraces(mut self, enabled: bool) -> Self {
        self.backtraces = enabled;
        self
    }

    /// Record when each free completes ([`MemoryEventKind::FreeCompleted`]): a host function
    /// enqueued on the freeing stream after the free, which the driver runs once the work before
    /// it is done (one more driver call per free, and the stream's work waits for the host).
    pub fn free_completions(mut self, enabled: bool) -> Self {
        self.free_completions = enabled;
        self
    }
}

/// What [`history`] read: the events kept, oldest first, and how many were dropped for want of
/// room.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct HistoryRecord {
    /// The events kept, oldest first.
    pub events: Vec<MemoryEvent>,
    /// Events recorded and then dropped, oldest first, when the ring was full.
    pub dropped: u64,
    /// Whether recording is on.
    pub recording: bool,
}

/// Whether events are recorded: the one load every allocation pays.
static RECORDING: AtomicBool = AtomicBool::new(false);
/// Whether events carry backtraces ([`HistoryOptions::backtraces`]).
static BACKTRACES: AtomicBool = AtomicBool::new(false);
/// Whether frees' completions are recorded ([`HistoryOptions::free_completions`]).
static FREE_COMPLETIONS: AtomicBool = AtomicBool::new(false);

/// The ring and its options.
#[derive(Debug)]
struct Ring {
    options: HistoryOptions,
    events: VecDeque<MemoryEvent>,
    dropped: u64,
}

fn ring() -> MutexGuard<'static, Ring> {
    static RING: Mutex<Ring> = Mutex::new(Ring {
        options: HistoryOptions { capacity: 1, backtraces: false, free_completions: false },
        events: VecDeque::new(),
        dropped: 0,
    });
    RING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// When the process's first recording began: every event's time counts from it.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The history's clock now: the time since the process's first recording began (or since the
/// first reading of it).
pub(crate) fn now() -> Duration {
    epoch().elapsed()
}

/// Starts recording with `options`, from an empty ring (what an earlier recording kept is
/// dropped, uncounted).
pub fn start_recording(options: HistoryOptions) {
    epoch();
    let mut ring = ring();
    *ring = Ring { options, events: VecDeque::with_capacity(options.capacity.min(1 << 16)), dropped: 0 };
    BACKTRACES.store(options.backtraces, Ordering::Relaxed);
    FREE_COMPLETIONS.store(options.free_completions, Ordering::Relaxed);
    RECORDING.store(true, Ordering::Release);
}

/// Stops recording; what was recorded stays for [`history`].
pub fn stop_recording() {
    RECORDING.store(false, Ordering::Release);
}

/// Whether events are being recorded.
pub fn is_recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// The events kept so far (recording goes on, if on).
pub fn history() -> HistoryRecord {
    let ring = ring();
    HistoryRecord { events: ring.events.iter().cloned().collect(), dropped: ring.dropped, recording: is_recording() }
}

/// Records an event when recording is on: one relaxed load when it is off. The resources of
/// this crate record their own; a resource of another crate records what it does with this
/// (`cuda-mem-vmm` its exports and imports).
#[inline]
pub fn record(kind: MemoryEventKind, address: DevicePtr, size: usize, stream: Option<&Stream>, resource: ResourceId) {
    if RECORDING.load(Ordering::Relaxed) {
        record_now(kind, address, size, stream.map_or(0, |stream| stream.handle() as usize as u64), resource);
    }
}

/// Records a free requested on `stream` and, with [`HistoryOptions::free_completions`], once the
/// stream's work before it is done, its completion (a host function enqueued on the stream; not
/// on a capturing stream, whose work runs only when its graph is launched, nor on another
/// thread's per-thread default stream).
#[inline]
pub(crate) fn record_free(address: DevicePtr, size: usize, stream: &Stream, resource: ResourceId) {
    if RECORDING.load(Ordering::Relaxed) {
        let handle = stream.handle() as usize as u64;
        record_now(MemoryEventKind::FreeRequested, address, size, handle, resource);
        if FREE_COMPLETIONS.load(Ordering::Relaxed)
            && matches!(stream.capture_state(), crate::stream::CaptureState::NotCapturing)
            && !stream.is_foreign_per_thread()
        {
            completion::enqueue(stream, Completed { address, size, stream: handle, resource });
        }
    }
}

/// What a free's completion records.
#[derive(Debug)]
struct Completed {
    address: DevicePtr,
    size: usize,
    stream: u64,
    resource: ResourceId,
}

/// The host function that records a free's completion.
mod completion {
    use std::ffi::c_void;

    use cuda_mem_sys::cu_call;

    use super::{Completed, MemoryEventKind, record_now};
    use crate::stream::Stream;

    /// Enqueues the recording of `completed` on `stream`, after its work so far. A failure to
    /// enqueue loses that one event (the free itself is done).
    pub(super) fn enqueue(stream: &Stream, completed: Completed) {
        let Ok(d) = crate::driver::driver() else { return };
        let data = Box::into_raw(Box::new(completed)).cast::<c_void>();
        // SAFETY: `on_completion` matches `CUhostFn` and takes ownership of `data`, a live box,
        // exactly once; the stream's handle is live while `stream` is.
        let launched = unsafe { cu_call!(d, cuLaunchHostFunc(stream.handle(), Some(on_completion), data)) };
        if launched.is_err() {
            // SAFETY: not enqueued, so not taken by the callback: this is its one owner.
            drop(unsafe { Box::from_raw(data.cast::<Completed>()) });
        }
    }

    /// Runs on the driver's thread once the work before it is done: records the completion. No
    /// driver call is made here (the driver forbids them in host functions), and no panic
    /// crosses back into the driver.
    extern "C" fn on_completion(data: *mut c_void) {
        // SAFETY: `data` is the box `enqueue` leaked for this one call.
        let completed = unsafe { Box::from_raw(data.cast::<Completed>()) };
        let _ = std::panic::catch_unwind(move || {
            let Completed { address, size, stream, resource } = *completed;
            record_now(MemoryEventKind::FreeCompleted, address, size, stream, resource);
        });
    }
}

#[cold]
#[inline(never)]
fn record_now(kind: MemoryEventKind, address: DevicePtr, size: usize, stream: u64, resource: ResourceId) {
    let time = epoch().elapsed();
    let thread = thread_number();
    // Captured outside the lock, so that threads do not wait on each other's stacks; an event
    // recorded just as recording is switched is kept or not, either way.
    let backtrace = BACKTRACES.load(Ordering::Relaxed).then(|| Arc::new(Backtrace::force_capture()));
    let event = MemoryEvent { time, kind, address, size, stream, resource, thread, backtrace };
    let mut ring = ring();
    if !RECORDING.load(Ordering::Relaxed) {
        return;
    }
    if ring.events.len() >= ring.options.capacity {
        ring.events.pop_front();
        ring.dropped += 1;
    }
    ring.events.push_back(event);
}

/// This thread's number: 1 for the first thread that recorded, and so on.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.try_with(|number| *number).unwrap_or(0)
}

/// Held by the tests (and examples) that record, which share the one process-wide recording.
#[doc(hidden)]
pub fn tests_serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a process of its own: other tests' allocations would be recorded too.
    #[test]
    fn a_full_ring_drops_the_oldest_and_counts_them_and_stopping_keeps_the_rest() {
        cuda_sim::testing::in_simulated_machine(
            "history::tests::a_full_ring_drops_the_oldest_and_counts_them_and_stopping_keeps_the_rest",
            &[],
            a_full_ring,
        );
    }

    fn a_full_ring() {
        let _serial = tests_serial();
        start_recording(HistoryOptions::default().capacity(3));
        for size in 1..=5 {
            record(MemoryEventKind::Allocate, 0x1000 * size as u64, size, None, ResourceId(7));
        }
        stop_recording();
        record(MemoryEventKind::Allocate, 0, 99, None, ResourceId(7));
        let record = history();
        assert_eq!(record.events.iter().map(|e| e.size).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!((record.dropped, record.recording), (2, false));
        assert!(record.events.windows(2).all(|pair| pair[0].time <= pair[1].time));
        assert!(record.events.iter().all(|e| e.thread > 0 && e.backtrace.is_none()));
    }

    /// In a process of its own, as every test that records: other tests' frees would launch
    /// completion callbacks on their streams meanwhile.
    #[test]
    fn backtraces_are_captured_when_asked() {
        cuda_sim::testing::in_simulated_machine(
            "history::tests::backtraces_are_captured_when_asked",
            &[],
            backtraces_captured,
        );
    }

    fn backtraces_captured() {
        let _serial = tests_serial();
        start_recording(HistoryOptions::default().backtraces(true));
        record(MemoryEventKind::OutOfMemory, 0, 1 << 40, None, ResourceId(1));
        stop_recording();
        let record = history();
        let ours = record.events.iter().find(|e| e.resource == ResourceId(1)).expect("recorded");
        let backtrace = ours.backtrace.as_ref().expect("captured");
        assert!(backtrace.to_string().contains("backtraces_captured"), "{backtrace}");
    }

    #[test]
    fn kinds_have_names_that_name_them_back() {
        for kind in MemoryEventKind::ALL {
            assert_eq!(MemoryEventKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(MemoryEventKind::from_name("alloc"), None);
    }
}
