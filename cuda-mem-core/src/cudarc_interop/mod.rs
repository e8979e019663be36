//! Interop with cudarc (feature `cudarc`): its streams as ours and ours as its, typed views and
//! buffers in its copies, memsets and kernel launches, and its allocations as buffers. The
//! overview and an example are in the crate docs ("cudarc").

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytemuck::Pod;
use cuda_mem_sys::types::{CUresult, CUstream};
use cudarc::driver::{
    self as rc, CudaContext, CudaSlice, CudaStream, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop,
};

use crate::buffer::{Buffer, ScopedBuffer, order_after_other_streams};
use crate::device::{Device, DevicePtr};
use crate::error::{CudarcError, Error, Result};
use crate::memory_resource::MemoryResource;
use crate::stream::{Stream, StreamOwner};
use crate::view::{DeviceView, DeviceViewMut};

/// cudarc's error as ours: the same driver code, named after the driver function that failed.
fn from_cudarc(function: &'static str, error: rc::DriverError) -> Error {
    Error::from(cuda_mem_sys::DriverError::from_header(function, CUresult(error.0 as u32)))
}

/// The device whose primary context `context` is.
fn primary_device(context: &CudaContext) -> Result<Device> {
    if !context.is_primary() {
        return Err(CudarcError::NotPrimaryContext { ordinal: context.ordinal() }.into());
    }
    Device::new(context.ordinal())
}

impl Stream {
    /// A cudarc stream as one of ours, borrowed: dropping the value (its last clone) never
    /// destroys the stream, and it holds a share of cudarc's `Arc`, so the stream lives at least as
    /// long as any clone of it (buffers allocated on it included).
    ///
    /// # Errors
    /// - [`CudarcError::NotPrimaryContext`] for a stream of a non-primary context.
    /// - A driver error.
    pub fn from_cudarc(stream: &Arc<CudaStream>) -> Result<Stream> {
        let device = primary_device(stream.context())?;
        let handle: CUstream = stream.cu_stream().cast();
        let owner: Arc<dyn Any + Send + Sync> = Arc::clone(stream) as _;
        Ok(Stream::borrowed_from(handle, device, Some(StreamOwner::new(owner))))
    }

    /// This stream as a cudarc stream of `context` (cudarc's `wrap_borrowed_stream`): dropping
    /// it never destroys the stream. cudarc's `CudaStream` has no room for a share of ours, so
    /// nothing keeps the stream alive for it: hence `unsafe`. The default streams
    /// ([`Stream::legacy_default`], [`Stream::per_thread_default`]) are never destroyed, so for
    /// them the promise below always holds.
    ///
    /// # Safety
    /// A clone of `self` outlives every use of the returned stream and of what holds it (cudarc
    /// slices allocated on it, launches): an owned stream is destroyed with its last clone.
    ///
    /// # Errors
    /// [`CudarcError::NotPrimaryContext`] and [`CudarcError::ContextOfAnotherDevice`] unless
    /// `context` is the primary context of this stream's device.
    pub unsafe fn to_cudarc(&self, context: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
        let device = primary_device(context)?;
        if device != self.device() {
            return Err(CudarcError::ContextOfAnotherDevice {
                stream_device: self.device().ordinal(),
                context_device: device.ordinal(),
            }
            .into());
        }
        // SAFETY: the handle is a stream of this device's primary context, which `context` is;
        // the caller keeps it alive while cudarc uses it; work through either wrapper goes to the
        // same stream, so stream order orders it.
        // cudarc may begin a capture on it, or make it wait for its events, through its safe
        // API: the handle is shared, and the stream's capture is asked of the driver from now on.
        Ok(unsafe { context.wrap_borrowed_stream(self.shared_handle().cast()) })
    }
}

/// Orders the work enqueued from now on on `stream` after the work enqueued so far on `other`,
/// the way a buffer's free is ordered after its uses (an event, or where a stream cannot be named
/// from this thread, the devices synchronized).
fn order_after(stream: &Stream, other: &Stream) -> Result<()> {
    order_after_other_streams(stream, std::slice::from_ref(other)).map(drop)
}

/// Brings `buffer` to `stream` for cudarc: work on `stream` from now on follows the work
/// enqueued so far through the buffer, and the buffer's free and host access wait for
/// `stream`'s work.
fn join(buffer: &ScopedBuffer<'_>, stream: &Arc<CudaStream>) -> Result<()> {
    let ours = Stream::from_cudarc(stream)?;
    buffer.order_before(&ours)
}

/// Where cudarc asks for the address on `stream`: nothing more to do on the view's own stream;
/// on another one, that stream first waits for the view's stream, and the call that asked waits
/// for it before returning (cudarc lends the stream only for the call, so the buffer cannot
/// record it to wait for later).
///
/// When `stream` cannot be made to wait (its event could not be made, recorded or waited for),
/// the view's stream is waited for here instead, before the call enqueues its work: the order
/// holds all the same, and the failure is recovered, as this crate's own waits fall back
/// (`Stream::synchronize_or_device`). It is not recorded: cudarc's trait returns no error, and
/// one recorded in the context's error state (`check_err`) would make the wait this returns
/// fail at once (cudarc's waits check that state first), so the call would return before its
/// work is done. Only when the view's stream cannot be waited for either is the call's work
/// unordered; that error is recorded then, as cudarc records its own.
fn use_on<'a>(home: &'a CudaStream, stream: &'a CudaStream) -> SyncOnDrop<'a> {
    if stream == home {
        return SyncOnDrop::Sync(None);
    }
    if stream.join(home).is_err() {
        stream.context().record_err(wait_for(home));
    }
    SyncOnDrop::sync_stream(stream)
}

/// Waits for the work enqueued so far on `home`, in its context, leaving the calling thread's
/// current context as it was (cudarc's call goes on in it). The driver's calls, not
/// `CudaStream::synchronize`, which first checks the context's error state and would not wait
/// while an error is recorded.
fn wait_for(home: &CudaStream) -> std::result::Result<(), rc::DriverError> {
    let current = rc::result::ctx::get_current()?;
    let context = home.context().cu_ctx();
    let switch = current != Some(context);
    if switch {
        // SAFETY: `home`'s context is alive: the stream holds it.
        unsafe { rc::result::ctx::set_current(context) }?;
    }
    // SAFETY: `home` is a live stream (the view that asked holds it), of the current context.
    let waited = unsafe { rc::result::stream::synchronize(home.cu_stream()) };
    if switch && let Some(current) = current {
        // SAFETY: the context current a moment ago, which the call that asked holds alive.
        unsafe { rc::result::ctx::set_current(current) }?;
    }
    waited
}

/// A read-only typed view of a buffer, bound to a cudarc stream: what cudarc's copies
/// (`CudaStream::memcpy_dtoh`, `memcpy_dtod`, `clone_dtoh`, …) take as a source
/// ([`DevicePtr`](cudarc::driver::DevicePtr)) and its launches as an argument (`&view`).
///
/// cudarc's traits ask every piece of device memory for the `Arc<CudaStream>` it belongs to,
/// which this crate's views do not hold: [`DeviceView::on_cudarc`] (or
/// [`ScopedBuffer::cudarc_view`]) names it. Making one orders the stream after the work
/// enqueued so far through the buffer (on any stream) and records the stream on the buffer, so
/// its free and host access wait for cudarc's work there, as they do for this crate's own.
///
/// Use it on that stream. A copy or memset of cudarc's on another stream waits for the view's
/// stream first and returns once it is done. A kernel launch is not told its stream (cudarc's
/// `LaunchArgs` keeps it private), so launch on the view's stream: launches are `unsafe`, and
/// this is part of what the caller promises.
#[derive(Debug)]
pub struct CudarcView<'b, T> {
    view: DeviceView<'b, T>,
    /// The address, where a launch reads it from (cudarc passes arguments by reference).
    ptr: rc::sys::CUdeviceptr,
    stream: Arc<CudaStream>,
}

/// A mutable typed view of a buffer, bound to a cudarc stream: what cudarc's copies and memsets
/// (`memcpy_htod`, `memcpy_dtod`, `memset_zeros`, …) take as a destination
/// ([`DevicePtrMut`](cudarc::driver::DevicePtrMut)) and its launches as an argument
/// (`&mut view`). As [`CudarcView`] otherwise.
#[derive(Debug)]
pub struct CudarcViewMut<'b, T> {
    view: DeviceViewMut<'b, T>,
    ptr: rc::sys::CUdeviceptr,
    stream: Arc<CudaStream>,
}

impl<'b, T: Pod> DeviceView<'b, T> {
    /// This view, for cudarc's copies and launches on `stream` (see [`CudarcView`]).
    ///
    /// # Errors
    /// - [`CudarcError::NotPrimaryContext`].
    /// - A driver error from ordering the streams.
    pub fn on_cudarc(self, stream: &Arc<CudaStream>) -> Result<CudarcView<'b, T>> {
        join(self.buffer(), stream)?;
        Ok(CudarcView { ptr: self.ptr(), view: self, stream: Arc::clone(stream) })
    }
}

impl<'b, T: Pod> DeviceViewMut<'b, T> {
    /// This view, for cudarc's copies, memsets and launches on `stream` (see [`CudarcViewMut`]).
    ///
    /// # Errors
    /// - [`CudarcError::NotPrimaryContext`].
    /// - A driver error from ordering the streams.
    pub fn on_cudarc(self, stream: &Arc<CudaStream>) -> Result<CudarcViewMut<'b, T>> {
        join(self.as_view().buffer(), stream)?;
        Ok(CudarcViewMut { ptr: self.ptr(), view: self, stream: Arc::clone(stream) })
    }
}

impl<'a> ScopedBuffer<'a> {
    /// The buffer as `T`s for cudarc's copies and launches on `stream`
    /// (`buffer.view::<T>()?.on_cudarc(stream)`).
    ///
    /// # Errors
    /// As [`view`](ScopedBuffer::view) and [`DeviceView::on_cudarc`].
    pub fn cudarc_view<T: Pod>(&self, stream: &Arc<CudaStream>) -> Result<CudarcView<'_, T>> {
        self.view::<T>()?.on_cudarc(stream)
    }

    /// The buffer as mutable `T`s for cudarc's copies, memsets and launches on `stream`
    /// (`buffer.view_mut::<T>()?.on_cudarc(stream)`).
    ///
    /// # Errors
    /// As [`view_mut`](ScopedBuffer::view_mut) and [`DeviceViewMut::on_cudarc`].
    pub fn cudarc_view_mut<T: Pod>(&mut self, stream: &Arc<CudaStream>) -> Result<CudarcViewMut<'_, T>> {
        self.view_mut::<T>()?.on_cudarc(stream)
    }
}

impl<'b, T: Pod> CudarcView<'b, T> {
    /// The view of this crate it wraps.
    pub fn view(&self) -> DeviceView<'b, T> {
        self.view
    }

    /// The cudarc stream it is bound to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<'b, T: Pod> CudarcViewMut<'b, T> {
    /// The view of this crate it wraps, read-only, while borrowed.
    pub fn view(&self) -> DeviceView<'_, T> {
        self.view.as_view()
    }

    /// The view of this crate it wraps, for writing with this crate's methods, while borrowed:
    /// a new view of the same elements, not the wrapped one itself, which stays the one
    /// cudarc's calls were bound to (its address and length are what they use, and its buffer
    /// is the one ordered after cudarc's stream). So another view cannot be swapped in:
    ///
    /// ```compile_fail,E0308
    /// # use std::sync::Arc;
    /// # use cuda_mem_core::cudarc::driver::CudaStream;
    /// # use cuda_mem_core::{DeviceMemoryResource, Stream};
    /// # fn f(theirs: &Arc<CudaStream>, ours: &Stream) -> cuda_mem_core::Result<()> {
    /// let pool = DeviceMemoryResource::new(ours.device(), Default::default())?;
    /// let (mut small, mut large) = (pool.allocate(4, ours)?, pool.allocate(1 << 20, ours)?);
    /// let mut bound = small.cudarc_view_mut::<u8>(theirs)?;
    /// let mut other = large.view_mut::<u8>()?;
    /// // error: a `Result` of a new view, not a `&mut` to the one cudarc uses
    /// std::mem::swap(bound.view_mut(), &mut other);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// None in practice: it is [`DeviceViewMut::slice_mut`] of every element, whose range always
    /// lies within the view.
    pub fn view_mut(&mut self) -> Result<DeviceViewMut<'_, T>> {
        self.view.slice_mut(..)
    }

    /// The cudarc stream it is bound to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T: Pod> DeviceSlice<T> for CudarcView<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T: Pod> DeviceSlice<T> for CudarcViewMut<'_, T> {
    fn len(&self) -> usize {
        self.view.len()
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T: Pod> rc::DevicePtr<T> for CudarcView<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (rc::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, use_on(&self.stream, stream))
    }
}

impl<T: Pod> rc::DevicePtr<T> for CudarcViewMut<'_, T> {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (rc::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, use_on(&self.stream, stream))
    }
}

impl<T: Pod> rc::DevicePtrMut<T> for CudarcViewMut<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (rc::sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, use_on(&self.stream, stream))
    }
}

// SAFETY: the argument pushed is a reference to the view's address, a `CUdeviceptr` (which is
// `DeviceRepr`) that lives as long as the borrow `'b`, which outlives the launch builder `'a`;
// the address stays valid while the view borrows its buffer.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b CudarcView<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudarcView<'c, T>) -> &mut Self {
        <Self as PushKernelArg<&'b rc::sys::CUdeviceptr>>::arg(self, &arg.ptr)
    }
}

// SAFETY: as for `CudarcView`; the exclusive borrow lets the kernel write through the address.
unsafe impl<'a, 'b: 'a, 'c: 'b, T> PushKernelArg<&'b mut CudarcViewMut<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudarcViewMut<'c, T>) -> &mut Self {
        let arg: &'b CudarcViewMut<'c, T> = arg;
        <Self as PushKernelArg<&'b rc::sys::CUdeviceptr>>::arg(self, &arg.ptr)
    }
}

/// A cudarc allocation a [`CudarcMemoryResource`] holds: the `CudaSlice` (of any element type)
/// and the stream it belongs to.
struct Held {
    size: usize,
    // Held to be dropped: cudarc frees it then.
    _slice: Box<dyn Any + Send + Sync>,
    home: Stream,
}

/// A memory resource whose memory is cudarc's: it allocates with cudarc on a cudarc stream
/// (`CudaStream::alloc`), and adopts cudarc allocations ([`adopt`](CudarcMemoryResource::adopt),
/// [`Buffer::from_cudarc`]) as owned [`Buffer`]s. It holds each `CudaSlice` until the buffer
/// frees it: the slice's stream is then made to wait for the buffer's uses, and the slice is
/// dropped, so cudarc frees it, in stream order, after them. Nothing is freed by this crate; an
/// error of cudarc's own free goes to the cudarc context's error state (`check_err`).
pub struct CudarcMemoryResource {
    stream: Arc<CudaStream>,
    ours: Stream,
    held: Mutex<HashMap<DevicePtr, Held>>,
}

impl std::fmt::Debug for CudarcMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("CudarcMemoryResource").field("stream", &self.ours).field("held", &held).finish()
    }
}

impl CudarcMemoryResource {
    /// A resource allocating with cudarc on `stream`.
    ///
    /// # Errors
    /// - [`CudarcError::NotPrimaryContext`].
    /// - A driver error.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Arc<Self>> {
        let ours = Stream::from_cudarc(stream)?;
        Ok(Arc::new(CudarcMemoryResource { stream: Arc::clone(stream), ours, held: Mutex::default() }))
    }

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this resource alive
    /// ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) without the import).
    /// A zero-size request makes an empty buffer without asking the resource.
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows this resource and
    /// the stream ([`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped)
    /// without the import).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(self, size, stream)
    }

    /// The cudarc stream it allocates on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// How many cudarc allocations it holds.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Takes `slice` as an owned [`Buffer`] of this resource, recorded on the slice's own stream
    /// (which first waits for cudarc's uses of it, as cudarc does before a write). When the
    /// buffer is freed, the slice is dropped after the buffer's uses and cudarc frees it.
    ///
    /// The slice must be memory of this resource's device: the buffer reports the resource's
    /// device as its own. [`Buffer::from_cudarc`] makes a resource of the slice's device.
    ///
    /// # Errors
    /// - [`CudarcError::NotPrimaryContext`].
    /// - [`Error::StreamOfAnotherDevice`] when the slice's stream (and so its memory) is of another
    ///   device than the resource's.
    /// - A driver error. On error the slice is dropped, which frees it.
    pub fn adopt<T: 'static>(self: &Arc<Self>, mut slice: CudaSlice<T>) -> Result<Buffer> {
        let home = Stream::from_cudarc(slice.stream())?;
        if home.device() != self.ours.device() {
            return Err(Error::StreamOfAnotherDevice {
                resource: self.ours.device().ordinal(),
                stream: home.device().ordinal(),
            });
        }
        let size = slice.num_bytes();
        if size == 0 {
            // Nothing to hold: an empty buffer, as a zero-size allocation makes.
            drop(slice);
            return self.allocate(0, &home);
        }
        let slice_stream = Arc::clone(slice.stream());
        let ptr = {
            // cudarc orders its stream after its own uses of the slice here, and records the
            // write it expects when `_record` goes.
            let (ptr, _record) = rc::DevicePtrMut::device_ptr_mut(&mut slice, &slice_stream);
            ptr
        };
        let held = Held { size, _slice: Box::new(slice), home: home.clone() };
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr, held);
        let resource: Arc<dyn MemoryResource> = Arc::clone(self) as _;
        // SAFETY: the memory is held by this resource from now on and given back (dropped) only
        // by its `deallocate_raw`, which the buffer calls once.
        Ok(unsafe { Buffer::from_raw_owned(ptr, size, resource, &home) })
    }
}

impl Buffer {
    /// A cudarc allocation as an owned buffer (through a [`CudarcMemoryResource`] of the slice's
    /// stream): views, copies and everything else of this crate work on it, and when the buffer
    /// is freed, cudarc frees the slice after the buffer's uses.
    ///
    /// # Errors
    /// - [`CudarcError::NotPrimaryContext`].
    /// - A driver error.
    pub fn from_cudarc<T: 'static>(slice: CudaSlice<T>) -> Result<Buffer> {
        CudarcMemoryResource::new(slice.stream())?.adopt(slice)
    }
}

// SAFETY: every address handed out is that of a cudarc device allocation of at least `size`
// bytes, held (so not freed) until `deallocate_raw` takes it back; it is device memory, which
// the host cannot access.
unsafe impl MemoryResource for CudarcMemoryResource {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        // SAFETY: bytes may hold anything; a new allocation's contents are unspecified, as every
        // resource's are.
        let mut slice = unsafe { self.stream.alloc::<u8>(size) }.map_err(|e| from_cudarc("cuMemAllocAsync", e))?;
        let (ptr, record) = rc::DevicePtrMut::device_ptr_mut(&mut slice, &self.stream);
        drop(record);
        if self.ours != *stream {
            // Allocated in the order of cudarc's stream: usable on `stream` once it follows.
            order_after(stream, &self.ours)?;
        }
        let held = Held { size, _slice: Box::new(slice), home: self.ours.clone() };
        self.held.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr, held);
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let home = match held.get(&ptr) {
            Some(entry) if entry.size == size => entry.home.clone(),
            _ => return Err(CudarcError::NotHeld { ptr, size }.into()),
        };
        // cudarc frees on the slice's stream: after the work enqueued so far on `stream`.
        order_after(&home, stream)?;
        let entry = held.remove(&ptr);
        drop(held);
        // cudarc's `Drop` frees the memory on its stream.
        drop(entry);
        Ok(())
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        false
    }

    fn device(&self) -> Option<Device> {
        Some(self.ours.device())
    }
}

#[cfg(test)]
mod tests {
    //! cudarc loads the driver by name (`libcuda.so`): on the simulator each test runs in a
    //! child process whose `LD_LIBRARY_PATH` finds the simulator under that name, as in
    //! `tests/tests/cudarc.rs`, so cudarc and this crate share one driver and one memory.

    use std::time::Duration;

    use cuda_sim::testing::{self, Gate};
    use cudarc::driver::CudaContext;

    use super::*;
    use crate::{DeviceMemoryResource, FillPattern};

    /// Runs `body` as `testing::with_simulator_as_libcuda` does, on a simulated machine of
    /// `devices` devices (on a real driver: here, on the machine's own).
    fn with_cudarc_on(test_name: &str, devices: &str, body: impl FnOnce()) {
        if !testing::on_simulator() || std::env::var(testing::CHILD_ENV).is_ok_and(|name| name == test_name) {
            return testing::in_simulated_machine(test_name, &[], body);
        }
        let mut search = testing::libcuda_dir().expect("the simulator links as libcuda.so").into_os_string();
        if let Some(inherited) = std::env::var_os("LD_LIBRARY_PATH").filter(|path| !path.is_empty()) {
            search.push(":");
            search.push(inherited);
        }
        let search = search.into_string().expect("a UTF-8 library path");
        testing::in_simulated_machine(test_name, &[("LD_LIBRARY_PATH", &search), ("CUDA_SIM_DEVICES", devices)], body);
    }

    #[test]
    fn a_resource_refuses_to_adopt_a_slice_of_another_device() {
        let name = "cudarc_interop::tests::a_resource_refuses_to_adopt_a_slice_of_another_device";
        with_cudarc_on(name, "2", || {
            testing::driver().expect("the driver loads");
            if Device::count().unwrap() < 2 {
                testing::skip("needs 2 devices");
                return;
            }
            let (zero, one) = (CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap());
            let resource = CudarcMemoryResource::new(&zero.new_stream().unwrap()).unwrap();
            let allocations = || testing::live_objects_if_simulated().map(|live| live.allocations);
            let before = allocations();
            let theirs = one.new_stream().unwrap();
            let error = resource.adopt(theirs.alloc_zeros::<u32>(64).unwrap()).unwrap_err();
            assert!(matches!(error, Error::StreamOfAnotherDevice { resource: 0, stream: 1 }), "{error}");
            // Not held, and freed by cudarc.
            assert_eq!(resource.held(), 0);
            theirs.synchronize().unwrap();
            assert_eq!(allocations(), before, "the refused slice was freed");
            // Its own device's resource takes it, as the memory of that device.
            let buffer = Buffer::from_cudarc(theirs.alloc_zeros::<u32>(64).unwrap()).unwrap();
            assert_eq!(buffer.device(), Some(Device::new(1).unwrap()));
            let buffer = resource.adopt(zero.default_stream().alloc_zeros::<u32>(64).unwrap()).unwrap();
            assert_eq!(buffer.device(), Some(Device::new(0).unwrap()));
            zero.check_err().unwrap();
            one.check_err().unwrap();
        });
    }

    #[test]
    fn a_copy_on_another_stream_waits_for_the_views_stream_when_it_cannot_join_it() {
        let name = "cudarc_interop::tests::a_copy_on_another_stream_waits_for_the_views_stream_when_it_cannot_join_it";
        with_cudarc_on(name, "1", || {
            let d = testing::driver().expect("the driver loads");
            if !testing::simulator_only("fault injection") {
                return;
            }
            let context = CudaContext::new(0).unwrap();
            let (home, other) = (context.new_stream().unwrap(), context.new_stream().unwrap());
            let ours = Stream::from_cudarc(&home).unwrap();
            let pool = DeviceMemoryResource::new(ours.device(), Default::default()).unwrap();
            let mut buffer = pool.allocate(4096, &ours).unwrap();
            // The view's stream is held, then fills the buffer: a copy on `other` that follows
            // it reads the fill, after the gate opens.
            let (gate, _opens_on_failure) = Gate::new();
            // SAFETY: a live stream of the driver's primary context.
            unsafe { gate.hold(d, home.cu_stream().cast()) }.unwrap();
            buffer.fill(FillPattern::U8(7), &ours).unwrap();
            let view = buffer.cudarc_view::<u8>(&home).unwrap();
            gate.open_after(Duration::from_millis(200));
            // `other` cannot be made to wait for `home` (cudarc's `join` fails in its
            // `cuStreamWaitEvent`): the copy must still follow the fill.
            testing::inject_failure(d, c"cuStreamWaitEvent", 1).unwrap();
            let out = other.clone_dtoh(&view).unwrap();
            assert!(gate.is_open(), "the copy on another stream returned before the view's stream ran");
            assert!(out.iter().all(|&b| b == 7), "the copy read the buffer before the fill");
            // Recovered: nothing recorded.
            context.check_err().unwrap();

            // Neither joined nor waited for: the failure is recorded.
            testing::inject_failure(d, c"cuStreamWaitEvent", 1).unwrap();
            testing::inject_failure(d, c"cuStreamSynchronize", 1).unwrap();
            let _ = other.clone_dtoh(&view);
            let recorded = context.check_err().unwrap_err();
            assert_eq!(recorded.0, rc::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY, "{recorded}");
            other.synchronize().unwrap();
            home.synchronize().unwrap();
        });
    }
}
