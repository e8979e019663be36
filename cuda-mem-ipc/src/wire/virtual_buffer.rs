//! The shared virtual buffer (feature `vmm`): the bytes and file descriptors of a
//! `cuda-mem-vmm` [`VirtualBufferDescriptor`], and where its memory lives.
//!
//! Documented on [`SharedVirtualBuffer`]: the importing resource, the encoding and what
//! decoding checks.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cuda_mem_core::{HandleType, NumaNode};
use cuda_mem_vmm::{ChunkHandle, MAX_CHUNKS, VirtualBufferDescriptor};
use uuid::Uuid;

use super::buffer_descriptor::MAX_BUFFER_SIZE;
use super::envelope::{self, CHECKSUM_LEN, EnvelopeError, field};
use super::frame::MAX_FDS;
use super::location::{WireDevice, WireLocation};

/// The first 8 bytes of every encoded [`SharedVirtualBuffer`].
pub const SHARED_VIRTUAL_BUFFER_MAGIC: [u8; 8] = *b"CUMEMVMM";

/// The encoding version written by [`SharedVirtualBuffer::encode`], the only one decoded.
pub const SHARED_VIRTUAL_BUFFER_VERSION: u16 = 2;

const HANDLE_TYPE_AT: usize = 16;
const LOCATION_AT: usize = 17;
const COUNT_AT: usize = 18;
const LOCATION_ID_AT: usize = 20;
const DEVICE_UUID_AT: usize = 24;
const SIZE_AT: usize = 40;
const HEADER_LEN: usize = 48;
const FABRIC_HANDLE_LEN: usize = 64;

const POSIX_FD_CODE: u8 = 1;
const FABRIC_CODE: u8 = 2;
const DEVICE_CODE: u8 = 1;
const HOST_NUMA_CODE: u8 = 2;

// One message carries every chunk's file descriptor, and the count field holds any count.
const _: () = assert!(MAX_CHUNKS <= MAX_FDS && MAX_CHUNKS <= u16::MAX as usize);
// The shared header ends where this encoding's own fields begin.
const _: () = assert!(envelope::HEADER_LEN == HANDLE_TYPE_AT);

/// A virtual buffer as it travels (feature `vmm`): its descriptor (one handle per chunk) and
/// where its memory lives.
///
/// `cuda-mem-vmm` makes the driver calls: [`VirtualBuffer::export`] gives a descriptor in memory
/// (one shareable handle per physical chunk) and [`VirtualMemoryResource::import`] maps one. This
/// type is what travels between them: the descriptor with the location of its memory, which the
/// receiver needs to pick the resource to import it with; [`IpcChannel::send_virtual_buffer`]
/// sends one as a message of its own (kind 4, see [`IpcChannel`]), and
/// [`SharedVirtualBuffer::encode`] and [`SharedVirtualBuffer::decode`] serve any other transport.
///
/// # Where the memory lives
///
/// The public API speaks [`cuda_mem_core::Location`]: [`SharedVirtualBuffer::export`] takes the
/// location of the buffer's resource, and [`SharedVirtualBuffer::location`] gives it back in the
/// process that holds the value. On the wire a device is its UUID (processes number devices
/// differently, `CUDA_VISIBLE_DEVICES`), with the sender's ordinal kept for messages; host memory
/// is its NUMA node's id. The wire form is private: decoding makes no driver call, and
/// [`location`](SharedVirtualBuffer::location) finds the device with that UUID here. Only device
/// memory and host memory on a NUMA node export (`Location::Host` and
/// `Location::HostNumaCurrent` cannot carry an exportable handle type).
///
/// # The importing resource
///
/// The receiving application chooses how virtual buffers are mapped: it registers one
/// [`VirtualMemoryResource`] per location on the channel
/// ([`IpcChannel::import_virtual_buffers_into`]), and each virtual buffer received is imported
/// with the one registered for where its memory lives (its device, found by UUID; or its host
/// NUMA node). The channel does not make one itself: the access the mapping gets (the peers, read
/// only or read-write), the granularity and the handle type are the importer's choice, and a
/// resource made from the sender's word alone would take them from the peer. A virtual buffer
/// for which nothing is registered is refused ([`IpcError::NoVirtualMemoryResource`]) and its
/// file descriptors are closed.
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{Device, Stream, StreamOptions};
/// use cuda_mem_ipc::{Channel, IpcChannel, Received};
/// use cuda_mem_vmm::{VirtualMemoryResource, VirtualMemoryResourceOptions};
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// // With `spawn_with_channel`, `there` would be in another process.
/// let (here, there) = Channel::pair()?;
/// let (sender, receiver) = (IpcChannel::new(here), IpcChannel::new(there));
///
/// // The receiver says what maps the virtual buffers of memory on `device`.
/// receiver.import_virtual_buffers_into(VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?);
///
/// let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
/// let buffer = vmm.allocate(1 << 20, &stream)?.grow(8 << 20)?;
/// sender.send_virtual_buffer(&buffer)?; // one file descriptor per chunk
/// let Received::VirtualBuffer(mapped) = receiver.recv(&stream)? else { panic!("expected a virtual buffer") };
/// assert_eq!((mapped.size(), mapped.chunk_count()), (buffer.size(), buffer.chunk_count()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Encoding
///
/// [`SharedVirtualBuffer::encode`] writes `48 + 8n` bytes for `n` chunks (`48 + 72n` with fabric
/// handles), then a 4-byte checksum; integers are little-endian.
///
/// | offset | length | field          | value                                                          |
/// |-------:|-------:|----------------|----------------------------------------------------------------|
/// |      0 |      8 | magic          | `b"CUMEMVMM"` ([`SHARED_VIRTUAL_BUFFER_MAGIC`])                       |
/// |      8 |      2 | version        | `2` ([`SHARED_VIRTUAL_BUFFER_VERSION`]), `u16`                        |
/// |     10 |      2 | flags          | `0`, `u16`: reserved for future versions                       |
/// |     12 |      4 | reserved       | `0`, `u32`                                                     |
/// |     16 |      1 | handle type    | `1` POSIX file descriptors, `2` fabric handles                 |
/// |     17 |      1 | location       | `1` device memory, `2` host memory on a NUMA node              |
/// |     18 |      2 | chunk count    | `n`, `u16`, `0..=`[`MAX_CHUNKS`]                               |
/// |     20 |      4 | location id    | `i32`, not negative: device memory, the sender's ordinal of the device (for messages: processes number devices differently); host memory, the NUMA node |
/// |     24 |     16 | device UUID    | device memory: the device's UUID, not nil; host memory: zero   |
/// |     40 |      8 | size           | the buffer's size in bytes, `u64`, `0..=`[`MAX_BUFFER_SIZE`] (0 only without chunks) |
/// |     48 |     8n | chunk sizes    | each chunk's size, `u64`, `1..=`[`MAX_BUFFER_SIZE`], in order  |
/// | 48+8n  |    64n | fabric handles | fabric handles only: each chunk's `CUmemFabricHandle`, opaque, no two alike |
/// | end−4  |      4 | checksum       | CRC-32 (as [`BufferDescriptor`](super::BufferDescriptor)'s) of every byte before it, `u32` |
///
/// The first 16 bytes and the checksum are laid out as in a buffer descriptor's encoding, and
/// checked by the same code.
///
/// File descriptors travel beside the bytes (`SCM_RIGHTS`): with POSIX-fd handles exactly `n`,
/// one per chunk in order; with fabric handles none. (Version 1 was `cuda-mem-vmm`'s own
/// encoding, without checksum or location; it is not decoded.)
///
/// [`SharedVirtualBuffer::decode`] takes ownership of the file descriptors at once and closes
/// them on any error. It checks, in this order and before any driver call: the length against
/// the smallest encoding, the magic, the version, the checksum, that flags and reserved are
/// zero, the handle type and location codes, the chunk count against [`MAX_CHUNKS`], the exact
/// length for that count, the location's fields, the size against [`MAX_BUFFER_SIZE`] and
/// against 0 with chunks, each chunk size against [`MAX_BUFFER_SIZE`], fabric handles repeated,
/// and the number of file descriptors. Each failure is its own
/// [`SharedVirtualBufferError`] variant (those of the shared header and checksum are
/// [`EnvelopeError`]s, as for a buffer descriptor). What the importing resource checks (handle type,
/// granularity, the size against the chunks, file descriptors of one chunk repeated, where each
/// imported chunk lives and whether it is larger than its size here) is
/// [`VirtualMemoryResource::import`]'s.
///
/// [`VirtualBuffer::export`]: cuda_mem_vmm::VirtualBuffer::export
/// [`VirtualMemoryResource`]: cuda_mem_vmm::VirtualMemoryResource
/// [`VirtualMemoryResource::import`]: cuda_mem_vmm::VirtualMemoryResource::import
/// [`IpcChannel`]: crate::IpcChannel
/// [`IpcChannel::send_virtual_buffer`]: crate::IpcChannel::send_virtual_buffer
/// [`IpcChannel::import_virtual_buffers_into`]: crate::IpcChannel::import_virtual_buffers_into
/// [`IpcError::NoVirtualMemoryResource`]: crate::IpcError::NoVirtualMemoryResource
#[doc(alias = "VirtualMemoryIPCBufferDescriptor")]
#[derive(Debug)]
pub struct SharedVirtualBuffer {
    /// Where the memory lives, as the wire names it ([`location`](Self::location) says where
    /// in this process).
    pub(crate) location: WireLocation,
    /// The chunks' handles and sizes, and the buffer's size.
    pub descriptor: VirtualBufferDescriptor,
}

/// Why bytes and file descriptors are not a valid encoded [`SharedVirtualBuffer`]. The file
/// descriptors were closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharedVirtualBufferError {
    /// Fewer bytes than the smallest encoding (no chunks).
    #[error("{found} bytes, shorter than the smallest encoding ({min} bytes)")]
    Truncated {
        /// The input's length.
        found: usize,
        /// The length of an encoding without chunks.
        min: usize,
    },
    /// The magic ([`SHARED_VIRTUAL_BUFFER_MAGIC`]), version
    /// ([`SHARED_VIRTUAL_BUFFER_VERSION`]), checksum, flags or reserved field is wrong.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// An unknown handle type code.
    #[error("handle type code {found}, expected 1 (POSIX file descriptors) or 2 (fabric handles)")]
    HandleType {
        /// The code in the input.
        found: u8,
    },
    /// An unknown location code.
    #[error("location code {found}, expected 1 (device memory) or 2 (host memory on a NUMA node)")]
    Location {
        /// The code in the input.
        found: u8,
    },
    /// More chunks than a descriptor may name.
    #[error("{count} chunks, more than the {max} one descriptor may name")]
    TooManyChunks {
        /// The chunk count in the input.
        count: usize,
        /// [`MAX_CHUNKS`].
        max: usize,
    },
    /// The length does not match the chunk count and handle type.
    #[error("{found} bytes for {count} chunks, expected exactly {expected}")]
    Length {
        /// The input's length.
        found: usize,
        /// The chunk count in the input.
        count: usize,
        /// The length that count (and handle type) needs.
        expected: usize,
    },
    /// A negative device ordinal or NUMA node.
    #[error("location id {found} is negative, expected a device ordinal or a NUMA node")]
    LocationId {
        /// The location id in the input.
        found: i32,
    },
    /// Device memory without a device UUID.
    #[error("device memory with a nil device UUID, expected the device's UUID")]
    NilDevice,
    /// Host memory that names a device UUID.
    #[error("host memory with a device UUID, expected zero")]
    DeviceForHostMemory,
    /// A buffer size of 0 with chunks: an empty buffer exports none.
    #[error("buffer size 0 with {count} chunks, expected none (an empty buffer exports no chunk)")]
    ZeroSizeWithChunks {
        /// The chunk count in the input.
        count: usize,
    },
    /// Two chunks carry the same fabric handle: the same memory twice, which no export gives.
    #[error("chunk {chunk} carries the fabric handle of chunk {first} again")]
    RepeatedFabricHandle {
        /// The later chunk, from 1.
        chunk: usize,
        /// The earlier chunk, from 1.
        first: usize,
    },
    /// The buffer size is beyond [`MAX_BUFFER_SIZE`].
    #[error("buffer size is {size} bytes, more than the maximum of {max}")]
    SizeTooLarge {
        /// The size in the input.
        size: u64,
        /// [`MAX_BUFFER_SIZE`].
        max: u64,
    },
    /// A chunk size that is zero or beyond [`MAX_BUFFER_SIZE`].
    #[error("chunk {chunk} has a size of {size} bytes, expected 1 to {max}")]
    ChunkSize {
        /// The chunk, from 1.
        chunk: usize,
        /// Its size in the input.
        size: u64,
        /// [`MAX_BUFFER_SIZE`].
        max: u64,
    },
    /// File descriptors came with fabric handles.
    #[error("{fds} file descriptors came with fabric handles, expected none")]
    FdsWithFabricHandles {
        /// The descriptors received.
        fds: usize,
    },
    /// Not one file descriptor per chunk.
    #[error("{fds} file descriptors for {count} chunks, expected one per chunk")]
    FdCount {
        /// The descriptors received.
        fds: usize,
        /// The chunk count.
        count: usize,
    },
}

/// The encoded length for `count` chunks, the checksum included.
fn encoded_len(count: usize, fabric: bool) -> usize {
    let per_chunk = if fabric { 8 + FABRIC_HANDLE_LEN } else { 8 };
    HEADER_LEN + count * per_chunk + CHECKSUM_LEN
}

impl SharedVirtualBuffer {
    /// The bytes to send, and the file descriptors to pass beside them (POSIX-fd handles, in
    /// chunk order). See [`SharedVirtualBuffer`], *Encoding*, for the layout.
    ///
    /// Encodes the fields as they are: a descriptor that is not what an export gives (a handle
    /// type other than POSIX file descriptors and fabric handles, a handle of the other kind, not one handle per chunk size, more than
    /// [`MAX_CHUNKS`] chunks, sizes out of range) gives bytes and descriptors that
    /// [`decode`](Self::decode) rejects.
    pub fn encode(&self) -> (Vec<u8>, Vec<BorrowedFd<'_>>) {
        let descriptor = &self.descriptor;
        let fabric = descriptor.handle_type == HandleType::Fabric;
        let count = descriptor.chunk_sizes.len();
        let mut bytes = Vec::with_capacity(encoded_len(count, fabric));
        bytes.extend_from_slice(&envelope::header(SHARED_VIRTUAL_BUFFER_MAGIC, SHARED_VIRTUAL_BUFFER_VERSION));
        bytes.push(match descriptor.handle_type {
            HandleType::PosixFd => POSIX_FD_CODE,
            HandleType::Fabric => FABRIC_CODE,
            // A handle type this encoding does not carry (Windows handles): a code no decoder
            // accepts.
            _ => 0,
        });
        let (location, id, device) = match self.location {
            WireLocation::Device(WireDevice { uuid, sender_ordinal }) => (DEVICE_CODE, sender_ordinal, uuid),
            // The driver's id (`int`): a node beyond it reads as the last, which no driver knows.
            WireLocation::HostNuma(node) => (HOST_NUMA_CODE, node.raw(), Uuid::nil()),
        };
        bytes.push(location);
        bytes.extend_from_slice(&u16::try_from(count).unwrap_or(u16::MAX).to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(device.as_bytes());
        bytes.extend_from_slice(&descriptor.size.to_le_bytes());
        for size in &descriptor.chunk_sizes {
            bytes.extend_from_slice(&size.to_le_bytes());
        }
        let mut fds = Vec::new();
        for handle in &descriptor.handles {
            match handle {
                ChunkHandle::Fabric(data) => bytes.extend_from_slice(data),
                ChunkHandle::Fd(fd) => fds.push(fd.as_fd()),
            }
        }
        bytes.extend_from_slice(&[0; CHECKSUM_LEN]);
        envelope::seal(&mut bytes);
        (bytes, fds)
    }

    /// Decodes and checks an encoded virtual buffer and the file descriptors that came with it,
    /// which it owns at once: on any error they are closed. Makes no driver call and never
    /// panics, whatever the input.
    ///
    /// # Errors
    ///
    /// - A [`SharedVirtualBufferError`] naming the first check that failed (see the
    ///   [`SharedVirtualBuffer`] docs, *Encoding*, for the order).
    pub fn decode(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<SharedVirtualBuffer, SharedVirtualBufferError> {
        let min = encoded_len(0, false);
        if bytes.len() < min {
            return Err(SharedVirtualBufferError::Truncated { found: bytes.len(), min });
        }
        envelope::check(bytes, SHARED_VIRTUAL_BUFFER_MAGIC, SHARED_VIRTUAL_BUFFER_VERSION)?;
        let handle_type = match bytes[HANDLE_TYPE_AT] {
            POSIX_FD_CODE => HandleType::PosixFd,
            FABRIC_CODE => HandleType::Fabric,
            found => return Err(SharedVirtualBufferError::HandleType { found }),
        };
        let location_code = bytes[LOCATION_AT];
        if location_code != DEVICE_CODE && location_code != HOST_NUMA_CODE {
            return Err(SharedVirtualBufferError::Location { found: location_code });
        }
        let count = usize::from(u16::from_le_bytes(field(bytes, COUNT_AT)));
        if count > MAX_CHUNKS {
            return Err(SharedVirtualBufferError::TooManyChunks { count, max: MAX_CHUNKS });
        }
        let fabric = handle_type == HandleType::Fabric;
        let expected = encoded_len(count, fabric);
        if bytes.len() != expected {
            return Err(SharedVirtualBufferError::Length { found: bytes.len(), count, expected });
        }
        let location = decode_location(bytes, location_code)?;
        let size = u64::from_le_bytes(field(bytes, SIZE_AT));
        if size > MAX_BUFFER_SIZE {
            return Err(SharedVirtualBufferError::SizeTooLarge { size, max: MAX_BUFFER_SIZE });
        }
        if size == 0 && count > 0 {
            return Err(SharedVirtualBufferError::ZeroSizeWithChunks { count });
        }
        let sizes_end = HEADER_LEN + 8 * count;
        let mut chunk_sizes = Vec::with_capacity(count);
        for (index, at) in (HEADER_LEN..sizes_end).step_by(8).enumerate() {
            let chunk_size = u64::from_le_bytes(field(bytes, at));
            if chunk_size == 0 || chunk_size > MAX_BUFFER_SIZE {
                return Err(SharedVirtualBufferError::ChunkSize {
                    chunk: index + 1,
                    size: chunk_size,
                    max: MAX_BUFFER_SIZE,
                });
            }
            chunk_sizes.push(chunk_size);
        }
        let handles = if fabric {
            if !fds.is_empty() {
                return Err(SharedVirtualBufferError::FdsWithFabricHandles { fds: fds.len() });
            }
            let handles: Vec<[u8; FABRIC_HANDLE_LEN]> =
                (0..count).map(|index| field(bytes, sizes_end + index * FABRIC_HANDLE_LEN)).collect();
            if let Some((first, chunk)) = first_repeat(&handles) {
                return Err(SharedVirtualBufferError::RepeatedFabricHandle { chunk, first });
            }
            handles.into_iter().map(ChunkHandle::Fabric).collect()
        } else {
            if fds.len() != count {
                return Err(SharedVirtualBufferError::FdCount { fds: fds.len(), count });
            }
            fds.into_iter().map(ChunkHandle::Fd).collect()
        };
        Ok(SharedVirtualBuffer {
            location,
            descriptor: VirtualBufferDescriptor { handle_type, size, chunk_sizes, handles },
        })
    }
}

/// The first item (from 1) equal to an earlier one, and that earlier one.
fn first_repeat<T: Eq + std::hash::Hash>(items: &[T]) -> Option<(usize, usize)> {
    let mut seen = std::collections::HashMap::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        if let Some(&first) = seen.get(item) {
            return Some((first + 1, index + 1));
        }
        seen.insert(item, index);
    }
    None
}

/// The location fields of an encoding whose location code is known.
fn decode_location(bytes: &[u8], code: u8) -> Result<WireLocation, SharedVirtualBufferError> {
    let id = i32::from_le_bytes(field(bytes, LOCATION_ID_AT));
    if id < 0 {
        return Err(SharedVirtualBufferError::LocationId { found: id });
    }
    let device = Uuid::from_bytes(field(bytes, DEVICE_UUID_AT));
    match code {
        DEVICE_CODE if device.is_nil() => Err(SharedVirtualBufferError::NilDevice),
        DEVICE_CODE => Ok(WireLocation::Device(WireDevice { uuid: device, sender_ordinal: id })),
        _ if !device.is_nil() => Err(SharedVirtualBufferError::DeviceForHostMemory),
        _ => Ok(WireLocation::HostNuma(NumaNode(id.unsigned_abs()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::envelope::crc32;
    use proptest::prelude::*;

    fn shared(handles: Vec<ChunkHandle>, handle_type: HandleType, location: WireLocation) -> SharedVirtualBuffer {
        let chunk_sizes = (1..=handles.len() as u64).map(|i| i << 21).collect::<Vec<_>>();
        let size = chunk_sizes.iter().sum::<u64>().saturating_sub(100);
        SharedVirtualBuffer {
            location,
            descriptor: VirtualBufferDescriptor { handle_type, size, chunk_sizes, handles },
        }
    }

    fn device() -> WireLocation {
        WireLocation::Device(WireDevice {
            uuid: Uuid::from_u128(0xfeed_0000_0000_0000_0000_0000_0000_0001),
            sender_ordinal: 3,
        })
    }

    fn fabric(count: usize) -> SharedVirtualBuffer {
        let handles = (0..count).map(|i| ChunkHandle::Fabric([i as u8 ^ 0x5A; 64])).collect();
        shared(handles, HandleType::Fabric, device())
    }

    /// One end of a socket pair, with file descriptors for the other end: the kept end reads
    /// end-of-file once every descriptor of the other end (here and wherever they were passed)
    /// is closed. A leak check that other threads' file descriptors cannot disturb.
    struct Pipe {
        read: std::os::unix::net::UnixStream,
        writes: Vec<OwnedFd>,
    }

    impl Pipe {
        fn new(writes: usize) -> Pipe {
            let (read, write) = std::os::unix::net::UnixStream::pair().unwrap();
            read.set_nonblocking(true).unwrap();
            let write = OwnedFd::from(write);
            let mut all = Vec::new();
            for _ in 1..writes {
                all.push(write.try_clone().unwrap());
            }
            all.push(write);
            Pipe { read, writes: all }
        }

        /// Owned duplicates of `n` write ends (the originals stay here).
        fn duplicates(&self, n: usize) -> Vec<OwnedFd> {
            (0..n).map(|i| self.writes[i % self.writes.len()].try_clone().unwrap()).collect()
        }

        /// Whether some write end other than those kept here is still open.
        fn leaked(mut self) -> bool {
            use std::io::Read;
            drop(std::mem::take(&mut self.writes));
            match self.read.read(&mut [0u8; 1]) {
                Ok(0) => false,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
                other => panic!("unexpected read of the socket: {other:?}"),
            }
        }
    }

    fn posix(pipe: &Pipe, count: usize, location: WireLocation) -> SharedVirtualBuffer {
        let handles = pipe.duplicates(count).into_iter().map(ChunkHandle::Fd).collect();
        shared(handles, HandleType::PosixFd, location)
    }

    /// Re-seals `bytes` with a correct checksum after a deliberate change.
    fn reseal(bytes: &mut [u8]) {
        envelope::seal(bytes);
    }

    /// `bytes` with `value` written at `at`, re-sealed.
    fn with(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
        let mut spoiled = bytes.to_vec();
        spoiled[at..at + value.len()].copy_from_slice(value);
        reseal(&mut spoiled);
        spoiled
    }

    #[test]
    fn encoding_has_the_documented_layout() {
        let pipe = Pipe::new(2);
        let s = posix(&pipe, 2, device());
        let (bytes, fds) = s.encode();
        assert_eq!(bytes.len(), 48 + 16 + 4);
        assert_eq!(fds.len(), 2);
        assert_eq!(&bytes[0..8], b"CUMEMVMM");
        assert_eq!(&bytes[8..10], &[2, 0]);
        assert_eq!(&bytes[10..12], &[0, 0], "flags");
        assert_eq!(&bytes[12..16], &[0; 4], "reserved");
        assert_eq!(bytes[16], 1, "POSIX fds");
        assert_eq!(bytes[17], 1, "device memory");
        assert_eq!(&bytes[18..20], &2u16.to_le_bytes());
        assert_eq!(&bytes[20..24], &3i32.to_le_bytes());
        assert_eq!(&bytes[24..40], Uuid::from_u128(0xfeed_0000_0000_0000_0000_0000_0000_0001).as_bytes());
        assert_eq!(&bytes[40..48], &s.descriptor.size.to_le_bytes());
        assert_eq!(&bytes[48..56], &(2u64 << 20).to_le_bytes());
        assert_eq!(&bytes[56..64], &(4u64 << 20).to_le_bytes());
        assert_eq!(&bytes[64..68], &crc32(&bytes[..64]).to_le_bytes());

        let f = fabric(2);
        let (bytes, fds) = f.encode();
        assert!(fds.is_empty(), "fabric handles travel in the bytes");
        assert_eq!(bytes.len(), 48 + 2 * 72 + 4);
        assert_eq!(bytes[16], 2);
        assert_eq!(&bytes[64..128], &[0x5A; 64]);
        assert_eq!(&bytes[128..192], &[0x5B; 64]);

        let numa = posix(&pipe, 1, WireLocation::HostNuma(NumaNode(1)));
        let (bytes, _) = numa.encode();
        assert_eq!(bytes[17], 2, "host NUMA memory");
        assert_eq!(&bytes[20..24], &1i32.to_le_bytes());
        assert_eq!(&bytes[24..40], &[0; 16]);
    }

    #[test]
    fn encoding_is_stable() {
        // A golden encoding: changing the format must change the version, not this test.
        let empty = SharedVirtualBuffer {
            location: WireLocation::HostNuma(NumaNode(0)),
            descriptor: VirtualBufferDescriptor {
                handle_type: HandleType::PosixFd,
                size: 0,
                chunk_sizes: Vec::new(),
                handles: Vec::new(),
            },
        };
        let (bytes, _) = empty.encode();
        let mut expected = b"CUMEMVMM\x02\x00\x00\x00\x00\x00\x00\x00\x01\x02".to_vec();
        expected.extend_from_slice(&[0; 30]);
        // CRC-32 of those 48 bytes, as zlib computes it.
        expected.extend_from_slice(&0x5556_da4du32.to_le_bytes());
        assert_eq!(bytes, expected);
    }

    #[test]
    fn round_trips_keep_every_field_and_the_fds() {
        let pipe = Pipe::new(3);
        for location in [device(), WireLocation::HostNuma(NumaNode(2))] {
            let s = posix(&pipe, 3, location);
            let (bytes, fds) = s.encode();
            let owned = fds.iter().map(|fd| fd.try_clone_to_owned().unwrap()).collect();
            let d = SharedVirtualBuffer::decode(&bytes, owned).unwrap();
            assert_eq!(d.location, location);
            assert_eq!(d.descriptor.handle_type, HandleType::PosixFd);
            assert_eq!(d.descriptor.size, s.descriptor.size);
            assert_eq!(d.descriptor.chunk_sizes, s.descriptor.chunk_sizes);
            assert!(d.descriptor.handles.iter().all(|h| matches!(h, ChunkHandle::Fd(_))));
            assert_eq!(d.encode().0, bytes, "re-encodes to the same bytes");
        }
        let f = fabric(4);
        let (bytes, _) = f.encode();
        let d = SharedVirtualBuffer::decode(&bytes, Vec::new()).unwrap();
        let handles: Vec<_> = d
            .descriptor
            .handles
            .iter()
            .map(|h| match h {
                ChunkHandle::Fabric(data) => data[0],
                ChunkHandle::Fd(_) => panic!("a file descriptor from fabric bytes"),
            })
            .collect();
        assert_eq!(handles, [0x5A, 0x5B, 0x58, 0x59]);
        assert_eq!(d.encode().0, bytes);
    }

    /// A refusal: what is spoiled, the bytes, the error and what its message mentions.
    type Refusal = (&'static str, Vec<u8>, SharedVirtualBufferError, &'static str);

    /// The refusals of the length and the envelope of `bytes`, a two-chunk encoding.
    fn envelope_refusals(bytes: &[u8]) -> Vec<Refusal> {
        use SharedVirtualBufferError as E;
        let len = bytes.len();
        let mut unsealed = bytes.to_vec();
        unsealed[45] ^= 1;
        vec![
            ("empty", Vec::new(), E::Truncated { found: 0, min: 52 }, "0 bytes, shorter than the smallest encoding"),
            ("a short header", bytes[..51].to_vec(), E::Truncated { found: 51, min: 52 }, "51 bytes"),
            (
                "bad magic",
                with(bytes, 0, b"CUMEMBUF"),
                E::Envelope(EnvelopeError::Magic { found: *b"CUMEMBUF", expected: *b"CUMEMVMM" }),
                "magic is b\"CUMEMBUF\", expected b\"CUMEMVMM\"",
            ),
            (
                "version 1 (cuda-mem-vmm's own)",
                with(bytes, 8, &1u16.to_le_bytes()),
                E::Envelope(EnvelopeError::UnsupportedVersion { found: 1, supported: 2 }),
                "version 1, expected 2",
            ),
            (
                "a damaged byte",
                unsealed.clone(),
                E::Envelope(EnvelopeError::Checksum {
                    stored: crc32(&bytes[..len - 4]),
                    computed: crc32(&unsealed[..len - 4]),
                }),
                "checksum mismatch",
            ),
            (
                "flags",
                with(bytes, 10, &[1, 0]),
                E::Envelope(EnvelopeError::Flags { found: 1 }),
                "flags are 0x0001, expected 0",
            ),
            (
                "reserved",
                with(bytes, 14, &[0, 2]),
                E::Envelope(EnvelopeError::Reserved { found: 0x0200_0000 }),
                "reserved field is 0x02000000, expected 0",
            ),
        ]
    }

    /// The refusals of the fields of `bytes`, a two-chunk encoding (with POSIX fds, of device
    /// memory), and of `numa`, the same of host memory.
    fn field_refusals(bytes: &[u8], numa: &[u8]) -> Vec<Refusal> {
        use SharedVirtualBufferError as E;
        let len = bytes.len();
        let mut longer = bytes[..len - 4].to_vec();
        longer.push(0);
        longer.extend_from_slice(&[0; 4]);
        reseal(&mut longer);
        let mut shorter = bytes[..len - 5].to_vec();
        shorter.extend_from_slice(&[0; 4]);
        reseal(&mut shorter);
        let big = MAX_BUFFER_SIZE + 1;
        vec![
            ("handle type None", with(bytes, 16, &[0]), E::HandleType { found: 0 }, "handle type code 0"),
            ("an unknown handle type", with(bytes, 16, &[7]), E::HandleType { found: 7 }, "handle type code 7"),
            ("an unknown location", with(bytes, 17, &[3]), E::Location { found: 3 }, "location code 3"),
            (
                "too many chunks",
                with(bytes, 18, &(MAX_CHUNKS as u16 + 1).to_le_bytes()),
                E::TooManyChunks { count: 254, max: 253 },
                "254 chunks, more than the 253",
            ),
            (
                "a count past the bytes",
                with(bytes, 18, &3u16.to_le_bytes()),
                E::Length { found: 68, count: 3, expected: 76 },
                "68 bytes for 3 chunks, expected exactly 76",
            ),
            ("a byte too many", longer, E::Length { found: 69, count: 2, expected: 68 }, "69 bytes for 2 chunks"),
            ("a byte too few", shorter, E::Length { found: 67, count: 2, expected: 68 }, "67 bytes for 2 chunks"),
            (
                "fabric handles missing",
                with(bytes, 16, &[2]),
                E::Length { found: 68, count: 2, expected: 196 },
                "68 bytes for 2 chunks, expected exactly 196",
            ),
            (
                "a negative ordinal",
                with(bytes, 20, &(-1i32).to_le_bytes()),
                E::LocationId { found: -1 },
                "location id -1",
            ),
            ("a nil device", with(bytes, 24, &[0; 16]), E::NilDevice, "nil device UUID"),
            (
                "host memory naming a device",
                with(numa, 24, &[1; 16]),
                E::DeviceForHostMemory,
                "host memory with a device UUID",
            ),
            (
                "a size too large",
                with(bytes, 40, &big.to_le_bytes()),
                E::SizeTooLarge { size: big, max: MAX_BUFFER_SIZE },
                "more than the maximum",
            ),
            (
                "size 0 with chunks",
                with(bytes, 40, &0u64.to_le_bytes()),
                E::ZeroSizeWithChunks { count: 2 },
                "buffer size 0 with 2 chunks",
            ),
            (
                "a zero chunk",
                with(bytes, 56, &0u64.to_le_bytes()),
                E::ChunkSize { chunk: 2, size: 0, max: MAX_BUFFER_SIZE },
                "chunk 2 has a size of 0 bytes",
            ),
            (
                "a chunk too large",
                with(bytes, 48, &big.to_le_bytes()),
                E::ChunkSize { chunk: 1, size: big, max: MAX_BUFFER_SIZE },
                "chunk 1 has a size of 281474976710657 bytes",
            ),
        ]
    }

    /// Every refusal, each with the fds that came with the bytes closed.
    #[test]
    fn every_refusal_is_typed_and_closes_the_fds() {
        use SharedVirtualBufferError as E;
        let pipe = Pipe::new(2);
        let s = posix(&pipe, 2, device());
        let (bytes, _) = s.encode();
        let numa = posix(&pipe, 2, WireLocation::HostNuma(NumaNode(0))).encode().0;
        let cases = [envelope_refusals(&bytes), field_refusals(&bytes, &numa)].concat();
        for (what, spoiled, expected, mention) in cases {
            let error = SharedVirtualBuffer::decode(&spoiled, pipe.duplicates(2)).unwrap_err();
            assert_eq!(error, expected, "{what}");
            assert!(error.to_string().contains(mention), "{what}: {error} should mention {mention:?}");
        }
        // The wrong number of fds, and fds beside fabric handles.
        for count in [0, 1, 3] {
            let error = SharedVirtualBuffer::decode(&bytes, pipe.duplicates(count)).unwrap_err();
            assert_eq!(error, E::FdCount { fds: count, count: 2 });
            assert!(error.to_string().contains(&format!("{count} file descriptors for 2 chunks")), "{error}");
        }
        let (fabric_bytes, _) = fabric(2).encode();
        let error = SharedVirtualBuffer::decode(&fabric_bytes, pipe.duplicates(1)).unwrap_err();
        assert_eq!(error, E::FdsWithFabricHandles { fds: 1 });
        assert!(error.to_string().contains("1 file descriptors came with fabric handles"), "{error}");
        // The same fabric handle for both chunks: one chunk's memory twice.
        let twice = with(&fabric_bytes, 128, &fabric_bytes[64..128]);
        let error = SharedVirtualBuffer::decode(&twice, Vec::new()).unwrap_err();
        assert_eq!(error, E::RepeatedFabricHandle { chunk: 2, first: 1 });
        assert!(error.to_string().contains("chunk 2 carries the fabric handle of chunk 1"), "{error}");
        drop(s);
        assert!(!pipe.leaked(), "a refused decode left a file descriptor open");
    }

    #[test]
    fn descriptors_an_export_never_gives_encode_to_rejected_bytes() {
        let pipe = Pipe::new(1);
        let mut windows = posix(&pipe, 1, device());
        windows.descriptor.handle_type = HandleType::Win32;
        let mut fabric_in_fd = posix(&pipe, 1, device());
        fabric_in_fd.descriptor.handles[0] = ChunkHandle::Fabric([0; 64]);
        let mut fd_in_fabric = fabric(1);
        fd_in_fabric.descriptor.handles[0] = ChunkHandle::Fd(pipe.duplicates(1).remove(0));
        let mut sizes_for_handles = posix(&pipe, 1, device());
        sizes_for_handles.descriptor.chunk_sizes.push(2 << 20);
        let mut zero = fabric(1);
        zero.descriptor.chunk_sizes[0] = 0;
        for (what, s) in [
            ("a Windows handle type", windows),
            ("a fabric handle in an fd descriptor", fabric_in_fd),
            ("an fd in a fabric descriptor", fd_in_fabric),
            ("more sizes than handles", sizes_for_handles),
            ("a zero chunk", zero),
        ] {
            let (bytes, fds) = s.encode();
            let owned = fds.iter().map(|fd| fd.try_clone_to_owned().unwrap()).collect();
            assert!(SharedVirtualBuffer::decode(&bytes, owned).is_err(), "{what} decoded");
        }
        assert!(!pipe.leaked());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any single changed byte of a valid encoding is refused (the checksum covers every
        /// other byte, and a changed checksum no longer matches).
        #[test]
        fn any_single_byte_change_is_rejected(count in 0..4usize, at in 0..1000usize, xor in 1..=255u8) {
            let (mut bytes, _) = fabric(count).encode();
            let at = at % bytes.len();
            bytes[at] ^= xor;
            prop_assert!(SharedVirtualBuffer::decode(&bytes, Vec::new()).is_err(), "byte {} ^ {:#x} accepted", at, xor);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = SharedVirtualBuffer::decode(&bytes, Vec::new());
        }

        /// Well-framed, sealed inputs, to reach the checks after the checksum.
        #[test]
        fn decode_never_panics_on_sealed_input(
            header in proptest::collection::vec(any::<u8>(), HEADER_LEN - 10),
            count in 0..4u16,
            fabric in any::<bool>(),
            tail in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut bytes = b"CUMEMVMM\x02\x00".to_vec();
            bytes.extend_from_slice(&header);
            // Zero flags and reserved, a known handle type: most inputs reach the later checks.
            bytes[10..16].fill(0);
            bytes[HANDLE_TYPE_AT] = if fabric { FABRIC_CODE } else { POSIX_FD_CODE };
            bytes[COUNT_AT..COUNT_AT + 2].copy_from_slice(&count.to_le_bytes());
            bytes.extend_from_slice(&tail);
            bytes.extend_from_slice(&[0; 4]);
            reseal(&mut bytes);
            if let Ok(d) = SharedVirtualBuffer::decode(&bytes, Vec::new()) {
                prop_assert_eq!(d.encode().0, bytes);
            }
        }
    }
}
