//! Physical allocations of the virtual memory management API (`cuMemCreate`): each one is a
//! `memfd` (a header page, then the bytes), mapped by `cuMemMap` into the simulator's alias of
//! the device arena at the offset of the device address it backs.
//!
//! The file is sealed at its size (see [`crate::sealed`]), so no importer can truncate it under
//! the processes that map it.
//!
//! Header (page 0): magic `cusimVM3` (8 bytes), size (u64 LE), location kind (u8: 0 device,
//! 1 host, 2 host NUMA), location id (i32 LE), handle types (u32 LE), FNV-1a checksum of the
//! first 25 bytes (u64 LE). An importer refuses a header whose checksum fails, and a file that
//! is not sealed or whose size is not the header page plus the size. For device memory the
//! location id is the device's *physical* index on the simulated machine, not the creating
//! process's ordinal (which `CUDA_VISIBLE_DEVICES` may make differ between processes): an
//! importer translates it to its own ordinal, so that `cuMemGetAllocationPropertiesFromHandle`
//! and access checks there name the right device, and refuses memory on a device it does not see
//! (`CUDA_ERROR_INVALID_VALUE`). (The version-1 header, magic `cusimVMM`, held the creator's
//! ordinal, and the version-2 one, `cusimVM2`, had no checksum; both are refused as unknown
//! rather than misread.)
//!
//! A fabric handle (64 bytes, `CUmemFabricHandle`): magic `cusimFAB` (8), exporting process id
//! (u32 LE), its descriptor number for the memfd (i32 LE), size (u64 LE), the exporter's IMEX
//! channel (u32 LE), zeros, FNV-1a of the first 56 bytes (u64 LE). The importer opens
//! `/proc/<pid>/fd/<n>`, so the exporting process must still hold the allocation (as on a
//! fabric, where the exporter keeps it alive), and must have been granted the same IMEX channel
//! (`CUDA_SIM_IMEX_CHANNEL`; otherwise `CUDA_ERROR_NOT_PERMITTED`, as `cuda.h` documents). It
//! names no device itself: the location comes from the header above, translated the same way.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cuda_mem_sys::types::CUresult;

use crate::config::Config;
use crate::error::{SimResult, ensure, fail};
use crate::pool::Location;
use crate::shared::{append_checksum, ordinal_of, physical_id, verify_checksum};

/// The header page's size; the bytes start after it.
const HEADER: u64 = 4096;
const MAGIC: &[u8; 8] = b"cusimVM3";
/// The header's length: the checksum covers everything before its last 8 bytes.
const HEADER_LEN: usize = 33;
const FABRIC_MAGIC: &[u8; 8] = b"cusimFAB";
/// The allocation granularity of every simulated device, minimum and recommended.
pub(crate) const GRANULARITY: u64 = 2 << 20;

/// One physical allocation.
pub(crate) struct Physical {
    /// The handle the application sees (`CUmemGenericAllocationHandle`).
    pub handle: u64,
    /// Its size.
    pub size: u64,
    /// Where it lives (a device by this process's ordinal).
    pub location: Location,
    /// The shareable handle types it may be exported as.
    pub handle_types: u32,
    file: OwnedFd,
}

/// The header's location kind and id for `location`: a device as its physical index.
fn location_bytes(location: Location, config: &Config) -> SimResult<(u8, i32)> {
    Ok(match location {
        Location::Device(ordinal) => (0, physical_id(config, ordinal)?),
        Location::Host | Location::Unspecified => (1, -1),
        Location::HostNuma(n) => (2, n),
    })
}

impl Physical {
    /// A new allocation of `size` bytes (sparse until written) at `location` (a device by this
    /// process's ordinal; the header gets its physical index from `config`).
    pub(crate) fn create(size: u64, location: Location, handle_types: u32, config: &Config) -> SimResult<Physical> {
        let (kind, id) = location_bytes(location, config)?;
        // A size the file cannot have is more memory than the system can give.
        let len = HEADER.checked_add(size).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let file = crate::sealed::create("cuda-sim-vmm", len)?;
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&size.to_le_bytes());
        header.push(kind);
        header.extend_from_slice(&id.to_le_bytes());
        header.extend_from_slice(&handle_types.to_le_bytes());
        append_checksum(&mut header);
        rustix::io::pwrite(&file, &header, 0).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(Physical { handle: crate::handle::next() as u64, size, location, handle_types, file })
    }

    /// Opens an allocation another process exported (on a private duplicate of `fd`): anything
    /// but such a file, or memory on a device `config` does not make visible, is
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn open(fd: BorrowedFd<'_>, config: &Config) -> SimResult<Physical> {
        let file = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        Physical::from_file(file, config)
    }

    /// Reads the header of `file`, translating a device's physical index to this process's
    /// ordinal, and checks it and the file (sealed, of the size the header states).
    fn from_file(file: OwnedFd, config: &Config) -> SimResult<Physical> {
        let mut header = [0u8; HEADER_LEN];
        let read = rustix::io::pread(&file, &mut header, 0).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        ensure(read == header.len() && &header[..8] == MAGIC)?;
        verify_checksum(&header)?;
        let size = u64::from_le_bytes(header[8..16].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        let id = i32::from_le_bytes(header[17..21].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        let handle_types =
            u32::from_le_bytes(header[21..25].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        let location = match header[16] {
            0 => Location::Device(ordinal_of(config, id)?),
            1 => Location::Host,
            2 => Location::HostNuma(id),
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        ensure(size > 0 && size.is_multiple_of(GRANULARITY))?;
        let len = HEADER.checked_add(size).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        crate::sealed::check(file.as_fd(), len)?;
        Ok(Physical { handle: crate::handle::next() as u64, size, location, handle_types, file })
    }

    /// A new descriptor for the allocation (`cuMemExportToShareableHandle`, POSIX fd).
    pub(crate) fn duplicate(&self) -> SimResult<OwnedFd> {
        rustix::io::fcntl_dupfd_cloexec(self.file.as_fd(), 0).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// The 64 bytes of a fabric handle for the allocation, exported through IMEX `channel`.
    pub(crate) fn fabric_handle(&self, channel: u32) -> [u8; 64] {
        let mut payload = [0u8; 12];
        payload[..8].copy_from_slice(&self.size.to_le_bytes());
        payload[8..].copy_from_slice(&channel.to_le_bytes());
        crate::sealed::process_handle(FABRIC_MAGIC, self.file.as_fd(), &payload)
    }

    /// Opens the allocation a fabric handle names (through the exporter's `/proc` entry); its
    /// location is translated as in [`Physical::open`]. An importer without the exporter's IMEX
    /// channel is `CUDA_ERROR_NOT_PERMITTED`.
    pub(crate) fn open_fabric(data: &[u8; 64], config: &Config) -> SimResult<Physical> {
        ensure(data[28..56].iter().all(|&b| b == 0))?;
        let (_, file) = crate::sealed::open_process_handle(data, FABRIC_MAGIC)?;
        let channel = u32::from_le_bytes(data[24..28].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        if config.imex_channel != Some(channel) {
            return fail(CUresult::CUDA_ERROR_NOT_PERMITTED);
        }
        let physical = Physical::from_file(file, config)?;
        let size = u64::from_le_bytes(data[16..24].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        ensure(physical.size == size)?;
        Ok(physical)
    }

    /// Maps the first `size` bytes of the allocation at `alias` (inside the alias arena).
    pub(crate) fn map_at(&self, alias: u64, size: u64) -> SimResult {
        ensure(size <= self.size)?;
        let prot = rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE;
        let flags = rustix::mm::MapFlags::SHARED | rustix::mm::MapFlags::FIXED;
        // SAFETY: `alias` lies inside the simulator's own inaccessible alias reservation, which
        // nothing else uses; replacing part of it with this file's pages is its purpose.
        unsafe { rustix::mm::mmap(alias as *mut _, size as usize, prot, flags, &self.file, HEADER) }
            .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(())
    }
}

/// Turns `[alias, alias + size)` back into inaccessible reserved space.
pub(crate) fn unmap_alias(alias: u64, size: u64) -> SimResult {
    let flags = rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED | rustix::mm::MapFlags::NORESERVE;
    // SAFETY: the range lies inside the simulator's alias reservation and held a mapping the
    // caller is removing; nothing else refers to it.
    unsafe { rustix::mm::mmap_anonymous(alias as *mut _, size as usize, rustix::mm::ProtFlags::empty(), flags) }
        .map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::four_devices_seeing as seeing;
    use crate::shared::fnv1a;

    #[test]
    fn the_header_names_the_physical_device_and_importers_translate_it() {
        // The creator sees physical devices 3 and 1 as its ordinals 0 and 1.
        let creator = seeing("3,1");
        let physical = Physical::create(GRANULARITY, Location::Device(1), 0, &creator).unwrap();
        assert_eq!(physical.location, Location::Device(1), "kept as the creator's ordinal");
        let mut header = [0u8; HEADER_LEN];
        rustix::io::pread(&physical.file, &mut header, 0).unwrap();
        assert_eq!(&header[..8], b"cusimVM3");
        assert_eq!((header[16], i32::from_le_bytes(header[17..21].try_into().unwrap())), (0, 1));
        let open = |visible: &str| Physical::open(physical.file.as_fd(), &seeing(visible)).map(|p| p.location);
        assert_eq!(open("3,1"), Ok(Location::Device(1)));
        assert_eq!(open("1"), Ok(Location::Device(0)));
        assert_eq!(open("0,2,3,1"), Ok(Location::Device(3)));
        assert_eq!(open("0,2,3"), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "physical device 1 is hidden");
        // A fabric handle reads the same header (here through this process's own /proc entry).
        let fabric = physical.fabric_handle(3);
        let on_channel = |visible: &str, channel| Config { imex_channel: channel, ..seeing(visible) };
        let by_fabric =
            |visible: &str| Physical::open_fabric(&fabric, &on_channel(visible, Some(3))).map(|p| p.location);
        assert_eq!(by_fabric("2,1"), Ok(Location::Device(1)));
        assert_eq!(by_fabric("0"), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        // Only an importer on the exporter's IMEX channel may open it.
        for channel in [None, Some(4)] {
            let opened = Physical::open_fabric(&fabric, &on_channel("2,1", channel)).map(|p| p.location);
            assert_eq!(opened, Err(CUresult::CUDA_ERROR_NOT_PERMITTED), "channel {channel:?}");
        }
        // Host memory needs no translation.
        let host = Physical::create(GRANULARITY, Location::HostNuma(0), 0, &creator).unwrap();
        assert_eq!(Physical::open(host.file.as_fd(), &seeing("0")).map(|p| p.location), Ok(Location::HostNuma(0)));
    }

    /// Overwrites header bytes at `at` and writes a checksum that matches again, as a forger
    /// would: what the importer must then catch is the field itself.
    fn forge(physical: &Physical, at: u64, bytes: &[u8]) {
        rustix::io::pwrite(&physical.file, bytes, at).unwrap();
        let mut header = [0u8; HEADER_LEN];
        rustix::io::pread(&physical.file, &mut header, 0).unwrap();
        let check = fnv1a(&header[..HEADER_LEN - 8]);
        rustix::io::pwrite(&physical.file, &check.to_le_bytes(), (HEADER_LEN - 8) as u64).unwrap();
    }

    #[test]
    fn older_headers_and_unknown_devices_are_refused() {
        let config = seeing("0,1,2,3");
        let physical = Physical::create(GRANULARITY, Location::Device(2), 0, &config).unwrap();
        let open = || Physical::open(physical.file.as_fd(), &config).map(|p| p.location);
        for old in [b"cusimVMM", b"cusimVM2"] {
            forge(&physical, 0, old);
            assert_eq!(open(), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        forge(&physical, 0, MAGIC);
        assert_eq!(open(), Ok(Location::Device(2)));
        for id in [4i32, -1] {
            forge(&physical, 17, &id.to_le_bytes());
            assert_eq!(open(), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "device {id}");
        }
        let created = Physical::create(GRANULARITY, Location::Device(4), 0, &config).map(|p| p.location);
        assert_eq!(created, Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn forged_files_and_headers_are_refused() {
        let config = seeing("0");
        let invalid = Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        let physical = Physical::create(GRANULARITY, Location::Device(0), 0, &config).unwrap();
        let open = |file: BorrowedFd<'_>| Physical::open(file, &config).map(|p| p.size);
        let mut header = [0u8; HEADER_LEN];
        rustix::io::pread(&physical.file, &mut header, 0).unwrap();
        for i in 0..HEADER_LEN {
            let mut bad = header;
            bad[i] ^= 0x40;
            rustix::io::pwrite(&physical.file, &bad, 0).unwrap();
            assert_eq!(open(physical.file.as_fd()), invalid, "byte {i}");
        }
        rustix::io::pwrite(&physical.file, &header, 0).unwrap();
        assert_eq!(open(physical.file.as_fd()), Ok(GRANULARITY));
        // Sizes that are not the file's, or not whole granules, with a matching checksum.
        for size in [2 * GRANULARITY, GRANULARITY - 4096, 0, u64::MAX] {
            forge(&physical, 8, &size.to_le_bytes());
            assert_eq!(open(physical.file.as_fd()), invalid, "size {size}");
        }
        forge(&physical, 8, &GRANULARITY.to_le_bytes());
        // The same header in a file anyone may resize.
        let copy = rustix::fs::memfd_create("forged", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&copy, HEADER + GRANULARITY).unwrap();
        rustix::io::pwrite(&copy, &header, 0).unwrap();
        assert_eq!(open(copy.as_fd()), invalid);
        // An importer cannot resize the real one, and a size that overflows is out of memory.
        let imported = Physical::open(physical.file.as_fd(), &config).unwrap();
        assert_eq!(rustix::fs::ftruncate(&imported.file, 0), Err(rustix::io::Errno::PERM));
        let huge = Physical::create(u64::MAX - GRANULARITY + 1, Location::Host, 0, &config).map(|p| p.size);
        assert_eq!(huge, Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    }
}
