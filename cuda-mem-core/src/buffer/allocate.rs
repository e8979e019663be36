//! Allocating buffers: [`MemoryResourceExt`] (an `Arc` of any resource into owned buffers, or
//! a borrowed one into scoped buffers) and the constructors it calls. Every resource of this
//! crate also has `allocate` and `allocate_scoped` of its own (written beside it, calling the
//! same constructors), so that the everyday path needs no trait import. The typed conveniences
//! (`allocate_zeroed`, `allocate_from_slice`) are the trait's alone.

use std::sync::Arc;

use bytemuck::Pod;

use super::{Buffer, FillPattern, Owner, ScopedBuffer, StreamRef};
use crate::device::DevicePtr;
use crate::error::{Result, ViewError};
use crate::history::{self, MemoryEventKind, ResourceId};
use crate::memory_resource::MemoryResource;
use crate::stream::Stream;

impl<'a> ScopedBuffer<'a> {
    /// Allocates `size` bytes from `resource` on `stream`, borrowing both for as long as the
    /// buffer lives (an empty buffer, without asking the resource, when `size` is 0).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate_scoped(resource: &'a dyn MemoryResource, size: usize, stream: &'a Stream) -> Result<Self> {
        let stream = StreamRef::on_calling_thread(stream);
        let ptr = allocate_raw_or_empty(resource, size, &stream)?;
        Ok(ScopedBuffer::new(ptr, size, Owner::Borrowed(resource), Some(stream)))
    }

    /// [`allocate_scoped`](Self::allocate_scoped) from a resource whose type is known: its
    /// `allocate_raw` is called directly, inlined into the caller with everything on the way,
    /// instead of through the vtable (the allocation's every layer is a call otherwise).
    #[inline(always)]
    pub(crate) fn allocate_scoped_in<R: MemoryResource>(
        resource: &'a R,
        size: usize,
        stream: &'a Stream,
    ) -> Result<Self> {
        let stream = StreamRef::on_calling_thread(stream);
        let ptr = allocate_raw_or_empty(resource, size, &stream)?;
        Ok(ScopedBuffer::new(ptr, size, Owner::Borrowed(resource), Some(stream)))
    }
}

/// `size` bytes from `resource` on `stream`, or the null pointer of an empty buffer (without
/// asking the resource for memory, only telling it: `note_empty_allocation`) when `size` is 0.
#[inline(always)]
fn allocate_raw_or_empty<R: MemoryResource + ?Sized>(resource: &R, size: usize, stream: &Stream) -> Result<DevicePtr> {
    if size == 0 {
        resource.note_empty_allocation();
        Ok(0)
    } else {
        let ptr = resource.allocate_raw(size, stream)?;
        history::record(MemoryEventKind::Allocate, ptr, size, Some(stream), ResourceId::of(resource));
        Ok(ptr)
    }
}

impl Buffer {
    /// Allocates `size` bytes from `resource` on `stream` (an empty buffer, without asking the
    /// resource, when `size` is 0).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    pub fn allocate(resource: Arc<dyn MemoryResource>, size: usize, stream: &Stream) -> Result<Buffer> {
        // The stream the allocation goes to from this thread (see `allocate_scoped`).
        let stream = stream.on_calling_thread().into_owned();
        let ptr = allocate_raw_or_empty(&*resource, size, &stream)?;
        Ok(Buffer::new(ptr, size, Owner::Resource(resource), Some(StreamRef::Shared(stream))))
    }

    /// [`allocate`](Self::allocate) from a resource whose type is known: its `allocate_raw` is
    /// called directly, inlined into the caller, instead of through the vtable.
    #[inline(always)]
    pub(crate) fn allocate_in<R: MemoryResource + 'static>(
        resource: Arc<R>,
        size: usize,
        stream: &Stream,
    ) -> Result<Buffer> {
        let stream = stream.on_calling_thread().into_owned();
        let ptr = allocate_raw_or_empty(&*resource, size, &stream)?;
        Ok(Buffer::new(ptr, size, Owner::Resource(resource), Some(StreamRef::Shared(stream))))
    }
}

/// Allocation into an owned [`Buffer`] that keeps the resource alive.
pub trait MemoryResourceExt {
    /// Allocates `size` bytes on `stream`. A zero-size request makes an empty buffer without
    /// asking the resource.
    ///
    /// # Errors
    /// When the resource cannot allocate.
    fn allocate(&self, size: usize, stream: &Stream) -> Result<Buffer>;

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows the resource and
    /// the stream instead of holding shares of them: the cheapest allocation this crate makes,
    /// for buffers that live inside one scope (per request, per step). The borrows keep both
    /// alive; see [`ScopedBuffer`].
    ///
    /// # Errors
    /// When the resource cannot allocate.
    fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>>;

    /// Room for `len` elements of `T`, zeroed, on `stream` (cudarc's `alloc_zeros`).
    ///
    /// # Errors
    /// - [`ViewError::TooManyElements`] when `len` elements of `T` exceed `usize::MAX` bytes.
    /// - When the resource cannot allocate, or the fill fails.
    fn allocate_zeroed<T: Pod>(&self, len: usize, stream: &Stream) -> Result<Buffer> {
        let size = len
            .checked_mul(size_of::<T>())
            .ok_or(ViewError::TooManyElements { element: std::any::type_name::<T>(), len })?;
        let mut buffer = self.allocate(size, stream)?;
        buffer.fill(FillPattern::U8(0), stream)?;
        Ok(buffer)
    }

    /// A new buffer holding a copy of `data`, on `stream` (cudarc's `clone_htod`). It returns
    /// once `data` has been read, so the slice may change right after.
    ///
    /// # Errors
    /// When the resource cannot allocate, or the copy fails.
    fn allocate_from_slice<T: Pod>(&self, data: &[T], stream: &Stream) -> Result<Buffer> {
        let mut buffer = self.allocate(size_of_val(data), stream)?;
        buffer.copy_from_slice(data, stream)?;
        Ok(buffer)
    }
}

impl<R: MemoryResource + 'static> MemoryResourceExt for Arc<R> {
    #[inline]
    fn allocate(&self, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    #[inline]
    fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(&**self, size, stream)
    }
}

impl MemoryResourceExt for Arc<dyn MemoryResource> {
    #[inline]
    fn allocate(&self, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate(Arc::clone(self), size, stream)
    }

    #[inline]
    fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped(&**self, size, stream)
    }
}
