//! Sharing pools between processes: pool file descriptors and exported pointers, in one process
//! (importing one's own export) and across a spawned child.

mod common;

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use common::*;
use cuda_sys::types::{
    CUmemAllocationHandleType, CUmemAllocationType, CUmemLocation, CUmemLocationType, CUmemPoolProps,
    CUmemPoolPtrExportData, CUmemoryPool,
};

const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

fn props(location: CUmemLocation, ipc: bool) -> CUmemPoolProps {
    CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: if ipc { POSIX_FD } else { CUmemAllocationHandleType(0) },
        location,
        ..CUmemPoolProps::default()
    }
}

fn device0() -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: 0 }
}

fn host_numa0() -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: 0 }
}

fn create_pool(props: &CUmemPoolProps) -> CUmemoryPool {
    let mut pool = std::ptr::null_mut();
    // SAFETY: valid out-pointer and properties.
    unsafe { cu_call!(driver(), cuMemPoolCreate(&mut pool, props)) }.unwrap();
    pool
}

fn alloc(pool: CUmemoryPool, size: usize) -> CUdeviceptr {
    let mut ptr = 0;
    // SAFETY: valid out-pointer; the legacy stream of the current context.
    unsafe { cu_call!(driver(), cuMemAllocFromPoolAsync(&mut ptr, size, pool, NULL_STREAM)) }.unwrap();
    ptr
}

fn export_fd(pool: CUmemoryPool) -> OwnedFd {
    let mut fd: c_int = -1;
    // SAFETY: `fd` is a valid out-pointer for an int.
    unsafe { cu_call!(driver(), cuMemPoolExportToShareableHandle((&raw mut fd).cast(), pool, POSIX_FD, 0)) }.unwrap();
    // SAFETY: the driver handed over a new descriptor the caller owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn import_pool(fd: &OwnedFd) -> Result<CUmemoryPool, CUresult> {
    let mut pool = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the fd travels as a pointer-sized integer, as the API takes it.
    let code = unsafe {
        code!(
            driver(),
            cuMemPoolImportFromShareableHandle(&mut pool, fd.as_raw_fd() as isize as *mut c_void, POSIX_FD, 0)
        )
    };
    if code == CUresult::CUDA_SUCCESS { Ok(pool) } else { Err(code) }
}

fn export_ptr(ptr: CUdeviceptr) -> Result<CUmemPoolPtrExportData, CUresult> {
    let mut data = CUmemPoolPtrExportData::default();
    // SAFETY: valid out-pointer.
    let code = unsafe { code!(driver(), cuMemPoolExportPointer(&mut data, ptr)) };
    if code == CUresult::CUDA_SUCCESS { Ok(data) } else { Err(code) }
}

fn import_ptr(pool: CUmemoryPool, mut data: CUmemPoolPtrExportData) -> Result<CUdeviceptr, CUresult> {
    let mut ptr = 0;
    // SAFETY: valid pointers for the call.
    let code = unsafe { code!(driver(), cuMemPoolImportPointer(&mut ptr, pool, &mut data)) };
    if code == CUresult::CUDA_SUCCESS { Ok(ptr) } else { Err(code) }
}

fn free(ptr: CUdeviceptr) -> CUresult {
    // SAFETY: freeing a pointer; errors are returned, not undefined.
    unsafe { code!(driver(), cuMemFreeAsync(ptr, NULL_STREAM)) }
}

#[test]
fn an_imported_allocation_shares_bytes_at_its_own_address() {
    for location in [device0(), host_numa0()] {
        use_device(0);
        let pool = create_pool(&props(location, true));
        let ptr = alloc(pool, 10_000);
        htod(ptr, &[7u8; 10_000]);
        let fd = export_fd(pool);
        let imported_pool = import_pool(&fd).unwrap();
        let data = export_ptr(ptr).unwrap();
        let mapped = import_ptr(imported_pool, data).unwrap();
        assert_ne!(mapped, ptr);
        assert_eq!(dtoh(mapped, 10_000), vec![7u8; 10_000]);
        htod(mapped, &[9u8; 100]);
        assert_eq!(&dtoh(ptr, 200)[..], &[[9u8; 100], [7u8; 100]].concat()[..]);
        // A duplicate import is the same pointer and is not counted: one free unmaps both.
        assert_eq!(import_ptr(imported_pool, data), Ok(mapped));
        assert_eq!(free(mapped), CUresult::CUDA_SUCCESS);
        assert_eq!(free(mapped), CUresult::CUDA_ERROR_INVALID_VALUE);
        // The exporter's memory is unaffected.
        assert_eq!(dtoh(ptr, 1), vec![9u8]);
        assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
        sync(NULL_STREAM);
    }
}

#[test]
fn export_and_import_errors() {
    use_device(0);
    let plain = create_pool(&props(device0(), false));
    let mut fd: c_int = -1;
    // SAFETY: valid out-pointer.
    let code = unsafe { code!(driver(), cuMemPoolExportToShareableHandle((&raw mut fd).cast(), plain, POSIX_FD, 0)) };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE, "a pool without handle types");
    let plain_ptr = alloc(plain, 64);
    assert_eq!(export_ptr(plain_ptr), Err(CUresult::CUDA_ERROR_INVALID_VALUE));

    let shareable = create_pool(&props(device0(), true));
    let fd = export_fd(shareable);
    let mut raw: c_int = -1;
    // SAFETY: valid out-pointer; a wrong handle type.
    let code = unsafe {
        code!(
            driver(),
            cuMemPoolExportToShareableHandle(
                (&raw mut raw).cast(),
                shareable,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                0
            )
        )
    };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);

    // A file descriptor that is not a pool.
    let not_a_pool: OwnedFd = std::fs::File::open("/proc/self/status").unwrap().into();
    assert_eq!(import_pool(&not_a_pool), Err(CUresult::CUDA_ERROR_INVALID_VALUE));

    let imported = import_pool(&fd).unwrap();
    // Imported pools cannot allocate.
    let mut ptr = 0;
    // SAFETY: valid out-pointer.
    let code = unsafe { code!(driver(), cuMemAllocFromPoolAsync(&mut ptr, 64, imported, NULL_STREAM)) };
    assert_eq!(code, CUresult::CUDA_ERROR_INVALID_VALUE);

    // Garbage, tampered, and another pool's export data.
    assert_eq!(
        import_ptr(imported, CUmemPoolPtrExportData { reserved: [0xa5; 64] }),
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    let real = export_ptr(alloc(shareable, 128)).unwrap();
    let mut tampered = real;
    tampered.reserved[30] ^= 0x40;
    assert_eq!(import_ptr(imported, tampered), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    let other = create_pool(&props(device0(), true));
    let other_data = export_ptr(alloc(other, 128)).unwrap();
    assert_eq!(import_ptr(imported, other_data), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "wrong pool");
    // Importing into the exporting pool itself is refused too.
    assert_eq!(import_ptr(shareable, real), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    assert!(import_ptr(imported, real).is_ok());
}

#[test]
fn a_child_process_sees_and_changes_the_parent_memory() {
    const FD_ENV: &str = "CUDA_SIM_TEST_POOL_FD";
    const DATA_ENV: &str = "CUDA_SIM_TEST_POINTER";
    if let (Ok(fd), Ok(data)) = (std::env::var(FD_ENV), std::env::var(DATA_ENV)) {
        // Child: import, check, write back.
        use_device(0);
        // SAFETY: the parent made this descriptor inheritable for this child.
        let fd = unsafe { OwnedFd::from_raw_fd(fd.parse().unwrap()) };
        let bytes: Vec<u8> = (0..64).map(|i| u8::from_str_radix(&data[2 * i..2 * i + 2], 16).unwrap()).collect();
        let pool = import_pool(&fd).unwrap();
        let ptr = import_ptr(pool, CUmemPoolPtrExportData { reserved: bytes.try_into().unwrap() }).unwrap();
        assert_eq!(dtoh(ptr, 4096), vec![0x5a; 4096]);
        htod(ptr, &[0xc3; 4096]);
        assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
        sync(NULL_STREAM);
        return;
    }
    use_device(0);
    let pool = create_pool(&props(device0(), true));
    let ptr = alloc(pool, 4096);
    htod(ptr, &[0x5a; 4096]);
    let fd = export_fd(pool);
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).unwrap();
    let data: String = export_ptr(ptr).unwrap().reserved.iter().map(|b| format!("{b:02x}")).collect();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_child_process_sees_and_changes_the_parent_memory", "--nocapture"])
        .env(FD_ENV, fd.as_raw_fd().to_string())
        .env(DATA_ENV, data)
        .output()
        .unwrap();
    assert!(output.status.success() && String::from_utf8_lossy(&output.stdout).contains("1 passed"), "{output:?}");
    assert_eq!(dtoh(ptr, 4096), vec![0xc3; 4096]);
}
