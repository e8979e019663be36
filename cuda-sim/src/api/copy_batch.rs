//! Copies with attributes: `cuMemcpyBatchAsync` (CUDA 13.0's revision, without `failIdx`) and
//! `cuMemcpyWithAttributesAsync` (CUDA 13.2), one copy with the same attributes.
//!
//! Every argument is checked before anything is enqueued, so a refused batch copies nothing.
//! The batch is one stream operation: it runs in stream order after the work before it, and
//! its copies, which `cuda.h` leaves unordered among themselves, are never dependent (a batch
//! where one copy writes what another reads or writes is refused, see [`crate::conservative`]).
//! The source access order is honoured as far as it can be observed:
//!
//! - `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`: the source is read in stream order, after the work
//!   enqueued before the call;
//! - `CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL`: the source is read before the call returns
//!   (the caller may reuse it at once); the destination is still written in stream order;
//! - `CU_MEMCPY_SRC_ACCESS_ORDER_ANY`: read in stream order, which the order allows.
//!
//! Host synchronization otherwise follows `cuMemcpyAsync`'s (see `api::memory`): a pageable
//! source going to the device is read at the call; a copy into pageable memory, or out of it
//! into pinned memory, returns when done. Location hints are checked (a location the machine
//! does not have is refused) and otherwise ignored, as `cuda.h` allows: the simulator's managed
//! memory never moves. `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE` is a hint and changes
//! nothing.

use cuda_mem_sys::types::{
    CUdeviceptr, CUmemLocation, CUmemLocationType, CUmemcpyAttributes, CUmemcpyFlags, CUmemcpySrcAccessOrder, CUresult,
    CUstream, CUstreamCaptureStatus,
};

use super::DefaultStream;
use super::memory::{Address, check_copy_access};
use super::stream::{names_legacy, resolve_for_work};
use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail};
use crate::memory::Endpoint;
use crate::state::{self, State};

/// One copy of a batch, as the caller gave it.
#[derive(Debug, Clone, Copy)]
struct Request {
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    /// Read before the call returns (`CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL`).
    during_call: bool,
}

/// Where a copy's bytes come from when its operation runs.
enum Source {
    /// Read at the call.
    Staged(Vec<u8>),
    /// Read when the operation runs; the endpoint (held, never read) keeps the memory alive.
    Live(Address, #[allow(dead_code)] Endpoint),
}

/// One copy, ready to run.
struct Prepared {
    to: Address,
    /// The destination, kept alive until the copy ran.
    dst: Endpoint,
    from: Source,
    len: usize,
}

/// `cuMemcpyBatchAsync` (`cuMemcpyBatchAsync_v2`).
///
/// # Safety
/// `dsts`, `srcs` and `sizes` are null or valid for `count` reads, `attrs` and `attrs_idxs` for
/// `num_attrs`; host memory among the copies is valid for its size (reads for sources, writes
/// for destinations) until the copy completes, as the driver requires.
#[allow(clippy::too_many_arguments)] // the driver's own arguments, one for one
pub(crate) unsafe fn batch(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const CUmemcpyAttributes,
    attrs_idxs: *const usize,
    num_attrs: usize,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    ensure(count > 0 && !dsts.is_null() && !srcs.is_null() && !sizes.is_null())?;
    ensure(num_attrs > 0 && num_attrs <= count && !attrs.is_null() && !attrs_idxs.is_null())?;
    // SAFETY: non-null and valid for `count` (`num_attrs`) reads by the caller's contract.
    let (dsts, srcs, sizes, attrs, attrs_idxs) = unsafe {
        (
            std::slice::from_raw_parts(dsts, count),
            std::slice::from_raw_parts(srcs, count),
            std::slice::from_raw_parts(sizes, count),
            std::slice::from_raw_parts(attrs, num_attrs),
            std::slice::from_raw_parts(attrs_idxs, num_attrs),
        )
    };
    // "The first entry in attrsIdxs must always be 0 … each entry must be greater than the
    // previous entry and the last entry should be less than count."
    ensure(attrs_idxs[0] == 0)?;
    ensure(attrs_idxs.windows(2).all(|pair| pair[0] < pair[1]) && attrs_idxs[num_attrs - 1] < count)?;
    let requests = (0..count)
        .map(|i| {
            // The last entry whose first copy is at or before `i`.
            let k = attrs_idxs.partition_point(|&first| first <= i) - 1;
            Ok(Request { dst: dsts[i], src: srcs[i], len: sizes[i], during_call: during_call(&attrs[k])? })
        })
        .collect::<SimResult<Vec<_>>>()?;
    // SAFETY: forwarded from the caller.
    unsafe { submit(&requests, attrs, stream, mode) }
}

/// `cuMemcpyWithAttributesAsync`: one copy, refused on a driver reporting a version older
/// than CUDA 13.2 (which would not have the function).
///
/// # Safety
/// `attr` is null or valid for a read; host memory among `dst` and `src` is valid for `len`
/// bytes until the copy completes.
pub(crate) unsafe fn with_attributes(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    attr: *const CUmemcpyAttributes,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    if super::init::reported_version()? < cuda_mem_sys::MEMCPY_WITH_ATTRIBUTES_VERSION as i32 {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    ensure(!attr.is_null())?;
    // SAFETY: non-null and valid for a read by the caller's contract.
    let attrs = std::slice::from_ref(unsafe { &*attr });
    let request = Request { dst, src, len, during_call: during_call(&attrs[0])? };
    // SAFETY: forwarded from the caller.
    unsafe { submit(&[request], attrs, stream, mode) }
}

/// Checks one set of attributes (access order, flags; hints are checked with the state) and
/// says whether the source is read during the call.
fn during_call(attr: &CUmemcpyAttributes) -> SimResult<bool> {
    use CUmemcpySrcAccessOrder as O;
    ensure(attr.flags & !CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE.0 == 0)?;
    match attr.srcAccessOrder {
        O::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM => Ok(false),
        // ANY may read out of stream order: read at the call, the earliest it allows, so that
        // a source still written by earlier work is read as it was (see `conservative`).
        O::CU_MEMCPY_SRC_ACCESS_ORDER_ANY | O::CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL => Ok(true),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Checks a location hint: none (`CU_MEM_LOCATION_TYPE_INVALID`, what a zeroed hint reads as),
/// a device of this process, the host, its one NUMA node (0), or the calling thread's node.
fn check_hint(state: &State, hint: CUmemLocation) -> SimResult {
    use CUmemLocationType as T;
    match hint.type_ {
        T::CU_MEM_LOCATION_TYPE_INVALID | T::CU_MEM_LOCATION_TYPE_HOST | T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => {
            Ok(())
        }
        T::CU_MEM_LOCATION_TYPE_DEVICE => {
            check_ordinal(&state.config, hint.id).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE).map(drop)
        }
        T::CU_MEM_LOCATION_TYPE_HOST_NUMA => ensure(hint.id == 0),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte.
fn overlaps(a: u64, a_len: usize, b: u64, b_len: usize) -> bool {
    a < b.saturating_add(b_len as u64) && b < a.saturating_add(a_len as u64)
}

/// Whether two copies of the batch depend on each other: one writes bytes the other reads or
/// writes. (A copy's own source and destination may overlap, as in `cuMemcpyAsync`.)
fn dependent(requests: &[Request]) -> bool {
    requests.iter().enumerate().any(|(i, a)| {
        requests[i + 1..].iter().any(|b| {
            overlaps(a.dst, a.len, b.dst, b.len)
                || overlaps(a.dst, a.len, b.src, b.len)
                || overlaps(b.dst, b.len, a.src, a.len)
        })
    })
}

/// Checks the copies against the state and enqueues them as one stream operation.
///
/// # Safety
/// As [`batch`], for the copies `requests` describe.
unsafe fn submit(
    requests: &[Request],
    attrs: &[CUmemcpyAttributes],
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    // "Must not be legacy NULL stream."
    ensure(!names_legacy(stream, mode))?;
    ensure(requests.iter().all(|r| r.len > 0))?;
    ensure(!dependent(requests))?;
    let state = state::lock()?;
    let (context, stream) = resolve_for_work(&state, stream, mode)?;
    for attr in attrs {
        check_hint(&state, attr.srcLocHint)?;
        check_hint(&state, attr.dstLocHint)?;
    }
    // No graph node represents these copies: refused in a capture, which stays valid.
    if stream.capture.status() == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return fail(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut checked = Vec::with_capacity(requests.len());
    for request in requests {
        let dst = state.memory.classify(request.dst, request.len)?;
        let src = state.memory.classify(request.src, request.len)?;
        check_copy_access(&state, request.dst, request.src, request.len, stream.device)?;
        checked.push((request, dst, src));
    }
    drop(state);
    let mut wait = false;
    let mut copies = Vec::with_capacity(checked.len());
    for (request, dst, src) in checked {
        // As cuMemcpyAsync: a pageable source going to the device is read at the call; a copy
        // touching pageable memory on its way to the host returns when done.
        wait |= dst.is_host() && (dst.is_pageable() || src.is_pageable());
        let stage = request.during_call || (src.is_pageable() && !dst.is_host());
        let from = if stage {
            // SAFETY: `src` was checked to hold `len` bytes (or is host memory the caller
            // vouches for), and nothing before this call may still be writing it (the
            // caller's promise for DURING_API_CALL; stream order does not apply to pageable
            // memory's staging either).
            Source::Staged(unsafe { std::slice::from_raw_parts(src.ptr(), request.len) }.to_vec())
        } else {
            Source::Live(Address(src.ptr()), src)
        };
        copies.push(Prepared { to: Address(dst.ptr()), dst, from, len: request.len });
    }
    let fault = std::sync::Arc::clone(&context.fault);
    let fence = context.submit(
        &stream,
        Box::new(move || {
            for copy in &copies {
                let (from, held) = match &copy.from {
                    Source::Staged(bytes) => (bytes.as_ptr(), Endpoint::hold(&[&copy.dst])),
                    Source::Live(address, src) => (address.0.cast_const(), Endpoint::hold(&[&copy.dst, src])),
                };
                // VMM memory unmapped since the call: a GPU faults.
                let Some(_held) = held else {
                    return fault.record(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                };
                // SAFETY: both ranges are valid for `len` bytes (checked at the call, or
                // guaranteed by the caller for host memory), kept alive by the endpoints and
                // mapped while `_held` lives; a copy's own ranges may overlap, hence a memmove.
                unsafe { std::ptr::copy(from, copy.to.0, copy.len) };
            }
        }),
    );
    if wait {
        fence.wait();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(dst: u64, src: u64, len: usize) -> Request {
        Request { dst, src, len, during_call: false }
    }

    #[test]
    fn dependent_copies_are_those_sharing_a_written_byte() {
        assert!(!dependent(&[request(0x1000, 0x2000, 16), request(0x1010, 0x2000, 16)]), "sources may be shared");
        assert!(dependent(&[request(0x1000, 0x2000, 16), request(0x100f, 0x3000, 16)]), "destinations overlap");
        assert!(dependent(&[request(0x1000, 0x2000, 16), request(0x3000, 0x1008, 4)]), "one reads what one writes");
        assert!(dependent(&[request(0x3000, 0x1008, 4), request(0x1000, 0x2000, 16)]), "in either order");
        assert!(!dependent(&[request(0x1000, 0x1004, 16)]), "a copy's own ranges may overlap");
    }
}
