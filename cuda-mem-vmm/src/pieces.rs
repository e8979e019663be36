//! The owned pieces of a virtual allocation, each undone exactly once by its `Drop`:
//! a physical allocation (`cuMemCreate` → `cuMemRelease`), an address reservation
//! (`cuMemAddressReserve` → `cuMemAddressFree`), a mapping of one into the other (`cuMemMap` +
//! `cuMemSetAccess` → `cuMemUnmap`), and a range: the mappings one buffer spans.
//!
//! A mapping holds its physical allocation and its reservation, so it is unmapped before the
//! reservation is freed; a range holds its mappings and synchronizes its stream before they go,
//! because unmapping is not stream-ordered. Any step that fails drops the pieces made before it,
//! so nothing leaks.

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle};
use cuda_mem_core::{DevicePtr, Result, Stream, driver, record_drop_error};

/// A physical allocation and the access every mapping of it gets.
#[derive(Debug)]
pub(crate) struct Physical {
    pub(crate) handle: CUmemGenericAllocationHandle,
    pub(crate) size: usize,
    pub(crate) access: Vec<CUmemAccessDesc>,
}

impl Physical {
    /// `cuMemCreate`.
    pub(crate) fn create(
        size: usize,
        prop: &CUmemAllocationProp,
        access: Vec<CUmemAccessDesc>,
    ) -> Result<Arc<Physical>> {
        let d = driver()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer and `prop` a fully initialized structure.
        unsafe { cu_call!(d, cuMemCreate(&mut handle, size, prop, 0)) }?;
        Ok(Arc::new(Physical { handle, size, access }))
    }

    /// Takes ownership of an imported handle.
    pub(crate) fn adopt(
        handle: CUmemGenericAllocationHandle,
        size: usize,
        access: Vec<CUmemAccessDesc>,
    ) -> Arc<Physical> {
        Arc::new(Physical { handle, size, access })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        let release = || -> Result<()> {
            let d = driver()?;
            // SAFETY: the handle is this value's own reference, released once, here.
            unsafe { cu_call!(d, cuMemRelease(self.handle)) }?;
            Ok(())
        };
        if let Err(error) = release() {
            record_drop_error("virtual memory physical allocation", error);
        }
    }
}

/// An address reservation.
#[derive(Debug)]
pub(crate) struct Reservation {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: usize,
}

impl Reservation {
    /// `cuMemAddressReserve`.
    pub(crate) fn reserve(size: usize, alignment: usize, hint: DevicePtr) -> Result<Arc<Reservation>> {
        let d = driver()?;
        let mut ptr: DevicePtr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, alignment, hint, 0)) }?;
        Ok(Arc::new(Reservation { ptr, size }))
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let free = || -> Result<()> {
            let d = driver()?;
            // SAFETY: the exact range this value reserved, freed once, after every mapping in it
            // (each mapping holds the reservation) was unmapped.
            unsafe { cu_call!(d, cuMemAddressFree(self.ptr, self.size)) }?;
            Ok(())
        };
        if let Err(error) = free() {
            record_drop_error("virtual address reservation", error);
        }
    }
}

/// A physical allocation mapped at an address of a reservation, with its access set.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) ptr: DevicePtr,
    pub(crate) physical: Arc<Physical>,
    _reservation: Arc<Reservation>,
}

impl Mapping {
    /// `cuMemMap` of the whole of `physical` at `ptr` (inside `reservation`), then
    /// `cuMemSetAccess` with the allocation's descriptors; unmapped again if that fails.
    pub(crate) fn map(ptr: DevicePtr, physical: Arc<Physical>, reservation: Arc<Reservation>) -> Result<Arc<Mapping>> {
        let d = driver()?;
        // SAFETY: the range lies inside `reservation` (the callers place it so) and the handle is
        // live while `physical` is.
        unsafe { cu_call!(d, cuMemMap(ptr, physical.size, 0, physical.handle, 0)) }?;
        let mapping = Mapping { ptr, physical, _reservation: reservation };
        if !mapping.physical.access.is_empty() {
            let access = &mapping.physical.access;
            // SAFETY: `access` holds `access.len()` initialized descriptors; the range was just
            // mapped. On failure `mapping` drops and unmaps.
            unsafe { cu_call!(d, cuMemSetAccess(ptr, mapping.physical.size, access.as_ptr(), access.len())) }?;
        }
        Ok(Arc::new(mapping))
    }

    /// The mapping's size.
    pub(crate) fn size(&self) -> usize {
        self.physical.size
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let unmap = || -> Result<()> {
            let d = driver()?;
            // SAFETY: the exact range this value mapped, unmapped once; the range that held it
            // synchronized its stream first.
            unsafe { cu_call!(d, cuMemUnmap(self.ptr, self.physical.size)) }?;
            Ok(())
        };
        if let Err(error) = unmap() {
            record_drop_error("virtual memory mapping", error);
        }
    }
}

/// The contiguous mappings one buffer spans, from `base`, and the stream whose work must finish
/// before they are unmapped.
#[derive(Debug)]
pub(crate) struct Range {
    pub(crate) base: DevicePtr,
    pub(crate) mappings: Vec<Arc<Mapping>>,
    pub(crate) stream: Option<Stream>,
}

impl Range {
    /// The bytes mapped.
    pub(crate) fn mapped_size(&self) -> usize {
        self.mappings.iter().map(|m| m.size()).sum()
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        // Unmapping is not stream-ordered: wait for the work that may still use the memory.
        if let Some(stream) = &self.stream
            && let Err(error) = stream.synchronize()
        {
            record_drop_error("virtual memory buffer (synchronizing before unmapping)", error);
        }
        // The mappings drop after this, unmapping those no other range holds.
    }
}
