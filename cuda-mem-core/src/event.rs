//! Events: markers recorded in a stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cuda_sys::cu_call;
use cuda_sys::types::{CUevent, CUevent_flags, CUresult};

use crate::device::Device;
use crate::driver::driver;
use crate::error::Result;
use crate::stream::Stream;

/// The CUDA version of `cuEventElapsedTime_v2` (`PFN_cuEventElapsedTime_v12080`); older drivers
/// get CUDA 2.0's `cuEventElapsedTime`, which takes the same arguments.
const ELAPSED_TIME_V2: u32 = 12080;

/// How to create an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventOptions {
    /// Whether the event records timestamps (needed for [`Event::elapsed_since`]).
    pub timing: bool,
    /// Whether waiting on it blocks the thread instead of spinning.
    pub blocking_sync: bool,
}

impl EventOptions {
    /// Options with timing enabled.
    pub fn timing(mut self) -> Self {
        self.timing = true;
        self
    }
}

/// An event of a device's primary context, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    handle: CUevent,
    device: Device,
    /// Whether its latest recording (through [`Event::record`]) may have been in a capture: a
    /// stream that waits for it may join that capture.
    in_capture: AtomicBool,
}

// SAFETY: the handle is an opaque token that only the driver interprets (Rust never dereferences
// it), and the driver API lets any thread use an event handle: its event functions are
// thread-safe. The event is destroyed only in `Drop`, once, which needs the value itself, so no
// thread can use the handle through this type after that.
unsafe impl Send for Event {}
// SAFETY: as for `Send`: every method takes `&self` and only passes the handle to thread-safe
// driver functions (recording, waiting, querying); the only state mutated after construction
// is an atomic flag.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn new(device: Device, options: EventOptions) -> Result<Event> {
        crate::context::bind(device)?;
        let d = driver()?;
        let mut flags = 0;
        if !options.timing {
            flags |= CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        }
        if options.blocking_sync {
            flags |= CUevent_flags::CU_EVENT_BLOCKING_SYNC.0;
        }
        let mut handle: CUevent = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the device's context is current.
        unsafe { cu_call!(d, cuEventCreate(&mut handle, flags)) }?;
        Ok(Event { handle, device, in_capture: AtomicBool::new(false) })
    }

    /// The raw handle.
    pub fn handle(&self) -> CUevent {
        self.handle
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

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
        let in_capture = stream.capture_state() != crate::graph::CaptureState::NotCapturing;
        self.in_capture.store(in_capture, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the latest recording through [`Event::record`] may have been in a capture (its
    /// stream was capturing, or its capture state unknown).
    pub(crate) fn maybe_recorded_in_capture(&self) -> bool {
        self.in_capture.load(Ordering::Relaxed)
    }

    /// Waits for the latest recording to complete.
    ///
    /// # Errors
    /// If the driver call fails.
    #[doc(alias = "sync")]
    pub fn synchronize(&self) -> Result<()> {
        let d = driver()?;
        // SAFETY: a valid event handle.
        unsafe { cu_call!(d, cuEventSynchronize(self.handle())) }?;
        Ok(())
    }

    /// Whether the latest recording has completed.
    ///
    /// # Errors
    /// If the driver reports an error other than "not ready".
    pub fn is_complete(&self) -> Result<bool> {
        let d = driver()?;
        // SAFETY: a valid event handle.
        match unsafe { cu_call!(d, cuEventQuery(self.handle())) } {
            Ok(()) => Ok(true),
            Err(e) if e.code() == Some(CUresult::CUDA_ERROR_NOT_READY) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The time between `start` completing and this event completing (both need timing).
    ///
    /// # Errors
    /// If either lacks timing, was never recorded, or has not completed.
    pub fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        let d = driver()?;
        let mut ms = 0f32;
        let has_v2 = d.version()? >= ELAPSED_TIME_V2;
        // SAFETY: `ms` is a valid out-pointer; valid event handles.
        unsafe {
            if has_v2 {
                cu_call!(d, cuEventElapsedTime_v2(&mut ms, start.handle(), self.handle()))
            } else {
                // Before 12.8 only CUDA 2.0's variant exists; it takes the same arguments.
                cu_call!(d, cuEventElapsedTime_v1(&mut ms, start.handle(), self.handle()))
            }
        }?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // The event carries its context: destroying it needs none current, so a failure to bind
        // one is no reason to leave the event behind.
        let _ = crate::context::bind(self.device);
        let destroy = || -> Result<()> {
            let d = driver()?;
            // SAFETY: the handle came from cuEventCreate and is destroyed once, here.
            unsafe { cu_call!(d, cuEventDestroy_v2(self.handle())) }?;
            Ok(())
        };
        if let Err(error) = destroy() {
            crate::drop_errors::record("Event", error);
        }
    }
}
