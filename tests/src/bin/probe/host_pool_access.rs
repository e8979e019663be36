//! Question 11: copies into and out of a pinned host pool's memory before `cuMemPoolSetAccess`.
//! cuda.core's `PinnedMemoryResource` grants no access and copies into and out of its memory
//! (tests that pass on GPUs); an H100 refused a memset into it. The simulator takes copies and
//! refuses memsets. What does the driver answer for each?

use std::ffi::c_void;

use cuda_mem_sys::{cu_call, driver};

use crate::owned::{DeviceAllocation, OwnedPool, OwnedStream, alloc_from_pool, free_async};
use crate::raw::{Call, code, device_location, host_location, memset_async, pool_access, pool_props};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "host-pool-before-access",
    question: "A pinned host pool's memory before cuMemPoolSetAccess: device 0's access as read, and the result of a \
               host-to-pool, pool-to-device, device-to-pool, pool-to-host copy and a memset",
    run,
    child: None,
};

const LEN: usize = 4096;

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let d = driver()?;
    let stream = OwnedStream::new(false)?;
    let pool = OwnedPool::new(&pool_props(host_location(), false, 0))?;
    details.put("access.device_0", pool_access(pool.raw(), device_location(0)));
    let p = alloc_from_pool(pool.raw(), LEN, stream.raw())?;
    let device = DeviceAllocation::new(LEN)?;
    let mut host = vec![0x5Au8; LEN];
    let s = stream.raw();
    let mut record = |name: &str, call: Call| {
        let call = call.and_then(|()| stream.synchronize());
        details.put(name, code(&call));
        code(&call)
    };
    // SAFETY: every range is LEN live bytes (the host vector, the pool allocation, the device
    // allocation) and the stream is synchronized before the vector is touched again.
    let (to_pool, to_device, from_device, to_host) = unsafe {
        (
            record("htod", cu_call!(d, cuMemcpyHtoDAsync_v2(p, host.as_ptr().cast::<c_void>(), LEN, s))),
            record("pool_to_device", cu_call!(d, cuMemcpyDtoDAsync_v2(device.ptr(), p, LEN, s))),
            record("device_to_pool", cu_call!(d, cuMemcpyDtoDAsync_v2(p, device.ptr(), LEN, s))),
            record("dtoh", cu_call!(d, cuMemcpyDtoHAsync_v2(host.as_mut_ptr().cast::<c_void>(), p, LEN, s))),
        )
    };
    let memset = record("memset", memset_async(p, 1, LEN, s));
    details.put("free", code(&free_async(p, s).and_then(|()| stream.synchronize())));
    Ok(format!(
        "access {}; copies: host->pool {to_pool}, pool->device {to_device}, device->pool {from_device}, pool->host \
         {to_host}; memset {memset}",
        details.get("access.device_0").unwrap_or("?")
    ))
}
