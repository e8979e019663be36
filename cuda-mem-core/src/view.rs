//! Typed views of a buffer's bytes ([`DeviceView`], [`DeviceViewMut`]) and the copies between
//! them and ordinary Rust memory (`&[T]`, `&mut [T]`, `Vec<T>`).

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use bytemuck::Pod;
use cuda_mem_sys::cu_call;

use crate::buffer::ScopedBuffer;
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::error::{Error, Result, ViewError};
use crate::ffi::{self, Memset};
use crate::stream::Stream;

/// A read-only, typed view of `len()` elements of type `T` in a buffer's memory.
///
/// Made by [`ScopedBuffer::view`] (any buffer: pool, legacy, imported, or a VMM buffer's
/// `as_buffer()`), or from a [`DeviceViewMut`]. It borrows its buffer, so the buffer can be
/// neither freed nor written through while the view lives:
///
/// ```compile_fail,E0505
/// # use cuda_mem_core::{Device, DeviceMemoryResource, MemoryResourceExt, Stream};
/// # fn f(device: Device, stream: &Stream) -> cuda_mem_core::Result<()> {
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let buffer = pool.allocate(1024, stream)?;
/// let view = buffer.view::<f32>()?;
/// drop(buffer); // error: `buffer` is borrowed by `view`
/// let _ = view.to_vec(stream)?;
/// # Ok(()) }
/// ```
///
/// Work enqueued through a view is recorded on its buffer as the buffer's own copies are, so
/// host access to the buffer and its free wait for it.
///
/// # Host memory
///
/// The driver's synchronization rules for pageable memory decide what a copy from or into a
/// Rust slice may assume. A Rust slice is usually pageable memory (a `Vec`, the stack). For an asynchronous copy between
/// device memory and pageable host memory, the driver documents only that the call "might be
/// synchronous with respect to host", and that it "may synchronize with the stream and stage the
/// copy into pinned memory" (CUDA driver API, "API synchronization behavior"): it does not
/// promise that the host bytes have been read (host to device) or written (device to host) when
/// the call returns. So the copies here enqueue the copy on the stream given (after the work
/// already there) and then wait for that stream before returning: when `copy_from_slice`
/// returns, the source slice is no longer read and the data is in device memory; when
/// `copy_to_slice` or `to_vec` returns, the data is in the slice. Nothing relies on staging.
/// The borrow of the slice therefore ends with the call, and no host memory is touched by the
/// driver after it. Copies between device memory (views, buffers) stay asynchronous.
///
/// When waiting for the stream fails, the device is waited for instead; when that fails too, the
/// error is returned and the destination's contents are unspecified.
#[derive(Debug)]
pub struct DeviceView<'b, T> {
    buffer: &'b ScopedBuffer<'b>,
    ptr: DevicePtr,
    len: usize,
    _elements: PhantomData<&'b [T]>,
}

// Manual: a derive would require `T: Clone`, which a shared view does not need.
impl<T> Clone for DeviceView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DeviceView<'_, T> {}

/// A mutable, typed view of `len()` elements of type `T` in a buffer's memory.
///
/// Made by [`ScopedBuffer::view_mut`] (or `VirtualBuffer::view_mut` in `cuda-mem-vmm`). It
/// borrows its buffer exclusively, so the buffer cannot be freed, grown, read on the host or
/// written through anything else while the view lives:
///
/// ```compile_fail,E0499
/// # use cuda_mem_core::{Device, DeviceMemoryResource, MemoryResourceExt, Stream};
/// # fn f(device: Device, stream: &Stream) -> cuda_mem_core::Result<()> {
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let mut buffer = pool.allocate(1024, stream)?;
/// let mut view = buffer.view_mut::<u32>()?;
/// buffer.fill(cuda_mem_core::FillPattern::U8(0), stream)?; // error: `buffer` is borrowed by `view`
/// view.fill(7, stream)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DeviceViewMut<'b, T> {
    // Shared, though the view was made from `&'b mut`: that borrow excludes every other access
    // for `'b`, and only the shared methods (noting uses) are called through it.
    buffer: &'b ScopedBuffer<'b>,
    ptr: DevicePtr,
    len: usize,
    _elements: PhantomData<&'b mut [T]>,
}

/// Checks that the `size` bytes at `ptr` are a whole number of aligned `T`s, and counts them.
fn element_count<T: Pod>(ptr: DevicePtr, size: usize) -> Result<usize> {
    const { assert!(size_of::<T>() > 0, "a typed view needs elements of a non-zero size") };
    let element = std::any::type_name::<T>();
    let element_size = size_of::<T>();
    if !size.is_multiple_of(element_size) {
        return Err(Error::View(ViewError::Size { element, element_size, size }));
    }
    let align = align_of::<T>();
    if !(ptr as usize).is_multiple_of(align) {
        return Err(Error::View(ViewError::Alignment { element, align, ptr }));
    }
    Ok(size / element_size)
}

/// The elements `range` names in a view of `len`, as a start and a length.
pub(crate) fn checked_range(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(start), Some(end)) if start <= end && end <= len => Ok((start, end - start)),
        (start, end) => Err(Error::View(ViewError::SliceOutOfRange {
            start: start.unwrap_or(usize::MAX),
            end: end.unwrap_or(usize::MAX),
            len,
        })),
    }
}

impl<'a> ScopedBuffer<'a> {
    /// The buffer's bytes as a read-only view of `T`s.
    ///
    /// # Errors
    /// - [`ViewError::Size`] when the size is not a multiple of `size_of::<T>()`.
    /// - [`ViewError::Alignment`] when the address is not aligned for `T`.
    pub fn view<T: Pod>(&self) -> Result<DeviceView<'_, T>> {
        let len = element_count::<T>(self.ptr(), self.size())?;
        Ok(DeviceView { buffer: self, ptr: self.ptr(), len, _elements: PhantomData })
    }

    /// The buffer's bytes as a mutable view of `T`s.
    ///
    /// # Errors
    /// As [`view`](ScopedBuffer::view).
    pub fn view_mut<T: Pod>(&mut self) -> Result<DeviceViewMut<'_, T>> {
        let len = element_count::<T>(self.ptr(), self.size())?;
        let buffer: &ScopedBuffer<'a> = self;
        Ok(DeviceViewMut { buffer, ptr: buffer.ptr(), len, _elements: PhantomData })
    }

    /// Copies `src` into the buffer on `stream`, returning once the data is in the buffer (see
    /// [the notes on host memory](crate::DeviceView#host-memory)).
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] unless `src` has the buffer's size in bytes.
    /// - As [`view_mut`](ScopedBuffer::view_mut).
    /// - A driver error.
    pub fn copy_from_slice<T: Pod>(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        check_bytes("the host source", self.size(), size_of_val(src))?;
        self.view_mut::<T>()?.copy_from_slice(src, stream)
    }

    /// Copies the buffer into `dst` on `stream`, returning once the data is in `dst`.
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] unless `dst` has the buffer's size in bytes.
    /// - As [`view`](ScopedBuffer::view).
    /// - A driver error.
    pub fn copy_to_slice<T: Pod>(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        check_bytes("the host destination", self.size(), size_of_val(dst))?;
        self.view::<T>()?.copy_to_slice(dst, stream)
    }

    /// The buffer's contents as a `Vec<T>`, copied on `stream`.
    ///
    /// # Errors
    /// - As [`view`](ScopedBuffer::view).
    /// - A driver error.
    pub fn to_vec<T: Pod>(&self, stream: &Stream) -> Result<Vec<T>> {
        self.view::<T>()?.to_vec(stream)
    }
}

fn check_bytes(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual { Ok(()) } else { Err(Error::SizeMismatch { what, expected, actual }) }
}

impl<'b, T: Pod> DeviceView<'b, T> {
    /// The address of the first element.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The buffer it views.
    pub fn buffer(&self) -> &'b ScopedBuffer<'b> {
        self.buffer
    }

    /// The elements `range` names (`view.slice(2..10)`, `view.slice(..n)`), as a view of the
    /// same buffer.
    ///
    /// # Errors
    /// [`ViewError::SliceOutOfRange`] when the range does not lie within `0..len()`.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'b, T>> {
        let (start, len) = checked_range(range, self.len)?;
        let ptr = self.ptr + (start * size_of::<T>()) as DevicePtr;
        Ok(DeviceView { buffer: self.buffer, ptr, len, _elements: PhantomData })
    }

    /// Copies the elements into `dst` on `stream` and waits for the stream: when it returns,
    /// the data is in `dst` (see [the notes on host memory](DeviceView#host-memory)).
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] unless `dst` has `len()` elements.
    /// - A driver error.
    pub fn copy_to_slice(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        check_bytes("the host destination", self.byte_len(), size_of_val(dst))?;
        if dst.is_empty() {
            return Ok(());
        }
        let d = driver()?;
        let stream = stream.on_calling_thread();
        stream.bind_if_default()?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        // SAFETY: the view covers `byte_len()` bytes of its buffer, valid while the buffer is
        // borrowed, and `bytes` is valid for as many writes; the stream is waited for below,
        // before `bytes`' borrow ends, so the driver writes nothing after the return.
        unsafe {
            cu_call!(d, cuMemcpyDtoHAsync_v2(bytes.as_mut_ptr().cast(), self.ptr, bytes.len(), stream.handle()))
        }?;
        self.buffer.note_use(&stream);
        stream.synchronize_or_device()
    }

    /// The elements as a `Vec`, copied on `stream` (waiting for it, as
    /// [`copy_to_slice`](DeviceView::copy_to_slice)).
    ///
    /// # Errors
    /// A driver error.
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        self.copy_to_slice(&mut out, stream)?;
        Ok(out)
    }

    /// Copies the elements into `dst` on `stream` (asynchronously: device memory to device
    /// memory).
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] unless the lengths agree.
    /// - A driver error.
    pub fn copy_to(&self, dst: &mut DeviceViewMut<'_, T>, stream: &Stream) -> Result<()> {
        dst.copy_from(self, stream)
    }
}

impl<'b, T: Pod> DeviceViewMut<'b, T> {
    /// The buffer viewed (for noting the streams that use it).
    pub(crate) fn buffer(&self) -> &'b ScopedBuffer<'b> {
        self.buffer
    }

    /// This view, read-only, for as long as it is borrowed.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView { buffer: self.buffer, ptr: self.ptr, len: self.len, _elements: PhantomData }
    }

    /// The address of the first element.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The elements `range` names, read-only.
    ///
    /// # Errors
    /// [`ViewError::SliceOutOfRange`] when the range does not lie within `0..len()`.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        self.as_view().slice(range)
    }

    /// The elements `range` names, for writing, while this view is borrowed.
    ///
    /// # Errors
    /// [`ViewError::SliceOutOfRange`] when the range does not lie within `0..len()`.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (start, len) = checked_range(range, self.len)?;
        let ptr = self.ptr + (start * size_of::<T>()) as DevicePtr;
        Ok(DeviceViewMut { buffer: self.buffer, ptr, len, _elements: PhantomData })
    }

    /// As [`DeviceView::copy_to_slice`].
    ///
    /// # Errors
    /// As [`DeviceView::copy_to_slice`].
    pub fn copy_to_slice(&self, dst: &mut [T], stream: &Stream) -> Result<()> {
        self.as_view().copy_to_slice(dst, stream)
    }

    /// As [`DeviceView::to_vec`].
    ///
    /// # Errors
    /// As [`DeviceView::to_vec`].
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        self.as_view().to_vec(stream)
    }

    /// Copies `src` into the view on `stream` and waits for the stream: when it returns, the
    /// driver no longer reads `src` and the data is in device memory (see
    /// [the notes on host memory](DeviceView#host-memory)).
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] unless `src` has `len()` elements.
    /// - A driver error.
    pub fn copy_from_slice(&mut self, src: &[T], stream: &Stream) -> Result<()> {
        check_bytes("the host source", self.byte_len(), size_of_val(src))?;
        self.write_from_host(bytemuck::cast_slice(src), stream)
    }

    /// Enqueues the copy of `bytes` (as long as the view) and waits for the stream.
    fn write_from_host(&mut self, bytes: &[u8], stream: &Stream) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let d = driver()?;
        let stream = stream.on_calling_thread();
        stream.bind_if_default()?;
        // SAFETY: the view covers `bytes.len()` bytes of its buffer, valid while the buffer is
        // borrowed, and `bytes` is valid for as many reads; the stream is waited for below,
        // before `bytes`' borrow ends, so the driver reads nothing after the return.
        unsafe { cu_call!(d, cuMemcpyHtoDAsync_v2(self.ptr, bytes.as_ptr().cast(), bytes.len(), stream.handle())) }?;
        self.buffer.note_use(&stream);
        stream.synchronize_or_device()
    }

    /// Copies `src` into this view on `stream` (asynchronously: device memory to device
    /// memory). `src` may be a view of another buffer only: this one's is borrowed exclusively.
    ///
    /// # Errors
    /// - [`Error::SizeMismatch`] unless the lengths agree.
    /// - A driver error.
    pub fn copy_from(&mut self, src: &DeviceView<'_, T>, stream: &Stream) -> Result<()> {
        check_bytes("the destination view", src.byte_len(), self.byte_len())?;
        if self.len == 0 {
            return Ok(());
        }
        let d = driver()?;
        let stream = stream.on_calling_thread();
        stream.bind_if_default()?;
        // SAFETY: both views cover `byte_len()` bytes of buffers that stay valid until they are
        // freed, which is ordered after this work; they are of different buffers (this one's is
        // borrowed exclusively), so they do not overlap.
        unsafe { ffi::memcpy_async(d, self.ptr, src.ptr, self.byte_len(), stream.handle()) }?;
        self.buffer.note_use(&stream);
        src.buffer.note_use(&stream);
        Ok(())
    }

    /// Sets every element to `value` on `stream`. Values whose bytes are all equal (zero, say),
    /// and elements of 2 or 4 bytes that start at an address aligned to their size, are set by
    /// the device (`cuMemsetD*Async`, asynchronously); other values are copied from the host
    /// (and the stream waited for, as [`copy_from_slice`](DeviceViewMut::copy_from_slice)).
    ///
    /// # Errors
    /// A driver error.
    pub fn fill(&mut self, value: T, stream: &Stream) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let bytes = bytemuck::bytes_of(&value);
        // The wider memsets need an address aligned to their width, which an element type of
        // smaller alignment (`[u8; 2]`, `[u16; 2]`) does not promise.
        let aligned_to = |width: DevicePtr| self.ptr.is_multiple_of(width);
        let memset = match *bytes {
            [b, ..] if bytes.iter().all(|&x| x == b) => Some(Memset::D8(b, self.byte_len())),
            [a, b] if aligned_to(2) => Some(Memset::D16(u16::from_ne_bytes([a, b]), self.len)),
            [a, b, c, e] if aligned_to(4) => Some(Memset::D32(u32::from_ne_bytes([a, b, c, e]), self.len)),
            _ => None,
        };
        let Some(memset) = memset else {
            return self.copy_from_slice(&vec![value; self.len], stream);
        };
        let d = driver()?;
        let stream = stream.on_calling_thread();
        stream.bind_if_default()?;
        // SAFETY: the view covers `byte_len()` bytes (`count` units of the width) of its buffer,
        // valid until the buffer is freed, which is ordered after this work; D16 and D32 are
        // used only for elements of that size at an address aligned to it.
        unsafe { ffi::memset_async(d, self.ptr, memset, stream.handle()) }?;
        self.buffer.note_use(&stream);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_not_truncated() {
        assert_eq!(checked_range(.., 10).unwrap(), (0, 10));
        assert_eq!(checked_range(2..5, 10).unwrap(), (2, 3));
        assert_eq!(checked_range(2..=5, 10).unwrap(), (2, 4));
        assert_eq!(checked_range(10.., 10).unwrap(), (10, 0));
        assert_eq!(checked_range(..=9, 10).unwrap(), (0, 10));
        for bad in [checked_range(5..11, 10), checked_range(11.., 10), checked_range(..=10, 10)] {
            assert!(matches!(bad, Err(Error::View(ViewError::SliceOutOfRange { len: 10, .. }))), "{bad:?}");
        }
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = checked_range(6..5, 10);
        assert!(matches!(reversed, Err(Error::View(ViewError::SliceOutOfRange { start: 6, end: 5, len: 10 }))));
        let overflow = checked_range(..=usize::MAX, 10);
        assert!(matches!(overflow, Err(Error::View(ViewError::SliceOutOfRange { end: usize::MAX, .. }))));
        let excluded_start = (Bound::Excluded(usize::MAX), Bound::Unbounded);
        assert!(matches!(checked_range(excluded_start, 10), Err(Error::View(ViewError::SliceOutOfRange { .. }))));
    }

    #[test]
    fn element_counts_check_size_and_alignment() {
        assert_eq!(element_count::<f32>(0x1000, 16).unwrap(), 4);
        assert_eq!(element_count::<u8>(0x1001, 3).unwrap(), 3);
        assert_eq!(element_count::<f64>(0, 0).unwrap(), 0);
        let size = element_count::<f64>(0x1000, 12);
        assert!(matches!(size, Err(Error::View(ViewError::Size { element_size: 8, size: 12, .. }))), "{size:?}");
        let align = element_count::<u32>(0x1002, 8);
        assert!(matches!(align, Err(Error::View(ViewError::Alignment { align: 4, ptr: 0x1002, .. }))), "{align:?}");
        let message = element_count::<u16>(0x1000, 3).unwrap_err().to_string();
        assert!(message.contains("u16") && message.contains("3 bytes"), "{message}");
    }
}
