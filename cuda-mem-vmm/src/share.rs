//! Sharing a virtual buffer with another process: one shareable handle per physical chunk.
//!
//! A [`VirtualBufferDescriptor`] holds the handle type, the buffer's size, each chunk's size and
//! its handle (an owned file descriptor, or a fabric handle's 64 bytes): the descriptor in
//! memory, no bytes. The importer checks everything it can before mapping anything; then it maps
//! the chunks into one new reservation with its own access.
//!
//! This crate makes the driver calls and nothing else: its bytes on the wire, checksummed and
//! versioned, and the passing of its file descriptors are `cuda-mem-ipc`'s (feature `vmm`:
//! `IpcChannel::send_virtual_buffer`, and the encoding for other transports).
//!
//! File descriptors ([`ChunkHandle::Fd`]) exist on Unix only (`cfg(unix)`); elsewhere only
//! fabric handles can be carried, and a resource cannot be created with
//! [`HandleType::PosixFd`](cuda_mem_core::HandleType::PosixFd).

#[cfg(unix)]
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cuda_mem_core::history::{MemoryEventKind, ResourceId};
use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{
    CUmemAllocationProp, CUmemFabricHandle, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult,
};
use cuda_mem_core::{HandleType, Location, Stream, driver, record_drop_error};

use crate::buffer::VirtualBuffer;
use crate::error::{DescriptorError, Result, VmmError};
use crate::pieces::{Physical, Reservation, map_contiguously};
use crate::release::release_deferred;
use crate::resource::VirtualMemoryResource;

/// The most chunks an exported descriptor may name: the most file descriptors one `SCM_RIGHTS`
/// message carries (`cuda-mem-ipc`'s `MAX_FDS`), so that one message carries any descriptor.
pub const MAX_CHUNKS: usize = 253;

/// One chunk's shareable handle.
#[derive(Debug)]
pub enum ChunkHandle {
    /// A POSIX file descriptor (closed when dropped). Unix only.
    #[cfg(unix)]
    Fd(OwnedFd),
    /// A fabric handle.
    Fabric([u8; 64]),
}

/// What another process needs to map a virtual buffer.
#[doc(alias = "VirtualMemoryIPCBufferDescriptor")]
#[derive(Debug)]
pub struct VirtualBufferDescriptor {
    /// The handle type every chunk is exported as.
    pub handle_type: HandleType,
    /// The buffer's size.
    pub size: u64,
    /// Each chunk's size, in order.
    pub chunk_sizes: Vec<u64>,
    /// Each chunk's handle, in order.
    pub handles: Vec<ChunkHandle>,
}

impl VirtualBuffer {
    /// Exports the buffer: one handle per chunk. Running out of file descriptors part way
    /// closes those already opened and says so.
    ///
    /// # Errors
    /// [`VmmError::TooManyChunks`] past [`MAX_CHUNKS`], [`VmmError::ImportedBuffer`] for an
    /// imported buffer (forward the descriptor you received instead), [`VmmError::NotExportable`]
    /// for a resource without an exportable handle type, [`VmmError::ExportFailed`] naming the
    /// chunk the driver refused (or gave no file descriptor for).
    #[doc(alias("ipc_descriptor", "get_ipc_descriptor"))]
    pub fn export(&self) -> Result<VirtualBufferDescriptor> {
        if self.chunk_count() > MAX_CHUNKS {
            return Err(VmmError::TooManyChunks { chunks: self.chunk_count(), max: MAX_CHUNKS });
        }
        if self.is_imported() {
            return Err(VmmError::ImportedBuffer);
        }
        let Some(handle_type) = self.resource().options().handle_type else {
            return Err(VmmError::NotExportable);
        };
        let d = driver()?;
        let mappings = &self.range().mappings;
        let mut handles = Vec::with_capacity(mappings.len());
        for (index, mapping) in mappings.iter().enumerate() {
            let handle = mapping.physical.handle;
            let exported = match handle_type {
                HandleType::Fabric => {
                    let mut fabric = CUmemFabricHandle::default();
                    // SAFETY: a fabric export writes one `CUmemFabricHandle`.
                    unsafe {
                        cu_call!(
                            d,
                            cuMemExportToShareableHandle((&raw mut fabric).cast(), handle, handle_type.raw(), 0)
                        )
                    }
                    .map(|()| ChunkHandle::Fabric(fabric.data))
                    .map_err(cuda_mem_core::Error::from)
                }
                // POSIX file descriptors: the only other handle type a resource is created with.
                #[cfg(unix)]
                _ => {
                    let mut raw: std::ffi::c_int = -1;
                    // SAFETY: a POSIX-fd export writes one `int`, a new descriptor owned here.
                    unsafe {
                        cu_call!(d, cuMemExportToShareableHandle((&raw mut raw).cast(), handle, handle_type.raw(), 0))
                    }
                    .map_err(cuda_mem_core::Error::from)
                    // SAFETY: on success the driver handed over a new descriptor.
                    .and_then(|()| unsafe { exported_fd(raw) }.map(ChunkHandle::Fd))
                }
                // `VirtualMemoryResource::new` refuses POSIX file descriptors here, and every
                // other handle type but fabric handles everywhere.
                #[cfg(not(unix))]
                _ => {
                    let device = self.resource().device();
                    return Err(VmmError::Unsupported { device, feature: crate::error::DeviceFeature::PosixFdHandles });
                }
            };
            match exported {
                Ok(chunk) => handles.push(chunk),
                Err(source) => {
                    let exported = handles.len();
                    drop(handles);
                    return Err(VmmError::ExportFailed { chunk: index + 1, count: mappings.len(), exported, source });
                }
            }
        }
        cuda_mem_core::memory_event!(
            DEBUG,
            ptr = %hex(self.ptr()),
            size = self.size(),
            chunks = mappings.len(),
            handle_type = ?handle_type,
            "virtual buffer exported"
        );
        let resource = ResourceId::of(&**self.resource());
        cuda_mem_core::history::record(MemoryEventKind::Export, self.ptr(), self.size(), None, resource);
        Ok(VirtualBufferDescriptor {
            handle_type,
            size: self.size() as u64,
            chunk_sizes: mappings.iter().map(|m| m.size() as u64).collect(),
            handles,
        })
    }
}

impl VirtualBufferDescriptor {
    /// Checks what can be checked against `resource` before importing anything: the handle
    /// type, the counts, each handle's kind, the chunk sizes against its granularity, and the
    /// claimed size against the chunks. Returns the chunks' total size.
    fn check_for(&self, resource: &VirtualMemoryResource) -> Result<usize, DescriptorError> {
        let own = resource.options().handle_type;
        if own != Some(self.handle_type) {
            return Err(DescriptorError::HandleTypeMismatch { descriptor: self.handle_type, resource: own });
        }
        if self.chunk_sizes.len() != self.handles.len() {
            return Err(DescriptorError::SizesForHandles {
                sizes: self.chunk_sizes.len(),
                handles: self.handles.len(),
            });
        }
        if self.chunk_sizes.is_empty() && self.size != 0 {
            return Err(DescriptorError::NoChunks { size: self.size });
        }
        let chunks = self.chunk_sizes.len();
        if chunks > MAX_CHUNKS {
            return Err(DescriptorError::TooManyChunks { chunks, max: MAX_CHUNKS });
        }
        if chunks > 0 && self.size == 0 {
            return Err(DescriptorError::ZeroSizeWithChunks { chunks });
        }
        for (index, handle) in self.handles.iter().enumerate() {
            let carries = match handle {
                #[cfg(unix)]
                ChunkHandle::Fd(_) if self.handle_type == HandleType::PosixFd => continue,
                ChunkHandle::Fabric(_) if self.handle_type == HandleType::Fabric => continue,
                #[cfg(unix)]
                ChunkHandle::Fd(_) => "a file descriptor",
                ChunkHandle::Fabric(_) => "a fabric handle",
            };
            return Err(DescriptorError::HandleKind { chunk: index + 1, carries, handle_type: self.handle_type });
        }
        if let Some((first, chunk)) = repeated_handle(&self.handles) {
            return Err(DescriptorError::RepeatedChunk { chunk, first });
        }
        let granularity = resource.granularity() as u64;
        let mut total: u64 = 0;
        for &size in &self.chunk_sizes {
            if size == 0 || !size.is_multiple_of(granularity) {
                return Err(DescriptorError::ChunkSize { size, granularity });
            }
            total = total.checked_add(size).ok_or(DescriptorError::ChunkSizesOverflow)?;
        }
        if self.size > total {
            return Err(DescriptorError::SizeExceedsChunks { size: self.size, total });
        }
        usize::try_from(total).map_err(|_| DescriptorError::AddressSpace)
    }
}

/// The first chunk (from 1) whose handle names the memory of an earlier one, and that earlier
/// one: the same fabric handle, the same file (a regular file, as a `memfd`, is the memory
/// itself), or the same open file description of another kind of file (a device file: every
/// export opens one of its own, so two descriptors of one description are one export named
/// twice). Handles whose file cannot be examined are left to the driver.
fn repeated_handle(handles: &[ChunkHandle]) -> Option<(usize, usize)> {
    let mut fabric = std::collections::HashMap::new();
    #[cfg(unix)]
    let mut files: std::collections::HashMap<(u64, u64), Vec<usize>> = std::collections::HashMap::new();
    for (index, handle) in handles.iter().enumerate() {
        match handle {
            ChunkHandle::Fabric(data) => {
                if let Some(&first) = fabric.get(data) {
                    return Some((first + 1, index + 1));
                }
                fabric.insert(*data, index);
            }
            #[cfg(unix)]
            ChunkHandle::Fd(fd) => {
                let Ok(stat) = rustix::fs::fstat(fd) else { continue };
                let regular = rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
                // The kernel's types differ between targets; both fit in 64 bits.
                #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
                let key = (stat.st_dev as u64, stat.st_ino as u64);
                let earlier = files.entry(key).or_default();
                let repeated = earlier.iter().find(|&&first| {
                    regular || matches!((&handles[first], handle), (ChunkHandle::Fd(a), ChunkHandle::Fd(b)) if same_description(a, b))
                });
                if let Some(&first) = repeated {
                    return Some((first + 1, index + 1));
                }
                earlier.push(index);
            }
        }
    }
    None
}

/// Whether `a` and `b` are one open file description (`kcmp`, Linux); `false` where the kernel
/// does not say (no `kcmp`, or not permitted, as in some containers).
#[cfg(target_os = "linux")]
fn same_description(a: &OwnedFd, b: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    /// `KCMP_FILE` (`linux/kcmp.h`), which `libc` does not define for Linux.
    const KCMP_FILE: libc::c_int = 0;
    // Process ids fit in a `pid_t`.
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: `kcmp` compares two of this process's descriptors, both open while borrowed here;
    // it reads and writes no memory of the caller.
    let same = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a.as_raw_fd(), b.as_raw_fd()) };
    same == 0
}

/// Whether `a` and `b` are one open file description: not known off Linux.
#[cfg(all(unix, not(target_os = "linux")))]
fn same_description(_a: &OwnedFd, _b: &OwnedFd) -> bool {
    false
}

/// The descriptor a successful POSIX-fd export wrote. A negative one is none (the slot left as
/// it was): `OwnedFd::from_raw_fd` would panic on -1, so it is an error instead.
///
/// # Safety
/// A non-negative `raw` must be open and owned by the caller, who gives it up.
#[cfg(unix)]
unsafe fn exported_fd(raw: std::ffi::c_int) -> cuda_mem_core::Result<OwnedFd> {
    if raw < 0 {
        return Err(cuda_mem_core::Error::Io {
            context: "exporting a chunk's file descriptor",
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the driver reported success but gave no descriptor ({raw})"),
            ),
        });
    }
    // SAFETY: forwarded from the caller.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Imports one chunk's handle as `handle_type`: a physical allocation owned here.
fn import_chunk(
    handle: &ChunkHandle,
    handle_type: HandleType,
    size: usize,
    resource: &VirtualMemoryResource,
) -> cuda_mem_core::Result<Arc<Physical>> {
    let d = driver()?;
    let mut imported: CUmemGenericAllocationHandle = 0;
    match handle {
        #[cfg(unix)]
        ChunkHandle::Fd(fd) => {
            use std::os::fd::AsRawFd;
            let raw = fd.as_raw_fd() as isize as *mut std::ffi::c_void;
            // SAFETY: the descriptor is open for the call; the driver does not keep it.
            unsafe { cu_call!(d, cuMemImportFromShareableHandle(&mut imported, raw, handle_type.raw())) }
        }
        ChunkHandle::Fabric(data) => {
            let mut fabric = CUmemFabricHandle { data: *data };
            // SAFETY: a pointer to a fabric handle, valid for the call.
            unsafe {
                cu_call!(d, cuMemImportFromShareableHandle(&mut imported, (&raw mut fabric).cast(), handle_type.raw()))
            }
        }
    }?;
    Ok(Physical::adopt(imported, size, resource.access().to_vec()))
}

/// Whether the physical allocation behind `physical` is larger than the size the descriptor
/// gives it (`physical.size`). The driver has no call that reports an allocation's size, but
/// `cuMemMap` maps only within it (`cuda.h`: "offset + size must be less than the size of the
/// memory allocation", refused with `CUDA_ERROR_INVALID_VALUE`): mapping the claimed size plus
/// `minimum` (the least granularity, by which any larger allocation is larger) at `probe`, a
/// reservation of at least that much, succeeds only for a larger allocation; it is unmapped at
/// once. Any other refusal is the driver's error.
fn larger_than_claimed(physical: &Physical, probe: &Reservation, minimum: usize) -> cuda_mem_core::Result<bool> {
    let d = driver()?;
    let Some(size) = physical.size.checked_add(minimum).filter(|&size| size <= probe.size) else {
        return Ok(false);
    };
    let map = d.cuMemMap()?;
    // SAFETY: the range lies inside `probe`, a reservation with nothing mapped in it, and the
    // handle is live while `physical` is; a mapping made is unmapped below.
    let code = unsafe { map(probe.ptr, size, 0, physical.handle, 0) };
    match code {
        CUresult::CUDA_ERROR_INVALID_VALUE => Ok(false),
        CUresult::CUDA_SUCCESS => {
            // SAFETY: mapped just above and handed to no one: unmapped once, here.
            if let Err(error) = unsafe { cu_call!(d, cuMemUnmap(probe.ptr, size)) } {
                record_drop_error("virtual memory mapping (a chunk's size probed)", error.into());
            }
            Ok(true)
        }
        other => {
            d.check("cuMemMap", other)?;
            Ok(false)
        }
    }
}

/// Where the physical allocation is, as the driver reports it.
fn location_of(physical: &Physical) -> cuda_mem_core::Result<CUmemLocation> {
    let d = driver()?;
    let mut prop = CUmemAllocationProp::default();
    // SAFETY: `prop` is a valid out-pointer; the handle is live.
    unsafe { cu_call!(d, cuMemGetAllocationPropertiesFromHandle(&mut prop, physical.handle)) }?;
    Ok(prop.location)
}

impl VirtualMemoryResource {
    /// Maps a buffer another process exported, with this resource's access settings.
    ///
    /// Before mapping anything it checks that the handle type matches this resource's, that
    /// the counts agree and name at most [`MAX_CHUNKS`] chunks, that a size of 0 comes with no
    /// chunks, that no two chunks name the same memory (the same fabric handle, file or open
    /// file description), that each chunk size is a positive multiple of this resource's
    /// granularity, that the claimed size fits in the chunks, and (after importing each handle)
    /// that the driver gave no handle twice, that every chunk is memory where this resource maps
    /// memory, and that no chunk's physical allocation is larger than its size in the descriptor
    /// (a `cuMemMap` of a little more than that, which only a larger allocation allows, into a
    /// reservation of its own, freed before the chunks are mapped). The descriptor's file
    /// descriptors are closed when it returns; the mapping does not need them.
    ///
    /// # Errors
    /// - [`VmmError::Descriptor`] naming the failed check: what the sender got wrong.
    /// - [`VmmError::ChunkImport`], [`VmmError::ChunkLocation`] and [`VmmError::ChunkMap`] naming
    ///   the chunk (a driver error stays their source).
    /// - Other driver errors. Nothing stays imported or mapped on failure.
    #[doc(alias = "from_ipc_descriptor")]
    pub fn import(self: &Arc<Self>, descriptor: VirtualBufferDescriptor, stream: &Stream) -> Result<VirtualBuffer> {
        // The chunks' total fits a `usize` (checked): so does each chunk, and the size within
        // them, which the `as usize` casts below rely on.
        let total = descriptor.check_for(self)?;
        if descriptor.chunk_sizes.is_empty() {
            return self.allocate(0, stream);
        }
        release_deferred();
        let count = descriptor.handles.len();
        let mut chunks: Vec<Arc<Physical>> = Vec::with_capacity(count);
        let want = self.location();
        // Where each chunk is mapped once, a little larger than claimed, to check its size (see
        // `larger_than_claimed`); freed when the chunks are checked.
        let minimum = self.minimum_granularity();
        let largest = descriptor.chunk_sizes.iter().copied().max().unwrap_or(0) as usize;
        let probe_size = largest.checked_add(minimum).ok_or(DescriptorError::AddressSpace)?;
        let probe = Reservation::reserve(probe_size, self.alignment(), 0)?;
        for (index, (handle, &size)) in descriptor.handles.iter().zip(&descriptor.chunk_sizes).enumerate() {
            let chunk = index + 1;
            let physical = import_chunk(handle, descriptor.handle_type, size as usize, self)
                .map_err(|source| VmmError::ChunkImport { chunk, count, source })?;
            // The same allocation again, where the driver says so by its handle.
            if let Some(first) = chunks.iter().position(|earlier| earlier.handle == physical.handle) {
                return Err(DescriptorError::RepeatedChunk { chunk, first: first + 1 }.into());
            }
            let found = location_of(&physical)?;
            // Device memory must be on this resource's device; host memory is host memory
            // whatever id the driver reports for it.
            let want_raw = want.raw();
            let device_type = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            if found.type_ != want_raw.type_ || (want_raw.type_ == device_type && found.id != want_raw.id) {
                let found = Location::from_raw(found).ok().flatten();
                return Err(VmmError::ChunkLocation { chunk, count, found, wanted: want });
            }
            if larger_than_claimed(&physical, &probe, minimum).map_err(|source| VmmError::ChunkImport {
                chunk,
                count,
                source,
            })? {
                return Err(DescriptorError::ChunkLargerThanClaimed { chunk, claimed: size }.into());
            }
            chunks.push(physical);
        }
        drop(probe);
        let reservation = self.reserve(total)?;
        let range = map_contiguously(&reservation, chunks).map_err(|failure| VmmError::ChunkMap {
            chunk: failure.index + 1,
            count,
            size: failure.size as u64,
            source: failure.error,
        })?;
        cuda_mem_core::memory_event!(
            DEBUG,
            ptr = %hex(range.base),
            size = descriptor.size,
            chunks = count,
            device = self.device().ordinal(),
            "virtual buffer imported"
        );
        let (ptr, size) = (range.base, descriptor.size as usize);
        cuda_mem_core::history::record(MemoryEventKind::Import, ptr, size, Some(stream), ResourceId::of(&**self));
        Ok(VirtualBuffer::new(Arc::new(range), size, Arc::clone(self), true, stream))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

    use super::{ChunkHandle, repeated_handle};

    fn open(path: &str) -> ChunkHandle {
        ChunkHandle::Fd(OwnedFd::from(std::fs::File::open(path).unwrap()))
    }

    fn duplicate(handle: &ChunkHandle) -> ChunkHandle {
        let ChunkHandle::Fd(fd) = handle else { panic!("a file descriptor") };
        ChunkHandle::Fd(fd.try_clone().unwrap())
    }

    /// Two chunks are the same memory when their handles are one fabric handle, one regular file
    /// (a `memfd` is the memory itself), or one open file description of a device file (as a
    /// driver's exports are, each opened anew: `/dev/null` stands in for one here).
    #[test]
    fn repeated_handles_are_told_from_distinct_ones() {
        let device = open("/dev/null");
        let other_open = open("/dev/null");
        assert_eq!(repeated_handle(&[open("/dev/null"), other_open]), None, "two opens of a device file");
        let dup = duplicate(&device);
        let same_description = [open("/dev/zero"), device, dup];
        if cfg!(target_os = "linux") {
            assert_eq!(repeated_handle(&same_description), Some((2, 3)), "one description twice");
        }
        let file = open("/proc/self/exe");
        let reopened = open("/proc/self/exe");
        assert_eq!(repeated_handle(&[open("/dev/null"), file, reopened]), Some((2, 3)), "one regular file twice");
        let fabric = [ChunkHandle::Fabric([1; 64]), ChunkHandle::Fabric([2; 64]), ChunkHandle::Fabric([1; 64])];
        assert_eq!(repeated_handle(&fabric), Some((1, 3)));
        assert_eq!(repeated_handle(&fabric[..2]), None);
    }

    /// A driver that reports a successful export and leaves the slot at -1 gave no descriptor:
    /// an error (the export then fails as `ExportFailed` for that chunk), where
    /// `OwnedFd::from_raw_fd(-1)` panicked.
    #[test]
    fn an_export_that_gives_no_descriptor_is_an_error() {
        for raw in [-1, -2] {
            // SAFETY: a negative descriptor is refused before anything owns it.
            let error = unsafe { super::exported_fd(raw) }.unwrap_err();
            let cuda_mem_core::Error::Io { source, .. } = &error else {
                panic!("expected an I/O error, got {error:?}")
            };
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidData, "{error}");
        }
        let raw = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        // SAFETY: `raw` was just opened and is given up here.
        let fd = unsafe { super::exported_fd(raw) }.unwrap();
        assert_eq!(fd.as_raw_fd(), raw);
    }
}
