//! What a probe creates, released when it goes out of scope: the primary context, streams (a
//! capture still under way is ended first), pools, allocations, events, captured graphs,
//! executable graphs and address reservations. A release that fails is noted ([`note_cleanup`]) and shows in the
//! probe's details, never lost and never a panic.

use std::ffi::c_int;
use std::sync::{Mutex, PoisonError};

use cuda_mem_sys::types::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUgraph, CUgraphExec, CUipcEventHandle, CUmemPoolProps, CUmemoryPool,
    CUstream, CUstream_flags, CUstreamCaptureMode,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::raw::{Call, capture_status, code, destroy_pool};

/// Releases that failed since the last [`take_cleanup_notes`].
static CLEANUP_NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Notes a release that failed (`what` names it).
pub(crate) fn note_cleanup(what: &str, call: Call) {
    if call.is_err() {
        CLEANUP_NOTES.lock().unwrap_or_else(PoisonError::into_inner).push(format!("{what}: {}", code(&call)));
    }
}

/// The failed releases noted since the last call.
pub(crate) fn take_cleanup_notes() -> Vec<String> {
    std::mem::take(&mut *CLEANUP_NOTES.lock().unwrap_or_else(PoisonError::into_inner))
}

/// The primary context of device 0, retained and current on the calling thread.
pub(crate) struct PrimaryContext {
    device: CUdevice,
    context: CUcontext,
}

// SAFETY: the value is a retained driver context and its device; the driver's context handles
// may be made current on, and used from, any thread (`cuCtxSetCurrent` is how), and nothing in
// the value changes after it is made.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Initializes the driver and makes device 0's primary context current.
    pub(crate) fn open() -> Result<PrimaryContext, CudaError> {
        let d = driver()?;
        // SAFETY: cuInit takes no pointers; flags must be 0.
        unsafe { cu_call!(d, cuInit(0)) }?;
        let mut device: CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGet(&mut device, 0)) }?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer; `device` came from the driver.
        unsafe { cu_call!(d, cuDevicePrimaryCtxRetain(&mut context, device)) }?;
        let retained = PrimaryContext { device, context };
        retained.make_current()?;
        Ok(retained)
    }

    /// Makes the context current on the calling thread (another thread of the probe's).
    pub(crate) fn make_current(&self) -> Call {
        let d = driver()?;
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { cu_call!(d, cuCtxSetCurrent(self.context)) }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        let release = || -> Call {
            let d = driver()?;
            // SAFETY: releases the retain `open` made, once.
            unsafe { cu_call!(d, cuDevicePrimaryCtxRelease_v2(self.device)) }
        };
        note_cleanup("releasing the primary context", release());
    }
}

/// A stream the probe created.
pub(crate) struct OwnedStream(CUstream);

impl OwnedStream {
    /// A blocking stream (it waits for the legacy default stream, and it for it) or a
    /// non-blocking one.
    pub(crate) fn new(blocking: bool) -> Result<OwnedStream, CudaError> {
        let d = driver()?;
        let flags = if blocking { CUstream_flags::CU_STREAM_DEFAULT } else { CUstream_flags::CU_STREAM_NON_BLOCKING };
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: `stream` is a valid out-pointer.
        unsafe { cu_call!(d, cuStreamCreate(&mut stream, flags.0)) }?;
        Ok(OwnedStream(stream))
    }

    /// The driver's handle.
    pub(crate) fn raw(&self) -> CUstream {
        self.0
    }

    /// `cuStreamSynchronize`.
    pub(crate) fn synchronize(&self) -> Call {
        let d = driver()?;
        // SAFETY: the stream is alive while `self` is.
        unsafe { cu_call!(d, cuStreamSynchronize(self.0)) }
    }

    /// `cuStreamBeginCapture` in `mode`.
    pub(crate) fn begin_capture(&self, mode: CUstreamCaptureMode) -> Call {
        let d = driver()?;
        // SAFETY: the stream is alive while `self` is.
        unsafe { cu_call!(d, cuStreamBeginCapture_v2(self.0, mode)) }
    }

    /// `cuStreamEndCapture`: its outcome and the graph (NULL when there is none).
    pub(crate) fn end_capture(&self) -> (Call, CapturedGraph) {
        let mut graph: CUgraph = std::ptr::null_mut();
        let call = (|| {
            let d = driver()?;
            // SAFETY: `graph` is a valid out-pointer; the stream is alive while `self` is.
            unsafe { cu_call!(d, cuStreamEndCapture(self.0, &mut graph)) }
        })();
        (call, CapturedGraph(graph))
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // A probe that failed part way may leave a capture under way; end it so that the
        // stream can be synchronized and destroyed.
        if matches!(capture_status(self.0).as_str(), "ACTIVE" | "INVALIDATED") {
            drop(self.end_capture());
        }
        note_cleanup("synchronizing a stream", self.synchronize());
        let destroy = || -> Call {
            let d = driver()?;
            // SAFETY: destroys the stream this value created, once.
            unsafe { cu_call!(d, cuStreamDestroy_v2(self.0)) }
        };
        note_cleanup("destroying a stream", destroy());
    }
}

/// A graph `cuStreamEndCapture` returned (maybe NULL), destroyed on drop.
pub(crate) struct CapturedGraph(CUgraph);

impl CapturedGraph {
    /// Whether the driver returned a NULL graph.
    pub(crate) fn is_null(&self) -> bool {
        self.0.is_null()
    }

    /// The driver's handle (NULL when there is none).
    pub(crate) fn raw(&self) -> CUgraph {
        self.0
    }

    /// `cuGraphInstantiateWithFlags` with no flags.
    pub(crate) fn instantiate(&self) -> Result<OwnedGraphExec, CudaError> {
        let d = driver()?;
        let mut exec: CUgraphExec = std::ptr::null_mut();
        // SAFETY: `exec` is a valid out-pointer; the graph is alive while `self` is.
        unsafe { cu_call!(d, cuGraphInstantiateWithFlags(&mut exec, self.0, 0)) }?;
        Ok(OwnedGraphExec(exec))
    }
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        if self.0.is_null() {
            return;
        }
        let destroy = || -> Call {
            let d = driver()?;
            // SAFETY: the graph came from cuStreamEndCapture and is destroyed once.
            unsafe { cu_call!(d, cuGraphDestroy(self.0)) }
        };
        note_cleanup("destroying a captured graph", destroy());
    }
}

/// An executable graph, destroyed on drop (after its launches, which the driver lets finish).
pub(crate) struct OwnedGraphExec(CUgraphExec);

impl OwnedGraphExec {
    /// `cuGraphLaunch` on any stream.
    pub(crate) fn launch(&self, stream: CUstream) -> Call {
        let d = driver()?;
        // SAFETY: the executable graph is alive while `self` is; the stream is the caller's.
        unsafe { cu_call!(d, cuGraphLaunch(self.0, stream)) }
    }

    /// `cuGraphUpload` on any stream.
    pub(crate) fn upload(&self, stream: CUstream) -> Call {
        let d = driver()?;
        // SAFETY: as in `launch`.
        unsafe { cu_call!(d, cuGraphUpload(self.0, stream)) }
    }
}

impl Drop for OwnedGraphExec {
    fn drop(&mut self) {
        let destroy = || -> Call {
            let d = driver()?;
            // SAFETY: destroys the executable graph this value instantiated, once.
            unsafe { cu_call!(d, cuGraphExecDestroy(self.0)) }
        };
        note_cleanup("destroying an executable graph", destroy());
    }
}

/// A pool the probe created.
pub(crate) struct OwnedPool(Option<CUmemoryPool>);

// SAFETY: the value owns its pool handle alone; the driver's pool functions may be called with
// it, and the pool destroyed, from any thread (a thread that created a pool during a capture
// hands it to the one that destroys it after).
unsafe impl Send for OwnedPool {}

impl OwnedPool {
    /// `cuMemPoolCreate`.
    pub(crate) fn new(props: &CUmemPoolProps) -> Result<OwnedPool, CudaError> {
        let d = driver()?;
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and `props` valid for a read.
        unsafe { cu_call!(d, cuMemPoolCreate(&mut pool, props)) }?;
        Ok(OwnedPool(Some(pool)))
    }

    /// The driver's handle (NULL once destroyed).
    pub(crate) fn raw(&self) -> CUmemoryPool {
        self.0.unwrap_or(std::ptr::null_mut())
    }

    /// Destroys the pool now, for a probe that asks what destroying does.
    pub(crate) fn destroy(&mut self) -> Call {
        match self.0.take() {
            Some(pool) => destroy_pool(pool),
            None => Ok(()),
        }
    }

    /// Exports the pool as a POSIX file descriptor, which the caller owns.
    pub(crate) fn export(&self) -> Result<std::os::fd::OwnedFd, CudaError> {
        let d = driver()?;
        let mut fd: c_int = -1;
        // SAFETY: the driver writes an int (the descriptor) through the pointer.
        unsafe {
            cu_call!(d, cuMemPoolExportToShareableHandle((&raw mut fd).cast(), self.raw(), crate::raw::POSIX_FD, 0))
        }?;
        // SAFETY: on success the driver created this descriptor for the caller, who owns it.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }
}

impl Drop for OwnedPool {
    fn drop(&mut self) {
        let destroy = self.destroy();
        note_cleanup("destroying a pool", destroy);
    }
}

/// An allocation from a pool, freed in the order of the stream it was made on.
pub(crate) struct PoolAllocation<'s> {
    ptr: Option<CUdeviceptr>,
    stream: &'s OwnedStream,
}

impl<'s> PoolAllocation<'s> {
    /// `cuMemAllocFromPoolAsync`.
    pub(crate) fn new(pool: CUmemoryPool, size: usize, stream: &'s OwnedStream) -> Result<Self, CudaError> {
        let ptr = alloc_from_pool(pool, size, stream.raw())?;
        Ok(PoolAllocation { ptr: Some(ptr), stream })
    }

    /// The device pointer.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr.unwrap_or(0)
    }

    /// `cuMemFreeAsync` on its stream, now.
    pub(crate) fn free(&mut self) -> Call {
        match self.ptr.take() {
            Some(ptr) => free_async(ptr, self.stream.raw()),
            None => Ok(()),
        }
    }
}

impl Drop for PoolAllocation<'_> {
    fn drop(&mut self) {
        let free = self.free();
        note_cleanup("freeing a pool allocation", free);
    }
}

/// `cuMemAllocFromPoolAsync` on any stream (a special handle included).
pub(crate) fn alloc_from_pool(pool: CUmemoryPool, size: usize, stream: CUstream) -> Result<CUdeviceptr, CudaError> {
    let d = driver()?;
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; the pool and stream are the caller's, alive.
    unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut ptr, size, pool, stream)) }?;
    Ok(ptr)
}

/// `cuMemFreeAsync` on any stream.
pub(crate) fn free_async(ptr: CUdeviceptr, stream: CUstream) -> Call {
    let d = driver()?;
    // SAFETY: the pointer is an allocation the caller gives up; the stream is alive.
    unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream)) }
}

/// Memory from `cuMemAlloc`, freed with `cuMemFree`.
pub(crate) struct DeviceAllocation {
    ptr: Option<CUdeviceptr>,
}

impl DeviceAllocation {
    /// `cuMemAlloc` of `size` bytes.
    pub(crate) fn new(size: usize) -> Result<DeviceAllocation, CudaError> {
        let d = driver()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAlloc_v2(&mut ptr, size)) }?;
        Ok(DeviceAllocation { ptr: Some(ptr) })
    }

    /// The device pointer.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr.unwrap_or(0)
    }

    /// `cuMemFree` now; on failure the allocation stays owned (and is freed on drop).
    pub(crate) fn free(&mut self) -> Call {
        let Some(ptr) = self.ptr else { return Ok(()) };
        let d = driver()?;
        // SAFETY: the allocation this value made, freed once (forgotten on success).
        unsafe { cu_call!(d, cuMemFree_v2(ptr)) }?;
        self.ptr = None;
        Ok(())
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        let free = self.free();
        note_cleanup("freeing a cuMemAlloc allocation", free);
    }
}

/// Memory from `cuMemAllocManaged` (`CU_MEM_ATTACH_GLOBAL`), freed with `cuMemFree`.
pub(crate) struct ManagedAllocation {
    ptr: CUdeviceptr,
}

impl ManagedAllocation {
    /// `cuMemAllocManaged` of `size` bytes, attached globally.
    pub(crate) fn new(size: usize) -> Result<ManagedAllocation, CudaError> {
        let d = driver()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; 1 is CU_MEM_ATTACH_GLOBAL.
        unsafe { cu_call!(d, cuMemAllocManaged(&mut ptr, size, 1)) }?;
        Ok(ManagedAllocation { ptr })
    }

    /// The pointer.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }
}

impl Drop for ManagedAllocation {
    fn drop(&mut self) {
        let free = || -> Call {
            let d = driver()?;
            // SAFETY: the allocation this value made, freed once.
            unsafe { cu_call!(d, cuMemFree_v2(self.ptr)) }
        };
        note_cleanup("freeing a cuMemAllocManaged allocation", free());
    }
}

/// Pinned host memory from `cuMemAllocHost`, freed with `cuMemFreeHost` (the address is kept as
/// an integer: the value is only handed back to the driver).
pub(crate) struct HostAllocation(usize);

impl HostAllocation {
    /// `cuMemAllocHost` of `size` bytes.
    pub(crate) fn new(size: usize) -> Result<HostAllocation, CudaError> {
        let d = driver()?;
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAllocHost_v2(&mut ptr, size)) }?;
        Ok(HostAllocation(ptr as usize))
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        let free = || -> Call {
            let d = driver()?;
            // SAFETY: the allocation this value made, freed once.
            unsafe { cu_call!(d, cuMemFreeHost(self.0 as *mut std::ffi::c_void)) }
        };
        note_cleanup("freeing a cuMemAllocHost allocation", free());
    }
}

/// An event the probe created (no timing) or opened from an interprocess handle.
pub(crate) struct OwnedEvent(CUevent);

/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 0x2;
/// `CU_EVENT_INTERPROCESS`.
const EVENT_INTERPROCESS: u32 = 0x4;

impl OwnedEvent {
    /// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING`.
    pub(crate) fn new() -> Result<OwnedEvent, CudaError> {
        OwnedEvent::create(EVENT_DISABLE_TIMING)
    }

    /// `cuEventCreate` with `CU_EVENT_INTERPROCESS` (and `CU_EVENT_DISABLE_TIMING`, which the
    /// driver requires with it).
    pub(crate) fn interprocess() -> Result<OwnedEvent, CudaError> {
        OwnedEvent::create(EVENT_INTERPROCESS | EVENT_DISABLE_TIMING)
    }

    fn create(flags: u32) -> Result<OwnedEvent, CudaError> {
        let d = driver()?;
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer; the flags are `CUevent_flags` bits.
        unsafe { cu_call!(d, cuEventCreate(&mut event, flags)) }?;
        Ok(OwnedEvent(event))
    }

    /// `cuIpcOpenEventHandle`: the event an interprocess handle names, destroyed on drop.
    pub(crate) fn open_ipc(handle: CUipcEventHandle) -> Result<OwnedEvent, CudaError> {
        let d = driver()?;
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer; the handle is passed by value.
        unsafe { cu_call!(d, cuIpcOpenEventHandle(&mut event, handle)) }?;
        Ok(OwnedEvent(event))
    }

    /// `cuIpcGetEventHandle`: the event's interprocess handle.
    pub(crate) fn ipc_handle(&self) -> Result<CUipcEventHandle, CudaError> {
        let d = driver()?;
        let mut handle = CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: `handle` is a valid out-pointer; the event is alive while `self` is.
        unsafe { cu_call!(d, cuIpcGetEventHandle(&mut handle, self.0)) }?;
        Ok(handle)
    }

    /// The driver's handle.
    pub(crate) fn raw(&self) -> CUevent {
        self.0
    }

    /// `cuEventRecord` on `stream`.
    pub(crate) fn record(&self, stream: CUstream) -> Call {
        let d = driver()?;
        // SAFETY: the event is alive while `self` is; the stream is the caller's, alive.
        unsafe { cu_call!(d, cuEventRecord(self.0, stream)) }
    }

    /// `cuEventQuery`.
    pub(crate) fn query(&self) -> Call {
        let d = driver()?;
        // SAFETY: the event is alive while `self` is.
        unsafe { cu_call!(d, cuEventQuery(self.0)) }
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        let destroy = || -> Call {
            let d = driver()?;
            // SAFETY: destroys the event this value created, once.
            unsafe { cu_call!(d, cuEventDestroy_v2(self.0)) }
        };
        note_cleanup("destroying an event", destroy());
    }
}

/// A virtual address range from `cuMemAddressReserve`.
pub(crate) struct Reservation {
    ptr: CUdeviceptr,
    size: usize,
}

impl Reservation {
    /// `cuMemAddressReserve(size, alignment, hint)`.
    pub(crate) fn new(size: usize, alignment: usize, hint: CUdeviceptr) -> Result<Reservation, CudaError> {
        let d = driver()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; a hint is only a request.
        unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, alignment, hint, 0)) }?;
        Ok(Reservation { ptr, size })
    }

    /// Where the range starts.
    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The first address after it.
    pub(crate) fn end(&self) -> CUdeviceptr {
        self.ptr + self.size as CUdeviceptr
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let free = || -> Call {
            let d = driver()?;
            // SAFETY: the whole range this value reserved, with nothing mapped in it, freed once.
            unsafe { cu_call!(d, cuMemAddressFree(self.ptr, self.size)) }
        };
        note_cleanup("freeing an address reservation", free());
    }
}
