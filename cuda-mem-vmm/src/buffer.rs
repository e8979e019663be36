//! `VirtualBuffer`: a buffer of a [`VirtualMemoryResource`], growable without copying.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cuda_mem_core::{Buffer, Result};

use crate::options::LocationType;
use crate::pieces::Range;
use crate::resource::VirtualMemoryResource;

/// A buffer over mapped virtual memory. It dereferences to a [`Buffer`] (copies, fills); the
/// memory goes when the last buffer mapping it is dropped (grown buffers share chunks with the
/// buffers they grew from), after the recorded stream's work.
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

impl DerefMut for VirtualBuffer {
    fn deref_mut(&mut self) -> &mut Buffer {
        &mut self.buffer
    }
}
