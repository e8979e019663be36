//! Sharing a virtual buffer with another process: one shareable handle per physical chunk.
//!
//! A [`VirtualBufferDescriptor`] holds the handle type, the buffer's size, each chunk's size and
//! its handle (an owned file descriptor, or a fabric handle's 64 bytes). The importer checks
//! everything it can before mapping anything; then it maps the chunks into one new reservation
//! with its own access. [`VirtualBufferDescriptor::encode`] gives bytes (and the descriptors to
//! pass beside them, for example with `SCM_RIGHTS`) for any transport; `decode` checks them.
//!
//! Encoding: magic `CUMEMVMM` (8 bytes), version (u16 LE, 1), handle type (u8: 1 POSIX fd,
//! 2 fabric), reserved (u8, 0), chunk count (u32 LE, at most [`MAX_CHUNKS`]), buffer size
//! (u64 LE), then per chunk its size (u64 LE), then for fabric handles 64 bytes per chunk.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUmemAllocationProp, CUmemFabricHandle, CUmemGenericAllocationHandle};
use cuda_mem_core::{Error, Result, Stream, driver};

use crate::buffer::VirtualBuffer;
use crate::options::HandleType;
use crate::pieces::{Mapping, Physical, Range};
use crate::resource::VirtualMemoryResource;

/// The most chunks a descriptor may name (the most descriptors one `SCM_RIGHTS` message carries).
pub const MAX_CHUNKS: usize = 253;
const MAGIC: &[u8; 8] = b"CUMEMVMM";
const VERSION: u16 = 1;

/// One chunk's shareable handle.
#[derive(Debug)]
pub enum ChunkHandle {
    /// A POSIX file descriptor (closed when dropped).
    Fd(OwnedFd),
    /// A fabric handle.
    Fabric([u8; 64]),
}

/// What another process needs to map a virtual buffer.
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

/// A location in words ("device 0", "host memory", …).
fn location_name(kind: cuda_mem_core::sys::types::CUmemLocationType, id: i32) -> String {
    use cuda_mem_core::sys::types::CUmemLocationType as T;
    match kind {
        T::CU_MEM_LOCATION_TYPE_DEVICE => format!("memory on device {id}"),
        T::CU_MEM_LOCATION_TYPE_HOST => "host memory".to_string(),
        T::CU_MEM_LOCATION_TYPE_HOST_NUMA => format!("host memory on NUMA node {id}"),
        other => format!("memory at location type {}", other.0),
    }
}

fn malformed(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("malformed virtual buffer descriptor: {what}"))
}

impl VirtualBuffer {
    /// Exports the buffer: one handle per chunk. Running out of file descriptors part way
    /// closes those already opened and says so.
    ///
    /// # Errors
    /// [`Error::InvalidState`] for an imported buffer (forward the descriptor you received
    /// instead), [`Error::NotSupported`] for a resource without an exportable handle type;
    /// driver errors.
    pub fn export(&self) -> Result<VirtualBufferDescriptor> {
        if self.chunk_count() > MAX_CHUNKS {
            return Err(Error::InvalidState(format!(
                "the buffer spans {} chunks; a descriptor can name at most {MAX_CHUNKS} (one message of file \
                 descriptors): grow in fewer, larger steps",
                self.chunk_count()
            )));
        }
        if self.is_imported() {
            return Err(Error::InvalidState(
                "an imported virtual buffer cannot be exported again: forward the descriptor it was imported from"
                    .to_string(),
            ));
        }
        let handle_type = self.resource().options().handle_type;
        if handle_type == HandleType::None {
            return Err(Error::NotSupported(
                "the buffer's resource has handle_type None: create it with HandleType::PosixFd or Fabric to share it"
                    .to_string(),
            ));
        }
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
                }
                _ => {
                    let mut raw: std::ffi::c_int = -1;
                    // SAFETY: a POSIX-fd export writes one `int`, a new descriptor owned here.
                    unsafe {
                        cu_call!(d, cuMemExportToShareableHandle((&raw mut raw).cast(), handle, handle_type.raw(), 0))
                    }
                    // SAFETY: on success the driver handed over a new descriptor.
                    .map(|()| ChunkHandle::Fd(unsafe { OwnedFd::from_raw_fd(raw) }))
                }
            };
            match exported {
                Ok(chunk) => handles.push(chunk),
                Err(error) => {
                    let opened = handles.len();
                    drop(handles);
                    return Err(Error::InvalidState(format!(
                        "exporting chunk {} of {} failed after {opened} were exported (their descriptors are closed; \
                         if the process is out of file descriptors, raise its limit): {error}",
                        index + 1,
                        mappings.len()
                    )));
                }
            }
        }
        Ok(VirtualBufferDescriptor {
            handle_type,
            size: self.size() as u64,
            chunk_sizes: mappings.iter().map(|m| m.size() as u64).collect(),
            handles,
        })
    }
}

impl VirtualBufferDescriptor {
    /// The bytes to send, and the file descriptors to pass beside them (POSIX-fd handles).
    pub fn encode(&self) -> (Vec<u8>, Vec<BorrowedFd<'_>>) {
        let mut bytes = Vec::with_capacity(24 + 8 * self.chunk_sizes.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.push(match self.handle_type {
            HandleType::Fabric => 2,
            _ => 1,
        });
        bytes.push(0);
        bytes.extend_from_slice(&(self.chunk_sizes.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&self.size.to_le_bytes());
        for size in &self.chunk_sizes {
            bytes.extend_from_slice(&size.to_le_bytes());
        }
        let mut fds = Vec::new();
        for handle in &self.handles {
            match handle {
                ChunkHandle::Fabric(data) => bytes.extend_from_slice(data),
                ChunkHandle::Fd(fd) => fds.push(fd.as_fd()),
            }
        }
        (bytes, fds)
    }

    /// Rebuilds a descriptor from received bytes and descriptors, checking its shape: magic,
    /// version, handle type, reserved byte, chunk count, lengths, and that one descriptor came
    /// per chunk for POSIX-fd handles (the descriptors are closed on any error).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong.
    pub fn decode(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<VirtualBufferDescriptor> {
        let header =
            bytes.get(..24).ok_or_else(|| malformed(format!("{} bytes, shorter than its header", bytes.len())))?;
        if &header[..8] != MAGIC {
            return Err(malformed("bad magic"));
        }
        let version = u16::from_le_bytes([header[8], header[9]]);
        if version != VERSION {
            return Err(malformed(format!("version {version}, this build reads {VERSION}")));
        }
        let handle_type = match header[10] {
            1 => HandleType::PosixFd,
            2 => HandleType::Fabric,
            other => return Err(malformed(format!("handle type {other}"))),
        };
        if header[11] != 0 {
            return Err(malformed("reserved byte is not zero"));
        }
        let count = u32::from_le_bytes([header[12], header[13], header[14], header[15]]) as usize;
        if count > MAX_CHUNKS {
            return Err(malformed(format!("{count} chunks, more than {MAX_CHUNKS}")));
        }
        let size = u64::from_le_bytes(header[16..24].try_into().map_err(|_| malformed("size"))?);
        let per_chunk = if handle_type == HandleType::Fabric { 8 + 64 } else { 8 };
        let expected = 24 + count * per_chunk;
        if bytes.len() != expected {
            return Err(malformed(format!("{} bytes for {count} chunks, expected {expected}", bytes.len())));
        }
        let sizes_end = 24 + 8 * count;
        let chunk_sizes: Vec<u64> =
            bytes[24..sizes_end].chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        let handles: Vec<ChunkHandle> = match handle_type {
            HandleType::Fabric => {
                if !fds.is_empty() {
                    return Err(malformed("file descriptors came with fabric handles"));
                }
                bytes[sizes_end..]
                    .chunks_exact(64)
                    .map(|c| {
                        let mut data = [0u8; 64];
                        data.copy_from_slice(c);
                        ChunkHandle::Fabric(data)
                    })
                    .collect()
            }
            _ => {
                if fds.len() != count {
                    return Err(malformed(format!("{} file descriptors for {count} chunks", fds.len())));
                }
                fds.into_iter().map(ChunkHandle::Fd).collect()
            }
        };
        Ok(VirtualBufferDescriptor { handle_type, size, chunk_sizes, handles })
    }
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
    /// [`Error::InvalidArgument`] naming the failed check; driver errors. Nothing stays
    /// imported or mapped on failure.
    pub fn import(
        self: &Arc<Self>,
        descriptor: VirtualBufferDescriptor,
        stream: Option<&Stream>,
    ) -> Result<VirtualBuffer> {
        let own = self.options().handle_type;
        if descriptor.handle_type != own {
            return Err(Error::InvalidArgument(format!(
                "the descriptor's handle type is {:?} but this resource's is {own:?}; import it with a resource configured \
                 like the exporter's",
                descriptor.handle_type
            )));
        }
        if descriptor.chunk_sizes.len() != descriptor.handles.len() {
            return Err(malformed(format!(
                "{} chunk sizes for {} handles",
                descriptor.chunk_sizes.len(),
                descriptor.handles.len()
            )));
        }
        if descriptor.chunk_sizes.is_empty() {
            if descriptor.size == 0 {
                return self.allocate(0, stream);
            }
            return Err(malformed(format!("size {} with no exported chunks", descriptor.size)));
        }
        for (index, handle) in descriptor.handles.iter().enumerate() {
            let matches = matches!(
                (handle, descriptor.handle_type),
                (ChunkHandle::Fd(_), HandleType::PosixFd) | (ChunkHandle::Fabric(_), HandleType::Fabric)
            );
            if !matches {
                let kind = match handle {
                    ChunkHandle::Fd(_) => "a file descriptor",
                    ChunkHandle::Fabric(_) => "a fabric handle",
                };
                return Err(malformed(format!(
                    "chunk {} carries {kind} but the descriptor's handle type is {:?}",
                    index + 1,
                    descriptor.handle_type
                )));
            }
        }
        let granularity = self.granularity() as u64;
        let mut total: u64 = 0;
        for &size in &descriptor.chunk_sizes {
            if size == 0 || !size.is_multiple_of(granularity) {
                return Err(Error::InvalidArgument(format!(
                    "descriptor chunk size {size} is not a positive multiple of the {granularity}-byte granularity"
                )));
            }
            total = total.checked_add(size).ok_or_else(|| malformed("chunk sizes overflow"))?;
        }
        if descriptor.size > total {
            return Err(Error::InvalidArgument(format!(
                "descriptor size ({}) exceeds the exported chunks ({total} bytes)",
                descriptor.size
            )));
        }
        let total = usize::try_from(total).map_err(|_| malformed("chunks larger than this machine's address space"))?;
        let d = driver()?;
        let mut chunks = Vec::with_capacity(descriptor.handles.len());
        let count = descriptor.handles.len();
        for (index, (handle, &size)) in descriptor.handles.iter().zip(&descriptor.chunk_sizes).enumerate() {
            let mut imported: CUmemGenericAllocationHandle = 0;
            let result = match handle {
                ChunkHandle::Fd(fd) => {
                    use std::os::fd::AsRawFd;
                    let raw = fd.as_raw_fd() as isize as *mut std::ffi::c_void;
                    // SAFETY: the descriptor is open for the call; the driver does not keep it.
                    unsafe { cu_call!(d, cuMemImportFromShareableHandle(&mut imported, raw, own.raw())) }
                }
                ChunkHandle::Fabric(data) => {
                    let mut fabric = CUmemFabricHandle { data: *data };
                    // SAFETY: a pointer to a fabric handle, valid for the call.
                    unsafe {
                        cu_call!(d, cuMemImportFromShareableHandle(&mut imported, (&raw mut fabric).cast(), own.raw()))
                    }
                }
            };
            result.map_err(|e| Error::InvalidArgument(format!("importing chunk {} of {count}: {e}", index + 1)))?;
            let physical = Physical::adopt(imported, size as usize, self.access().to_vec());
            let mut prop = CUmemAllocationProp::default();
            // SAFETY: `prop` is a valid out-pointer; the handle is live.
            unsafe { cu_call!(d, cuMemGetAllocationPropertiesFromHandle(&mut prop, physical.handle)) }?;
            let want = self.location();
            let device_type = cuda_mem_core::sys::types::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            if prop.location.type_ != want.type_ || (want.type_ == device_type && prop.location.id != want.id) {
                return Err(Error::InvalidArgument(format!(
                    "chunk {} of {count} is {}, but this resource maps {}; import it with a resource for that device",
                    index + 1,
                    location_name(prop.location.type_, prop.location.id),
                    location_name(want.type_, want.id),
                )));
            }
            chunks.push(physical);
        }
        let reservation = self.reserve(total)?;
        let mut mappings = Vec::with_capacity(chunks.len());
        let mut offset = 0u64;
        for (index, physical) in chunks.into_iter().enumerate() {
            let size = physical.size as u64;
            let mapping = Mapping::map(reservation.ptr + offset, physical, Arc::clone(&reservation)).map_err(|e| {
                Error::InvalidArgument(format!("mapping chunk {} of {count} ({size} bytes): {e}", index + 1))
            })?;
            mappings.push(mapping);
            offset += size;
        }
        let stream = stream.cloned().unwrap_or_else(|| self.device().default_stream());
        let range = Range { base: reservation.ptr, mappings, stream: Some(stream) };
        Ok(VirtualBuffer::new(Arc::new(range), descriptor.size as usize, Arc::clone(self), true))
    }
}
