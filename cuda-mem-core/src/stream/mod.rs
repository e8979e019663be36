//! Streams: created ones (destroyed when the last handle goes) and the default streams.
//!
//! - here: [`Stream`], its options, its lifetime and the questions it answers;
//! - [`capture`]: what this crate knows of a stream's capture ([`CaptureMode`], [`CaptureState`])
//!   and what a capture keeps alive for its graphs;
//! - [`ordering`]: how streams order work after each other's with events
//!   ([`Stream::wait`], [`Stream::record_event`], [`Event::record`](crate::Event::record)).

mod capture;
mod ordering;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUstream, CUstream_flags, CUstreamCaptureStatus};

use capture::CaptureWord;
pub(crate) use capture::GraphResources;
pub use capture::{CaptureMode, CaptureState};

use crate::device::Device;
use crate::driver::driver;
use crate::drop_errors::on_drop;
use crate::error::Result;
use crate::ffi;

/// `CU_STREAM_LEGACY`: the legacy default stream, whatever the default-stream mode.
pub(crate) const LEGACY: CUstream = std::ptr::without_provenance_mut(0x1);
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const PER_THREAD: CUstream = std::ptr::without_provenance_mut(0x2);

/// How to create a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamOptions {
    /// Whether the stream does not synchronize with the legacy default stream.
    pub non_blocking: bool,
    /// Its priority (lower is higher priority); the driver clamps it to the device's range.
    pub priority: Option<i32>,
}

impl StreamOptions {
    /// Options for a non-blocking stream.
    pub fn non_blocking(mut self) -> Self {
        self.non_blocking = true;
        self
    }

    /// Options with this priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// Made by [`Stream::new`]; destroyed when the last clone goes.
    Owned,
    /// A default stream, or one the application owns.
    Borrowed,
}

#[derive(Debug)]
struct Inner {
    handle: CUstream,
    device: Device,
    ownership: Ownership,
    /// For a per-thread default stream: the thread whose stream it is (the same handle names
    /// another stream on every other thread).
    thread: Option<std::thread::ThreadId>,
    /// For a borrowed stream: what keeps it alive while this value lives (another library's
    /// handle to it, such as a cudarc `Arc<CudaStream>`), dropped with the last clone.
    _owner: Option<StreamOwner>,
    /// What this crate knows of the stream's capture ([`CaptureWord`]): read without a lock by
    /// every pool allocation.
    capture: CaptureWord,
    /// While a capture begun through [`Stream::begin_capture`] is under way: what its graph
    /// keeps alive.
    capture_resources: Mutex<Option<Arc<GraphResources>>>,
    /// Whether the handle went to code that may capture the stream through an API of its own
    /// ([`Stream::shared_handle`]): its capture is then never known without the driver.
    handle_shared: AtomicBool,
}

impl Inner {
    fn new(
        handle: CUstream,
        device: Device,
        ownership: Ownership,
        thread: Option<std::thread::ThreadId>,
        owner: Option<StreamOwner>,
    ) -> Inner {
        let mut inner = Inner {
            handle,
            device,
            ownership,
            thread,
            _owner: owner,
            capture: CaptureWord::new(CaptureState::Unknown),
            capture_resources: Mutex::new(None),
            handle_shared: AtomicBool::new(false),
        };
        inner.capture = CaptureWord::new(inner.resting_state());
        inner
    }

    /// Whether this crate can know the stream's capture when none of its own is under way: for
    /// a stream it created whose handle it never shared (nothing else can begin a capture on it
    /// without `unsafe` FFI, see [`Stream::handle`]) and for the legacy default stream (which
    /// cannot capture); not for the others.
    fn capture_knowable(&self) -> bool {
        (self.ownership == Ownership::Owned && !self.handle_shared.load(Ordering::Acquire)) || self.handle == LEGACY
    }

    /// The state when no capture of this crate's is under way.
    fn resting_state(&self) -> CaptureState {
        if self.capture_knowable() { CaptureState::NotCapturing } else { CaptureState::Unknown }
    }
}

/// What keeps a borrowed stream alive; only held, never looked into.
pub(crate) struct StreamOwner {
    _keep: Arc<dyn std::any::Any + Send + Sync>,
}

impl StreamOwner {
    /// Holds `keep` for a borrowed stream.
    #[cfg_attr(not(feature = "cudarc"), expect(dead_code, reason = "only cudarc's streams have an owner to hold"))]
    pub(crate) fn new(keep: Arc<dyn std::any::Any + Send + Sync>) -> Self {
        StreamOwner { _keep: keep }
    }
}

impl std::fmt::Debug for StreamOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StreamOwner(..)")
    }
}

// SAFETY: the handle is an opaque token that only the driver interprets (Rust never dereferences
// it), and the driver API lets any thread use a stream handle: its stream functions are
// thread-safe. What a per-thread default stream's handle means depends on the calling thread;
// `thread` records whose it is, and every use through `Stream` accounts for that. An owned
// stream is destroyed only in `Drop`, once, when the last `Stream` sharing this `Inner` is gone,
// so no thread can use the handle after it is destroyed through this type.
unsafe impl Send for Inner {}
// SAFETY: as for `Send`: `&Inner` only reads the handle and passes it to thread-safe driver
// functions; the only state mutated after construction, the capture slot, is behind a mutex.
unsafe impl Sync for Inner {}

/// The streams this crate created and that live, by handle: a wrapper of one of their handles
/// ([`Stream::from_raw`]) can begin or join a capture of it that the creator's value would not
/// see, so making one shares the handle ([`Stream::shared_handle`]).
static CREATED: Mutex<BTreeMap<usize, Weak<Inner>>> = Mutex::new(BTreeMap::new());

fn created() -> MutexGuard<'static, BTreeMap<usize, Weak<Inner>>> {
    CREATED.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.ownership != Ownership::Owned {
            return;
        }
        {
            // Gone from the created streams before the handle can be reused.
            let mut created = created();
            if created.get(&(self.handle as usize)).is_some_and(|weak| std::ptr::eq(weak.as_ptr(), self)) {
                created.remove(&(self.handle as usize));
            }
        }
        // A created stream carries its context: destroying it needs none current, so a failure to
        // bind one is no reason to leave the stream behind.
        let _ = crate::context::bind(self.device);
        // SAFETY: the handle came from cuStreamCreate and is destroyed once, here; work already
        // enqueued still completes, as the driver documents.
        on_drop("Stream", || Ok(unsafe { cu_call!(driver()?, cuStreamDestroy_v2(self.handle)) }?));
    }
}

impl Device {
    /// The device's legacy default stream.
    pub fn default_stream(&self) -> Stream {
        Stream::legacy_default(*self)
    }
}

/// A stream of a device. Clones share it; a created stream is destroyed when the last clone is
/// dropped.
///
/// # Per-thread default streams
/// [`Stream::per_thread_default`] is the stream of the thread that calls it. The driver's handle
/// for it (`CU_STREAM_PER_THREAD`) names the *calling* thread's stream, so, as in C, work enqueued
/// through the value from another thread (fills, copies, allocation, [`wait`](Stream::wait),
/// [`record_event`](Stream::record_event)) goes to that other thread's per-thread stream, and
/// buffers record the stream it went to: their host access and their free wait for the right
/// work. [`synchronize`](Stream::synchronize) from another thread than its own waits for the
/// whole device, since its own thread's stream cannot be named from there.
#[derive(Debug, Clone)]
pub struct Stream {
    inner: Arc<Inner>,
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

/// What tells one stream from another (what [`Stream`]'s `PartialEq` compares), kept without
/// keeping the stream alive: the handle, the device and, for a per-thread default stream, the
/// thread. Once the stream is destroyed, a new one may get its handle, so a key outliving its
/// stream may name another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamKey {
    handle: usize,
    device: Device,
    thread: Option<std::thread::ThreadId>,
}

impl Stream {
    /// This stream's [`StreamKey`].
    #[inline]
    pub(crate) fn key(&self) -> StreamKey {
        StreamKey { handle: self.inner.handle as usize, device: self.inner.device, thread: self.inner.thread }
    }
}

impl Eq for Stream {}

impl Stream {
    /// Creates a stream on `device`.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn new(device: Device, options: StreamOptions) -> Result<Stream> {
        crate::context::bind(device)?;
        let d = driver()?;
        let flags = if options.non_blocking { CUstream_flags::CU_STREAM_NON_BLOCKING.0 } else { 0 };
        let mut handle: CUstream = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the device's context is current.
        unsafe { cu_call!(d, cuStreamCreateWithPriority(&mut handle, flags, options.priority.unwrap_or(0))) }?;
        let inner = Arc::new(Inner::new(handle, device, Ownership::Owned, None, None));
        created().insert(handle as usize, Arc::downgrade(&inner));
        Ok(Stream { inner })
    }

    /// The legacy default stream of `device` (`CU_STREAM_LEGACY`).
    pub fn legacy_default(device: Device) -> Stream {
        Stream::borrowed(LEGACY, device)
    }

    /// The calling thread's per-thread default stream on `device` (`CU_STREAM_PER_THREAD`).
    /// Used from another thread, see [the type's notes](Stream#per-thread-default-streams).
    pub fn per_thread_default(device: Device) -> Stream {
        Stream::borrowed(PER_THREAD, device)
    }

    /// Wraps a stream the application owns; it is not destroyed by this crate.
    ///
    /// The null handle means the legacy or the per-thread default stream depending on how the
    /// driver was opened; it is treated like `CU_STREAM_PER_THREAD`, as the calling thread's
    /// (the cautious reading: it makes uses from other threads wait for the whole device).
    ///
    /// A handle of a stream this crate created is shared by this
    /// ([`shared_handle`](Stream::shared_handle)): a capture the wrapper begins or joins is then
    /// one the creating value asks the driver about.
    ///
    /// # Safety
    /// `handle` is a valid stream of `device`'s primary context (or a special default-stream
    /// handle) and outlives every use through the returned value.
    pub unsafe fn from_raw(handle: CUstream, device: Device) -> Stream {
        let creator = created().get(&(handle as usize)).and_then(Weak::upgrade);
        if let Some(creator) = creator {
            Stream { inner: creator }.shared_handle();
        }
        Stream::borrowed(handle, device)
    }

    /// A stream this value does not destroy; the calling thread's, for a handle whose meaning
    /// depends on the thread.
    fn borrowed(handle: CUstream, device: Device) -> Stream {
        Stream::borrowed_from(handle, device, None)
    }

    /// A borrowed stream that holds `owner`, which keeps it alive, until the last clone goes.
    pub(crate) fn borrowed_from(handle: CUstream, device: Device, owner: Option<StreamOwner>) -> Stream {
        let thread = (handle == PER_THREAD || handle.is_null()).then(|| std::thread::current().id());
        Stream { inner: Arc::new(Inner::new(handle, device, Ownership::Borrowed, thread, owner)) }
    }

    /// The raw handle.
    ///
    /// # Capture
    /// This crate follows the capture of a stream it created without asking the driver (see
    /// [`capture_state`](Stream::capture_state)): pool allocations on it ask the driver only
    /// when the state is unknown. Code that takes this handle must not begin a capture on the
    /// stream with it (`cuStreamBeginCapture` through FFI), nor make the stream wait with it for
    /// an event recorded in a capture (`cuStreamWaitEvent`, which joins that capture): the state
    /// would then say [`NotCapturing`](CaptureState::NotCapturing) while the stream captures,
    /// and a pool would allocate outside the graph, memory that is not there once the capture
    /// ends. Hand such code [`shared_handle`](Stream::shared_handle) instead, or begin the
    /// capture with [`begin_capture`](Stream::begin_capture) and make the stream wait with
    /// [`wait`](Stream::wait).
    #[inline]
    pub fn handle(&self) -> CUstream {
        self.inner.handle
    }

    /// The raw handle, for code that may begin a capture on the stream or make it wait for
    /// events this crate did not record (another library, FFI): from this call on, this crate
    /// no longer claims to know the stream's capture ([`CaptureState::Unknown`] outside its own
    /// captures), and every pool allocation on the stream asks the driver
    /// (`cuStreamIsCapturing`), as for a stream wrapped from a raw handle.
    /// `Stream::to_cudarc` (feature `cudarc`) shares the handle this way.
    pub fn shared_handle(&self) -> CUstream {
        self.inner.handle_shared.store(true, Ordering::Release);
        self.inner.capture.forget();
        self.inner.handle
    }

    /// The device.
    #[inline]
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Whether this value owns the stream (destroys it on the last drop).
    #[inline]
    pub fn is_owned(&self) -> bool {
        self.inner.ownership == Ownership::Owned
    }

    /// Binds the device's primary context when the stream is a default stream (whose meaning
    /// depends on the current context); created streams carry their context, so calls on them
    /// need none current — which is what lets a buffer be freed from any thread cheaply.
    #[inline]
    pub(crate) fn bind_if_default(&self) -> Result<()> {
        if self.is_owned() { Ok(()) } else { crate::context::bind(self.device()) }
    }

    /// Whether this is a per-thread default stream of another thread than the calling one: its
    /// handle names the calling thread's stream here, not the one the work went to.
    #[inline]
    pub(crate) fn is_foreign_per_thread(&self) -> bool {
        self.inner.thread.is_some_and(|t| t != std::thread::current().id())
    }

    /// The stream that work enqueued through this value from the calling thread goes to: this
    /// one, or, for another thread's per-thread default stream, the calling thread's (what the
    /// handle names here). Buffers record this one, so that what waits for their uses waits for
    /// the stream the work is really on.
    #[inline]
    pub(crate) fn on_calling_thread(&self) -> Cow<'_, Stream> {
        if self.is_foreign_per_thread() {
            Cow::Owned(Stream::borrowed(self.handle(), self.device()))
        } else {
            Cow::Borrowed(self)
        }
    }

    /// Waits for the stream's work, or, when that fails (or the stream cannot be named from
    /// here), for all of its device's work: a wait that only gives up when the device cannot be
    /// synchronized either. For callers that must know the work is done before they free or
    /// lend memory it uses.
    ///
    /// # Errors
    /// The device's synchronization error, when both fail.
    pub(crate) fn synchronize_or_device(&self) -> Result<()> {
        self.synchronize().or_else(|_| self.device().synchronize())
    }

    /// Waits until all work enqueued so far has completed. For a per-thread default stream used
    /// from another thread, that is all the device's work (its handle cannot name that thread's
    /// stream from here).
    ///
    /// # Errors
    /// If a driver call fails (for example an earlier asynchronous error).
    #[doc(alias = "sync")]
    pub fn synchronize(&self) -> Result<()> {
        if self.is_foreign_per_thread() {
            return self.device().synchronize();
        }
        crate::context::bind(self.device())?;
        let d = driver()?;
        // SAFETY: a valid stream handle; the device's context is current.
        unsafe { cu_call!(d, cuStreamSynchronize(self.handle())) }?;
        Ok(())
    }

    /// Whether all work enqueued so far has completed (`cuStreamQuery`). For another thread's
    /// per-thread default stream, the calling thread's is asked (see
    /// [the type's notes](Stream#per-thread-default-streams)).
    ///
    /// # Errors
    /// If the driver reports an error other than "not ready".
    pub fn is_idle(&self) -> Result<bool> {
        crate::context::bind(self.device())?;
        let d = driver()?;
        // SAFETY: a valid stream handle; the device's context is current.
        match unsafe { cu_call!(d, cuStreamQuery(self.handle())) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(cuda_mem_sys::types::CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether the stream is capturing a graph (an active or invalidated capture both count),
    /// as the driver says (`cuStreamIsCapturing`); [`capture_state`](Stream::capture_state) says
    /// what this crate knows without asking it.
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn is_capturing(&self) -> Result<bool> {
        self.bind_if_default()?;
        self.is_capturing_bound()
    }

    /// [`is_capturing`](Stream::is_capturing) once the caller has bound what the handle needs
    /// ([`bind_if_default`](Stream::bind_if_default)): a created stream carries its context, so
    /// the allocation path makes no context call for it.
    #[inline]
    pub(crate) fn is_capturing_bound(&self) -> Result<bool> {
        // SAFETY: a valid stream handle, bound as it needs (the caller's promise).
        let status = unsafe { ffi::stream_capture_status(driver()?, self.handle()) }?;
        Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Whether a resource may not allocate on the stream because it captures (a pool would
    /// allocate outside the graph; see [`Error::CapturingStream`](crate::Error::CapturingStream)),
    /// nor a copy with options run on it (`copy_batch` and the `_with` copies), asking the driver
    /// (`cuStreamIsCapturing`) only where this crate does not know
    /// ([`capture_state`](Stream::capture_state)): a capture of this crate's is refused at once,
    /// a stream known not to capture allocates at once. The legacy default stream, which cannot
    /// capture, is asked all the same: the driver refuses using it while a blocking stream
    /// captures (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`), and the query is refused without harm
    /// where the allocation would invalidate that capture. The caller has bound what the handle
    /// needs ([`bind_if_default`](Stream::bind_if_default)).
    #[inline(always)]
    pub(crate) fn refuses_allocation(&self) -> Result<bool> {
        let seen = self.inner.capture.load();
        // Inlined into every allocation: the common case, known not to capture, in two compares.
        if CaptureWord::is_not_capturing(seen) && self.inner.handle != LEGACY {
            return Ok(false);
        }
        self.refuses_allocation_otherwise(seen)
    }

    /// [`refuses_allocation`](Stream::refuses_allocation) of every other case (capturing,
    /// unknown, the legacy stream), with the capture word as it was `seen` there.
    #[inline(never)]
    fn refuses_allocation_otherwise(&self, seen: u64) -> Result<bool> {
        match CaptureWord::decode(seen) {
            CaptureState::Capturing(_) => Ok(true),
            CaptureState::NotCapturing | CaptureState::Unknown => {
                let capturing = self.is_capturing_bound()?;
                if !capturing && self.inner.capture_knowable() {
                    // Known again until the next wait that may join a capture: nothing else
                    // begins one on this stream (see `handle`).
                    self.inner.capture.confirm_not_capturing(seen);
                }
                Ok(capturing)
            }
        }
    }

    /// What this crate knows of the stream's capture, without asking the driver:
    /// [`CaptureState::Capturing`] between [`begin_capture`](Stream::begin_capture) and the end
    /// of the [`Capture`](crate::Capture) it returned, [`CaptureState::NotCapturing`] for a
    /// stream this crate created otherwise (and for the legacy default stream, which cannot
    /// capture), [`CaptureState::Unknown`] where it cannot be known: a stream wrapped from a raw
    /// handle ([`Stream::from_raw`], cudarc's, the per-thread default stream) or whose handle
    /// was shared ([`Stream::shared_handle`], `Stream::to_cudarc`), whose capture other code
    /// may begin; a stream of this crate's that waited for an event that may have been recorded
    /// in a capture (recorded in a capturing stream or in one whose capture is unknown, or
    /// opened from another process, whose recordings this crate does not see), which joins
    /// that capture, until the driver next says it does not capture (pool allocations ask it);
    /// and a stream whose capture of this crate's ended with an error other than its
    /// invalidation. The state is shared by the stream's clones.
    ///
    /// It is stale only where code outside this crate captures a stream it created through its
    /// raw [`handle`](Stream::handle) (see there): that is outside the safe API.
    pub fn capture_state(&self) -> CaptureState {
        CaptureWord::decode(self.inner.capture.load())
    }

    fn capture_resources(&self) -> MutexGuard<'_, Option<Arc<GraphResources>>> {
        self.inner.capture_resources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the capture state unknown just before a capture begins: until
    /// [`capture_began`](Stream::capture_began) says so, work recorded or allocations made from
    /// other threads meanwhile ask the driver rather than count the stream as not capturing.
    /// Returns what to give [`capture_not_begun`](Stream::capture_not_begun) if the driver
    /// refuses the capture.
    pub(crate) fn capture_beginning(&self) -> Option<u64> {
        self.inner.capture.forget()
    }

    /// The driver refused the capture [`capture_beginning`](Stream::capture_beginning) prepared
    /// for: the state from before stands again, unless something changed it meanwhile.
    pub(crate) fn capture_not_begun(&self, replaced: Option<u64>) {
        if let Some(replaced) = replaced {
            self.inner.capture.put_back(replaced);
        }
    }

    /// Notes a capture begun through this crate, and what its graph will keep alive.
    pub(crate) fn capture_began(&self, mode: CaptureMode, resources: Arc<GraphResources>) {
        let mut held = self.capture_resources();
        *held = Some(resources);
        self.inner.capture.set(CaptureState::Capturing(mode));
    }

    /// Notes that the capture begun through this crate ended (`known`: the driver confirmed it;
    /// otherwise the state is unknown).
    pub(crate) fn capture_ended(&self, known: bool) {
        let mut held = self.capture_resources();
        *held = None;
        self.inner.capture.set(if known { self.inner.resting_state() } else { CaptureState::Unknown });
    }

    /// Hands `item` to the capture under way on this stream, when it was begun through this
    /// crate ([`begin_capture`](Stream::begin_capture)): the item then lives as long as the
    /// graph the capture makes and every executable graph instantiated from it, and is dropped
    /// only once the work they enqueued before (the stream's work from before the capture, each
    /// launch) is done. This is how memory a captured operation uses is kept for as long as a
    /// graph may still use it: a resource whose release cannot be captured (unmapping virtual
    /// memory, a synchronous free) hands the release over instead of doing it.
    ///
    /// # Errors
    /// The item back, when no capture of this crate's is under way on the stream (not
    /// capturing, or captured by other code, or joined to another stream's capture: see
    /// [`capture_state`](Stream::capture_state)).
    pub fn keep_alive_in_capture<T: std::any::Any + Send + Sync>(&self, item: T) -> std::result::Result<(), T> {
        match &*self.capture_resources() {
            Some(resources) => {
                resources.keep(Box::new(item));
                Ok(())
            }
            None => Err(item),
        }
    }
}
