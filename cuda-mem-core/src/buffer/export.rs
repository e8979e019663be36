//! A buffer's export data for another process ([`MemoryPool::export_buffer`]), made once and
//! kept with the buffer. Written here, beside the buffer's slot, rather than with the pool:
//! the pool knows nothing of buffers.

use super::ScopedBuffer;
use crate::error::{Result, SharingError};
use crate::pool::{EXPORT_DATA_LEN, MemoryPool};
use crate::resources::CachingResource;

/// A buffer's export data, kept in the buffer once made: the pool it was exported through (by
/// handle: the buffer keeps its pool alive, so the handle cannot name another pool meanwhile)
/// and the data.
#[derive(Debug)]
pub(super) struct CachedExport {
    pool: usize,
    data: [u8; EXPORT_DATA_LEN],
}

impl MemoryPool {
    /// The export data of `buffer`, an allocation of this pool: as
    /// [`MemoryPool::export_pointer`] of its address the first time, then the same data again,
    /// kept in the buffer, without a driver call. The data describes the allocation, which does
    /// not change while the buffer lives; it goes with the buffer, so a later allocation at the
    /// same address starts without it (as cuda.core keeps a buffer's IPC descriptor once made).
    ///
    /// A view (a buffer that owns no memory) is exported each time, as its address is.
    ///
    /// # Errors
    /// - [`SharingError::CachedBlock`]: a buffer of a [`CachingResource`] (directly or through
    ///   adaptors), a block of a larger segment that the driver would export whole.
    /// - As [`MemoryPool::export_pointer`] (a failed export keeps nothing).
    #[doc(alias = "get_ipc_descriptor")]
    pub fn export_buffer(&self, buffer: &ScopedBuffer<'_>) -> Result<[u8; EXPORT_DATA_LEN]> {
        let data = self.export_buffer_data(buffer)?;
        let pool = crate::history::ResourceId(self.handle() as usize as u64);
        crate::history::record(crate::history::MemoryEventKind::Export, buffer.ptr(), buffer.size(), None, pool);
        Ok(data)
    }

    /// [`export_buffer`](MemoryPool::export_buffer) but for the history.
    fn export_buffer_data(&self, buffer: &ScopedBuffer<'_>) -> Result<[u8; EXPORT_DATA_LEN]> {
        let pool = self.handle() as usize;
        let Some(resource) = buffer.memory_resource() else {
            return self.export_pointer(buffer.ptr());
        };
        if CachingResource::serves(resource) {
            return Err(SharingError::CachedBlock { ptr: buffer.ptr(), size: buffer.size() }.into());
        }
        let slot = &buffer.export;
        if let Some(cached) = slot.get() {
            if cached.pool == pool {
                return Ok(cached.data);
            }
            // Asked of another pool than the first time: its own answer, not kept.
            return self.export_pointer(buffer.ptr());
        }
        let data = self.export_pointer(buffer.ptr())?;
        // Two threads exporting at once both got the same data; the first one set is kept.
        let _ = slot.set(Box::new(CachedExport { pool, data }));
        Ok(data)
    }
}
