//! `VirtualMemoryResource`: allocation and growth through the VMM API.

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUmemAccessDesc, CUmemAllocationProp, CUmemLocation, CUmemLocationType};
use cuda_mem_core::{Device, Error, Result, Stream, driver};

use crate::buffer::VirtualBuffer;
use crate::options::{HandleType, LocationType, VirtualMemoryResourceOptions};
use crate::pieces::{Mapping, Physical, Range, Reservation};

/// Allocates device (or host) memory as physical chunks mapped into reserved address ranges, so
/// that a buffer can grow without copying.
#[derive(Debug)]
pub struct VirtualMemoryResource {
    device: Device,
    options: VirtualMemoryResourceOptions,
    location: CUmemLocation,
    granularity: usize,
    access: Vec<CUmemAccessDesc>,
}

/// Rounds `size` up to a multiple of `granularity`, or says it does not fit.
pub(crate) fn round_up(size: usize, granularity: usize) -> Result<usize> {
    size.checked_next_multiple_of(granularity).ok_or_else(|| {
        Error::InvalidArgument(format!("{size} bytes rounded up to the {granularity}-byte granularity overflow"))
    })
}

impl VirtualMemoryResource {
    /// A resource allocating for `device` with `options`, checked now: every invalid combination
    /// is an error here, saying what to change.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the device lacks VMM, the handle type, or GPUDirect RDMA
    /// with VMM; [`Error::InvalidArgument`] for an alignment that is not a power of two, an
    /// exportable handle type on plain host memory, or the owner listed as a peer.
    pub fn new(device: Device, options: VirtualMemoryResourceOptions) -> Result<Arc<VirtualMemoryResource>> {
        let properties = device.properties()?;
        if !properties.virtual_memory_management_supported {
            return Err(Error::NotSupported(format!(
                "{device} does not support the virtual memory management API; use a pool resource instead"
            )));
        }
        if options.address_alignment != 0 && !options.address_alignment.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "address_alignment must be a power of two (or 0 for the granularity), got {}",
                options.address_alignment
            )));
        }
        if options.location_type == LocationType::Host && options.handle_type != HandleType::None {
            return Err(Error::InvalidArgument(
                "memory with location_type Host cannot have an exportable handle type: use handle_type(HandleType::None), \
                 or LocationType::HostNuma to share host memory"
                    .to_string(),
            ));
        }
        match options.handle_type {
            HandleType::PosixFd if !properties.posix_fd_handles_supported => {
                return Err(Error::NotSupported(format!(
                    "{device} cannot export memory as POSIX file descriptors; use handle_type(HandleType::None)"
                )));
            }
            HandleType::Fabric if !properties.fabric_handles_supported => {
                return Err(Error::NotSupported(format!(
                    "{device} cannot export memory as fabric handles; use handle_type(HandleType::PosixFd) or None"
                )));
            }
            _ => {}
        }
        if options.gpu_direct_rdma && !properties.gpu_direct_rdma_with_vmm_supported {
            return Err(Error::NotSupported(format!(
                "{device} does not support GPUDirect RDMA with VMM allocations; set gpu_direct_rdma(false)"
            )));
        }
        if options.location_type == LocationType::HostNumaCurrent {
            return Err(Error::NotSupported(
                "physical allocations cannot be placed on the calling thread's NUMA node (HostNumaCurrent); use \
                 LocationType::HostNuma or Host"
                    .to_string(),
            ));
        }
        if options.peers.contains(&device) {
            return Err(Error::InvalidArgument(format!(
                "{device} owns the memory and cannot also be one of its peers; set its access with self_access"
            )));
        }
        let id = match options.location_type {
            LocationType::Device => device.raw(),
            LocationType::HostNuma => properties.host_numa_id.ok_or_else(|| {
                Error::NotSupported(format!("{device} reports no host NUMA node; use LocationType::Host"))
            })?,
            LocationType::Host | LocationType::HostNumaCurrent => 0,
        };
        let location = CUmemLocation { type_: options.location_type.raw(), id };
        let mut access = Vec::new();
        if let Some(flags) = options.self_access.raw() {
            // The owner's descriptor names the device even for host memory: it is the device
            // that accesses it.
            let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() };
            access.push(CUmemAccessDesc { location, flags });
        }
        if let Some(flags) = options.peer_access.raw() {
            for peer in &options.peers {
                let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: peer.raw() };
                access.push(CUmemAccessDesc { location, flags });
            }
        }
        let mut resource = VirtualMemoryResource { device, options, location, granularity: 0, access };
        resource.granularity = resource.query_granularity().map_err(|e| match resource.options.allocation_type {
            crate::options::AllocationType::Managed => Error::NotSupported(format!(
                "the driver refuses managed physical allocations for {device} ({e}); use AllocationType::Pinned"
            )),
            _ => e,
        })?;
        Ok(Arc::new(resource))
    }

    fn prop(&self) -> CUmemAllocationProp {
        let mut prop = CUmemAllocationProp {
            type_: self.options.allocation_type.raw(),
            requestedHandleTypes: self.options.handle_type.raw(),
            location: self.location,
            ..CUmemAllocationProp::default()
        };
        prop.allocFlags.gpuDirectRDMACapable = u8::from(self.options.gpu_direct_rdma);
        prop
    }

    fn query_granularity(&self) -> Result<usize> {
        let d = driver()?;
        let prop = self.prop();
        let mut granularity = 0usize;
        // SAFETY: valid pointers for the call.
        unsafe { cu_call!(d, cuMemGetAllocationGranularity(&mut granularity, &prop, self.options.granularity.raw())) }?;
        if granularity == 0 {
            return Err(Error::InvalidState("the driver reported a granularity of 0".to_string()));
        }
        Ok(granularity)
    }

    /// The device the resource allocates for.
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

    /// The location of the memory it allocates, as the driver describes it.
    pub(crate) fn location(&self) -> CUmemLocation {
        self.location
    }

    /// The alignment of its reservations.
    fn alignment(&self) -> usize {
        if self.options.address_alignment == 0 { self.granularity } else { self.options.address_alignment }
    }

    /// One physical chunk of `size` bytes with this resource's properties and access.
    pub(crate) fn create_chunk(&self, size: usize) -> Result<Arc<Physical>> {
        Physical::create(size, &self.prop(), self.access.clone())
    }

    /// The access descriptors mappings of this resource get.
    pub(crate) fn access(&self) -> &[CUmemAccessDesc] {
        &self.access
    }

    /// Reserves `size` bytes with this resource's alignment and hint.
    pub(crate) fn reserve(&self, size: usize) -> Result<Arc<Reservation>> {
        Reservation::reserve(size, self.alignment(), self.options.address_hint)
    }

    /// Allocates at least `size` bytes (rounded up to the granularity: the buffer's size is the
    /// rounded size), freed, after `stream` (or the device's legacy default stream) has finished
    /// its work, when the last buffer using the memory is dropped. A zero size gives an empty
    /// buffer without any driver call.
    ///
    /// # Errors
    /// Driver errors from any step; every step already taken is undone.
    pub fn allocate(self: &Arc<Self>, size: usize, stream: Option<&Stream>) -> Result<VirtualBuffer> {
        let stream = stream.cloned().unwrap_or_else(|| self.device.default_stream());
        if size == 0 {
            let range = Range { base: 0, mappings: Vec::new(), stream: Some(stream) };
            return Ok(VirtualBuffer::new(Arc::new(range), 0, Arc::clone(self), false));
        }
        let aligned = round_up(size, self.granularity)?;
        let physical = self.create_chunk(aligned)?;
        let reservation = self.reserve(aligned)?;
        let mapping = Mapping::map(reservation.ptr, physical, Arc::clone(&reservation))?;
        let range = Range { base: reservation.ptr, mappings: vec![mapping], stream: Some(stream) };
        Ok(VirtualBuffer::new(Arc::new(range), aligned, Arc::clone(self), false))
    }

    /// A buffer covering `buffer`'s bytes and more, `new_size` in all (rounded up).
    ///
    /// It first reserves the addresses right after the buffer's and maps one new chunk there:
    /// the pointer stays the same and nothing is copied. If the driver puts that reservation
    /// elsewhere, it reserves a new range and maps every existing chunk again, then the new one:
    /// a new pointer, still no copy. Either way `buffer` stays valid and aliases the same
    /// memory; existing chunks keep their access. Growing to a size already covered makes no
    /// driver call. A failure leaves `buffer` untouched and leaks nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a buffer of another resource; driver errors.
    pub fn grow(self: &Arc<Self>, buffer: &VirtualBuffer, new_size: usize) -> Result<VirtualBuffer> {
        if !Arc::ptr_eq(buffer.resource(), self) {
            return Err(Error::InvalidArgument(
                "the buffer was not allocated by this VirtualMemoryResource".to_string(),
            ));
        }
        let range = buffer.range();
        if range.mappings.is_empty() {
            return self.allocate(new_size, range.stream.as_ref());
        }
        let requested = round_up(new_size, self.granularity)?;
        let total = range.mapped_size();
        if requested <= total {
            return Ok(VirtualBuffer::new(
                Arc::clone(range),
                requested.max(buffer.size()),
                Arc::clone(self),
                buffer.is_imported(),
            ));
        }
        let added = requested - total;
        let end = range.base + total as u64;
        // In place: the addresses right after the buffer, if the driver grants them.
        match Reservation::reserve(added, 0, end) {
            Ok(next) if next.ptr == end => {
                let physical = self.create_chunk(added)?;
                let mapping = Mapping::map(next.ptr, physical, next)?;
                let mut mappings = range.mappings.clone();
                mappings.push(mapping);
                let grown = Range { base: range.base, mappings, stream: range.stream.clone() };
                return Ok(VirtualBuffer::new(Arc::new(grown), requested, Arc::clone(self), buffer.is_imported()));
            }
            // Granted elsewhere (dropped here, so freed) or refused: move instead.
            _ => {}
        }
        let reservation = self.reserve(requested)?;
        let mut mappings = Vec::with_capacity(range.mappings.len() + 1);
        let mut offset = 0u64;
        for existing in &range.mappings {
            let physical = Arc::clone(&existing.physical);
            mappings.push(Mapping::map(reservation.ptr + offset, physical, Arc::clone(&reservation))?);
            offset += existing.size() as u64;
        }
        let physical = self.create_chunk(added)?;
        mappings.push(Mapping::map(reservation.ptr + offset, physical, Arc::clone(&reservation))?);
        let moved = Range { base: reservation.ptr, mappings, stream: range.stream.clone() };
        Ok(VirtualBuffer::new(Arc::new(moved), requested, Arc::clone(self), buffer.is_imported()))
    }
}
