//! Events: a marker recorded into a stream, complete once the stream reaches it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cuda_mem_sys::types::{CUevent_flags, CUresult};

use crate::capture::CapturePoint;
use crate::error::{SimResult, fail};
use crate::ipc_event::SharedProgress;

/// An event and the progress of its latest recording.
pub(crate) struct Event {
    /// The handle the application sees.
    pub handle: usize,
    /// The context it was created in.
    pub ctx: usize,
    /// `CU_EVENT_*` flags.
    pub flags: u32,
    progress: Mutex<Progress>,
    reached: Condvar,
    /// For an interprocess event (created or imported): the progress every process holding it
    /// shares, which stands in for `progress`'s counters.
    pub shared: Option<SharedProgress>,
    /// What waiting for the event shows the host: the stream of its latest completed recording
    /// in this process and that stream's mark before it (see
    /// [`crate::stream::Stream::marks`]), with the recording's number; `None` when that
    /// recording was not made by `cuEventRecord` here (a graph's, another process's).
    observes: Mutex<Option<(u64, usize, u64)>>,
}

#[derive(Default)]
struct Progress {
    /// How many times it has been recorded.
    recorded: u64,
    /// The latest recording that has completed.
    completed: u64,
    /// When that completion happened.
    completed_at: Option<Instant>,
    /// When it was last recorded into a capture sequence: where.
    captured: Option<CapturePoint>,
}

impl Event {
    /// A new, never-recorded event (which counts as complete, as in the driver).
    pub(crate) fn new(ctx: usize, flags: u32, shared: Option<SharedProgress>) -> Arc<Event> {
        Arc::new(Event {
            handle: crate::handle::next(),
            ctx,
            flags,
            progress: Mutex::new(Progress::default()),
            reached: Condvar::new(),
            shared,
            observes: Mutex::new(None),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a new recording; returns its number, to pass to [`Event::complete`] from the stream.
    pub(crate) fn begin_record(&self) -> u64 {
        let mut progress = self.lock();
        progress.captured = None;
        progress.recorded += 1;
        match &self.shared {
            Some(shared) => shared.begin_record(),
            None => progress.recorded,
        }
    }

    /// Notes a recording into a capture sequence at `point`: the event is then a
    /// captured event (its earlier recordings are no longer what it stands for) until it is
    /// recorded outside a capture.
    pub(crate) fn record_captured(&self, point: CapturePoint) {
        self.lock().captured = Some(point);
    }

    /// Where the latest recording was captured, if it was.
    pub(crate) fn captured_in(&self) -> Option<CapturePoint> {
        self.lock().captured.clone()
    }

    /// Marks recording `generation` complete (run by the stream's worker); `observes` is what
    /// waiting for it shows the host, the stream's handle and mark (see [`Event::observes`]).
    pub(crate) fn complete(&self, generation: u64, observes: Option<(usize, u64)>) {
        {
            let mut latest = self.observes.lock().unwrap_or_else(PoisonError::into_inner);
            if latest.is_none_or(|(seen, _, _)| seen < generation) {
                *latest = observes.map(|(stream, mark)| (generation, stream, mark));
            }
        }
        if let Some(shared) = &self.shared {
            shared.complete(generation);
            return;
        }
        let mut progress = self.lock();
        if progress.completed < generation {
            progress.completed = generation;
            progress.completed_at = Some(Instant::now());
        }
        drop(progress);
        self.reached.notify_all();
    }

    /// The stream and mark that waiting for the event shows the host (see
    /// [`crate::pool::Observed::StreamUpTo`]): those of the latest recording that completed in
    /// this process, if `cuEventRecord` made it.
    pub(crate) fn observes(&self) -> Option<(usize, u64)> {
        let latest = *self.observes.lock().unwrap_or_else(PoisonError::into_inner);
        latest.map(|(_, stream, mark)| (stream, mark))
    }

    /// The latest recording, or `None` if it was never recorded.
    pub(crate) fn latest(&self) -> Option<u64> {
        let recorded = self.shared.as_ref().map_or_else(|| self.lock().recorded, SharedProgress::recorded);
        (recorded > 0).then_some(recorded)
    }

    /// Whether the latest recording has completed.
    pub(crate) fn is_complete(&self) -> bool {
        if let Some(shared) = &self.shared {
            return shared.completed() >= shared.recorded();
        }
        let progress = self.lock();
        progress.completed >= progress.recorded
    }

    /// Blocks until recording `generation` has completed.
    pub(crate) fn wait_for(&self, generation: u64) {
        if let Some(shared) = &self.shared {
            shared.wait_for(generation);
            return;
        }
        let mut progress = self.lock();
        while progress.completed < generation {
            progress = self.reached.wait(progress).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Blocks until the latest recording (as of now) has completed.
    pub(crate) fn synchronize(&self) {
        let generation = self.latest().unwrap_or(0);
        self.wait_for(generation);
    }

    /// Milliseconds between two completed events, as `cuEventElapsedTime` computes it.
    pub(crate) fn elapsed_ms(start: &Event, end: &Event) -> SimResult<f32> {
        let timing_disabled = CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        if start.flags & timing_disabled != 0 || end.flags & timing_disabled != 0 {
            return fail(CUresult::CUDA_ERROR_INVALID_HANDLE);
        }
        let read = |event: &Event| {
            let progress = event.lock();
            if progress.recorded == 0 {
                return fail(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            if progress.completed < progress.recorded {
                return fail(CUresult::CUDA_ERROR_NOT_READY);
            }
            progress.completed_at.ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
        };
        let (t0, t1) = (read(start)?, read(end)?);
        let ms = if t1 >= t0 {
            t1.duration_since(t0).as_secs_f64() * 1e3
        } else {
            -(t0.duration_since(t1).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }
}
