//! `VirtualMemoryResourceOptions`: every option of the resource, typed, with cuda.core's
//! defaults. The handle type and the access are `cuda-mem-core`'s vocabulary
//! ([`HandleType`], [`Access`]), shared with the pools.

use cuda_mem_core::sys::types::{CUmemAllocationGranularity_flags, CUmemAllocationType};
use cuda_mem_core::{Access, Device, HandleType, Location};

/// What kind of physical memory to create.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AllocationType {
    /// Memory that stays where it is created (`CU_MEM_ALLOCATION_TYPE_PINNED`).
    #[default]
    Pinned,
    /// Managed memory (`CU_MEM_ALLOCATION_TYPE_MANAGED`, CUDA 13).
    Managed,
}

impl AllocationType {
    pub(crate) fn raw(self) -> CUmemAllocationType {
        match self {
            AllocationType::Pinned => CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            AllocationType::Managed => CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
        }
    }
}

/// Which granularity sizes are rounded to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Granularity {
    /// The smallest the driver accepts.
    Minimum,
    /// The driver's recommendation for performance.
    #[default]
    Recommended,
}

impl Granularity {
    pub(crate) fn raw(self) -> CUmemAllocationGranularity_flags {
        match self {
            Granularity::Minimum => CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            Granularity::Recommended => CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        }
    }
}

/// How much address space each reservation of a
/// [`VirtualMemoryResource`](crate::VirtualMemoryResource) takes beyond what it maps, so that a
/// buffer grows inside it: the new chunks are mapped right after the old ones, with no address
/// hint to be refused, and the pointer never moves (PyTorch's expandable segments do the same).
///
/// The pointer stays where nothing is mapped after the buffer yet: growing the same buffer a
/// second time while its first growth (or a buffer grown from that) lives moves, as the
/// addresses after it are the first growth's; they are free again once that growth and what
/// grew from it are dropped.
///
/// Every reservation the resource makes (for an allocation, for a growth past a reservation's
/// end, for a move, for an import) is then at least this large; a buffer larger than that gets a
/// reservation of its own size. Growth past the reservation takes the usual path (the addresses
/// right after it, if the driver grants them, else a move), and the reservation it makes is
/// again this large.
///
/// Reserving costs address space only: no physical memory is created or mapped until the buffer
/// grows into it, and the unmapped part cannot be read or written. The device's virtual address
/// space is large but finite, and `cuMemAddressReserve` fails with
/// `CUDA_ERROR_OUT_OF_MEMORY` when it is used up (it is shared with every other allocation of the
/// process): with [`ReserveAhead::DeviceMemory`] every live reservation takes as much address
/// space as the device has memory, so the number of reservations that can live at once is the
/// address space divided by the device's memory. Reserving is one `cuMemAddressReserve` call
/// whatever the size. A size the driver cannot reserve at all is refused at construction:
/// [`VirtualMemoryResource::new`](crate::VirtualMemoryResource::new) makes and frees one
/// reservation of it ([`VmmError::ReserveAheadRefused`](crate::VmmError::ReserveAheadRefused)),
/// rather than handing out a resource whose every allocation would fail.
///
/// Sharing is unchanged: an export names the buffer's chunks only, so the importer maps the
/// mapped part (into a reservation of its own resource's options), never the reserved rest.
/// The reservation is freed with its last mapping: when the last buffer mapping any of it (the
/// buffer, the buffers it grew from and those grown from it) is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveAhead {
    /// At least this many bytes (rounded up to the granularity) per reservation.
    Bytes(usize),
    /// As many bytes as the resource's device has memory (`cuDeviceTotalMem`): a buffer of
    /// device memory then never grows past its reservation.
    DeviceMemory,
}

/// How a [`VirtualMemoryResource`](crate::VirtualMemoryResource) allocates. The defaults are
/// cuda.core's: pinned device memory, POSIX-fd handles (on Unix; elsewhere `None`, as file
/// descriptors exist on Unix only), recommended granularity, no RDMA, the driver's choice of
/// address and alignment, no peers, read-write access; no address space reserved ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VirtualMemoryResourceOptions {
    /// Pinned or managed memory.
    pub allocation_type: AllocationType,
    /// Where the memory lives: `None` (the default) for the resource's device; otherwise that
    /// device again, [`Location::Host`], or a [`Location::HostNuma`] node
    /// (`device.host_numa_node()?` names the one closest to the device). The calling thread's
    /// node and other devices are refused.
    pub location: Option<Location>,
    /// The handle type chunks can be exported as: [`HandleType::PosixFd`] (Unix only) or
    /// [`HandleType::Fabric`]; `None` for memory that is not exported.
    pub handle_type: Option<HandleType>,
    /// The granularity sizes are rounded to.
    pub granularity: Granularity,
    /// Whether the memory must be usable for GPUDirect RDMA.
    pub gpu_direct_rdma: bool,
    /// An address to try to reserve at (0: the driver's choice).
    pub address_hint: u64,
    /// The alignment of reservations (0: the granularity); a power of two.
    pub address_alignment: usize,
    /// Devices besides the owner that get access.
    pub peers: Vec<Device>,
    /// The owner's access ([`Access::None`]: no access descriptor is set for it).
    pub self_access: Access,
    /// Each peer's access ([`Access::None`]: no access descriptor is set for them).
    pub peer_access: Access,
    /// Address space reserved ahead of each buffer, for growth that never moves; `None`: each
    /// reservation is as large as what it maps.
    pub reserve_ahead: Option<ReserveAhead>,
}

impl Default for VirtualMemoryResourceOptions {
    fn default() -> Self {
        VirtualMemoryResourceOptions {
            allocation_type: AllocationType::default(),
            location: None,
            // Exportable by default where file descriptors exist (Unix); not exported elsewhere.
            handle_type: if cfg!(unix) { Some(HandleType::PosixFd) } else { None },
            granularity: Granularity::default(),
            gpu_direct_rdma: false,
            address_hint: 0,
            address_alignment: 0,
            peers: Vec::new(),
            self_access: Access::ReadWrite,
            peer_access: Access::ReadWrite,
            reserve_ahead: None,
        }
    }
}

impl VirtualMemoryResourceOptions {
    /// With an allocation type.
    pub fn allocation_type(mut self, value: AllocationType) -> Self {
        self.allocation_type = value;
        self
    }

    /// With the memory at a location (`None`: on the resource's device).
    pub fn location(mut self, value: impl Into<Option<Location>>) -> Self {
        self.location = value.into();
        self
    }

    /// With a handle type (`HandleType::PosixFd` or `HandleType::Fabric`), or `None` for
    /// memory that is not exported.
    pub fn handle_type(mut self, value: impl Into<Option<HandleType>>) -> Self {
        self.handle_type = value.into();
        self
    }

    /// With a granularity.
    pub fn granularity(mut self, value: Granularity) -> Self {
        self.granularity = value;
        self
    }

    /// With GPUDirect RDMA on or off.
    pub fn gpu_direct_rdma(mut self, value: bool) -> Self {
        self.gpu_direct_rdma = value;
        self
    }

    /// With an address hint.
    pub fn address_hint(mut self, value: u64) -> Self {
        self.address_hint = value;
        self
    }

    /// With a reservation alignment.
    pub fn address_alignment(mut self, value: usize) -> Self {
        self.address_alignment = value;
        self
    }

    /// With peers.
    pub fn peers(mut self, value: impl IntoIterator<Item = Device>) -> Self {
        self.peers = value.into_iter().collect();
        self
    }

    /// With the owner's access.
    pub fn self_access(mut self, value: Access) -> Self {
        self.self_access = value;
        self
    }

    /// With the peers' access.
    pub fn peer_access(mut self, value: Access) -> Self {
        self.peer_access = value;
        self
    }

    /// With address space reserved ahead (see [`ReserveAhead`]), or `None` for none.
    pub fn reserve_ahead(mut self, value: impl Into<Option<ReserveAhead>>) -> Self {
        self.reserve_ahead = value.into();
        self
    }
}
