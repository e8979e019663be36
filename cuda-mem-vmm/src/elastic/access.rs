//! `ElasticAccess`: the memory of an elastic buffer, or mapped pages of an on-demand range, kept
//! mapped while the access lives.

use std::sync::RwLockReadGuard;

use cuda_mem_core::{Buffer, DeviceViewMut, FillPattern, ScopedBuffer, Stream};

use super::backing::Backing;
use super::group::Phase;
use crate::error::Result;

/// What keeps the memory mapped: the group's gate, or the range's pages, held for reading.
#[derive(Debug)]
pub(super) enum Gate<'a> {
    /// An [`ElasticGroup`](crate::ElasticGroup)'s: it neither sleeps nor wakes meanwhile.
    Group {
        /// Held, not read.
        _held: RwLockReadGuard<'a, Phase>,
    },
    /// An [`OnDemandRange`](crate::OnDemandRange)'s: it neither maps nor unmaps meanwhile.
    Pages {
        /// Held, not read.
        _held: RwLockReadGuard<'a, Backing>,
    },
}

/// Mapped elastic memory ([`ElasticBuffer::access`](crate::ElasticBuffer::access),
/// [`OnDemandRange::access`](crate::OnDemandRange::access)): a [`Buffer`] (through `Deref`) for
/// anything that takes one, its memory kept mapped while the access lives. Writes go through its
/// own methods, so that the `Buffer` inside cannot be swapped for another.
///
/// Work enqueued through it must be done, or ordered before the stream the memory's release
/// waits for, before that release (as for any buffer's free).
#[derive(Debug)]
pub struct ElasticAccess<'a> {
    _gate: Gate<'a>,
    buffer: Buffer,
}

impl<'a> ElasticAccess<'a> {
    /// `buffer`, a view of memory `gate` keeps mapped.
    pub(super) fn new(gate: Gate<'a>, buffer: Buffer) -> ElasticAccess<'a> {
        ElasticAccess { _gate: gate, buffer }
    }

    /// Copies `src` into the memory on `stream` (as [`Buffer::copy_from`]).
    ///
    /// # Errors
    /// As [`Buffer::copy_from`].
    pub fn copy_from(&mut self, src: &ScopedBuffer<'_>, stream: &Stream) -> Result<()> {
        Ok(self.buffer.copy_from(src, stream)?)
    }

    /// Fills the memory with `pattern` on `stream` (as [`Buffer::fill`]).
    ///
    /// # Errors
    /// As [`Buffer::fill`].
    pub fn fill(&mut self, pattern: FillPattern, stream: &Stream) -> Result<()> {
        Ok(self.buffer.fill(pattern, stream)?)
    }

    /// The bytes as a mutable typed view (as [`Buffer::view_mut`]).
    ///
    /// # Errors
    /// As [`Buffer::view_mut`].
    pub fn view_mut<T: cuda_mem_core::bytemuck::Pod>(&mut self) -> Result<DeviceViewMut<'_, T>> {
        Ok(self.buffer.view_mut()?)
    }
}

impl std::ops::Deref for ElasticAccess<'_> {
    type Target = Buffer;

    fn deref(&self) -> &Buffer {
        &self.buffer
    }
}
