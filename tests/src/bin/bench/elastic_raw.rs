//! Case (10)'s raw baseline: what `ElasticGroup` does, by hand through cuda-mem-sys on the same
//! driver, so that the elastic steps compare with their own driver calls: buffers of one physical
//! allocation each (`cuMemCreate`, `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`);
//! an offload (`cuMemAllocFromPoolAsync` from the staging pool and `cuMemcpyAsync` per buffer, a
//! `cuStreamSynchronize`, then `cuMemUnmap` and `cuMemRelease` per buffer); a restore
//! (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemcpyAsync` and `cuMemFreeAsync` per buffer,
//! then a `cuStreamSynchronize`); a discard and the wake after it (the same, without copies).

use std::time::Instant;

use cuda_mem_core::sys::types::{
    CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationProp, CUmemAllocationType, CUmemGenericAllocationHandle,
    CUmemLocation, CUmemLocationType,
};
use cuda_mem_core::sys::{Driver, cu_call};
use cuda_mem_core::{Device, DevicePtr, PinnedMemoryResource, Stream};

use crate::Error;
use crate::stats::elapsed_ns;

/// Buffers of `size` bytes, each reserved and (while awake) mapped, by raw calls.
pub(crate) struct RawGroup {
    d: &'static Driver,
    size: usize,
    prop: CUmemAllocationProp,
    access: CUmemAccessDesc,
    /// Each buffer's address, its physical allocation while mapped, and its pinned copy while
    /// offloaded.
    buffers: Vec<(DevicePtr, Option<CUmemGenericAllocationHandle>, Option<DevicePtr>)>,
}

impl RawGroup {
    /// `count` buffers of `size` bytes on `device`, mapped.
    pub(crate) fn new(device: Device, count: usize, size: usize) -> Result<RawGroup, Error> {
        let d = cuda_mem_core::driver()?;
        let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device.raw() };
        let prop = CUmemAllocationProp {
            type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            location,
            ..CUmemAllocationProp::default()
        };
        let access = CUmemAccessDesc { location, flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        let mut group = RawGroup { d, size, prop, access, buffers: Vec::with_capacity(count) };
        for _ in 0..count {
            let mut ptr: DevicePtr = 0;
            // SAFETY: a valid out-pointer; the reservation is freed once, in `drop`.
            unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, 0, 0, 0)) }?;
            group.buffers.push((ptr, None, None));
        }
        group.map_all()?;
        Ok(group)
    }

    /// Maps new memory under every buffer (with its access): a wake's driver calls.
    pub(crate) fn map_all(&mut self) -> Result<(), Error> {
        let (d, size) = (self.d, self.size);
        for (ptr, handle, _) in &mut self.buffers {
            let mut created: CUmemGenericAllocationHandle = 0;
            // SAFETY: valid pointers; `prop` is fully initialized.
            unsafe { cu_call!(d, cuMemCreate(&mut created, size, &self.prop, 0)) }?;
            // SAFETY: the buffer's reservation, unmapped; the handle just made.
            unsafe { cu_call!(d, cuMemMap(*ptr, size, 0, created, 0)) }?;
            // SAFETY: the range just mapped; one initialized descriptor.
            unsafe { cu_call!(d, cuMemSetAccess(*ptr, size, &self.access, 1)) }?;
            *handle = Some(created);
        }
        Ok(())
    }

    /// Unmaps and releases every buffer's memory (after `stream`'s work): a discard's.
    pub(crate) fn unmap_all(&mut self, stream: &Stream) -> Result<(), Error> {
        let (d, size) = (self.d, self.size);
        // SAFETY: a live stream.
        unsafe { cu_call!(d, cuStreamSynchronize(stream.handle())) }?;
        for (ptr, handle, _) in &mut self.buffers {
            if let Some(mapped) = handle.take() {
                // SAFETY: mapped by `map_all`, idle (the stream was synchronized).
                unsafe { cu_call!(d, cuMemUnmap(*ptr, size)) }?;
                // SAFETY: the handle `map_all` made, released once.
                unsafe { cu_call!(d, cuMemRelease(mapped)) }?;
            }
        }
        Ok(())
    }

    /// Copies every buffer to pinned memory of `staging` on `stream`, then unmaps: an offload.
    pub(crate) fn offload(&mut self, staging: &PinnedMemoryResource, stream: &Stream) -> Result<(), Error> {
        let (d, size) = (self.d, self.size);
        for (ptr, _, host) in &mut self.buffers {
            let mut copy: DevicePtr = 0;
            // SAFETY: a valid out-pointer, the pool's and the stream's live handles.
            unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut copy, size, staging.pool().handle(), stream.handle())) }?;
            // SAFETY: both ranges are `size` bytes, live until the copy is done.
            unsafe { cu_call!(d, cuMemcpyAsync(copy, *ptr, size, stream.handle())) }?;
            *host = Some(copy);
        }
        self.unmap_all(stream)
    }

    /// Maps new memory and copies the pinned copies back on `stream` (freeing them after), then
    /// waits: a restore.
    pub(crate) fn restore(&mut self, stream: &Stream) -> Result<(), Error> {
        self.map_all()?;
        let (d, size) = (self.d, self.size);
        for (ptr, _, host) in &mut self.buffers {
            if let Some(copy) = host.take() {
                // SAFETY: both ranges are `size` bytes, live until the copy is done.
                unsafe { cu_call!(d, cuMemcpyAsync(*ptr, copy, size, stream.handle())) }?;
                // SAFETY: allocated on this stream by `offload`, freed once, after the copy.
                unsafe { cu_call!(d, cuMemFreeAsync(copy, stream.handle())) }?;
            }
        }
        // SAFETY: a live stream.
        unsafe { cu_call!(d, cuStreamSynchronize(stream.handle())) }?;
        Ok(())
    }

    /// `step` timed.
    pub(crate) fn timed(&mut self, step: impl FnOnce(&mut RawGroup) -> Result<(), Error>) -> Result<f64, Error> {
        let start = Instant::now();
        step(self)?;
        Ok(elapsed_ns(start))
    }
}

impl Drop for RawGroup {
    fn drop(&mut self) {
        let (d, size) = (self.d, self.size);
        for (ptr, handle, _) in self.buffers.drain(..) {
            if let Some(mapped) = handle {
                // SAFETY: mapped and idle (every step waits for its stream); released once.
                unsafe {
                    let _ = cu_call!(d, cuMemUnmap(ptr, size));
                    let _ = cu_call!(d, cuMemRelease(mapped));
                }
            }
            // SAFETY: the reservation `new` made, freed once, nothing mapped in it now.
            let _ = unsafe { cu_call!(d, cuMemAddressFree(ptr, size)) };
        }
    }
}
