//! Events: markers recorded in a stream, and interprocess events shared with other processes.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUevent, CUevent_flags, CUipcEventHandle, CUresult};

use crate::device::Device;
use crate::driver::driver;
use crate::drop_errors::on_drop;
use crate::error::{Error, Result};

/// The length in bytes of an interprocess event handle (`CUipcEventHandle`).
pub const IPC_EVENT_HANDLE_LEN: usize = 64;

const _: () = assert!(std::mem::size_of::<CUipcEventHandle>() == IPC_EVENT_HANDLE_LEN);

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
    /// Whether the event can be shared with other processes (`CU_EVENT_INTERPROCESS`; cuda.core's
    /// `ipc_enabled`). The driver needs timing off for it: asking for both is refused
    /// ([`Error::InterprocessEventTiming`]) before any driver call.
    #[doc(alias = "ipc_enabled")]
    pub interprocess: bool,
}

impl EventOptions {
    /// Options with timing enabled.
    pub fn timing(mut self) -> Self {
        self.timing = true;
        self
    }

    /// Options with blocking synchronization (the waiting thread sleeps instead of spinning).
    pub fn blocking_sync(mut self) -> Self {
        self.blocking_sync = true;
        self
    }

    /// Options for an interprocess event (timing stays off: the driver does not time them),
    /// which [`Event::ipc_handle`] exports and [`Event::from_ipc_handle`] opens in another
    /// process.
    #[doc(alias = "ipc_enabled")]
    pub fn interprocess(mut self) -> Self {
        self.interprocess = true;
        self
    }
}

/// The driver's handle of an interprocess event (`CUipcEventHandle`): 64 opaque bytes that name
/// the event to another process ([`Event::from_ipc_handle`] opens it there). How the bytes travel
/// is the caller's business (`cuda-mem-ipc` has an encoding for them); nothing but the driver
/// interprets them.
///
/// A handle names its event for as long as the exporting process holds the event: each
/// recording, in either process, is seen by both (waits and queries see the latest). Opening it
/// after the exporter destroyed the event is undefined in the driver's documentation.
#[doc(alias = "IPCEventDescriptor")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcEventHandle([u8; IPC_EVENT_HANDLE_LEN]);

impl IpcEventHandle {
    /// A handle from its 64 bytes (as another process's [`IpcEventHandle::to_bytes`] gave them).
    pub fn from_bytes(bytes: [u8; IPC_EVENT_HANDLE_LEN]) -> IpcEventHandle {
        IpcEventHandle(bytes)
    }

    /// The handle's 64 bytes.
    pub fn to_bytes(&self) -> [u8; IPC_EVENT_HANDLE_LEN] {
        self.0
    }

    /// The handle's 64 bytes, borrowed.
    pub fn as_bytes(&self) -> &[u8; IPC_EVENT_HANDLE_LEN] {
        &self.0
    }

    /// The driver's structure.
    pub fn to_raw(&self) -> CUipcEventHandle {
        let mut raw = CUipcEventHandle::default();
        for (to, &from) in raw.reserved.iter_mut().zip(&self.0) {
            *to = from as std::ffi::c_char;
        }
        raw
    }

    /// A handle from the driver's structure.
    pub fn from_raw(raw: &CUipcEventHandle) -> IpcEventHandle {
        let mut bytes = [0u8; IPC_EVENT_HANDLE_LEN];
        for (to, &from) in bytes.iter_mut().zip(&raw.reserved) {
            *to = from as u8;
        }
        IpcEventHandle(bytes)
    }
}

impl fmt::Debug for IpcEventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IpcEventHandle(")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str(")")
    }
}

/// Where an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Created here with these options.
    Created(EventOptions),
    /// Opened from another process's handle.
    Imported,
}

/// An event of a device's primary context, destroyed on drop.
///
/// An event created with [`EventOptions::interprocess`] is shared with other processes: its
/// [`ipc_handle`](Event::ipc_handle) goes to another process, which opens it with
/// [`Event::from_ipc_handle`]. The opened event is an `Event` too (so everything that takes an
/// `&Event`, [`Stream::wait`](crate::Stream::wait) first, takes it): it has timing off and names the exporter's event,
/// whose recordings in either process it sees. It is destroyed (closed in this process) on drop,
/// once, like any other.
#[derive(Debug)]
pub struct Event {
    handle: CUevent,
    device: Device,
    origin: Origin,
    /// A number no other event of this process has had.
    id: u64,
    /// The interprocess handle, once exported (or the one it was opened from).
    ipc_handle: OnceLock<IpcEventHandle>,
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
// is an atomic flag and a `OnceLock` (the exported handle), both safe to share.
unsafe impl Sync for Event {}

/// The next event's [`Event::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Event {
    /// Creates an event.
    ///
    /// # Errors
    /// - [`Error::InterprocessEventTiming`] for an interprocess event with timing (before any
    ///   driver call).
    /// - A failed driver call.
    pub fn new(device: Device, options: EventOptions) -> Result<Event> {
        if options.interprocess && options.timing {
            return Err(Error::InterprocessEventTiming);
        }
        crate::context::bind(device)?;
        let d = driver()?;
        let mut flags = 0;
        if !options.timing {
            flags |= CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        }
        if options.blocking_sync {
            flags |= CUevent_flags::CU_EVENT_BLOCKING_SYNC.0;
        }
        if options.interprocess {
            flags |= CUevent_flags::CU_EVENT_INTERPROCESS.0;
        }
        let mut handle: CUevent = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the device's context is current.
        unsafe { cu_call!(d, cuEventCreate(&mut handle, flags)) }?;
        Ok(Event::wrap(handle, device, Origin::Created(options)))
    }

    fn wrap(handle: CUevent, device: Device, origin: Origin) -> Event {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Event { handle, device, origin, id, ipc_handle: OnceLock::new(), in_capture: AtomicBool::new(false) }
    }

    /// Opens, in `device`'s primary context, the interprocess event another process exported
    /// ([`Event::ipc_handle`] there; `cuIpcOpenEventHandle`). The event has timing off and is
    /// IPC-enabled; its [`ipc_handle`](Event::ipc_handle) is `handle`. It is closed in this
    /// process on drop. Open it once and keep it: each opening is another event of this process,
    /// and every one names the same event of the exporter.
    ///
    /// # Errors
    /// A failed driver call: a handle that names no live interprocess event of another process
    /// (damaged, forged, or the exporter destroyed the event or exited) is refused by the driver,
    /// typically with `CUDA_ERROR_INVALID_VALUE` (the driver's documentation leaves using a
    /// handle of a destroyed event undefined: do not rely on the refusal).
    #[doc(alias = "from_ipc_descriptor")]
    #[doc(alias = "cuIpcOpenEventHandle")]
    pub fn from_ipc_handle(device: Device, handle: &IpcEventHandle) -> Result<Event> {
        crate::context::bind(device)?;
        let d = driver()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the handle is passed by value; the device's
        // context is current.
        unsafe { cu_call!(d, cuIpcOpenEventHandle(&mut raw, handle.to_raw())) }?;
        let event = Event::wrap(raw, device, Origin::Imported);
        let _ = event.ipc_handle.set(*handle);
        Ok(event)
    }

    /// The handle that names this interprocess event to another process
    /// (`cuIpcGetEventHandle`, asked once and kept; for an opened event, the handle it was opened
    /// from). Send its bytes; the other process opens it with [`Event::from_ipc_handle`].
    ///
    /// # Errors
    /// - [`Error::EventNotInterprocess`] for an event created without
    ///   [`EventOptions::interprocess`] (before any driver call).
    /// - A failed driver call.
    #[doc(alias = "get_ipc_descriptor")]
    #[doc(alias = "ipc_descriptor")]
    #[doc(alias = "cuIpcGetEventHandle")]
    pub fn ipc_handle(&self) -> Result<IpcEventHandle> {
        if let Some(handle) = self.ipc_handle.get() {
            return Ok(*handle);
        }
        if !self.is_ipc_enabled() {
            return Err(Error::EventNotInterprocess);
        }
        let d = driver()?;
        let mut raw = CUipcEventHandle::default();
        // SAFETY: `raw` is a valid out-pointer; a valid event handle.
        unsafe { cu_call!(d, cuIpcGetEventHandle(&mut raw, self.handle())) }?;
        Ok(*self.ipc_handle.get_or_init(|| IpcEventHandle::from_raw(&raw)))
    }

    /// Whether the event can be shared with other processes: created with
    /// [`EventOptions::interprocess`], or opened from another process's handle.
    #[doc(alias = "is_interprocess")]
    pub fn is_ipc_enabled(&self) -> bool {
        match self.origin {
            Origin::Created(options) => options.interprocess,
            Origin::Imported => true,
        }
    }

    /// Whether the event records timestamps (never for an interprocess event).
    pub fn is_timing_enabled(&self) -> bool {
        matches!(self.origin, Origin::Created(options) if options.timing)
    }

    /// Whether waiting on the event blocks the thread instead of spinning (as this process asked
    /// when it created it; `false` for an opened event, which the driver opens like an event
    /// created with timing off and nothing else).
    pub fn is_blocking_sync(&self) -> bool {
        matches!(self.origin, Origin::Created(options) if options.blocking_sync)
    }

    /// Whether the event was opened from another process's handle ([`Event::from_ipc_handle`]).
    pub fn is_imported(&self) -> bool {
        self.origin == Origin::Imported
    }

    /// A number no other event of this process has had or will have (the driver may give a new
    /// event the handle, or the interprocess handle, of one destroyed before): to tell events
    /// apart, as `cuda-mem-ipc` does for the events it sends.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The raw handle.
    pub fn handle(&self) -> CUevent {
        self.handle
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Notes whether the latest recording may have been in a capture (see
    /// [`maybe_recorded_in_capture`](Event::maybe_recorded_in_capture)).
    pub(crate) fn note_recorded(&self, in_capture: bool) {
        self.in_capture.store(in_capture, Ordering::Relaxed);
    }

    /// Whether the latest recording may have been in a capture: through [`Event::record`], in a
    /// stream that was capturing or whose capture state was unknown; and always for an event
    /// opened from another process, whose recordings (there, or here through its raw handle)
    /// this crate does not see.
    pub(crate) fn maybe_recorded_in_capture(&self) -> bool {
        self.is_imported() || self.in_capture.load(Ordering::Relaxed)
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
                cu_call!(d, cuEventElapsedTime_v1(&mut ms, start.handle(), self.handle()) as "cuEventElapsedTime")
            }
        }?;
        Ok(elapsed_from_ms(ms))
    }
}

/// The driver's milliseconds as a `Duration`: below zero (or NaN) is zero, beyond `Duration` is
/// `Duration::MAX`. `Duration::from_secs_f64` would panic on an infinite or huge answer.
fn elapsed_from_ms(ms: f32) -> Duration {
    Duration::try_from_secs_f64(f64::from(ms.max(0.0)) / 1e3).unwrap_or(Duration::MAX)
}

impl Drop for Event {
    fn drop(&mut self) {
        // The event carries its context: destroying it needs none current, so a failure to bind
        // one is no reason to leave the event behind.
        let _ = crate::context::bind(self.device);
        // SAFETY: the handle came from cuEventCreate or cuIpcOpenEventHandle and is destroyed
        // once, here.
        on_drop("Event", || Ok(unsafe { cu_call!(driver()?, cuEventDestroy_v2(self.handle)) }?));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Stream, StreamOptions};

    fn device() -> Device {
        cuda_sim::testing::driver().expect("the test driver loads");
        Device::new(0).unwrap()
    }

    #[test]
    fn elapsed_times_the_driver_could_not_mean_do_not_panic() {
        assert_eq!(elapsed_from_ms(1500.0), Duration::from_millis(1500));
        assert_eq!(elapsed_from_ms(-3.0), Duration::ZERO);
        assert_eq!(elapsed_from_ms(f32::NAN), Duration::ZERO);
        // Both panicked in `Duration::from_secs_f64`.
        assert_eq!(elapsed_from_ms(f32::INFINITY), Duration::MAX);
        assert_eq!(elapsed_from_ms(f32::MAX), Duration::MAX);
    }

    #[test]
    fn interprocess_events_have_timing_off_and_asking_for_both_is_refused_first() {
        let device = device();
        let refused = Event::new(device, EventOptions::default().interprocess().timing()).unwrap_err();
        // The driver would have answered CUDA_ERROR_INVALID_VALUE: this is the check before it.
        assert!(matches!(refused, Error::InterprocessEventTiming), "{refused:?}");
        assert!(refused.to_string().contains("EventOptions::default().interprocess()"), "{refused}");
        assert_eq!(refused.cuda_code(), None, "no driver call");

        let shared = Event::new(device, EventOptions::default().interprocess()).unwrap();
        assert!(shared.is_ipc_enabled() && !shared.is_timing_enabled() && !shared.is_imported());
        let plain = Event::new(device, EventOptions::default().timing().blocking_sync()).unwrap();
        assert!(!plain.is_ipc_enabled() && plain.is_timing_enabled() && plain.is_blocking_sync());
        assert_ne!(shared.id(), plain.id());
    }

    /// In a process of its own: the simulator counts the `cuIpcGetEventHandle` calls of every
    /// thread, and other tests of this binary export events meanwhile.
    #[test]
    fn only_interprocess_events_are_exported_and_the_handle_is_asked_once() {
        cuda_sim::testing::in_simulated_machine(
            "event::tests::only_interprocess_events_are_exported_and_the_handle_is_asked_once",
            &[],
            || {
                let device = device();
                let plain = Event::new(device, EventOptions::default()).unwrap();
                let (refused, counts) = cuda_sim::testing::count_calls_if_simulated(|| plain.ipc_handle());
                assert!(matches!(refused, Err(Error::EventNotInterprocess)), "{refused:?}");
                counts.assert_calls("cuIpcGetEventHandle", 0, "refused before the driver call");
                assert!(refused.unwrap_err().to_string().contains("not IPC-enabled"));

                let shared = Event::new(device, EventOptions::default().interprocess()).unwrap();
                let first = shared.ipc_handle().unwrap();
                let (again, counts) = cuda_sim::testing::count_calls_if_simulated(|| shared.ipc_handle());
                assert_eq!(again.unwrap(), first);
                counts.assert_calls("cuIpcGetEventHandle", 0, "kept from the first export");
                assert_ne!(first.to_bytes(), [0; IPC_EVENT_HANDLE_LEN]);
                assert_eq!(IpcEventHandle::from_raw(&first.to_raw()), first);
                assert_eq!(IpcEventHandle::from_bytes(first.to_bytes()), first);
                assert!(format!("{first:?}").starts_with("IpcEventHandle("));
            },
        );
    }

    #[test]
    fn handles_that_name_no_other_process_event_are_refused_by_the_driver() {
        let device = device();
        let shared = Event::new(device, EventOptions::default().interprocess()).unwrap();
        // The simulator refuses its own process's handles (see its `conservative` notes), and
        // every driver refuses zeros.
        for handle in [shared.ipc_handle().unwrap(), IpcEventHandle::from_bytes([0; IPC_EVENT_HANDLE_LEN])] {
            let refused = Event::from_ipc_handle(device, &handle).unwrap_err();
            assert_eq!(refused.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "{refused}");
        }
        // The exported event still works: recorded, waited for.
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        shared.record(&stream).unwrap();
        stream.wait(&shared).unwrap();
        shared.synchronize().unwrap();
        assert!(shared.is_complete().unwrap());
    }

    #[test]
    fn waiting_for_an_opened_event_makes_the_waiters_capture_unknown() {
        let device = device();
        let recorder = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let waiter = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let created = Event::new(device, EventOptions::default().interprocess()).unwrap();
        created.record(&recorder).unwrap();
        waiter.wait(&created).unwrap();
        assert_eq!(waiter.capture_state(), crate::CaptureState::NotCapturing, "recorded outside captures");
        // As `from_ipc_handle` opens one (the simulator opens only other processes' handles):
        // its recordings, in the exporter or here through its raw handle, are not seen here.
        let mut opened = Event::new(device, EventOptions::default().interprocess()).unwrap();
        opened.origin = Origin::Imported;
        opened.record(&recorder).unwrap();
        waiter.wait(&opened).unwrap();
        assert_eq!(waiter.capture_state(), crate::CaptureState::Unknown, "its origin cannot be vouched for");
    }
}
