//! Managed memory operations: advice (`cuMemAdvise`), prefetches (`cuMemPrefetchAsync`,
//! `cuMemPrefetchBatchAsync`), discards (`cuMemDiscardBatchAsync`,
//! `cuMemDiscardAndPrefetchBatchAsync`) and range queries (`cuMemRangeGetAttribute(s)`).
//!
//! Managed memory is `cuMemAllocManaged` memory or an allocation from a managed pool; the
//! simulator keeps it in host memory, so a prefetch moves nothing: it is stream work that runs
//! in stream order and records where the range was last prefetched to, which is all the driver
//! promises to report ("it gives no indication as to whether the prefetch operation … has
//! completed or even begun"). A discard, also in stream order, overwrites the discarded pages
//! with [`DISCARDED`], since reading them afterwards gives "an indeterminate value". Advice and
//! prefetches apply to whole pages (`cuda.h`: the range is rounded out to CPU pages).

use std::ffi::c_void;
use std::ops::Range;

use cuda_mem_sys::types::{
    CUdevice_attribute, CUdeviceptr, CUmem_advise, CUmem_range_attribute, CUmemLocation, CUmemLocationType, CUresult,
    CUstream,
};

use super::DefaultStream;
use super::stream::resolve_for_work;
use crate::context as ctx;
use crate::device::check_ordinal;
use crate::error::{SimResult, ensure, fail};
use crate::managed::{Accessor, PageAttributes, Place, agreed};
use crate::memory::{Allocation, Endpoint, Kind, PAGE, round_up};
use crate::pool::PoolKind;
use crate::state::{self, State};

/// What discarded pages read as afterwards (a GPU gives "an indeterminate value").
pub(crate) const DISCARDED: u8 = 0xDB;
/// `CU_DEVICE_CPU`.
const DEVICE_CPU: i32 = -1;
/// `CU_DEVICE_INVALID`.
const DEVICE_INVALID: i32 = -2;
/// The CUDA version whose `CUmem_range_attribute` gained the typed location attributes
/// (`CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE` and the three after it), with
/// `cuMemAdvise_v2`.
const TYPED_LOCATION_ATTRIBUTES: i32 = 12020;
/// The last attribute of CUDA 8.0's `CUmem_range_attribute`
/// (`CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION`).
const LAST_LEGACY_ATTRIBUTE: u32 = CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION.0;
/// `CU_STREAM_LEGACY`.
const STREAM_LEGACY: usize = 0x1;

/// Whether `allocation` is managed memory: `cuMemAllocManaged`, or a managed pool's.
fn is_managed(state: &State, allocation: &Allocation) -> bool {
    match allocation.kind {
        Kind::Managed => true,
        Kind::Pooled { pool, .. } => state.pools.get(&pool).is_some_and(|p| p.kind == PoolKind::Managed),
        _ => false,
    }
}

/// The managed allocation `[address, address + count)` lies in (its base) and the pages the
/// range covers, rounded out to whole pages. A zero count, memory that is not managed, and a
/// range that leaves its allocation's last page are `CUDA_ERROR_INVALID_VALUE`.
fn managed_pages(state: &State, address: CUdeviceptr, count: usize) -> SimResult<(u64, Range<u64>)> {
    ensure(count > 0)?;
    let allocation = state.memory.find(address).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(is_managed(state, allocation))?;
    let offset = address - allocation.base;
    let end = offset.checked_add(count as u64).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    ensure(end <= round_up(allocation.size as u64))?;
    Ok((allocation.base, offset / PAGE..end.div_ceil(PAGE)))
}

/// Whether devices have concurrent managed access: every simulated device does, unless
/// `CUDA_SIM_DEVICE_ATTRIBUTES` reports the attribute as 0, in which case the managed
/// operations behave as on such a device too.
fn concurrent_managed_access(state: &State) -> bool {
    let code = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS.0;
    state.config.attribute_override(code).is_none_or(|value| value != 0)
}

/// A device named by a location: a valid ordinal of a device with concurrent managed access,
/// else `CUDA_ERROR_INVALID_DEVICE`.
fn managed_device(state: &State, id: i32) -> SimResult<usize> {
    let device = check_ordinal(&state.config, id)?;
    if !concurrent_managed_access(state) {
        return fail(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(device)
}

/// Reads a location to prefer or prefetch to: a device, the host, host NUMA node 0 (the
/// simulated host's only node) or the calling thread's node (that one).
fn place(state: &State, location: CUmemLocation) -> SimResult<Place> {
    use CUmemLocationType as T;
    match location.type_ {
        T::CU_MEM_LOCATION_TYPE_DEVICE => managed_device(state, location.id).map(Place::Device),
        T::CU_MEM_LOCATION_TYPE_HOST => Ok(Place::Host),
        T::CU_MEM_LOCATION_TYPE_HOST_NUMA if location.id == 0 => Ok(Place::HostNuma(0)),
        T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(Place::HostNuma(0)),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Reads the processor `CU_MEM_ADVISE_SET/UNSET_ACCESSED_BY` names: a device or the host; "all
/// other location types are invalid".
fn accessor(state: &State, location: CUmemLocation) -> SimResult<Accessor> {
    match location.type_ {
        CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE => managed_device(state, location.id).map(Accessor::Device),
        CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST => Ok(Accessor::Host),
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemAdvise_v2`: the advice applies to every page the range covers. The location is read
/// only for the advice that uses it (`cuda.h`: "ignored" for the others).
pub(crate) fn advise(address: CUdeviceptr, count: usize, advice: CUmem_advise, location: CUmemLocation) -> SimResult {
    use CUmem_advise as A;
    let mut state = state::lock()?;
    ctx::current(&state)?;
    let (base, pages) = managed_pages(&state, address, count)?;
    let change: Box<dyn Fn(&mut PageAttributes)> = match advice {
        A::CU_MEM_ADVISE_SET_READ_MOSTLY => Box::new(|page| page.read_mostly = true),
        A::CU_MEM_ADVISE_UNSET_READ_MOSTLY => Box::new(|page| page.read_mostly = false),
        A::CU_MEM_ADVISE_SET_PREFERRED_LOCATION => {
            let place = place(&state, location)?;
            Box::new(move |page| page.preferred = Some(place))
        }
        A::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION => Box::new(|page| page.preferred = None),
        A::CU_MEM_ADVISE_SET_ACCESSED_BY => {
            let accessor = accessor(&state, location)?;
            Box::new(move |page| {
                page.accessed_by.insert(accessor);
            })
        }
        A::CU_MEM_ADVISE_UNSET_ACCESSED_BY => {
            let accessor = accessor(&state, location)?;
            Box::new(move |page| {
                page.accessed_by.remove(&accessor);
            })
        }
        _ => return fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    let allocation = state.memory.find_mut(base).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    allocation.pages.update(pages, change);
    Ok(())
}

/// The location CUDA 8.0's `cuMemAdvise` and `cuMemPrefetchAsync` mean by a device argument:
/// `CU_DEVICE_CPU` is the host, anything else a device ordinal (checked where it is read, so an
/// invalid one is `CUDA_ERROR_INVALID_DEVICE`, and ignored where the advice ignores it).
fn legacy_location(device: i32) -> CUmemLocation {
    if device == DEVICE_CPU {
        CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, id: 0 }
    } else {
        CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
    }
}

/// `cuMemAdvise` of CUDA 8.0 (`PFN_cuMemAdvise_v8000`): `cuMemAdvise_v2` with a device ordinal
/// or `CU_DEVICE_CPU` for the location.
pub(crate) fn advise_v1(address: CUdeviceptr, count: usize, advice: CUmem_advise, device: i32) -> SimResult {
    advise(address, count, advice, legacy_location(device))
}

/// One range of a prefetch or discard, checked.
struct Operation {
    /// The managed allocation's base.
    base: u64,
    /// The pages it covers.
    pages: Range<u64>,
    /// Where to prefetch it to, for a prefetch.
    place: Option<Place>,
}

/// Records each prefetch in `operations`, and enqueues one piece of stream work that discards
/// the ranges if `discard` (a prefetch moves nothing: the memory is host memory).
fn enqueue(
    state: &mut State,
    operations: Vec<Operation>,
    discard: bool,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    let (context, stream) = resolve_for_work(state, stream, mode)?;
    let mut discarded: Vec<(Endpoint, usize)> = Vec::new();
    for operation in operations {
        let allocation = state.memory.find_mut(operation.base).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if let Some(place) = operation.place {
            allocation.pages.update(operation.pages.clone(), |page| page.last_prefetch = Some(place));
        }
        let size = allocation.size as u64;
        if discard {
            let start = operation.pages.start * PAGE;
            let len = (operation.pages.end * PAGE).min(size) - start;
            discarded.push((state.memory.classify(operation.base + start, len as usize)?, len as usize));
        }
    }
    context.submit(
        &stream,
        Box::new(move || {
            for (range, len) in &discarded {
                // SAFETY: `range` is `len` bytes of a managed allocation's host backing
                // (checked at the call), kept alive by the endpoint's span.
                unsafe { std::ptr::write_bytes(range.ptr(), DISCARDED, *len) };
            }
        }),
    );
    Ok(())
}

/// `cuMemPrefetchAsync_v2`: flags must be 0; a device location needs concurrent managed
/// access; the prefetch runs in stream order.
pub(crate) fn prefetch(
    address: CUdeviceptr,
    count: usize,
    location: CUmemLocation,
    flags: u32,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    ensure(flags == 0)?;
    let mut state = state::lock()?;
    ctx::current(&state)?;
    let (base, pages) = managed_pages(&state, address, count)?;
    let place = place(&state, location)?;
    enqueue(&mut state, vec![Operation { base, pages, place: Some(place) }], false, stream, mode)
}

/// `cuMemPrefetchAsync` of CUDA 8.0 (`PFN_cuMemPrefetchAsync_v8000`): `cuMemPrefetchAsync_v2`
/// to a device ordinal or `CU_DEVICE_CPU`, without flags.
pub(crate) fn prefetch_v1(
    address: CUdeviceptr,
    count: usize,
    device: i32,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    prefetch(address, count, legacy_location(device), 0, stream, mode)
}

/// Every batched discard or prefetch: `cuMemPrefetchBatchAsync` (`discard` false),
/// `cuMemDiscardBatchAsync` (`locations` `None`), `cuMemDiscardAndPrefetchBatchAsync`.
///
/// # Safety
/// `dptrs` and `sizes` are null or valid for `count` reads; `locations`, if given, holds
/// pointers null or valid for `num_locations` reads each.
#[allow(clippy::too_many_arguments)] // the driver's own arguments, one for one
pub(crate) unsafe fn batch(
    dptrs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    locations: Option<(*const CUmemLocation, *const usize, usize)>,
    discard: bool,
    flags: u64,
    stream: CUstream,
    mode: DefaultStream,
) -> SimResult {
    ensure(flags == 0 && count > 0 && !dptrs.is_null() && !sizes.is_null())?;
    // "Must not be legacy NULL stream."
    let handle = stream as usize;
    ensure(handle != STREAM_LEGACY && !(handle == 0 && mode == DefaultStream::Legacy))?;
    // SAFETY: non-null and valid for `count` reads by the caller's contract.
    let (dptrs, sizes) =
        unsafe { (std::slice::from_raw_parts(dptrs, count), std::slice::from_raw_parts(sizes, count)) };
    let places = match locations {
        // SAFETY: forwarded from the caller.
        Some((locations, first_indices, n)) => Some(unsafe { read_locations(locations, first_indices, n, count) }?),
        None => None,
    };
    let mut state = state::lock()?;
    ctx::current(&state)?;
    // "All devices in the system must have a non-zero value for … CONCURRENT_MANAGED_ACCESS."
    if !concurrent_managed_access(&state) {
        return fail(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let mut operations = Vec::with_capacity(count);
    for (i, (&address, &size)) in dptrs.iter().zip(sizes).enumerate() {
        let (base, pages) = managed_pages(&state, address, size)?;
        let place = match &places {
            Some(places) => {
                // The last entry whose first operation is at or before `i`.
                let k = places.partition_point(|&(first, _)| first <= i) - 1;
                Some(place(&state, places[k].1)?)
            }
            None => None,
        };
        operations.push(Operation { base, pages, place });
    }
    enqueue(&mut state, operations, discard, stream, mode)
}

/// Reads a batch's locations and the index of the first operation each applies to: the first
/// index is 0, each is greater than the one before and less than `count`, and there are at
/// most `count` of them, at least one.
///
/// # Safety
/// Both pointers are null or valid for `n` reads.
unsafe fn read_locations(
    locations: *const CUmemLocation,
    first_indices: *const usize,
    n: usize,
    count: usize,
) -> SimResult<Vec<(usize, CUmemLocation)>> {
    ensure(n > 0 && n <= count && !locations.is_null() && !first_indices.is_null())?;
    // SAFETY: non-null and valid for `n` reads by the caller's contract.
    let (locations, first_indices) =
        unsafe { (std::slice::from_raw_parts(locations, n), std::slice::from_raw_parts(first_indices, n)) };
    ensure(first_indices[0] == 0)?;
    ensure(first_indices.windows(2).all(|pair| pair[0] < pair[1]) && first_indices[n - 1] < count)?;
    Ok(first_indices.iter().copied().zip(locations.iter().copied()).collect())
}

/// A place as the legacy attributes report it: a device ordinal or `CU_DEVICE_CPU` (a host
/// NUMA node is the CPU too).
fn legacy_id(place: Option<Place>) -> Option<i32> {
    match place? {
        Place::Device(device) => Some(device as i32),
        Place::Host | Place::HostNuma(_) => Some(DEVICE_CPU),
    }
}

/// A place's `CUmemLocationType` and id, as the v2 attributes report them (`INVALID` when the
/// pages do not agree or have none; the id is then `CU_DEVICE_INVALID`, to be ignored, as it
/// is for the host).
fn typed(place: Option<Option<Place>>) -> (CUmemLocationType, i32) {
    use CUmemLocationType as T;
    match place.flatten() {
        Some(Place::Device(device)) => (T::CU_MEM_LOCATION_TYPE_DEVICE, device as i32),
        Some(Place::Host) => (T::CU_MEM_LOCATION_TYPE_HOST, DEVICE_INVALID),
        Some(Place::HostNuma(node)) => (T::CU_MEM_LOCATION_TYPE_HOST_NUMA, node),
        None => (T::CU_MEM_LOCATION_TYPE_INVALID, DEVICE_INVALID),
    }
}

/// The bytes `attribute` reads for pages `runs`, checking `size` (4 bytes for each single
/// value, a non-zero multiple of 4 for the accessed-by list).
fn attribute_bytes(runs: &[&PageAttributes], attribute: CUmem_range_attribute, size: usize) -> SimResult<Vec<u8>> {
    use CUmem_range_attribute as A;
    let single = |value: i32| -> SimResult<Vec<u8>> {
        ensure(size == 4)?;
        Ok(value.to_ne_bytes().to_vec())
    };
    let legacy = |read: fn(&PageAttributes) -> Option<Place>| {
        agreed(runs, |page| legacy_id(read(page))).flatten().unwrap_or(DEVICE_INVALID)
    };
    match attribute {
        A::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY => single(i32::from(agreed(runs, |page| page.read_mostly) == Some(true))),
        A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION => single(legacy(|page| page.preferred)),
        A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION => single(legacy(|page| page.last_prefetch)),
        A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE => {
            single(typed(agreed(runs, |page| page.preferred)).0.0 as i32)
        }
        A::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID => single(typed(agreed(runs, |page| page.preferred)).1),
        A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE => {
            single(typed(agreed(runs, |page| page.last_prefetch)).0.0 as i32)
        }
        A::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID => single(typed(agreed(runs, |page| page.last_prefetch)).1),
        A::CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY => {
            ensure(size > 0 && size.is_multiple_of(4))?;
            // Processors advised for the whole range: in every run's set.
            let mut every = runs.first().map(|page| page.accessed_by.clone()).unwrap_or_default();
            for page in runs {
                every.retain(|accessor| page.accessed_by.contains(accessor));
            }
            let ids = every.into_iter().map(|accessor| match accessor {
                Accessor::Device(device) => device as i32,
                Accessor::Host => DEVICE_CPU,
            });
            let padded = ids.chain(std::iter::repeat(DEVICE_INVALID)).take(size / 4);
            Ok(padded.flat_map(i32::to_ne_bytes).collect())
        }
        _ => fail(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// The bytes of each attribute in `attributes` (with its size) for `[address, address + count)`.
fn query(
    state: &State,
    address: CUdeviceptr,
    count: usize,
    attributes: &[(CUmem_range_attribute, usize)],
) -> SimResult<Vec<Vec<u8>>> {
    ctx::current(state)?;
    // The typed location attributes came with CUDA 12.2; an older driver does not know them.
    let typed_known = super::init::reported_version()? >= TYPED_LOCATION_ATTRIBUTES;
    ensure(typed_known || attributes.iter().all(|(attribute, _)| attribute.0 <= LAST_LEGACY_ATTRIBUTE))?;
    let (base, pages) = managed_pages(state, address, count)?;
    let allocation = state.memory.find(base).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let runs = allocation.pages.covering(pages);
    attributes.iter().map(|&(attribute, size)| attribute_bytes(&runs, attribute, size)).collect()
}

/// `cuMemRangeGetAttribute`.
///
/// # Safety
/// `data` is null or valid for `size` bytes of writes.
pub(crate) unsafe fn range_attribute(
    data: *mut c_void,
    size: usize,
    attribute: CUmem_range_attribute,
    address: CUdeviceptr,
    count: usize,
) -> SimResult {
    ensure(!data.is_null())?;
    let state = state::lock()?;
    let bytes = query(&state, address, count, &[(attribute, size)])?;
    // SAFETY: `data` is valid for `size` bytes, and each value is `size` bytes (checked).
    unsafe { std::ptr::copy_nonoverlapping(bytes[0].as_ptr(), data.cast::<u8>(), size) };
    Ok(())
}

/// `cuMemRangeGetAttributes`: every attribute is checked before any is written.
///
/// # Safety
/// `data`, `sizes` and `attributes` are null or valid for `n` reads; each `data[i]` is valid
/// for `sizes[i]` bytes of writes.
pub(crate) unsafe fn range_attributes(
    data: *mut *mut c_void,
    sizes: *const usize,
    attributes: *const CUmem_range_attribute,
    n: usize,
    address: CUdeviceptr,
    count: usize,
) -> SimResult {
    ensure(n > 0 && !data.is_null() && !sizes.is_null() && !attributes.is_null())?;
    // SAFETY: non-null and valid for `n` reads by the caller's contract.
    let (data, sizes, attributes) = unsafe {
        (
            std::slice::from_raw_parts(data, n),
            std::slice::from_raw_parts(sizes, n),
            std::slice::from_raw_parts(attributes, n),
        )
    };
    ensure(data.iter().all(|out| !out.is_null()))?;
    let wanted: Vec<(CUmem_range_attribute, usize)> = attributes.iter().copied().zip(sizes.iter().copied()).collect();
    let state = state::lock()?;
    let values = query(&state, address, count, &wanted)?;
    for (out, bytes) in data.iter().zip(values) {
        // SAFETY: each `data[i]` is valid for `sizes[i]` bytes, the length of its value.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
    }
    Ok(())
}
