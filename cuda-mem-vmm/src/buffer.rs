//! `VirtualBuffer`: a buffer of a [`VirtualMemoryResource`], growable without copying.

use std::sync::Arc;

use cuda_mem_core::{Buffer, Device, DevicePtr, DeviceViewMut, FillPattern, ScopedBuffer, Stream};

use crate::error::{Result, VmmError};
use crate::pieces::Range;
use crate::resource::VirtualMemoryResource;

/// A buffer over mapped virtual memory: a [`Buffer`] of its [`VirtualMemoryResource`]
/// ([`as_buffer`](VirtualBuffer::as_buffer), for anything that takes one) and the range it maps,
/// which growth and export use. Writes go through its own
/// [`copy_from`](VirtualBuffer::copy_from) and [`fill`](VirtualBuffer::fill), so that the
/// `Buffer` inside cannot be replaced by another one (the range must stay the one its pointer
/// names).
///
/// The memory goes when the last buffer mapping it is gone (grown buffers share chunks with the
/// buffers they grew from), after the work enqueued through it: unmapping is not stream-ordered,
/// so its stream is synchronized first. If that stream is capturing when the buffer is dropped,
/// neither happens then. A capture begun through
/// [`Stream::begin_capture`](cuda_mem_core::Stream::begin_capture) takes the memory: it is
/// unmapped once the graph and every executable graph made from it are gone and their launches
/// done. Another capture (begun through a raw handle) cannot be followed: the release is
/// deferred until it has ended (see [`release_deferred`](crate::release_deferred)) and recorded
/// ([`take_drop_errors`](cuda_mem_core::take_drop_errors)), so its graph must not be launched
/// after that. [`close`](VirtualBuffer::close) refuses a capturing stream instead and gives the
/// buffer back.
///
/// ```compile_fail
/// # use cuda_mem_core::Buffer;
/// # use cuda_mem_vmm::VirtualBuffer;
/// // The `Buffer` inside cannot be swapped for another one.
/// fn replace(grown: VirtualBuffer, other: Buffer) {
///     *grown.as_buffer() = other;
/// }
/// ```
#[doc(alias = "VirtualMemoryBuffer")]
#[derive(Debug)]
pub struct VirtualBuffer {
    /// Freed (first, as declared first) through the resource, which lets go of its own share of
    /// the range after the stream's work.
    buffer: Buffer,
    range: Arc<Range>,
    resource: Arc<VirtualMemoryResource>,
    imported: bool,
}

/// A [`VirtualBuffer::close`] that did not happen, or failed.
#[derive(Debug)]
pub struct CloseError {
    /// What went wrong.
    pub error: VmmError,
    /// The buffer, given back whenever nothing was released ([`VmmError::CapturingStream`], the
    /// capture status could not be read, or the release failed): it still owns its memory.
    /// `None` only where the memory's fate is in the error. Boxed, so that the error stays small.
    pub buffer: Option<Box<VirtualBuffer>>,
}

impl std::fmt::Display for CloseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for CloseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl VirtualBuffer {
    /// `size` bytes of `range`, freed after `stream`'s work.
    pub(crate) fn new(
        range: Arc<Range>,
        size: usize,
        resource: Arc<VirtualMemoryResource>,
        imported: bool,
        stream: &Stream,
    ) -> VirtualBuffer {
        let buffer = resource.adopt(Arc::clone(&range), size, stream);
        VirtualBuffer { buffer, range, resource, imported }
    }

    pub(crate) fn range(&self) -> &Arc<Range> {
        &self.range
    }

    /// The buffer, for anything that takes a [`Buffer`] (copies, reads); it is owned by this
    /// virtual buffer's resource.
    pub fn as_buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// The address.
    #[doc(alias = "handle")]
    pub fn ptr(&self) -> DevicePtr {
        self.buffer.ptr()
    }

    /// The size in bytes (at most [`mapped_size`](VirtualBuffer::mapped_size)).
    pub fn size(&self) -> usize {
        self.buffer.size()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// The device the memory is on; `None` for host memory.
    #[doc(alias = "device_id")]
    pub fn device(&self) -> Option<Device> {
        self.buffer.device()
    }

    /// The stream the memory is released after.
    pub fn deallocation_stream(&self) -> Option<&Stream> {
        self.buffer.deallocation_stream()
    }

    /// The resource that allocated it (or imported it).
    pub fn resource(&self) -> &Arc<VirtualMemoryResource> {
        &self.resource
    }

    /// Whether it was imported from another process (it cannot be exported again).
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// How many physical chunks it spans.
    pub fn chunk_count(&self) -> usize {
        self.range.mappings.len()
    }

    /// The bytes mapped (at least its size).
    pub fn mapped_size(&self) -> usize {
        self.range.mapped_size()
    }

    /// Copies this buffer into `dst` on `stream` (as [`Buffer::copy_to`]).
    ///
    /// # Errors
    /// As [`Buffer::copy_to`].
    pub fn copy_to(&self, dst: &mut ScopedBuffer<'_>, stream: &Stream) -> Result<()> {
        Ok(self.buffer.copy_to(dst, stream)?)
    }

    /// Copies `src` into this buffer on `stream` (as [`Buffer::copy_from`]).
    ///
    /// # Errors
    /// As [`Buffer::copy_from`].
    pub fn copy_from(&mut self, src: &ScopedBuffer<'_>, stream: &Stream) -> Result<()> {
        Ok(self.buffer.copy_from(src, stream)?)
    }

    /// The buffer's bytes as a mutable typed view (as [`Buffer::view_mut`]), for writing Rust
    /// data into it ([`DeviceViewMut::copy_from_slice`]); read through
    /// [`as_buffer`](VirtualBuffer::as_buffer)`().view()`. The view borrows this buffer
    /// exclusively, so it cannot be closed or dropped while the view lives.
    ///
    /// # Errors
    /// As [`Buffer::view_mut`].
    pub fn view_mut<T: cuda_mem_core::bytemuck::Pod>(&mut self) -> Result<DeviceViewMut<'_, T>> {
        Ok(self.buffer.view_mut()?)
    }

    /// Fills this buffer with `pattern` on `stream` (as [`Buffer::fill`]).
    ///
    /// # Errors
    /// As [`Buffer::fill`].
    pub fn fill(&mut self, pattern: FillPattern, stream: &Stream) -> Result<()> {
        Ok(self.buffer.fill(pattern, stream)?)
    }

    /// Makes `stream` the one whose work the unmapping waits for (as
    /// [`Buffer::set_deallocation_stream`]; work on other streams used through the buffer is
    /// ordered before it).
    pub fn set_deallocation_stream(&mut self, stream: &Stream) {
        self.buffer.set_deallocation_stream(stream);
    }

    /// A buffer of `new_size` bytes covering this one's (see [`VirtualMemoryResource::grow`]).
    ///
    /// # Errors
    /// As [`VirtualMemoryResource::grow`].
    #[doc(alias = "modify_allocation")]
    pub fn grow(&self, new_size: usize) -> Result<VirtualBuffer> {
        self.resource.grow(self, new_size)
    }

    /// Releases the buffer now, after the work of `stream` (or of the recorded stream), and says
    /// whether that worked: the memory is unmapped once no other buffer maps it.
    ///
    /// A capturing stream is refused, as by cuda.core: unmapping cannot be captured, and waiting
    /// for the stream would disturb the capture. Close it once the capture has ended.
    ///
    /// # Errors
    /// - [`VmmError::CapturingStream`] with the buffer given back, unchanged (also when the capture
    ///   status cannot be read, with that error).
    /// - When the release itself fails the error is returned with the buffer too, still owning its
    ///   memory. A release that could not wait for the stream is not a failure: it is deferred and
    ///   recorded (see [`VmmError::ReleaseDeferred`]).
    pub fn close(mut self, stream: Option<&Stream>) -> Result<(), CloseError> {
        if let Some(chosen) = stream.or(self.buffer.deallocation_stream()) {
            match chosen.is_capturing() {
                Ok(false) => {}
                Ok(true) => return Err(CloseError { error: VmmError::CapturingStream, buffer: Some(Box::new(self)) }),
                Err(error) => return Err(CloseError { error: error.into(), buffer: Some(Box::new(self)) }),
            }
        }
        if let Some(stream) = stream {
            self.buffer.set_deallocation_stream(stream);
        }
        let VirtualBuffer { buffer, range, resource, imported } = self;
        match buffer.close(None) {
            // After the release above waited for the stream (or deferred it with its own share).
            Ok(()) => Ok(()),
            // Not freed: the buffer comes back whole, still owning its memory.
            Err(failed) => {
                let (buffer, error) = failed.into_parts();
                let buffer = Some(Box::new(VirtualBuffer { buffer, range, resource, imported }));
                Err(CloseError { error: error.into(), buffer })
            }
        }
    }
}
