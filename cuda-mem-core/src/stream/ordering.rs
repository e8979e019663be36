//! How streams order work after each other's: an event recorded in one stream
//! ([`Event::record`], [`Stream::record_event`]) that another waits for ([`Stream::wait`]).
//! Waiting for an event recorded in a capture joins that capture, which the waiter's capture
//! state then says.

use cuda_mem_sys::cu_call;

use super::{CaptureState, Stream};
use crate::driver::driver;
use crate::error::Result;
use crate::event::{Event, EventOptions};

impl Stream {
    /// Makes later work on this stream wait for `event`'s latest recording. For another thread's
    /// per-thread default stream, the calling thread's waits (the work enqueued through this value
    /// from here goes there; see [the type's notes](Stream#per-thread-default-streams)).
    ///
    /// # Errors
    /// If the driver call fails.
    pub fn wait(&self, event: &Event) -> Result<()> {
        crate::context::bind(self.device())?;
        let d = driver()?;
        // SAFETY: valid stream and event handles; the event outlives the call (the driver keeps
        // what it needs).
        unsafe { cu_call!(d, cuStreamWaitEvent(self.handle(), event.handle(), 0)) }?;
        if event.maybe_recorded_in_capture() {
            // Waiting for work of a capture joins it: this stream now captures into that graph
            // (until its capture ends), which this crate cannot follow. Forgotten after the
            // wait, so that a driver answer asked for before it is never written back.
            self.inner.capture.forget();
        }
        Ok(())
    }

    /// Records a new event at the current end of the stream (for another thread's per-thread
    /// default stream, of the calling thread's, as [`Event::record`] does).
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn record_event(&self) -> Result<Event> {
        let event = Event::new(self.device(), EventOptions::default())?;
        event.record(self)?;
        Ok(event)
    }
}

impl Event {
    /// Records the event at the current end of `stream` (for another thread's per-thread default
    /// stream, of the calling thread's: see [`Stream`'s notes](Stream#per-thread-default-streams)).
    ///
    /// # Errors
    /// If the driver call fails (a stream of another device, say).
    pub fn record(&self, stream: &Stream) -> Result<()> {
        crate::context::bind(stream.device())?;
        let d = driver()?;
        // SAFETY: valid event and stream handles.
        unsafe { cu_call!(d, cuEventRecord(self.handle(), stream.handle())) }?;
        self.note_recorded(stream.capture_state() != CaptureState::NotCapturing);
        Ok(())
    }
}
