//! The files behind memory that other processes map (shareable pools, VMM allocations): `memfd`s
//! whose size is sealed.
//!
//! Every process that imports such a file maps it shared. Were its size free to change, any of
//! them could `ftruncate` it, and every process with pages past the new end mapped would die of
//! `SIGBUS` at its next access. So the creator sizes the file once, then seals it with
//! `F_SEAL_SHRINK` and `F_SEAL_GROW` (its size never changes afterwards: the simulator places
//! allocations inside a file made as large as the pool may grow), and `F_SEAL_SEAL`, so that no
//! importer can add `F_SEAL_WRITE` and make the creator's next writable mapping fail. An
//! importer accepts only a file sealed so, of exactly the size its header states; anything else
//! is a forged or foreign descriptor, `CUDA_ERROR_INVALID_VALUE`.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use cuda_mem_sys::types::CUresult;
use rustix::fs::SealFlags;

use crate::error::{SimResult, ensure};

/// The seals every shared file carries.
const SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// A new `memfd` named `name` of `len` bytes (sparse), sealed. `CUDA_ERROR_OUT_OF_MEMORY` when the
/// system cannot make it.
pub(crate) fn create(name: &str, len: u64) -> SimResult<OwnedFd> {
    let out_of_memory = |_| CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
    let file = rustix::fs::memfd_create(name, flags).map_err(out_of_memory)?;
    rustix::fs::ftruncate(&file, len).map_err(out_of_memory)?;
    rustix::fs::fcntl_add_seals(&file, SEALS).map_err(out_of_memory)?;
    Ok(file)
}

/// Checks a file another process shared: a `memfd` sealed as [`create`] seals, of exactly `len`
/// bytes. Anything else is `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn check(file: BorrowedFd<'_>, len: u64) -> SimResult {
    // Files that cannot carry seals (not a memfd) answer EINVAL.
    let seals = rustix::fs::fcntl_get_seals(file).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(seals.contains(SEALS))?;
    let size = rustix::fs::fstat(file).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?.st_size;
    ensure(u64::try_from(size).is_ok_and(|size| size == len))
}

/// A 64-byte handle that names `file` as this process holds it (fabric handles, interprocess
/// event handles): `magic` (8 bytes), process id (u32 LE), descriptor number (i32 LE),
/// `payload` (at most 40 bytes, the rest zeros), FNV-1a of the first 56 bytes (u64 LE).
pub(crate) fn process_handle(magic: &[u8; 8], file: BorrowedFd<'_>, payload: &[u8]) -> [u8; 64] {
    let mut data = [0u8; 64];
    data[..8].copy_from_slice(magic);
    data[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    data[12..16].copy_from_slice(&file.as_raw_fd().to_le_bytes());
    data[16..16 + payload.len()].copy_from_slice(payload);
    let check = crate::shared::fnv1a(&data[..56]);
    data[56..].copy_from_slice(&check.to_le_bytes());
    data
}

/// Opens the file a [`process_handle`] with `magic` names, through the exporting process's
/// `/proc/<pid>/fd/<n>` (so only while that process holds it); returns the process id and the
/// file. A wrong magic or checksum, or a file that cannot be opened, is
/// `CUDA_ERROR_INVALID_VALUE`; the payload (bytes 16..56) is the caller's to check.
pub(crate) fn open_process_handle(data: &[u8; 64], magic: &[u8; 8]) -> SimResult<(u32, OwnedFd)> {
    let field = |range: std::ops::Range<usize>| -> SimResult<[u8; 4]> {
        data[range].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
    };
    ensure(&data[..8] == magic)?;
    let check = u64::from_le_bytes(data[56..].try_into().map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?);
    ensure(check == crate::shared::fnv1a(&data[..56]))?;
    let pid = u32::from_le_bytes(field(8..12)?);
    let fd = i32::from_le_bytes(field(12..16)?);
    let path = format!("/proc/{pid}/fd/{fd}");
    let flags = rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC;
    let file = rustix::fs::open(path.as_str(), flags, rustix::fs::Mode::empty())
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    Ok((pid, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_sealed_file_cannot_be_resized() {
        let file = create("cuda-sim-test", 8192).unwrap();
        for len in [0, 4096, 8191, 8193, 1 << 20] {
            assert_eq!(rustix::fs::ftruncate(&file, len), Err(rustix::io::Errno::PERM), "to {len} bytes");
        }
        let write_seal = rustix::fs::fcntl_add_seals(&file, SealFlags::WRITE);
        assert_eq!(write_seal, Err(rustix::io::Errno::PERM), "no seal can be added");
        assert_eq!(check(file.as_fd(), 8192), Ok(()));
        assert_eq!(check(file.as_fd(), 4096), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "another size");
    }

    #[test]
    fn unsealed_and_foreign_files_are_refused() {
        let invalid = Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        let unsealed = rustix::fs::memfd_create("cuda-sim-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 8192).unwrap();
        assert_eq!(check(unsealed.as_fd(), 8192), invalid, "cannot be sealed");
        let sealable = rustix::fs::memfd_create("cuda-sim-test", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&sealable, 8192).unwrap();
        assert_eq!(check(sealable.as_fd(), 8192), invalid, "sealable but not sealed");
        rustix::fs::fcntl_add_seals(&sealable, SealFlags::SHRINK).unwrap();
        assert_eq!(check(sealable.as_fd(), 8192), invalid, "can still grow");
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(check(null.as_fd(), 0), invalid, "not a memfd");
    }
}
