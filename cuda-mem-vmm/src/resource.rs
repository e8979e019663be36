//! `VirtualMemoryResource`: allocation and growth through the VMM API.

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{
    CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation, CUmemLocationType, CUresult,
};
use cuda_mem_core::{Access, Device, DevicePtr, DriverCapability, HandleType, HandleTypes, Location, Stream, driver};

use crate::buffer::VirtualBuffer;
use crate::error::{DeviceFeature, InvalidOptions, Result, VmmError};
use crate::expandable::ExpandableRanges;
use crate::memory_resource::LiveRanges;
use crate::options::{AllocationType, Granularity, ReserveAhead, VirtualMemoryResourceOptions};
use crate::pieces::{Physical, Range, Reservation, map_contiguously};
use crate::release::release_deferred;

/// Allocates device (or host) memory as physical chunks mapped into reserved address ranges, so
/// that a buffer can grow without copying.
///
/// It is a [`MemoryResource`](cuda_mem_core::MemoryResource): an `Arc` of one allocates plain
/// [`Buffer`](cuda_mem_core::Buffer)s through
/// [`MemoryResourceExt`](cuda_mem_core::MemoryResourceExt) (`allocate_scoped`, or
/// `MemoryResourceExt::allocate(&resource, size, &stream)`: the inherent
/// [`allocate`](VirtualMemoryResource::allocate), which gives a growable, exportable
/// [`VirtualBuffer`], takes precedence in method syntax), and it can stand wherever an
/// `Arc<dyn MemoryResource>` is expected. Growth and export are [`VirtualBuffer`]'s.
#[derive(Debug)]
pub struct VirtualMemoryResource {
    device: Device,
    options: VirtualMemoryResourceOptions,
    location: Location,
    granularity: usize,
    /// The driver's minimum granularity for the same properties (the granularity itself with
    /// [`Granularity::Minimum`](crate::Granularity::Minimum)): what any physical allocation's
    /// size is a multiple of.
    minimum_granularity: usize,
    /// The least size of each reservation ([`ReserveAhead`], rounded up to the granularity); 0
    /// for none.
    reserve_ahead: usize,
    access: Vec<CUmemAccessDesc>,
    /// The ranges of the buffers it handed out, found again when they are freed.
    pub(crate) live: LiveRanges,
    /// The expandable ranges it reserved ([`ExpandableMemory`](cuda_mem_core::ExpandableMemory)).
    pub(crate) expandable: ExpandableRanges,
}

/// The flags of the access descriptor that gives `access`, or none for no access: a mapping
/// starts inaccessible, so no descriptor is sent for it.
fn descriptor_flags(access: Access) -> Option<CUmemAccess_flags> {
    (access != Access::None).then(|| access.raw())
}

/// Rounds `size` up to a multiple of `granularity`, or says it does not fit.
pub(crate) fn round_up(size: usize, granularity: usize) -> Result<usize> {
    size.checked_next_multiple_of(granularity).ok_or(VmmError::SizeOverflow { size, granularity })
}

impl VirtualMemoryResource {
    /// A resource allocating for `device` with `options`, checked now: every invalid combination
    /// is an error here, saying what to change.
    ///
    /// # Errors
    /// - [`VmmError::Unsupported`] when the device lacks VMM, the handle type, GPUDirect RDMA with
    ///   VMM or a host NUMA node, or, for fabric handles, when this process has no IMEX channel
    ///   ([`DeviceFeature::ImexChannel`]: the driver refused the one granule made and released here
    ///   to find out).
    /// - [`VmmError::InvalidOptions`] for an alignment that is not a power of two, an exportable
    ///   handle type on plain host memory, a handle type other than POSIX file descriptors and
    ///   fabric handles, a location the memory cannot be placed at (the calling thread's NUMA node,
    ///   another device), or the owner listed as a peer.
    /// - [`VmmError::ManagedRefused`] when the driver refuses managed memory.
    /// - [`cuda_mem_core::Error::DriverTooOld`] (inside [`VmmError::Core`]) for fabric handles
    ///   before CUDA 12.3 ([`DriverCapability::FabricHandles`]), before any driver call.
    /// - [`VmmError::SizeOverflow`] for a [`ReserveAhead::Bytes`] that cannot be rounded up to the
    ///   granularity.
    /// - [`VmmError::ReserveAheadRefused`] for a [`ReserveAhead`] the driver cannot reserve: one
    ///   reservation of that size is made and freed here to find out.
    /// - The driver's error when [`ReserveAhead::DeviceMemory`] cannot read the device's memory.
    pub fn new(device: Device, options: VirtualMemoryResourceOptions) -> Result<Arc<VirtualMemoryResource>> {
        // Before any other driver call: an older driver would refuse only the handle type, later.
        if options.handle_type == Some(HandleType::Fabric) {
            DriverCapability::FabricHandles.require()?;
        }
        let properties = device.properties()?;
        let unsupported = |feature| VmmError::Unsupported { device, feature };
        if !properties.virtual_memory_management_supported {
            return Err(unsupported(DeviceFeature::VirtualMemoryManagement));
        }
        if options.address_alignment != 0 && !options.address_alignment.is_power_of_two() {
            return Err(InvalidOptions::AlignmentNotPowerOfTwo(options.address_alignment).into());
        }
        let location = placement(device, &options)?;
        match options.handle_type {
            None => {}
            // No file descriptors off Unix (`ChunkHandle::Fd` is Unix only), whatever the device says.
            Some(HandleType::PosixFd) if !cfg!(unix) || !properties.posix_fd_handles_supported => {
                return Err(unsupported(DeviceFeature::PosixFdHandles));
            }
            Some(HandleType::Fabric) if !properties.fabric_handles_supported => {
                return Err(unsupported(DeviceFeature::FabricHandles));
            }
            Some(HandleType::PosixFd | HandleType::Fabric) => {}
            Some(other) => return Err(InvalidOptions::UnsupportedHandleType(other).into()),
        }
        if options.gpu_direct_rdma && !properties.gpu_direct_rdma_with_vmm_supported {
            return Err(unsupported(DeviceFeature::GpuDirectRdma));
        }
        if options.peers.contains(&device) {
            return Err(InvalidOptions::OwnerAsPeer(device).into());
        }
        let mut access = Vec::new();
        if let Some(flags) = descriptor_flags(options.self_access) {
            // The owner's descriptor names the device even for host memory: it is the device
            // that accesses it.
            let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() };
            access.push(CUmemAccessDesc { location, flags });
        }
        if let Some(flags) = descriptor_flags(options.peer_access) {
            for peer in &options.peers {
                let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: peer.raw() };
                access.push(CUmemAccessDesc { location, flags });
            }
        }
        let mut resource = VirtualMemoryResource {
            device,
            options,
            location,
            granularity: 0,
            minimum_granularity: 0,
            reserve_ahead: 0,
            access,
            live: LiveRanges::default(),
            expandable: ExpandableRanges::default(),
        };
        let query = |flag| {
            resource.query_granularity(flag).map_err(|e| match (resource.options.allocation_type, e) {
                (AllocationType::Managed, VmmError::Core(source)) => VmmError::ManagedRefused { device, source },
                (_, e) => e,
            })
        };
        let granularity = query(resource.options.granularity)?;
        let minimum_granularity = match resource.options.granularity {
            Granularity::Minimum => granularity,
            Granularity::Recommended => query(Granularity::Minimum)?,
        };
        (resource.granularity, resource.minimum_granularity) = (granularity, minimum_granularity);
        let ahead = match resource.options.reserve_ahead {
            None => 0,
            Some(ReserveAhead::Bytes(bytes)) => bytes,
            Some(ReserveAhead::DeviceMemory) => device.total_memory()?,
        };
        resource.reserve_ahead = round_up(ahead, resource.granularity)?;
        if let Some(requested) = resource.options.reserve_ahead {
            resource.check_reserve_ahead(requested)?;
        }
        if resource.options.handle_type == Some(HandleType::Fabric) {
            resource.check_fabric_permitted()?;
        }
        cuda_mem_core::memory_event!(
            DEBUG,
            device = device.ordinal(),
            granularity = resource.granularity,
            location = %resource.location(),
            handle_type = ?resource.options.handle_type,
            "virtual memory resource created"
        );
        let resource = Arc::new(resource);
        cuda_mem_core::snapshot::register(&resource);
        Ok(resource)
    }

    fn prop(&self) -> CUmemAllocationProp {
        let mut prop = CUmemAllocationProp {
            type_: self.options.allocation_type.raw(),
            requestedHandleTypes: HandleTypes::from(self.options.handle_type).raw(),
            location: self.location.raw(),
            ..CUmemAllocationProp::default()
        };
        prop.allocFlags.gpuDirectRDMACapable = u8::from(self.options.gpu_direct_rdma);
        prop
    }

    /// The device attribute says whether the device and driver support fabric handles, not
    /// whether this process was granted an IMEX channel, without which `cuMemCreate` of fabric
    /// memory is `CUDA_ERROR_NOT_PERMITTED`: one granule made and released finds out here rather
    /// than at the first allocation. Other refusals (out of memory) are left to the allocations.
    fn check_fabric_permitted(&self) -> Result<()> {
        match Physical::create(self.granularity, &self.prop(), Vec::new()) {
            Ok(probe) => {
                drop(probe);
                Ok(())
            }
            Err(error) if error.cuda_code() == Some(CUresult::CUDA_ERROR_NOT_PERMITTED) => {
                Err(VmmError::Unsupported { device: self.device, feature: DeviceFeature::ImexChannel })
            }
            Err(_) => Ok(()),
        }
    }

    /// What the driver can reserve is not documented, and depends on the device's virtual
    /// address space and on what the process holds of it already. No bound computed here
    /// (the device's memory times a factor, a number of address bits) would be right on every
    /// driver, and a size beyond what the driver gives would fail every allocation and growth
    /// later with `cuMemAddressReserve`'s `CUDA_ERROR_OUT_OF_MEMORY`: so one reservation of the
    /// size each one would take is made and freed here, with the resource's alignment and hint,
    /// and a refusal refuses the options. (Address space used up later by other reservations
    /// still fails the allocation that needs more, as for any memory.)
    fn check_reserve_ahead(&self, requested: ReserveAhead) -> Result<()> {
        if self.reserve_ahead == 0 {
            return Ok(());
        }
        match Reservation::reserve(self.reserve_ahead, self.alignment(), self.options.address_hint) {
            // Dropped at once: freed.
            Ok(trial) => {
                drop(trial);
                Ok(())
            }
            Err(source) => Err(VmmError::ReserveAheadRefused { requested, size: self.reserve_ahead, source }),
        }
    }

    fn query_granularity(&self, which: Granularity) -> Result<usize> {
        let d = driver()?;
        let prop = self.prop();
        let mut granularity = 0usize;
        // SAFETY: valid pointers for the call.
        unsafe { cu_call!(d, cuMemGetAllocationGranularity(&mut granularity, &prop, which.raw())) }
            .map_err(cuda_mem_core::Error::from)?;
        if granularity == 0 {
            return Err(VmmError::ZeroGranularity);
        }
        Ok(granularity)
    }

    /// The device the resource allocates for.
    #[doc(alias = "device_id")]
    pub fn device(&self) -> Device {
        self.device
    }

    /// Its options.
    pub fn options(&self) -> &VirtualMemoryResourceOptions {
        &self.options
    }

    /// The granularity sizes are rounded up to.
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// The driver's minimum granularity for the memory it allocates (see the field).
    pub(crate) fn minimum_granularity(&self) -> usize {
        self.minimum_granularity
    }

    /// Where the memory it allocates (and maps, when it imports) lives: on its device, on the
    /// host or on a host NUMA node. A receiver of shared virtual buffers uses it to pick the
    /// resource to import each one with.
    pub fn location(&self) -> Location {
        self.location
    }

    /// The alignment of its reservations.
    pub(crate) fn alignment(&self) -> usize {
        if self.options.address_alignment == 0 { self.granularity } else { self.options.address_alignment }
    }

    /// One physical chunk of `size` bytes with this resource's properties and access.
    pub(crate) fn create_chunk(&self, size: usize) -> Result<Arc<Physical>> {
        Ok(Physical::create(size, &self.prop(), self.access.clone())?)
    }

    /// The access descriptors mappings of this resource get.
    pub(crate) fn access(&self) -> &[CUmemAccessDesc] {
        &self.access
    }

    /// The size of a reservation for `size` bytes: at least the size reserved ahead.
    fn reservation_size(&self, size: usize) -> usize {
        size.max(self.reserve_ahead)
    }

    /// Reserves `size` bytes (or the size reserved ahead, if larger) with this resource's
    /// alignment and hint.
    pub(crate) fn reserve(&self, size: usize) -> Result<Arc<Reservation>> {
        Ok(Reservation::reserve(self.reservation_size(size), self.alignment(), self.options.address_hint)?)
    }

    /// `stream`, or the device's legacy default stream.
    pub(crate) fn stream_or_default(&self, stream: Option<&Stream>) -> Stream {
        stream.cloned().unwrap_or_else(|| self.device.default_stream())
    }

    /// A new range of at least `size` bytes (more than 0; rounded up to the granularity): one
    /// physical chunk mapped into a reservation of its own.
    pub(crate) fn map_new(&self, size: usize) -> Result<Range> {
        let aligned = round_up(size, self.granularity)?;
        let physical = self.create_chunk(aligned)?;
        let reservation = self.reserve(aligned)?;
        let range = map_contiguously(&reservation, [physical]).map_err(|failure| failure.error)?;
        cuda_mem_core::memory_event!(
            TRACE,
            size = aligned,
            ptr = %hex(range.base),
            device = self.device.ordinal(),
            "allocate"
        );
        Ok(range)
    }

    /// Allocates at least `size` bytes (rounded up to the granularity: the buffer's size is the
    /// rounded size), freed, after `stream` has finished its work, when the last buffer using the
    /// memory is dropped (as a pool's buffers; `device.default_stream()` is the legacy default
    /// stream). A zero size gives an empty buffer without any driver call.
    ///
    /// # Errors
    /// - Driver errors from any step ([`VmmError::Core`]).
    /// - Every step already taken is undone.
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<VirtualBuffer> {
        release_deferred();
        if size == 0 {
            return Ok(VirtualBuffer::new(Arc::new(Range::empty()), 0, Arc::clone(self), false, stream));
        }
        let range = self.map_new(size)?;
        let aligned = range.mapped_size();
        Ok(VirtualBuffer::new(Arc::new(range), aligned, Arc::clone(self), false, stream))
    }

    /// A buffer covering `buffer`'s bytes and more, `new_size` in all (rounded up), freed after
    /// the stream `buffer` is freed on.
    ///
    /// With [`ReserveAhead`](crate::ReserveAhead), a growth that fits in the reservation the
    /// buffer's last chunk lies in, where nothing is mapped after the buffer yet, maps one new
    /// chunk right after the buffer: the pointer stays the same, with no address asked of the
    /// driver (a constant number of driver calls). Otherwise it first reserves the addresses
    /// right after the buffer's (with `ReserveAhead`, that many) and maps one new chunk there:
    /// the pointer stays the same and nothing is copied. If the driver puts that reservation
    /// elsewhere, it reserves a new range and maps every existing chunk again, then the new one:
    /// a new pointer, still no copy. Either way `buffer` stays valid and aliases the same
    /// memory; existing chunks keep their access.
    ///
    /// Growing the same `buffer` a second time while the first growth (or a buffer grown from
    /// it) lives moves: the addresses right after `buffer` are that growth's, mapped, so the
    /// second one (a sibling of the first) gets a new pointer, with or without `ReserveAhead`.
    /// Once the first growth and every buffer grown from it are dropped, those addresses are
    /// free again and `buffer` grows in place once more.
    ///
    /// Growing to a size already covered creates, reserves and maps nothing: its only driver
    /// calls are those of releasing memory whose release was deferred earlier (growth is a safe
    /// point, see [`release_deferred`](crate::release_deferred)), and with nothing deferred it
    /// makes none. A failure leaves `buffer` untouched and leaks nothing.
    ///
    /// # Errors
    /// - [`VmmError::ForeignBuffer`] for a buffer of another resource.
    /// - Driver errors.
    #[doc(alias = "modify_allocation")]
    pub fn grow(self: &Arc<Self>, buffer: &VirtualBuffer, new_size: usize) -> Result<VirtualBuffer> {
        if !Arc::ptr_eq(buffer.resource(), self) {
            return Err(VmmError::ForeignBuffer);
        }
        release_deferred();
        let stream = self.stream_or_default(buffer.deallocation_stream());
        let range = buffer.range();
        if range.mappings.is_empty() {
            return self.allocate(new_size, &stream);
        }
        let requested = round_up(new_size, self.granularity)?;
        let total = range.mapped_size();
        let imported = buffer.is_imported();
        if requested <= total {
            let size = requested.max(buffer.size());
            return Ok(VirtualBuffer::new(Arc::clone(range), size, Arc::clone(self), imported, &stream));
        }
        let added = requested - total;
        // In place inside the reservation: the addresses after the buffer, reserved ahead.
        if let Some(claim) = range.claim_after(added) {
            // A failure drops the claim, which gives the addresses back.
            let physical = self.create_chunk(added)?;
            let grown = claim.map(range, physical)?;
            grown_event(buffer, range.base, requested, true);
            return Ok(VirtualBuffer::new(Arc::new(grown), requested, Arc::clone(self), imported, &stream));
        }
        let end = range.base + total as u64;
        // In place: the addresses right after the buffer, if the driver grants them.
        match Reservation::reserve(self.reservation_size(added), 0, end) {
            Ok(next) if next.ptr == end => {
                let physical = self.create_chunk(added)?;
                let mut new_chunk = map_contiguously(&next, [physical]).map_err(|failure| failure.error)?;
                let mut mappings = range.mappings.clone();
                // Taken out: a range lets go of its mappings when dropped.
                mappings.extend(std::mem::take(&mut new_chunk.mappings));
                let grown = Range { base: range.base, mappings };
                grown_event(buffer, range.base, requested, true);
                return Ok(VirtualBuffer::new(Arc::new(grown), requested, Arc::clone(self), imported, &stream));
            }
            // Granted elsewhere (dropped here, so freed) or refused: move instead.
            _ => {}
        }
        let reservation = self.reserve(requested)?;
        let physical = self.create_chunk(added)?;
        let chunks = range.mappings.iter().map(|existing| Arc::clone(&existing.physical)).chain([physical]);
        let moved = map_contiguously(&reservation, chunks).map_err(|failure| failure.error)?;
        grown_event(buffer, moved.base, requested, false);
        Ok(VirtualBuffer::new(Arc::new(moved), requested, Arc::clone(self), imported, &stream))
    }
}

/// The event of a growth of `buffer` to `size` bytes at `ptr` (the same address when
/// `in_place`).
#[inline]
fn grown_event(_buffer: &VirtualBuffer, _ptr: DevicePtr, _size: usize, _in_place: bool) {
    cuda_mem_core::memory_event!(
        DEBUG,
        old_ptr = %hex(_buffer.ptr()),
        old_size = _buffer.size(),
        ptr = %hex(_ptr),
        size = _size,
        in_place = _in_place,
        chunks = _buffer.chunk_count() + 1,
        device = _buffer.resource().device().ordinal(),
        "virtual buffer grown"
    );
}

impl Drop for VirtualMemoryResource {
    fn drop(&mut self) {
        // A safe point: memory deferred while its stream captured may be released by now.
        release_deferred();
    }
}

#[cfg(all(test, feature = "tracing"))]
mod tests {
    use cuda_mem_core::__private::capture::{capture, named};
    use cuda_mem_core::__private::tracing::Level;
    use cuda_mem_core::{Device, Stream, StreamOptions};

    use crate::VirtualMemoryResource;

    /// Creation, an allocation and a growth each emit their event, with sizes, addresses and
    /// the device.
    #[test]
    fn creation_allocation_and_growth_are_traced() {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let ((small, grown), events) = capture(|| {
            let resource = VirtualMemoryResource::new(device, Default::default()).unwrap();
            let small = resource.allocate(1, &stream).unwrap();
            let grown = small.grow(small.size() + 1).unwrap();
            ((small.ptr(), small.size()), (grown.ptr(), grown.size(), grown.chunk_count()))
        });
        let granularity = small.1 as u64;
        let created: Vec<_> = named(&events, "virtual memory resource created").collect();
        assert_eq!(created.len(), 1, "{events:#?}");
        assert_eq!((created[0].level, created[0].number("device")), (Level::DEBUG, Some(0)));
        assert_eq!(created[0].number("granularity"), Some(granularity));
        let allocated: Vec<_> = named(&events, "allocate").collect();
        assert_eq!(allocated.len(), 1, "{events:#?}");
        assert_eq!(allocated[0].level, Level::TRACE);
        assert_eq!((allocated[0].number("ptr"), allocated[0].number("size")), (Some(small.0), Some(granularity)));
        let growth: Vec<_> = named(&events, "virtual buffer grown").collect();
        assert_eq!(growth.len(), 1, "{events:#?}");
        let event = growth[0];
        assert_eq!(event.level, Level::DEBUG);
        assert_eq!(event.target, "cuda_mem_vmm::resource");
        assert_eq!((event.number("old_ptr"), event.number("old_size")), (Some(small.0), Some(granularity)));
        assert_eq!((event.number("ptr"), event.number("size")), (Some(grown.0), Some(grown.1 as u64)));
        assert_eq!((event.number("chunks"), event.number("device")), (Some(grown.2 as u64), Some(0)));
        let in_place = (grown.0 == small.0).to_string();
        assert_eq!(event.fields.get("in_place"), Some(&in_place), "{event:?}");
    }
}

/// Where `options` place the memory of a resource for `device`: its device unless they name the
/// host or a host NUMA node.
fn placement(device: Device, options: &VirtualMemoryResourceOptions) -> Result<Location> {
    let location = options.location.unwrap_or(Location::Device(device));
    match location {
        Location::Device(d) if d == device => Ok(location),
        // Plain host memory has no NUMA node to export it from.
        Location::Host if options.handle_type.is_some() => Err(InvalidOptions::ExportableHostMemory.into()),
        Location::Host | Location::HostNuma(_) => Ok(location),
        // The calling thread's node is no place for memory that stays; another device's
        // memory is its own resource's.
        _ => Err(InvalidOptions::Location { location, device }.into()),
    }
}
