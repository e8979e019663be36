//! What this crate knows of a stream's capture: the [`CaptureMode`] a capture was begun in, the
//! [`CaptureState`] every pool allocation reads (kept in one atomic word, `CaptureWord`), and
//! what a capture keeps alive for its graphs (`GraphResources`). Beginning and ending captures,
//! and the graphs they make, are in `graph`.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_mem_sys::types::CUstreamCaptureMode;

use super::Stream;
use crate::event::Event;

/// How a capture treats calls that may be unsafe while it is under way (`CUstreamCaptureMode`):
/// which threads' calls to such functions (`cuMemAlloc`, synchronous copies, …) are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Refused on every thread while any global capture is under way, and on the capturing
    /// thread while its thread-local captures are (`CU_STREAM_CAPTURE_MODE_GLOBAL`, the
    /// safest).
    Global,
    /// Refused on the capturing thread only (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`).
    ThreadLocal,
    /// Never refused because of the capture (`CU_STREAM_CAPTURE_MODE_RELAXED`; cuda.core's
    /// `begin_building` default).
    Relaxed,
}

impl CaptureMode {
    /// The driver's value.
    pub fn raw(self) -> CUstreamCaptureMode {
        match self {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// What this crate knows of a stream's capture without asking the driver
/// ([`Stream::capture_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureState {
    /// No capture is under way: a stream this crate created outside the captures begun through
    /// it, or the legacy default stream.
    NotCapturing,
    /// A capture begun through [`Stream::begin_capture`] is under way (it may have been
    /// invalidated since: the driver still counts it as capturing until it ends).
    Capturing(CaptureMode),
    /// Cannot be known here: a stream from a raw handle or whose handle was shared
    /// ([`Stream::shared_handle`]; other code may begin its capture), or one that may have
    /// joined another stream's capture by waiting for an event recorded in it (until the
    /// driver next says it does not capture). Allocations on it ask the driver.
    Unknown,
}

/// What a capture's graph keeps alive, shared by the capture, its graph and every executable
/// graph instantiated from it; dropped with the last of them, once the work that may use it is
/// done.
#[derive(Debug, Default)]
pub(crate) struct GraphResources {
    inner: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    items: Vec<Box<dyn Any + Send + Sync>>,
    /// The latest event per stream after which the items are unused: the capturing stream's
    /// work from before the capture, and each launch.
    waits: Vec<(Stream, Event)>,
    /// A wait that could not be recorded (the items are then never let go of).
    unordered: bool,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("items", &self.items.len())
            .field("waits", &self.waits.len())
            .field("unordered", &self.unordered)
            .finish()
    }
}

impl GraphResources {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `item` alive with the graph.
    pub(crate) fn keep(&self, item: Box<dyn Any + Send + Sync>) {
        self.lock().items.push(item);
    }

    /// How many items it keeps.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Lets the items go only after the work enqueued on `stream` so far (when there are any):
    /// an event recorded there now (replacing the stream's previous one, which it follows).
    pub(crate) fn order_after(&self, stream: &Stream) {
        if self.len() == 0 {
            return;
        }
        match stream.record_event() {
            Ok(event) => {
                let mut held = self.lock();
                held.waits.retain(|(s, _)| s != stream);
                held.waits.push((stream.clone(), event));
            }
            Err(error) => {
                crate::drop_errors::record("graph resources (ordering their release)", error);
                self.lock().unordered = true;
            }
        }
    }
}

impl Drop for GraphResources {
    fn drop(&mut self) {
        let held = std::mem::take(self.inner.get_mut().unwrap_or_else(PoisonError::into_inner));
        if held.items.is_empty() {
            return;
        }
        let mut ordered = !held.unordered;
        for (_, event) in &held.waits {
            if let Err(error) = event.synchronize() {
                crate::drop_errors::record("graph resources (waiting for their last use)", error);
                ordered = false;
            }
        }
        if ordered {
            drop(held.items);
        } else {
            // Memory a graph may still use is never released: without a wait for its last use,
            // it is kept for the life of the process (the errors above say why).
            std::mem::forget(held.items);
        }
    }
}

/// A [`CaptureState`] in one atomic word, with a generation that every change bumps: a driver
/// answer asked for while the state was unknown is written back only if nothing changed
/// meanwhile (a concurrent wait that joined a capture, say).
#[derive(Debug)]
pub(super) struct CaptureWord(AtomicU64);

/// The low bits of a [`CaptureWord`]: the state.
const STATE_BITS: u32 = 3;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
const NOT_CAPTURING: u64 = 0;
const UNKNOWN: u64 = 1;
const CAPTURING_GLOBAL: u64 = 2;
const CAPTURING_THREAD_LOCAL: u64 = 3;
const CAPTURING_RELAXED: u64 = 4;

impl CaptureWord {
    pub(super) fn new(state: CaptureState) -> CaptureWord {
        CaptureWord(AtomicU64::new(CaptureWord::encode(state)))
    }

    fn encode(state: CaptureState) -> u64 {
        match state {
            CaptureState::NotCapturing => NOT_CAPTURING,
            CaptureState::Unknown => UNKNOWN,
            CaptureState::Capturing(CaptureMode::Global) => CAPTURING_GLOBAL,
            CaptureState::Capturing(CaptureMode::ThreadLocal) => CAPTURING_THREAD_LOCAL,
            CaptureState::Capturing(CaptureMode::Relaxed) => CAPTURING_RELAXED,
        }
    }

    pub(super) fn decode(word: u64) -> CaptureState {
        match word & STATE_MASK {
            NOT_CAPTURING => CaptureState::NotCapturing,
            CAPTURING_GLOBAL => CaptureState::Capturing(CaptureMode::Global),
            CAPTURING_THREAD_LOCAL => CaptureState::Capturing(CaptureMode::ThreadLocal),
            CAPTURING_RELAXED => CaptureState::Capturing(CaptureMode::Relaxed),
            _ => CaptureState::Unknown,
        }
    }

    /// Whether `word` (a [`load`](CaptureWord::load)) says "not capturing": the state bits read
    /// directly, which `decode`'s full match costs two instructions more than.
    #[inline(always)]
    pub(super) fn is_not_capturing(word: u64) -> bool {
        word & STATE_MASK == NOT_CAPTURING
    }

    /// The word with `state` in place of its state, one generation on.
    fn next(word: u64, state: CaptureState) -> u64 {
        ((word >> STATE_BITS).wrapping_add(1) << STATE_BITS) | CaptureWord::encode(state)
    }

    #[inline(always)]
    pub(super) fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(super) fn set(&self, state: CaptureState) {
        let _ = self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| Some(CaptureWord::next(word, state)));
    }

    /// Makes the state unknown, unless a capture of this crate's is under way (whose end sets
    /// it anew); returns the word it replaced, if it did.
    pub(super) fn forget(&self) -> Option<u64> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (!matches!(CaptureWord::decode(word), CaptureState::Capturing(_)))
                    .then(|| CaptureWord::next(word, CaptureState::Unknown))
            })
            .ok()
    }

    /// Puts back the state of `replaced` over the word `forget` made of it, if nothing changed
    /// it since.
    pub(super) fn put_back(&self, replaced: u64) {
        let made = CaptureWord::next(replaced, CaptureState::Unknown);
        let back = CaptureWord::next(made, CaptureWord::decode(replaced));
        let _ = self.0.compare_exchange(made, back, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Records the driver's "not capturing", asked for when the word was `seen` (unknown), if it
    /// has not changed since.
    pub(super) fn confirm_not_capturing(&self, seen: u64) {
        let confirmed = CaptureWord::next(seen, CaptureState::NotCapturing);
        let _ = self.0.compare_exchange(seen, confirmed, Ordering::AcqRel, Ordering::Relaxed);
    }
}
