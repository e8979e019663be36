//! [`GraphMemoryResource`]: memory that graphs allocate and free as they run (allocation and
//! free nodes, made by `cuMemAllocAsync` and `cuMemFreeAsync` on a capturing stream), one per
//! device in the process, with the device's graph-memory attributes and `trim`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUgraphMem_attribute, CUstreamCaptureStatus};

use crate::buffer::{Buffer, ScopedBuffer};
use crate::device::{Device, DevicePtr};
use crate::driver::driver;
use crate::driver_version::DriverCapability;
use crate::error::{Error, Result};
use crate::ffi;
use crate::memory_resource::MemoryResource;
use crate::stream::Stream;

/// The memory graphs of a device allocate while they run: a [`MemoryResource`] that allocates
/// only on a stream that is capturing a graph (`cuMemAllocAsync` there makes an allocation node
/// of the graph), and frees on the buffer's stream (`cuMemFreeAsync`: a free node while the
/// stream captures, a free of the graph's allocation otherwise). As cuda.core's
/// `GraphMemoryResource`, its memory is device memory that only the graph's launches make valid:
/// device-accessible, never host-accessible.
///
/// There is one per device in the process ([`GraphMemoryResource::new`] gives the same `Arc`
/// for a device each time): graph memory is the device's, as are its
/// [`attributes`](GraphMemoryResource::attributes) and [`trim`](GraphMemoryResource::trim).
///
/// A buffer allocated during the capture and dropped during it becomes a free node: the graph
/// allocates and frees it at each launch. One kept past the capture is the graph's output: its
/// memory is valid after each launch, and dropping the buffer after a launch frees it (a graph
/// whose allocation was not freed cannot be launched again, unless instantiated with
/// [`auto_free_on_launch`](crate::InstantiateOptions::auto_free_on_launch)).
///
/// # From cuda.core
///
/// What cuda.core writes with a `GraphBuilder` and a `GraphMemoryResource`:
///
/// ```python
/// gmr = GraphMemoryResource(device)
/// gb = stream.create_graph_builder().begin_building("relaxed")
/// scratch = gmr.allocate(16, stream=gb)
/// scratch.fill(3, width=4, stream=gb)
/// output.copy_from(scratch, stream=gb)
/// scratch.close()
/// graph = gb.end_building().complete()
/// graph.launch(stream); graph.launch(stream)
/// gmr.attributes.used_mem_high = 0
/// gmr.trim()
/// ```
///
/// is, here:
///
/// ```
/// # cuda_sim::testing::driver()?; // the tests run this example on the simulator
/// use cuda_mem_core::{
///     CaptureMode, Device, DeviceMemoryResource, Error, FillPattern, GraphMemoryResource, HighWaterMark,
///     InstantiateOptions, Stream, StreamOptions,
/// };
///
/// let device = Device::new(0)?;
/// let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
/// let pool = DeviceMemoryResource::new(device, Default::default())?;
/// let mut output = pool.allocate(16, &stream)?; // allocated before the capture
/// let graph_memory = GraphMemoryResource::new(device); // the same `Arc` for every call
/// assert!(matches!(graph_memory.allocate(16, &stream), Err(Error::NotCapturing { .. })));
///
/// let capture = stream.begin_capture(CaptureMode::Relaxed)?;
/// assert!(matches!(pool.allocate(16, &stream), Err(Error::CapturingStream)));
/// let mut scratch = graph_memory.allocate(16, capture.stream())?; // an allocation node
/// scratch.fill(FillPattern::U32(3), capture.stream())?;
/// output.copy_from(&scratch, capture.stream())?;
/// drop(scratch); // a free node: each launch allocates and frees it
/// let exec = capture.end()?.instantiate(InstantiateOptions::default())?;
/// // SAFETY: `output`, the one buffer the graph uses that it does not allocate itself, lives
/// // on, and no host slice of it is taken before the launches' work is done.
/// unsafe {
///     exec.launch(&stream)?;
///     exec.launch(&stream)?;
/// }
/// assert_eq!(output.to_vec::<u32>(&stream)?, [3; 4]);
///
/// let attributes = graph_memory.attributes()?; // used and reserved, current and high
/// assert!(attributes.used_high >= 16 && attributes.reserved_high >= attributes.used_high);
/// graph_memory.reset_high_water_mark(HighWaterMark::Used)?; // to the current use: no other value
/// graph_memory.trim()?;
/// # Ok::<(), cuda_mem_core::Error>(())
/// ```
///
/// A capture keeps what its graphs may use ([`Stream::keep_alive_in_capture`]): a
/// `cuda-mem-vmm` virtual buffer dropped during the capture stays mapped, a buffer of a
/// resource without pools unfreed, and any buffer the captured work used on the capturing stream
/// and dropped on another during the capture unfreed, until the graph and every executable graph
/// made from it are gone and their launches done. Captures begun through raw handles cannot be followed: there
/// the pools and the resources without pools refuse, and virtual buffers wait only for the end of
/// the capture.
#[derive(Debug)]
pub struct GraphMemoryResource {
    device: Device,
}

/// The graph-memory figures of a device (`cuDeviceGetGraphMemAttribute`), in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphMemoryAttributes {
    /// The memory associated with graphs now (`CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`): that of
    /// their live allocations, and of allocations freed since their executable graph last ran
    /// (kept for its next launch until it is destroyed or the memory is trimmed).
    pub used_current: u64,
    /// The most they used since the mark was last reset (`CU_GRAPH_MEM_ATTR_USED_MEM_HIGH`).
    pub used_high: u64,
    /// The memory reserved for graph allocations now, cached by the driver
    /// (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`).
    pub reserved_current: u64,
    /// The most reserved since the mark was last reset (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`).
    pub reserved_high: u64,
}

/// A high-water mark of graph memory, which can only be reset to the current figure
/// ([`GraphMemoryResource::reset_high_water_mark`]); cuda.core refuses setting it to anything
/// but zero, which here cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HighWaterMark {
    /// [`GraphMemoryAttributes::used_high`].
    Used,
    /// [`GraphMemoryAttributes::reserved_high`].
    Reserved,
}

/// The resources made so far, one per device ordinal, for the life of the process.
static RESOURCES: OnceLock<Mutex<HashMap<usize, Arc<GraphMemoryResource>>>> = OnceLock::new();

impl GraphMemoryResource {
    /// The graph memory resource of `device`: the same one for every call (interned, as
    /// cuda.core's `GraphMemoryResource(device)`).
    pub fn new(device: Device) -> Arc<GraphMemoryResource> {
        let resources = RESOURCES.get_or_init(Mutex::default);
        let mut resources = resources.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(resources.entry(device.ordinal()).or_insert_with(|| Arc::new(GraphMemoryResource { device })))
    }

    /// Allocates `size` bytes on `stream` into an owned [`Buffer`] that keeps this resource alive
    /// ([`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) without the import).
    /// A zero-size request makes an empty buffer without asking the resource.
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate(self: &Arc<Self>, size: usize, stream: &Stream) -> Result<Buffer> {
        Buffer::allocate_in(Arc::clone(self), size, stream)
    }

    /// Allocates `size` bytes on `stream` into a [`ScopedBuffer`] that borrows this resource and
    /// the stream ([`MemoryResourceExt::allocate_scoped`](crate::MemoryResourceExt::allocate_scoped)
    /// without the import).
    ///
    /// # Errors
    /// When the resource cannot allocate.
    #[inline]
    pub fn allocate_scoped<'a>(&'a self, size: usize, stream: &'a Stream) -> Result<ScopedBuffer<'a>> {
        ScopedBuffer::allocate_scoped_in(self, size, stream)
    }

    /// The device.
    #[doc(alias = "device_id")]
    pub fn device(&self) -> Device {
        self.device
    }

    /// The device's graph-memory figures, read now.
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn attributes(&self) -> Result<GraphMemoryAttributes> {
        Ok(GraphMemoryAttributes {
            used_current: self.attribute(CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: self.attribute(CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved_current: self.attribute(CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: self.attribute(CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    fn attribute(&self, attribute: CUgraphMem_attribute) -> Result<u64> {
        DriverCapability::GraphMemory.require()?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut value: u64 = 0;
        // SAFETY: the graph-memory attributes are `cuuint64_t`s: `value` is a valid out-pointer
        // of that type.
        unsafe { cu_call!(d, cuDeviceGetGraphMemAttribute(self.device.raw(), attribute, (&raw mut value).cast())) }?;
        Ok(value)
    }

    /// Resets a high-water mark to the current figure (`cuDeviceSetGraphMemAttribute` with 0,
    /// the only value the driver takes).
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn reset_high_water_mark(&self, mark: HighWaterMark) -> Result<()> {
        let attribute = match mark {
            HighWaterMark::Used => CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH,
            HighWaterMark::Reserved => CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
        };
        DriverCapability::GraphMemory.require()?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        let mut zero: u64 = 0;
        // SAFETY: the high-water marks are `cuuint64_t`s: `zero` is a valid pointer to one.
        unsafe { cu_call!(d, cuDeviceSetGraphMemAttribute(self.device.raw(), attribute, (&raw mut zero).cast())) }?;
        Ok(())
    }

    /// Gives the memory cached for graph allocations and not in use back to the system
    /// (`cuDeviceGraphMemTrim`).
    ///
    /// # Errors
    /// If a driver call fails.
    pub fn trim(&self) -> Result<()> {
        DriverCapability::GraphMemory.require()?;
        crate::context::bind(self.device)?;
        let d = driver()?;
        // SAFETY: a valid device ordinal.
        unsafe { cu_call!(d, cuDeviceGraphMemTrim(self.device.raw())) }?;
        Ok(())
    }
}

// SAFETY: `cuMemAllocAsync` on a capturing stream makes an allocation node: `size` bytes of
// device memory at the returned address, valid for the graph's work from its launch until the
// free, which `deallocate_raw` makes. It is never host-accessible (reported so).
unsafe impl MemoryResource for GraphMemoryResource {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr> {
        DriverCapability::GraphMemory.require()?;
        if stream.device() != self.device {
            return Err(Error::StreamOfAnotherDevice {
                resource: self.device.ordinal(),
                stream: stream.device().ordinal(),
            });
        }
        stream.bind_if_default()?;
        let d = driver()?;
        // SAFETY: a valid stream handle, bound as it needs.
        let status = unsafe { ffi::stream_capture_status(d, stream.handle()) }?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Err(Error::NotCapturing {
                invalidated: status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            });
        }
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the stream handle is valid and capturing.
        unsafe { cu_call!(d, cuMemAllocAsync(&mut ptr, size, stream.handle())) }
            .map_err(|e| Error::allocation(e, size))?;
        crate::memory_event!(TRACE, size, ptr = %hex(ptr), stream = %hex(stream.handle()), "allocate");
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, _size: usize, stream: &Stream) -> Result<()> {
        stream.bind_if_default()?;
        // SAFETY: the caller guarantees `ptr` came from `allocate_raw` and is freed once, after
        // the work enqueued on `stream`.
        unsafe { ffi::mem_free_async(driver()?, ptr, stream.handle()) }?;
        crate::memory_event!(TRACE, size = _size, ptr = %hex(ptr), stream = %hex(stream.handle()), "free");
        Ok(())
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        false
    }

    fn device(&self) -> Option<Device> {
        Some(self.device)
    }
}

#[cfg(test)]
mod tests {
    use cuda_mem_sys::types::CUresult;
    use cuda_sim::testing::in_simulated_machine;

    use super::*;
    use crate::{CaptureMode, FillPattern, InstantiateOptions, StreamOptions};

    /// The granularity the simulator reserves and counts graph memory in.
    const GRANULE: u64 = 2 << 20;

    fn setup() -> (Device, Stream, Arc<GraphMemoryResource>) {
        cuda_sim::testing::driver().expect("the test driver loads");
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        (device, stream, GraphMemoryResource::new(device))
    }

    #[test]
    fn attributes_follow_the_graphs_allocations_and_the_marks_reset_to_the_current_use() {
        let name =
            "resources::graph::tests::attributes_follow_the_graphs_allocations_and_the_marks_reset_to_the_current_use";
        in_simulated_machine(name, &[], || {
            let (_, stream, graph_memory) = setup();
            assert_eq!(graph_memory.attributes().unwrap(), GraphMemoryAttributes::default(), "nothing yet");
            let capture = stream.begin_capture(CaptureMode::Global).unwrap();
            let mut output = graph_memory.allocate(4096, &stream).unwrap();
            // Each allocation counts for a granule.
            let mut scratch = graph_memory.allocate(4096, &stream).unwrap();
            scratch.fill(FillPattern::U8(9), &stream).unwrap();
            output.copy_from(&scratch, &stream).unwrap();
            drop(scratch);
            let exec = capture.end().unwrap().instantiate(InstantiateOptions::default()).unwrap();
            // SAFETY: the graph uses only memory it allocates itself.
            unsafe { exec.launch(&stream) }.unwrap();
            stream.synchronize().unwrap();
            let after = graph_memory.attributes().unwrap();
            // The scratch, freed in the graph, keeps its memory for the next launch.
            assert_eq!(after.used_current, 2 * GRANULE, "the output live, the scratch freed in the graph");
            assert_eq!(after.used_high, 2 * GRANULE, "both were live during the launch");
            assert!(after.reserved_current >= after.used_high && after.reserved_high >= after.reserved_current);
            assert_eq!(output.to_vec::<u8>(&stream).unwrap(), vec![9; 4096], "the graph's output");
            // Launched again while its output lives: refused without auto-free.
            // SAFETY: as above.
            let again = unsafe { exec.launch(&stream) }.unwrap_err();
            assert_eq!(again.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE), "{again}");
            // The marks reset to the current figures, never to anything else.
            graph_memory.reset_high_water_mark(HighWaterMark::Used).unwrap();
            let reset = graph_memory.attributes().unwrap();
            assert_eq!(reset.used_high, 2 * GRANULE);
            assert_eq!(reset.reserved_high, after.reserved_high, "only the mark asked for");
            // Freed outside the graph, on its stream: still the graph's (as cuda.core's tests see
            // on GPUs), and the reserve stays, until trimmed.
            drop(output);
            stream.synchronize().unwrap();
            let freed = graph_memory.attributes().unwrap();
            assert_eq!(freed.used_current, 2 * GRANULE);
            assert_eq!(freed.reserved_current, after.reserved_current, "cached for the next launch");
            graph_memory.reset_high_water_mark(HighWaterMark::Reserved).unwrap();
            assert_eq!(graph_memory.attributes().unwrap().reserved_high, freed.reserved_current);
            graph_memory.trim().unwrap();
            let trimmed = graph_memory.attributes().unwrap();
            assert_eq!((trimmed.used_current, trimmed.reserved_current), (0, 0), "nothing in use: all given back");
            assert!(crate::take_drop_errors().is_empty());
            // Its allocation freed, the graph launches again.
            // SAFETY: as above.
            unsafe { exec.launch(&stream) }.unwrap();
            stream.synchronize().unwrap();
            assert_eq!(graph_memory.attributes().unwrap().used_current, 2 * GRANULE);
        });
    }

    /// In a process of its own: the drop errors it reads are the whole process's, which the
    /// tests beside it record and drain.
    #[test]
    fn auto_free_on_launch_lets_a_graph_with_a_live_output_launch_again() {
        cuda_sim::testing::in_simulated_machine(
            "resources::graph::tests::auto_free_on_launch_lets_a_graph_with_a_live_output_launch_again",
            &[],
            || {
                let (_, stream, graph_memory) = setup();
                let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
                let mut output = graph_memory.allocate(64, &stream).unwrap();
                output.fill(FillPattern::U32(5), &stream).unwrap();
                let graph = capture.end().unwrap();
                let exec = graph.instantiate(InstantiateOptions::default().auto_free_on_launch()).unwrap();
                // A graph with memory nodes has one executable graph at a time.
                let second = graph.instantiate(InstantiateOptions::default()).unwrap_err();
                assert!(second.cuda_code().is_some(), "{second}");
                for _ in 0..3 {
                    // SAFETY: the graph uses only memory it allocates itself.
                    unsafe { exec.launch(&stream) }.unwrap();
                    assert_eq!(output.to_vec::<u32>(&stream).unwrap(), [5; 16]);
                }
                drop(output);
                stream.synchronize().unwrap();
                assert!(crate::take_drop_errors().iter().all(|e| e.what != "Buffer"));
            },
        );
    }

    /// In a process of its own: the drop errors it reads are the whole process's, which the
    /// tests beside it record and drain.
    #[test]
    fn an_output_dropped_before_any_launch_is_refused_and_recorded() {
        cuda_sim::testing::in_simulated_machine(
            "resources::graph::tests::an_output_dropped_before_any_launch_is_refused_and_recorded",
            &[],
            || {
                let (_, stream, graph_memory) = setup();
                let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
                let output = graph_memory.allocate(64, &stream).unwrap();
                let graph = capture.end().unwrap();
                let _ = crate::take_drop_errors();
                // No launch has allocated it yet: there is nothing to free.
                drop(output);
                let errors: Vec<_> = crate::take_drop_errors().into_iter().filter(|e| e.what == "Buffer").collect();
                assert_eq!(errors.len(), 1, "{errors:?}");
                assert_eq!(errors[0].error.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
                drop(graph);
            },
        );
    }

    #[test]
    fn a_zero_byte_buffer_asks_nothing() {
        let (_, stream, graph_memory) = setup();
        let capture = stream.begin_capture(CaptureMode::Relaxed).unwrap();
        let empty = graph_memory.allocate(0, &stream).unwrap();
        assert!(empty.is_empty());
        drop(empty);
        drop(capture.end().unwrap());
    }
}
