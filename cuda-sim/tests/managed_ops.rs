//! Managed memory operations: `cuMemAdvise`, `cuMemPrefetchAsync`, the batched prefetches and
//! discards, and the range attributes that report them.

mod common;

use std::ffi::c_void;

use common::{
    Gate, NULL_STREAM, STREAM_LEGACY, code, driver, hold, in_child, init, non_blocking_stream, on_fresh_thread, query,
    sync, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUdeviceptr, CUmem_advise, CUmem_range_attribute, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation,
    CUmemLocationType, CUmemPoolProps, CUmemoryPool, CUresult, CUstream,
};

const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
const OK: CUresult = CUresult::CUDA_SUCCESS;
const PAGE: usize = 4096;
/// `CU_DEVICE_CPU` and `CU_DEVICE_INVALID`.
const CPU: i32 = -1;
const NONE: i32 = -2;
/// What discarded pages read as on the simulator.
const DISCARDED: u8 = 0xDB;

use CUmem_advise as Advice;
use CUmem_range_attribute as Attr;
use CUmemLocationType as T;

fn loc(type_: CUmemLocationType, id: i32) -> CUmemLocation {
    CUmemLocation { type_, id }
}

fn dev(id: i32) -> CUmemLocation {
    loc(T::CU_MEM_LOCATION_TYPE_DEVICE, id)
}

fn host() -> CUmemLocation {
    loc(T::CU_MEM_LOCATION_TYPE_HOST, 0)
}

fn managed(len: usize) -> CUdeviceptr {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; flags are CU_MEM_ATTACH_GLOBAL.
    unsafe { cu_call!(driver(), cuMemAllocManaged(&mut ptr, len, 1)) }.unwrap();
    ptr
}

fn free(ptr: CUdeviceptr) {
    // SAFETY: no host pointers.
    unsafe { cu_call!(driver(), cuMemFree_v2(ptr)) }.unwrap();
}

fn advise(ptr: CUdeviceptr, len: usize, advice: CUmem_advise, location: CUmemLocation) -> CUresult {
    // SAFETY: no host pointers.
    unsafe { code!(driver(), cuMemAdvise_v2(ptr, len, advice, location)) }
}

fn prefetch(ptr: CUdeviceptr, len: usize, location: CUmemLocation, flags: u32, s: CUstream) -> CUresult {
    // SAFETY: no host pointers.
    unsafe { code!(driver(), cuMemPrefetchAsync_v2(ptr, len, location, flags, s)) }
}

/// One 4-byte range attribute, or the error.
fn attr(ptr: CUdeviceptr, len: usize, attribute: CUmem_range_attribute) -> Result<i32, CUresult> {
    let mut value = 12345i32;
    // SAFETY: `value` is valid for 4 bytes of writes.
    let result =
        unsafe { code!(driver(), cuMemRangeGetAttribute((&raw mut value).cast::<c_void>(), 4, attribute, ptr, len)) };
    if result == OK { Ok(value) } else { Err(result) }
}

/// The legacy, type and id forms of the preferred location.
fn preferred(ptr: CUdeviceptr, len: usize) -> (i32, i32, i32) {
    three(
        ptr,
        len,
        [
            Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
            Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE,
            Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID,
        ],
    )
}

/// The legacy, type and id forms of the last prefetch location.
fn last_prefetch(ptr: CUdeviceptr, len: usize) -> (i32, i32, i32) {
    three(
        ptr,
        len,
        [
            Attr::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            Attr::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE,
            Attr::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID,
        ],
    )
}

/// Three 4-byte attributes in one `cuMemRangeGetAttributes`.
fn three(ptr: CUdeviceptr, len: usize, mut attributes: [CUmem_range_attribute; 3]) -> (i32, i32, i32) {
    let mut values = [7i32; 3];
    let mut data: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut i32).cast::<c_void>()).collect();
    let mut sizes = [4usize; 3];
    // SAFETY: three pointers, each valid for 4 bytes, and three sizes and attributes.
    unsafe {
        cu_call!(
            driver(),
            cuMemRangeGetAttributes(data.as_mut_ptr(), sizes.as_mut_ptr(), attributes.as_mut_ptr(), 3, ptr, len)
        )
    }
    .unwrap();
    (values[0], values[1], values[2])
}

fn accessed_by(ptr: CUdeviceptr, len: usize, slots: usize) -> Result<Vec<i32>, CUresult> {
    let mut ids = vec![99i32; slots.max(1)];
    // SAFETY: `ids` is valid for `slots * 4` bytes (at least 4).
    let result = unsafe {
        code!(
            driver(),
            cuMemRangeGetAttribute(
                ids.as_mut_ptr().cast(),
                slots * 4,
                Attr::CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY,
                ptr,
                len
            )
        )
    };
    if result == OK { Ok(ids) } else { Err(result) }
}

const DEVICE: i32 = T::CU_MEM_LOCATION_TYPE_DEVICE.0 as i32;
const HOST: i32 = T::CU_MEM_LOCATION_TYPE_HOST.0 as i32;
const HOST_NUMA: i32 = T::CU_MEM_LOCATION_TYPE_HOST_NUMA.0 as i32;
const NO_TYPE: i32 = T::CU_MEM_LOCATION_TYPE_INVALID.0 as i32;

#[test]
fn advice_applies_per_page_and_the_range_attributes_report_it() {
    use_device(0);
    let p = managed(3 * PAGE);
    let read_mostly = |ptr, len| attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY).unwrap();
    assert_eq!(read_mostly(p, 3 * PAGE), 0);
    // Two bytes in the middle page advise the whole page, and no other.
    assert_eq!(advise(p + PAGE as u64 + 100, 2, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), OK);
    assert_eq!(read_mostly(p + PAGE as u64, PAGE), 1);
    assert_eq!(read_mostly(p + PAGE as u64 + 4000, 1), 1);
    assert_eq!(read_mostly(p, 3 * PAGE), 0, "not every page is read-mostly");
    assert_eq!(advise(p, 3 * PAGE, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), OK);
    assert_eq!(read_mostly(p, 3 * PAGE), 1);
    assert_eq!(advise(p, 3 * PAGE, Advice::CU_MEM_ADVISE_UNSET_READ_MOSTLY, host()), OK);
    assert_eq!(read_mostly(p, 3 * PAGE), 0);

    // The preferred location in its three forms.
    assert_eq!(preferred(p, 3 * PAGE), (NONE, NO_TYPE, NONE));
    let set = Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
    assert_eq!(advise(p, 3 * PAGE, set, dev(0)), OK);
    assert_eq!(preferred(p, 3 * PAGE), (0, DEVICE, 0));
    assert_eq!(advise(p, PAGE, set, host()), OK);
    assert_eq!(preferred(p, PAGE), (CPU, HOST, NONE));
    assert_eq!(preferred(p, 2 * PAGE), (NONE, NO_TYPE, NONE), "the pages disagree");
    assert_eq!(advise(p, 3 * PAGE, set, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)), OK);
    assert_eq!(preferred(p, 3 * PAGE), (CPU, HOST_NUMA, 0));
    assert_eq!(advise(p, 3 * PAGE, Advice::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, dev(0)), OK);
    assert_eq!(preferred(p, 3 * PAGE), (NONE, NO_TYPE, NONE));
    // The calling thread's NUMA node is the simulated host's only one, 0.
    assert_eq!(advise(p, 3 * PAGE, set, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 77)), OK);
    assert_eq!(preferred(p, 3 * PAGE), (CPU, HOST_NUMA, 0));

    // Accessed-by: the processors advised for the whole range, padded with CU_DEVICE_INVALID.
    assert_eq!(accessed_by(p, 3 * PAGE, 3), Ok(vec![NONE; 3]));
    assert_eq!(advise(p, 3 * PAGE, Advice::CU_MEM_ADVISE_SET_ACCESSED_BY, dev(0)), OK);
    assert_eq!(advise(p, PAGE, Advice::CU_MEM_ADVISE_SET_ACCESSED_BY, host()), OK);
    assert_eq!(accessed_by(p, PAGE, 3), Ok(vec![0, CPU, NONE]));
    assert_eq!(accessed_by(p, 3 * PAGE, 3), Ok(vec![0, NONE, NONE]), "the host only for the first page");
    assert_eq!(accessed_by(p, PAGE, 1), Ok(vec![0]), "as many as fit");
    assert_eq!(advise(p, 3 * PAGE, Advice::CU_MEM_ADVISE_UNSET_ACCESSED_BY, dev(0)), OK);
    assert_eq!(accessed_by(p, PAGE, 2), Ok(vec![CPU, NONE]));
    free(p);
}

#[test]
fn advice_refuses_what_cuda_h_does() {
    use_device(0);
    let p = managed(100);
    let set_preferred = Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
    // The range is rounded out to the page: the rest of the last page is part of it.
    assert_eq!(advise(p, PAGE, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), OK);
    assert_eq!(advise(p, PAGE + 1, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), INVALID, "past the allocation");
    assert_eq!(advise(p, 0, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), INVALID, "zero count");
    assert_eq!(advise(p, 100, CUmem_advise(7), host()), INVALID, "unknown advice");
    assert_eq!(advise(p, 100, CUmem_advise(0), host()), INVALID, "unknown advice");
    // The location is ignored by the advice that does not use it.
    assert_eq!(advise(p, 100, Advice::CU_MEM_ADVISE_UNSET_READ_MOSTLY, loc(CUmemLocationType(99), -5)), OK);
    assert_eq!(advise(p, 100, Advice::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, loc(CUmemLocationType(99), 9)), OK);
    // Each advice's locations.
    assert_eq!(advise(p, 100, set_preferred, dev(1)), CUresult::CUDA_ERROR_INVALID_DEVICE);
    assert_eq!(advise(p, 100, set_preferred, dev(-1)), CUresult::CUDA_ERROR_INVALID_DEVICE);
    assert_eq!(advise(p, 100, set_preferred, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 1)), INVALID);
    assert_eq!(advise(p, 100, set_preferred, loc(T::CU_MEM_LOCATION_TYPE_INVALID, 0)), INVALID);
    assert_eq!(advise(p, 100, set_preferred, loc(CUmemLocationType(5), 0)), INVALID);
    for accessed in [Advice::CU_MEM_ADVISE_SET_ACCESSED_BY, Advice::CU_MEM_ADVISE_UNSET_ACCESSED_BY] {
        assert_eq!(advise(p, 100, accessed, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)), INVALID);
        assert_eq!(advise(p, 100, accessed, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0)), INVALID);
        assert_eq!(advise(p, 100, accessed, dev(3)), CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    assert_eq!(preferred(p, 100), (NONE, NO_TYPE, NONE), "no refused advice changed anything");
    assert_eq!(accessed_by(p, 100, 2), Ok(vec![NONE, NONE]));

    // Memory that is not managed: device, pinned host, pageable host, freed managed.
    let mut device = 0;
    let mut pinned: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        cu_call!(driver(), cuMemAlloc_v2(&mut device, PAGE)).unwrap();
        cu_call!(driver(), cuMemAllocHost_v2(&mut pinned, PAGE)).unwrap();
    }
    let pageable = vec![0u8; PAGE];
    for ptr in [device, pinned as u64, pageable.as_ptr() as u64, 0] {
        assert_eq!(advise(ptr, 16, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), INVALID, "{ptr:#x}");
        assert_eq!(prefetch(ptr, 16, host(), 0, NULL_STREAM), INVALID, "{ptr:#x}");
        assert_eq!(attr(ptr, 16, Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), Err(INVALID), "{ptr:#x}");
    }
    // SAFETY: both were allocated above.
    unsafe {
        cu_call!(driver(), cuMemFree_v2(device)).unwrap();
        cu_call!(driver(), cuMemFreeHost(pinned)).unwrap();
    }
    free(p);

    // Without a current context.
    let q = managed(16) as usize;
    let without_context = on_fresh_thread(move || {
        (
            advise(q as u64, 16, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()),
            attr(q as u64, 16, Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY),
        )
    });
    assert_eq!(without_context, (CUresult::CUDA_ERROR_INVALID_CONTEXT, Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)));
    free(q as u64);
}

/// In a process of its own: another test's thread could allocate at the freed address
/// between the free and the advice.
#[test]
fn advice_on_freed_memory_is_refused() {
    in_child!(&[], || {
        use_device(0);
        let p = managed(100);
        free(p);
        assert_eq!(advise(p, 16, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), INVALID, "freed");
    });
}

#[test]
fn range_queries_check_their_sizes_and_attributes() {
    use_device(0);
    let p = managed(PAGE);
    let mut value = 0i32;
    let out = (&raw mut value).cast::<c_void>();
    let get = |size, attribute| {
        // SAFETY: `out` is valid for 4 bytes; every size above 4 is refused before a write.
        unsafe { code!(driver(), cuMemRangeGetAttribute(out, size, attribute, p, PAGE)) }
    };
    for attribute in (1..=8).map(CUmem_range_attribute).filter(|&a| a != Attr::CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY) {
        assert_eq!(get(4, attribute), OK, "{attribute:?}");
        assert_eq!(get(8, attribute), INVALID, "{attribute:?}");
        assert_eq!(get(2, attribute), INVALID, "{attribute:?}");
    }
    for size in [0, 2, 6] {
        assert_eq!(get(size, Attr::CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY), INVALID, "{size} bytes");
    }
    assert_eq!(get(4, CUmem_range_attribute(9)), INVALID);
    assert_eq!(get(4, CUmem_range_attribute(0)), INVALID);
    // SAFETY: null data is refused.
    let null = unsafe {
        code!(driver(), cuMemRangeGetAttribute(std::ptr::null_mut(), 4, Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4))
    };
    assert_eq!(null, INVALID);
    assert_eq!(attr(p, 0, Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), Err(INVALID));

    // Several at once: one bad entry and nothing is written.
    let (mut first, mut second) = (55i32, 66i32);
    let mut data = [(&raw mut first).cast::<c_void>(), (&raw mut second).cast::<c_void>()];
    let mut attributes = [Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION];
    let mut sizes = [4usize, 8];
    let mut get_both = |n: usize| {
        // SAFETY: two pointers, each valid for 4 bytes; the 8-byte size is refused before writing.
        unsafe {
            code!(
                driver(),
                cuMemRangeGetAttributes(data.as_mut_ptr(), sizes.as_mut_ptr(), attributes.as_mut_ptr(), n, p, PAGE)
            )
        }
    };
    assert_eq!(get_both(2), INVALID);
    assert_eq!(get_both(0), INVALID);
    assert_eq!((first, second), (55, 66));
    sizes[1] = 4;
    let mut get_both = |n: usize| {
        // SAFETY: as above, both sizes now 4.
        unsafe {
            code!(
                driver(),
                cuMemRangeGetAttributes(data.as_mut_ptr(), sizes.as_mut_ptr(), attributes.as_mut_ptr(), n, p, PAGE)
            )
        }
    };
    assert_eq!(get_both(2), OK);
    assert_eq!((first, second), (0, NONE));
    free(p);
}

#[test]
fn managed_pool_memory_takes_advice_and_pinned_pool_memory_does_not() {
    use_device(0);
    let s = non_blocking_stream();
    let pool = |kind, location| {
        let props = CUmemPoolProps {
            allocType: kind,
            handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location,
            ..CUmemPoolProps::default()
        };
        let mut pool: CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer and properties.
        unsafe { cu_call!(driver(), cuMemPoolCreate(&mut pool, &props)) }.unwrap();
        let mut ptr = 0;
        // SAFETY: valid out-pointer; the pool and stream are live.
        unsafe { cu_call!(driver(), cuMemAllocFromPoolAsync(&mut ptr, 2 * PAGE, pool, s)) }.unwrap();
        (pool, ptr)
    };
    let (managed_pool, m) =
        pool(CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED, loc(T::CU_MEM_LOCATION_TYPE_NONE, 0));
    let (pinned_pool, h) = pool(CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED, host());
    assert_eq!(advise(m, 2 * PAGE, Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev(0)), OK);
    assert_eq!(preferred(m, 2 * PAGE), (0, DEVICE, 0));
    assert_eq!(prefetch(m, 2 * PAGE, host(), 0, s), OK);
    assert_eq!(last_prefetch(m, 2 * PAGE), (CPU, HOST, NONE));
    assert_eq!(advise(h, PAGE, Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, host()), INVALID);
    // SAFETY: both were allocated above on `s`; then the pools are destroyed.
    unsafe {
        cu_call!(driver(), cuMemFreeAsync(m, s)).unwrap();
        cu_call!(driver(), cuMemFreeAsync(h, s)).unwrap();
        cu_call!(driver(), cuStreamSynchronize(s)).unwrap();
        cu_call!(driver(), cuMemPoolDestroy(managed_pool)).unwrap();
        cu_call!(driver(), cuMemPoolDestroy(pinned_pool)).unwrap();
        cu_call!(driver(), cuStreamDestroy_v2(s)).unwrap();
    }
}

#[test]
fn prefetches_run_in_stream_order_and_record_the_last_location() {
    use_device(0);
    let p = managed(2 * PAGE);
    let s = non_blocking_stream();
    assert_eq!(last_prefetch(p, 2 * PAGE), (NONE, NO_TYPE, NONE), "never prefetched");
    let (gate, _open) = Gate::new();
    hold(gate, driver(), s);
    assert_eq!(prefetch(p, 2 * PAGE, dev(0), 0, s), OK);
    assert_eq!(query(s), CUresult::CUDA_ERROR_NOT_READY, "the prefetch waits behind the held work");
    // What the application asked for is reported at once, as documented.
    assert_eq!(last_prefetch(p, 2 * PAGE), (0, DEVICE, 0));
    gate.open();
    sync(s);
    assert_eq!(prefetch(p, 1, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0), 0, s), OK);
    assert_eq!(last_prefetch(p, PAGE), (CPU, HOST_NUMA, 0));
    assert_eq!(last_prefetch(p, 2 * PAGE), (NONE, NO_TYPE, NONE), "the pages went to different places");
    // The legacy NULL stream is allowed for a single prefetch.
    assert_eq!(prefetch(p, 2 * PAGE, host(), 0, NULL_STREAM), OK);
    assert_eq!(last_prefetch(p, 2 * PAGE), (CPU, HOST, NONE));
    sync(NULL_STREAM);
    // Errors: flags, locations, the stream, the range.
    assert_eq!(prefetch(p, PAGE, host(), 1, s), INVALID);
    assert_eq!(prefetch(p, PAGE, dev(4), 0, s), CUresult::CUDA_ERROR_INVALID_DEVICE);
    assert_eq!(prefetch(p, PAGE, loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 2), 0, s), INVALID);
    assert_eq!(prefetch(p, PAGE, loc(T::CU_MEM_LOCATION_TYPE_INVALID, 0), 0, s), INVALID);
    assert_eq!(prefetch(p, PAGE, host(), 0, 0xdead_0000 as CUstream), CUresult::CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(prefetch(p, 0, host(), 0, s), INVALID);
    assert_eq!(prefetch(p, 2 * PAGE + 1, host(), 0, s), INVALID);
    assert_eq!(last_prefetch(p, 2 * PAGE), (CPU, HOST, NONE), "no refused prefetch was recorded");
    free(p);
    // SAFETY: the stream was created above.
    unsafe { cu_call!(driver(), cuStreamDestroy_v2(s)) }.unwrap();
}

/// A batch call: prefetch (`discard` false), discard (`locations` empty), or both.
fn batch(
    ptrs: &[CUdeviceptr],
    sizes: &[usize],
    locations: &[CUmemLocation],
    first: &[usize],
    discard: bool,
    flags: u64,
    s: CUstream,
) -> CUresult {
    let (mut ptrs, mut sizes, mut locations, mut first) =
        (ptrs.to_vec(), sizes.to_vec(), locations.to_vec(), first.to_vec());
    let count = ptrs.len();
    let (p, z, l, f) = (ptrs.as_mut_ptr(), sizes.as_mut_ptr(), locations.as_mut_ptr(), first.as_mut_ptr());
    let n = locations.len();
    // SAFETY: each array is valid for its length, which is what is passed (or the call refuses).
    unsafe {
        match (discard, n) {
            (true, 0) => code!(driver(), cuMemDiscardBatchAsync(p, z, count, flags, s)),
            (true, _) => code!(driver(), cuMemDiscardAndPrefetchBatchAsync(p, z, count, l, f, n, flags, s)),
            (false, _) => code!(driver(), cuMemPrefetchBatchAsync(p, z, count, l, f, n, flags, s)),
        }
    }
}

/// Reads `len` bytes of managed memory on the host.
fn read(ptr: CUdeviceptr, len: usize) -> Vec<u8> {
    // SAFETY: managed memory is host-accessible here and the tests read it only when no stream
    // writes it.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec()
}

fn write(ptr: CUdeviceptr, value: u8, len: usize) {
    // SAFETY: as in `read`.
    unsafe { (ptr as *mut u8).write_bytes(value, len) };
}

#[test]
fn batched_prefetches_take_one_location_per_run_of_operations() {
    use_device(0);
    let s = non_blocking_stream();
    let bufs: Vec<CUdeviceptr> = (0..3).map(|_| managed(PAGE)).collect();
    let sizes = [PAGE; 3];
    // Buffers 0 and 1 to the device, 2 to the host.
    assert_eq!(batch(&bufs, &sizes, &[dev(0), host()], &[0, 2], false, 0, s), OK);
    assert_eq!([0, 1, 2].map(|i| last_prefetch(bufs[i], PAGE).1), [DEVICE, DEVICE, HOST]);
    // One location for all.
    assert_eq!(batch(&bufs, &sizes, &[loc(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)], &[0], false, 0, s), OK);
    assert_eq!([0, 1, 2].map(|i| last_prefetch(bufs[i], PAGE).1), [HOST_NUMA; 3]);
    sync(s);
    bufs.into_iter().for_each(free);
    // SAFETY: the stream was created above.
    unsafe { cu_call!(driver(), cuStreamDestroy_v2(s)) }.unwrap();
}

#[test]
fn discards_overwrite_whole_pages_in_stream_order() {
    use_device(0);
    let s = non_blocking_stream();
    let a = managed(3 * PAGE);
    let b = managed(PAGE);
    write(a, 0x11, 3 * PAGE);
    write(b, 0x22, PAGE);
    let (gate, _open) = Gate::new();
    hold(gate, driver(), s);
    // Two bytes of a's middle page discard that page; all of b, and b prefetched to the host.
    assert_eq!(batch(&[a + PAGE as u64 + 10, b], &[2, PAGE], &[], &[], true, 0, s), OK);
    assert_eq!(read(a, 3 * PAGE), vec![0x11; 3 * PAGE], "not yet: the discard waits for the stream");
    gate.open();
    sync(s);
    let after = read(a, 3 * PAGE);
    assert_eq!(after[..PAGE], [0x11; PAGE]);
    assert_eq!(after[PAGE..2 * PAGE], [DISCARDED; PAGE]);
    assert_eq!(after[2 * PAGE..], [0x11; PAGE]);
    assert_eq!(read(b, PAGE), vec![DISCARDED; PAGE]);
    assert_eq!(last_prefetch(b, PAGE), (NONE, NO_TYPE, NONE), "a discard alone prefetches nothing");
    // Discard and prefetch: both.
    write(b, 0x33, PAGE);
    assert_eq!(batch(&[b], &[PAGE], &[dev(0)], &[0], true, 0, s), OK);
    sync(s);
    assert_eq!(read(b, PAGE), vec![DISCARDED; PAGE]);
    assert_eq!(last_prefetch(b, PAGE), (0, DEVICE, 0));
    free(a);
    free(b);
    // SAFETY: the stream was created above.
    unsafe { cu_call!(driver(), cuStreamDestroy_v2(s)) }.unwrap();
}

#[test]
fn batches_refuse_bad_arguments_before_doing_anything() {
    use_device(0);
    let s = non_blocking_stream();
    let a = managed(PAGE);
    let b = managed(PAGE);
    write(a, 0x44, PAGE);
    let mut device = 0;
    // SAFETY: valid out-pointer.
    unsafe { cu_call!(driver(), cuMemAlloc_v2(&mut device, PAGE)) }.unwrap();
    let both = [a, b];
    let sizes = [PAGE; 2];
    let h = [host()];
    for discard in [false, true] {
        // Prefetching batches need at least one location; a pure discard takes none.
        let (locations, first): (&[CUmemLocation], &[usize]) = if discard { (&[], &[]) } else { (&h, &[0]) };
        assert_eq!(batch(&[], &[], locations, first, discard, 0, s), INVALID, "empty");
        assert_eq!(batch(&both, &sizes, locations, first, discard, 1, s), INVALID, "flags");
        assert_eq!(batch(&both, &[PAGE, 0], locations, first, discard, 0, s), INVALID, "a zero size");
        assert_eq!(batch(&[a, device], &sizes, locations, first, discard, 0, s), INVALID, "not managed");
        assert_eq!(batch(&both, &sizes, locations, first, discard, 0, NULL_STREAM), INVALID, "legacy NULL stream");
        assert_eq!(batch(&both, &sizes, locations, first, discard, 0, STREAM_LEGACY), INVALID, "legacy stream");
    }
    for discard in [false, true] {
        let tables: [(&[CUmemLocation], &[usize]); 5] = [
            (&[], &[]),
            (&[host(), host(), host()], &[0, 1, 1]),
            (&[host()], &[1]),
            (&[host(), host()], &[0, 0]),
            (&[host(), host()], &[0, 2]),
        ];
        for (locations, first) in tables {
            if discard && locations.is_empty() {
                continue;
            }
            assert_eq!(batch(&both, &sizes, locations, first, discard, 0, s), INVALID, "{first:?}");
        }
        assert_eq!(
            batch(&both, &sizes, &[dev(0), dev(7)], &[0, 1], discard, 0, s),
            CUresult::CUDA_ERROR_INVALID_DEVICE
        );
    }
    sync(s);
    assert_eq!(read(a, PAGE), vec![0x44; PAGE], "nothing was discarded");
    assert_eq!(last_prefetch(a, PAGE), (NONE, NO_TYPE, NONE), "nothing was recorded");
    free(a);
    free(b);
    free(device);
    // SAFETY: the stream was created above.
    unsafe { cu_call!(driver(), cuStreamDestroy_v2(s)) }.unwrap();
}

#[test]
fn per_thread_variants_take_handle_0_as_the_per_thread_stream() {
    use_device(0);
    let d = common::per_thread_driver();
    let p = managed(PAGE);
    let (mut ptrs, mut sizes, mut locations, mut first) = ([p], [PAGE], [host()], [0usize]);
    // SAFETY: one-element arrays, as passed.
    unsafe {
        cu_call!(d, cuMemPrefetchAsync_v2(p, PAGE, dev(0), 0, NULL_STREAM)).unwrap();
        let (a, b, c, e) = (ptrs.as_mut_ptr(), sizes.as_mut_ptr(), locations.as_mut_ptr(), first.as_mut_ptr());
        cu_call!(d, cuMemPrefetchBatchAsync(a, b, 1, c, e, 1, 0, NULL_STREAM)).unwrap();
        cu_call!(d, cuMemDiscardBatchAsync(a, b, 1, 0, NULL_STREAM)).unwrap();
        cu_call!(d, cuStreamSynchronize(NULL_STREAM)).unwrap();
    }
    assert_eq!(last_prefetch(p, PAGE), (CPU, HOST, NONE));
    assert_eq!(read(p, PAGE), vec![DISCARDED; PAGE]);
    free(p);
}

#[test]
fn without_concurrent_managed_access_devices_are_refused() {
    in_child!(&[("CUDA_SIM_DEVICE_ATTRIBUTES", "89=0")], || {
        use_device(0);
        let s = non_blocking_stream();
        let p = managed(PAGE);
        let set_preferred = Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
        assert_eq!(advise(p, PAGE, set_preferred, dev(0)), CUresult::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(advise(p, PAGE, Advice::CU_MEM_ADVISE_SET_ACCESSED_BY, dev(0)), CUresult::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(prefetch(p, PAGE, dev(0), 0, s), CUresult::CUDA_ERROR_INVALID_DEVICE);
        // The host is still a place to prefer and prefetch to.
        assert_eq!(advise(p, PAGE, set_preferred, host()), OK);
        assert_eq!(prefetch(p, PAGE, host(), 0, s), OK);
        assert_eq!(batch(&[p], &[PAGE], &[host()], &[0], false, 0, s), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(batch(&[p], &[PAGE], &[], &[], true, 0, s), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(batch(&[p], &[PAGE], &[host()], &[0], true, 0, s), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        sync(s);
    });
}

#[test]
fn the_driver_version_13_entry_points_resolve() {
    let d = init();
    for name in [c"cuMemAdvise", c"cuMemPrefetchAsync", c"cuMemPrefetchBatchAsync", c"cuMemDiscardBatchAsync"] {
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status = cuda_mem_sys::types::CUdriverProcAddressQueryResult(99);
        // SAFETY: a NUL-terminated name and valid out-pointers.
        unsafe { cu_call!(d, cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 13000, 0, &mut status)) }.unwrap();
        assert!(!pfn.is_null(), "{name:?}");
    }
}

/// CUDA 8.0's `cuMemAdvise` and `cuMemPrefetchAsync`, which a driver before 12.2 offers instead
/// of the `CUmemLocation` forms: a device ordinal, or `CU_DEVICE_CPU` for the host; an invalid
/// device is `CUDA_ERROR_INVALID_DEVICE`. That driver also knows only the untyped range
/// attributes.
#[test]
fn cuda_8_0_s_advice_and_prefetch_take_a_device_ordinal() {
    in_child!(&[("CUDA_SIM_DRIVER_VERSION", "12000")], || {
        use cuda_mem_sys::types::CUdriverProcAddress_flags as F;
        let d = driver();
        use_device(0);
        // Through cuGetProcAddress_v2 at the old version, legacy and per-thread, as a loader asks.
        let lookup = |name: &std::ffi::CStr, flags: F| {
            let mut pfn: *mut c_void = std::ptr::null_mut();
            // SAFETY: the name is NUL-terminated; the out-pointer is valid; status may be null.
            let r = unsafe {
                code!(d, cuGetProcAddress_v2(name.as_ptr(), &mut pfn, 8000, u64::from(flags.0), std::ptr::null_mut()))
            };
            assert_eq!(r, OK, "{name:?}");
            pfn as usize
        };
        let exported = |name: &'static std::ffi::CStr| d.library_symbol(name).expect("exported") as usize;
        assert_eq!(lookup(c"cuMemAdvise", F::CU_GET_PROC_ADDRESS_LEGACY_STREAM), exported(c"cuMemAdvise"));
        assert_eq!(
            lookup(c"cuMemPrefetchAsync", F::CU_GET_PROC_ADDRESS_LEGACY_STREAM),
            exported(c"cuMemPrefetchAsync")
        );
        assert_eq!(
            lookup(c"cuMemPrefetchAsync", F::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            exported(c"cuMemPrefetchAsync_ptsz")
        );
        assert_eq!(d.cuMemAdvise_v1().unwrap() as usize, exported(c"cuMemAdvise"));

        let len = 2 * PAGE;
        let ptr = managed(len);
        let s = non_blocking_stream();
        let advise_v1 = |advice: CUmem_advise, device: i32| {
            // SAFETY: no host pointers.
            unsafe { code!(d, cuMemAdvise_v1(ptr, len, advice, device)) }
        };
        let prefetch_v1 = |device: i32| {
            // SAFETY: no host pointers.
            unsafe { code!(d, cuMemPrefetchAsync_v1(ptr, len, device, s)) }
        };
        assert_eq!(advise_v1(Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, CPU), OK);
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION), Ok(CPU));
        assert_eq!(advise_v1(Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, 0), OK);
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION), Ok(0));
        assert_eq!(advise_v1(Advice::CU_MEM_ADVISE_SET_ACCESSED_BY, CPU), OK);
        let invalid_device = CUresult::CUDA_ERROR_INVALID_DEVICE;
        assert_eq!(advise_v1(Advice::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, 7), invalid_device);
        assert_eq!(advise_v1(Advice::CU_MEM_ADVISE_SET_ACCESSED_BY, NONE), invalid_device);
        // The device is ignored where the advice takes none.
        assert_eq!(advise_v1(Advice::CU_MEM_ADVISE_SET_READ_MOSTLY, NONE), OK);
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY), Ok(1));
        assert_eq!(prefetch_v1(0), OK);
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION), Ok(0));
        assert_eq!(prefetch_v1(CPU), OK);
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION), Ok(CPU));
        assert_eq!(prefetch_v1(3), invalid_device);
        // CUDA 12.2's typed attributes are unknown to this driver.
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE), Err(INVALID));
        assert_eq!(attr(ptr, len, Attr::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID), Err(INVALID));
        sync(s);
        free(ptr);
    });
}
