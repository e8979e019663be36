//! Buffers lent to the peer of a channel: kept by the lender until the peer hands them back
//! (a [`MessageKind::Returned`](crate::wire::MessageKind::Returned) message) or its process
//! exits, so that the driver's rule (every importer frees before the exporter does) holds by
//! ownership: the lender cannot drop what a worker may still map.
//!
//! The wire is unchanged for the borrower: lent buffers arrive as buffers, so a blocking, async
//! or Python worker receives them alike, and hands them back with `give_back`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cuda_mem_core::{Buffer, DevicePtr, EXPORT_DATA_LEN};
use uuid::Uuid;

use crate::error::{IpcError, Result};
use crate::peer::PeerId;
use crate::wire::BufferDescriptor;

/// Which lent buffer a descriptor names: its pool's UUID and the driver's export data, which
/// names one allocation of that pool.
type LoanKey = (Uuid, [u8; EXPORT_DATA_LEN]);

fn key(descriptor: &BufferDescriptor) -> LoanKey {
    (descriptor.resource, descriptor.export_data)
}

/// The buffers a channel has lent and not had back. A key may name more than one buffer (a relay
/// lending two imports of one allocation), handed back one at a time.
#[derive(Debug, Default)]
pub(crate) struct Loans(Mutex<HashMap<LoanKey, Vec<Buffer>>>);

impl Loans {
    fn lent(&self) -> MutexGuard<'_, HashMap<LoanKey, Vec<Buffer>>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `buffers`, lent under `descriptors` (one each, in order).
    pub(crate) fn keep(&self, descriptors: &[BufferDescriptor], buffers: Vec<Buffer>) {
        let mut lent = self.lent();
        for (descriptor, buffer) in descriptors.iter().zip(buffers) {
            lent.entry(key(descriptor)).or_default().push(buffer);
        }
    }

    /// Takes back the buffers `descriptors` name, all of them or none: a descriptor that names
    /// no buffer lent here (or more of one than were lent) is [`IpcError::NotLent`], and every
    /// loan stays as it was.
    pub(crate) fn take(&self, descriptors: &[BufferDescriptor]) -> Result<Vec<Buffer>> {
        let mut lent = self.lent();
        let mut wanted: HashMap<LoanKey, usize> = HashMap::new();
        for descriptor in descriptors {
            let count = wanted.entry(key(descriptor)).or_default();
            *count += 1;
            if lent.get(&key(descriptor)).map_or(0, Vec::len) < *count {
                return Err(IpcError::NotLent { resource: descriptor.resource, size: descriptor.size });
            }
        }
        let mut buffers = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            let key = key(descriptor);
            // Present, as counted above.
            if let Some(kept) = lent.get_mut(&key) {
                buffers.extend(kept.pop());
                if kept.is_empty() {
                    lent.remove(&key);
                }
            }
        }
        Ok(buffers)
    }

    /// What is lent now.
    pub(crate) fn held(&self) -> Held {
        let lent = self.lent();
        let mut held = Held::default();
        for buffer in lent.values().flatten() {
            held.buffers += 1;
            held.bytes += buffer.size() as u64;
        }
        held
    }

    /// The lent buffers' addresses and sizes, in this process.
    pub(crate) fn list(&self) -> Vec<(DevicePtr, usize)> {
        let mut list: Vec<_> = self.lent().values().flatten().map(|b| (b.ptr(), b.size())).collect();
        list.sort_unstable();
        list
    }

    /// Every loan, taken out.
    pub(crate) fn take_all(&self) -> Vec<Buffer> {
        std::mem::take(&mut *self.lent()).into_values().flatten().collect()
    }
}

/// How much a peer holds of what was lent to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Held {
    /// Buffers lent and not handed back.
    pub buffers: usize,
    /// Their sizes, in all.
    pub bytes: u64,
}

/// A lend that did not go out: its error, and the buffers, given back (the peer never had them:
/// a frame it did not receive whole is never imported).
#[derive(Debug, thiserror::Error)]
#[error("buffers not lent: {error}")]
pub struct Unlent {
    /// Why.
    #[source]
    pub error: IpcError,
    /// The buffers, still this process's alone.
    pub buffers: Vec<Buffer>,
}

impl From<Box<Unlent>> for IpcError {
    /// The error; the buffers are dropped (freed), which is sound: they were never lent.
    fn from(unlent: Box<Unlent>) -> IpcError {
        unlent.error
    }
}

/// The buffers a peer still held when its channel ended
/// ([`IpcChannel::into_outstanding`](crate::IpcChannel::into_outstanding)): they come back once
/// its process has exited, when the driver has unmapped everything it imported.
///
/// Dropped while the peer may still be running (or where the kernel did not say which process it
/// is), the buffers are kept allocated until this process exits, never freed under the peer,
/// and [`SharingError::LentBuffersKept`](cuda_mem_core::SharingError::LentBuffersKept) is
/// recorded ([`cuda_mem_core::take_drop_errors`]).
#[derive(Debug)]
pub struct Outstanding {
    peer: Option<PeerId>,
    buffers: Vec<Buffer>,
}

impl Outstanding {
    pub(crate) fn new(peer: Option<PeerId>, buffers: Vec<Buffer>) -> Outstanding {
        Outstanding { peer, buffers }
    }

    /// The borrowing process's id, where the kernel vouched for it.
    pub fn peer_process_id(&self) -> Option<u32> {
        self.peer.map(PeerId::pid)
    }

    /// What it holds.
    pub fn held(&self) -> Held {
        Held { buffers: self.buffers.len(), bytes: self.buffers.iter().map(|b| b.size() as u64).sum() }
    }

    /// The held buffers' addresses and sizes, in this process.
    pub fn list(&self) -> Vec<(DevicePtr, usize)> {
        self.buffers.iter().map(|b| (b.ptr(), b.size())).collect()
    }

    /// Whether the borrower has exited (false where the kernel did not say which process it is).
    pub fn peer_exited(&self) -> bool {
        self.peer.is_some_and(|peer| !peer.is_alive())
    }

    /// The buffers, if the borrower has exited (or nothing is held); itself otherwise.
    ///
    /// # Errors
    /// Itself, while the borrower may still map the buffers.
    pub fn try_reclaim(mut self) -> std::result::Result<Vec<Buffer>, Outstanding> {
        if self.buffers.is_empty() || self.peer_exited() {
            return Ok(std::mem::take(&mut self.buffers));
        }
        Err(self)
    }

    /// Waits, blocking the thread, up to `timeout` (`None`: for as long as it takes) for the
    /// borrower to exit, then gives the buffers back.
    ///
    /// # Errors
    /// Itself, if the borrower is still running at the time-out, or the kernel did not say which
    /// process it is (it never waits then).
    pub fn wait_for_exit(self, timeout: Option<Duration>) -> std::result::Result<Vec<Buffer>, Outstanding> {
        let Some(peer) = self.peer else { return Err(self) };
        if let Some(pidfd) = peer.exit_notifier() {
            let wait = timeout.map(|t| rustix::event::Timespec {
                tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(t.subsec_nanos()),
            });
            let mut fds = [rustix::event::PollFd::new(&pidfd, rustix::event::PollFlags::IN)];
            // An interrupted or failed wait is answered by the check below.
            let _ = rustix::event::poll(&mut fds, wait.as_ref());
        }
        // Without a pidfd (exited already, or an old kernel) the check alone decides.
        self.try_reclaim()
    }

    /// Waits (without blocking a thread; feature `tokio`) for the borrower to exit, then gives
    /// the buffers back. Bound it with `tokio::time::timeout`.
    ///
    /// # Errors
    /// Itself, where the kernel did not say which process the borrower is, or its exit cannot
    /// be waited for (no pidfds, outside a runtime).
    #[cfg(feature = "tokio")]
    pub async fn exited(self) -> std::result::Result<Vec<Buffer>, Outstanding> {
        let Some(peer) = self.peer else { return Err(self) };
        // Registering outside a runtime would panic: not waited for then.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(self);
        }
        let notifier = peer.exit_notifier().and_then(|pidfd| {
            // SAFETY: the descriptor is owned by the `AsyncFd` for the registration's whole
            // life, never closed or replaced under it.
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }.ok()
        });
        if let Some(notifier) = notifier {
            // Readable once the process has exited; an error is answered by the check below.
            let _ = notifier.readable().await;
        }
        self.try_reclaim()
    }

    /// The buffers, whether or not the borrower still maps them.
    ///
    /// # Safety
    /// The borrower must have freed its imports of them, and those frees must have run (it
    /// said so, or it has exited): dropping one frees it, and the pool's next allocation may
    /// take its memory while the borrower still uses it.
    pub unsafe fn into_buffers_unchecked(mut self) -> Vec<Buffer> {
        std::mem::take(&mut self.buffers)
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        if self.buffers.is_empty() {
            return;
        }
        let held = self.held();
        let buffers = std::mem::take(&mut self.buffers);
        if self.peer_exited() {
            // Nothing maps them any more: freed.
            drop(buffers);
            return;
        }
        // Freed, the memory could go to the next allocation while the borrower still uses it:
        // kept, unreachable, until this process exits (and the driver releases it all).
        for buffer in buffers {
            buffer.leak();
        }
        let kept = cuda_mem_core::SharingError::LentBuffersKept {
            buffers: held.buffers,
            bytes: held.bytes,
            pid: self.peer_process_id(),
        };
        cuda_mem_core::record_drop_error("buffers lent to another process", kept.into());
    }
}
