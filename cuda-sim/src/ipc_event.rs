//! Interprocess events (`CU_EVENT_INTERPROCESS`): the event's progress (how often it was
//! recorded, which recording has completed) lives in a one-page sealed `memfd` that every
//! process holding the event maps shared, so a stream in one process can wait for work another
//! process recorded.
//!
//! File (page 0): magic `cusimEV1` (8 bytes), then two little-endian `u64` counters, each on a
//! cache line of its own: recorded (at byte 64), completed (at byte 128).
//!
//! Handle (64 bytes, `CUipcEventHandle`): magic `cusimIEV` (8), exporting process id (u32 LE),
//! its descriptor number for the file (i32 LE), zeros, FNV-1a of the first 56 bytes (u64 LE).
//! The importer opens `/proc/<pid>/fd/<n>`, so the exporting process must still hold the event
//! (cuda.h: operations after the exporter destroyed it are undefined).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuda_mem_sys::types::CUresult;

use crate::error::{SimResult, ensure};

const PAGE: usize = 4096;
const FILE_MAGIC: &[u8; 8] = b"cusimEV1";
const HANDLE_MAGIC: &[u8; 8] = b"cusimIEV";
const RECORDED: usize = 64;
const COMPLETED: usize = 128;

/// An interprocess event's progress, mapped from its file.
pub(crate) struct SharedProgress {
    file: OwnedFd,
    page: *mut u8,
}

// SAFETY: the mapping is owned by this value and only reached through atomics (the counters) or
// read once before sharing (the magic); the file descriptor is thread-safe.
unsafe impl Send for SharedProgress {}
// SAFETY: as above: every access after construction is an atomic operation.
unsafe impl Sync for SharedProgress {}

impl SharedProgress {
    /// A new file for an event created with `CU_EVENT_INTERPROCESS`.
    pub(crate) fn create() -> SimResult<SharedProgress> {
        let file = crate::sealed::create("cuda-sim-event", PAGE as u64)?;
        let progress = SharedProgress::map(file)?;
        // SAFETY: the page is mapped writable and nothing else has the file yet.
        unsafe { std::ptr::copy_nonoverlapping(FILE_MAGIC.as_ptr(), progress.page, FILE_MAGIC.len()) };
        Ok(progress)
    }

    fn map(file: OwnedFd) -> SimResult<SharedProgress> {
        let prot = rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE;
        // SAFETY: a fresh shared mapping of the file's one page, chosen by the kernel.
        let page =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), PAGE, prot, rustix::mm::MapFlags::SHARED, &file, 0) }
                .map_err(|_| CUresult::CUDA_ERROR_MAP_FAILED)?;
        Ok(SharedProgress { file, page: page.cast() })
    }

    fn counter(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is 64 or 128, inside the mapped page and 8-byte aligned (the page is
        // page-aligned); the page lives as long as `self`, and every process touches the
        // counters only atomically.
        unsafe { &*self.page.add(at).cast::<AtomicU64>() }
    }

    /// Starts a new recording; returns its number.
    pub(crate) fn begin_record(&self) -> u64 {
        self.counter(RECORDED).fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Marks recording `generation` complete.
    pub(crate) fn complete(&self, generation: u64) {
        self.counter(COMPLETED).fetch_max(generation, Ordering::AcqRel);
    }

    /// The latest recording, from any process.
    pub(crate) fn recorded(&self) -> u64 {
        self.counter(RECORDED).load(Ordering::Acquire)
    }

    /// The latest completed recording, from any process.
    pub(crate) fn completed(&self) -> u64 {
        self.counter(COMPLETED).load(Ordering::Acquire)
    }

    /// Blocks until recording `generation` has completed: polls, since the completion may come
    /// from another process (backing off from 20 µs to 1 ms).
    pub(crate) fn wait_for(&self, generation: u64) {
        let mut pause = Duration::from_micros(20);
        while self.completed() < generation {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// The 64 bytes of the event's handle.
    pub(crate) fn handle(&self) -> [u8; 64] {
        crate::sealed::process_handle(HANDLE_MAGIC, self.file.as_fd(), &[])
    }

    /// Maps the progress of the event a handle names, through the exporter's `/proc` entry.
    /// A handle made in this process, a forged one, or one whose exporter is gone or whose file
    /// is not an event's is `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn open(data: &[u8; 64]) -> SimResult<SharedProgress> {
        ensure(data[16..56].iter().all(|&b| b == 0))?;
        let (pid, file) = crate::sealed::open_process_handle(data, HANDLE_MAGIC)?;
        // Opened in the exporting process itself: refused (see `conservative`).
        ensure(pid != std::process::id())?;
        crate::sealed::check(file.as_fd(), PAGE as u64)?;
        let progress = SharedProgress::map(file)?;
        let mut magic = [0u8; 8];
        // SAFETY: the page is mapped readable; the magic is written once, before any handle.
        unsafe { std::ptr::copy_nonoverlapping(progress.page, magic.as_mut_ptr(), magic.len()) };
        ensure(&magic == FILE_MAGIC)?;
        Ok(progress)
    }
}

impl Drop for SharedProgress {
    fn drop(&mut self) {
        // SAFETY: the page was mapped by `map` and no reference to it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.page.cast(), PAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_from_this_process_or_forged_is_refused() {
        let progress = SharedProgress::create().unwrap();
        let handle = progress.handle();
        assert_eq!(SharedProgress::open(&handle).err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "same process");
        let mut forged = handle;
        forged[20] = 1;
        assert_eq!(SharedProgress::open(&forged).err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "checksum");
        assert_eq!(SharedProgress::open(&[0; 64]).err(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "zeros");
    }

    #[test]
    fn recordings_complete_in_order() {
        let progress = SharedProgress::create().unwrap();
        assert_eq!((progress.recorded(), progress.completed()), (0, 0));
        let (first, second) = (progress.begin_record(), progress.begin_record());
        assert_eq!((first, second), (1, 2));
        progress.complete(second);
        progress.complete(first);
        assert_eq!(progress.completed(), 2, "a late completion does not go back");
        progress.wait_for(2);
    }
}
