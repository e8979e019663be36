//! Export: a buffer (owned, shared, or held by another owner) or a typed view of one as a
//! versioned DLPack tensor whose deleter keeps the buffer alive.

use std::ffi::c_void;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use bytemuck::Pod;
use dlpark::DlpackFlags;
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType};
use dlpark::metadata::Dynamic;

use super::dtype::{DlpackElement, element_bytes, is_defined};
use super::layout;
use super::stream::{ConsumerStream, hand_over};
use super::tensor::DlpackTensor;
use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::Device;
use crate::driver::driver;
use crate::error::{DlpackError, Error, Result, ViewError};
use crate::ffi;
use crate::view::{DeviceView, checked_range};

/// How a buffer is exported: which elements, their shape and strides, whether the consumer may
/// write, and the consumer's stream.
///
/// By default the whole buffer, one dimension, writable when the source is exclusive (see
/// [`ExportSource`]), synchronized with the legacy default stream.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions<'s> {
    elements: Option<(Bound<usize>, Bound<usize>)>,
    shape: Option<Vec<usize>>,
    strides: Option<Vec<isize>>,
    read_only: bool,
    consumer: ConsumerStream<'s>,
}

impl<'s> ExportOptions<'s> {
    /// Exports only these elements (in elements of the exported type, within the buffer or
    /// view): `elements(16..32)`.
    pub fn elements(mut self, range: impl RangeBounds<usize>) -> Self {
        self.elements = Some((range.start_bound().cloned(), range.end_bound().cloned()));
        self
    }

    /// The tensor's shape, compact row-major: its dimensions must multiply to the number of
    /// elements exported.
    pub fn shape(mut self, shape: &[usize]) -> Self {
        self.shape = Some(shape.to_vec());
        self.strides = None;
        self
    }

    /// The tensor's shape and strides (in elements, as DLPack counts them; negative to walk
    /// backwards): every element they reach must lie in the elements exported, and the element
    /// reached first is the first exported (element `[0, …, 0]` is placed accordingly).
    pub fn shape_and_strides(mut self, shape: &[usize], strides: &[isize]) -> Self {
        self.shape = Some(shape.to_vec());
        self.strides = Some(strides.to_vec());
        self
    }

    /// Marks the tensor read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`): consumers must not write it.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The stream the consumer will use the tensor on (see [`ConsumerStream`]).
    pub fn consumer_stream(mut self, consumer: ConsumerStream<'s>) -> Self {
        self.consumer = consumer;
        self
    }
}

/// What an exported tensor holds to keep its memory alive: it is moved into the tensor and
/// dropped when the consumer calls the deleter (from any thread), which frees the memory if it
/// was the last holder.
///
/// A source is *exclusive* when nothing else can reach the memory while the tensor lives (a
/// [`Buffer`] moved in); the tensor is then writable unless
/// [`read_only`](ExportOptions::read_only) is asked. A shared source (an `Arc`, an [`OwnedBy`])
/// is always exported read-only, since its other holders may read the memory while the consumer
/// holds it.
///
/// # Safety
/// The consumer may write a tensor whose source says it is exclusive, while this process reads
/// the memory through any other value that reaches it: [`is_exclusive`](Self::is_exclusive)
/// returns `true` only when nothing but the source reaches the buffer's memory while the source
/// lives (no other buffer, view, slice or copy of this process). [`buffer`](Self::buffer)
/// returns the same buffer every time, alive as long as the source.
///
/// So a source that claims it is the caller's word, not safe code's:
///
/// ```compile_fail,E0200
/// use std::sync::Arc;
/// use cuda_mem_core::{Buffer, ExportSource};
///
/// // A share of a buffer that others read, claimed exclusive: refused without `unsafe impl`.
/// struct Claimed(Arc<Buffer>);
/// impl ExportSource for Claimed {
///     fn buffer(&self) -> &Buffer { &self.0 }
///     fn is_exclusive(&self) -> bool { true }
/// }
/// ```
pub unsafe trait ExportSource: Send + 'static {
    /// The buffer to export.
    fn buffer(&self) -> &Buffer;

    /// Whether nothing else reaches the memory while the tensor lives.
    fn is_exclusive(&self) -> bool;

    /// Whether the memory is managed, when the source knows better than its buffer (a
    /// [`DlpackImport`](crate::DlpackImport) knows what its producer said); `None` lets the
    /// buffer's resource, or for a view the driver's pointer attributes, tell.
    fn is_managed(&self) -> Option<bool> {
        None
    }
}

// SAFETY: a buffer moved into the tensor is reached through nothing else: its owner gave it up.
unsafe impl ExportSource for Buffer {
    fn buffer(&self) -> &Buffer {
        self
    }

    fn is_exclusive(&self) -> bool {
        true
    }
}

// SAFETY: never claims exclusivity (other holders of the `Arc` reach the memory); the buffer is
// the shared source's, alive while the `Arc` is.
unsafe impl<S: ExportSource + Sync> ExportSource for Arc<S> {
    fn buffer(&self) -> &Buffer {
        (**self).buffer()
    }

    fn is_exclusive(&self) -> bool {
        false
    }
}

/// A value that holds a buffer (a `VirtualBuffer` of `cuda-mem-vmm`, which lends its buffer
/// through `as_buffer`), exported through the function that lends it:
/// `OwnedBy::new(virtual_buffer, VirtualBuffer::as_buffer)`. Read-only unless made with
/// [`new_exclusive`](OwnedBy::new_exclusive).
pub struct OwnedBy<O> {
    owner: O,
    buffer: fn(&O) -> &Buffer,
    exclusive: bool,
}

impl<O> OwnedBy<O> {
    /// `owner`, whose buffer `buffer` lends; exported read-only.
    pub fn new(owner: O, buffer: fn(&O) -> &Buffer) -> OwnedBy<O> {
        OwnedBy { owner, buffer, exclusive: false }
    }

    /// `owner`, whose buffer `buffer` lends, exported writable unless asked otherwise.
    ///
    /// # Safety
    /// Nothing but the tensor reaches the buffer's memory while the tensor lives: no other
    /// value of this process views, copies or frees it (a grown virtual buffer shares memory
    /// with the buffer it grew from, say).
    pub unsafe fn new_exclusive(owner: O, buffer: fn(&O) -> &Buffer) -> OwnedBy<O> {
        OwnedBy { owner, buffer, exclusive: true }
    }
}

impl<O> std::fmt::Debug for OwnedBy<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedBy").field("buffer", (self.buffer)(&self.owner)).finish_non_exhaustive()
    }
}

// SAFETY: exclusive only when made with the `unsafe` `new_exclusive`, whose caller vouches for
// it; the buffer is lent by the owner the source holds.
unsafe impl<O: Send + 'static> ExportSource for OwnedBy<O> {
    fn buffer(&self) -> &Buffer {
        (self.buffer)(&self.owner)
    }

    fn is_exclusive(&self) -> bool {
        self.exclusive
    }
}

/// Exports `source`'s buffer as a tensor of `T` (see [`Buffer::into_dlpack`] for what the
/// tensor says and the errors).
///
/// # Errors
/// As [`Buffer::into_dlpack`].
pub fn export_dlpack<T: DlpackElement>(source: impl ExportSource, options: &ExportOptions<'_>) -> Result<DlpackTensor> {
    let size = source.buffer().size();
    let element = Element { dtype: T::DTYPE, size: size_of::<T>(), align: align_of::<T>(), name: type_name::<T>() };
    export_range(source, element, 0, size, options)
}

/// Exports `source`'s buffer as a tensor of elements of `dtype` (a data type no Rust type of
/// [`DlpackElement`] names: `float16`, complex, vectors), without an alignment check.
///
/// # Errors
/// - [`DlpackError::UnknownDtype`] for a data type DLPack does not define (an unknown type
///   code, or a width its code does not take), which consumers refuse.
/// - [`DlpackError::UnsupportedDtype`] for a data type that is not a whole number of bytes.
/// - As [`Buffer::into_dlpack`].
pub fn export_dlpack_as(
    source: impl ExportSource,
    dtype: DLDataType,
    options: &ExportOptions<'_>,
) -> Result<DlpackTensor> {
    if !is_defined(dtype) {
        return Err(DlpackError::UnknownDtype { dtype }.into());
    }
    let Some(size) = element_bytes(dtype) else {
        return Err(DlpackError::UnsupportedDtype { dtype }.into());
    };
    let total = source.buffer().size();
    export_range(source, Element { dtype, size, align: 1, name: "the DLPack data type's elements" }, 0, total, options)
}

fn type_name<T>() -> &'static str {
    std::any::type_name::<T>()
}

/// What is exported: the data type, the Rust size and alignment of one element, and its name
/// for errors.
#[derive(Clone, Copy)]
struct Element {
    dtype: DLDataType,
    size: usize,
    align: usize,
    name: &'static str,
}

impl Buffer {
    /// Exports the buffer as a versioned DLPack tensor of `T` (`DLManagedTensorVersioned`) that
    /// owns it: the memory stays valid, and its resource (a pool) alive, until the consumer calls
    /// the tensor's deleter, which frees it (from any thread, once, never panicking; errors are
    /// recorded, see [`take_drop_errors`](crate::take_drop_errors)).
    ///
    /// The tensor's device is the memory's: `kDLCUDA` and the device's ordinal for device
    /// memory, `kDLCUDAHost` for pinned host memory and `kDLCUDAManaged` for managed memory
    /// (id 0 for both, as DLPack asks). Its data type is `T`'s; its shape one dimension of
    /// every element, or the options' shape and strides; it is writable unless
    /// [`read_only`](ExportOptions::read_only) is asked. The consumer's stream waits for the
    /// buffer's work (see [`ConsumerStream`]). To keep the buffer in Rust too, export an
    /// `Arc<Buffer>` with [`export_dlpack`](crate::export_dlpack) (read-only), or a view with
    /// [`DeviceView::to_dlpack`].
    ///
    /// # Errors
    /// - [`ViewError::Size`] or [`ViewError::Alignment`] when the bytes are not whole, aligned
    ///   `T`s.
    /// - [`ViewError::SliceOutOfRange`] for elements past the end.
    /// - [`Error::Dlpack`] with [`DlpackError::ShapeSize`], [`DlpackError::StridesLength`],
    ///   [`DlpackError::OutOfBounds`] or [`DlpackError::ShapeTooLarge`] for a layout that does not
    ///   fit, [`DlpackError::NotAccessible`] or [`DlpackError::UnknownDevice`] for memory with no
    ///   DLPack device.
    /// - A driver error from the stream exchange. The buffer is dropped (freed) on error: export an
    ///   `Arc` of it to keep it.
    #[doc(alias = "__dlpack__")]
    pub fn into_dlpack<T: DlpackElement>(self, options: &ExportOptions<'_>) -> Result<DlpackTensor> {
        export_dlpack::<T>(self, options)
    }

    /// As [`into_dlpack`](ScopedBuffer::into_dlpack), with elements of `dtype` (see
    /// [`export_dlpack_as`](crate::export_dlpack_as)).
    ///
    /// # Errors
    /// - As [`into_dlpack`](ScopedBuffer::into_dlpack).
    /// - [`DlpackError::UnknownDtype`], [`DlpackError::UnsupportedDtype`].
    pub fn into_dlpack_as(self, dtype: DLDataType, options: &ExportOptions<'_>) -> Result<DlpackTensor> {
        export_dlpack_as(self, dtype, options)
    }
}

impl<T: Pod + DlpackElement> DeviceView<'_, T> {
    /// Exports the elements this view covers as a read-only DLPack tensor of `T` that holds a
    /// share of `owner`, the buffer the view was made from (a view borrows its buffer, so the
    /// tensor, which outlives the borrow, keeps the buffer alive through the `Arc` instead).
    /// The options' [`elements`](ExportOptions::elements) count within the view.
    ///
    /// # Errors
    /// - [`DlpackError::NotTheViewsBuffer`] when `owner` is not the view's buffer.
    /// - As [`Buffer::into_dlpack`].
    pub fn to_dlpack(&self, owner: &Arc<Buffer>, options: &ExportOptions<'_>) -> Result<DlpackTensor> {
        let viewed: *const ScopedBuffer<'_> = self.buffer();
        if !std::ptr::eq(viewed.cast::<()>(), Arc::as_ptr(owner).cast::<()>()) {
            return Err(DlpackError::NotTheViewsBuffer.into());
        }
        let element = Element { dtype: T::DTYPE, size: size_of::<T>(), align: align_of::<T>(), name: type_name::<T>() };
        // The view lies within its buffer, so the offset does not underflow.
        let start = (self.ptr() - owner.ptr()) as usize;
        export_range(Arc::clone(owner), element, start, self.byte_len(), options)
    }
}

/// Exports `byte_len` bytes from `byte_start` of the source's buffer as elements of `element`.
fn export_range(
    source: impl ExportSource,
    element: Element,
    byte_start: usize,
    byte_len: usize,
    options: &ExportOptions<'_>,
) -> Result<DlpackTensor> {
    let buffer = source.buffer();
    let base = buffer.ptr() + byte_start as u64;
    if !byte_len.is_multiple_of(element.size) {
        return Err(Error::View(ViewError::Size { element: element.name, element_size: element.size, size: byte_len }));
    }
    if !(base as usize).is_multiple_of(element.align) {
        return Err(Error::View(ViewError::Alignment { element: element.name, align: element.align, ptr: base }));
    }
    let (first, count) = match options.elements {
        Some(range) => checked_range(range, byte_len / element.size)?,
        None => (0, byte_len / element.size),
    };
    let layout = layout::check(options.shape.as_deref(), options.strides.as_deref(), count)?;
    let device = dl_device(buffer, source.is_managed())?;
    let stream_device = match buffer.device().or_else(|| buffer.deallocation_stream().map(|s| s.device())) {
        Some(device) => device,
        None => Device::new(0)?,
    };
    hand_over(buffer, options.consumer, stream_device)?;
    // DLPack: "if the tensor is of size zero, then the data pointer should be set to NULL",
    // the size being the product of the shape's dimensions (its `GetDataSize`): a shape with a
    // dimension of 0 has none, whatever the range (explicit strides may put an empty shape over
    // a range with elements).
    let data = if layout.shape.contains(&0) { 0 } else { base + ((first + layout.origin) * element.size) as u64 };
    let read_only = options.read_only || !source.is_exclusive();
    let metadata = Dynamic::new(layout.shape, layout.strides);
    let mut tensor = metadata.initialize(Box::new(source)).map_err(DlpackError::Metadata)?;
    tensor.set_data(data as *mut c_void).set_device(device).set_dtype(element.dtype);
    if read_only {
        // SAFETY: READ_ONLY only narrows what the consumer may do; IS_COPIED is not asserted.
        unsafe { tensor.set_flags_unchecked(DlpackFlags::READ_ONLY) };
    }
    // SAFETY: the data pointer addresses elements of the buffer that the layout keeps inside
    // it (checked above), and the buffer lives in the tensor's context until the deleter runs;
    // shape and strides live in the tensor's own allocation; the flags say read-only whenever
    // anything else may reach the memory.
    Ok(DlpackTensor::new(unsafe { tensor.finish() }))
}

/// The DLPack device of the buffer's memory, as cuda.core's `Buffer.__dlpack_device__` reports
/// it.
fn dl_device(buffer: &Buffer, managed: Option<bool>) -> Result<DLDevice> {
    let (ptr, size) = (buffer.ptr(), buffer.size());
    match (buffer.is_device_accessible(), buffer.is_host_accessible()) {
        (true, false) => {
            let device = buffer.device().ok_or(DlpackError::UnknownDevice { ptr, size })?;
            // Ordinals come from the driver's `int` device count.
            Ok(DLDevice::cuda(device.ordinal() as i32))
        }
        (true, true) => {
            let managed = match managed {
                Some(managed) => managed,
                None => is_managed(buffer)?,
            };
            let device_type = if managed { DLDeviceType::CUDAMANAGED } else { DLDeviceType::CUDAHOST };
            Ok(DLDevice { device_type, device_id: 0 })
        }
        (false, true) => Ok(DLDevice::CPU),
        (false, false) => Err(DlpackError::NotAccessible { ptr, size }.into()),
    }
}

/// Whether the buffer's memory is managed: its resource says so, or, for a view of memory
/// someone else owns, the driver's pointer attributes do.
fn is_managed(buffer: &Buffer) -> Result<bool> {
    if let Some(resource) = buffer.memory_resource() {
        return Ok(resource.is_managed());
    }
    if buffer.size() == 0 {
        return Ok(false);
    }
    Ok(ffi::pointer_is_managed(driver()?, buffer.ptr())?)
}
