//! Copies with attributes: `cuMemcpyBatchAsync` (CUDA 13.0's `_v2`) and
//! `cuMemcpyWithAttributesAsync` (CUDA 13.2, offered when `CUDA_SIM_DRIVER_VERSION` says so),
//! each error they return, and what the source access order lets a caller observe.

mod common;

use std::ffi::{CStr, c_void};

use common::{
    DeviceBuffer, Gate, NULL_STREAM, Pinned, STREAM_LEGACY, code, driver, hold, in_child, memset_async,
    non_blocking_stream, per_thread_driver, query, sync, use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{
    CUdeviceptr, CUdriverProcAddressQueryResult, CUgraph, CUmemLocation, CUmemLocationType, CUmemcpyAttributes,
    CUmemcpySrcAccessOrder, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
};

const OK: CUresult = CUresult::CUDA_SUCCESS;
const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;

use CUmemcpySrcAccessOrder as Order;

fn attrs(order: CUmemcpySrcAccessOrder) -> CUmemcpyAttributes {
    CUmemcpyAttributes { srcAccessOrder: order, ..Default::default() }
}

fn stream_order() -> CUmemcpyAttributes {
    attrs(Order::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM)
}

/// `cuMemcpyBatchAsync` through the legacy driver, with the arrays as slices (null when empty).
fn batch_on(
    d: &cuda_mem_sys::Driver,
    dsts: &[CUdeviceptr],
    srcs: &[CUdeviceptr],
    sizes: &[usize],
    attributes: &[CUmemcpyAttributes],
    first: &[usize],
    s: CUstream,
) -> CUresult {
    fn ptr<T>(slice: &[T]) -> *mut T {
        if slice.is_empty() { std::ptr::null_mut() } else { slice.as_ptr().cast_mut() }
    }
    let (dsts_p, srcs_p, sizes_p, attrs_p, first_p) = (ptr(dsts), ptr(srcs), ptr(sizes), ptr(attributes), ptr(first));
    // SAFETY: each pointer is null or valid for its slice's length, which the counts give; the
    // host memory copied is pinned memory the tests keep alive until they synchronize.
    unsafe {
        code!(d, cuMemcpyBatchAsync_v2(dsts_p, srcs_p, sizes_p, dsts.len(), attrs_p, first_p, attributes.len(), s))
    }
}

fn batch(
    dsts: &[CUdeviceptr],
    srcs: &[CUdeviceptr],
    sizes: &[usize],
    attributes: &[CUmemcpyAttributes],
    first: &[usize],
    s: CUstream,
) -> CUresult {
    batch_on(driver(), dsts, srcs, sizes, attributes, first, s)
}

/// One copy with one set of attributes.
fn one(dst: CUdeviceptr, src: CUdeviceptr, len: usize, attr: CUmemcpyAttributes, s: CUstream) -> CUresult {
    batch(&[dst], &[src], &[len], &[attr], &[0], s)
}

fn capture_status(s: CUstream) -> CUstreamCaptureStatus {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamIsCapturing(s, &mut status)) }.unwrap();
    status
}

fn destroy(s: CUstream) {
    // SAFETY: the tests destroy only streams they created.
    unsafe { cu_call!(driver(), cuStreamDestroy_v2(s)) }.unwrap();
}

#[test]
fn a_batch_copies_every_pair_in_stream_order() {
    use_device(0);
    let s = non_blocking_stream();
    let a = DeviceBuffer::with(&[1; 64]);
    let b = DeviceBuffer::new(64);
    let host = Pinned::new(32);
    host.write(&[7; 32]);
    let back = Pinned::new(16);
    let (gate, _open) = Gate::new();
    hold(gate, driver(), s);
    // Device to device, pinned host to device, device to pinned host; two attribute runs.
    let during = attrs(Order::CU_MEMCPY_SRC_ACCESS_ORDER_ANY);
    let r = batch(
        &[b.ptr, b.ptr + 32, back.dptr()],
        &[a.ptr, host.dptr(), a.ptr + 16],
        &[32, 32, 16],
        &[stream_order(), during],
        &[0, 1],
        s,
    );
    assert_eq!(r, OK);
    assert_eq!(query(s), CUresult::CUDA_ERROR_NOT_READY, "the batch waits behind the held work");
    assert_eq!(back.read(), vec![0; 16], "nothing copied before the stream reaches the batch");
    gate.open();
    sync(s);
    let mut expected = vec![1; 32];
    expected.extend([7; 32]);
    assert_eq!(b.read(), expected);
    assert_eq!(back.read(), vec![1; 16]);
    destroy(s);
}

#[test]
fn during_api_call_reads_the_source_before_returning() {
    use_device(0);
    let s = non_blocking_stream();
    let src = Pinned::new(16);
    let (stream_dst, during_dst) = (DeviceBuffer::new(16), DeviceBuffer::new(16));
    src.fill(1);
    let (gate, _open) = Gate::new();
    hold(gate, driver(), s);
    assert_eq!(one(during_dst.ptr, src.dptr(), 16, attrs(Order::CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL), s), OK);
    assert_eq!(one(stream_dst.ptr, src.dptr(), 16, stream_order(), s), OK);
    // The source may be reused at once after a DURING_API_CALL copy, not after a STREAM one.
    src.fill(2);
    gate.open();
    sync(s);
    assert_eq!(during_dst.read(), vec![1; 16], "read during the call");
    assert_eq!(stream_dst.read(), vec![2; 16], "read in stream order");
    destroy(s);
}

#[test]
fn any_order_reads_the_source_at_the_call_before_earlier_work_writes_it() {
    // ANY allows reads out of stream order: the simulator takes the earliest, so a source that
    // work enqueued before the copy still writes is read as it was, not as that work leaves it.
    use_device(0);
    let s = non_blocking_stream();
    let (src, dst) = (DeviceBuffer::new(16), DeviceBuffer::new(16));
    let (gate, _open) = Gate::new();
    memset_async(src.ptr, 1, 16, s);
    sync(s);
    hold(gate, driver(), s);
    memset_async(src.ptr, 2, 16, s);
    assert_eq!(one(dst.ptr, src.ptr, 16, attrs(Order::CU_MEMCPY_SRC_ACCESS_ORDER_ANY), s), OK);
    gate.open();
    sync(s);
    assert_eq!(dst.read(), vec![1; 16], "read at the call, before the held memset");
    destroy(s);
}

#[test]
fn a_pageable_source_and_destination_work_as_with_cu_memcpy_async() {
    use_device(0);
    let s = non_blocking_stream();
    let src = vec![5u8; 64];
    let dev = DeviceBuffer::new(64);
    assert_eq!(one(dev.ptr, src.as_ptr() as CUdeviceptr, 64, stream_order(), s), OK);
    let mut back = vec![0u8; 64];
    // Into pageable memory: done when the call returns, as cuMemcpyAsync.
    assert_eq!(one(back.as_mut_ptr() as CUdeviceptr, dev.ptr, 64, stream_order(), s), OK);
    assert_eq!(back, src);
    destroy(s);
}

#[test]
fn the_per_thread_default_stream_is_accepted_the_legacy_one_is_not() {
    use_device(0);
    let (a, b) = (DeviceBuffer::with(&[3; 8]), DeviceBuffer::new(8));
    let copy =
        |d: &cuda_mem_sys::Driver, s: CUstream| batch_on(d, &[b.ptr], &[a.ptr], &[8], &[stream_order()], &[0], s);
    assert_eq!(copy(driver(), NULL_STREAM), INVALID, "handle 0 is the legacy stream here");
    assert_eq!(copy(driver(), STREAM_LEGACY), INVALID);
    assert_eq!(copy(per_thread_driver(), STREAM_LEGACY), INVALID);
    assert_eq!(copy(per_thread_driver(), NULL_STREAM), OK, "handle 0 is the per-thread stream here");
    assert_eq!(copy(driver(), common::STREAM_PER_THREAD), OK);
    sync(common::STREAM_PER_THREAD);
    assert_eq!(b.read(), vec![3; 8]);
}

#[test]
fn malformed_arguments_are_invalid_values() {
    use_device(0);
    let s = non_blocking_stream();
    let (a, b) = (DeviceBuffer::with(&[9; 64]), DeviceBuffer::new(64));
    let st = stream_order();
    let two = ([b.ptr, b.ptr + 32], [a.ptr, a.ptr + 32], [32usize, 32]);
    // Null arrays and an empty batch.
    assert_eq!(batch(&[], &[], &[], &[st], &[0], s), INVALID, "count 0");
    assert_eq!(batch(&two.0, &two.1, &[], &[st], &[0], s), INVALID, "null sizes");
    // SAFETY: null arrays, which the call must refuse before reading anything.
    let nulls = unsafe {
        code!(
            driver(),
            cuMemcpyBatchAsync_v2(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                1,
                s
            )
        )
    };
    assert_eq!(nulls, INVALID);
    // The attribute table: present, at most one entry per copy, starting at 0, increasing,
    // inside the batch.
    assert_eq!(batch(&two.0, &two.1, &two.2, &[], &[], s), INVALID, "no attributes");
    assert_eq!(batch(&[b.ptr], &[a.ptr], &[8], &[st, st], &[0, 1], s), INVALID, "more attributes than copies");
    assert_eq!(batch(&two.0, &two.1, &two.2, &[st], &[1], s), INVALID, "first index not 0");
    assert_eq!(batch(&two.0, &two.1, &two.2, &[st, st], &[0, 0], s), INVALID, "indices not increasing");
    assert_eq!(
        batch(&[b.ptr, b.ptr + 16, b.ptr + 32], &[a.ptr; 3], &[8; 3], &[st, st, st], &[0, 2, 1], s),
        INVALID,
        "indices decreasing"
    );
    assert_eq!(batch(&two.0, &two.1, &two.2, &[st, st], &[0, 2], s), INVALID, "an index past the last copy");
    // Each attribute: a valid access order, known flags, real locations.
    for order in [Order::CU_MEMCPY_SRC_ACCESS_ORDER_INVALID, Order(4), Order::CU_MEMCPY_SRC_ACCESS_ORDER_MAX] {
        assert_eq!(one(b.ptr, a.ptr, 8, attrs(order), s), INVALID, "{order:?}");
    }
    assert_eq!(one(b.ptr, a.ptr, 8, CUmemcpyAttributes { flags: 2, ..st }, s), INVALID, "unknown flag");
    assert_eq!(one(b.ptr, a.ptr, 8, CUmemcpyAttributes { flags: 1, ..st }, s), OK, "prefer overlap");
    let hint = |type_, id| CUmemLocation { type_, id };
    use CUmemLocationType as T;
    for bad in [hint(T::CU_MEM_LOCATION_TYPE_DEVICE, 99), hint(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 1), hint(T(99), 0)] {
        assert_eq!(one(b.ptr, a.ptr, 8, CUmemcpyAttributes { srcLocHint: bad, ..st }, s), INVALID, "{bad:?}");
        assert_eq!(one(b.ptr, a.ptr, 8, CUmemcpyAttributes { dstLocHint: bad, ..st }, s), INVALID, "{bad:?}");
    }
    for good in [
        hint(T::CU_MEM_LOCATION_TYPE_DEVICE, 0),
        hint(T::CU_MEM_LOCATION_TYPE_HOST, 0),
        hint(T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 0),
        hint(T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0),
    ] {
        let attr = CUmemcpyAttributes { srcLocHint: good, dstLocHint: good, ..st };
        assert_eq!(one(b.ptr, a.ptr, 8, attr, s), OK, "{good:?}");
    }
    // Sizes and ranges: inside live allocations, not zero.
    assert_eq!(one(b.ptr, a.ptr, 0, st, s), INVALID, "a zero-byte copy");
    assert_eq!(one(b.ptr, a.ptr, 65, st, s), INVALID, "past the source's end");
    assert_eq!(one(b.ptr + 8, a.ptr, 64, st, s), INVALID, "past the destination's end");
    assert_eq!(one(0, a.ptr, 8, st, s), INVALID, "a null destination");
    let freed = DeviceBuffer::new(64);
    let stale = freed.ptr;
    drop(freed);
    assert_eq!(one(b.ptr, stale, 8, st, s), INVALID, "a freed source");
    // A stream that does not exist.
    assert_eq!(one(b.ptr, a.ptr, 8, st, 0xdead_0000 as CUstream), CUresult::CUDA_ERROR_INVALID_HANDLE);
    sync(s);
    destroy(s);
}

#[test]
fn dependent_copies_are_refused_and_a_refused_batch_copies_nothing() {
    use_device(0);
    let s = non_blocking_stream();
    let (a, b) = (DeviceBuffer::with(&[4; 64]), DeviceBuffer::with(&[0; 64]));
    let st = stream_order();
    let dependent = [
        // Two destinations share bytes.
        ([b.ptr, b.ptr + 8], [a.ptr, a.ptr + 32]),
        // One copy writes what another reads.
        ([b.ptr, a.ptr + 40], [a.ptr + 32, b.ptr + 4]),
    ];
    for (dsts, srcs) in dependent {
        assert_eq!(batch(&dsts, &srcs, &[16, 16], &[st], &[0], s), INVALID, "{dsts:x?} {srcs:x?}");
    }
    // The first copy is fine, the second reads past its allocation: nothing is copied.
    assert_eq!(batch(&[b.ptr, b.ptr + 32], &[a.ptr, a.ptr + 60], &[16, 16], &[st], &[0], s), INVALID);
    // Shared sources, and a copy whose own ranges overlap, are fine.
    assert_eq!(batch(&[b.ptr, b.ptr + 16], &[a.ptr, a.ptr], &[16, 16], &[st], &[0], s), OK);
    assert_eq!(one(a.ptr, a.ptr + 8, 16, st, s), OK);
    sync(s);
    let mut expected = vec![4; 32];
    expected.extend([0; 32]);
    assert_eq!(b.read(), expected, "only the accepted batch copied");
    destroy(s);
}

#[test]
fn a_capturing_stream_refuses_the_batch_and_stays_capturing() {
    use_device(0);
    let s = non_blocking_stream();
    let (a, b) = (DeviceBuffer::with(&[6; 16]), DeviceBuffer::with(&[0; 16]));
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)) }
        .unwrap();
    assert_eq!(one(b.ptr, a.ptr, 16, stream_order(), s), CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(capture_status(s), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "the capture survives");
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamEndCapture(s, &mut graph)) }.unwrap();
    assert!(!graph.is_null());
    // SAFETY: the graph was just made and is destroyed once.
    unsafe { cu_call!(driver(), cuGraphDestroy(graph)) }.unwrap();
    sync(s);
    assert_eq!(b.read(), vec![0; 16], "nothing was copied");
    destroy(s);
}

/// What `cuGetProcAddress_v2` answers for `symbol` at `version` (legacy stream).
fn proc_address(symbol: &CStr, version: i32) -> (CUresult, CUdriverProcAddressQueryResult) {
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status = CUdriverProcAddressQueryResult(0);
    // SAFETY: `symbol` is NUL-terminated; `pfn` and `status` are valid out-pointers.
    let r = unsafe { code!(driver(), cuGetProcAddress_v2(symbol.as_ptr(), &mut pfn, version, 1, &mut status)) };
    (r, status)
}

fn driver_version() -> i32 {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuDriverGetVersion(&mut version)) }.unwrap();
    version
}

/// `cuMemcpyWithAttributesAsync` (resolved by `dlsym` where `cuGetProcAddress` refuses it).
fn with_attributes(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    attr: *mut CUmemcpyAttributes,
    s: CUstream,
) -> CUresult {
    // SAFETY: `attr` is null or points at one set of attributes; the memory is the test's own.
    unsafe { code!(driver(), cuMemcpyWithAttributesAsync(dst, src, len, attr, s)) }
}

#[test]
fn a_cuda_13_0_driver_has_no_memcpy_with_attributes() {
    use_device(0);
    assert_eq!(driver_version(), 13000);
    use CUdriverProcAddressQueryResult as Q;
    assert_eq!(proc_address(c"cuMemcpyBatchAsync", 13000), (OK, Q::CU_GET_PROC_ADDRESS_SUCCESS));
    assert_eq!(
        proc_address(c"cuMemcpyWithAttributesAsync", 13020),
        (CUresult::CUDA_ERROR_NOT_FOUND, Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
    );
    // The loader does not ask a driver older than the variant for it.
    assert!(
        matches!(driver().cuMemcpyWithAttributesAsync(), Err(cuda_mem_sys::LoadError::VersionNotSufficient { .. })),
        "the loader refuses a 13.2 function on a 13.0 driver"
    );
    // Found by `dlsym` anyway (the simulator exports every symbol it implements), it refuses.
    let path = cuda_sim::testing::library_path().expect("the simulator library is built");
    // SAFETY: the simulator library runs no initialisation with preconditions when loaded.
    let library = unsafe { libloading::Library::new(&path) }.expect("the simulator loads");
    // SAFETY: the symbol has `cuMemcpyWithAttributesAsync`'s signature (the simulator's export).
    let function = unsafe { library.get::<cuda_mem_sys::MemcpyWithAttributesAsync>(b"cuMemcpyWithAttributesAsync\0") }
        .expect("the simulator exports it");
    let (a, b) = (DeviceBuffer::with(&[1; 8]), DeviceBuffer::new(8));
    let s = non_blocking_stream();
    let mut attr = stream_order();
    // SAFETY: the memory and the attributes are the test's own; the stream is live.
    assert_eq!(unsafe { function(b.ptr, a.ptr, 8, &mut attr, s) }, CUresult::CUDA_ERROR_NOT_SUPPORTED);
    destroy(s);
}

#[test]
fn a_cuda_13_2_driver_copies_with_attributes() {
    in_child!(&[("CUDA_SIM_DRIVER_VERSION", "13020")], || {
        use_device(0);
        assert_eq!(driver_version(), 13020);
        use CUdriverProcAddressQueryResult as Q;
        assert_eq!(proc_address(c"cuMemcpyWithAttributesAsync", 13020), (OK, Q::CU_GET_PROC_ADDRESS_SUCCESS));
        let s = non_blocking_stream();
        let src = Pinned::new(16);
        src.fill(1);
        let (during, later) = (DeviceBuffer::new(16), DeviceBuffer::new(16));
        let (gate, _open) = Gate::new();
        hold(gate, driver(), s);
        let mut attr = attrs(Order::CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL);
        assert_eq!(with_attributes(during.ptr, src.dptr(), 16, &mut attr, s), OK);
        let mut attr = stream_order();
        assert_eq!(with_attributes(later.ptr, src.dptr(), 16, &mut attr, s), OK);
        src.fill(2);
        gate.open();
        sync(s);
        assert_eq!(during.read(), vec![1; 16]);
        assert_eq!(later.read(), vec![2; 16]);
        // Its errors: those of a one-copy batch, and a null attribute.
        assert_eq!(with_attributes(later.ptr, src.dptr(), 16, std::ptr::null_mut(), s), INVALID);
        assert_eq!(with_attributes(later.ptr, src.dptr(), 16, &mut attr, NULL_STREAM), INVALID);
        assert_eq!(with_attributes(later.ptr, src.dptr(), 0, &mut attr, s), INVALID);
        assert_eq!(with_attributes(later.ptr, src.dptr(), 17, &mut attr, s), INVALID);
        let mut bad = attrs(Order::CU_MEMCPY_SRC_ACCESS_ORDER_INVALID);
        assert_eq!(with_attributes(later.ptr, src.dptr(), 16, &mut bad, s), INVALID);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuStreamBeginCapture_v2(s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)) }
            .unwrap();
        assert_eq!(
            with_attributes(later.ptr, src.dptr(), 16, &mut attr, s),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        assert_eq!(capture_status(s), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer.
        unsafe { cu_call!(driver(), cuStreamEndCapture(s, &mut graph)) }.unwrap();
        // SAFETY: destroyed once.
        unsafe { cu_call!(driver(), cuGraphDestroy(graph)) }.unwrap();
        destroy(s);
    });
}

#[test]
fn a_cuda_12_8_driver_has_no_cuda_13_batch() {
    in_child!(&[("CUDA_SIM_DRIVER_VERSION", "12080")], || {
        use_device(0);
        assert_eq!(driver_version(), 12080);
        use CUdriverProcAddressQueryResult as Q;
        assert_eq!(
            proc_address(c"cuMemcpyBatchAsync", 13000),
            (CUresult::CUDA_ERROR_NOT_FOUND, Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
        assert_eq!(proc_address(c"cuMemAlloc", 12080), (OK, Q::CU_GET_PROC_ADDRESS_SUCCESS));
    });
}

#[test]
fn a_driver_version_out_of_range_is_refused() {
    in_child!(&[("CUDA_SIM_DRIVER_VERSION", "13030")], || {
        let mut version = 0;
        // SAFETY: `version` is a valid out-pointer.
        assert_eq!(unsafe { code!(driver(), cuDriverGetVersion(&mut version)) }, INVALID);
        // SAFETY: no pointers.
        assert_eq!(unsafe { code!(driver(), cuInit(0)) }, INVALID);
    });
}
