//! Managed memory operations: advice, prefetches, discards and the range attributes that report
//! them (cuda.core's `ManagedBuffer`, `Host` and `cuda.core.utils.prefetch_batch` & co.).
//!
//! The operations live on a checked handle, not on every buffer: [`ScopedBuffer::managed`]
//! (and [`ScopedBuffer::managed_mut`]) return a [`ManagedBuffer`] only for managed memory (a
//! buffer of a [`ManagedMemoryResource`](crate::ManagedMemoryResource), or any buffer whose
//! pointer the driver reports as managed, such as a view of `cuMemAllocManaged` memory), so an
//! operation on other memory fails once, with [`ManagedError::NotManaged`], before any driver call.
//! Discards destroy the contents, so they need the exclusive handle ([`ManagedBufferMut`]),
//! which no host slice of the buffer can outlive.

use std::ffi::c_void;

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUmem_range_attribute, CUmemLocation, CUmemLocationType};

use crate::advice::Advice;
use crate::buffer::{ScopedBuffer, is_managed};
use crate::device::Device;
use crate::device::DevicePtr;
use crate::driver::driver;
use crate::driver_version::DriverCapability;
use crate::error::{Error, ManagedError, Result};
use crate::location::Location;
use crate::stream::Stream;

/// A location the driver reported as a type and an id; `None` for no location (pages that
/// disagree, or none recorded).
fn from_reported(type_: i32, id: i32) -> Result<Option<Location>> {
    Location::from_raw(CUmemLocation { type_: CUmemLocationType(type_ as u32), id })
        // A range attribute reports where pages are, never "the calling thread's node".
        .map(|location| location.filter(|l| *l != Location::HostNumaCurrent))
}

/// A location as CUDA 8.0's range attributes report it: a device ordinal, `CU_DEVICE_CPU` for
/// the host, `None` for anything else (`CU_DEVICE_INVALID`: no location).
fn from_legacy(id: i32) -> Result<Option<Location>> {
    Ok(match id {
        CU_DEVICE_CPU => Some(Location::Host),
        id if id >= 0 => Some(Location::Device(Device::new(id as usize)?)),
        _ => None,
    })
}

/// `CU_DEVICE_CPU`: the host, where CUDA 8.0's managed-memory calls take a device ordinal.
const CU_DEVICE_CPU: i32 = -1;

/// The installed driver's version when it lacks the `CUmemLocation` forms of advice and
/// prefetches ([`DriverCapability::ManagedLocations`]), whose CUDA 8.0 forms take a device
/// ordinal instead; `None` when it has them.
fn before_locations() -> Result<Option<u32>> {
    let installed = crate::driver::installed_version()?;
    Ok((installed < DriverCapability::ManagedLocations.needs()).then_some(installed))
}

/// `location` as CUDA 8.0's `cuMemAdvise` and `cuMemPrefetchAsync` take it: a device ordinal or
/// `CU_DEVICE_CPU`; a host NUMA node, which they cannot name, is [`Error::DriverTooOld`].
fn legacy_device(location: Location, installed: u32) -> Result<i32> {
    match location {
        Location::Device(device) => Ok(device.raw()),
        Location::Host => Ok(CU_DEVICE_CPU),
        Location::HostNuma(_) | Location::HostNumaCurrent => Err(DriverCapability::ManagedLocations.too_old(installed)),
    }
}

/// A managed buffer, checked: the advice, prefetch and range-attribute operations of cuda.core's
/// `ManagedBuffer`. Made by [`ScopedBuffer::managed`]; it borrows the buffer.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, Location, ManagedMemoryResource, Stream, StreamOptions, prefetch_batch};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let resource = ManagedMemoryResource::new(Default::default())?;
/// let mut buffer = resource.allocate(1 << 20, &stream)?;
/// buffer.host_slice_mut()?.fill(1); // managed memory: the host writes it directly
///
/// // cuda.core: buf.read_mostly = True; buf.preferred_location = Device(0);
/// // buf.accessed_by.add(Host()); buf.prefetch(Device(0), stream=s)
/// let managed = buffer.managed()?; // ManagedError::NotManaged for other memory
/// managed.set_read_mostly(true)?;
/// managed.set_preferred_location(device)?;
/// managed.add_accessed_by(Location::Host)?;
/// managed.prefetch(device, &stream)?;
/// assert_eq!(managed.last_prefetch_location()?, Some(Location::Device(device)));
/// assert_eq!(managed.accessed_by()?, [Location::Host]);
///
/// // Many buffers in one driver call, one location for all or one each.
/// let other = resource.allocate(4096, &stream)?;
/// prefetch_batch([&buffer, &other], &[Location::Host, Location::Device(device)][..], &stream)?;
///
/// // Discarding destroys the contents, so it takes the buffer exclusively.
/// buffer.managed_mut()?.discard_prefetch(device, &stream)?;
/// stream.synchronize()?;
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
///
/// Not `Copy` or `Clone`: a [`ManagedBufferMut`] lends its `ManagedBuffer` by reference only,
/// so no copy of it can keep the buffer borrowed past the exclusive handle's discards.
#[derive(Debug)]
pub struct ManagedBuffer<'b, 'a> {
    buffer: &'b ScopedBuffer<'a>,
}

/// A managed buffer, checked and borrowed exclusively: everything [`ManagedBuffer`] does, and
/// the discards, which destroy the contents (no host slice of the buffer can be alive). Made by
/// [`ScopedBuffer::managed_mut`].
#[derive(Debug)]
pub struct ManagedBufferMut<'b, 'a> {
    /// Made from the `&'b mut` borrow, which nothing else can use while this lives.
    shared: ManagedBuffer<'b, 'a>,
}

impl<'b, 'a> std::ops::Deref for ManagedBufferMut<'b, 'a> {
    type Target = ManagedBuffer<'b, 'a>;

    fn deref(&self) -> &ManagedBuffer<'b, 'a> {
        &self.shared
    }
}

impl<'a> ScopedBuffer<'a> {
    /// The managed-memory operations of this buffer, or [`ManagedError::NotManaged`] when its memory is
    /// not managed (its resource says so, or, for other buffers, the driver's
    /// `CU_POINTER_ATTRIBUTE_IS_MANAGED`; a view of managed *pool* memory, which the driver does
    /// not report as managed, is not recognized: keep the resource's buffer instead).
    ///
    /// # Errors
    /// - [`ManagedError::NotManaged`].
    /// - A driver error from the pointer query.
    pub fn managed(&self) -> Result<ManagedBuffer<'_, 'a>> {
        check_managed(self, "managed")?;
        Ok(ManagedBuffer { buffer: self })
    }

    /// [`managed`](ScopedBuffer::managed), borrowing the buffer exclusively, for the discards.
    ///
    /// # Errors
    /// As [`managed`](ScopedBuffer::managed).
    pub fn managed_mut(&mut self) -> Result<ManagedBufferMut<'_, 'a>> {
        check_managed(self, "managed_mut")?;
        Ok(ManagedBufferMut { shared: ManagedBuffer { buffer: self } })
    }
}

/// [`ManagedError::NotManaged`] unless `buffer`'s memory is managed.
fn check_managed(buffer: &ScopedBuffer<'_>, operation: &'static str) -> Result<()> {
    if is_managed(buffer)? {
        Ok(())
    } else {
        Err(Error::Managed(ManagedError::NotManaged { operation, ptr: buffer.ptr(), size: buffer.size() }))
    }
}

impl<'b, 'a> ManagedBuffer<'b, 'a> {
    /// The buffer, borrowed from this handle (so from a [`ManagedBufferMut`] only while its
    /// discards wait).
    ///
    /// ```compile_fail,E0502
    /// # use cuda_mem_core::{Device, ManagedMemoryResource, Stream, StreamOptions};
    /// # fn f(resource: std::sync::Arc<ManagedMemoryResource>, stream: &Stream) -> cuda_mem_core::Result<()> {
    /// let mut buffer = resource.allocate(4096, stream)?;
    /// let mut exclusive = buffer.managed_mut()?;
    /// let bytes: &[u8] = exclusive.buffer().host_slice()?;
    /// exclusive.discard(stream)?; // error: `exclusive` is borrowed by `bytes`
    /// println!("{}", bytes[0]);
    /// # Ok(()) }
    /// ```
    pub fn buffer(&self) -> &ScopedBuffer<'a> {
        self.buffer
    }

    /// Gives `advice` for the whole buffer, with `location` where the advice uses one (the
    /// driver ignores it for the read-mostly advice and for unsetting the preferred location).
    ///
    /// # Errors
    /// - [`ManagedError::AdviceLocation`] when the advice does not take the location (before any
    ///   driver call).
    /// - [`Error::DriverTooOld`] before CUDA 12.2 ([`DriverCapability::ManagedLocations`]) for a
    ///   host NUMA location the advice uses (devices and the host go through CUDA 8.0's
    ///   `cuMemAdvise` there).
    /// - A driver error.
    #[doc(alias = "cuMemAdvise")]
    pub fn advise(&self, advice: Advice, location: Location) -> Result<()> {
        if !advice.accepts(location) {
            return Err(Error::Managed(ManagedError::AdviceLocation { advice, location }));
        }
        let d = driver()?;
        let (ptr, size) = (self.buffer.ptr(), self.buffer.size());
        if let Some(installed) = before_locations()? {
            // CUDA 8.0's form ignores the device for advice that takes no location, as `_v2` does.
            let device = if advice.uses_location() { legacy_device(location, installed)? } else { CU_DEVICE_CPU };
            bind_for(self.buffer)?;
            // SAFETY: the range is the buffer's, valid while it lives; no pointers are passed.
            unsafe { cu_call!(d, cuMemAdvise_v1(ptr, size, advice.raw(), device) as "cuMemAdvise") }?;
            return Ok(());
        }
        bind_for(self.buffer)?;
        // SAFETY: the range is the buffer's, valid while it lives; no pointers are passed.
        unsafe { cu_call!(d, cuMemAdvise_v2(ptr, size, advice.raw(), location.raw())) }?;
        Ok(())
    }

    /// Whether every page is advised read-mostly.
    ///
    /// # Errors
    /// A driver error.
    #[doc(alias = "CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY")]
    pub fn read_mostly(&self) -> Result<bool> {
        Ok(self.range_attributes([CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY])?[0] != 0)
    }

    /// Advises the memory read-mostly, or undoes it.
    ///
    /// # Errors
    /// A driver error.
    #[doc(alias = "read_mostly")]
    pub fn set_read_mostly(&self, read_mostly: bool) -> Result<()> {
        let advice = if read_mostly { Advice::SetReadMostly } else { Advice::UnsetReadMostly };
        self.advise(advice, Location::Host)
    }

    /// The preferred location every page agrees on (a host NUMA node named, with its node),
    /// `None` when there is none or the pages disagree. Before CUDA 12.2 the driver names no
    /// NUMA node: a host location is [`Location::Host`].
    ///
    /// # Errors
    /// A driver error.
    #[doc(alias = "CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION")]
    pub fn preferred_location(&self) -> Result<Option<Location>> {
        use CUmem_range_attribute as A;
        if before_locations()?.is_some() {
            let [id] = self.range_attributes([A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION])?;
            return from_legacy(id);
        }
        let [type_, id] = self.range_attributes([
            A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE,
            A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID,
        ])?;
        from_reported(type_, id)
    }

    /// Sets the preferred location (any kind).
    ///
    /// # Errors
    /// A driver error (a device without concurrent managed access, say).
    #[doc(alias = "preferred_location")]
    pub fn set_preferred_location(&self, location: impl Into<Location>) -> Result<()> {
        self.advise(Advice::SetPreferredLocation, location.into())
    }

    /// Drops the preferred location.
    ///
    /// # Errors
    /// A driver error.
    pub fn unset_preferred_location(&self) -> Result<()> {
        self.advise(Advice::UnsetPreferredLocation, Location::Host)
    }

    /// The processors (devices, and the host as [`Location::Host`]) advised to access the whole
    /// buffer, read from the driver.
    ///
    /// # Errors
    /// A driver error.
    #[doc(alias = "CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY")]
    pub fn accessed_by(&self) -> Result<Vec<Location>> {
        // One slot per device and one for the host: room for every answer.
        let mut ids = vec![-2i32; Device::count()? + 1];
        let d = driver()?;
        bind_for(self.buffer)?;
        // SAFETY: `ids` is valid for `ids.len() * 4` bytes of writes.
        unsafe {
            cu_call!(
                d,
                cuMemRangeGetAttribute(
                    ids.as_mut_ptr().cast::<c_void>(),
                    ids.len() * 4,
                    CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY,
                    self.buffer.ptr(),
                    self.buffer.size()
                )
            )
        }?;
        let mut found = Vec::new();
        for id in ids {
            match id {
                -1 => found.push(Location::Host),
                id if id >= 0 => found.push(Location::Device(Device::new(id as usize)?)),
                _ => {}
            }
        }
        Ok(found)
    }

    /// Advises that `location` (a device or the host) accesses the memory.
    ///
    /// # Errors
    /// - [`ManagedError::AdviceLocation`] for a host NUMA location.
    /// - A driver error.
    #[doc(alias = "accessed_by")]
    pub fn add_accessed_by(&self, location: impl Into<Location>) -> Result<()> {
        self.advise(Advice::SetAccessedBy, location.into())
    }

    /// Undoes [`add_accessed_by`](ManagedBuffer::add_accessed_by).
    ///
    /// # Errors
    /// As [`add_accessed_by`](ManagedBuffer::add_accessed_by).
    pub fn remove_accessed_by(&self, location: impl Into<Location>) -> Result<()> {
        self.advise(Advice::UnsetAccessedBy, location.into())
    }

    /// Where every page was last prefetched to (what was asked for, not whether it is done),
    /// `None` if some page never was or the pages disagree. Before CUDA 12.2 the driver names
    /// no NUMA node: a host location is [`Location::Host`].
    ///
    /// # Errors
    /// A driver error.
    #[doc(alias = "CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION")]
    pub fn last_prefetch_location(&self) -> Result<Option<Location>> {
        use CUmem_range_attribute as A;
        if before_locations()?.is_some() {
            let [id] = self.range_attributes([A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION])?;
            return from_legacy(id);
        }
        let [type_, id] = self.range_attributes([
            A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
            A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID,
        ])?;
        from_reported(type_, id)
    }

    /// Prefetches the memory to `location` on `stream`.
    ///
    /// # Errors
    /// - [`Error::DriverTooOld`] before CUDA 12.2 ([`DriverCapability::ManagedLocations`]) for a
    ///   host NUMA location (devices and the host go through CUDA 8.0's `cuMemPrefetchAsync`
    ///   there), before any other driver call.
    /// - A driver error (a device without concurrent managed access, say).
    #[doc(alias = "cuMemPrefetchAsync")]
    pub fn prefetch(&self, location: impl Into<Location>, stream: &Stream) -> Result<()> {
        let location = location.into();
        let d = driver()?;
        let legacy = before_locations()?.map(|installed| legacy_device(location, installed)).transpose()?;
        let stream = stream.on_calling_thread();
        stream.bind_if_default()?;
        let (ptr, size) = (self.buffer.ptr(), self.buffer.size());
        match legacy {
            // SAFETY: the range is the buffer's, valid until it is freed, which is ordered after
            // this work.
            Some(device) => unsafe {
                cu_call!(d, cuMemPrefetchAsync_v1(ptr, size, device, stream.handle()) as "cuMemPrefetchAsync")
            }?,
            // SAFETY: as above; flags must be 0.
            None => unsafe { cu_call!(d, cuMemPrefetchAsync_v2(ptr, size, location.raw(), 0, stream.handle())) }?,
        }
        self.buffer.note_use(&stream);
        Ok(())
    }

    /// 4-byte range attributes of the whole buffer, in one driver call.
    fn range_attributes<const N: usize>(&self, mut attributes: [CUmem_range_attribute; N]) -> Result<[i32; N]> {
        let mut values = [0i32; N];
        let mut data: [*mut c_void; N] = [std::ptr::null_mut(); N];
        for (out, value) in data.iter_mut().zip(values.iter_mut()) {
            *out = (value as *mut i32).cast();
        }
        let mut sizes = [4usize; N];
        let d = driver()?;
        bind_for(self.buffer)?;
        // SAFETY: `N` pointers, each valid for 4 bytes of writes, `N` sizes and attributes.
        unsafe {
            cu_call!(
                d,
                cuMemRangeGetAttributes(
                    data.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    attributes.as_mut_ptr(),
                    N,
                    self.buffer.ptr(),
                    self.buffer.size()
                )
            )
        }?;
        Ok(values)
    }
}

impl ManagedBufferMut<'_, '_> {
    /// Discards the contents on `stream`: until written or prefetched again, the bytes read as
    /// anything (cuda.core's `discard`, one `cuMemDiscardBatchAsync`).
    ///
    /// # Errors
    /// A driver error (the legacy default stream is refused, as are systems without concurrent
    /// managed access).
    #[doc(alias = "cuMemDiscardBatchAsync")]
    pub fn discard(&mut self, stream: &Stream) -> Result<()> {
        discard_batch(std::iter::once(&mut *self), stream)
    }

    /// Discards the contents and prefetches the memory to `location`, on `stream`.
    ///
    /// # Errors
    /// As [`discard`](ManagedBufferMut::discard).
    #[doc(alias = "cuMemDiscardAndPrefetchBatchAsync")]
    pub fn discard_prefetch(&mut self, location: impl Into<Location>, stream: &Stream) -> Result<()> {
        discard_prefetch_batch(std::iter::once(&mut *self), ManagedLocations::Same(location.into()), stream)
    }
}

/// Where a batch of prefetches goes: one location for every buffer, or one per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedLocations<'l> {
    /// Every buffer to this location.
    Same(Location),
    /// Buffer `i` to location `i` (as many locations as buffers). A slice of one location
    /// means that location for every buffer, as [`Same`](ManagedLocations::Same).
    PerBuffer(&'l [Location]),
}

impl From<Location> for ManagedLocations<'_> {
    fn from(location: Location) -> Self {
        ManagedLocations::Same(location)
    }
}

impl From<Device> for ManagedLocations<'_> {
    fn from(device: Device) -> Self {
        ManagedLocations::Same(Location::Device(device))
    }
}

impl<'l> From<&'l [Location]> for ManagedLocations<'l> {
    fn from(locations: &'l [Location]) -> Self {
        ManagedLocations::PerBuffer(locations)
    }
}

/// The driver's location table of a batch: each run of equal locations once, with the index of
/// its first buffer. Checks the length first.
fn location_table(locations: ManagedLocations<'_>, buffers: usize) -> Result<(Vec<CUmemLocation>, Vec<usize>)> {
    match locations {
        ManagedLocations::Same(location) | ManagedLocations::PerBuffer(&[location]) => {
            Ok((vec![location.raw()], vec![0]))
        }
        ManagedLocations::PerBuffer(list) if list.len() != buffers => {
            Err(Error::Managed(ManagedError::BatchLengthMismatch { buffers, locations: list.len() }))
        }
        ManagedLocations::PerBuffer(list) => {
            let (mut table, mut first) = (Vec::new(), Vec::new());
            for (i, location) in list.iter().enumerate() {
                if i == 0 || list[i - 1] != *location {
                    table.push(location.raw());
                    first.push(i);
                }
            }
            Ok((table, first))
        }
    }
}

/// The buffers of a batch, every one checked managed; [`Error::DriverTooOld`] before CUDA 13.0,
/// [`Error::EmptyBatch`] for none.
fn checked<'x, 'y: 'x>(
    buffers: impl IntoIterator<Item = &'x ScopedBuffer<'y>>,
    operation: &'static str,
) -> Result<Vec<&'x ScopedBuffer<'y>>> {
    DriverCapability::BatchPrefetchDiscard.require()?;
    let buffers: Vec<&ScopedBuffer<'y>> = buffers.into_iter().collect();
    if buffers.is_empty() {
        return Err(Error::EmptyBatch { operation });
    }
    for buffer in &buffers {
        check_managed(buffer, operation)?;
    }
    Ok(buffers)
}

/// One batched driver call over checked `buffers` on `stream`: a discard (`discard`), a
/// prefetch (`locations`), or both; then notes the stream's use of each buffer.
fn run_batch(
    buffers: &[&ScopedBuffer<'_>],
    locations: Option<ManagedLocations<'_>>,
    discard: bool,
    stream: &Stream,
) -> Result<()> {
    let mut ptrs: Vec<DevicePtr> = buffers.iter().map(|b| b.ptr()).collect();
    let mut sizes: Vec<usize> = buffers.iter().map(|b| b.size()).collect();
    let (mut table, mut first) = match locations {
        Some(locations) => location_table(locations, buffers.len())?,
        None => (Vec::new(), Vec::new()),
    };
    let d = driver()?;
    let stream = stream.on_calling_thread();
    stream.bind_if_default()?;
    let (p, z, n, s) = (ptrs.as_mut_ptr(), sizes.as_mut_ptr(), ptrs.len(), stream.handle());
    let (l, f, k) = (table.as_mut_ptr(), first.as_mut_ptr(), table.len());
    // SAFETY: each array is valid for the length passed with it; the ranges are the buffers',
    // valid until they are freed, which is ordered after this work; a discard's buffers are
    // borrowed exclusively by the callers, so no host slice of them is alive.
    unsafe {
        match (discard, locations.is_some()) {
            (false, _) => cu_call!(d, cuMemPrefetchBatchAsync(p, z, n, l, f, k, 0, s)),
            (true, false) => cu_call!(d, cuMemDiscardBatchAsync(p, z, n, 0, s)),
            (true, true) => cu_call!(d, cuMemDiscardAndPrefetchBatchAsync(p, z, n, l, f, k, 0, s)),
        }
    }?;
    buffers.iter().for_each(|b| b.note_use(&stream));
    Ok(())
}

/// Prefetches many managed buffers in one `cuMemPrefetchBatchAsync` on `stream`: to one
/// location, or to one each (cuda.core's `utils.prefetch_batch`).
///
/// # Errors
/// - [`Error::DriverTooOld`] before CUDA 13.0 ([`DriverCapability::BatchPrefetchDiscard`]).
/// - [`Error::EmptyBatch`], [`ManagedError::BatchLengthMismatch`] and [`ManagedError::NotManaged`],
///   before any driver call.
/// - A driver error (the legacy default stream is refused, as are systems without concurrent
///   managed access).
#[doc(alias = "cuMemPrefetchBatchAsync")]
pub fn prefetch_batch<'x, 'y: 'x, 'l>(
    buffers: impl IntoIterator<Item = &'x ScopedBuffer<'y>>,
    locations: impl Into<ManagedLocations<'l>>,
    stream: &Stream,
) -> Result<()> {
    run_batch(&checked(buffers, "prefetch_batch")?, Some(locations.into()), false, stream)
}

/// Discards many managed buffers in one `cuMemDiscardBatchAsync` on `stream` (cuda.core's
/// `utils.discard_batch`): exclusive handles, since their contents are destroyed.
///
/// # Errors
/// - [`Error::DriverTooOld`] before CUDA 13.0, [`Error::EmptyBatch`], before any driver call.
/// - A driver error.
pub fn discard_batch<'x, 'b: 'x, 'y: 'b>(
    buffers: impl IntoIterator<Item = &'x mut ManagedBufferMut<'b, 'y>>,
    stream: &Stream,
) -> Result<()> {
    let buffers = checked(buffers.into_iter().map(|b| b.shared.buffer), "discard_batch")?;
    run_batch(&buffers, None, true, stream)
}

/// Discards many managed buffers and prefetches them, in one
/// `cuMemDiscardAndPrefetchBatchAsync` on `stream` (cuda.core's `utils.discard_prefetch_batch`).
///
/// # Errors
/// As [`prefetch_batch`].
pub fn discard_prefetch_batch<'x, 'b: 'x, 'y: 'b, 'l>(
    buffers: impl IntoIterator<Item = &'x mut ManagedBufferMut<'b, 'y>>,
    locations: impl Into<ManagedLocations<'l>>,
    stream: &Stream,
) -> Result<()> {
    let buffers = checked(buffers.into_iter().map(|b| b.shared.buffer), "discard_prefetch_batch")?;
    run_batch(&buffers, Some(locations.into()), true, stream)
}

/// Makes a context current for a call that takes no stream: the buffer's device's, else
/// device 0's (managed memory is reachable from every context).
fn bind_for(buffer: &ScopedBuffer<'_>) -> Result<()> {
    let device = match buffer.device() {
        Some(device) => device,
        None => Device::new(0)?,
    };
    device.set_current()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Buffer, DeviceMemoryResource, ManagedMemoryResource, PinnedMemoryResource, StreamOptions};
    use crate::{ForeignMemory, NumaNode};

    const PAGE: usize = 4096;

    fn setup() -> (Device, Stream, Arc<ManagedMemoryResource>) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        (device, stream, ManagedMemoryResource::new(Default::default()).unwrap())
    }

    #[test]
    fn advice_round_trips_through_the_driver() {
        let (device, stream, managed) = setup();
        let buffer = managed.allocate(3 * PAGE, &stream).unwrap();
        let m = buffer.managed().unwrap();
        assert!(!m.read_mostly().unwrap());
        m.set_read_mostly(true).unwrap();
        assert!(m.read_mostly().unwrap());
        m.set_read_mostly(false).unwrap();
        assert!(!m.read_mostly().unwrap());

        assert_eq!(m.preferred_location().unwrap(), None);
        m.set_preferred_location(device).unwrap();
        assert_eq!(m.preferred_location().unwrap(), Some(Location::Device(device)));
        m.set_preferred_location(Location::Host).unwrap();
        assert_eq!(m.preferred_location().unwrap(), Some(Location::Host));
        m.set_preferred_location(Location::HostNuma(NumaNode(0))).unwrap();
        assert_eq!(m.preferred_location().unwrap(), Some(Location::HostNuma(NumaNode(0))));
        m.set_preferred_location(Location::HostNumaCurrent).unwrap();
        assert!(matches!(m.preferred_location().unwrap(), Some(Location::HostNuma(_))), "resolved to a node");
        m.unset_preferred_location().unwrap();
        assert_eq!(m.preferred_location().unwrap(), None);

        assert_eq!(m.accessed_by().unwrap(), []);
        m.add_accessed_by(device).unwrap();
        m.add_accessed_by(Location::Host).unwrap();
        assert_eq!(m.accessed_by().unwrap(), [Location::Device(device), Location::Host]);
        m.remove_accessed_by(device).unwrap();
        assert_eq!(m.accessed_by().unwrap(), [Location::Host]);
    }

    /// In a process of its own: it asserts that no driver call at all was made, and the
    /// simulator counts the calls of every thread, those of the tests beside it too.
    #[test]
    fn each_advice_takes_its_locations_only_checked_before_the_driver() {
        cuda_sim::testing::in_simulated_machine(
            "managed::tests::each_advice_takes_its_locations_only_checked_before_the_driver",
            &[],
            || {
                let (device, stream, managed) = setup();
                let all = [
                    Location::Device(device),
                    Location::Host,
                    Location::HostNuma(NumaNode(0)),
                    Location::HostNumaCurrent,
                ];
                let table = [
                    (Advice::SetReadMostly, [true, true, true, false]),
                    (Advice::UnsetReadMostly, [true, true, true, false]),
                    (Advice::UnsetPreferredLocation, [true, true, true, false]),
                    (Advice::SetPreferredLocation, [true, true, true, true]),
                    (Advice::SetAccessedBy, [true, true, false, false]),
                    (Advice::UnsetAccessedBy, [true, true, false, false]),
                ];
                let buffer = managed.allocate(PAGE, &stream).unwrap();
                let m = buffer.managed().unwrap();
                for (advice, accepted) in table {
                    for (location, accepts) in all.into_iter().zip(accepted) {
                        assert_eq!(advice.accepts(location), accepts, "{advice:?} {location:?}");
                        let result = m.advise(advice, location);
                        if accepts {
                            result.unwrap();
                        } else {
                            // The driver ignores the location of the read-mostly advice: this refusal
                            // is ours, made before the call.
                            let error = result.unwrap_err();
                            assert!(matches!(
                                error,
                                Error::Managed(ManagedError::AdviceLocation { advice: a, location: l }) if a == advice && l == location
                            ));
                            assert!(error.to_string().contains("does not take the location"), "{error}");
                        }
                    }
                }
                let (_, counts) = cuda_sim::testing::count_calls_if_simulated(|| {
                    m.advise(Advice::SetReadMostly, Location::HostNumaCurrent).unwrap_err()
                });
                counts.assert_total(0, "no driver call");
            },
        );
    }

    #[test]
    fn memory_that_is_not_managed_is_refused_and_views_of_managed_memory_are_not() {
        let (device, stream, managed) = setup();
        let on_device = DeviceMemoryResource::new(device, Default::default()).unwrap().allocate(PAGE, &stream).unwrap();
        let pinned = PinnedMemoryResource::current().unwrap().allocate(PAGE, &stream).unwrap();
        let empty = managed.allocate(0, &stream).unwrap();
        for buffer in [&on_device, &pinned, &empty] {
            let error = buffer.managed().unwrap_err();
            assert!(matches!(error, Error::Managed(ManagedError::NotManaged { operation: "managed", .. })), "{error}");
            assert!(error.to_string().contains("requires a managed-memory allocation"), "{error}");
        }
        let error = prefetch_batch([&on_device], Location::Host, &stream).unwrap_err();
        assert!(
            matches!(error, Error::Managed(ManagedError::NotManaged { operation: "prefetch_batch", .. })),
            "{error}"
        );

        // A view of cuMemAllocManaged memory: the driver says it is managed.
        let d = driver().unwrap();
        let mut ptr = 0;
        // SAFETY: valid out-pointer; CU_MEM_ATTACH_GLOBAL.
        unsafe { cu_call!(d, cuMemAllocManaged(&mut ptr, PAGE, 1)) }.unwrap();
        // SAFETY: the memory stays allocated until freed below, after the view is dropped.
        let view = unsafe { Buffer::from_raw(ptr, PAGE, ForeignMemory::pinned()) };
        view.managed().unwrap().prefetch(Location::Host, &stream).unwrap();
        assert_eq!(view.managed().unwrap().last_prefetch_location().unwrap(), Some(Location::Host));
        stream.synchronize().unwrap();
        drop(view);
        // SAFETY: allocated above; nothing uses it any more.
        unsafe { cu_call!(d, cuMemFree_v2(ptr)) }.unwrap();
    }

    #[test]
    fn prefetch_and_discard_record_and_destroy() {
        let (device, stream, managed) = setup();
        let mut buffer = managed.allocate(2 * PAGE, &stream).unwrap();
        buffer.host_slice_mut().unwrap().fill(0x11);
        let m = buffer.managed().unwrap();
        assert_eq!(m.last_prefetch_location().unwrap(), None);
        m.prefetch(device, &stream).unwrap();
        assert_eq!(m.last_prefetch_location().unwrap(), Some(Location::Device(device)));
        let mut exclusive = buffer.managed_mut().unwrap();
        exclusive.discard(&stream).unwrap();
        exclusive.discard_prefetch(Location::Host, &stream).unwrap();
        assert_eq!(exclusive.last_prefetch_location().unwrap(), Some(Location::Host));
        // The host slice waits for the discards, which ran on `stream`.
        let bytes = buffer.host_slice().unwrap();
        if cuda_sim::testing::on_simulator() {
            assert!(bytes.iter().all(|&b| b == 0xDB), "the simulator overwrites discarded pages");
        }
    }

    #[test]
    fn batches_check_their_lengths_before_the_driver_and_group_locations() {
        let (device, stream, managed) = setup();
        let mut buffers: Vec<Buffer> = (0..3).map(|_| managed.allocate(PAGE, &stream).unwrap()).collect();
        let none: [&Buffer; 0] = [];
        assert!(matches!(prefetch_batch(none, Location::Host, &stream), Err(Error::EmptyBatch { .. })));
        let two = [Location::Host, Location::Host];
        let error = prefetch_batch(&buffers, &two[..], &stream).unwrap_err();
        assert!(
            matches!(error, Error::Managed(ManagedError::BatchLengthMismatch { buffers: 3, locations: 2 })),
            "{error}"
        );

        let per_buffer = [Location::Device(device), Location::Device(device), Location::Host];
        assert_eq!(
            location_table(ManagedLocations::PerBuffer(&per_buffer), 3).unwrap().1,
            [0, 2],
            "one entry per run of equal locations"
        );
        prefetch_batch(&buffers, &per_buffer[..], &stream).unwrap();
        let last: Vec<_> = buffers.iter().map(|b| b.managed().unwrap().last_prefetch_location().unwrap()).collect();
        assert_eq!(last, per_buffer.map(Some));
        prefetch_batch(&buffers, device, &stream).unwrap();

        let mut handles: Vec<ManagedBufferMut<'_, '_>> = buffers.iter_mut().map(|b| b.managed_mut().unwrap()).collect();
        discard_batch(handles.iter_mut(), &stream).unwrap();
        // A slice of one location is that location for every buffer.
        discard_prefetch_batch(handles.iter_mut(), &[Location::Host][..], &stream).unwrap();
        for handle in &handles {
            assert_eq!(handle.last_prefetch_location().unwrap(), Some(Location::Host));
        }
        discard_prefetch_batch(handles.iter_mut(), Location::HostNuma(NumaNode(0)), &stream).unwrap();
        assert!(matches!(discard_batch(handles.iter_mut().take(0), &stream), Err(Error::EmptyBatch { .. })));
        drop(handles);
        for buffer in &buffers {
            assert_eq!(
                buffer.managed().unwrap().last_prefetch_location().unwrap(),
                Some(Location::HostNuma(NumaNode(0)))
            );
        }
    }

    #[test]
    fn host_slices_of_managed_memory_need_idle_devices_without_concurrent_managed_access() {
        cuda_sim::testing::in_simulated_machine(
            "managed::tests::host_slices_of_managed_memory_need_idle_devices_without_concurrent_managed_access",
            &[("CUDA_SIM_DEVICE_ATTRIBUTES", "89=0")],
            || {
                if !cuda_sim::testing::simulator_only("a device without concurrent managed access") {
                    return;
                }
                let (device, stream, managed) = setup();
                assert!(!device.concurrent_managed_access().unwrap());
                let mut buffer = managed.allocate(PAGE, &stream).unwrap();
                let error = buffer.host_slice().unwrap_err();
                assert!(matches!(error, Error::Managed(ManagedError::HostAccessNotConcurrent { .. })), "{error}");
                assert!(matches!(
                    buffer.host_slice_mut(),
                    Err(Error::Managed(ManagedError::HostAccessNotConcurrent { .. }))
                ));
                // SAFETY: this test launches no device work while the slices live.
                unsafe {
                    buffer.host_slice_mut_devices_idle().unwrap().fill(7);
                    assert_eq!(buffer.host_slice_devices_idle().unwrap(), [7; PAGE]);
                }
                // Other host memory is lent as before.
                let mut pinned = PinnedMemoryResource::current().unwrap().allocate(PAGE, &stream).unwrap();
                pinned.host_slice_mut().unwrap().fill(1);
                // And the driver refuses device prefetches and the batches.
                let m = buffer.managed().unwrap();
                assert!(m.prefetch(device, &stream).unwrap_err().cuda_code().is_some());
                assert!(prefetch_batch([&buffer], Location::Host, &stream).unwrap_err().cuda_code().is_some());
            },
        );
    }
}
