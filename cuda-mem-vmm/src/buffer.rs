//! `VirtualBuffer`: a buffer of a [`VirtualMemoryResource`], growable without copying.

use std::ops::Deref;
use std::sync::Arc;

use cuda_mem_core::{Buffer, FillPattern, Result, Stream};

use crate::options::LocationType;
use crate::pieces::Range;
use crate::resource::VirtualMemoryResource;

/// A buffer over mapped virtual memory. It dereferences to a [`Buffer`] for reading (pointer,
/// size, copies out); writes go through its own [`copy_from`](VirtualBuffer::copy_from) and
/// [`fill`](VirtualBuffer::fill), so that the `Buffer` inside cannot be replaced by another one
/// (the range it maps, which export and growth use, must stay the one its pointer names). The
/// memory goes when the last buffer mapping it is dropped (grown buffers share chunks with the
/// buffers they grew from), after the work enqueued through it.
///
/// ```compile_fail
/// # use cuda_mem_core::Buffer;
/// # use cuda_mem_vmm::VirtualBuffer;
/// // The `Buffer` inside cannot be swapped for another one.
/// fn replace(mut grown: VirtualBuffer, other: Buffer) {
///     *grown = other;
/// }
/// ```
#[derive(Debug)]
pub struct VirtualBuffer {
    buffer: Buffer,
    range: Arc<Range>,
    resource: Arc<VirtualMemoryResource>,
    imported: bool,
}

impl VirtualBuffer {
    pub(crate) fn new(
        range: Arc<Range>,
        size: usize,
        resource: Arc<VirtualMemoryResource>,
        imported: bool,
    ) -> VirtualBuffer {
        let device = (resource.options().location_type == LocationType::Device).then(|| resource.device());
        let keep_alive: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(&range) as _;
        // SAFETY: the view covers `size` bytes mapped by `range` (at most its mapped size), which
        // it keeps alive; the memory is device memory, never lent to the host.
        let buffer = unsafe { Buffer::from_raw(range.base, size, device, true, false, Some(keep_alive)) };
        VirtualBuffer { buffer, range, resource, imported }
    }

    pub(crate) fn range(&self) -> &Arc<Range> {
        &self.range
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

    /// Copies `src` into this buffer on `stream` (as [`Buffer::copy_from`]).
    ///
    /// # Errors
    /// As [`Buffer::copy_from`].
    pub fn copy_from(&mut self, src: &Buffer, stream: &Stream) -> Result<()> {
        self.buffer.copy_from(src, stream)
    }

    /// Fills this buffer with `pattern` on `stream` (as [`Buffer::fill`]).
    ///
    /// # Errors
    /// As [`Buffer::fill`].
    pub fn fill(&mut self, pattern: FillPattern, stream: &Stream) -> Result<()> {
        self.buffer.fill(pattern, stream)
    }

    /// Makes `stream` the one whose work the unmapping waits for first (as
    /// [`Buffer::set_deallocation_stream`]; other streams used through the buffer are waited for
    /// too).
    pub fn set_deallocation_stream(&mut self, stream: &Stream) {
        self.buffer.set_deallocation_stream(stream);
    }

    /// A buffer of `new_size` bytes covering this one's (see [`VirtualMemoryResource::grow`]).
    ///
    /// # Errors
    /// As [`VirtualMemoryResource::grow`].
    pub fn grow(&self, new_size: usize) -> Result<VirtualBuffer> {
        self.resource.grow(self, new_size)
    }
}

impl Drop for VirtualBuffer {
    fn drop(&mut self) {
        // Unmapping is not stream-ordered: before this view lets go of the range (possibly its
        // last holder), wait for the work enqueued through it on any stream.
        if let Err(error) = self.buffer.wait_for_uses() {
            cuda_mem_core::record_drop_error("virtual memory buffer (waiting for its streams)", error);
        }
    }
}

impl Deref for VirtualBuffer {
    type Target = Buffer;

    fn deref(&self) -> &Buffer {
        &self.buffer
    }
}
