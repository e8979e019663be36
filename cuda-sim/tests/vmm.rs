//! The virtual memory management API: reservations, physical allocations, mappings, access,
//! reference counting, sharing, fault injection and the live-object report.

mod common;

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use common::*;
use cuda_mem_sys::types::{
    CUmemAccess_flags, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationHandleType,
    CUmemAllocationProp, CUmemAllocationType, CUmemFabricHandle, CUmemGenericAllocationHandle, CUmemLocation,
    CUmemLocationType,
};
use cuda_sim::testing::{LiveObjects, inject_failure, live_objects};

const G: usize = 2 << 20;

fn prop(handle_types: u32) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: CUmemAllocationHandleType(handle_types),
        location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 },
        ..CUmemAllocationProp::default()
    }
}

fn create(size: usize, handle_types: u32) -> Result<CUmemGenericAllocationHandle, CUresult> {
    let mut handle = 0;
    let p = prop(handle_types);
    // SAFETY: valid pointers for the call.
    let code = unsafe { code!(driver(), cuMemCreate(&mut handle, size, &p, 0)) };
    if code == CUresult::CUDA_SUCCESS { Ok(handle) } else { Err(code) }
}

fn reserve(size: usize, hint: CUdeviceptr) -> CUdeviceptr {
    let mut ptr = 0;
    // SAFETY: valid out-pointer.
    unsafe { cu_call!(driver(), cuMemAddressReserve(&mut ptr, size, 0, hint, 0)) }.unwrap();
    ptr
}

fn map(ptr: CUdeviceptr, size: usize, handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: plain values.
    unsafe { code!(driver(), cuMemMap(ptr, size, 0, handle, 0)) }
}

fn grant(ptr: CUdeviceptr, size: usize, device: i32) -> CUresult {
    let desc = CUmemAccessDesc {
        location: CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one valid descriptor.
    unsafe { code!(driver(), cuMemSetAccess(ptr, size, &desc, 1)) }
}

fn unmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: plain values.
    unsafe { code!(driver(), cuMemUnmap(ptr, size)) }
}

fn release(handle: CUmemGenericAllocationHandle) -> CUresult {
    // SAFETY: plain value.
    unsafe { code!(driver(), cuMemRelease(handle)) }
}

fn free_range(ptr: CUdeviceptr, size: usize) -> CUresult {
    // SAFETY: plain values.
    unsafe { code!(driver(), cuMemAddressFree(ptr, size)) }
}

fn live() -> LiveObjects {
    live_objects(driver()).unwrap()
}

#[test]
fn granularity_create_map_access_copy_and_teardown() {
    in_child!(&[], || {
        use_device(0);
        let before = live();
        let mut granularity = 0usize;
        let p = prop(0);
        // SAFETY: valid pointers.
        unsafe {
            cu_call!(driver(), cuMemGetAllocationGranularity(&mut granularity, &p, CUmemAllocationGranularity_flags(0)))
        }
        .unwrap();
        assert_eq!(granularity, G);
        assert_eq!(create(G + 1, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "not a granularity multiple");
        let handle = create(2 * G, 0).unwrap();
        let ptr = reserve(4 * G, 0);
        assert_eq!(map(ptr + 4096, G, handle), CUresult::CUDA_ERROR_INVALID_VALUE, "misaligned");
        // SAFETY: plain values; a non-zero offset.
        assert_eq!(unsafe { code!(driver(), cuMemMap(ptr, G, G, handle, 0)) }, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(map(ptr, 2 * G, handle), CUresult::CUDA_SUCCESS);
        assert_eq!(map(ptr + G as u64, G, handle), CUresult::CUDA_ERROR_INVALID_VALUE, "overlapping");
        // No access yet: a copy fails.
        let mut out = vec![0u8; 16];
        // SAFETY: `out` is valid for 16 bytes.
        let code = unsafe { code!(driver(), cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, 16)) };
        assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(grant(ptr, 2 * G, 0), CUresult::CUDA_SUCCESS);
        let mut flags = 0u64;
        let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 };
        // SAFETY: valid pointers.
        unsafe { cu_call!(driver(), cuMemGetAccess(&mut flags, &location, ptr)) }.unwrap();
        assert_eq!(flags, 3);
        htod(ptr + G as u64 - 8, &[5u8; 16]);
        assert_eq!(dtoh(ptr + G as u64 - 8, 16), vec![5u8; 16]);
        // Release while mapped: the memory stays until unmapped.
        assert_eq!(release(handle), CUresult::CUDA_SUCCESS);
        assert_eq!(release(handle), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(dtoh(ptr + G as u64, 8), vec![5u8; 8]);
        assert_eq!(free_range(ptr, 4 * G), CUresult::CUDA_ERROR_INVALID_VALUE, "still mapped");
        assert_eq!(unmap(ptr, G), CUresult::CUDA_ERROR_INVALID_VALUE, "part of a mapping");
        assert_eq!(unmap(ptr, 2 * G), CUresult::CUDA_SUCCESS);
        assert_eq!(free_range(ptr, 2 * G), CUresult::CUDA_ERROR_INVALID_VALUE, "not the whole reservation");
        assert_eq!(free_range(ptr, 4 * G), CUresult::CUDA_SUCCESS);
        assert_eq!(live(), before);
    });
}

#[test]
fn growth_in_place_and_by_remapping_keeps_the_bytes() {
    in_child!(&[], || {
        use_device(0);
        let first = create(G, 0).unwrap();
        let base = reserve(G, 0);
        assert_eq!(map(base, G, first), CUresult::CUDA_SUCCESS);
        assert_eq!(grant(base, G, 0), CUresult::CUDA_SUCCESS);
        htod(base, &[1u8; 64]);
        htod(base + G as u64 - 64, &[1u8; 64]);
        // In place: reserve right after and map the new chunk there.
        let next = reserve(G, base + G as u64);
        assert_eq!(next, base + G as u64, "the hint is honoured when free");
        let second = create(G, 0).unwrap();
        assert_eq!(map(next, G, second), CUresult::CUDA_SUCCESS);
        assert_eq!(grant(next, G, 0), CUresult::CUDA_SUCCESS);
        // A copy across the two reservations works.
        htod(base + G as u64 - 4, &[2u8; 8]);
        assert_eq!(dtoh(base + G as u64 - 8, 12), [[1u8; 4], [2u8; 4], [2u8; 4]].concat());
        // Moving: a taken hint is not honoured; the chunks are mapped again elsewhere.
        let taken = reserve(G, base + G as u64);
        assert_ne!(taken, base + G as u64);
        let moved = reserve(2 * G, 0);
        assert_eq!(map(moved, G, first), CUresult::CUDA_SUCCESS);
        assert_eq!(map(moved + G as u64, G, second), CUresult::CUDA_SUCCESS);
        assert_eq!(grant(moved, 2 * G, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(dtoh(moved, 4), vec![1u8; 4]);
        assert_eq!(dtoh(moved + G as u64 - 4, 8), vec![2u8; 8]);
        htod(moved, &[9u8; 4]);
        assert_eq!(dtoh(base, 4), vec![9u8; 4], "both mappings alias the same memory");
    });
}

#[test]
fn access_needs_a_reachable_device() {
    in_child!(&[("CUDA_SIM_DEVICES", "2"), ("CUDA_SIM_PEER_ACCESS", "none")], || {
        use_device(0);
        let handle = create(G, 0).unwrap();
        let ptr = reserve(G, 0);
        assert_eq!(map(ptr, G, handle), CUresult::CUDA_SUCCESS);
        assert_eq!(grant(ptr, G, 1), CUresult::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(grant(ptr, G, 0), CUresult::CUDA_SUCCESS);
        // Device 1's stream cannot read it.
        use_device(1);
        let mut out = vec![0u8; 4];
        // SAFETY: `out` is valid for 4 bytes.
        let code = unsafe { code!(driver(), cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, 4)) };
        assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
    });
}

/// Fabric memory needs an IMEX channel; the device attribute says fabric handles are supported
/// either way (cuda.h: the channel is the user's to be granted).
#[test]
fn fabric_memory_without_an_imex_channel_is_not_permitted() {
    in_child!(&[], || {
        use_device(0);
        let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let fabric = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        let mut supported = 0;
        let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED;
        // SAFETY: valid out-pointer.
        unsafe { cu_call!(driver(), cuDeviceGetAttribute(&mut supported, attribute, 0)) }.unwrap();
        assert_eq!(supported, 1);
        for handle_types in [fabric.0, posix.0 | fabric.0] {
            assert_eq!(create(G, handle_types), Err(CUresult::CUDA_ERROR_NOT_PERMITTED), "{handle_types:#x}");
        }
        let handle = create(G, posix.0).unwrap();
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemRelease(handle)) }.unwrap();
    });
}

#[test]
fn sharing_by_file_descriptor_and_fabric_handle() {
    in_child!(&[("CUDA_SIM_IMEX_CHANNEL", "0")], || {
        use_device(0);
        let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let fabric = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        let handle = create(G, posix.0 | fabric.0).unwrap();
        let ptr = reserve(G, 0);
        assert_eq!(map(ptr, G, handle), CUresult::CUDA_SUCCESS);
        assert_eq!(grant(ptr, G, 0), CUresult::CUDA_SUCCESS);
        htod(ptr, &[0x33; 32]);
        let mut fd: c_int = -1;
        // SAFETY: valid out-pointer for an int.
        unsafe { cu_call!(driver(), cuMemExportToShareableHandle((&raw mut fd).cast(), handle, posix, 0)) }.unwrap();
        // SAFETY: the driver handed over a new descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut imported = 0;
        // SAFETY: the descriptor travels as a pointer-sized integer.
        unsafe {
            cu_call!(
                driver(),
                cuMemImportFromShareableHandle(&mut imported, fd.as_raw_fd() as isize as *mut c_void, posix)
            )
        }
        .unwrap();
        let mut fabric_handle = CUmemFabricHandle::default();
        // SAFETY: valid out-pointer for a fabric handle.
        unsafe { cu_call!(driver(), cuMemExportToShareableHandle((&raw mut fabric_handle).cast(), handle, fabric, 0)) }
            .unwrap();
        let mut from_fabric = 0;
        // SAFETY: a pointer to a fabric handle.
        unsafe {
            cu_call!(
                driver(),
                cuMemImportFromShareableHandle(&mut from_fabric, (&raw mut fabric_handle).cast(), fabric)
            )
        }
        .unwrap();
        for other in [imported, from_fabric] {
            let at = reserve(G, 0);
            assert_eq!(map(at, G, other), CUresult::CUDA_SUCCESS);
            assert_eq!(grant(at, G, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(dtoh(at, 32), vec![0x33; 32]);
        }
        // A type the allocation was not created with, and garbage.
        let plain = create(G, 0).unwrap();
        let mut raw: c_int = -1;
        // SAFETY: valid out-pointer.
        let code = unsafe { code!(driver(), cuMemExportToShareableHandle((&raw mut raw).cast(), plain, posix, 0)) };
        assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
        let not_vmm: OwnedFd = std::fs::File::open("/proc/self/status").unwrap().into();
        let mut bad = 0;
        // SAFETY: the descriptor travels as a pointer-sized integer.
        let code = unsafe {
            code!(
                driver(),
                cuMemImportFromShareableHandle(&mut bad, not_vmm.as_raw_fd() as isize as *mut c_void, posix)
            )
        };
        assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
        let mut garbage = CUmemFabricHandle { data: [7; 64] };
        // SAFETY: a pointer to 64 bytes.
        let code =
            unsafe { code!(driver(), cuMemImportFromShareableHandle(&mut bad, (&raw mut garbage).cast(), fabric)) };
        assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);
    });
}

#[test]
fn retain_properties_and_injected_failures() {
    in_child!(&[], || {
        use_device(0);
        let before = live();
        let handle = create(G, 0).unwrap();
        let ptr = reserve(G, 0);
        assert_eq!(map(ptr, G, handle), CUresult::CUDA_SUCCESS);
        let mut retained = 0;
        // SAFETY: valid out-pointer; an address inside the mapping.
        unsafe { cu_call!(driver(), cuMemRetainAllocationHandle(&mut retained, (ptr + 100) as *mut c_void)) }.unwrap();
        assert_eq!(retained, handle);
        let mut p = CUmemAllocationProp::default();
        // SAFETY: valid out-pointer.
        unsafe { cu_call!(driver(), cuMemGetAllocationPropertiesFromHandle(&mut p, handle)) }.unwrap();
        assert_eq!(p.location.type_, CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE);
        assert_eq!(release(retained), CUresult::CUDA_SUCCESS);
        assert_eq!(release(handle), CUresult::CUDA_SUCCESS);
        assert_eq!(live().physical_allocations, before.physical_allocations + 1, "still mapped");
        assert_eq!(unmap(ptr, G), CUresult::CUDA_SUCCESS);
        assert_eq!(free_range(ptr, G), CUresult::CUDA_SUCCESS);
        assert_eq!(live(), before);

        inject_failure(driver(), c"cuMemMap", 2).unwrap();
        let a = create(G, 0).unwrap();
        let ra = reserve(2 * G, 0);
        assert_eq!(map(ra, G, a), CUresult::CUDA_SUCCESS, "the first call passes");
        assert_eq!(map(ra + G as u64, G, a), CUresult::CUDA_ERROR_OUT_OF_MEMORY, "the second fails");
        assert_eq!(map(ra + G as u64, G, a), CUresult::CUDA_SUCCESS, "and only it");
    });
}

fn located(type_: CUmemLocationType, handle_types: u32) -> CUmemAllocationProp {
    CUmemAllocationProp { location: CUmemLocation { type_, id: 0 }, ..prop(handle_types) }
}

/// `cuda.h` (`cuMemCreate`): "HOST allocations are not IPC capable and
/// ::CUmemAllocationProp::requestedHandleTypes must be 0, any other value will result in
/// ::CUDA_ERROR_INVALID_VALUE". `cuMemGetAllocationGranularity` refuses such properties too.
#[test]
fn host_memory_takes_no_handle_type() {
    in_child!(&[], || {
        use_device(0);
        let posix = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
        let fabric = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
        let host = CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST;
        let granularity = |p: &CUmemAllocationProp| {
            let mut out = 0usize;
            // SAFETY: valid pointers.
            unsafe { code!(driver(), cuMemGetAllocationGranularity(&mut out, p, CUmemAllocationGranularity_flags(0))) }
        };
        for types in [posix, fabric, posix | fabric] {
            let p = located(host, types);
            let mut handle = 0;
            // SAFETY: valid pointers.
            let code = unsafe { code!(driver(), cuMemCreate(&mut handle, G, &p, 0)) };
            assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemCreate, handle types {types:#x}");
            assert_eq!(granularity(&p), CUresult::CUDA_ERROR_INVALID_VALUE, "granularity, handle types {types:#x}");
        }
        let before = live();
        // Without a handle type, and host NUMA memory with one, are fine.
        for p in [located(host, 0), located(CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, posix)] {
            assert_eq!(granularity(&p), CUresult::CUDA_SUCCESS);
            let mut handle = 0;
            // SAFETY: valid pointers.
            unsafe { cu_call!(driver(), cuMemCreate(&mut handle, G, &p, 0)) }.unwrap();
            assert_eq!(release(handle), CUresult::CUDA_SUCCESS);
        }
        assert_eq!(live(), before);
    });
}

fn set_access_at(ptr: CUdeviceptr, size: usize, type_: CUmemLocationType, id: i32) -> CUresult {
    let desc = CUmemAccessDesc {
        location: CUmemLocation { type_, id },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: one valid descriptor.
    unsafe { code!(driver(), cuMemSetAccess(ptr, size, &desc, 1)) }
}

/// `cuMemSetAccess` takes ranges of whole mappings, aligned to the granularity and mapped
/// throughout ("a fully mapped address range containing all allocations"): a grant never reaches
/// memory outside the range it names.
#[test]
fn access_is_set_on_whole_granular_mappings() {
    in_child!(&[], || {
        use_device(0);
        let g = G as u64;
        let two = create(2 * G, 0).unwrap();
        let one = create(G, 0).unwrap();
        let ptr = reserve(4 * G, 0);
        assert_eq!(map(ptr, 2 * G, two), CUresult::CUDA_SUCCESS);
        assert_eq!(map(ptr + 2 * g, G, one), CUresult::CUDA_SUCCESS);
        assert_eq!(grant(ptr + 4096, G, 0), CUresult::CUDA_ERROR_INVALID_VALUE, "misaligned start");
        assert_eq!(grant(ptr, 2 * G + 4096, 0), CUresult::CUDA_ERROR_INVALID_VALUE, "misaligned size");
        assert_eq!(grant(ptr, G, 0), CUresult::CUDA_ERROR_INVALID_VALUE, "the first half of a mapping");
        assert_eq!(grant(ptr + g, 2 * G, 0), CUresult::CUDA_ERROR_INVALID_VALUE, "from the middle of a mapping");
        assert_eq!(grant(ptr, 4 * G, 0), CUresult::CUDA_ERROR_INVALID_VALUE, "past the mapped range");
        // Nothing was granted by the refused calls.
        let mut flags = 7u64;
        let location = CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 };
        // SAFETY: valid pointers.
        unsafe { cu_call!(driver(), cuMemGetAccess(&mut flags, &location, ptr + g)) }.unwrap();
        assert_eq!(flags, 0);
        assert_eq!(grant(ptr + 2 * g, G, 0), CUresult::CUDA_SUCCESS, "one whole mapping");
        assert_eq!(grant(ptr, 3 * G, 0), CUresult::CUDA_SUCCESS, "two whole mappings");
        htod(ptr + 2 * g - 4, &[6u8; 8]);
        assert_eq!(dtoh(ptr + 2 * g - 4, 8), vec![6u8; 8]);
        assert_eq!(unmap(ptr, 2 * G), CUresult::CUDA_SUCCESS);
        assert_eq!(unmap(ptr + 2 * g, G), CUresult::CUDA_SUCCESS);
        assert_eq!(release(two), CUresult::CUDA_SUCCESS);
        assert_eq!(release(one), CUresult::CUDA_SUCCESS);
        assert_eq!(free_range(ptr, 4 * G), CUresult::CUDA_SUCCESS);
    });
}

/// `cuda.h` (`cuMemSetAccess`): "Users cannot specify ::CU_MEM_LOCATION_TYPE_HOST_NUMA
/// accessibility for allocations created on with other location types".
#[test]
fn host_numa_access_is_only_for_host_numa_memory() {
    in_child!(&[], || {
        use_device(0);
        let (host, numa) =
            (CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA);
        for (created, expected) in [
            (CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, CUresult::CUDA_ERROR_INVALID_VALUE),
            (host, CUresult::CUDA_ERROR_INVALID_VALUE),
            (numa, CUresult::CUDA_SUCCESS),
        ] {
            let p = located(created, 0);
            let mut handle = 0;
            // SAFETY: valid pointers.
            unsafe { cu_call!(driver(), cuMemCreate(&mut handle, G, &p, 0)) }.unwrap();
            let ptr = reserve(G, 0);
            assert_eq!(map(ptr, G, handle), CUresult::CUDA_SUCCESS);
            assert_eq!(set_access_at(ptr, G, numa, 0), expected, "host NUMA access to {created:?} memory");
            assert_eq!(unmap(ptr, G), CUresult::CUDA_SUCCESS);
            assert_eq!(release(handle), CUresult::CUDA_SUCCESS);
            assert_eq!(free_range(ptr, G), CUresult::CUDA_SUCCESS);
        }
    });
}

/// `cuMemGetAddressRange` in mapped memory names the mapping the address lies in, as GPUs do
/// (one `cuMemCreate` handle's extent, not the reservation's); reserved addresses with nothing
/// mapped are in no allocation.
#[test]
fn the_address_range_of_mapped_memory_is_its_mapping() {
    in_child!(&[], || {
        use_device(0);
        let base = reserve(3 * G, 0);
        let (first, second) = (create(G, 0).unwrap(), create(G, 0).unwrap());
        assert_eq!(map(base, G, first), CUresult::CUDA_SUCCESS);
        assert_eq!(map(base + G as u64, G, second), CUresult::CUDA_SUCCESS);
        assert_eq!(address_range(base), Ok((base, G)));
        assert_eq!(address_range(base + G as u64 - 1), Ok((base, G)));
        assert_eq!(address_range(base + G as u64 + 5), Ok((base + G as u64, G)));
        assert_eq!(address_range(base + 2 * G as u64), Err(CUresult::CUDA_ERROR_NOT_FOUND), "reserved, not mapped");
        assert_eq!(unmap(base, 2 * G), CUresult::CUDA_SUCCESS);
        assert_eq!(address_range(base), Err(CUresult::CUDA_ERROR_NOT_FOUND), "unmapped");
        assert_eq!((release(first), release(second)), (CUresult::CUDA_SUCCESS, CUresult::CUDA_SUCCESS));
        assert_eq!(free_range(base, 3 * G), CUresult::CUDA_SUCCESS);
    });
}
