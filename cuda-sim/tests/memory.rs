//! Allocation and freeing, memory accounting and exhaustion (in child processes, where nothing
//! else allocates), address ranges, copies, memsets and pointer attributes.

mod common;

use std::ffi::{c_uint, c_void};

use common::{
    DeviceBuffer, NULL_STREAM, Pinned, address_range, code, driver, dtoh, htod, in_child, non_blocking_stream, sync,
    use_device,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUcontext, CUdeviceptr, CUmemorytype, CUpointer_attribute, CUresult, CUstream};

const INVALID: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;

fn alloc(len: usize) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAlloc_v2(&mut ptr, len)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn free(ptr: CUdeviceptr) -> CUresult {
    // SAFETY: no host pointers are dereferenced.
    unsafe { code!(driver(), cuMemFree_v2(ptr)) }
}

fn free_host(ptr: *mut c_void) -> CUresult {
    // SAFETY: only pointers the simulator allocated are freed; others are rejected unread.
    unsafe { code!(driver(), cuMemFreeHost(ptr)) }
}

fn alloc_host(len: usize) -> Result<*mut c_void, CUresult> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is a valid out-pointer.
    match unsafe { code!(driver(), cuMemAllocHost_v2(&mut ptr, len)) } {
        CUresult::CUDA_SUCCESS => Ok(ptr),
        error => Err(error),
    }
}

fn mem_info() -> (usize, usize) {
    let (mut free, mut total) = (0, 0);
    // SAFETY: both are valid out-pointers.
    unsafe { cu_call!(driver(), cuMemGetInfo_v2(&mut free, &mut total)) }.unwrap();
    (free, total)
}

#[test]
fn allocation_and_free_errors() {
    use_device(0);
    assert_eq!(alloc(0), Err(INVALID));
    assert_eq!(alloc_host(0), Err(INVALID));
    // SAFETY: null out-pointers are rejected.
    unsafe {
        assert_eq!(code!(driver(), cuMemAlloc_v2(std::ptr::null_mut(), 16)), INVALID);
        assert_eq!(code!(driver(), cuMemAllocHost_v2(std::ptr::null_mut(), 16)), INVALID);
    }

    let a = alloc(100).unwrap();
    let b = alloc(100).unwrap();
    assert_eq!(a % 256, 0, "device allocations are aligned");
    assert_eq!(b % 256, 0);
    assert!(b >= a + 100 || a >= b + 100, "allocations do not overlap");
    assert_eq!(free(a + 1), INVALID, "an interior pointer");
    assert_eq!(free(a), CUresult::CUDA_SUCCESS);
    assert_eq!(free(a), INVALID, "freeing twice");
    assert_eq!(free(0), INVALID, "freeing null");
    let c = alloc(100).unwrap();
    assert_ne!(c, a, "a freed address is not handed out again at once");

    let pinned = alloc_host(100).unwrap();
    assert_eq!(free(pinned as CUdeviceptr), INVALID, "cuMemFree of pinned host memory");
    assert_eq!(free_host(b as *mut c_void), INVALID, "cuMemFreeHost of device memory");
    assert_eq!(free_host(std::ptr::null_mut()), INVALID, "cuMemFreeHost of null");
    let mut local = 0u64;
    assert_eq!(free_host(std::ptr::from_mut(&mut local).cast()), INVALID, "cuMemFreeHost of pageable memory");
    // SAFETY: `pinned` is valid for 100 bytes.
    let interior = unsafe { pinned.cast::<u8>().add(1) };
    assert_eq!(free_host(interior.cast()), INVALID, "an interior pinned pointer");

    // Pinned memory is ordinary host memory.
    // SAFETY: `pinned` is valid for 100 bytes, and nothing else uses it.
    unsafe {
        pinned.cast::<u8>().write_bytes(0x5a, 100);
        assert_eq!(pinned.cast::<u8>().add(99).read(), 0x5a);
    }
    assert_eq!(free_host(pinned), CUresult::CUDA_SUCCESS);
    assert_eq!(free_host(pinned), INVALID, "cuMemFreeHost twice");
    assert_eq!(free(b), CUresult::CUDA_SUCCESS);
    assert_eq!(free(c), CUresult::CUDA_SUCCESS);
}

#[test]
fn memory_accounting_and_exhaustion() {
    in_child!(&[("CUDA_SIM_MEMORY", "1M"), ("CUDA_SIM_DEVICES", "2")], || {
        use_device(1);
        let other = mem_info();
        use_device(0);
        let total = 1 << 20;
        assert_eq!(mem_info(), (total, total));
        assert_eq!(other, (total, total));

        let small = alloc(1).unwrap();
        let after_small = mem_info().0;
        assert!(after_small < total, "a 1-byte allocation uses memory");
        let big = alloc(100_000).unwrap();
        let after_big = mem_info().0;
        assert!(after_small - after_big >= 100_000, "{after_small} - {after_big}");
        // Pinned host memory is not device memory.
        let pinned = alloc_host(200_000).unwrap();
        assert_eq!(mem_info().0, after_big);
        // Another device's memory is its own.
        use_device(1);
        assert_eq!(mem_info(), (total, total));
        use_device(0);

        assert_eq!(free(big), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, after_small);
        assert_eq!(free(small), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info(), (total, total), "freeing returns exactly what was taken");

        // Exhaustion.
        assert_eq!(alloc(total + 1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(alloc(usize::MAX), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(mem_info().0, total, "a failed allocation takes nothing");
        let all = alloc(total).unwrap();
        assert_eq!(mem_info().0, 0);
        assert_eq!(alloc(1), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        use_device(1);
        let on_one = alloc(total).expect("device 1 still has all its memory");
        use_device(0);
        assert_eq!(free(all), CUresult::CUDA_SUCCESS);
        let half = alloc(total / 2).unwrap();
        assert!(alloc(total / 2 + 1).is_err(), "half is taken");
        let rest = alloc(total / 2).unwrap();
        for ptr in [half, rest] {
            assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
        }
        use_device(1);
        assert_eq!(free(on_one), CUresult::CUDA_SUCCESS);
        assert_eq!(free_host(pinned), CUresult::CUDA_SUCCESS);
        // SAFETY: null out-pointers are rejected.
        unsafe {
            let mut n = 0;
            assert_eq!(code!(driver(), cuMemGetInfo_v2(std::ptr::null_mut(), &mut n)), INVALID);
            assert_eq!(code!(driver(), cuMemGetInfo_v2(&mut n, std::ptr::null_mut())), INVALID);
        }
    });
}

#[test]
fn address_ranges() {
    use_device(0);
    let buffer = DeviceBuffer::new(100);
    let p = buffer.ptr;
    for offset in [0, 1, 50, 99] {
        assert_eq!(address_range(p + offset), Ok((p, 100)), "offset {offset}");
    }
    assert_eq!(address_range(p + 100), Err(CUresult::CUDA_ERROR_NOT_FOUND), "one past the end");
    let pinned = Pinned::new(10);
    assert_eq!(address_range(pinned.dptr() + 9), Ok((pinned.dptr(), 10)));
    let local = 0u8;
    assert_eq!(address_range(std::ptr::from_ref(&local) as CUdeviceptr), Err(CUresult::CUDA_ERROR_NOT_FOUND));
    // Either output may be null.
    let mut base = 0;
    let mut size = 0;
    // SAFETY: each pointer is valid or null, which cuda.h allows.
    unsafe {
        cu_call!(driver(), cuMemGetAddressRange_v2(&mut base, std::ptr::null_mut(), p + 5)).unwrap();
        cu_call!(driver(), cuMemGetAddressRange_v2(std::ptr::null_mut(), &mut size, p + 5)).unwrap();
        cu_call!(driver(), cuMemGetAddressRange_v2(std::ptr::null_mut(), std::ptr::null_mut(), p)).unwrap();
    }
    assert_eq!((base, size), (p, 100));
    let freed = alloc(64).unwrap();
    assert_eq!(free(freed), CUresult::CUDA_SUCCESS);
    assert_eq!(address_range(freed), Err(CUresult::CUDA_ERROR_NOT_FOUND), "a freed allocation");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Every copy function, between every kind of memory it accepts.
#[test]
fn copies_move_the_bytes() {
    use_device(0);
    let d = driver();
    let n = 4096 + 13;
    let (a, b) = (DeviceBuffer::new(n), DeviceBuffer::new(n));
    let pinned = Pinned::new(n);
    let src = pattern(n, 1);

    htod(a.ptr, &src);
    assert_eq!(a.read(), src);
    // SAFETY: no host pointers.
    unsafe { cu_call!(d, cuMemcpyDtoD_v2(b.ptr, a.ptr, n)) }.unwrap();
    assert_eq!(b.read(), src);

    // Pinned memory on either side.
    let src2 = pattern(n, 2);
    pinned.write(&src2);
    // SAFETY: `pinned` is valid for `n` bytes.
    unsafe { cu_call!(d, cuMemcpyHtoD_v2(a.ptr, pinned.ptr.cast(), n)) }.unwrap();
    pinned.fill(0);
    // SAFETY: as above; a device-to-pinned copy returns when done.
    unsafe { cu_call!(d, cuMemcpyDtoH_v2(pinned.ptr.cast(), a.ptr, n)) }.unwrap();
    assert_eq!(pinned.read(), src2);

    // cuMemcpy infers each side's kind from the address (unified addressing).
    let src3 = pattern(n, 3);
    let mut host = vec![0u8; n];
    // SAFETY: `src3` and `host` are valid for `n` bytes; synchronous copies involving pageable
    // host memory are done (or staged) when they return.
    unsafe {
        cu_call!(d, cuMemcpy(b.ptr, src3.as_ptr() as CUdeviceptr, n)).unwrap();
        cu_call!(d, cuMemcpy(a.ptr, b.ptr, n)).unwrap();
        cu_call!(d, cuMemcpy(host.as_mut_ptr() as CUdeviceptr, a.ptr, n)).unwrap();
    }
    assert_eq!(host, src3);
    let mut host2 = vec![0u8; n];
    // SAFETY: both host buffers are valid for `n` bytes.
    unsafe { cu_call!(d, cuMemcpy(host2.as_mut_ptr() as CUdeviceptr, host.as_ptr() as CUdeviceptr, n)) }.unwrap();
    assert_eq!(host2, src3, "host to host");
    // SAFETY: `pinned` and `host2` are valid for `n` bytes.
    unsafe { cu_call!(d, cuMemcpy(pinned.dptr(), host2.as_ptr() as CUdeviceptr, n)) }.unwrap();
    assert_eq!(pinned.read(), src3, "pageable to pinned");

    // Copies at offsets touch only their range.
    // SAFETY: the ranges are inside the allocations.
    unsafe {
        cu_call!(d, cuMemcpyHtoD_v2(a.ptr + 100, src.as_ptr().cast(), 50)).unwrap();
        cu_call!(d, cuMemcpyDtoD_v2(b.ptr + 1000, a.ptr + 100, 50)).unwrap();
    }
    let mut expected = src3.clone();
    expected[1000..1050].copy_from_slice(&src[..50]);
    assert_eq!(b.read(), expected);
    assert_eq!(dtoh(b.ptr + 1010, 5), &src[10..15]);
}

#[test]
fn asynchronous_copies_move_the_bytes_in_stream_order() {
    use_device(0);
    let d = driver();
    let n = 10_000;
    let (a, b) = (DeviceBuffer::new(n), DeviceBuffer::new(n));
    let pinned_in = Pinned::new(n);
    let pinned_out = Pinned::new(n);
    for s in [non_blocking_stream(), common::blocking_stream(), NULL_STREAM, common::STREAM_PER_THREAD] {
        let src = pattern(n, s as usize as u8);
        pinned_in.write(&src);
        pinned_out.fill(0);
        let mut pageable = vec![0u8; n];
        // SAFETY: all host buffers are valid for `n` bytes until the stream is synchronized.
        unsafe {
            cu_call!(d, cuMemcpyHtoDAsync_v2(a.ptr, pinned_in.ptr.cast(), n, s)).unwrap();
            cu_call!(d, cuMemcpyDtoDAsync_v2(b.ptr, a.ptr, n, s)).unwrap();
            cu_call!(d, cuMemcpyAsync(a.ptr, b.ptr, n, s)).unwrap();
            cu_call!(d, cuMemcpyDtoHAsync_v2(pinned_out.ptr.cast(), a.ptr, n, s)).unwrap();
            cu_call!(d, cuMemcpyAsync(pageable.as_mut_ptr() as CUdeviceptr, b.ptr, n, s)).unwrap();
        }
        sync(s);
        assert_eq!(pinned_out.read(), src, "stream {s:?}");
        assert_eq!(pageable, src, "stream {s:?}");
    }
}

/// Every copy form, called with `dst`, `src` and `len`; `(name, code)`.
fn all_copies(dst: CUdeviceptr, src: CUdeviceptr, len: usize, s: CUstream) -> Vec<(&'static str, CUresult)> {
    let d = driver();
    let (h_dst, h_src) = (dst as *mut c_void, src as *const c_void);
    // SAFETY: callers pass host pointers valid for `len` bytes, or pointers the driver rejects
    // before touching them.
    unsafe {
        vec![
            ("cuMemcpy", code!(d, cuMemcpy(dst, src, len))),
            ("cuMemcpyHtoD", code!(d, cuMemcpyHtoD_v2(dst, h_src, len))),
            ("cuMemcpyDtoH", code!(d, cuMemcpyDtoH_v2(h_dst, src, len))),
            ("cuMemcpyDtoD", code!(d, cuMemcpyDtoD_v2(dst, src, len))),
            ("cuMemcpyAsync", code!(d, cuMemcpyAsync(dst, src, len, s))),
            ("cuMemcpyHtoDAsync", code!(d, cuMemcpyHtoDAsync_v2(dst, h_src, len, s))),
            ("cuMemcpyDtoHAsync", code!(d, cuMemcpyDtoHAsync_v2(h_dst, src, len, s))),
            ("cuMemcpyDtoDAsync", code!(d, cuMemcpyDtoDAsync_v2(dst, src, len, s))),
        ]
    }
}

#[test]
fn copies_out_of_bounds_or_of_freed_memory_are_invalid() {
    use_device(0);
    let d = driver();
    let s = non_blocking_stream();
    let n = 100;
    let (a, b) = (DeviceBuffer::with(&pattern(n, 7)), DeviceBuffer::with(&pattern(n, 8)));
    let host = vec![0u8; 2 * n];
    let h = host.as_ptr() as CUdeviceptr;
    let check = |dst, src, len, what: &str| {
        for (function, result) in all_copies(dst, src, len, s) {
            // Only the forms whose direction fits are meaningful; the others fail anyway.
            assert_eq!(result, INVALID, "{function}: {what}");
        }
    };
    check(a.ptr, b.ptr, n + 1, "both ranges run past the end");
    check(a.ptr + 1, b.ptr, n, "the destination runs past the end");
    check(a.ptr, b.ptr + 1, n, "the source runs past the end");
    check(a.ptr + n as u64, b.ptr, 1, "the destination starts at the end");
    check(a.ptr, b.ptr + n as u64 + 64, 1, "the source lies past the end");
    // SAFETY: `host` is valid for 2n bytes; the device ranges run past the end and are rejected.
    unsafe {
        assert_eq!(code!(d, cuMemcpyHtoD_v2(a.ptr + 50, host.as_ptr().cast(), 51)), INVALID);
        assert_eq!(code!(d, cuMemcpyDtoH_v2(host.as_ptr().cast_mut().cast(), a.ptr + 99, 2)), INVALID);
        assert_eq!(code!(d, cuMemcpy(h, a.ptr + 1, n)), INVALID);
        assert_eq!(code!(d, cuMemcpy(a.ptr + 1, h, n)), INVALID);
    }
    // The last byte is in range.
    // SAFETY: both ranges are in bounds.
    unsafe { cu_call!(d, cuMemcpyDtoD_v2(a.ptr + 99, b.ptr + 99, 1)) }.unwrap();

    // A freed device pointer is invalid in every copy, cuMemcpy included (it is not mistaken
    // for pageable host memory).
    let freed = alloc(n).unwrap();
    assert_eq!(free(freed), CUresult::CUDA_SUCCESS);
    check(freed, b.ptr, 10, "freed destination");
    check(a.ptr, freed, 10, "freed source");
    check(freed, h, 10, "freed destination, host source");
    check(h, freed, 10, "host destination, freed source");
    check(0, b.ptr, 10, "null destination");
    check(a.ptr, 0, 10, "null source");

    // The direction must match the memory.
    // SAFETY: every host pointer is valid for 10 bytes; device pointers on the wrong side are
    // rejected before anything is copied.
    unsafe {
        assert_eq!(code!(d, cuMemcpyHtoD_v2(a.ptr, b.ptr as *const c_void, 10)), INVALID, "HtoD from device memory");
        assert_eq!(code!(d, cuMemcpyDtoH_v2(a.ptr as *mut c_void, b.ptr, 10)), INVALID, "DtoH to device memory");
        assert_eq!(
            code!(d, cuMemcpyDtoH_v2(host.as_ptr().cast_mut().cast(), h + 10, 10)),
            INVALID,
            "DtoH from host memory"
        );
        assert_eq!(code!(d, cuMemcpyHtoD_v2(h, host.as_ptr().cast(), 10)), INVALID, "HtoD to host memory");
        assert_eq!(code!(d, cuMemcpyDtoD_v2(a.ptr, h, 10)), INVALID, "DtoD from host memory");
        assert_eq!(code!(d, cuMemcpyDtoDAsync_v2(h, a.ptr, 10, s)), INVALID, "DtoD to host memory");
    }
    // Nothing was written by any failed call.
    sync(s);
    let mut expected = pattern(n, 7);
    expected[99] = pattern(n, 8)[99];
    assert_eq!(a.read(), expected);
    assert_eq!(b.read(), pattern(n, 8));
    assert!(host.iter().all(|&b| b == 0));
}

#[test]
fn zero_length_copies_succeed() {
    use_device(0);
    let s = non_blocking_stream();
    let (a, b) = (DeviceBuffer::with(&[1; 16]), DeviceBuffer::with(&[2; 16]));
    let host = [3u8; 16];
    for (function, result) in all_copies(a.ptr, b.ptr, 0, s) {
        if function.contains("HtoD") || function.contains("DtoH") {
            continue;
        }
        assert_eq!(result, CUresult::CUDA_SUCCESS, "{function}");
    }
    for (function, result) in all_copies(a.ptr, host.as_ptr() as CUdeviceptr, 0, s) {
        if function.contains("HtoD") || function == "cuMemcpy" || function == "cuMemcpyAsync" {
            assert_eq!(result, CUresult::CUDA_SUCCESS, "{function}");
        }
    }
    for (function, result) in all_copies(host.as_ptr() as CUdeviceptr, a.ptr, 0, s) {
        if function.contains("DtoH") {
            assert_eq!(result, CUresult::CUDA_SUCCESS, "{function}");
        }
    }
    sync(s);
    assert_eq!(a.read(), [1; 16]);
    assert_eq!(b.read(), [2; 16]);
    assert_eq!(host, [3; 16]);
}

/// A memset through each of the six functions: (width, asynchronous).
fn memset(width: usize, asynchronous: bool, dst: CUdeviceptr, value: u32, count: usize, s: CUstream) -> CUresult {
    let d = driver();
    // SAFETY: no host pointers are dereferenced except pinned ones the caller owns.
    unsafe {
        match (width, asynchronous) {
            (1, false) => code!(d, cuMemsetD8_v2(dst, value as u8, count)),
            (2, false) => code!(d, cuMemsetD16_v2(dst, value as u16, count)),
            (4, false) => code!(d, cuMemsetD32_v2(dst, value, count)),
            (1, true) => code!(d, cuMemsetD8Async(dst, value as u8, count, s)),
            (2, true) => code!(d, cuMemsetD16Async(dst, value as u16, count, s)),
            _ => code!(d, cuMemsetD32Async(dst, value, count, s)),
        }
    }
}

#[test]
fn memsets_fill_elements_in_bounds() {
    use_device(0);
    let s = non_blocking_stream();
    let n = 64;
    let value: u32 = 0xdead_beef;
    for width in [1, 2, 4] {
        for asynchronous in [false, true] {
            let what = format!("D{} {}", width * 8, if asynchronous { "async" } else { "sync" });
            let buffer = DeviceBuffer::with(&[0x11; 64]);
            let stream = if asynchronous { s } else { NULL_STREAM };
            // Fill 8 bytes at offset 8 with elements of `width` bytes.
            assert_eq!(
                memset(width, asynchronous, buffer.ptr + 8, value, 8 / width, s),
                CUresult::CUDA_SUCCESS,
                "{what}"
            );
            sync(stream);
            let element = &value.to_le_bytes()[..width];
            let mut expected = vec![0x11u8; n];
            for chunk in expected[8..16].chunks_mut(width) {
                chunk.copy_from_slice(element);
            }
            assert_eq!(buffer.read(), expected, "{what}");
            // The whole buffer, exactly.
            assert_eq!(memset(width, asynchronous, buffer.ptr, value, n / width, s), CUresult::CUDA_SUCCESS, "{what}");
            sync(stream);
            assert_eq!(buffer.read(), element.repeat(n / width), "{what}");
            // Zero elements: nothing happens.
            assert_eq!(memset(width, asynchronous, buffer.ptr, 0, 0, s), CUresult::CUDA_SUCCESS, "{what}");

            // One element too many, from the start or an offset; a count whose byte size
            // overflows; misaligned addresses; not device memory.
            let local = [0u8; 64];
            let freed = alloc(64).unwrap();
            assert_eq!(free(freed), CUresult::CUDA_SUCCESS);
            let mut bad = vec![
                (buffer.ptr, n / width + 1, "one element past the end"),
                (buffer.ptr + width as u64, n / width, "from an offset, past the end"),
                (buffer.ptr, usize::MAX / 2 + 1, "a byte count that overflows"),
                (local.as_ptr() as CUdeviceptr, 1, "pageable host memory"),
                (freed, 1, "freed memory"),
                (0, 1, "null"),
            ];
            if width > 1 {
                bad.push((buffer.ptr + 1, 1, "misaligned by one byte"));
                bad.push((buffer.ptr + width as u64 / 2, 1, "misaligned by half an element"));
            }
            for (dst, count, why) in bad {
                assert_eq!(memset(width, asynchronous, dst, 0, count, s), INVALID, "{what}: {why}");
            }
            sync(stream);
            assert_eq!(buffer.read(), element.repeat(n / width), "{what}: failed memsets wrote nothing");
        }
    }
}

#[test]
fn a_synchronous_memset_of_pinned_memory_is_done_when_it_returns() {
    use_device(0);
    let pinned = Pinned::new(64);
    for (width, value, expected) in
        [(1, 0x7f, [0x7f; 4]), (2, 0x1234, [0x34, 0x12, 0x34, 0x12]), (4, 0x0102_0304, [4, 3, 2, 1])]
    {
        assert_eq!(memset(width, false, pinned.dptr(), value, 64 / width, NULL_STREAM), CUresult::CUDA_SUCCESS);
        assert_eq!(pinned.read(), expected.repeat(16), "D{} on pinned memory", width * 8);
    }
}

/// Reads one pointer attribute of type `T` (initialized to `init`).
fn attribute<T: Copy>(attr: CUpointer_attribute, ptr: CUdeviceptr, init: T) -> Result<T, CUresult> {
    let mut value = init;
    // SAFETY: `value` has the type cuda.h documents for `attr`.
    match unsafe { code!(driver(), cuPointerGetAttribute(std::ptr::from_mut(&mut value).cast(), attr, ptr)) } {
        CUresult::CUDA_SUCCESS => Ok(value),
        error => Err(error),
    }
}

/// The attributes `cuPointerGetAttributes` reads in [`attributes`], in order.
const ATTRIBUTES: [CUpointer_attribute; 12] = [
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_HOST_POINTER,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPED,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
];

/// What [`attributes`] returns, one field per attribute of [`ATTRIBUTES`].
#[derive(Debug, Clone, Copy, PartialEq)]
struct Attributes {
    context: CUcontext,
    memory_type: c_uint,
    device_pointer: CUdeviceptr,
    host_pointer: *mut c_void,
    sync_memops: bool,
    buffer_id: u64,
    is_managed: bool,
    device_ordinal: i32,
    range_start: CUdeviceptr,
    range_size: usize,
    mapped: bool,
    ipc_capable: bool,
}

/// Every attribute of [`ATTRIBUTES`] at once, with `cuPointerGetAttributes`.
fn attributes(ptr: CUdeviceptr) -> Result<Attributes, CUresult> {
    let mut a = Attributes {
        context: std::ptr::dangling_mut(),
        memory_type: 99,
        device_pointer: 99,
        host_pointer: std::ptr::dangling_mut(),
        sync_memops: true,
        buffer_id: 99,
        is_managed: true,
        device_ordinal: 99,
        range_start: 99,
        range_size: 99,
        mapped: true,
        ipc_capable: true,
    };
    let mut data: [*mut c_void; 12] = [
        std::ptr::from_mut(&mut a.context).cast(),
        std::ptr::from_mut(&mut a.memory_type).cast(),
        std::ptr::from_mut(&mut a.device_pointer).cast(),
        std::ptr::from_mut(&mut a.host_pointer).cast(),
        std::ptr::from_mut(&mut a.sync_memops).cast(),
        std::ptr::from_mut(&mut a.buffer_id).cast(),
        std::ptr::from_mut(&mut a.is_managed).cast(),
        std::ptr::from_mut(&mut a.device_ordinal).cast(),
        std::ptr::from_mut(&mut a.range_start).cast(),
        std::ptr::from_mut(&mut a.range_size).cast(),
        std::ptr::from_mut(&mut a.mapped).cast(),
        std::ptr::from_mut(&mut a.ipc_capable).cast(),
    ];
    let mut attrs = ATTRIBUTES;
    // SAFETY: both arrays have 12 elements, and each data pointer has its attribute's type.
    let result = unsafe { code!(driver(), cuPointerGetAttributes(12, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr)) };
    if result == CUresult::CUDA_SUCCESS { Ok(a) } else { Err(result) }
}

#[test]
fn pointer_attributes_of_device_and_pinned_memory() {
    use CUpointer_attribute as A;
    let ctx = use_device(0);
    let buffer = DeviceBuffer::new(1000);
    let other = DeviceBuffer::new(10);
    let pinned = Pinned::new(100);
    let (p, h) = (buffer.ptr, pinned.dptr());
    let device = CUmemorytype::CU_MEMORYTYPE_DEVICE.0;
    let host = CUmemorytype::CU_MEMORYTYPE_HOST.0;

    for q in [p, p + 100, p + 999] {
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_CONTEXT, q, std::ptr::null_mut()), Ok(ctx));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q, 0u32), Ok(device));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, q, -1i32), Ok(0));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q, 0u64), Ok(p));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, q, 0usize), Ok(1000));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_MAPPED, q, false), Ok(true));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_IS_MANAGED, q, true), Ok(false));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q, false), Ok(true));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, q, 0x1usize), Ok(0));
        // "the value returned in *data will equal the input value ptr"
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q, 0u64), Ok(q), "device pointer of {q:#x}");
        // Device memory has no host pointer.
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_HOST_POINTER, q, 0usize), Err(INVALID));
    }
    let id = attribute(A::CU_POINTER_ATTRIBUTE_BUFFER_ID, p, 0u64).unwrap();
    assert_ne!(id, 0);
    assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 500, 0u64), Ok(id));
    let other_id = attribute(A::CU_POINTER_ATTRIBUTE_BUFFER_ID, other.ptr, 0u64).unwrap();
    assert_ne!(other_id, id, "buffer ids are unique");
    assert_ne!(attribute(A::CU_POINTER_ATTRIBUTE_BUFFER_ID, h, 0u64).unwrap(), id);

    for q in [h, h + 10, h + 99] {
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, q, 0u32), Ok(host));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_CONTEXT, q, std::ptr::null_mut()), Ok(ctx));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, q, 0u64), Ok(h));
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_RANGE_SIZE, q, 0usize), Ok(100));
        assert_eq!(
            attribute(A::CU_POINTER_ATTRIBUTE_HOST_POINTER, q, 0usize),
            Ok(q as usize),
            "host pointer of {q:#x}"
        );
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER, q, 0u64), Ok(q), "device pointer of {q:#x}");
        assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, q, true), Ok(false));
    }

    // Booleans are written as one byte (C bool).
    assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_IS_MANAGED, p, u64::MAX), Ok(u64::MAX << 8));

    // The plural form reads the same values; device memory's host pointer reads as null.
    let all = attributes(p + 100).unwrap();
    assert_eq!(
        all,
        Attributes {
            context: ctx,
            memory_type: device,
            device_pointer: p + 100,
            host_pointer: std::ptr::null_mut(),
            sync_memops: false,
            buffer_id: id,
            is_managed: false,
            device_ordinal: 0,
            range_start: p,
            range_size: 1000,
            mapped: true,
            ipc_capable: true,
        }
    );
    let all = attributes(h + 1).unwrap();
    assert_eq!(
        (all.memory_type, all.host_pointer, all.range_start, all.range_size),
        (host, (h + 1) as *mut c_void, h, 100)
    );
}

#[test]
fn pointer_attributes_of_unknown_pointers() {
    use_device(0);
    let freed = alloc(64).unwrap();
    assert_eq!(free(freed), CUresult::CUDA_SUCCESS);
    let local = 0u64;
    let buffer = DeviceBuffer::new(64);
    for ptr in [0, std::ptr::from_ref(&local) as CUdeviceptr, freed, buffer.ptr + 64] {
        for attr in ATTRIBUTES {
            assert_eq!(
                attribute(attr, ptr, [0u8; 16]).err(),
                Some(INVALID),
                "singular, attribute {} of {ptr:#x}",
                attr.0
            );
        }
        // The plural form succeeds with null values.
        let all = attributes(ptr).unwrap();
        assert_eq!(
            all,
            Attributes {
                context: std::ptr::null_mut(),
                memory_type: 0,
                device_pointer: 0,
                host_pointer: std::ptr::null_mut(),
                sync_memops: false,
                buffer_id: 0,
                is_managed: false,
                device_ordinal: -2,
                range_start: 0,
                range_size: 0,
                mapped: false,
                ipc_capable: false,
            },
            "{ptr:#x}"
        );
    }
}

#[test]
fn pointer_attribute_arguments() {
    use CUpointer_attribute as A;
    use_device(0);
    let buffer = DeviceBuffer::new(64);
    let p = buffer.ptr;
    // Attributes the simulator does not model, and values that are no attribute.
    for attr in
        [A::CU_POINTER_ATTRIBUTE_P2P_TOKENS, A::CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, A::CU_POINTER_ATTRIBUTE_MAPPING_SIZE]
    {
        assert_eq!(attribute(attr, p, [0u8; 16]), Err(CUresult::CUDA_ERROR_NOT_SUPPORTED), "attribute {}", attr.0);
    }
    for raw in [0, 22, 1000] {
        assert_eq!(attribute(A(raw), p, [0u8; 16]), Err(INVALID), "attribute {raw}");
    }
    let d = driver();
    let mut attrs = [A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, A::CU_POINTER_ATTRIBUTE_RANGE_SIZE];
    let mut size = 0usize;
    let mut data: [*mut c_void; 2] = [std::ptr::null_mut(), std::ptr::from_mut(&mut size).cast()];
    // SAFETY: null pointers are rejected or skipped; the others have their attribute's type.
    unsafe {
        assert_eq!(
            code!(d, cuPointerGetAttribute(std::ptr::null_mut(), A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p)),
            INVALID
        );
        assert_eq!(code!(d, cuPointerGetAttributes(0, attrs.as_mut_ptr(), data.as_mut_ptr(), p)), INVALID);
        assert_eq!(code!(d, cuPointerGetAttributes(2, std::ptr::null_mut(), data.as_mut_ptr(), p)), INVALID);
        assert_eq!(code!(d, cuPointerGetAttributes(2, attrs.as_mut_ptr(), std::ptr::null_mut(), p)), INVALID);
        // A null entry in `data` skips that attribute.
        cu_call!(d, cuPointerGetAttributes(2, attrs.as_mut_ptr(), data.as_mut_ptr(), p)).unwrap();
    }
    assert_eq!(size, 64);
}

#[test]
fn pointer_attributes_name_the_allocating_device_and_context() {
    use CUpointer_attribute as A;
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        let c1 = use_device(1);
        let on_one = DeviceBuffer::new(32);
        let pinned_one = Pinned::new(32);
        let c0 = use_device(0);
        let on_zero = DeviceBuffer::new(32);
        for (ptr, ctx, ordinal) in [(on_one.ptr, c1, 1), (pinned_one.dptr(), c1, 1), (on_zero.ptr, c0, 0)] {
            assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_CONTEXT, ptr, std::ptr::null_mut()), Ok(ctx));
            assert_eq!(attribute(A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr, -1i32), Ok(ordinal));
            assert_eq!(attributes(ptr).unwrap().device_ordinal, ordinal);
        }
        // Copies between devices' memory work from either context (peer access is on).
        htod(on_one.ptr, &[9; 32]);
        // SAFETY: no host pointers.
        unsafe { cu_call!(driver(), cuMemcpyDtoD_v2(on_zero.ptr, on_one.ptr, 32)) }.unwrap();
        assert_eq!(on_zero.read(), [9; 32]);
        // Freeing another device's memory works from this context.
        let ptr = on_one.ptr;
        std::mem::forget(on_one);
        assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
    });
}

/// Another device's `cuMemAlloc` memory takes copies on this device's streams (the driver stages
/// a copy between devices without peer access) but not memsets, which would need the context
/// peer access the simulator does not model: `CUDA_ERROR_INVALID_VALUE`, as for a pool's memory
/// without access.
#[test]
fn another_devices_memory_takes_copies_but_not_memsets() {
    in_child!(&[("CUDA_SIM_DEVICES", "2")], || {
        use_device(0);
        let on_zero = DeviceBuffer::with(&[4; 64]);
        use_device(1);
        let on_one = DeviceBuffer::new(64);
        let s = non_blocking_stream();
        for asynchronous in [false, true] {
            assert_eq!(memset(1, asynchronous, on_zero.ptr, 7, 64, s), INVALID, "async {asynchronous}");
            assert_eq!(memset(4, asynchronous, on_zero.ptr, 7, 16, s), INVALID, "async {asynchronous}");
        }
        // SAFETY: no host pointers; both ranges are 64 live bytes.
        unsafe { cu_call!(driver(), cuMemcpyDtoDAsync_v2(on_one.ptr, on_zero.ptr, 64, s)) }.unwrap();
        // SAFETY: as above.
        unsafe { cu_call!(driver(), cuMemcpyDtoDAsync_v2(on_zero.ptr + 32, on_one.ptr, 32, s)) }.unwrap();
        sync(s);
        assert_eq!(on_one.read(), [4; 64]);
        // This device's own memory takes memsets.
        assert_eq!(memset(1, true, on_one.ptr, 2, 64, s), CUresult::CUDA_SUCCESS);
        sync(s);
        assert_eq!(on_one.read(), [2; 64]);
        use_device(0);
        assert_eq!(on_zero.read(), [4; 64], "the refused memsets wrote nothing");
    });
}
