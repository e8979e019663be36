//! Question 35: a peer copy (`cuMemcpyPeerAsync`, `cuMemcpyPeer`) of pool memory between two
//! devices, no access granted to either pool. `cuMemcpyAsync` of the same memory needs the
//! pool's access grant for the stream's device (cuda.core's peer-access tests, which pass on
//! GPUs, expect `CUDA_ERROR_INVALID_VALUE` without it); a reproducer of NVIDIA bug 3446335 copies
//! `cudaMallocAsync` memory between devices with `cudaMemcpyPeer(Async)` instead. The simulator
//! reaches each side of a peer copy as the device of the context named for it: no grant is
//! needed, and pool memory named with the other device's context is refused. What does the
//! driver answer? Needs two devices.

use cuda_mem_sys::types::{CUcontext, CUdevice, CUdeviceptr};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::owned::{OwnedPool, OwnedStream, PoolAllocation, note_cleanup};
use crate::raw::{Call, code, device_location, memset_async, pool_props, read_bytes};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "peer-copy-pool-access",
    question: "Pool memory of devices 0 and 1, no access granted: cuMemcpyPeerAsync and cuMemcpyPeer between them \
               (each side named with its own device's context), the same with the contexts swapped, and \
               cuMemcpyDtoDAsync on device 0's stream",
    run,
    child: None,
};

const LEN: usize = 4096;

/// Device 1's primary context, retained for the probe and released on drop.
struct Device1 {
    device: CUdevice,
    context: CUcontext,
}

impl Device1 {
    fn retain() -> Result<Device1, CudaError> {
        let d = driver()?;
        let mut device: CUdevice = 0;
        // SAFETY: `device` is a valid out-pointer.
        unsafe { cu_call!(d, cuDeviceGet(&mut device, 1)) }?;
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid out-pointer; `device` came from the driver.
        unsafe { cu_call!(d, cuDevicePrimaryCtxRetain(&mut context, device)) }?;
        Ok(Device1 { device, context })
    }

    /// Reads `len` bytes at `ptr` with device 1's context current, then makes `back` current.
    fn read(&self, ptr: CUdeviceptr, len: usize, back: CUcontext) -> Result<Vec<u8>, CudaError> {
        let d = driver()?;
        // SAFETY: both contexts are retained while this runs.
        unsafe { cu_call!(d, cuCtxSetCurrent(self.context)) }?;
        let bytes = read_bytes(ptr, len);
        // SAFETY: as above.
        unsafe { cu_call!(d, cuCtxSetCurrent(back)) }?;
        bytes
    }
}

impl Drop for Device1 {
    fn drop(&mut self) {
        let release = || -> Call {
            let d = driver()?;
            // SAFETY: releases the retain `retain` made, once.
            unsafe { cu_call!(d, cuDevicePrimaryCtxRelease_v2(self.device)) }
        };
        note_cleanup("releasing device 1's primary context", release());
    }
}

fn run(setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    details.put("devices", setup.devices);
    if setup.devices < 2 {
        return Ok(format!("not applicable: it needs two devices, the driver reports {}", setup.devices));
    }
    let d = driver()?;
    let device1 = Device1::retain()?;
    let mut ctx0: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx0` is a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetCurrent(&mut ctx0)) }?;
    let ctx1 = device1.context;
    let stream = OwnedStream::new(false)?;
    // Pools of their own: no access left over from another probe.
    let (pool0, pool1) = (
        OwnedPool::new(&pool_props(device_location(0), false, 0))?,
        OwnedPool::new(&pool_props(device_location(1), false, 0))?,
    );
    let on0 = PoolAllocation::new(pool0.raw(), LEN, &stream)?;
    let on1 = PoolAllocation::new(pool1.raw(), LEN, &stream)?;
    let (p0, p1, s) = (on0.ptr(), on1.ptr(), stream.raw());
    memset_async(p0, 0x5A, LEN, s)?;
    stream.synchronize()?;
    let mut record = |name: &str, call: Call| {
        let call = call.and_then(|()| stream.synchronize());
        details.put(name, code(&call));
        code(&call)
    };
    // SAFETY: every range is LEN bytes of a live pool allocation; the stream is alive.
    let (peer_async, swapped, dtod) = unsafe {
        (
            record("peer_async", cu_call!(d, cuMemcpyPeerAsync(p1, ctx1, p0, ctx0, LEN, s))),
            record("peer_async_swapped_contexts", cu_call!(d, cuMemcpyPeerAsync(p1, ctx0, p0, ctx1, LEN, s))),
            record("dtod_async", cu_call!(d, cuMemcpyDtoDAsync_v2(p1, p0, LEN, s))),
        )
    };
    // SAFETY: as above; synchronous, from device 1 to device 0 (leaving device 1's bytes alone).
    let peer = record("peer", unsafe { cu_call!(d, cuMemcpyPeer(p0, ctx0, p1, ctx1, LEN)) });
    let arrived = match device1.read(p1, LEN, ctx0) {
        Ok(bytes) if bytes.iter().all(|&b| b == 0x5A) => "the bytes arrived".to_string(),
        Ok(_) => "other bytes arrived".to_string(),
        Err(error) => format!("reading them back {}", code::<()>(&Err(error))),
    };
    details.put("peer_async.bytes", &arrived);
    drop((on0, on1));
    details.put("synchronize", code(&stream.synchronize()));
    Ok(format!(
        "cuMemcpyPeerAsync {peer_async} ({arrived}), cuMemcpyPeer {peer}; with the contexts swapped {swapped}; \
         cuMemcpyDtoDAsync {dtod}"
    ))
}
