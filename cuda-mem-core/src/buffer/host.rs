//! Host slices of a buffer's bytes: lent once every stream the buffer was used on has finished,
//! never for memory that other processes may write (through the safe API), and for managed
//! memory only where host access may overlap device work (or once every device is idle).

use std::sync::OnceLock;

use super::ScopedBuffer;
use crate::device::Device;
use crate::driver::driver;
use crate::error::{Error, ManagedError, Result};
use crate::ffi;

impl<'a> ScopedBuffer<'a> {
    fn check_host_accessible(&self) -> Result<()> {
        if self.is_host_accessible() {
            Ok(())
        } else {
            Err(Error::NotHostAccessible { ptr: self.ptr, size: self.size })
        }
    }

    /// Refuses to lend a host slice of memory that others may write (see
    /// [`MemoryResource::may_be_written_externally`]).
    fn refuse_if_written_elsewhere(&self) -> Result<()> {
        let elsewhere =
            self.is_host_accessible() && self.memory_resource().is_some_and(|r| r.may_be_written_externally());
        if elsewhere { Err(Error::WritableElsewhere { ptr: self.ptr, size: self.size }) } else { Ok(()) }
    }

    /// The bytes, for reading on the host, once every stream the buffer was used on has
    /// finished. Only for host-accessible buffers of memory that nothing else writes.
    ///
    /// # Errors
    /// - [`Error::NotHostAccessible`] for device-only memory.
    /// - [`Error::WritableElsewhere`] for memory other processes may write (a buffer of an
    ///   IPC-enabled pool: read it with [`copy_to_slice`](ScopedBuffer::copy_to_slice), or see
    ///   [`host_slice_assume_exclusive`](ScopedBuffer::host_slice_assume_exclusive)).
    /// - A driver error from synchronizing.
    pub fn host_slice(&self) -> Result<&[u8]> {
        self.refuse_if_written_elsewhere()?;
        // SAFETY: nothing but this process's buffers writes the memory (checked above).
        unsafe { self.host_slice_assume_exclusive() }
    }

    /// The bytes, for writing on the host, once every stream the buffer was used on has
    /// finished. Only for host-accessible buffers of memory that nothing else writes.
    ///
    /// # Errors
    /// As [`host_slice`](ScopedBuffer::host_slice).
    pub fn host_slice_mut(&mut self) -> Result<&mut [u8]> {
        self.refuse_if_written_elsewhere()?;
        // SAFETY: nothing but this process's buffers writes the memory (checked above).
        unsafe { self.host_slice_mut_assume_exclusive() }
    }

    /// [`host_slice`](ScopedBuffer::host_slice) without refusing memory that other processes
    /// may write (a buffer of an IPC-enabled pool), for when the application knows they do not
    /// while the slice lives (a protocol that hands the bytes back and forth, say).
    ///
    /// # Safety
    /// No other process, and no importer of the memory in this one (through `cuda-mem-ipc`, or
    /// any other mapping of it), writes these bytes while the returned slice lives.
    ///
    /// # Errors
    /// - [`Error::NotHostAccessible`] for device-only memory.
    /// - [`ManagedError::HostAccessNotConcurrent`](crate::ManagedError::HostAccessNotConcurrent)
    ///   for managed memory where a device lacks concurrent managed access (see
    ///   [`host_slice_devices_idle`](ScopedBuffer::host_slice_devices_idle)).
    /// - A driver error from synchronizing.
    pub unsafe fn host_slice_assume_exclusive(&self) -> Result<&[u8]> {
        self.check_host_accessible()?;
        check_host_access(self)?;
        // SAFETY: forwarded from the caller; host access may overlap device work (checked).
        unsafe { self.host_slice_unchecked_concurrency() }
    }

    /// The host slice once the buffer's streams are done, without the managed-memory check.
    ///
    /// # Safety
    /// As [`host_slice_assume_exclusive`](ScopedBuffer::host_slice_assume_exclusive), and host
    /// access to the memory may overlap device work (it is not managed memory, every device has
    /// concurrent managed access, or no device work runs while the slice lives).
    pub(crate) unsafe fn host_slice_unchecked_concurrency(&self) -> Result<&[u8]> {
        self.check_host_accessible()?;
        self.wait_for_uses()?;
        if self.size == 0 {
            return Ok(&[]);
        }
        // SAFETY: the memory is host-accessible, `size` bytes long and valid while `self` lives;
        // device work on it through this buffer has completed, new device writes need
        // `&mut self`, and nothing else writes it (the caller's promise).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.size) })
    }

    /// [`host_slice_mut`](ScopedBuffer::host_slice_mut) without refusing memory that other
    /// processes may write; see
    /// [`host_slice_assume_exclusive`](ScopedBuffer::host_slice_assume_exclusive).
    ///
    /// # Safety
    /// No other process, and no importer of the memory in this one, reads or writes these bytes
    /// while the returned slice lives.
    ///
    /// # Errors
    /// As [`host_slice_assume_exclusive`](ScopedBuffer::host_slice_assume_exclusive).
    pub unsafe fn host_slice_mut_assume_exclusive(&mut self) -> Result<&mut [u8]> {
        self.check_host_accessible()?;
        check_host_access(self)?;
        // SAFETY: forwarded from the caller; host access may overlap device work (checked).
        unsafe { self.host_slice_mut_unchecked_concurrency() }
    }

    /// [`host_slice_unchecked_concurrency`](ScopedBuffer::host_slice_unchecked_concurrency), for
    /// writing.
    ///
    /// # Safety
    /// As [`host_slice_mut_assume_exclusive`](ScopedBuffer::host_slice_mut_assume_exclusive),
    /// and host access may overlap device work.
    pub(crate) unsafe fn host_slice_mut_unchecked_concurrency(&mut self) -> Result<&mut [u8]> {
        self.check_host_accessible()?;
        self.wait_for_uses()?;
        if self.size == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `host_slice_assume_exclusive`, and `&mut self` excludes every other
        // access through this process's buffers.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.size) })
    }

    /// [`host_slice`](ScopedBuffer::host_slice) for managed memory on a system where a device
    /// lacks concurrent managed access (which `host_slice` refuses there): synchronizes every
    /// device, then lends the bytes.
    ///
    /// # Safety
    /// No device work is launched, from any thread, while the slice lives (on such a system a
    /// host access during device work faults); and as for
    /// [`host_slice`](ScopedBuffer::host_slice), nothing else writes the bytes.
    ///
    /// # Errors
    /// - [`Error::NotHostAccessible`].
    /// - A driver error from synchronizing.
    pub unsafe fn host_slice_devices_idle(&self) -> Result<&[u8]> {
        self.wait_for_every_device()?;
        // SAFETY: every device is idle and stays so (the caller's promise); the rest is
        // forwarded.
        unsafe { self.host_slice_unchecked_concurrency() }
    }

    /// [`host_slice_devices_idle`](ScopedBuffer::host_slice_devices_idle), for writing.
    ///
    /// # Safety
    /// As [`host_slice_devices_idle`](ScopedBuffer::host_slice_devices_idle), and nothing else
    /// reads the bytes either.
    ///
    /// # Errors
    /// As [`host_slice_devices_idle`](ScopedBuffer::host_slice_devices_idle).
    pub unsafe fn host_slice_mut_devices_idle(&mut self) -> Result<&mut [u8]> {
        self.wait_for_every_device()?;
        // SAFETY: as in `host_slice_devices_idle`.
        unsafe { self.host_slice_mut_unchecked_concurrency() }
    }

    fn wait_for_every_device(&self) -> Result<()> {
        if !self.is_host_accessible() {
            return Err(Error::NotHostAccessible { ptr: self.ptr(), size: self.size() });
        }
        Device::all()?.into_iter().try_for_each(|device| device.synchronize())
    }
}

/// Whether `buffer`'s memory is managed: its resource says so, or the driver does.
pub(crate) fn is_managed(buffer: &ScopedBuffer<'_>) -> Result<bool> {
    if buffer.is_empty() {
        return Ok(false);
    }
    if buffer.memory_resource().is_some_and(|r| r.is_managed()) {
        return Ok(true);
    }
    // Memory the driver does not know (pageable host memory) is not managed.
    Ok(ffi::pointer_is_managed(driver()?, buffer.ptr()).unwrap_or(false))
}

/// Whether host access to managed memory may overlap device work: every device has concurrent
/// managed access (asked once per process: the attribute does not change).
fn host_access_is_concurrent() -> Result<bool> {
    static CONCURRENT: OnceLock<bool> = OnceLock::new();
    if let Some(&concurrent) = CONCURRENT.get() {
        return Ok(concurrent);
    }
    let mut concurrent = true;
    for device in Device::all()? {
        concurrent &= device.concurrent_managed_access()?;
    }
    Ok(*CONCURRENT.get_or_init(|| concurrent))
}

/// [`ManagedError::HostAccessNotConcurrent`] for a host slice of managed memory where a device lacks
/// concurrent managed access (the buffer's own resource tells; views of managed memory are
/// asked of the driver).
fn check_host_access(buffer: &ScopedBuffer<'_>) -> Result<()> {
    if buffer.is_empty() || host_access_is_concurrent()? || !is_managed(buffer)? {
        return Ok(());
    }
    Err(Error::Managed(ManagedError::HostAccessNotConcurrent { ptr: buffer.ptr(), size: buffer.size() }))
}
