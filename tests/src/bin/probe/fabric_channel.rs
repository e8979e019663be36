//! Question 27: fabric handles without an IMEX channel. `cuda.h` says fabric sharing needs an
//! IMEX channel the user can open (`/dev/nvidia-caps-imex-channels/channel*`) and documents
//! `CUDA_ERROR_NOT_PERMITTED` for an importer without the exporter's; what `cuMemCreate` of
//! fabric-shareable memory answers a process with no channel it does not say. Libraries report
//! `CUDA_ERROR_NOT_PERMITTED` while `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` reads 1;
//! the simulator answers so, and `cuda-mem-vmm` probes for it when a resource with fabric handles
//! is made (`DeviceFeature::ImexChannel`). What does this machine's driver answer?

use cuda_mem_sys::types::{
    CUdevice_attribute, CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType, CUmemFabricHandle,
    CUmemGenericAllocationHandle,
};
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::address_hint::granularity;
use crate::raw::{code, device_attribute, device_location};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "fabric-channel",
    question: "Does device 0 report fabric handles as supported, which IMEX channels can this process open, and what \
               do cuMemCreate of one granule shareable as a fabric handle and its export answer?",
    run,
    child: None,
};

/// Where the driver's IMEX channel files live.
const CHANNELS: &str = "/dev/nvidia-caps-imex-channels";

/// The channel files this process can open for reading, by name; `none` when there are none (or
/// no folder).
fn openable_channels() -> String {
    let Ok(entries) = std::fs::read_dir(CHANNELS) else { return "none (no folder)".to_string() };
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| std::fs::File::open(entry.path()).is_ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names.is_empty() { "none".to_string() } else { names.join(", ") }
}

/// A physical allocation of `size` bytes on device 0 shareable as a fabric handle.
fn create_fabric(size: usize) -> Result<CUmemGenericAllocationHandle, CudaError> {
    let d = driver()?;
    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
        location: device_location(0),
        ..CUmemAllocationProp::default()
    };
    let mut handle = 0;
    // SAFETY: `handle` is a valid out-pointer and `prop` valid for a read.
    unsafe { cu_call!(d, cuMemCreate(&mut handle, size, &prop, 0)) }?;
    Ok(handle)
}

/// Exports `handle` as a fabric handle, then releases it; the export's outcome and the release's.
fn export_and_release(handle: CUmemGenericAllocationHandle) -> Result<(String, String), CudaError> {
    let d = driver()?;
    let mut fabric = CUmemFabricHandle::default();
    let fabric_type = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
    // SAFETY: `fabric` is a valid out-pointer for a fabric handle; `handle` is live.
    let exported =
        unsafe { cu_call!(d, cuMemExportToShareableHandle((&raw mut fabric).cast(), handle, fabric_type, 0)) };
    // SAFETY: `handle` came from cuMemCreate and is released once, here.
    let released = unsafe { cu_call!(d, cuMemRelease(handle)) };
    Ok((code(&exported), code(&released)))
}

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let attribute = device_attribute(0, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
    details.put("fabric_supported_attribute", attribute.as_ref().map_or_else(|e| format!("{e}"), i32::to_string));
    let channels = openable_channels();
    details.put("openable_channels", &channels);
    let created = create_fabric(granularity()?);
    details.put("create", code(&created));
    let made = match created {
        Ok(handle) => {
            let (exported, released) = export_and_release(handle)?;
            details.put("export", &exported);
            details.put("release", released);
            format!("made; its export {exported}")
        }
        Err(e) => crate::raw::error_code(e),
    };
    let supported = match attribute {
        Ok(value) => value.to_string(),
        Err(e) => crate::raw::error_code(e),
    };
    Ok(format!(
        "fabric handles supported (attribute): {supported}; IMEX channels this process can open: {channels}; \
         cuMemCreate shareable as a fabric handle: {made}"
    ))
}
