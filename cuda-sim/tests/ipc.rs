//! Sharing pools between processes: pool file descriptors and exported pointers, in one process
//! (importing one's own export) and across a spawned child; and, across processes that number
//! the devices differently (`CUDA_VISIBLE_DEVICES`), pools and VMM allocations.

mod common;

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use common::*;
use cuda_mem_sys::types::{
    CUmemAllocationHandleType, CUmemAllocationProp, CUmemAllocationType, CUmemFabricHandle,
    CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUmemPoolProps, CUmemPoolPtrExportData,
    CUmemoryPool, CUuuid,
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
        // A host pool's memory is the host CPU's until a device is given access, imported too.
        let host = location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        let readwrite = CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if host {
            assert_eq!(set_access(pool, 0, readwrite), CUresult::CUDA_SUCCESS);
        }
        let ptr = alloc(pool, 10_000);
        htod(ptr, &[7u8; 10_000]);
        let fd = export_fd(pool);
        let imported_pool = import_pool(&fd).unwrap();
        if host {
            assert_eq!(set_access(imported_pool, 0, readwrite), CUresult::CUDA_SUCCESS);
        }
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

/// The file offset the simulator's export data names (bytes 24..32, see `shared.rs`).
fn offset_of(data: &CUmemPoolPtrExportData) -> u64 {
    u64::from_le_bytes(data.reserved[24..32].try_into().unwrap())
}

/// A device pool's allocation filled with one byte, and its import through the pool imported in
/// this process.
struct Shared {
    pool: CUmemoryPool,
    imported: CUmemoryPool,
    ptr: CUdeviceptr,
    data: CUmemPoolPtrExportData,
    mapped: CUdeviceptr,
}

fn shared_allocation(size: usize, byte: u8) -> Shared {
    use_device(0);
    let pool = create_pool(&props(device0(), true));
    let imported = import_pool(&export_fd(pool)).unwrap();
    let ptr = alloc(pool, size);
    htod(ptr, &vec![byte; size]);
    let data = export_ptr(ptr).unwrap();
    let mapped = import_ptr(imported, data).unwrap();
    Shared { pool, imported, ptr, data, mapped }
}

/// cuda.h: "The imported memory must be freed from all importing processes before being freed in
/// the exporting process." An exporter that frees first leaves the importer reading poison, not
/// the next allocation's bytes: the range is kept from new allocations until the importer frees
/// it. Export data of an allocation already freed no longer imports.
#[test]
fn an_exporter_freeing_before_its_importer_poisons_the_bytes_and_keeps_them_until_the_importer_frees() {
    let Shared { pool, imported, ptr, data, mapped } = shared_allocation(8192, 7);
    assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
    sync(NULL_STREAM);
    assert_eq!(dtoh(mapped, 8192), vec![0xdb; 8192], "poisoned when the exporter's free ran");

    let next = alloc(pool, 8192);
    let next_data = export_ptr(next).unwrap();
    assert_ne!(offset_of(&next_data), offset_of(&data), "not reused while imported");
    htod(next, &[1; 8192]);
    assert_eq!(dtoh(mapped, 8192), vec![0xdb; 8192]);
    // Even where it is still mapped: the allocation it names is gone.
    assert_eq!(import_ptr(imported, data), Err(CUresult::CUDA_ERROR_INVALID_VALUE), "freed by its exporter");

    assert_eq!(free(mapped), CUresult::CUDA_SUCCESS);
    sync(NULL_STREAM);
    let reused = alloc(pool, 8192);
    assert_eq!(offset_of(&export_ptr(reused).unwrap()), offset_of(&data), "free again once unmapped");
    for p in [next, reused] {
        assert_eq!(free(p), CUresult::CUDA_SUCCESS);
    }
    sync(NULL_STREAM);
}

/// In the right order (the importer's free before the exporter's) nothing is poisoned and the
/// range is reused at once; a synchronous `cuMemFree` by the exporter is checked as the
/// stream-ordered one is.
#[test]
fn frees_in_the_documented_order_poison_nothing() {
    let Shared { pool, ptr, data, mapped, .. } = shared_allocation(4096, 3);
    assert_eq!(free(mapped), CUresult::CUDA_SUCCESS);
    sync(NULL_STREAM);
    assert_eq!(dtoh(ptr, 4096), vec![3; 4096]);
    // SAFETY: a live pool allocation, freed once.
    assert_eq!(unsafe { code!(driver(), cuMemFree_v2(ptr)) }, CUresult::CUDA_SUCCESS);
    let again = alloc(pool, 4096);
    assert_eq!(offset_of(&export_ptr(again).unwrap()), offset_of(&data));
    assert_eq!(free(again), CUresult::CUDA_SUCCESS);
    sync(NULL_STREAM);
}

/// An importer that dies holding an allocation drops its hold with it (the kernel's record of it
/// goes with the process): the exporter's later free is in order.
#[test]
fn an_importer_that_exits_holding_an_allocation_lets_the_exporter_free_it() {
    const ROLE_FD_ENV: &str = "CUDA_SIM_TEST_HOLDING_FD";
    if let (Ok(fd), Ok(data)) = (std::env::var(ROLE_FD_ENV), std::env::var(POINTER_ENV)) {
        use_device(0);
        // SAFETY: the parent made this descriptor inheritable for this child.
        let pool = import_pool(&unsafe { OwnedFd::from_raw_fd(fd.parse().unwrap()) }).unwrap();
        let ptr = import_ptr(pool, CUmemPoolPtrExportData { reserved: unhex(&data).try_into().unwrap() }).unwrap();
        assert_eq!(dtoh(ptr, 4096), vec![0x5a; 4096]);
        // Exits without freeing.
        return;
    }
    let name = test_name!();
    in_child!(&[], || {
        let (pool, ptr, data) = run_importer(&name, ROLE_FD_ENV);
        assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
        sync(NULL_STREAM);
        let again = alloc(pool, 4096);
        assert_eq!(offset_of(&export_ptr(again).unwrap()), offset_of(&data), "reused: no importer left");
        assert_eq!(free(again), CUresult::CUDA_SUCCESS);
        sync(NULL_STREAM);
    });
}

/// The importer of [`an_importer_cannot_resize_the_pool_under_the_exporter`]: every way to
/// change the size of the pool's file fails (it would make the exporter's next access to its
/// memory a SIGBUS), and the memory is still shared.
fn resizing_importer(fd: OwnedFd, data: &str) {
    use_device(0);
    let pool = import_pool(&fd).unwrap();
    let ptr = import_ptr(pool, CUmemPoolPtrExportData { reserved: unhex(data).try_into().unwrap() }).unwrap();
    let len = rustix::fs::fstat(&fd).unwrap().st_size as u64;
    for to in [0, 4096, len - 4096, len + 4096, 1 << 40] {
        assert_eq!(rustix::fs::ftruncate(&fd, to), Err(rustix::io::Errno::PERM), "ftruncate to {to} bytes");
    }
    let seal = rustix::fs::fcntl_add_seals(&fd, rustix::fs::SealFlags::WRITE);
    assert_eq!(seal, Err(rustix::io::Errno::PERM), "no seal can be added");
    assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size as u64, len);
    assert_eq!(dtoh(ptr, 4096), vec![0x5a; 4096]);
    htod(ptr, &[0xc3; 4096]);
    assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
    sync(NULL_STREAM);
}

/// A pool's file is sealed at its size: an importer that tries to shrink (or grow) it gets
/// `EPERM`, and the exporter, whose memory it maps, lives on (it died of SIGBUS).
#[test]
fn an_importer_cannot_resize_the_pool_under_the_exporter() {
    const ROLE_FD_ENV: &str = "CUDA_SIM_TEST_RESIZE_FD";
    if let (Ok(fd), Ok(data)) = (std::env::var(ROLE_FD_ENV), std::env::var(POINTER_ENV)) {
        // SAFETY: the parent made this descriptor inheritable for this child.
        return resizing_importer(unsafe { OwnedFd::from_raw_fd(fd.parse().unwrap()) }, &data);
    }
    let name = test_name!();
    in_child!(&[], || {
        let (pool, ptr, _) = run_importer(&name, ROLE_FD_ENV);
        // The exporter's memory is whole: what the importer wrote, then more of the pool.
        assert_eq!(dtoh(ptr, 4096), vec![0xc3; 4096]);
        let later = alloc(pool, 1 << 20);
        htod(later, &[0x11; 1 << 20]);
        assert_eq!(dtoh(later, 1 << 20), vec![0x11; 1 << 20]);
        for p in [ptr, later] {
            assert_eq!(free(p), CUresult::CUDA_SUCCESS);
        }
        sync(NULL_STREAM);
    });
}

/// The exporter's side of the tests with an importing child: a device pool's allocation of
/// 4096 bytes of 0x5a, its pool's descriptor and export data handed to this test binary run as
/// the child `name` (through `role_env` and [`POINTER_ENV`]), which must pass.
fn run_importer(name: &str, role_env: &str) -> (CUmemoryPool, CUdeviceptr, CUmemPoolPtrExportData) {
    use_device(0);
    let pool = create_pool(&props(device0(), true));
    let ptr = alloc(pool, 4096);
    htod(ptr, &[0x5a; 4096]);
    sync(NULL_STREAM);
    let fd = export_fd(pool);
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()).unwrap();
    let data = export_ptr(ptr).unwrap();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(role_env, fd.as_raw_fd().to_string())
        .env(POINTER_ENV, hex(&data.reserved))
        .output()
        .unwrap();
    assert!(output.status.success() && String::from_utf8_lossy(&output.stdout).contains("1 passed"), "{output:?}");
    (pool, ptr, data)
}

/// A copy of the real file, `len` bytes long, with `header` (its first page) written in: sealed as
/// the simulator seals its files, or not sealed at all.
fn copy_of(header: &[u8], len: u64, sealed: bool) -> OwnedFd {
    use rustix::fs::{MemfdFlags, SealFlags};
    let flags = if sealed { MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING } else { MemfdFlags::CLOEXEC };
    let file = rustix::fs::memfd_create("forged", flags).unwrap();
    rustix::fs::ftruncate(&file, len).unwrap();
    rustix::io::pwrite(&file, header, 0).unwrap();
    if sealed {
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).unwrap();
    }
    file
}

/// The first page and the length of a shared file.
fn header_and_len(fd: &OwnedFd) -> (Vec<u8>, u64) {
    let mut header = vec![0u8; 4096];
    assert_eq!(rustix::io::pread(fd, &mut header, 0).unwrap(), 4096);
    (header, rustix::fs::fstat(fd).unwrap().st_size as u64)
}

/// Importing a pool or VMM allocation checks the file, not only its header: a file that is not
/// sealed (an importer could truncate it under everyone mapping it), or whose size is not the
/// one its header states, or whose header fails its checksum, is `CUDA_ERROR_INVALID_VALUE`. A
/// faithful sealed copy is accepted, so each refusal is for the reason tested.
#[test]
fn forged_and_unsealed_pool_and_vmm_files_are_refused() {
    use_device(0);
    let invalid = CUresult::CUDA_ERROR_INVALID_VALUE;
    let (header, len) = header_and_len(&export_fd(create_pool(&props(device0(), true))));
    assert_eq!(import_pool(&copy_of(&header, len, false)), Err(invalid), "not sealed");
    assert_eq!(import_pool(&copy_of(&header, len + 4096, true)), Err(invalid), "another size");
    assert_eq!(import_pool(&copy_of(&header, len - 4096, true)), Err(invalid), "another size");
    // The header's 50 bytes (see the simulator's `shared` module): any change fails.
    for i in 0..50 {
        let mut forged = header.clone();
        forged[i] ^= 0x04;
        assert_eq!(import_pool(&copy_of(&forged, len, true)), Err(invalid), "header byte {i} changed");
    }
    let faithful = import_pool(&copy_of(&header, len, true)).unwrap();
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuMemPoolDestroy(faithful)) }.unwrap();

    let prop = CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: POSIX_FD,
        location: device0(),
        ..CUmemAllocationProp::default()
    };
    let mut vmm = 0;
    // SAFETY: valid pointers for the call.
    unsafe { cu_call!(driver(), cuMemCreate(&mut vmm, VMM_SIZE, &prop, 0)) }.unwrap();
    let mut raw: c_int = -1;
    // SAFETY: valid out-pointer for an int.
    unsafe { cu_call!(driver(), cuMemExportToShareableHandle((&raw mut raw).cast(), vmm, POSIX_FD, 0)) }.unwrap();
    // SAFETY: the driver handed over a new descriptor.
    let (header, len) = header_and_len(&unsafe { OwnedFd::from_raw_fd(raw) });
    let import = |fd: &OwnedFd| vmm_import(fd.as_raw_fd() as isize as *mut c_void, POSIX_FD);
    assert_eq!(import(&copy_of(&header, len, false)), Err(invalid), "not sealed");
    assert_eq!(import(&copy_of(&header, len + 4096, true)), Err(invalid), "another size");
    // The header's 33 bytes (see the simulator's `vmm` module).
    for i in 0..33 {
        let mut forged = header.clone();
        forged[i] ^= 0x04;
        assert_eq!(import(&copy_of(&forged, len, true)), Err(invalid), "header byte {i} changed");
    }
    for handle in [import(&copy_of(&header, len, true)).unwrap(), vmm] {
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemRelease(handle)) }.unwrap();
    }
}

/// What the exporter of [`records_name_the_physical_device_whatever_the_ordinals`] passes to each
/// importer (all in the environment; the descriptors are inherited).
const IMPORT_ROLE_ENV: &str = "CUDA_SIM_TEST_IMPORT_EXPECT";
const POOL_FD_ENV: &str = "CUDA_SIM_TEST_POOL_FD";
const POINTER_ENV: &str = "CUDA_SIM_TEST_POINTER";
const VMM_FD_ENV: &str = "CUDA_SIM_TEST_VMM_FD";
const FABRIC_ENV: &str = "CUDA_SIM_TEST_FABRIC";
const UUID_ENV: &str = "CUDA_SIM_TEST_UUID";
const VMM_SIZE: usize = 2 << 20;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len() / 2).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn device_uuid(device: c_int) -> [u8; 16] {
    let mut uuid = CUuuid::default();
    // SAFETY: `uuid` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuDeviceGetUuid_v2(&mut uuid, device)) }.unwrap();
    uuid.bytes.map(|b| b as u8)
}

/// The device ordinal of a VMM allocation handle, as `cuMemGetAllocationPropertiesFromHandle`
/// reports it.
fn vmm_device(handle: CUmemGenericAllocationHandle) -> c_int {
    let mut prop = CUmemAllocationProp::default();
    // SAFETY: valid out-pointer.
    unsafe { cu_call!(driver(), cuMemGetAllocationPropertiesFromHandle(&mut prop, handle)) }.unwrap();
    assert_eq!(prop.location.type_, CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE);
    prop.location.id
}

fn vmm_import(os_handle: *mut c_void, handle_type: CUmemAllocationHandleType) -> Result<u64, CUresult> {
    let mut handle = 0;
    // SAFETY: `os_handle` is a descriptor cast to a pointer, or a pointer to a fabric handle.
    let code = unsafe { code!(driver(), cuMemImportFromShareableHandle(&mut handle, os_handle, handle_type)) };
    if code == CUresult::CUDA_SUCCESS { Ok(handle) } else { Err(code) }
}

/// A process of another `CUDA_VISIBLE_DEVICES` imports what the exporter shared: it must find the
/// exporter's device at ordinal `expect`, or refuse everything when `expect` is `none`.
fn importer(expect: &str) {
    let var = |name: &str| std::env::var(name).unwrap();
    // SAFETY: the exporter made these descriptors inheritable for this process.
    let (pool_fd, vmm_fd) = unsafe {
        (
            OwnedFd::from_raw_fd(var(POOL_FD_ENV).parse().unwrap()),
            OwnedFd::from_raw_fd(var(VMM_FD_ENV).parse().unwrap()),
        )
    };
    let mut fabric = CUmemFabricHandle { data: unhex(&var(FABRIC_ENV)).try_into().unwrap() };
    let vmm_os_handle = vmm_fd.as_raw_fd() as isize as *mut c_void;
    let fabric_type = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
    use_device(0);
    let Ok(expect) = expect.parse::<c_int>() else {
        // The exporter's device is hidden here: nothing that names it is imported.
        assert_eq!(import_pool(&pool_fd), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(vmm_import(vmm_os_handle, POSIX_FD), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(vmm_import((&raw mut fabric).cast(), fabric_type), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        return;
    };
    // The same GPU: the exporter's UUID is this process's device `expect`.
    assert_eq!(hex(&device_uuid(expect)), var(UUID_ENV));
    use_device(expect);
    let pool = import_pool(&pool_fd).unwrap();
    let data = CUmemPoolPtrExportData { reserved: unhex(&var(POINTER_ENV)).try_into().unwrap() };
    let ptr = import_ptr(pool, data).unwrap();
    let mut ordinal: c_int = -1;
    // SAFETY: DEVICE_ORDINAL is an int.
    unsafe {
        cu_call!(
            driver(),
            cuPointerGetAttribute(
                (&raw mut ordinal).cast(),
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr
            )
        )
    }
    .unwrap();
    assert_eq!(ordinal, expect, "the imported pool's memory is on this process's ordinal for the device");
    assert_eq!(dtoh(ptr, 4096), vec![0x3c; 4096]);
    assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
    sync(NULL_STREAM);
    for handle in
        [vmm_import(vmm_os_handle, POSIX_FD).unwrap(), vmm_import((&raw mut fabric).cast(), fabric_type).unwrap()]
    {
        assert_eq!(vmm_device(handle), expect);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemRelease(handle)) }.unwrap();
    }
}

/// The exporter sees physical devices 2 and 0 (`CUDA_VISIBLE_DEVICES=2,0`) and shares a pool and
/// a VMM allocation of its device 0, physical device 2. Processes that number the devices
/// otherwise import them on their own ordinal for physical device 2, and one that does not see it
/// refuses them.
#[test]
fn records_name_the_physical_device_whatever_the_ordinals() {
    if let Ok(expect) = std::env::var(IMPORT_ROLE_ENV) {
        return importer(&expect);
    }
    let name = test_name!();
    // The importers inherit the IMEX channel, which fabric handles need.
    let machine = [("CUDA_SIM_DEVICES", "3"), ("CUDA_VISIBLE_DEVICES", "2,0"), ("CUDA_SIM_IMEX_CHANNEL", "0")];
    in_child!(&machine, || {
        use_device(0);
        let pool = create_pool(&props(device0(), true));
        let ptr = alloc(pool, 4096);
        htod(ptr, &[0x3c; 4096]);
        sync(NULL_STREAM);
        let pool_fd = export_fd(pool);
        let data = export_ptr(ptr).unwrap();
        let handle_types = POSIX_FD.0 | CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
        let prop = CUmemAllocationProp {
            type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: CUmemAllocationHandleType(handle_types),
            location: device0(),
            ..CUmemAllocationProp::default()
        };
        let mut vmm = 0;
        // SAFETY: valid pointers for the call.
        unsafe { cu_call!(driver(), cuMemCreate(&mut vmm, VMM_SIZE, &prop, 0)) }.unwrap();
        assert_eq!(vmm_device(vmm), 0, "the creator sees its own ordinal");
        let mut raw: c_int = -1;
        // SAFETY: valid out-pointer for an int.
        unsafe { cu_call!(driver(), cuMemExportToShareableHandle((&raw mut raw).cast(), vmm, POSIX_FD, 0)) }.unwrap();
        // SAFETY: the driver handed over a new descriptor.
        let vmm_fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut fabric = CUmemFabricHandle::default();
        let fabric_type = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        // SAFETY: valid out-pointer for a fabric handle.
        unsafe { cu_call!(driver(), cuMemExportToShareableHandle((&raw mut fabric).cast(), vmm, fabric_type, 0)) }
            .unwrap();
        for fd in [&pool_fd, &vmm_fd] {
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).unwrap();
        }
        let uuid = hex(&device_uuid(0));
        let by_uuid =
            format!("GPU-{}-{}-{}-{}-{}", &uuid[..8], &uuid[8..12], &uuid[12..16], &uuid[16..20], &uuid[20..]);
        for (visible, expect) in
            [("0,1,2", "2"), ("2", "0"), ("1,2,0", "1"), (&by_uuid[..12], "0"), (&by_uuid, "0"), ("0,1", "none")]
        {
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &name, "--nocapture", "--test-threads=1"])
                .env("CUDA_VISIBLE_DEVICES", visible)
                .env(IMPORT_ROLE_ENV, expect)
                .env(POOL_FD_ENV, pool_fd.as_raw_fd().to_string())
                .env(POINTER_ENV, hex(&data.reserved))
                .env(VMM_FD_ENV, vmm_fd.as_raw_fd().to_string())
                .env(FABRIC_ENV, hex(&fabric.data))
                .env(UUID_ENV, &uuid)
                .output()
                .unwrap();
            assert!(
                output.status.success() && String::from_utf8_lossy(&output.stdout).contains("1 passed"),
                "importer with CUDA_VISIBLE_DEVICES={visible:?}: {output:?}"
            );
        }
        assert_eq!(free(ptr), CUresult::CUDA_SUCCESS);
        sync(NULL_STREAM);
        // SAFETY: no pointers.
        unsafe { cu_call!(driver(), cuMemRelease(vmm)) }.unwrap();
    });
}

/// The descriptors this process has open on the simulator's pool files (its exported and
/// imported pools' `memfd`s, and the descriptions an imported pool records its holds on).
fn pool_files() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("cuda-sim-pool"))
        .count()
}

/// One thread's round: import the pool, map one of its allocations, use it and free it on the
/// thread's stream (its per-thread default stream, or a stream it creates and destroys), destroy
/// the import, and exit with that work still pending when `gate` holds the stream.
fn import_round(pool: usize, fd: &OwnedFd, per_thread: bool, gate: Option<&'static Gate>) {
    use_device(0);
    let d = driver();
    let stream = if per_thread { STREAM_PER_THREAD } else { non_blocking_stream() };
    let imported = import_pool(fd).unwrap();
    let mut ptr = 0;
    // SAFETY: a valid out-pointer; `pool` is the exporting pool, live for the whole test.
    unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut ptr, 4096, pool as CUmemoryPool, stream)) }.unwrap();
    sync(stream);
    let mapped = import_ptr(imported, export_ptr(ptr).unwrap()).unwrap();
    if let Some(gate) = gate {
        hold(gate, d, stream);
    }
    memset_async(mapped, 5, 4096, stream);
    // SAFETY: both live allocations, freed once, the import first (cuda.h's order).
    unsafe {
        cu_call!(d, cuMemFreeAsync(mapped, stream)).unwrap();
        cu_call!(d, cuMemFreeAsync(ptr, stream)).unwrap();
    }
    // SAFETY: the import's last allocation is freed (in stream order); the handle is not used again.
    unsafe { cu_call!(d, cuMemPoolDestroy(imported)) }.unwrap();
    if !per_thread {
        // SAFETY: a stream this thread created; its pending work still completes.
        unsafe { cu_call!(d, cuStreamDestroy_v2(stream)) }.unwrap();
    }
}

/// Pools imported and dropped by threads at once close their files on their last release: once
/// the threads are gone and the context is synchronized, the process has exactly the exporter's
/// pool files open again, also where the last free of an import was still pending on a stream
/// when its thread exited (its per-thread default stream, or a stream destroyed with work).
#[test]
fn imported_pools_close_their_files_once_released_and_synchronized() {
    in_child!(&[], || {
        const THREADS: usize = 6;
        const ROUNDS: usize = 20;
        use_device(0);
        let exporter = create_pool(&props(device0(), true));
        let fd = std::sync::Arc::new(export_fd(exporter));
        let baseline = pool_files();
        for round in 0..ROUNDS {
            let (gate, _guard) = Gate::new();
            let threads: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (fd, pool) = (std::sync::Arc::clone(&fd), exporter as usize);
                    // Half the threads leave their work held until every thread has exited.
                    let held = (t % 2 == 0).then_some(gate);
                    std::thread::spawn(move || import_round(pool, &fd, t % 3 != 0, held))
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            gate.open();
            // SAFETY: no pointers.
            unsafe { cu_call!(driver(), cuCtxSynchronize()) }.unwrap();
            assert_eq!(pool_files(), baseline, "round {round}: pool files left open after the last release");
        }
    });
}
