//! `Buffer`: one allocation, owned, freed once on the stream it records; and `ScopedBuffer`,
//! the same with its resource and stream borrowed instead of shared.
//!
//! - here: the types, taking and giving up ownership, the accessors, copies, fills, host
//!   slices and freeing;
//! - [`allocate`]: allocating them ([`MemoryResourceExt`], and the constructors the resources'
//!   own `allocate` calls);
//! - [`host`]: host slices of their bytes (and whether managed memory may be lent);
//! - [`export`]: a buffer's export data for another process, kept with the buffer.

mod allocate;
mod export;
mod host;

pub use allocate::MemoryResourceExt;
pub(crate) use host::is_managed;

use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::device::Device;
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::drop_errors::on_drop;
use crate::error::{Error, Result};
use crate::event::{Event, EventOptions};
use crate::ffi::{self, Memset};
use crate::memory_resource::MemoryResource;
use crate::stream::{CaptureState, Stream};

/// A value to fill a buffer with, repeated: 1, 2 or 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillPattern {
    /// One byte.
    U8(u8),
    /// Two bytes, in native byte order; the buffer's size must be a multiple of 2.
    U16(u16),
    /// Four bytes, in native byte order; the buffer's size must be a multiple of 4.
    U32(u32),
}

impl FillPattern {
    fn width(self) -> usize {
        match self {
            FillPattern::U8(_) => 1,
            FillPattern::U16(_) => 2,
            FillPattern::U32(_) => 4,
        }
    }
}

/// Who frees the memory.
#[derive(Debug)]
enum Owner<'a> {
    /// A resource, through `deallocate_raw`, on the recorded stream.
    Resource(Arc<dyn MemoryResource>),
    /// A borrowed resource, the same way: the borrow, not a count, keeps it alive.
    Borrowed(&'a dyn MemoryResource),
    /// Nobody: a view of memory someone else owns, optionally keeping that owner alive.
    View(ForeignMemory),
}

/// What a buffer over memory owned elsewhere knows of it ([`Buffer::from_raw`]): the device it
/// belongs to, whether devices and the host can reach it, and what to keep alive while the
/// buffer lives. Start from the kind of memory, then adjust:
///
/// ```
/// # use std::sync::Arc;
/// # use cuda_mem_core::{Device, ForeignMemory};
/// # fn f(device: Device, owner: Arc<Vec<u8>>) {
/// let on_device = ForeignMemory::device_memory(device);
/// let pinned = ForeignMemory::pinned().keep_alive(owner);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct ForeignMemory {
    device: Option<Device>,
    device_accessible: bool,
    host_accessible: bool,
    /// Dropped with the view, once the work enqueued through the view is done (its drop may
    /// free the memory: a DLPack producer's deleter, say).
    keep_alive: Option<Arc<dyn Any + Send + Sync>>,
}

impl ForeignMemory {
    /// A view that knows nothing and keeps nothing alive: what an owner is replaced by when
    /// ownership leaves a buffer.
    const NOTHING: ForeignMemory =
        ForeignMemory { device: None, device_accessible: false, host_accessible: false, keep_alive: None };

    /// Memory of `device` (`cuMemAlloc`, a pool's, another library's device allocation):
    /// devices reach it, the host does not.
    pub fn device_memory(device: Device) -> ForeignMemory {
        ForeignMemory { device: Some(device), device_accessible: true, ..ForeignMemory::default() }
    }

    /// Page-locked or managed host memory: the host and devices reach it, and it belongs to no
    /// one device.
    pub fn pinned() -> ForeignMemory {
        ForeignMemory { device_accessible: true, host_accessible: true, ..ForeignMemory::default() }
    }

    /// Memory only the host reaches (pageable memory).
    pub fn host() -> ForeignMemory {
        ForeignMemory { host_accessible: true, ..ForeignMemory::default() }
    }

    /// With the device the memory belongs to (`None`: none, host memory).
    pub fn device(mut self, device: Option<Device>) -> ForeignMemory {
        self.device = device;
        self
    }

    /// With devices reaching it or not.
    pub fn device_accessible(mut self, accessible: bool) -> ForeignMemory {
        self.device_accessible = accessible;
        self
    }

    /// With the host reaching it or not.
    pub fn host_accessible(mut self, accessible: bool) -> ForeignMemory {
        self.host_accessible = accessible;
        self
    }

    /// With an owner held until the buffer is dropped and the work enqueued through it is
    /// done, so that dropping the owner then may free the memory.
    pub fn keep_alive(mut self, owner: Arc<dyn Any + Send + Sync>) -> ForeignMemory {
        self.keep_alive = Some(owner);
        self
    }
}

impl std::fmt::Debug for ForeignMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignMemory")
            .field("device", &self.device)
            .field("device_accessible", &self.device_accessible)
            .field("host_accessible", &self.host_accessible)
            .field("keep_alive", &self.keep_alive.is_some())
            .finish()
    }
}

/// One allocation: a pointer, a size, and who frees it.
///
/// An owning buffer keeps its resource alive and frees its memory exactly once: when dropped, on
/// the stream it records (the allocation stream, or one given to
/// [`set_deallocation_stream`](ScopedBuffer::set_deallocation_stream)), or through
/// [`close`](ScopedBuffer::close), which consumes it. A view ([`Buffer::from_raw`]) frees nothing.
///
/// Stream-ordered operations (`copy_*`, `fill`) take the stream to run on; writes need `&mut`,
/// so while [`host_slice`](ScopedBuffer::host_slice) lends the bytes to the host no new device
/// write can be enqueued through the buffer, and every stream the buffer was used on is
/// synchronized before the bytes are lent. The stream recorded is the one the work went to:
/// another thread's per-thread default stream, used from here, means this thread's (see
/// [`Stream`'s notes](Stream#per-thread-default-streams)). Memory that other processes may write
/// (a pool's shared with them) is never lent as a slice by the safe API:
/// [`copy_to_slice`](ScopedBuffer::copy_to_slice) and [`to_vec`](ScopedBuffer::to_vec) read it.
///
/// A `Buffer` holds a share (an `Arc`) of its resource and of its stream, so it can outlive the
/// scope that made it, move to another thread and be kept anywhere. Where a buffer lives inside
/// one scope, a [`ScopedBuffer`] borrows them instead and costs no reference counting.
///
/// # What a buffer does
///
/// `Buffer` is the `'static` [`ScopedBuffer`]: every method is written once, on
/// `ScopedBuffer`, and documented there. By task:
///
/// | to | call |
/// |---|---|
/// | allocate | `resource.allocate(size, &stream)`, [`MemoryResourceExt::allocate_zeroed`], [`MemoryResourceExt::allocate_from_slice`], [`Buffer::allocate`] |
/// | learn about it | [`ptr`](ScopedBuffer::ptr), [`size`](ScopedBuffer::size), [`device`](ScopedBuffer::device), [`memory_resource`](ScopedBuffer::memory_resource), [`is_host_accessible`](ScopedBuffer::is_host_accessible) |
/// | copy Rust data in and out | [`copy_from_slice`](ScopedBuffer::copy_from_slice), [`copy_to_slice`](ScopedBuffer::copy_to_slice), [`to_vec`](ScopedBuffer::to_vec) |
/// | copy between buffers | [`copy_from`](ScopedBuffer::copy_from), [`copy_to`](ScopedBuffer::copy_to), [`copy_to_new`](ScopedBuffer::copy_to_new), [`copy_to_with`](ScopedBuffer::copy_to_with), [`copy_batch`](crate::copy_batch), [`copy_batch_within`](crate::copy_batch_within) |
/// | fill | [`fill`](ScopedBuffer::fill) |
/// | see it as `[T]` | [`view`](ScopedBuffer::view), [`view_mut`](ScopedBuffer::view_mut) |
/// | read it on the host | [`host_slice`](ScopedBuffer::host_slice), [`host_slice_mut`](ScopedBuffer::host_slice_mut) |
/// | advise, prefetch, discard managed memory | [`managed`](ScopedBuffer::managed), [`managed_mut`](ScopedBuffer::managed_mut) |
/// | free it | drop it, or [`close`](ScopedBuffer::close) to see the error; [`set_deallocation_stream`](ScopedBuffer::set_deallocation_stream) |
/// | hand it on | [`into_raw`](Buffer::into_raw), [`leak`](Buffer::leak); DLPack's `into_dlpack` (feature `dlpack`) |
/// | wrap memory someone else owns | [`Buffer::from_raw`] with [`ForeignMemory`], [`Buffer::from_raw_owned`] |
pub type Buffer = ScopedBuffer<'static>;

/// A buffer whose resource and allocation stream may be borrowed for `'a` instead of shared.
///
/// Made by [`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped) or
/// [`ScopedBuffer::allocate_scoped`]: the borrow checker, not a reference count, then keeps the
/// resource and the stream alive until the buffer is freed, so allocating and freeing one
/// touches no shared counter (a [`Buffer`] takes and gives back a share of both, four atomic
/// operations per allocation). Everything else is as for [`Buffer`], which is the `'static`
/// kind: the methods, freeing once on drop or [`close`](ScopedBuffer::close), the stream
/// ordering. A stream given later to
/// [`set_deallocation_stream`](ScopedBuffer::set_deallocation_stream) is shared, not borrowed.
///
/// The resource cannot be dropped while a scoped buffer of it lives:
///
/// ```compile_fail,E0505
/// # use cuda_mem_core::{Device, DeviceMemoryResource, MemoryResourceExt, Stream};
/// # fn f(device: Device, stream: &Stream) -> cuda_mem_core::Result<()> {
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let buffer = pool.allocate_scoped(256, stream)?;
/// drop(pool); // error: `pool` is borrowed by `buffer`
/// drop(buffer);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ScopedBuffer<'a> {
    ptr: DevicePtr,
    size: usize,
    owner: Owner<'a>,
    /// The stream the memory is freed on (owning buffers) and whose work precedes host access.
    stream: Option<StreamRef<'a>>,
    /// Other streams that have used the buffer since the last host access.
    used_on: Mutex<Vec<Stream>>,
    /// The driver's export data for the allocation, made on the first export and valid while
    /// the buffer lives (see [`crate::MemoryPool::export_buffer`]). Boxed: most buffers are never
    /// exported, and this keeps them 16 bytes larger, not 72.
    export: OnceLock<Box<export::CachedExport>>,
}

/// The recorded stream: borrowed (scoped allocation) or a share of it.
#[derive(Debug)]
enum StreamRef<'a> {
    Borrowed(&'a Stream),
    Shared(Stream),
}

impl<'a> StreamRef<'a> {
    /// The stream that work enqueued through `stream` from the calling thread goes to,
    /// borrowed; or, for another thread's per-thread default stream, a share of the calling
    /// thread's (there is nothing to borrow).
    #[inline(always)]
    fn on_calling_thread(stream: &'a Stream) -> StreamRef<'a> {
        match stream.on_calling_thread() {
            Cow::Borrowed(stream) => StreamRef::Borrowed(stream),
            Cow::Owned(stream) => StreamRef::Shared(stream),
        }
    }
}

impl std::ops::Deref for StreamRef<'_> {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        match self {
            StreamRef::Borrowed(stream) => stream,
            StreamRef::Shared(stream) => stream,
        }
    }
}

impl<'a> ScopedBuffer<'a> {
    /// The buffer of these parts, used on no other stream yet.
    #[inline]
    fn new(ptr: DevicePtr, size: usize, owner: Owner<'a>, stream: Option<StreamRef<'a>>) -> Self {
        ScopedBuffer { ptr, size, owner, stream, used_on: Mutex::default(), export: OnceLock::new() }
    }
}

impl Buffer {
    /// Takes ownership of memory `resource` allocated (or otherwise hands out for it to
    /// release): the buffer calls its `deallocate_raw` on `stream` when dropped, unless `size`
    /// is 0 (an empty buffer releases nothing).
    ///
    /// # Safety
    /// `ptr` and `size` come from one `resource.allocate_raw` call, or name other memory of at
    /// least `size` bytes that one call of `resource.deallocate_raw` with them releases (such
    /// as one holder's share of an allocation imported from another process, which the
    /// imported pool's resource gives back); either way the memory is released exactly once,
    /// through this buffer, and not freed by anything else. Memory that must be released
    /// cannot be taken with a `size` of 0, which would never release it. A null `ptr` with a
    /// `size` of 0 is taken as an empty buffer of `resource` (the parts of one from
    /// [`into_raw`](Buffer::into_raw)): dropping it tells `resource`
    /// ([`note_empty_deallocation`](MemoryResource::note_empty_deallocation)).
    pub unsafe fn from_raw_owned(
        ptr: DevicePtr,
        size: usize,
        resource: Arc<dyn MemoryResource>,
        stream: &Stream,
    ) -> Buffer {
        Buffer::new(ptr, size, Owner::Resource(resource), Some(StreamRef::Shared(stream.clone())))
    }

    /// A view of memory someone else owns; dropping it frees nothing. `memory` says where it
    /// lives and who reaches it; its [`keep_alive`](ForeignMemory::keep_alive), if given, is
    /// held until the view is dropped, and then until the work enqueued through the view is done
    /// (the view's drop waits for it first), so that dropping it may free the memory.
    ///
    /// # Safety
    /// `size` bytes at `ptr` stay valid while the view lives and, without `keep_alive`, until
    /// the work enqueued through it is done (the owner orders its free after that work), with
    /// the accessibility claimed, and the owner does not free or write them behind the view's
    /// back while host slices of it are borrowed.
    #[doc(alias = "from_handle")]
    pub unsafe fn from_raw(ptr: DevicePtr, size: usize, memory: ForeignMemory) -> Buffer {
        Buffer::new(ptr, size, Owner::View(memory), None)
    }
}

/// The parts of an owning [`Buffer`] whose ownership left it ([`Buffer::into_raw`]): the memory,
/// the resource that frees it and the stream its free must follow. Nothing frees the memory
/// until they are given back to [`Buffer::from_raw_owned`] (or freed by hand with
/// `resource.deallocate_raw(ptr, size, &stream)`); dropping them leaks it.
#[derive(Debug)]
pub struct RawBuffer {
    /// The address.
    pub ptr: DevicePtr,
    /// The size in bytes.
    pub size: usize,
    /// The resource that allocated it, which must free it.
    pub resource: Arc<dyn MemoryResource>,
    /// The stream after whose work (enqueued so far) the memory may be freed: work that used it
    /// on other streams is already ordered before this stream's next work.
    pub stream: Stream,
}

impl Buffer {
    /// Gives up ownership without freeing: the pointer, size, resource and stream, for code that
    /// takes raw memory (another library, FFI), and back through [`Buffer::from_raw_owned`]
    /// (`from_raw_owned(raw.ptr, raw.size, raw.resource, &raw.stream)` owns it again). Work
    /// enqueued through the buffer on streams other than the returned one is ordered before that
    /// stream's next work (with events, as a free is), so whoever frees on it frees after every
    /// use.
    ///
    /// # Errors
    /// When the buffer owns nothing to hand out ([`Error::NotOwning`] for a view,
    /// [`Error::NoSharedResource`] for a buffer that borrows its resource), or its uses could
    /// not be ordered (a driver error): the [`CloseError`] holds the cause and hands the buffer
    /// back unchanged.
    pub fn into_raw(mut self) -> Result<RawBuffer, CloseError<'static>> {
        let (ptr, size) = (self.ptr, self.size);
        // Taken out while the parts are gathered; put back whenever the buffer is handed back.
        let resource = match std::mem::replace(&mut self.owner, Owner::View(ForeignMemory::NOTHING)) {
            Owner::Resource(resource) => resource,
            owner => {
                let error = match owner {
                    Owner::View(_) => Error::NotOwning { ptr, size },
                    _ => Error::NoSharedResource { ptr, size },
                };
                self.owner = owner;
                return Err(CloseError { buffer: Box::new(self), error });
            }
        };
        let uses = std::mem::take(self.used_on.get_mut().unwrap_or_else(PoisonError::into_inner));
        // An owning buffer always records a stream; without one there is nothing to order.
        let ordered = match &self.stream {
            Some(stream) => order_after_uses(stream, &uses).map(Cow::into_owned),
            None => Err(Error::NotOwning { ptr, size }),
        };
        let stream = match ordered {
            Ok(stream) => stream,
            Err(error) => {
                self.owner = Owner::Resource(resource);
                *self.used_on.get_mut().unwrap_or_else(PoisonError::into_inner) = uses;
                return Err(CloseError { buffer: Box::new(self), error });
            }
        };
        // What is left owns nothing: the drop that follows frees nothing, and (the stream gone)
        // tells the resource nothing of an empty buffer, whose parts now own it.
        self.size = 0;
        self.stream = None;
        Ok(RawBuffer { ptr, size, resource, stream })
    }

    /// Gives up ownership for good and returns the address: the memory is never freed, and the
    /// buffer, with its resource (or, for a view, what it keeps alive), is kept in a process-wide
    /// list until the process exits, so the address stays valid. Work enqueued through the
    /// buffer is not waited for: order what uses the address after it (synchronize, or an
    /// event).
    pub fn leak(self) -> DevicePtr {
        /// Leaked buffers: never dropped (statics are not), and reachable, so leak checkers see
        /// them as kept on purpose.
        static LEAKED: Mutex<Vec<Buffer>> = Mutex::new(Vec::new());
        let ptr = self.ptr;
        LEAKED.lock().unwrap_or_else(PoisonError::into_inner).push(self);
        ptr
    }
}

impl<'a> ScopedBuffer<'a> {
    /// A new buffer of the same size from this buffer's own resource, allocated on `stream`,
    /// with this buffer's bytes copied into it on `stream` (as cuda.core's
    /// `Buffer.copy_to(dst=None)`).
    ///
    /// # Errors
    /// - [`Error::NoSharedResource`] for a buffer that holds no share of its resource (a scoped
    ///   buffer: allocate the destination with `allocate_scoped` and use
    ///   [`copy_to`](ScopedBuffer::copy_to); a view of memory someone else owns).
    /// - The resource's allocation error.
    /// - A driver error.
    pub fn copy_to_new(&self, stream: &Stream) -> Result<Buffer> {
        let Some(resource) = self.resource() else {
            return Err(Error::NoSharedResource { ptr: self.ptr, size: self.size });
        };
        let mut dst = Buffer::allocate(Arc::clone(resource), self.size, stream)?;
        copy(&mut dst, self, stream)?;
        Ok(dst)
    }
}

impl<'a> ScopedBuffer<'a> {
    /// The address.
    #[doc(alias = "handle")]
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The resource that frees it and a share of which it holds: `None` for views, and for
    /// scoped buffers, which borrow theirs ([`memory_resource`](ScopedBuffer::memory_resource)).
    pub fn resource(&self) -> Option<&Arc<dyn MemoryResource>> {
        match &self.owner {
            Owner::Resource(resource) => Some(resource),
            Owner::Borrowed(_) | Owner::View(_) => None,
        }
    }

    /// The resource that frees it, shared or borrowed; `None` for views.
    pub fn memory_resource(&self) -> Option<&dyn MemoryResource> {
        match &self.owner {
            Owner::Resource(resource) => Some(&**resource),
            Owner::Borrowed(resource) => Some(*resource),
            Owner::View(_) => None,
        }
    }

    /// Whether dropping it frees memory.
    pub fn is_owning(&self) -> bool {
        !matches!(self.owner, Owner::View(_))
    }

    /// The device the memory belongs to, if one does.
    #[doc(alias = "device_id")]
    pub fn device(&self) -> Option<Device> {
        match &self.owner {
            Owner::View(view) => view.device,
            _ => self.memory_resource().and_then(|r| r.device()),
        }
    }

    /// Whether devices can access it.
    pub fn is_device_accessible(&self) -> bool {
        match &self.owner {
            Owner::View(view) => view.device_accessible,
            _ => self.memory_resource().is_some_and(|r| r.is_device_accessible()),
        }
    }

    /// Whether the host can access it.
    pub fn is_host_accessible(&self) -> bool {
        match &self.owner {
            Owner::View(view) => view.host_accessible,
            _ => self.memory_resource().is_some_and(|r| r.is_host_accessible()),
        }
    }

    /// The stream the memory will be freed on.
    pub fn deallocation_stream(&self) -> Option<&Stream> {
        self.stream.as_deref()
    }

    /// Frees the memory on `stream` instead of the allocation stream (keeping a share of it).
    /// Nothing is synchronized: order the streams yourself (with an event) if work on the old
    /// stream still uses it.
    pub fn set_deallocation_stream(&mut self, stream: &Stream) {
        if let Some(old) = self.stream.replace(StreamRef::Shared(stream.clone()))
            && *old != *stream
        {
            self.note_use(&old);
        }
    }

    /// Remembers that work on `stream` uses the buffer (host access waits for it).
    pub(crate) fn note_use(&self, stream: &Stream) {
        if self.stream.as_deref() == Some(stream) {
            return;
        }
        let mut used_on = self.used_on.lock().unwrap_or_else(PoisonError::into_inner);
        if !used_on.contains(stream) {
            used_on.push(stream.clone());
        }
    }

    /// Makes `consumer` wait for the work enqueued so far through the buffer (on its recorded
    /// stream and every stream it was used on), and records `consumer` as a use, so that the
    /// free follows the consumer's work too: a DLPack export's stream exchange, and a buffer
    /// handed to cudarc's stream.
    #[cfg(any(feature = "cudarc", feature = "dlpack"))]
    pub(crate) fn order_before(&self, consumer: &Stream) -> Result<()> {
        let mut producers = self.used_on.lock().unwrap_or_else(PoisonError::into_inner).clone();
        producers.extend(self.stream.as_deref().cloned());
        order_after_other_streams(consumer, &producers)?;
        self.note_use(consumer);
        Ok(())
    }

    /// Copies this buffer into `dst` on `stream`.
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] if the sizes differ.
    /// - A driver error otherwise.
    pub fn copy_to(&self, dst: &mut ScopedBuffer<'_>, stream: &Stream) -> Result<()> {
        copy(dst, self, stream)
    }

    /// Copies `src` into this buffer on `stream`.
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] if the sizes differ.
    /// - A driver error otherwise.
    pub fn copy_from(&mut self, src: &ScopedBuffer<'_>, stream: &Stream) -> Result<()> {
        copy(self, src, stream)
    }

    /// Fills the buffer with `pattern` on `stream`.
    ///
    /// # Errors
    /// - [`Error::FillPatternWidth`] if the pattern's width does not divide the size.
    /// - Driver errors.
    pub fn fill(&mut self, pattern: FillPattern, stream: &Stream) -> Result<()> {
        let width = pattern.width();
        if !self.size.is_multiple_of(width) {
            return Err(Error::FillPatternWidth { width, size: self.size });
        }
        if self.size == 0 {
            return Ok(());
        }
        let d = driver()?;
        let stream = stream.on_calling_thread();
        stream.bind_if_default()?;
        let count = self.size / width;
        let memset = match pattern {
            FillPattern::U8(value) => Memset::D8(value, count),
            FillPattern::U16(value) => Memset::D16(value, count),
            FillPattern::U32(value) => Memset::D32(value, count),
        };
        // SAFETY: `ptr` addresses `size` bytes this buffer owns or views, valid until the
        // buffer is freed, which is ordered after this work; allocations are aligned to every
        // width.
        unsafe { ffi::memset_async(d, self.ptr, memset, stream.handle()) }?;
        self.note_use(&stream);
        Ok(())
    }

    /// Waits for every stream the buffer was used on (and its recorded stream): afterwards no
    /// work enqueued through it so far is still running. Crates built on this one call it before
    /// releasing memory that is not freed in stream order. A stream that fails to synchronize is
    /// waited for through its device instead; when that fails too, the error is returned and
    /// every use not yet waited for stays recorded (a later call waits for it again).
    ///
    /// # Errors
    /// A driver error from synchronizing a device.
    pub fn wait_for_uses(&self) -> Result<()> {
        let pending: Vec<Stream> = std::mem::take(&mut *self.used_on.lock().unwrap_or_else(PoisonError::into_inner));
        let waited = pending.iter().chain(self.stream.as_deref()).try_for_each(Stream::synchronize_or_device);
        if waited.is_err() {
            for stream in &pending {
                self.note_use(stream);
            }
        }
        waited
    }

    /// Frees the memory now, on `stream` (or the recorded stream), reporting any error instead
    /// of recording it. A view is just dropped.
    ///
    /// # Errors
    /// When the memory could not be freed (the driver refused, or no order after the buffer's
    /// uses could be established): the [`CloseError`] holds the cause and hands the buffer back,
    /// still owning its memory.
    pub fn close(mut self, stream: Option<&Stream>) -> Result<(), CloseError<'a>> {
        if let Some(stream) = stream {
            self.set_deallocation_stream(stream);
        }
        // On success the buffer has no memory left, so the `Drop` that follows (which still
        // releases the resource and stream shares) frees nothing.
        self.release().map_err(|error| CloseError { buffer: Box::new(self), error })
    }

    /// Frees the memory (owning buffers with memory only) and marks it gone (size 0). On failure
    /// the memory is still the buffer's, with every use still recorded.
    ///
    /// Only the common case is here, inlined into `Drop` and `close`; ordering after other
    /// streams' uses is [`release_after_uses`], out of line.
    #[inline(always)]
    fn release(&mut self) -> Result<()> {
        let resource: &dyn MemoryResource = match &mut self.owner {
            Owner::Resource(resource) => &**resource,
            Owner::Borrowed(resource) => *resource,
            Owner::View(view) => {
                let Some(keep_alive) = view.keep_alive.take() else { return Ok(()) };
                // What keeps the memory alive goes only after the work on it: its drop may
                // free it. When that work cannot be waited for, it is never dropped (leaked),
                // so the memory is never freed under the work.
                let waited = self.wait_for_uses();
                if waited.is_err() {
                    std::mem::forget(keep_alive);
                }
                return waited;
            }
        };
        if self.size == 0 {
            // An empty buffer a resource made (the null pointer: memory that was freed leaves
            // its address) tells it once that it is gone: the stream goes with the notice, so
            // a release after this one tells nothing.
            if self.ptr == 0 && self.stream.take().is_some() {
                resource.note_empty_deallocation();
            }
            return Ok(());
        }
        // Taken now: the history names the resource by it after the borrow ends.
        let resource_id = crate::history::ResourceId::of(resource);
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        // The common case, a buffer used only on the stream it is freed on, which the calling
        // thread can name: its work so far is all the free must follow, in that stream's own
        // order, so nothing is ordered (no event) and the uses are neither taken nor put back.
        // `&mut self`: no other reference can be noting a use, so no lock is needed.
        // (Only a buffer used on other streams can have been used in a capture, so the common
        // case checks one list for emptiness; the rest is out of line.)
        let used_on = self.used_on.get_mut().unwrap_or_else(PoisonError::into_inner);
        if used_on.is_empty() && !stream.is_foreign_per_thread() {
            // SAFETY: as in `release_after_uses`; every use of the memory was enqueued on
            // `stream`, before this.
            unsafe { resource.deallocate_raw(self.ptr, self.size, stream) }?;
        } else if used_on.iter().any(|used| matches!(used.capture_state(), CaptureState::Capturing(_))) {
            free_after_captures(&self.owner, stream, self.ptr, self.size, used_on)?;
        } else {
            release_after_uses(resource, stream, self.ptr, self.size, used_on)?;
        }
        crate::history::record_free(self.ptr, self.size, stream, resource_id);
        self.size = 0;
        Ok(())
    }
}

/// The free of a buffer that work captured into a graph used: handed to each capture (begun
/// through [`Stream::begin_capture`]) it was used in, it is done on the buffer's stream when the
/// last of them lets go of it, after their graphs and the work those enqueued.
#[derive(Debug)]
struct FreeAfterGraphs {
    resource: Arc<dyn MemoryResource>,
    ptr: DevicePtr,
    size: usize,
    stream: Stream,
}

impl Drop for FreeAfterGraphs {
    fn drop(&mut self) {
        // SAFETY: the buffer handed its free over unperformed (the memory is live, from this
        // resource, and freed once, here); the captures drop what they keep only after their
        // graphs are gone and the work of every launch is done, and `stream` was ordered after
        // the buffer's uses outside them before the free was handed over.
        on_drop("Buffer (freed after the graphs that used it)", || unsafe {
            self.resource.deallocate_raw(self.ptr, self.size, &self.stream)
        });
    }
}

/// [`ScopedBuffer::release`] of a buffer that work being captured used (on a stream whose
/// capture this crate began): its graph may run that work for as long as it lives, so the
/// memory goes only when every such capture lets go of it ([`FreeAfterGraphs`]). Ordering the
/// free after those streams the usual way (an event recorded in the capture, waited for by the
/// freeing stream) would instead draw the freeing stream into the capture and free the memory
/// under the graph. The other streams' work is ordered before the free now. A buffer whose
/// resource is borrowed cannot outlive the borrow: it is not freed ([`Error::CapturingStream`];
/// the memory stays allocated, never freed under a graph).
#[cold]
#[inline(never)]
fn free_after_captures(
    owner: &Owner<'_>,
    stream: &Stream,
    ptr: DevicePtr,
    size: usize,
    used_on: &mut Vec<Stream>,
) -> Result<()> {
    let Owner::Resource(resource) = owner else {
        // The uses stay: a later attempt (a `close` given back) finds the capture still under
        // way, or over and the free ordered the usual way.
        return Err(Error::CapturingStream);
    };
    let (capturing, others): (Vec<Stream>, Vec<Stream>) = std::mem::take(used_on)
        .into_iter()
        .partition(|used| matches!(used.capture_state(), CaptureState::Capturing(_)));
    let free_on = match order_after_other_streams(stream, &others) {
        Ok(free_on) => free_on.into_owned(),
        Err(error) => {
            used_on.extend(capturing.into_iter().chain(others));
            return Err(error);
        }
    };
    let free = Arc::new(FreeAfterGraphs { resource: Arc::clone(resource), ptr, size, stream: free_on });
    let ended: Vec<&Stream> =
        capturing.iter().filter(|used| used.keep_alive_in_capture(Arc::clone(&free)).is_err()).collect();
    for used in ended {
        // Its capture ended meanwhile (on its own thread): its work is no longer recorded, so
        // the free follows its stream the usual way.
        if let Err(error) = wait_in(&free.stream, used).or_else(|_| used.synchronize_or_device()) {
            // No order after that work: the memory is never freed (leaked), and the buffer no
            // longer owns it either, so nothing frees it twice.
            std::mem::forget(free);
            crate::drop_errors::record("Buffer (used in a capture; not freed)", error);
            return Ok(());
        }
    }
    // The captures hold the rest; the last of them frees.
    Ok(())
}

/// [`ScopedBuffer::release`] of an owning buffer with memory that was used on other streams
/// too (`used_on`), or whose `stream` the calling thread cannot name: the free is ordered after
/// every use first. On failure the uses are left as they were.
#[cold]
#[inline(never)]
fn release_after_uses(
    resource: &dyn MemoryResource,
    stream: &Stream,
    ptr: DevicePtr,
    size: usize,
    used_on: &mut Vec<Stream>,
) -> Result<()> {
    let uses = std::mem::take(used_on);
    let freed = order_after_other_streams(stream, &uses).and_then(|free_on| {
        // SAFETY: the pointer came from this resource's `allocate_raw` (or the caller of
        // `from_raw_owned` promised so) and is freed only here, once: the caller zeroes the
        // buffer's size when it was, so neither `close` nor `Drop` frees it again; `free_on` is
        // ordered after every use.
        unsafe { resource.deallocate_raw(ptr, size, &free_on) }
    });
    if freed.is_err() {
        *used_on = uses;
    }
    freed
}

/// A [`close`](ScopedBuffer::close) that did not free the memory: the cause, and the buffer,
/// handed back still owning it. Drop the buffer to try once more (a failure is then recorded,
/// see [`take_drop_errors`](crate::take_drop_errors)), or keep it and close it later.
#[derive(Debug)]
pub struct CloseError<'a> {
    // Boxed: only a failure pays for it, and the `Result` of every close stays small.
    buffer: Box<ScopedBuffer<'a>>,
    error: Error,
}

impl<'a> CloseError<'a> {
    /// Why the memory was not freed.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The buffer, still owning its memory.
    pub fn into_buffer(self) -> ScopedBuffer<'a> {
        *self.buffer
    }

    /// The buffer and the cause.
    pub fn into_parts(self) -> (ScopedBuffer<'a>, Error) {
        (*self.buffer, self.error)
    }
}

impl std::fmt::Display for CloseError<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the buffer ({} bytes at {:#x}) was not freed and is handed back: drop it to try again, or keep it",
            self.buffer.size, self.buffer.ptr
        )
    }
}

/// The cause, for `?` in a function that returns [`Error`]: the buffer handed back is dropped,
/// which tries to free it once more (a failure then is recorded, see
/// [`take_drop_errors`](crate::take_drop_errors)). Keep the buffer with
/// [`into_parts`](CloseError::into_parts) instead to retry later.
impl From<CloseError<'_>> for Error {
    fn from(refused: CloseError<'_>) -> Error {
        let (buffer, error) = refused.into_parts();
        drop(buffer);
        error
    }
}

impl std::error::Error for CloseError<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Orders a free on `stream` after the work enqueued so far on every stream in `uses`, and
/// returns the stream to free on.
#[inline]
fn order_after_uses<'s>(stream: &'s Stream, uses: &[Stream]) -> Result<Cow<'s, Stream>> {
    // A buffer used on its own stream only orders nothing (as `release`'s fast path).
    if uses.is_empty() && !stream.is_foreign_per_thread() {
        return Ok(Cow::Borrowed(stream));
    }
    order_after_other_streams(stream, uses)
}

/// [`order_after_uses`] when there is something to order: an event on each stream used, waited
/// for by `stream`. When that bookkeeping fails, or a stream cannot be named from here (a
/// per-thread default stream of another thread, the free stream included), the devices involved
/// are synchronized instead, and the free goes on the stream that `stream` names from here. Only
/// when that fails too is there no safe order, and the memory must not be freed.
pub(crate) fn order_after_other_streams<'s>(stream: &'s Stream, uses: &[Stream]) -> Result<Cow<'s, Stream>> {
    let nameable = !stream.is_foreign_per_thread() && !uses.iter().any(Stream::is_foreign_per_thread);
    if nameable && uses.iter().filter(|&u| u != stream).try_for_each(|used| wait_in(stream, used)).is_ok() {
        return Ok(Cow::Borrowed(stream));
    }
    let mut devices: Vec<Device> = uses.iter().map(Stream::device).collect();
    devices.push(stream.device());
    devices.sort();
    devices.dedup();
    devices.into_iter().try_for_each(|device| device.synchronize())?;
    Ok(stream.on_calling_thread())
}

/// Makes `stream` wait for the work enqueued so far on `used`.
fn wait_in(stream: &Stream, used: &Stream) -> Result<()> {
    let event = Event::new(used.device(), EventOptions::default())?;
    event.record(used)?;
    stream.wait(&event)
}

impl Drop for ScopedBuffer<'_> {
    #[inline]
    fn drop(&mut self) {
        on_drop("Buffer", || self.release());
    }
}

impl PartialEq for ScopedBuffer<'_> {
    /// Two buffers are equal when they cover the same bytes.
    fn eq(&self, other: &Self) -> bool {
        self.ptr == other.ptr && self.size == other.size
    }
}

fn copy(dst: &mut ScopedBuffer<'_>, src: &ScopedBuffer<'_>, stream: &Stream) -> Result<()> {
    if dst.size != src.size {
        return Err(Error::SizeMismatch { what: "the destination buffer", expected: src.size, actual: dst.size });
    }
    if dst.size == 0 {
        return Ok(());
    }
    let d = driver()?;
    let stream = stream.on_calling_thread();
    stream.bind_if_default()?;
    // SAFETY: both buffers cover `size` bytes that stay valid until they are freed, which is
    // ordered after this work; the driver handles overlap.
    unsafe { ffi::memcpy_async(d, dst.ptr, src.ptr, dst.size, stream.handle()) }?;
    dst.note_use(&stream);
    src.note_use(&stream);
    Ok(())
}
