//! Shared memory for pools that can be shared between processes (`CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`).
//!
//! Such a pool's memory is one `memfd`: a header page that identifies the pool, then the bytes
//! of its allocations, placed by a first-fit allocator over file offsets, then a table of tags
//! (u64 LE, one per page of allocations: the tag of the live allocation that starts there, 0
//! where none does). Exporting the pool
//! hands out a duplicate of the file descriptor; importing it in another process maps
//! allocations of the same file, so both processes see the same bytes at their own addresses.
//! The file is made as large as the pool may grow and sealed at that size (see
//! [`crate::sealed`]), so no importer can truncate it under the exporter.
//!
//! Header (page 0): magic `cusimPOOL\0v4` (12 bytes), pool id (16 bytes), location kind (u8:
//! 0 device, 1 host, 2 host NUMA, 3 unspecified), location id (i32 LE), pool kind (u8: 0 pinned,
//! 1 managed), capacity (u64 LE: the bytes after the header page, a multiple of the page), FNV-1a
//! checksum of the first 42 bytes (u64 LE). For a device pool the location id is the device's
//! *physical* index on the simulated machine, not the exporting process's ordinal: processes
//! with different `CUDA_VISIBLE_DEVICES` see the same device under different ordinals, so the
//! importer translates the index back to its own ordinal, and refuses
//! (`CUDA_ERROR_INVALID_VALUE`) a pool on a device it does not see. An importer also refuses a
//! header whose checksum fails or whose fields are out of range, and a file that is not sealed
//! or whose size is not the header page plus the capacity plus its tag table. (Version 1
//! headers held the exporter's ordinal, version 2 headers had no capacity or checksum, version 3
//! files had no tag table; all are refused as unknown rather than misread.)
//!
//! Exported pointer data (the 64-byte `CUmemPoolPtrExportData`): magic `cusimPTR` (8), pool id
//! (16), file offset (u64 LE), size (u64 LE), the allocation's tag (u64 LE, never 0), reserved
//! zeros (8), FNV-1a checksum of the first 56 bytes (u64 LE).
//!
//! The exporter gives each allocation a tag of the pool's own, writes it into the table when it
//! places the allocation and clears it when it frees it, so an importer refuses export data of
//! an allocation freed since (`CUDA_ERROR_INVALID_VALUE`), even once another allocation took
//! its place. The table is written with `pwrite`, one system call per allocation and free;
//! which processes hold the pool and its imports are locks (see [`crate::holds`]).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use cuda_mem_sys::types::CUresult;

use crate::config::Config;
use crate::error::{SimResult, ensure, fail};
use crate::holds::{EXPORTER, Holds, imported_span};
use crate::pool::{Location, PoolKind};

/// The header page's size; allocations start after it.
pub(crate) const HEADER: u64 = 4096;
const POOL_MAGIC: &[u8; 12] = b"cusimPOOL\0v4";
/// The header's length: the checksum covers everything before its last 8 bytes.
const POOL_HEADER_LEN: usize = 50;
const POINTER_MAGIC: &[u8; 8] = b"cusimPTR";
/// Allocations are placed on page boundaries.
const ALIGN: u64 = 4096;
/// What the bytes of an allocation freed too early read afterwards (see
/// [`SharedArena::give_back`]).
pub(crate) const POISON: u8 = 0xdb;

/// A shareable pool's file and, for the exporting process, its allocator.
pub(crate) struct SharedArena {
    /// The memfd holding the pool's memory.
    pub file: OwnedFd,
    /// The pool's identity, the same in every process that maps it.
    pub id: [u8; 16],
    /// Whether this process imported the pool (it then cannot allocate from it).
    pub imported: bool,
    /// The file's size.
    pub capacity: u64,
    free: Mutex<BTreeMap<u64, u64>>,
    /// What this process holds of the file, as other processes can see it (see
    /// [`crate::holds`]); `None` where it cannot be recorded.
    holds: Option<Holds>,
    /// Ranges the exporter freed while an importer still mapped them: kept out of use until no
    /// importer does (offset, length).
    quarantined: Mutex<Vec<(u64, u64)>>,
    /// The exporter's last allocation tag (see the module's docs).
    last_tag: AtomicU64,
}

fn fresh_id() -> [u8; 16] {
    use std::hash::{BuildHasher, RandomState};
    let state = RandomState::new();
    let a = state.hash_one((std::process::id(), crate::handle::next()));
    let b = state.hash_one((a, std::time::SystemTime::now()));
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&a.to_le_bytes());
    id[8..].copy_from_slice(&b.to_le_bytes());
    id
}

/// The header's location kind and id for `location`: a device as its physical index.
fn location_bytes(location: Location, config: &Config) -> SimResult<(u8, i32)> {
    Ok(match location {
        Location::Device(ordinal) => (0, physical_id(config, ordinal)?),
        Location::Host => (1, -1),
        Location::HostNuma(n) => (2, n),
        Location::Unspecified => (3, -1),
    })
}

/// The physical index of this process's device `ordinal`, as cross-process records store it.
pub(crate) fn physical_id(config: &Config, ordinal: usize) -> SimResult<i32> {
    let physical = config.physical(ordinal).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    i32::try_from(physical).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// This process's ordinal for the physical index `id` a cross-process record stores:
/// `CUDA_ERROR_INVALID_VALUE` when no visible device is that one (see `conservative`).
pub(crate) fn ordinal_of(config: &Config, id: i32) -> SimResult<usize> {
    usize::try_from(id).ok().and_then(|physical| config.ordinal(physical)).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// Appends the FNV-1a checksum of `header` (u64 LE) to it: the last field of the pool and VMM
/// file headers.
pub(crate) fn append_checksum(header: &mut Vec<u8>) {
    let check = fnv1a(header);
    header.extend_from_slice(&check.to_le_bytes());
}

/// Checks a header written by [`append_checksum`]: `CUDA_ERROR_INVALID_VALUE` unless its last 8
/// bytes are the checksum of the rest.
pub(crate) fn verify_checksum(header: &[u8]) -> SimResult {
    let (fields, check) = header.split_at(header.len().saturating_sub(8));
    ensure(check == fnv1a(fields).to_le_bytes())
}

/// The length of the tag table of a pool of `capacity` bytes (whole pages): a u64 per page.
fn table_len(capacity: u64) -> u64 {
    capacity / ALIGN * 8
}

/// The file's length for a pool of `capacity` bytes; `None` when it does not fit in 64 bits.
fn file_len(capacity: u64) -> Option<u64> {
    HEADER.checked_add(capacity)?.checked_add(table_len(capacity))
}

/// `size` rounded up to whole pages (`ALIGN`); `None` when that does not fit in 64 bits.
fn aligned(size: u64) -> Option<u64> {
    size.checked_next_multiple_of(ALIGN)
}

/// FNV-1a over `bytes`: the checksum that pool pointer exports and VMM fabric handles carry, so a
/// corrupted or forged 64-byte record is refused.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl SharedArena {
    /// A new shared file of `capacity` bytes of allocations (sparse: nothing is committed until
    /// written) for a pool at `location` (a device by this process's ordinal, which `config`
    /// translates to the physical index the header stores).
    pub(crate) fn create(location: Location, kind: PoolKind, capacity: u64, config: &Config) -> SimResult<SharedArena> {
        let (location_kind, location_id) = location_bytes(location, config)?;
        // A capacity the file cannot have is more memory than the system can give.
        let capacity = aligned(capacity).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let len = file_len(capacity).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        let file = crate::sealed::create("cuda-sim-pool", len)?;
        let id = fresh_id();
        let mut header = Vec::with_capacity(POOL_HEADER_LEN);
        header.extend_from_slice(POOL_MAGIC);
        header.extend_from_slice(&id);
        header.push(location_kind);
        header.extend_from_slice(&location_id.to_le_bytes());
        header.push(u8::from(kind == PoolKind::Managed));
        header.extend_from_slice(&capacity.to_le_bytes());
        append_checksum(&mut header);
        rustix::io::pwrite(&file, &header, 0).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(SharedArena::on(file, id, false, capacity, BTreeMap::from([(HEADER, capacity)])))
    }

    /// Opens a pool another process exported: `fd` must be such a file, sealed, with a header
    /// that checks out and the size it states (anything else is `CUDA_ERROR_INVALID_VALUE`).
    /// Returns the arena (on a private duplicate of `fd`) and the pool's location, a device by
    /// this process's ordinal (a device `config` does not make visible is
    /// `CUDA_ERROR_INVALID_VALUE`), and kind.
    pub(crate) fn open(
        fd: std::os::fd::BorrowedFd<'_>,
        config: &Config,
    ) -> SimResult<(SharedArena, Location, PoolKind)> {
        let file = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let mut header = [0u8; POOL_HEADER_LEN];
        let read = rustix::io::pread(&file, &mut header, 0).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        ensure(read == header.len() && &header[..12] == POOL_MAGIC)?;
        verify_checksum(&header)?;
        let mut id = [0u8; 16];
        id.copy_from_slice(&header[12..28]);
        let location_id = i32::from_le_bytes([header[29], header[30], header[31], header[32]]);
        let location = match header[28] {
            0 => Location::Device(ordinal_of(config, location_id)?),
            1 => Location::Host,
            2 => Location::HostNuma(location_id),
            3 => Location::Unspecified,
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let kind = match header[33] {
            0 => PoolKind::Pinned,
            1 => PoolKind::Managed,
            _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
        };
        let capacity = u64::from_le_bytes(header[34..42].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        ensure(capacity > 0 && capacity % ALIGN == 0)?;
        let len = file_len(capacity).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        crate::sealed::check(file.as_fd(), len)?;
        Ok((SharedArena::on(file, id, true, capacity, BTreeMap::new()), location, kind))
    }

    /// The arena of `file`, with this process's own description of it for its holds; the
    /// exporter's ([`imported`](SharedArena::imported) false) holds [`EXPORTER`] from here on.
    fn on(file: OwnedFd, id: [u8; 16], imported: bool, capacity: u64, free: BTreeMap<u64, u64>) -> SharedArena {
        let holds = Holds::open(file.as_fd());
        if let (Some(holds), false) = (&holds, imported) {
            holds.hold((EXPORTER, 1));
        }
        let (free, quarantined, last_tag) = (Mutex::new(free), Mutex::default(), AtomicU64::new(0));
        SharedArena { file, id, imported, capacity, free, holds, quarantined, last_tag }
    }

    /// Where the tag of the allocation at file offset `offset` (page-aligned, in the arena) is.
    fn tag_at(&self, offset: u64) -> u64 {
        HEADER + self.capacity + (offset - HEADER) / ALIGN * 8
    }

    /// Writes the tag of the allocation at `offset` (0: none lives there).
    fn write_tag(&self, offset: u64, tag: u64) -> SimResult {
        let written = rustix::io::pwrite(&self.file, &tag.to_le_bytes(), self.tag_at(offset));
        ensure(written.is_ok_and(|n| n == 8))
    }

    /// The tag of the allocation at `offset`, 0 for none (or when it cannot be read).
    fn read_tag(&self, offset: u64) -> u64 {
        let mut tag = [0u8; 8];
        match rustix::io::pread(&self.file, &mut tag, self.tag_at(offset)) {
            Ok(8) => u64::from_le_bytes(tag),
            _ => 0,
        }
    }

    /// The file, borrowed.
    pub(crate) fn file_as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// A duplicate of the file descriptor, for export.
    pub(crate) fn duplicate(&self) -> SimResult<OwnedFd> {
        rustix::io::fcntl_dupfd_cloexec(self.file.as_fd(), 0).map_err(|_| CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }

    /// Finds room for `size` bytes: its file offset, or `CUDA_ERROR_OUT_OF_MEMORY`. The
    /// allocation's tag is written for importers to see.
    pub(crate) fn take(&self, size: u64) -> SimResult<u64> {
        let len = aligned(size).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        self.end_quarantines();
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let (&start, &available) =
            free.iter().find(|&(_, &available)| available >= len).ok_or(CUresult::CUDA_ERROR_OUT_OF_MEMORY)?;
        free.remove(&start);
        if available > len {
            free.insert(start + len, available - len);
        }
        drop(free);
        let tag = self.last_tag.fetch_add(1, Ordering::Relaxed) + 1;
        if self.write_tag(start, tag).is_err() {
            // The page of the table could not be had: as out of memory as the allocation.
            self.merge_free(start, len);
            return fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(start)
    }

    /// The exporter's free of the `size` bytes at `offset` (a range [`take`](SharedArena::take)
    /// handed out). Were an importer still to map them (`cuda.h`: the importers must free
    /// first), they are overwritten with [`POISON`] and kept out of use until no importer maps
    /// them, and the mistake is reported on stderr: a GPU's pool would hand the bytes to the next
    /// allocation, and the importer would read someone else's data, silently. Otherwise they
    /// join their free neighbours.
    pub(crate) fn give_back(&self, offset: u64, size: u64) {
        // `take` rounded the same size, so it fits.
        let Some(len) = aligned(size) else { return };
        // Its export data no longer imports. (Clearing a tag written before writes no new page.)
        let _ = self.write_tag(offset, 0);
        if let Some(holds) = &self.holds
            && holds.held_elsewhere(imported_span(offset, len).0) == Some(true)
        {
            eprintln!(
                "cuda-sim: process {} freed a pool allocation ({size} bytes at offset {offset:#x} of its \
                 shared pool) that an importing pool, in this or another process, still maps; cuda.h: \
                 \"The imported memory must be freed from all importing processes before being freed in \
                 the exporting process.\" Its bytes now read {POISON:#04x} and it is not reused until the \
                 importers free it.",
                std::process::id()
            );
            self.poison(offset, len);
            self.quarantined.lock().unwrap_or_else(PoisonError::into_inner).push((offset, len));
            return;
        }
        self.merge_free(offset, len);
    }

    /// Overwrites the `len` bytes at `offset` with [`POISON`] (what it can: the file was sized
    /// for them, so only a system out of memory stops it, and then the bytes stay as they were).
    fn poison(&self, offset: u64, len: u64) {
        let chunk = [POISON; 64 << 10];
        let mut done = 0;
        while done < len {
            let part = usize::try_from(len - done).map_or(chunk.len(), |left| left.min(chunk.len()));
            match rustix::io::pwrite(&self.file, &chunk[..part], offset + done) {
                Ok(written) if written > 0 => done += written as u64,
                _ => return,
            }
        }
    }

    /// Frees the quarantined ranges no importer maps any more.
    fn end_quarantines(&self) {
        let Some(holds) = &self.holds else { return };
        let mut quarantined = self.quarantined.lock().unwrap_or_else(PoisonError::into_inner);
        if quarantined.is_empty() {
            return;
        }
        quarantined.retain(|&(offset, len)| {
            let still_imported = holds.held_elsewhere(imported_span(offset, len).0) != Some(false);
            if !still_imported {
                self.merge_free(offset, len);
            }
            still_imported
        });
    }

    /// Puts the `len` bytes at `offset` back among the free ranges, merged with their neighbours.
    fn merge_free(&self, offset: u64, mut len: u64) {
        let mut start = offset;
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((&before, &before_len)) = free.range(..start).next_back()
            && before + before_len == start
        {
            free.remove(&before);
            start = before;
            len += before_len;
        }
        if let Some(after_len) = free.remove(&(start + len)) {
            len += after_len;
        }
        free.insert(start, len);
    }

    /// For an importer: `CUDA_ERROR_INVALID_VALUE` unless the exporter still has the pool and
    /// the allocation at `offset` is still the one tagged `tag` (its export data outlives it; a
    /// GPU's pool may have handed the bytes to another allocation since).
    pub(crate) fn check_exporter_holds(&self, offset: u64, tag: u64) -> SimResult {
        ensure(self.read_tag(offset) == tag)?;
        match &self.holds {
            Some(holds) => ensure(holds.held_elsewhere(EXPORTER) != Some(false)),
            None => Ok(()),
        }
    }

    /// For an importer: records that this pool maps the allocation of `size` bytes at `offset`.
    pub(crate) fn hold_import(&self, offset: u64, size: u64) {
        if let (Some(holds), Some(len)) = (&self.holds, aligned(size)) {
            holds.hold(imported_span(offset, len));
        }
    }

    /// For an importer: records that this pool no longer maps the allocation of `size` bytes at
    /// `offset`.
    pub(crate) fn release_import(&self, offset: u64, size: u64) {
        if let (Some(holds), Some(len)) = (&self.holds, aligned(size)) {
            holds.release(imported_span(offset, len));
        }
    }

    /// The 64 bytes another process needs to import the allocation at `offset`.
    pub(crate) fn export_pointer(&self, offset: u64, size: u64) -> [u8; 64] {
        let mut data = [0u8; 64];
        data[..8].copy_from_slice(POINTER_MAGIC);
        data[8..24].copy_from_slice(&self.id);
        data[24..32].copy_from_slice(&offset.to_le_bytes());
        data[32..40].copy_from_slice(&size.to_le_bytes());
        data[40..48].copy_from_slice(&self.read_tag(offset).to_le_bytes());
        let check = fnv1a(&data[..56]);
        data[56..].copy_from_slice(&check.to_le_bytes());
        data
    }

    /// Checks exported pointer data against this pool: `(offset, size, tag)`, or
    /// `CUDA_ERROR_INVALID_VALUE` for garbage, another pool's data, or a range outside the file.
    pub(crate) fn check_pointer(&self, data: &[u8; 64]) -> SimResult<(u64, u64, u64)> {
        ensure(&data[..8] == POINTER_MAGIC)?;
        ensure(data[48..56].iter().all(|&b| b == 0))?;
        let check = u64::from_le_bytes(data[56..].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        ensure(check == fnv1a(&data[..56]))?;
        ensure(data[8..24] == self.id)?;
        let offset = u64::from_le_bytes(data[24..32].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        let size = u64::from_le_bytes(data[32..40].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        ensure(size > 0 && offset >= HEADER && offset % ALIGN == 0)?;
        ensure(offset.checked_add(size).is_some_and(|end| end <= HEADER + self.capacity))?;
        let tag = u64::from_le_bytes(data[40..48].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
        ensure(tag != 0)?;
        Ok((offset, size, tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::four_devices_seeing as seeing;

    #[test]
    fn first_fit_reuses_and_merges() {
        let arena = SharedArena::create(Location::Device(0), PoolKind::Pinned, 64 << 10, &seeing("0")).unwrap();
        let a = arena.take(100).unwrap();
        let b = arena.take(5000).unwrap();
        assert_eq!((a, b), (HEADER, HEADER + 4096));
        arena.give_back(a, 100);
        arena.give_back(b, 5000);
        assert_eq!(arena.take(64 << 10).unwrap(), HEADER);
        assert!(arena.take(1).is_err());
    }

    #[test]
    fn pointer_data_round_trips_and_rejects_tampering() {
        let config = seeing("0");
        let arena = SharedArena::create(Location::Host, PoolKind::Pinned, 1 << 20, &config).unwrap();
        assert_eq!(arena.take(4096), Ok(HEADER));
        assert_eq!(arena.take(10), Ok(HEADER + 4096));
        let data = arena.export_pointer(HEADER + 4096, 10);
        assert_eq!(arena.check_pointer(&data), Ok((HEADER + 4096, 10, 2)), "the second allocation's tag");
        for i in 0..64 {
            let mut bad = data;
            bad[i] ^= 1;
            assert!(arena.check_pointer(&bad).is_err(), "byte {i}");
        }
        let other = SharedArena::create(Location::Host, PoolKind::Pinned, 1 << 20, &config).unwrap();
        assert!(other.check_pointer(&data).is_err());
        let (opened, location, kind) = SharedArena::open(arena.file.as_fd(), &config).unwrap();
        assert_eq!((location, kind), (Location::Host, PoolKind::Pinned));
        assert_eq!(opened.check_pointer(&data), Ok((HEADER + 4096, 10, 2)));
    }

    /// Overwrites header bytes at `at` and writes a checksum that matches again, as a forger
    /// would: what the importer must then catch is the field itself.
    fn forge(file: std::os::fd::BorrowedFd<'_>, at: u64, bytes: &[u8]) {
        rustix::io::pwrite(file, bytes, at).unwrap();
        let mut header = [0u8; POOL_HEADER_LEN];
        rustix::io::pread(file, &mut header, 0).unwrap();
        let check = fnv1a(&header[..POOL_HEADER_LEN - 8]);
        rustix::io::pwrite(file, &check.to_le_bytes(), (POOL_HEADER_LEN - 8) as u64).unwrap();
    }

    #[test]
    fn export_data_of_a_freed_allocation_no_longer_checks_out() {
        let config = seeing("0");
        let invalid = Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        let arena = SharedArena::create(Location::Host, PoolKind::Pinned, 1 << 20, &config).unwrap();
        let (imported, _, _) = SharedArena::open(arena.file.as_fd(), &config).unwrap();
        let a = arena.take(100).unwrap();
        let (offset, size, tag) = imported.check_pointer(&arena.export_pointer(a, 100)).unwrap();
        assert_eq!((offset, size), (a, 100));
        assert_eq!(imported.check_exporter_holds(offset, tag), Ok(()));
        arena.give_back(a, 100);
        assert_eq!(imported.check_exporter_holds(offset, tag), invalid, "freed");
        assert_eq!(arena.take(100), Ok(a), "the same place again");
        assert_eq!(imported.check_exporter_holds(offset, tag), invalid, "another allocation took its place");
        let (_, _, new_tag) = imported.check_pointer(&arena.export_pointer(a, 100)).unwrap();
        assert_eq!(imported.check_exporter_holds(offset, new_tag), Ok(()));
        drop(arena);
        assert_eq!(imported.check_exporter_holds(offset, new_tag), invalid, "the exporter is gone");
    }

    #[test]
    fn the_header_names_the_physical_device_and_importers_translate_it() {
        // The exporter sees physical devices 2 and 0 as its ordinals 0 and 1.
        let exporter = seeing("2,0");
        let arena = SharedArena::create(Location::Device(0), PoolKind::Managed, 1 << 20, &exporter).unwrap();
        let mut header = [0u8; POOL_HEADER_LEN];
        rustix::io::pread(&arena.file, &mut header, 0).unwrap();
        assert_eq!(&header[..12], b"cusimPOOL\0v4");
        assert_eq!((header[28], i32::from_le_bytes(header[29..33].try_into().unwrap())), (0, 2));
        assert_eq!(u64::from_le_bytes(header[34..42].try_into().unwrap()), 1 << 20, "the capacity");
        let open = |visible: &str| SharedArena::open(arena.file.as_fd(), &seeing(visible)).map(|(_, l, k)| (l, k));
        assert_eq!(open("2,0"), Ok((Location::Device(0), PoolKind::Managed)), "the exporter's own view");
        assert_eq!(open("0,1,2,3"), Ok((Location::Device(2), PoolKind::Managed)));
        assert_eq!(open("3,2"), Ok((Location::Device(1), PoolKind::Managed)));
        assert_eq!(open(&crate::device::uuid_string(2)), Ok((Location::Device(0), PoolKind::Managed)));
        assert_eq!(open("0,1,3").err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "physical device 2 is hidden");
        // Host locations need no translation.
        let host = SharedArena::create(Location::HostNuma(0), PoolKind::Pinned, 1 << 20, &exporter).unwrap();
        let (_, location, _) = SharedArena::open(host.file.as_fd(), &seeing("1")).unwrap();
        assert_eq!(location, Location::HostNuma(0));
    }

    #[test]
    fn older_headers_and_unknown_devices_are_refused() {
        let config = seeing("0,1,2,3");
        let arena = SharedArena::create(Location::Device(1), PoolKind::Pinned, 1 << 20, &config).unwrap();
        for old in [b"cusimPOOL\0v1", b"cusimPOOL\0v2", b"cusimPOOL\0v3"] {
            forge(arena.file.as_fd(), 0, old);
            let opened = SharedArena::open(arena.file.as_fd(), &config);
            assert_eq!(opened.err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        }
        forge(arena.file.as_fd(), 0, POOL_MAGIC);
        assert!(SharedArena::open(arena.file.as_fd(), &config).is_ok());
        // A header naming a device the machine does not have (or a negative one).
        for id in [4i32, 63, -1] {
            forge(arena.file.as_fd(), 29, &id.to_le_bytes());
            let opened = SharedArena::open(arena.file.as_fd(), &config);
            assert_eq!(opened.err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "device {id}");
        }
        // An ordinal this process lacks cannot be written either.
        let created = SharedArena::create(Location::Device(4), PoolKind::Pinned, 1 << 20, &config);
        assert_eq!(created.err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn forged_and_inconsistent_headers_are_refused() {
        let config = seeing("0");
        let invalid = Some(CUresult::CUDA_ERROR_INVALID_VALUE);
        let arena = SharedArena::create(Location::Device(0), PoolKind::Pinned, 1 << 20, &config).unwrap();
        let mut header = [0u8; POOL_HEADER_LEN];
        rustix::io::pread(&arena.file, &mut header, 0).unwrap();
        // Any changed byte fails the checksum (or the magic).
        for i in 0..POOL_HEADER_LEN {
            let mut bad = header;
            bad[i] ^= 0x40;
            rustix::io::pwrite(&arena.file, &bad, 0).unwrap();
            assert_eq!(SharedArena::open(arena.file.as_fd(), &config).err(), invalid, "byte {i}");
        }
        rustix::io::pwrite(&arena.file, &header, 0).unwrap();
        assert!(SharedArena::open(arena.file.as_fd(), &config).is_ok());
        // Fields out of range, with a checksum that matches: an unknown location or pool kind, a
        // capacity that is not whole pages, or that is not the file's size.
        let fields: [(u64, &[u8]); 6] = [
            (28, &[7]),
            (33, &[2]),
            (34, &0u64.to_le_bytes()),
            (34, &((1u64 << 20) + 1).to_le_bytes()),
            (34, &(2u64 << 20).to_le_bytes()),
            (34, &u64::MAX.to_le_bytes()),
        ];
        for (at, bytes) in fields {
            forge(arena.file.as_fd(), at, bytes);
            assert_eq!(SharedArena::open(arena.file.as_fd(), &config).err(), invalid, "{bytes:?} at {at}");
            rustix::io::pwrite(&arena.file, &header, 0).unwrap();
        }
    }

    #[test]
    fn an_unsealed_copy_of_a_pool_is_refused_and_the_pool_cannot_be_resized() {
        let config = seeing("0");
        let arena = SharedArena::create(Location::Host, PoolKind::Pinned, 1 << 20, &config).unwrap();
        let len = file_len(arena.capacity).unwrap();
        let mut header = [0u8; POOL_HEADER_LEN];
        rustix::io::pread(&arena.file, &mut header, 0).unwrap();
        // The same header and size in a file anyone may resize.
        let copy = rustix::fs::memfd_create("forged", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&copy, len).unwrap();
        rustix::io::pwrite(&copy, &header, 0).unwrap();
        let opened = SharedArena::open(copy.as_fd(), &config);
        assert_eq!(opened.err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        // An importer's descriptor cannot shrink or grow the real one.
        let (imported, _, _) = SharedArena::open(arena.file.as_fd(), &config).unwrap();
        assert_eq!(rustix::fs::ftruncate(&imported.file, HEADER), Err(rustix::io::Errno::PERM));
        assert_eq!(rustix::fs::ftruncate(&imported.file, 2 * len), Err(rustix::io::Errno::PERM));
        assert_eq!(rustix::fs::fstat(&arena.file).unwrap().st_size, len as i64);
    }

    #[test]
    fn sizes_that_overflow_are_out_of_memory() {
        let config = seeing("0");
        let out_of_memory = Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        for capacity in [u64::MAX, u64::MAX - HEADER, u64::MAX - ALIGN] {
            let created = SharedArena::create(Location::Host, PoolKind::Pinned, capacity, &config);
            assert_eq!(created.err(), out_of_memory, "capacity {capacity}");
        }
        let arena = SharedArena::create(Location::Host, PoolKind::Pinned, 1 << 20, &config).unwrap();
        assert_eq!(arena.take(u64::MAX).err(), out_of_memory);
        assert_eq!(arena.take(u64::MAX - 1).err(), out_of_memory);
        assert_eq!(arena.take(1 << 20), Ok(HEADER), "the free list is as it was");
    }
}
