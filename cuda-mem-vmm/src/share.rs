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

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{
    CUmemAllocationProp, CUmemFabricHandle, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType,
};
use cuda_mem_core::{HandleType, Location, Stream, driver};

use crate::buffer::VirtualBuffer;
use crate::error::{DescriptorError, Result, VmmError};
use crate::pieces::{Physical, map_contiguously};
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
    /// the counts agree, that each chunk size is a positive multiple of this resource's
    /// granularity, that the claimed size fits in the chunks, and (after importing each handle)
    /// that every chunk is memory where this resource maps memory. The descriptor's file
    /// descriptors are closed when it returns; the mapping does not need them.
    ///
    /// # Errors
    /// - [`VmmError::Descriptor`] naming the failed check.
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
        let mut chunks = Vec::with_capacity(count);
        let want = self.location();
        for (index, (handle, &size)) in descriptor.handles.iter().zip(&descriptor.chunk_sizes).enumerate() {
            let chunk = index + 1;
            let physical = import_chunk(handle, descriptor.handle_type, size as usize, self)
                .map_err(|source| VmmError::ChunkImport { chunk, count, source })?;
            let found = location_of(&physical)?;
            // Device memory must be on this resource's device; host memory is host memory
            // whatever id the driver reports for it.
            let want_raw = want.raw();
            let device_type = CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            if found.type_ != want_raw.type_ || (want_raw.type_ == device_type && found.id != want_raw.id) {
                let found = Location::from_raw(found).ok().flatten();
                return Err(VmmError::ChunkLocation { chunk, count, found, wanted: want });
            }
            chunks.push(physical);
        }
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
        Ok(VirtualBuffer::new(Arc::new(range), descriptor.size as usize, Arc::clone(self), true, stream))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::fd::{AsRawFd, IntoRawFd};

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
