//! Stream capture into graphs: [`Stream::begin_capture`] gives a [`Capture`], whose
//! [`end`](Capture::end) gives the [`Graph`] of the work enqueued meanwhile;
//! [`Graph::instantiate`] makes a [`GraphExec`], which [`launch`](GraphExec::launch)es on a
//! stream. Each owns its driver object and destroys it when dropped.
//!
//! A capture keeps what its graph needs alive ([`Stream::keep_alive_in_capture`]): memory a
//! captured operation uses whose release could not be captured (a virtual buffer dropped while
//! its stream captured, say) is handed to the capture, then shared by the graph and every
//! executable graph instantiated from it, and let go of once the last of them is gone and the
//! work they enqueued is done.

use std::marker::PhantomData;
use std::sync::Arc;

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUgraph, CUgraphExec, CUgraphInstantiate_flags, CUresult, CUstreamCaptureStatus};

use crate::device::Device;
use crate::driver::driver;
use crate::drop_errors::on_drop;
use crate::error::Result;
use crate::ffi;
use crate::stream::{CaptureMode, GraphResources, Stream};

impl Stream {
    /// Begins capturing the work enqueued on this stream into a graph (`cuStreamBeginCapture`):
    /// until the returned [`Capture`] ends, that work is recorded instead of run. The stream's
    /// [`capture_state`](Stream::capture_state) is [`CaptureState::Capturing`](crate::CaptureState::Capturing) meanwhile.
    ///
    /// # Errors
    /// If the driver refuses: a stream already capturing (`CUDA_ERROR_ILLEGAL_STATE`), the
    /// legacy default stream (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), …
    #[doc(alias = "begin_building")]
    #[doc(alias = "create_graph_builder")]
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<Capture> {
        self.bind_if_default()?;
        let d = driver()?;
        // Unknown from before the driver's capture begins to after it is noted (another thread's
        // event record or allocation in between must not count it as not capturing); a refused
        // capture puts the state back.
        let replaced = self.capture_beginning();
        // SAFETY: a valid stream handle; the mode is one of the driver's values.
        let begun = unsafe { cu_call!(d, cuStreamBeginCapture_v2(self.handle(), mode.raw())) };
        if let Err(refused) = begun {
            self.capture_not_begun(replaced);
            return Err(refused.into());
        }
        let resources = Arc::new(GraphResources::default());
        self.capture_began(mode, Arc::clone(&resources));
        Ok(Capture { stream: self.clone(), resources, ended: false, _same_thread: PhantomData })
    }
}

/// A capture under way on a stream ([`Stream::begin_capture`]); [`end`](Capture::end) gives
/// its graph. Dropped without `end`, it ends the capture and destroys the graph (errors are
/// recorded: [`take_drop_errors`](crate::take_drop_errors)).
///
/// It is neither `Send` nor `Sync`: the driver ends a global or thread-local capture only on
/// the thread that began it.
///
/// ```compile_fail
/// fn send<T: Send>(_: T) {}
/// fn end_elsewhere(capture: cuda_mem_core::Capture) {
///     send(capture); // a capture ends on the thread that began it
/// }
/// ```
#[derive(Debug)]
#[doc(alias = "GraphBuilder")]
#[must_use = "the capture ends, its graph discarded, when this is dropped: call end() for the graph"]
pub struct Capture {
    stream: Stream,
    resources: Arc<GraphResources>,
    ended: bool,
    _same_thread: PhantomData<*const ()>,
}

impl Capture {
    /// The capturing stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Whether the capture is still active (not invalidated by a call that conflicts with it),
    /// as the driver says.
    ///
    /// # Errors
    /// If the driver call fails.
    #[doc(alias = "is_building")]
    pub fn is_active(&self) -> Result<bool> {
        self.stream.bind_if_default()?;
        // SAFETY: a valid stream handle, bound as it needs.
        let status = unsafe { ffi::stream_capture_status(driver()?, self.stream.handle()) }?;
        Ok(status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
    }

    /// Ends the capture (`cuStreamEndCapture`) and gives its graph.
    ///
    /// # Errors
    /// If the driver refuses: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when a conflicting call
    /// invalidated the capture (it has ended all the same, without a graph), and the like.
    #[doc(alias = "end_building")]
    pub fn end(mut self) -> Result<Graph> {
        let graph = self.finish()?;
        Ok(self.graph(graph))
    }

    /// The owner of the graph the capture made.
    fn graph(&self, handle: CUgraph) -> Graph {
        Graph { handle, device: self.stream.device(), resources: Arc::clone(&self.resources) }
    }

    /// Ends the capture, once; the stream's work from before it is what the resources wait for
    /// first.
    fn finish(&mut self) -> Result<CUgraph> {
        self.ended = true;
        let mut graph: CUgraph = std::ptr::null_mut();
        let ended = self.stream.bind_if_default().and_then(|()| {
            let d = driver()?;
            // SAFETY: `graph` is a valid out-pointer; a valid stream handle.
            unsafe { cu_call!(d, cuStreamEndCapture(self.stream.handle(), &mut graph)) }?;
            Ok(())
        });
        let known = match &ended {
            Ok(()) => true,
            Err(error) => error.cuda_code() == Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
        };
        self.stream.capture_ended(known);
        if known {
            // No capture now: an event recorded here follows the stream's work from before it.
            self.resources.order_after(&self.stream);
        }
        ended.map(|()| graph)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        on_drop("Capture", || self.finish().map(|graph| drop(self.graph(graph))));
    }
}

/// Options of [`Graph::instantiate`] (`CUDA_GRAPH_INSTANTIATE_FLAG_*`), as cuda.core's
/// `GraphCompleteOptions`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
#[doc(alias = "GraphCompleteOptions")]
pub struct InstantiateOptions {
    /// Frees the graph's allocations that are still live when it is launched again, instead
    /// of refusing the launch (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`).
    pub auto_free_on_launch: bool,
    /// Launches nodes with their own priorities rather than the stream's
    /// (`CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`).
    pub use_node_priority: bool,
}

impl InstantiateOptions {
    /// Options with [`auto_free_on_launch`](InstantiateOptions::auto_free_on_launch) set.
    pub fn auto_free_on_launch(mut self) -> Self {
        self.auto_free_on_launch = true;
        self
    }

    /// Options with [`use_node_priority`](InstantiateOptions::use_node_priority) set.
    pub fn use_node_priority(mut self) -> Self {
        self.use_node_priority = true;
        self
    }

    fn flags(self) -> u64 {
        let mut flags = 0;
        if self.auto_free_on_launch {
            flags |= u64::from(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0);
        }
        if self.use_node_priority {
            flags |= u64::from(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0);
        }
        flags
    }
}

/// A graph made by a capture ([`Capture::end`]); destroyed (`cuGraphDestroy`) when dropped.
/// What the capture kept alive lives until this graph and every [`GraphExec`] instantiated from
/// it are gone.
///
/// It is `Send` but not `Sync`: the driver lets one thread at a time use a graph.
///
/// ```compile_fail
/// fn share<T: Sync>(_: &T) {}
/// fn instantiate_from_two_threads(graph: &cuda_mem_core::Graph) {
///     share(graph);
/// }
/// ```
#[derive(Debug)]
pub struct Graph {
    handle: CUgraph,
    device: Device,
    resources: Arc<GraphResources>,
}

// SAFETY: the handle is an opaque token only the driver interprets; the driver lets any thread
// use or destroy a graph, as long as no two threads use one graph at once. The graph is used
// through `&self` only by `instantiate`, and `Graph` is not `Sync`, so no two threads can; it is
// destroyed once, in `Drop`. The shared resources are behind a mutex.
unsafe impl Send for Graph {}

impl Graph {
    /// The raw handle (still owned by this value).
    pub fn handle(&self) -> CUgraph {
        self.handle
    }

    /// The device of the stream it was captured on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// How many objects the capture handed to the graph to keep alive
    /// ([`Stream::keep_alive_in_capture`]).
    pub fn kept_alive(&self) -> usize {
        self.resources.len()
    }

    /// Makes an executable graph (`cuGraphInstantiateWithFlags`); the graph may be dropped
    /// afterwards, and instantiated again.
    ///
    /// # Errors
    /// If the driver refuses (a graph with allocations instantiated twice while an instance
    /// lives, say).
    #[doc(alias = "complete")]
    pub fn instantiate(&self, options: InstantiateOptions) -> Result<GraphExec> {
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: `exec` is a valid out-pointer; the graph handle is live (owned by `self`);
        // the device's context is current.
        unsafe { cu_call!(d, cuGraphInstantiateWithFlags(&mut exec, self.handle, options.flags())) }?;
        Ok(GraphExec { handle: exec, device: self.device, resources: Arc::clone(&self.resources) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuStreamEndCapture and is destroyed once, here.
        on_drop("Graph", || Ok(unsafe { cu_call!(driver()?, cuGraphDestroy(self.handle)) }?));
    }
}

/// An executable graph ([`Graph::instantiate`]); destroyed (`cuGraphExecDestroy`) when dropped
/// (a launch still running completes first, as the driver documents). `Send`, not `Sync`, as
/// [`Graph`].
#[derive(Debug)]
pub struct GraphExec {
    handle: CUgraphExec,
    device: Device,
    resources: Arc<GraphResources>,
}

// SAFETY: as for `Graph`: an opaque handle, usable from any thread but not from two at once;
// `launch` takes `&self` and `GraphExec` is not `Sync`; destroyed once, in `Drop`.
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// The raw handle (still owned by this value).
    pub fn handle(&self) -> CUgraphExec {
        self.handle
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Launches the graph on `stream` (`cuGraphLaunch`). What the graph keeps alive is then let
    /// go of only after this launch's work (and, launched into a capture begun through this
    /// crate, after that capture's graphs are gone).
    ///
    /// # Safety
    /// The graph's work reads and writes the memory the captured work used, by address, when it
    /// runs, and nothing ties that memory to the graph but what the capture was handed
    /// ([`Stream::keep_alive_in_capture`]): the graph's own allocations, and the buffers the
    /// captured work used through this crate (fills, copies) that were dropped *during* the
    /// capture, whatever stream frees them (their frees wait for the graphs). So every other
    /// buffer, view or pointer the captured work used (one dropped after the capture ended, one
    /// a kernel used, a view) is still allocated when this launch's work runs, and none of its
    /// bytes is lent to the host ([`host_slice`](crate::ScopedBuffer::host_slice) and the like)
    /// while that work may run: keep them, and their slices, ordered around the launch's stream
    /// as for any work on it. (A buffer used in a capture and dropped after it, then a launch,
    /// would be a write to freed memory.)
    ///
    /// ```compile_fail,E0133
    /// # fn f(exec: &cuda_mem_core::GraphExec, stream: &cuda_mem_core::Stream) -> cuda_mem_core::Result<()> {
    /// exec.launch(stream)?; // error: the caller vouches for the memory the graph uses
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// If the driver refuses (a graph whose allocations are still live launched again without
    /// [`InstantiateOptions::auto_free_on_launch`], say).
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        crate::context::bind(stream.device())?;
        let d = driver()?;
        // SAFETY: the exec handle is live (owned by `self`) and the stream handle valid.
        unsafe { cu_call!(d, cuGraphLaunch(self.handle, stream.on_calling_thread().handle())) }?;
        if self.resources.len() == 0 {
            return Ok(());
        }
        if let Err(kept) = stream.keep_alive_in_capture(Arc::clone(&self.resources)) {
            match stream.is_capturing() {
                Ok(false) => self.resources.order_after(&stream.on_calling_thread()),
                // Launched into a capture this crate does not follow: its graph may use the
                // memory for as long as it lives, which cannot be known, so it is kept.
                _ => std::mem::forget(kept),
            }
        }
        Ok(())
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuGraphInstantiateWithFlags and is destroyed once.
        on_drop("GraphExec", || Ok(unsafe { cu_call!(driver()?, cuGraphExecDestroy(self.handle)) }?));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::{CaptureState, StreamOptions};

    fn setup() -> (Device, Stream) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        (device, Stream::new(device, StreamOptions::default().non_blocking()).unwrap())
    }

    /// Sets its flag when dropped.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn flag() -> (DropFlag, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        (DropFlag(Arc::clone(&dropped)), dropped)
    }

    /// Drop errors recorded about `what` (other tests of the binary record their own).
    fn recorded(what: &str) -> Vec<crate::DropError> {
        crate::take_drop_errors().into_iter().filter(|e| e.what == what).collect()
    }

    #[test]
    fn modes_are_the_drivers_values() {
        assert_eq!(CaptureMode::Global.raw().0, 0);
        assert_eq!(CaptureMode::ThreadLocal.raw().0, 1);
        assert_eq!(CaptureMode::Relaxed.raw().0, 2);
        let flags = |o: InstantiateOptions| o.flags();
        assert_eq!(flags(InstantiateOptions::default()), 0);
        assert_eq!(flags(InstantiateOptions::default().auto_free_on_launch()), 1);
        assert_eq!(flags(InstantiateOptions::default().use_node_priority()), 8);
        assert_eq!(flags(InstantiateOptions::default().auto_free_on_launch().use_node_priority()), 9);
    }

    /// In a process of its own: a capture in the global mode restricts the driver calls of
    /// every other thread while it lasts.
    #[test]
    fn the_state_follows_begin_and_end_and_agrees_with_the_driver() {
        cuda_sim::testing::in_simulated_machine(
            "graph::tests::the_state_follows_begin_and_end_and_agrees_with_the_driver",
            &[],
            || {
                let (_, stream) = setup();
                let clone = stream.clone();
                assert_eq!(stream.capture_state(), CaptureState::NotCapturing);
                assert!(!stream.is_capturing().unwrap());
                let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
                assert_eq!(clone.capture_state(), CaptureState::Capturing(CaptureMode::Relaxed), "clones share it");
                assert!(stream.is_capturing().unwrap());
                assert!(capture.is_active().unwrap());
                assert_eq!(capture.stream(), &stream);
                // A second capture on the same stream is refused, and leaves the first alone.
                let again = clone.begin_capture(CaptureMode::Relaxed).unwrap_err();
                assert_eq!(again.cuda_code(), Some(CUresult::CUDA_ERROR_ILLEGAL_STATE), "{again}");
                assert_eq!(stream.capture_state(), CaptureState::Capturing(CaptureMode::Relaxed));
                let graph = capture.end().unwrap();
                assert!(!graph.handle().is_null());
                assert_eq!(graph.device(), stream.device());
                assert_eq!(graph.kept_alive(), 0);
                assert_eq!(stream.capture_state(), CaptureState::NotCapturing);
                assert!(!stream.is_capturing().unwrap());
                drop(graph);
                assert!(recorded("Graph").is_empty(), "the graph was destroyed once");
                // Each mode begins a capture of its own.
                for mode in [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed] {
                    let capture = stream.begin_capture(mode).unwrap();
                    assert_eq!(stream.capture_state(), CaptureState::Capturing(mode));
                    drop(capture.end().unwrap());
                }
            },
        );
    }

    #[test]
    fn default_and_raw_streams() {
        let (device, _) = setup();
        let legacy = Stream::legacy_default(device);
        assert_eq!(legacy.capture_state(), CaptureState::NotCapturing, "the legacy stream cannot capture");
        let refused = legacy.begin_capture(CaptureMode::Relaxed).unwrap_err();
        assert_eq!(refused.cuda_code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), "{refused}");
        assert_eq!(legacy.capture_state(), CaptureState::NotCapturing);
        assert_eq!(Stream::per_thread_default(device).capture_state(), CaptureState::Unknown);
        let owned = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        // SAFETY: `owned` outlives the wrapper.
        let raw = unsafe { Stream::from_raw(owned.handle(), device) };
        assert_eq!(raw.capture_state(), CaptureState::Unknown, "other code may capture it");
        // Begun through the wrapper, it is known until the end, then unknown again.
        let capture = raw.begin_capture(CaptureMode::Relaxed).unwrap();
        assert_eq!(raw.capture_state(), CaptureState::Capturing(CaptureMode::Relaxed));
        drop(capture.end().unwrap());
        assert_eq!(raw.capture_state(), CaptureState::Unknown);
    }

    #[test]
    fn waiting_for_an_event_recorded_in_a_capture_joins_it() {
        let (device, origin) = setup();
        let joined = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let bystander = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        // An event recorded outside captures leaves the waiter's state known.
        let plain = origin.record_event().unwrap();
        bystander.wait(&plain).unwrap();
        assert_eq!(bystander.capture_state(), CaptureState::NotCapturing);
        let capture = origin.begin_capture(CaptureMode::Relaxed).unwrap();
        let fork = origin.record_event().unwrap();
        joined.wait(&fork).unwrap();
        assert_eq!(joined.capture_state(), CaptureState::Unknown, "it joined a capture it cannot follow");
        assert!(joined.keep_alive_in_capture(1u8).is_err(), "nor hand anything to it");
        // Joined back, as a capture needs; the origin's state is unchanged.
        let back = joined.record_event().unwrap();
        origin.wait(&back).unwrap();
        assert_eq!(origin.capture_state(), CaptureState::Capturing(CaptureMode::Relaxed));
        drop(capture.end().unwrap());
        assert_eq!(origin.capture_state(), CaptureState::NotCapturing);
        assert_eq!(joined.capture_state(), CaptureState::Unknown, "stays unknown: the driver is asked");
        assert!(!joined.is_capturing().unwrap());
    }

    /// In a process of its own: the drop errors it reads are the whole process's, which the
    /// tests beside it record and drain.
    #[test]
    fn a_capture_dropped_without_end_ends_and_discards_its_graph() {
        cuda_sim::testing::in_simulated_machine(
            "graph::tests::a_capture_dropped_without_end_ends_and_discards_its_graph",
            &[],
            || {
                let (_, stream) = setup();
                let (item, dropped) = flag();
                let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
                stream.keep_alive_in_capture(item).map_err(drop).unwrap();
                drop(capture);
                assert!(!stream.is_capturing().unwrap(), "the capture ended");
                assert_eq!(stream.capture_state(), CaptureState::NotCapturing);
                assert!(dropped.load(Ordering::SeqCst), "what it kept went with it");
                assert!(recorded("Capture").is_empty());
                assert!(recorded("Graph").is_empty(), "its graph was destroyed");
                // The stream captures again.
                drop(stream.begin_capture(CaptureMode::Relaxed).unwrap().end().unwrap());
            },
        );
    }

    /// In a process of its own: the drop errors it reads are the whole process's, which the
    /// tests beside it record and drain.
    #[test]
    fn an_invalidated_capture_ends_with_its_error() {
        cuda_sim::testing::in_simulated_machine(
            "graph::tests::an_invalidated_capture_ends_with_its_error",
            &[],
            || {
                let (_, stream) = setup();
                let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
                // Waiting for a capturing stream invalidates its capture.
                assert!(stream.synchronize().is_err());
                assert!(!capture.is_active().unwrap());
                assert!(stream.is_capturing().unwrap(), "invalidated still counts as capturing");
                let error = capture.end().unwrap_err();
                assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), "{error}");
                assert_eq!(stream.capture_state(), CaptureState::NotCapturing, "it ended all the same");
                assert!(!stream.is_capturing().unwrap());
                // Dropped instead of ended, the error is recorded.
                let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
                assert!(stream.synchronize().is_err());
                drop(capture);
                let errors = recorded("Capture");
                assert_eq!(errors.len(), 1, "{errors:?}");
                assert_eq!(errors[0].error.cuda_code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
                assert_eq!(stream.capture_state(), CaptureState::NotCapturing);
            },
        );
    }

    #[test]
    fn only_a_capture_of_this_crate_keeps_items_and_its_graph_holds_them() {
        let (_, stream) = setup();
        assert_eq!(stream.keep_alive_in_capture(7u32), Err(7), "not capturing: given back");
        let (item, dropped) = flag();
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        stream.keep_alive_in_capture(item).map_err(drop).unwrap();
        let graph = capture.end().unwrap();
        assert_eq!(graph.kept_alive(), 1);
        assert!(stream.keep_alive_in_capture(8u32).is_err(), "the capture is over");
        assert!(!dropped.load(Ordering::SeqCst), "the graph holds it");
        drop(graph);
        assert!(dropped.load(Ordering::SeqCst), "gone with the graph");
    }

    #[test]
    fn kept_items_wait_for_the_work_from_before_the_capture() {
        let (_, stream) = setup();
        crate::context::bind(stream.device()).unwrap();
        let (gate, _open) = cuda_sim::testing::Gate::new();
        // SAFETY: a live stream of this test.
        unsafe { gate.hold(driver().unwrap(), stream.handle()) }.unwrap();
        let (item, dropped) = flag();
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        stream.keep_alive_in_capture(item).map_err(drop).unwrap();
        let graph = capture.end().unwrap();
        gate.open_after(std::time::Duration::from_millis(100));
        drop(graph);
        assert!(gate.is_open(), "dropped only once the stream's earlier work was done");
        assert!(dropped.load(Ordering::SeqCst));
    }
}
