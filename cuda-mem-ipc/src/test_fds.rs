//! Descriptors for the unit tests: a memfd with given contents, and what one holds.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

/// A memfd holding `contents`.
pub(crate) fn memfd(contents: &[u8]) -> File {
    let fd = rustix::fs::memfd_create("cuda-mem-ipc-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let file = File::from(fd);
    file.write_all_at(contents, 0).unwrap();
    file
}

/// What the file `fd` names holds.
pub(crate) fn contents(fd: &OwnedFd) -> Vec<u8> {
    let file = File::from(fd.try_clone().unwrap());
    let mut buf = vec![0u8; file.metadata().unwrap().len() as usize];
    file.read_exact_at(&mut buf, 0).unwrap();
    buf
}
