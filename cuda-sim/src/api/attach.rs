//! `cuStreamAttachMemAsync`: a managed allocation's stream association.
//!
//! The simulator's managed memory is host memory every device and the host reach at any time
//! (its devices report concurrent managed access), so an association changes nothing it models:
//! the call checks what `cuda.h` asks of its arguments and enqueues nothing.

use cuda_mem_sys::types::{CUdeviceptr, CUmemAttach_flags, CUresult, CUstream};

use super::DefaultStream;
use super::stream::resolve;
use crate::capture;
use crate::error::{SimResult, ensure, fail};
use crate::memory::{Endpoint, Kind};
use crate::state;
use crate::stream::StreamKind;

/// `cuStreamAttachMemAsync`. The flags must be one of `CUmemAttach_flags`; a managed allocation
/// (`cuMemAllocManaged`) is attached whole, from its start, with a length of 0 or its size;
/// `CU_MEM_ATTACH_SINGLE` needs a stream of its own, not a default stream ("It is illegal to
/// attach singly to the NULL stream"). Each of these, and memory that is not managed, is
/// `CUDA_ERROR_INVALID_VALUE` (see [`conservative`](crate::conservative)). Pageable host memory
/// needs `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`, which the simulated devices lack:
/// `CUDA_ERROR_NOT_SUPPORTED`. On a capturing stream it is `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`
/// and the capture is invalidated.
pub(crate) fn attach(
    stream: CUstream,
    address: CUdeviceptr,
    length: usize,
    flags: u32,
    mode: DefaultStream,
) -> SimResult {
    let known = [CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL, CUmemAttach_flags::CU_MEM_ATTACH_HOST];
    let single = flags == CUmemAttach_flags::CU_MEM_ATTACH_SINGLE.0;
    ensure(single || known.iter().any(|f| f.0 == flags))?;
    let state = state::lock()?;
    let (context, stream) = resolve(&state, stream, mode)?;
    ensure(!single || stream.kind == StreamKind::Created)?;
    match state.memory.classify(address, 1)? {
        Endpoint::Pageable(_) => {
            ensure(length > 0)?;
            return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        Endpoint::Device(_) | Endpoint::Pinned(_) => {
            let allocation = state.memory.find(address).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
            ensure(allocation.kind == Kind::Managed && allocation.base == address)?;
            ensure(length == 0 || length == allocation.size)?;
        }
    }
    drop(state);
    capture::admit_wait(&context, &stream)
}
