//! Which processes hold a shared pool and its allocations: byte-range locks on the pool's file.
//!
//! `cuda.h` (`cuMemPoolImportPointer`): "The imported memory must be freed from all importing
//! processes before being freed in the exporting process." To see a process break that rule,
//! each process records what it holds as open-file-description locks (`F_OFD_SETLK`) on the
//! pool's `memfd`, on byte positions (not on the bytes' contents: a lock changes nothing a
//! mapping sees):
//!
//! - byte [`EXPORTER`] is read-locked by the exporting process for as long as it has the pool,
//!   so an importer can tell a pool whose exporter is gone;
//! - for the allocation of `len` bytes at file offset `o`, the bytes of [`imported_span`]`(o,
//!   len)` are read-locked by each importing pool while it maps the allocation, so the exporter
//!   can tell, when its free runs, whether an importer still maps it.
//!
//! An allocation's spans never overlap another live one's, and the kernel merges a description's
//! adjacent locks of one kind into one: an importer of a run of neighbouring allocations holds
//! one lock, not one each. That matters because the kernel keeps a file's locks in one list that
//! every lock call walks: with one lock per allocation, a batch of 1,024 imports cost about
//! 40 µs each on this simulator's 2-core VM (2026-11-29), against 3–4 µs without locks.
//! (Whether the exporter still has the allocation itself is a tag in the pool's file, see
//! [`crate::shared`]: one lock per allocation would make the list as long as the pool's live
//! allocations.)
//!
//! Locks are the kernel's record, not the processes': a process that dies drops its own, as the
//! driver forgets a dead process's imports, and nothing stale is left for the others to trip on.
//! Each process locks through an open file description of its own (the file reopened through
//! `/proc/self/fd`): descriptors passed over a socket share the sender's description, whose
//! locks would be the sender's. Where the file cannot be reopened (no `/proc`), nothing is
//! recorded and nothing is checked.
//!
//! `rustix` locks whole files only (`fcntl_lock`), so the byte-range calls go through `libc`.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// A process's own open file description of a shared pool's file, on which it records what it
/// holds.
pub(crate) struct Holds {
    file: OwnedFd,
}

/// The lock byte the exporting process holds while it has the pool.
pub(crate) const EXPORTER: u64 = 0;

/// Where importers' locks start: far above any file offset (a pool's file is smaller than
/// this), so that they never meet [`EXPORTER`].
const IMPORTED_BASE: u64 = 1 << 61;

/// The lock bytes (start, length) each importing pool holds while it maps the allocation of
/// `len` bytes (rounded as the pool places them) at file offset `offset`.
pub(crate) fn imported_span(offset: u64, len: u64) -> (u64, u64) {
    (IMPORTED_BASE.saturating_add(offset), len.max(1))
}

impl Holds {
    /// Reopens `file` as a description of this process's own; `None` where that is not possible.
    pub(crate) fn open(file: BorrowedFd<'_>) -> Option<Holds> {
        let path = format!("/proc/self/fd/{}", file.as_raw_fd());
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        let file = rustix::fs::open(path.as_str(), flags, rustix::fs::Mode::empty()).ok()?;
        Some(Holds { file })
    }

    /// Records that this process holds the `len` bytes at `start` (a shared lock: others may
    /// hold them too).
    pub(crate) fn hold(&self, (start, len): (u64, u64)) {
        // A lock the kernel cannot record (ENOLCK) only means this hold goes unchecked.
        let _ = self.fcntl(libc::F_OFD_SETLK, libc::F_RDLCK, start, len);
    }

    /// Records that this process no longer holds the `len` bytes at `start`.
    pub(crate) fn release(&self, (start, len): (u64, u64)) {
        let _ = self.fcntl(libc::F_OFD_SETLK, libc::F_UNLCK, start, len);
    }

    /// Whether a description other than this one holds `byte` (a process, this one included
    /// through another pool, that recorded it with [`hold`](Holds::hold)). `None` when the
    /// kernel cannot say.
    pub(crate) fn held_elsewhere(&self, byte: u64) -> Option<bool> {
        // The question is asked as for an exclusive lock: any shared one held elsewhere conflicts,
        // and this description's own locks never do.
        let answer = self.fcntl(libc::F_OFD_GETLK, libc::F_WRLCK, byte, 1)?;
        Some(answer.l_type != libc::F_UNLCK as libc::c_short)
    }

    /// `fcntl(command)` with a lock of `kind` on the `len` bytes at `start`; the lock as the
    /// kernel returned it, or `None` on failure.
    fn fcntl(&self, command: libc::c_int, kind: libc::c_int, start: u64, len: u64) -> Option<libc::flock> {
        // SAFETY: `flock` is plain data; all zeros is a valid value (l_pid must be 0 for OFD locks).
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::c_short::try_from(kind).ok()?;
        lock.l_whence = libc::SEEK_SET as libc::c_short;
        lock.l_start = libc::off_t::try_from(start).ok()?;
        lock.l_len = libc::off_t::try_from(len).ok()?;
        // SAFETY: the descriptor is open for the duration of the call (owned by `self`), and
        // `lock` is a valid, writable `struct flock`, which is what these commands take.
        let result = unsafe { libc::fcntl(self.file.as_fd().as_raw_fd(), command, &raw mut lock) };
        (result == 0).then_some(lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> OwnedFd {
        crate::sealed::create("cuda-sim-holds-test", 16 << 10).unwrap()
    }

    #[test]
    fn a_hold_is_seen_from_another_description_only() {
        let file = file();
        let (mine, theirs) = (Holds::open(file.as_fd()).unwrap(), Holds::open(file.as_fd()).unwrap());
        assert_eq!(theirs.held_elsewhere(4096), Some(false));
        mine.hold((4096, 1));
        assert_eq!(theirs.held_elsewhere(4096), Some(true));
        assert_eq!(mine.held_elsewhere(4096), Some(false), "its own hold is not another's");
        assert_eq!(theirs.held_elsewhere(4097), Some(false), "one byte only");
        assert_eq!(theirs.held_elsewhere(4095), Some(false), "one byte only");
        mine.release((4096, 1));
        assert_eq!(theirs.held_elsewhere(4096), Some(false));
    }

    #[test]
    fn holds_of_two_descriptions_are_released_apart() {
        let file = file();
        let (a, b, asker) = (
            Holds::open(file.as_fd()).unwrap(),
            Holds::open(file.as_fd()).unwrap(),
            Holds::open(file.as_fd()).unwrap(),
        );
        let span = imported_span(8192, 4096);
        a.hold(span);
        b.hold(span);
        a.release(span);
        assert_eq!(asker.held_elsewhere(span.0), Some(true), "b still holds it");
        assert_eq!(asker.held_elsewhere(EXPORTER), Some(false));
        drop(b);
        assert_eq!(asker.held_elsewhere(span.0), Some(false), "closing drops the holds");
    }

    /// The kernel merges one description's neighbouring spans (the list every lock call walks
    /// stays short), and releasing one of them leaves the others held.
    #[test]
    fn neighbouring_spans_are_one_lock_and_are_released_apart() {
        let file = file();
        let (importer, asker) = (Holds::open(file.as_fd()).unwrap(), Holds::open(file.as_fd()).unwrap());
        let spans = [imported_span(4096, 4096), imported_span(8192, 8192), imported_span(16384, 4096)];
        for span in spans {
            importer.hold(span);
        }
        let first = asker.fcntl(libc::F_OFD_GETLK, libc::F_WRLCK, spans[0].0, 1).unwrap();
        assert_eq!((first.l_start as u64, first.l_len as u64), (spans[0].0, 16384), "one lock for the three");
        importer.release(spans[1]);
        assert_eq!(asker.held_elsewhere(spans[0].0), Some(true));
        assert_eq!(asker.held_elsewhere(spans[1].0), Some(false));
        assert_eq!(asker.held_elsewhere(spans[1].0 + 8191), Some(false));
        assert_eq!(asker.held_elsewhere(spans[2].0), Some(true));
    }

    #[test]
    fn a_duplicated_descriptor_shares_the_description_that_reopening_does_not() {
        let file = file();
        let holds = Holds::open(file.as_fd()).unwrap();
        let shared = Holds { file: rustix::io::fcntl_dupfd_cloexec(&holds.file, 0).unwrap() };
        holds.hold((4096, 1));
        assert_eq!(shared.held_elsewhere(4096), Some(false), "a duplicate is the same holder");
        assert_eq!(Holds::open(file.as_fd()).unwrap().held_elsewhere(4096), Some(true));
    }
}
