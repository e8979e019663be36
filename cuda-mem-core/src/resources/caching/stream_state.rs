//! [`StreamState`]: what a [`CachingResource`](super::CachingResource) keeps per stream — the
//! segments first allocated for it, their blocks and free bins ([`Arena`]), behind a lock of its
//! own — and the events that order one stream's reuse after another's use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::options::{CachingOptions, SizeClass};
use super::segments::{Arena, Segment};
use crate::device::DevicePtr;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::stream::{CaptureState, Stream, StreamKey};

/// Whether an event may be recorded on `stream` from here, now: it is not capturing (a
/// recording would go into the graph and say nothing of the stream's work) and the calling
/// thread can name it.
pub(super) fn quiet(stream: &Stream) -> bool {
    match stream.capture_state() {
        CaptureState::NotCapturing => true,
        CaptureState::Capturing(_) => false,
        CaptureState::Unknown => {
            !stream.is_foreign_per_thread() && stream.is_capturing().is_ok_and(|capturing| !capturing)
        }
    }
}

/// The last use of a block freed on another stream than its segment's: that stream, and an
/// event recorded on it at the free (or later, when it could not be recorded then: it then
/// follows even more of that stream's work).
#[derive(Debug)]
pub(super) struct LastUse {
    stream: Stream,
    event: Option<Event>,
}

impl LastUse {
    /// The work enqueued on `stream` so far.
    pub(super) fn on(stream: &Stream) -> LastUse {
        let mut last_use = LastUse { stream: stream.clone(), event: None };
        last_use.record_if_missing();
        last_use
    }

    fn record_if_missing(&mut self) -> Option<&Event> {
        if self.event.is_none() && quiet(&self.stream) {
            self.event = self.stream.record_event().ok();
        }
        self.event.as_ref()
    }

    /// Whether the use is known to be done (asks the driver; never waits).
    pub(super) fn is_done(&mut self) -> bool {
        self.record_if_missing().is_some_and(|event| event.is_complete().is_ok_and(|done| done))
    }

    /// Makes `stream` wait for the use.
    ///
    /// # Errors
    /// [`Error::CapturingStream`] when no event could be recorded on the stream of the use (it
    /// captures); the driver's error when the wait fails.
    pub(super) fn order_before(&mut self, stream: &Stream) -> Result<()> {
        let event = self.record_if_missing().ok_or(Error::CapturingStream)?;
        stream.wait(event)
    }
}

/// An event recorded on a state's stream after its `covers`-th free: once complete, every block
/// freed there up to that free may go to any stream.
#[derive(Debug)]
struct Fence {
    event: Event,
    covers: u64,
}

/// What [`Locked::take_for_other`] found for another stream.
#[derive(Debug)]
pub(super) enum Taken {
    /// A block, handed out; its segment stays with the state it came from.
    Block(DevicePtr),
    /// A wholly free segment, at this base, removed from the state it came from (still counted
    /// in the resource's counters): the taking stream's state attaches it and takes the block
    /// from it.
    Segment(DevicePtr, Segment),
}

/// A state's lock's contents.
#[derive(Debug)]
pub(super) struct Locked {
    /// Reached through [`arena`](Locked::arena), which merges the recent frees first, or the
    /// fast pair ([`take_recent`](Locked::take_recent), [`free_recent`](Locked::free_recent)).
    arena: Arena<LastUse>,
    fence: Option<Fence>,
    /// The stream, held while the state orders work on it (until its segments are released);
    /// `None` once the state is retired or its resource dropped, so that a thread that still
    /// names the state keeps no stream alive.
    pub(super) stream: Option<Stream>,
}

/// One stream's caching state.
#[derive(Debug)]
pub(super) struct StreamState {
    /// Which stream it is for (compared on the hot path without the lock).
    pub(super) key: StreamKey,
    /// Forgotten by the resource (it had no segment left; set under the lock, by
    /// [`retire_if_empty`](StreamState::retire_if_empty)): a segment acquired for its stream goes
    /// to the stream's new state instead, and a thread that still names the state looks for the
    /// stream's state again.
    retired: AtomicBool,
    locked: Mutex<Locked>,
}

impl StreamState {
    pub(super) fn new(stream: Stream, arena: Arena<LastUse>) -> StreamState {
        let key = stream.key();
        let locked = Locked { arena, fence: None, stream: Some(stream) };
        StreamState { key, retired: AtomicBool::new(false), locked: Mutex::new(locked) }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Locked> {
        self.locked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the state was retired: the answer while its lock is held (it is retired under
    /// the lock), a hint without.
    #[inline]
    pub(super) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Retires the locked state (`locked` is this state's) when its arena is empty, letting go
    /// of its stream: whether it was.
    pub(super) fn retire_if_empty(&self, locked: &mut Locked) -> bool {
        if !locked.arena().is_empty() {
            return false;
        }
        locked.stream = None;
        self.retired.store(true, Ordering::Relaxed);
        true
    }
}

impl Locked {
    /// The arena, its recent frees merged (what every use but the fast pair needs).
    #[inline]
    pub(super) fn arena(&mut self) -> &mut Arena<LastUse> {
        if !self.arena.is_flushed() {
            self.arena.flush_recent();
        }
        &mut self.arena
    }

    /// [`Arena::take_recent`]: a block this stream freed last, without touching the bins.
    #[inline]
    pub(super) fn take_recent(
        &mut self,
        options: &CachingOptions,
        class: SizeClass,
        rounded: usize,
        requested: usize,
    ) -> Option<DevicePtr> {
        self.arena.take_recent(options, class, rounded, requested)
    }

    /// [`Arena::free_recent`]: a free on this stream, merged later.
    #[inline]
    pub(super) fn free_recent(&mut self, ptr: DevicePtr) -> bool {
        self.arena.free_recent(ptr)
    }

    /// Settles the pending blocks whose last use is done.
    pub(super) fn poll_pending(&mut self) {
        if !self.arena().has_pending() {
            return;
        }
        let done: Vec<DevicePtr> = self.arena().pending_where(LastUse::is_done);
        for ptr in done {
            self.arena().settle(ptr);
        }
    }

    /// A block for another stream than `own` (this state's): only one whose last use an event
    /// on `own` shows done. When that block is a whole segment (free, nothing of it pending, its
    /// last use on `own` done), the segment itself, removed from this state for the other
    /// stream's to take over: that stream's later frees of its blocks are then frees on their
    /// segment's stream, not cross-stream ones. When no complete event covers a fitting block,
    /// records one for a later request (and this one gets none); never waits.
    pub(super) fn take_for_other(
        &mut self,
        own: &Stream,
        options: &CachingOptions,
        class: SizeClass,
        rounded: usize,
        requested: usize,
    ) -> Option<Taken> {
        self.poll_pending();
        if !self.arena().has_fit(class, rounded) {
            return None;
        }
        let covered = match &self.fence {
            Some(fence) if fence.event.is_complete().is_ok_and(|done| done) => fence.covers,
            Some(_) => 0,
            None => 0,
        };
        if let Some((base, segment)) = self.arena().detach_free_segment(class, rounded, covered) {
            return Some(Taken::Segment(base, segment));
        }
        if let Some(ptr) = self.arena().take(options, class, rounded, requested, covered) {
            return Some(Taken::Block(ptr));
        }
        // A fence still under way covers no more once complete than one recorded now; one
        // complete may be renewed to cover the later frees.
        let epoch = self.arena().epoch();
        let renew = self.fence.as_ref().is_none_or(|fence| fence.covers < epoch && covered == fence.covers);
        if !renew || !quiet(own) {
            return None;
        }
        // Recorded for a later request to find complete: asked at once, it would be complete or
        // not by a race with the stream, and which memory a request gets would vary run to run.
        if let Ok(event) = own.record_event() {
            self.fence = Some(Fence { event, covers: epoch });
        }
        None
    }
}
