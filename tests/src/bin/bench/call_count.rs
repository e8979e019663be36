//! Counting a step's driver calls on the simulator: every counted function is armed to fail at
//! its `ARM_AT`th next call, the step runs, and probes with harmless arguments find how many
//! calls of each the step made.

use cuda_mem_core::DevicePtr;
use cuda_mem_core::Stream;
use cuda_mem_core::sys::types::{
    CUcontext, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationProp, CUresult, CUstream,
};
use cuda_mem_core::sys::{Driver, cu_call};

use crate::Error;

/// Calls per counted function, in [`COUNTED`]'s order.
pub(crate) type Calls = Vec<(&'static str, u32)>;

/// The functions counted per step: every function cuda-mem-vmm calls, the context and stream
/// functions it reaches through cuda-mem-core, and the copies (which must stay at zero).
const COUNTED: [&std::ffi::CStr; 14] = [
    c"cuMemAddressReserve",
    c"cuMemAddressFree",
    c"cuMemCreate",
    c"cuMemRelease",
    c"cuMemMap",
    c"cuMemUnmap",
    c"cuMemSetAccess",
    c"cuMemGetAllocationGranularity",
    c"cuStreamSynchronize",
    c"cuCtxGetCurrent",
    c"cuCtxSetCurrent",
    c"cuMemcpy",
    c"cuMemcpyDtoD_v2",
    c"cuMemcpyAsync",
];

/// More calls of one function than any step makes; the probe makes the rest.
const ARM_AT: u32 = 4096;

/// Arms an injected failure of every counted function at its `ARM_AT`th next call.
pub(crate) fn arm(d: &Driver) -> Result<(), Error> {
    for function in COUNTED {
        cuda_sim::testing::inject_failure(d, function, ARM_AT)?;
    }
    Ok(())
}

/// Calls each counted function with harmless arguments until the armed failure fires: the step
/// made `ARM_AT` minus that many calls of it.
pub(crate) fn probe(d: &Driver, stream: &Stream) -> Result<Calls, Error> {
    let oom = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    // SAFETY: all-zero bytes are a valid value of these plain C structs (no references).
    let prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let desc: CUmemAccessDesc = unsafe { std::mem::zeroed() };
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetCurrent(&mut current)) }?;
    let handle: CUstream = stream.handle();
    let mut out = Vec::new();
    for function in COUNTED {
        let name = function.to_str().unwrap_or("?");
        let call = || -> Result<CUresult, Error> {
            let mut ptr: DevicePtr = 0;
            let mut generic = 0;
            let mut granularity = 0usize;
            let mut got: CUcontext = std::ptr::null_mut();
            let minimum = CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
            // SAFETY: every pointer argument points to a live local of the right type, and the
            // calls ask for nothing (zero sizes, null handles the driver refuses, the current
            // context, a synchronize), so that a call that is not the armed failure changes
            // nothing.
            let code = unsafe {
                match name {
                    "cuMemAddressReserve" => d.cuMemAddressReserve()?(&mut ptr, 0, 0, 0, 0),
                    "cuMemAddressFree" => d.cuMemAddressFree()?(0, 0),
                    "cuMemCreate" => d.cuMemCreate()?(&mut generic, 0, &prop, 0),
                    "cuMemRelease" => d.cuMemRelease()?(0),
                    "cuMemMap" => d.cuMemMap()?(0, 0, 0, 0, 0),
                    "cuMemUnmap" => d.cuMemUnmap()?(0, 0),
                    "cuMemSetAccess" => d.cuMemSetAccess()?(0, 0, &desc, 1),
                    "cuMemGetAllocationGranularity" => {
                        d.cuMemGetAllocationGranularity()?(&mut granularity, &prop, minimum)
                    }
                    "cuStreamSynchronize" => d.cuStreamSynchronize()?(handle),
                    "cuCtxGetCurrent" => d.cuCtxGetCurrent()?(&mut got),
                    "cuCtxSetCurrent" => d.cuCtxSetCurrent()?(current),
                    "cuMemcpy" => d.cuMemcpy()?(0, 0, 0),
                    "cuMemcpyDtoD_v2" => d.cuMemcpyDtoD_v2()?(0, 0, 0),
                    "cuMemcpyAsync" => d.cuMemcpyAsync()?(0, 0, 0, handle),
                    _ => return Err(format!("no probe for {name}").into()),
                }
            };
            Ok(code)
        };
        let mut probes = 0;
        loop {
            probes += 1;
            if call()? == oom {
                break;
            }
            if probes > ARM_AT {
                return Err(format!("the armed failure of {name} never fired").into());
            }
        }
        out.push((name, ARM_AT - probes));
    }
    Ok(out)
}
