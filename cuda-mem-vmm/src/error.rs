//! The crate's error type: what went wrong, as variants a caller can match, each saying what to
//! do; a driver error stays the [`source`](std::error::Error::source) and answers
//! [`VmmError::cuda_code`].

use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{Device, DevicePtr, HandleType, Location};

/// Everything that can go wrong in `cuda-mem-vmm`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VmmError {
    /// A driver call failed, or `cuda-mem-core` refused an operation.
    #[error(transparent)]
    Core(#[from] cuda_mem_core::Error),

    /// The device lacks a capability the resource's options need.
    #[error("not supported: {}", unsupported_message(*.device, *.feature))]
    Unsupported {
        /// The resource's device.
        device: Device,
        /// What it lacks.
        feature: DeviceFeature,
    },

    /// The options cannot work together, whatever the device.
    #[error(transparent)]
    InvalidOptions(#[from] InvalidOptions),

    /// The driver refuses managed physical allocations for the device (it answered the
    /// granularity query with an error).
    #[error(
        "not supported: the driver refuses managed physical allocations for {device} ({source}); use \
         AllocationType::Pinned"
    )]
    ManagedRefused {
        /// The resource's device.
        device: Device,
        /// The driver's answer.
        #[source]
        source: cuda_mem_core::Error,
    },

    /// The driver reported a granularity of 0.
    #[error("the driver reported a granularity of 0")]
    ZeroGranularity,

    /// A size rounded up to the granularity does not fit in `usize`.
    #[error("invalid argument: {size} bytes rounded up to the {granularity}-byte granularity overflow")]
    SizeOverflow {
        /// The size asked for.
        size: usize,
        /// The granularity.
        granularity: usize,
    },

    /// The address space the options reserve ahead ([`ReserveAhead`](crate::ReserveAhead)) is
    /// more than the driver gives for one reservation: every allocation and growth would fail
    /// with `cuMemAddressReserve`'s error, so the resource is refused at construction.
    #[error(
        "invalid argument: reserve_ahead ReserveAhead::{requested:?} asks {size} bytes of address space for every \
         reservation, which the driver refuses ({source}), so every allocation would fail: reserve less ahead, or \
         None"
    )]
    ReserveAheadRefused {
        /// The option as given.
        requested: crate::ReserveAhead,
        /// The size of each reservation it asks for (rounded up to the granularity).
        size: usize,
        /// The driver's refusal of a reservation of that size, tried (and freed) at
        /// construction.
        #[source]
        source: cuda_mem_core::Error,
    },

    /// A virtual buffer given to a resource that did not allocate (or import) it.
    #[error("invalid argument: the buffer was not allocated by this VirtualMemoryResource")]
    ForeignBuffer,

    /// Memory given back to a resource that did not hand it out (or took it back already).
    #[error(
        "invalid argument: {size} bytes at {ptr:#x} were not allocated by this VirtualMemoryResource, or were \
         freed already"
    )]
    ForeignPointer {
        /// The address given back.
        ptr: DevicePtr,
        /// The size given back.
        size: usize,
    },

    /// An expandable range ([`ExpandableMemory`](cuda_mem_core::ExpandableMemory)) asked to
    /// map a size that is not a positive multiple of the granularity, or more than its
    /// reservation holds.
    #[error(
        "cannot map {size} more bytes in the expandable range at {base:#x}: {mapped} of its {reserved} bytes are \
         mapped, and growth is by positive multiples of the granularity"
    )]
    PastReservation {
        /// The range's base.
        base: DevicePtr,
        /// The bytes mapped in it.
        mapped: usize,
        /// The bytes asked to be mapped.
        size: usize,
        /// The bytes reserved.
        reserved: usize,
    },

    /// The buffer spans more chunks than one descriptor can name.
    #[error(
        "the buffer spans {chunks} chunks; a descriptor can name at most {max} (one message of file \
         descriptors): grow in fewer, larger steps"
    )]
    TooManyChunks {
        /// How many chunks the buffer spans.
        chunks: usize,
        /// The most a descriptor names ([`MAX_CHUNKS`](crate::MAX_CHUNKS)).
        max: usize,
    },

    /// An imported buffer cannot be exported again.
    #[error("an imported virtual buffer cannot be exported again: forward the descriptor it was imported from")]
    ImportedBuffer,

    /// The buffer's resource has no exportable handle type.
    #[error(
        "not supported: the buffer's resource has handle_type None: create it with HandleType::PosixFd or Fabric \
         to share it"
    )]
    NotExportable,

    /// Exporting one chunk failed; the handles exported before it were closed.
    #[error(
        "exporting chunk {chunk} of {count} failed after {exported} were exported (their descriptors are closed; \
         if the process is out of file descriptors, raise its limit): {source}"
    )]
    ExportFailed {
        /// The chunk that failed, from 1.
        chunk: usize,
        /// How many chunks the buffer spans.
        count: usize,
        /// How many were exported before it.
        exported: usize,
        /// The driver's error.
        #[source]
        source: cuda_mem_core::Error,
    },

    /// A descriptor was refused before anything was mapped (the chunks imported to check it,
    /// if any, were released): what the sender got wrong.
    #[error("invalid argument: {0}")]
    Descriptor(#[from] DescriptorError),

    /// Importing one chunk's handle failed; nothing stays imported.
    #[error("importing chunk {chunk} of {count}: {source}")]
    ChunkImport {
        /// The chunk that failed, from 1.
        chunk: usize,
        /// How many chunks the descriptor names.
        count: usize,
        /// The driver's error.
        #[source]
        source: cuda_mem_core::Error,
    },

    /// An imported chunk is memory elsewhere than where this resource maps memory.
    #[error(
        "invalid argument: chunk {chunk} of {count} is memory at {}, but this resource maps memory at {wanted}; \
         import it with a resource for that location",
        found.map_or_else(|| "a location this crate cannot name".to_owned(), |l| l.to_string())
    )]
    ChunkLocation {
        /// The chunk, from 1.
        chunk: usize,
        /// How many chunks the descriptor names.
        count: usize,
        /// Where the chunk is (`None`: a location this crate cannot name).
        found: Option<Location>,
        /// Where this resource maps memory.
        wanted: Location,
    },

    /// Mapping one imported chunk failed; nothing stays mapped.
    #[error("mapping chunk {chunk} of {count} ({size} bytes): {source}")]
    ChunkMap {
        /// The chunk that failed, from 1.
        chunk: usize,
        /// How many chunks the descriptor names.
        count: usize,
        /// The chunk's size.
        size: u64,
        /// The driver's error.
        #[source]
        source: cuda_mem_core::Error,
    },

    /// A virtual buffer cannot be closed on a capturing stream; it was given back, unchanged.
    #[error(
        "cannot close a virtual buffer on a capturing stream: unmapping virtual memory is not stream-ordered and \
         cannot be captured; close it once the capture has ended (dropping it instead defers the release until \
         then)"
    )]
    CapturingStream,

    /// Memory could not be released yet and stays mapped: it is released later, at the next
    /// allocation, growth, import or release of any virtual memory resource after its stream
    /// can be waited for, when a resource is dropped, or by [`release_deferred`](crate::release_deferred).
    #[error(
        "the release of {size} bytes of virtual memory at {ptr:#x} is deferred: {cause}; the memory stays mapped \
         and is released at a later allocation, growth, import or release once its stream can be waited for (or \
         call cuda_mem_vmm::release_deferred)"
    )]
    ReleaseDeferred {
        /// The start of the range kept mapped.
        ptr: DevicePtr,
        /// The bytes kept mapped.
        size: usize,
        /// Why it could not be released now.
        #[source]
        cause: DeferCause,
    },

    /// The memory of an elastic group is released (asleep): wake the group first. Nothing was
    /// done.
    #[error("the memory of elastic group {tag:?} is released (the group is asleep): wake it first")]
    Asleep {
        /// The group's tag.
        tag: String,
    },

    /// An elastic group cannot sleep or wake while its buffers are accessed (an
    /// [`ElasticAccess`](crate::ElasticAccess) lives), nor an on-demand range map or unmap
    /// while its pages are accessed. Nothing was done: try again once they are dropped.
    #[error("{memory} is in use (an access to it lives): drop the accesses first; nothing was done")]
    InUse {
        /// Which memory.
        memory: ElasticMemory,
    },

    /// Physical memory ran out while mapping elastic memory: nothing of the attempt stays
    /// mapped (what was mapped before it is as it was).
    #[error(
        "out of physical memory mapping {requested} bytes of elastic memory ({mapped} bytes mapped before): {source}"
    )]
    PhysicalMemoryExhausted {
        /// The bytes the attempt was to map.
        requested: usize,
        /// The bytes mapped (of the group or range) before the attempt, and after it.
        mapped: usize,
        /// The driver's refusal (`CUDA_ERROR_OUT_OF_MEMORY`).
        #[source]
        source: cuda_mem_core::Error,
    },

    /// Pages outside an on-demand range.
    #[error("invalid argument: pages {first}..{end} lie outside the range's {count} pages")]
    PagesOutOfRange {
        /// The first page asked for.
        first: usize,
        /// The page after the last one asked for.
        end: usize,
        /// The range's pages.
        count: usize,
    },

    /// Bytes of an on-demand range that are not all mapped cannot be accessed.
    #[error("{len} bytes at offset {offset} of the on-demand range include unmapped page {page}: map it first")]
    NotMapped {
        /// The offset asked for.
        offset: usize,
        /// The bytes asked for.
        len: usize,
        /// The first unmapped page among them.
        page: usize,
    },
}

impl VmmError {
    /// The driver's code, when the error came from a driver call (also one wrapped with the
    /// chunk it concerned, or the cause of a deferred release).
    pub fn cuda_code(&self) -> Option<CUresult> {
        match self {
            VmmError::Core(error)
            | VmmError::ManagedRefused { source: error, .. }
            | VmmError::ExportFailed { source: error, .. }
            | VmmError::ChunkImport { source: error, .. }
            | VmmError::ChunkMap { source: error, .. }
            | VmmError::ReserveAheadRefused { source: error, .. }
            | VmmError::PhysicalMemoryExhausted { source: error, .. } => error.cuda_code(),
            VmmError::ReleaseDeferred { cause, .. } => cause.cuda_code(),
            _ => None,
        }
    }

    /// The error as `cuda-mem-core`'s (see the `From` conversion).
    pub(crate) fn into_core(self) -> cuda_mem_core::Error {
        self.into()
    }
}

/// A `VmmError` as `cuda-mem-core`'s error, for the
/// [`MemoryResource`](cuda_mem_core::MemoryResource) methods, whose signatures name that type: a
/// core error as it was, any other kept whole as an
/// [`Error::Resource`](cuda_mem_core::Error::Resource), its source (downcast it to match on the
/// `VmmError`; [`cuda_mem_core::Error::cuda_code`] finds a driver code inside it).
impl From<VmmError> for cuda_mem_core::Error {
    fn from(error: VmmError) -> Self {
        match error {
            VmmError::Core(error) => error,
            other => cuda_mem_core::Error::resource(other),
        }
    }
}

/// Elastic memory an error concerns ([`VmmError::InUse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ElasticMemory {
    /// An [`ElasticGroup`](crate::ElasticGroup), by its tag.
    Group {
        /// The group's tag.
        tag: String,
    },
    /// An [`OnDemandRange`](crate::OnDemandRange), by its first address.
    OnDemandRange {
        /// The range's first address.
        ptr: DevicePtr,
    },
}

impl std::fmt::Display for ElasticMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElasticMemory::Group { tag } => write!(f, "elastic group {tag:?}"),
            ElasticMemory::OnDemandRange { ptr } => write!(f, "the on-demand range at {ptr:#x}"),
        }
    }
}

/// A capability of the device that the options need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceFeature {
    /// The virtual memory management API itself.
    VirtualMemoryManagement,
    /// Exporting memory as POSIX file descriptors ([`HandleType::PosixFd`]).
    PosixFdHandles,
    /// Exporting memory as fabric handles ([`HandleType::Fabric`]).
    FabricHandles,
    /// An IMEX channel granted to this process, without which the driver makes no memory for
    /// fabric handles (`CUDA_ERROR_NOT_PERMITTED`) although the device supports them.
    ImexChannel,
    /// GPUDirect RDMA with VMM allocations (`gpu_direct_rdma(true)`).
    GpuDirectRdma,
}

fn unsupported_message(device: Device, feature: DeviceFeature) -> String {
    match feature {
        DeviceFeature::VirtualMemoryManagement => {
            format!("{device} does not support the virtual memory management API; use a pool resource instead")
        }
        DeviceFeature::PosixFdHandles => {
            format!("{device} cannot export memory as POSIX file descriptors; use handle_type(None)")
        }
        DeviceFeature::FabricHandles => {
            format!("{device} cannot export memory as fabric handles; use handle_type(HandleType::PosixFd) or None")
        }
        DeviceFeature::ImexChannel => format!(
            "{device} supports fabric handles, but the driver refused to make fabric memory for this process \
             (CUDA_ERROR_NOT_PERMITTED): fabric handles need an IMEX channel the user can open \
             (/dev/nvidia-caps-imex-channels/channel*); grant one, or use handle_type(HandleType::PosixFd) or None"
        ),
        DeviceFeature::GpuDirectRdma => {
            format!("{device} does not support GPUDirect RDMA with VMM allocations; set gpu_direct_rdma(false)")
        }
    }
}

/// Options that cannot work together, on any device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidOptions {
    /// `address_alignment` is neither 0 nor a power of two.
    #[error("invalid argument: address_alignment must be a power of two (or 0 for the granularity), got {0}")]
    AlignmentNotPowerOfTwo(usize),
    /// Plain host memory with an exportable handle type.
    #[error(
        "invalid argument: memory at Location::Host cannot have an exportable handle type: use \
         handle_type(None), or Location::HostNuma(node) to share host memory"
    )]
    ExportableHostMemory,
    /// A handle type virtual memory is not shared as here (Windows handles).
    #[error(
        "not supported: virtual memory is shared as POSIX file descriptors or fabric handles, not as a {0}: use \
         handle_type(HandleType::PosixFd), HandleType::Fabric, or None"
    )]
    UnsupportedHandleType(HandleType),
    /// A location physical memory of the resource cannot be placed at: the calling thread's NUMA
    /// node ([`Location::HostNumaCurrent`]), which names no fixed place, or another device.
    #[error(
        "not supported: a virtual memory resource for {device} cannot place memory at {location}: use None (its \
         device), Location::Host or Location::HostNuma(node), or a resource for the other device"
    )]
    Location {
        /// The location refused.
        location: Location,
        /// The resource's device.
        device: Device,
    },
    /// The owning device listed among the peers.
    #[error(
        "invalid argument: {0} owns the memory and cannot also be one of its peers; set its access with self_access"
    )]
    OwnerAsPeer(Device),
}

/// Why a descriptor was refused, before anything was mapped: most before anything is imported;
/// [`ChunkLargerThanClaimed`](DescriptorError::ChunkLargerThanClaimed) and a
/// [`RepeatedChunk`](DescriptorError::RepeatedChunk) the driver reveals once the chunks are
/// imported, which are then released. (Why bytes do not decode to a descriptor is
/// `cuda-mem-ipc`'s to say, which owns the encoding.)
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorError {
    /// Not one handle per chunk size.
    #[error("malformed virtual buffer descriptor: {sizes} chunk sizes for {handles} handles")]
    SizesForHandles {
        /// The chunk sizes.
        sizes: usize,
        /// The handles.
        handles: usize,
    },
    /// A size but no chunks.
    #[error("malformed virtual buffer descriptor: size {size} with no exported chunks")]
    NoChunks {
        /// The size claimed.
        size: u64,
    },
    /// More chunks than a descriptor may name ([`MAX_CHUNKS`](crate::MAX_CHUNKS)): no export
    /// gives one, and no message could carry its file descriptors.
    #[error("malformed virtual buffer descriptor: {chunks} chunks, but a descriptor names at most {max}")]
    TooManyChunks {
        /// The chunks it names.
        chunks: usize,
        /// [`MAX_CHUNKS`](crate::MAX_CHUNKS).
        max: usize,
    },
    /// Chunks for a buffer of size 0: an empty buffer exports none.
    #[error("malformed virtual buffer descriptor: size 0 with {chunks} chunks (an empty buffer exports none)")]
    ZeroSizeWithChunks {
        /// The chunks it names.
        chunks: usize,
    },
    /// Two chunks are the same memory (the same file, open file description or fabric handle,
    /// or the same allocation as the driver imports it): the buffer would alias itself, which no
    /// export gives.
    #[error("malformed virtual buffer descriptor: chunk {chunk} is the memory of chunk {first} again")]
    RepeatedChunk {
        /// The later chunk, from 1.
        chunk: usize,
        /// The earlier chunk it repeats, from 1.
        first: usize,
    },
    /// A chunk's physical allocation is larger than the size the descriptor gives it: the
    /// importer would map only its first part, and every later chunk at the wrong offset of the
    /// exporter's buffer. (The driver maps more of it than that; how much larger it is, it does
    /// not say.)
    #[error(
        "malformed virtual buffer descriptor: chunk {chunk} claims {claimed} bytes, but its physical allocation is \
         larger; a chunk's size is its whole allocation's"
    )]
    ChunkLargerThanClaimed {
        /// The chunk, from 1.
        chunk: usize,
        /// The size the descriptor gives it.
        claimed: u64,
    },
    /// A chunk's handle is not of the descriptor's handle type.
    #[error(
        "malformed virtual buffer descriptor: chunk {chunk} carries {carries} but the descriptor's handle type is \
         {handle_type:?}"
    )]
    HandleKind {
        /// The chunk, from 1.
        chunk: usize,
        /// What it carries ("a file descriptor", "a fabric handle").
        carries: &'static str,
        /// The descriptor's handle type.
        handle_type: HandleType,
    },
    /// The chunk sizes add up past `u64`.
    #[error("malformed virtual buffer descriptor: chunk sizes overflow")]
    ChunkSizesOverflow,
    /// The chunks are larger than this machine's address space.
    #[error("malformed virtual buffer descriptor: chunks larger than this machine's address space")]
    AddressSpace,
    /// The descriptor's handle type is not the importing resource's.
    #[error(
        "the descriptor's handle type is {descriptor:?} but this resource's is {}; import it with a \
         resource configured like the exporter's",
        .resource.map_or_else(|| "None".to_string(), |t| format!("{t:?}"))
    )]
    HandleTypeMismatch {
        /// The descriptor's.
        descriptor: HandleType,
        /// The importing resource's (`None`: it exports nothing).
        resource: Option<HandleType>,
    },
    /// A chunk size that is 0 or not a multiple of the importer's granularity.
    #[error("descriptor chunk size {size} is not a positive multiple of the {granularity}-byte granularity")]
    ChunkSize {
        /// The chunk size.
        size: u64,
        /// The importing resource's granularity.
        granularity: u64,
    },
    /// The claimed size does not fit in the chunks.
    #[error("descriptor size ({size}) exceeds the exported chunks ({total} bytes)")]
    SizeExceedsChunks {
        /// The size claimed.
        size: u64,
        /// The chunks' total size.
        total: u64,
    },
}

/// Why memory could not be released at once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeferCause {
    /// Its stream is capturing: waiting for it would disturb the capture, and the captured work
    /// may still use the memory.
    #[error(
        "its stream is capturing, and unmapping, which is not stream-ordered, must not disturb the capture nor \
         pull memory from under the work it records"
    )]
    Capturing,
    /// Whether its stream captures could not be read.
    #[error("reading its stream's capture status failed: {0}")]
    CaptureStatus(#[source] cuda_mem_core::Error),
    /// Waiting for its stream failed both ways: synchronizing it (the error kept here), then
    /// waiting for an event recorded at its end.
    #[error("synchronizing its stream failed (and so did waiting for an event at its end): {0}")]
    Synchronize(#[source] cuda_mem_core::Error),
}

impl DeferCause {
    /// The driver's code, when a driver call failed.
    pub fn cuda_code(&self) -> Option<CUresult> {
        match self {
            DeferCause::Capturing => None,
            DeferCause::CaptureStatus(error) | DeferCause::Synchronize(error) => error.cuda_code(),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = VmmError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem_core::NumaNode;
    use std::error::Error as _;

    #[test]
    fn a_driver_error_inside_keeps_its_code_and_is_the_source() {
        let driver = cuda_mem_core::sys::DriverError::from_header(
            "cuMemImportFromShareableHandle",
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        );
        let error = VmmError::ChunkImport { chunk: 2, count: 3, source: cuda_mem_core::Error::from(driver) };
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(error.to_string().starts_with("importing chunk 2 of 3: "), "{error}");
        assert!(error.source().is_some());
    }

    #[test]
    fn errors_without_a_driver_call_have_no_code() {
        assert_eq!(VmmError::ForeignBuffer.cuda_code(), None);
        let deferred = VmmError::ReleaseDeferred { ptr: 0x1000, size: 4096, cause: DeferCause::Capturing };
        assert_eq!(deferred.cuda_code(), None);
        assert!(deferred.to_string().contains("at 0x1000 is deferred: its stream is capturing"), "{deferred}");
    }

    #[test]
    fn a_resource_without_a_handle_type_reads_as_none() {
        let error = DescriptorError::HandleTypeMismatch { descriptor: HandleType::PosixFd, resource: None };
        assert!(error.to_string().starts_with("the descriptor's handle type is PosixFd but this resource's is None;"));
        let error =
            DescriptorError::HandleTypeMismatch { descriptor: HandleType::PosixFd, resource: Some(HandleType::Fabric) };
        assert!(error.to_string().contains("is PosixFd but this resource's is Fabric;"), "{error}");
    }

    #[test]
    fn a_chunk_elsewhere_names_both_locations() {
        let wanted = Location::HostNuma(NumaNode(0));
        let error = VmmError::ChunkLocation { chunk: 1, count: 2, found: Some(Location::Host), wanted };
        assert!(
            error
                .to_string()
                .contains("chunk 1 of 2 is memory at the host, but this resource maps memory at host NUMA node 0"),
            "{error}"
        );
        let error = VmmError::ChunkLocation { chunk: 2, count: 2, found: None, wanted };
        assert!(error.to_string().contains("is memory at a location this crate cannot name"), "{error}");
    }
}
