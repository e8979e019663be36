//! DLPack (feature `dlpack`): exports of every buffer kind and import back, the deleter's
//! exactly-once call, the keep-alive, the stream exchange and every refusal.

#![cfg(feature = "dlpack")]

mod common;

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Gate, OPEN_DELAY, hold};
use cuda_mem_core::dlpark::DlpackFlags;
use cuda_mem_core::dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor};
use cuda_mem_core::dlpark::metadata::Dynamic;
use cuda_mem_core::{
    Buffer, ConsumerStream, Device, DeviceMemoryResource, DlpackElement, DlpackError, DlpackImport, DlpackTensor,
    Error, ExportOptions, ForeignMemory, LegacyPinnedMemoryResource, ManagedMemoryResource, MemoryResource, OwnedBy,
    PinnedMemoryResource, RawStream, Stream, SynchronousMemoryResource, ViewError, export_dlpack,
};
use cuda_sim::testing::{in_simulated_machine, live_objects_if_simulated};

/// Every kind of resource a buffer comes from, and the DLPack device type its memory has.
fn resources(device: Device) -> Vec<(&'static str, Arc<dyn MemoryResource>, DLDeviceType)> {
    vec![
        ("device pool", DeviceMemoryResource::new(device, Default::default()).unwrap(), DLDeviceType::CUDA),
        ("current device pool", DeviceMemoryResource::current(device).unwrap(), DLDeviceType::CUDA),
        ("pinned pool", PinnedMemoryResource::new(Default::default()).unwrap(), DLDeviceType::CUDAHOST),
        ("managed pool", ManagedMemoryResource::new(Default::default()).unwrap(), DLDeviceType::CUDAMANAGED),
        ("cuMemAlloc", SynchronousMemoryResource::new(device), DLDeviceType::CUDA),
        ("cuMemAllocHost", LegacyPinnedMemoryResource::new(device), DLDeviceType::CUDAHOST),
    ]
}

/// A buffer of `resource` holding `data`.
fn filled<T: bytemuck::Pod>(resource: &Arc<dyn MemoryResource>, data: &[T], stream: &Stream) -> Buffer {
    let mut buffer = Buffer::allocate(Arc::clone(resource), size_of_val(data), stream).unwrap();
    buffer.copy_from_slice(data, stream).unwrap();
    buffer
}

/// Exports `data` from a buffer of `resource` and imports it back, checking the tensor.
fn round_trip<T: bytemuck::Pod + DlpackElement + PartialEq + std::fmt::Debug>(
    resource: &Arc<dyn MemoryResource>,
    device_type: DLDeviceType,
    data: &[T],
    stream: &Stream,
) {
    let buffer = filled(resource, data, stream);
    let tensor = buffer.into_dlpack::<T>(&ExportOptions::default()).unwrap();
    // The tensor says what it is before anyone takes it.
    assert_eq!(
        (tensor.shape(), tensor.strides(), tensor.dl_device().device_type),
        (&[data.len() as i64][..], &[1i64][..], device_type)
    );
    assert!(tensor.dtype().matches(T::DTYPE));
    let shown = format!("{tensor:?}");
    assert!(
        shown.starts_with("DlpackTensor { data: 0x") && shown.contains(&format!("shape: [{}]", data.len())),
        "{shown}"
    );
    let import = take(tensor).unwrap();
    assert_eq!(import.dl_device().device_type, device_type);
    let expected_id = if device_type == DLDeviceType::CUDA { resource.device().unwrap().ordinal() as i32 } else { 0 };
    assert_eq!(import.dl_device().device_id, expected_id);
    assert_eq!(import.shape(), [data.len() as i64]);
    assert_eq!(import.strides(), [1]);
    assert!(import.dtype().matches(T::DTYPE) && !import.is_read_only());
    assert_eq!(import.view::<T>().unwrap().to_vec(stream).unwrap(), data);
}

#[test]
fn every_buffer_kind_and_dtype_round_trips() {
    let device = common::device();
    let stream = common::stream(device);
    for (kind, resource, device_type) in resources(device) {
        eprintln!("{kind}");
        round_trip(&resource, device_type, &(0..100).map(|i| i as f32 * 0.5).collect::<Vec<_>>(), &stream);
        round_trip(&resource, device_type, &(0..37).map(|i| i * -3).collect::<Vec<i64>>(), &stream);
        round_trip(&resource, device_type, &(0..50).map(|i| i * 7).collect::<Vec<u16>>(), &stream);
        round_trip(&resource, device_type, &[1.5f64, -2.25, 1e300], &stream);
        round_trip(&resource, device_type, &[0u8, 1, 255], &stream);
        round_trip(&resource, device_type, &[-128i8, 0, 127], &stream);
        round_trip(&resource, device_type, &[u64::MAX, 0], &stream);
        round_trip::<u32>(&resource, device_type, &[], &stream);
    }
}

#[test]
fn bool_and_explicit_dtypes_describe_the_bytes() {
    let device = common::device();
    let stream = common::stream(device);
    let pool = DeviceMemoryResource::current(device).unwrap();
    let bytes = pool.allocate(8, &stream).unwrap();
    let tensor = bytes.into_dlpack::<bool>(&ExportOptions::default()).unwrap();
    let import = take(tensor).unwrap();
    assert!(import.dtype().matches(DLDataType::BOOL));
    assert_eq!(import.buffer().size(), 8);

    // float16, which no Rust element type names, from raw bytes: 2 bytes each.
    let half = DLDataType::new(cuda_mem_core::dlpark::ffi::DLDataTypeCode::FLOAT, 16, 1);
    let tensor = pool.allocate(8, &stream).unwrap().into_dlpack_as(half, &ExportOptions::default()).unwrap();
    let import = take(tensor).unwrap();
    assert_eq!((import.shape(), import.dtype()), (&[4i64][..], half));
}

#[test]
fn shapes_strides_and_sub_ranges_reach_the_right_elements() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let data: Vec<i32> = (0..24).collect();

    // A 2x3x4 shape: compact strides, the same bytes.
    let tensor = filled(&pool, &data, &stream).into_dlpack::<i32>(&ExportOptions::default().shape(&[2, 3, 4])).unwrap();
    let import = take(tensor).unwrap();
    assert_eq!((import.shape(), import.strides()), (&[2i64, 3, 4][..], &[12i64, 4, 1][..]));
    assert_eq!(import.view::<i32>().unwrap().to_vec(&stream).unwrap(), data);

    // Elements 4..16 as a transposed 3x4 (strides 1, 3): not contiguous, so no typed view, but
    // the buffer covers exactly the 12 elements reached.
    let options = ExportOptions::default().elements(4..16).shape_and_strides(&[4, 3], &[1, 4]);
    let tensor = filled(&pool, &data, &stream).into_dlpack::<i32>(&options).unwrap();
    let import = take(tensor).unwrap();
    assert!(!import.is_contiguous());
    let refused = import.view::<i32>().unwrap_err();
    assert!(matches!(refused, Error::Dlpack(DlpackError::NotContiguous { .. })), "{refused}");
    assert_eq!(import.buffer().to_vec::<i32>(&stream).unwrap(), data[4..16]);

    // Reversed: element [0] is the range's last, and the buffer still covers the range.
    let options = ExportOptions::default().elements(..8).shape_and_strides(&[8], &[-1]);
    let tensor = filled(&pool, &data, &stream).into_dlpack::<i32>(&options).unwrap();
    // Element [0] is the eighth of the buffer.
    let first = tensor.data_ptr();
    let import = take(tensor).unwrap();
    assert_eq!(first, import.buffer().ptr() + 7 * 4);
    assert_eq!(import.buffer().to_vec::<i32>(&stream).unwrap(), data[..8]);
}

#[test]
fn views_of_a_shared_buffer_export_their_elements_read_only() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let data: Vec<f64> = (0..16).map(f64::from).collect();
    let shared = Arc::new(filled(&pool, &data, &stream));
    let view = shared.view::<f64>().unwrap();
    let tensor = view.slice(4..10).unwrap().to_dlpack(&shared, &ExportOptions::default().elements(1..)).unwrap();
    assert_eq!(tensor.flags(), DlpackFlags::READ_ONLY);
    let mut import = take(tensor).unwrap();
    assert_eq!(import.view::<f64>().unwrap().to_vec(&stream).unwrap(), data[5..10]);
    let error = import.view_mut::<f64>().unwrap_err();
    assert!(matches!(error, Error::Dlpack(DlpackError::ReadOnly)), "{error}");
    assert!(matches!(import.buffer_mut(), Err(Error::Dlpack(DlpackError::ReadOnly))));

    // The whole Arc, too, is read-only; a view with another buffer's Arc is refused.
    let tensor = export_dlpack::<f64>(Arc::clone(&shared), &ExportOptions::default()).unwrap();
    assert_eq!(tensor.flags(), DlpackFlags::READ_ONLY);
    let other = Arc::new(filled(&pool, &data, &stream));
    let error = refused(view.to_dlpack(&other, &ExportOptions::default()));
    assert!(matches!(error, Error::Dlpack(DlpackError::NotTheViewsBuffer)), "{error}");

    // An owned buffer is writable unless asked: the import writes through it.
    let tensor = filled(&pool, &data, &stream).into_dlpack::<f64>(&ExportOptions::default()).unwrap();
    let mut import = take(tensor).unwrap();
    import.view_mut::<f64>().unwrap().fill(2.0, &stream).unwrap();
    assert_eq!(import.view::<f64>().unwrap().to_vec(&stream).unwrap(), vec![2.0; 16]);
    let tensor = filled(&pool, &data, &stream).into_dlpack::<f64>(&ExportOptions::default().read_only()).unwrap();
    assert_eq!(tensor.flags(), DlpackFlags::READ_ONLY);
}

#[test]
fn an_import_exports_again_and_keeps_its_device_type() {
    let device = common::device();
    let stream = common::stream(device);
    for (kind, resource, device_type) in resources(device) {
        let data: Vec<u32> = (0..64).collect();
        let tensor = filled(&resource, &data, &stream).into_dlpack::<u32>(&ExportOptions::default()).unwrap();
        let import = take(tensor).unwrap();
        // Handed on to another consumer: the first import stays alive in the second tensor, and
        // managed memory stays managed (the import remembers what its producer said).
        let again = export_dlpack::<u32>(import, &ExportOptions::default()).unwrap();
        let second = take(again).unwrap();
        assert_eq!(second.dl_device().device_type, device_type, "{kind}");
        assert_eq!(second.view::<u32>().unwrap().to_vec(&stream).unwrap(), data, "{kind}");
        // Its buffer alone (a view of memory someone else owns, with no resource to ask):
        // managed memory is told apart from pinned memory by the driver's pointer attributes,
        // where it reports them (cuMemAllocManaged memory).
        let held = export_dlpack::<u32>(OwnedBy::new(second, |i| i.buffer()), &ExportOptions::default()).unwrap();
        assert_eq!(held.flags(), DlpackFlags::READ_ONLY, "{kind}");
        let third = take(held).unwrap();
        assert_eq!(third.view::<u32>().unwrap().to_vec(&stream).unwrap(), data, "{kind}");
        if device_type != DLDeviceType::CUDAMANAGED {
            assert_eq!(third.dl_device().device_type, device_type, "{kind}");
        }
    }
}

/// Takes a tensor this test made (from memory it keeps valid, which nothing writes behind the
/// import's back).
fn take(tensor: impl Into<cuda_mem_core::dlpark::versioned::Dlpack>) -> cuda_mem_core::Result<DlpackImport> {
    // SAFETY: see above: every tensor of these tests describes memory the test keeps valid.
    unsafe { DlpackImport::from_dlpack(tensor) }
}

/// The error of an export that must fail (a tensor has no `Debug` for `unwrap_err`).
fn refused(export: cuda_mem_core::Result<DlpackTensor>) -> Error {
    match export {
        Ok(_) => panic!("the export was not refused"),
        Err(error) => error,
    }
}

/// Counts how often the producer's deleter released its context.
struct Released(Arc<AtomicUsize>);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A producer's tensor over `ptr` (which the test keeps valid), counting its releases.
fn foreign(
    ptr: u64,
    device: DLDevice,
    dtype: DLDataType,
    shape: &[i64],
    strides: &[i64],
) -> (cuda_mem_core::dlpark::versioned::Dlpack, Arc<AtomicUsize>) {
    foreign_at(ptr, 0, device, dtype, shape, strides)
}

/// [`foreign`], its elements `byte_offset` bytes past `ptr`.
fn foreign_at(
    ptr: u64,
    byte_offset: u64,
    device: DLDevice,
    dtype: DLDataType,
    shape: &[i64],
    strides: &[i64],
) -> (cuda_mem_core::dlpark::versioned::Dlpack, Arc<AtomicUsize>) {
    let released = Arc::new(AtomicUsize::new(0));
    let mut tensor =
        Dynamic::new(shape.to_vec(), strides.to_vec()).initialize(Box::new(Released(Arc::clone(&released)))).unwrap();
    tensor.set_data(ptr as *mut c_void).set_device(device).set_dtype(dtype).set_byte_offset(byte_offset);
    // SAFETY: the test keeps the memory valid while the tensor lives.
    (unsafe { tensor.finish() }, released)
}

#[test]
fn the_producers_deleter_is_called_once_when_the_import_is_dropped() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let memory = filled(&pool, &[1.0f32, 2.0, 3.0], &stream);
    let (tensor, released) = foreign(memory.ptr(), DLDevice::cuda(0), f32::DTYPE, &[3], &[1]);
    let import = take(tensor).unwrap();
    assert_eq!(import.view::<f32>().unwrap().to_vec(&stream).unwrap(), [1.0, 2.0, 3.0]);
    assert_eq!(released.load(Ordering::SeqCst), 0);
    // Dropped on another thread: the deleter runs there, once.
    std::thread::spawn(move || drop(import)).join().unwrap();
    assert_eq!(released.load(Ordering::SeqCst), 1);

    // From a raw pointer (as a C or Python producer hands it over), and a legacy tensor.
    let (tensor, released) = foreign(memory.ptr(), DLDevice::cuda(0), f32::DTYPE, &[3], &[1]);
    // SAFETY: the tensor is handed over whole, its memory kept valid by the test.
    drop(unsafe { DlpackImport::from_raw(tensor.into_raw()) }.unwrap());
    assert_eq!(released.load(Ordering::SeqCst), 1);
    let legacy_released = Arc::new(AtomicUsize::new(0));
    let mut legacy = Dynamic::compact(vec![3i64])
        .initialize_as::<DLManagedTensor>(Box::new(Released(Arc::clone(&legacy_released))))
        .unwrap();
    legacy.set_data(memory.ptr() as *mut c_void).set_device(DLDevice::cuda(0)).set_dtype(f32::DTYPE);
    // SAFETY: `memory` outlives the tensor.
    let legacy = unsafe { legacy.finish() };
    // SAFETY: as above.
    let import = unsafe { DlpackImport::from_raw_legacy(legacy.into_raw()) }.unwrap();
    assert_eq!(import.view::<f32>().unwrap().to_vec(&stream).unwrap(), [1.0, 2.0, 3.0]);
    drop(import);
    assert_eq!(legacy_released.load(Ordering::SeqCst), 1);
}

/// What a refusal must be.
type Expected = fn(&DlpackError) -> bool;

#[test]
fn refused_imports_release_the_tensor_once_with_a_typed_error() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let memory = filled(&pool, &[0u8; 64], &stream);
    let ptr = memory.ptr();
    let count = Device::count().unwrap();
    let cases: Vec<(DLDevice, u64, &[i64], Expected)> = vec![
        (DLDevice::CPU, ptr, &[4], |e| matches!(e, DlpackError::UnsupportedDevice { device_type: 1, .. })),
        (DLDevice::metal(0), ptr, &[4], |e| matches!(e, DlpackError::UnsupportedDevice { device_type: 8, .. })),
        (DLDevice::cuda(count as i32), ptr, &[4], |e| matches!(e, DlpackError::DeviceNotVisible { .. })),
        (DLDevice::cuda(-1), ptr, &[4], |e| matches!(e, DlpackError::DeviceNotVisible { device_id: -1, .. })),
        (DLDevice::cuda(0), 0, &[4], |e| matches!(e, DlpackError::NullData { bytes: 16 })),
        (DLDevice::cuda(0), ptr, &[-4], |e| matches!(e, DlpackError::Malformed(_))),
    ];
    for (dl_device, data, shape, expected) in cases {
        let (tensor, released) = foreign(data, dl_device, f32::DTYPE, shape, &[1]);
        let error = take(tensor).unwrap_err();
        let Error::Dlpack(error) = &error else { panic!("not a DLPack error: {error}") };
        assert!(expected(error), "{dl_device:?} {shape:?}: {error}");
        assert_eq!(released.load(Ordering::SeqCst), 1, "{error}");
    }

    // A packed 4-bit type is not whole bytes.
    let (tensor, released) = foreign(ptr, DLDevice::cuda(0), DLDataType::F4E2M1FN, &[4], &[1]);
    let error = take(tensor).unwrap_err();
    assert!(matches!(error, Error::Dlpack(DlpackError::UnsupportedDtype { .. })), "{error}");
    assert_eq!(released.load(Ordering::SeqCst), 1);

    // Another major version: released unread, as DLPack requires.
    let (tensor, released) = foreign(ptr, DLDevice::cuda(0), f32::DTYPE, &[4], &[1]);
    let raw = tensor.into_raw();
    // SAFETY: the tensor is this test's; only its version is changed.
    unsafe { (*raw).version.major = 2 };
    // SAFETY: the tensor is handed over whole (its version aside, which must be refused).
    let error = unsafe { DlpackImport::from_raw(raw) }.unwrap_err();
    assert!(matches!(error, Error::Dlpack(DlpackError::UnsupportedVersion { major: 2, supported: 1 })), "{error}");
    assert_eq!(released.load(Ordering::SeqCst), 1);
    // SAFETY: null is refused before anything is read.
    let error = unsafe { DlpackImport::from_raw(std::ptr::null_mut()) }.unwrap_err();
    assert!(matches!(error, Error::Dlpack(DlpackError::NullTensor)), "{error}");

    // Typed views check the data type and the size.
    let (tensor, released) = foreign(ptr, DLDevice::cuda(0), f32::DTYPE, &[3], &[1]);
    let import = take(tensor).unwrap();
    let error = import.view::<u32>().unwrap_err();
    assert!(matches!(error, Error::Dlpack(DlpackError::DtypeMismatch { .. })), "{error}");
    assert!(error.to_string().contains("uint32") && error.to_string().contains("float32"), "{error}");
    let error = import.buffer().view::<f64>().unwrap_err();
    assert!(matches!(error, Error::View(ViewError::Size { size: 12, .. })), "{error}");
    drop(import);
    assert_eq!(released.load(Ordering::SeqCst), 1);
}

/// Imports `tensor`, which must be refused, and checks that its deleter ran once.
fn refused_import(tensor: cuda_mem_core::dlpark::versioned::Dlpack, released: &AtomicUsize) -> DlpackError {
    let error = match take(tensor) {
        Ok(import) => panic!(
            "imported {:?} over {} bytes at {:#x}",
            import.shape(),
            import.buffer().size(),
            import.buffer().ptr()
        ),
        Err(Error::Dlpack(error)) => error,
        Err(other) => panic!("not a DLPack error: {other}"),
    };
    assert_eq!(released.load(Ordering::SeqCst), 1, "{error}");
    error
}

/// A producer's word on where its elements lie is checked against the driver's allocations
/// (a byte offset of 2^63, a shape past the end, elements running into the neighbouring
/// allocation were imported, and the buffer covered memory that was unmapped or another's), as
/// are its data type and the arithmetic of its extent; each refusal releases the tensor once.
#[test]
fn imports_reaching_outside_their_allocation_are_refused_and_released_once() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let (a, b) = (filled(&pool, &[1u8; 64], &stream), filled(&pool, &[2u8; 64], &stream));
    let ptr = a.ptr();
    assert!(ptr < 1 << 62, "device addresses lie below 2^62");
    let cuda = DLDevice::cuda(0);
    let f32x4 = DLDataType::new(DLDataTypeCode::FLOAT, 32, 4);

    // A byte offset of 2^63: no allocation there.
    let (tensor, released) = foreign_at(ptr, 1 << 63, cuda, u8::DTYPE, &[4], &[1]);
    let error = refused_import(tensor, &released);
    assert!(matches!(error, DlpackError::NotAllocated { ptr: p, size: 4 } if p == ptr + (1 << 63)), "{error}");
    // An offset that carries the address past 2^64: the sum is checked, not wrapped.
    let (tensor, released) = foreign_at(ptr, ptr.wrapping_neg(), cuda, u8::DTYPE, &[4], &[1]);
    let error = refused_import(tensor, &released);
    assert!(matches!(error, DlpackError::Malformed(_)), "{error}");

    // Past the allocation's end: by the shape, by lanes, from an offset near its end.
    let outside = |error: &DlpackError, start: u64, bytes: usize| {
        matches!(*error, DlpackError::OutsideAllocation { ptr: p, size, base, allocation: 64 }
            if p == start && size == bytes && base == ptr)
    };
    let cases: [(u64, DLDataType, i64, usize); 3] = [(0, f32::DTYPE, 17, 68), (0, f32x4, 5, 80), (60, u8::DTYPE, 8, 8)];
    for (offset, dtype, len, bytes) in cases {
        let (tensor, released) = foreign_at(ptr, offset, cuda, dtype, &[len], &[1]);
        let error = refused_import(tensor, &released);
        assert!(outside(&error, ptr + offset, bytes), "{error}");
        assert!(error.to_string().contains("run past the allocation"), "{error}");
    }
    // Into the neighbouring allocation, whichever of the two lies lower.
    let (low, high) = (ptr.min(b.ptr()), ptr.max(b.ptr()));
    let span = (high - low) as i64 + 8;
    let (tensor, released) = foreign(low, cuda, u8::DTYPE, &[span], &[1]);
    let error = refused_import(tensor, &released);
    assert!(matches!(error, DlpackError::OutsideAllocation { ptr: p, base, .. } if p == low && base == low), "{error}");
    // Reversed below the allocation's start: what lies there is not the tensor's either.
    let (tensor, released) = foreign(ptr + 2, cuda, u8::DTYPE, &[8], &[-1]);
    let error = refused_import(tensor, &released);
    assert!(matches!(error, DlpackError::NotAllocated { .. } | DlpackError::OutsideAllocation { .. }), "{error}");

    // Data types DLPack does not define: an unknown code, a width its code does not take.
    for dtype in [DLDataType::new(DLDataTypeCode(99), 32, 1), DLDataType::new(DLDataTypeCode::FLOAT, 24, 1)] {
        let (tensor, released) = foreign(ptr, cuda, dtype, &[4], &[1]);
        let error = refused_import(tensor, &released);
        assert!(matches!(error, DlpackError::UnknownDtype { dtype: d } if d == dtype), "{error}");
    }
    // Element and byte counts that overflow.
    let (tensor, released) = foreign(ptr, cuda, u8::DTYPE, &[1 << 62, 1 << 62], &[1 << 62, 1]);
    assert!(matches!(refused_import(tensor, &released), DlpackError::Malformed(_)));
    let wide = DLDataType::new(DLDataTypeCode::FLOAT, 64, 1024);
    let (tensor, released) = foreign(ptr, cuda, wide, &[1 << 60], &[1]);
    assert!(matches!(refused_import(tensor, &released), DlpackError::Malformed(_)));

    // Managed and pinned memory the driver knows are checked the same way.
    let managed: Arc<dyn MemoryResource> = ManagedMemoryResource::new(Default::default()).unwrap();
    let pinned: Arc<dyn MemoryResource> = PinnedMemoryResource::new(Default::default()).unwrap();
    for (resource, device_type) in [(managed, DLDeviceType::CUDAMANAGED), (pinned, DLDeviceType::CUDAHOST)] {
        let memory = filled(&resource, &[3u8; 64], &stream);
        let host = DLDevice { device_type, device_id: 0 };
        let (tensor, released) = foreign(memory.ptr(), host, f32::DTYPE, &[17], &[1]);
        let error = refused_import(tensor, &released);
        assert!(matches!(error, DlpackError::OutsideAllocation { size: 68, allocation: 64, .. }), "{error}");
        if device_type == DLDeviceType::CUDAMANAGED {
            // Pinned host memory the driver does not know is taken on the caller's word (host
            // memory registered elsewhere may be pinned too); managed memory must be known.
            let (tensor, released) = foreign_at(memory.ptr(), 1 << 63, host, f32::DTYPE, &[4], &[1]);
            let error = refused_import(tensor, &released);
            assert!(matches!(error, DlpackError::NotAllocated { size: 16, .. }), "{error}");
        }
        // Inside the allocation: imported.
        let (tensor, released) = foreign_at(memory.ptr(), 48, host, f32::DTYPE, &[4], &[1]);
        let import = take(tensor).unwrap();
        assert_eq!(import.view::<f32>().unwrap().to_vec(&stream).unwrap(), [f32::from_le_bytes([3; 4]); 4]);
        drop(import);
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    // Tensors inside their allocation still import: the whole of it, and its last bytes from
    // an offset, reversed.
    let (tensor, released) = foreign(ptr, cuda, f32::DTYPE, &[16], &[1]);
    assert_eq!(take(tensor).unwrap().buffer().to_vec::<u8>(&stream).unwrap(), [1; 64]);
    assert_eq!(released.load(Ordering::SeqCst), 1);
    let (tensor, released) = foreign_at(ptr, 63, cuda, u8::DTYPE, &[4], &[-1]);
    let import = take(tensor).unwrap();
    assert_eq!((import.buffer().ptr(), import.buffer().size()), (ptr + 60, 4));
    drop(import);
    assert_eq!(released.load(Ordering::SeqCst), 1);
    drop(b);
}

#[test]
fn refused_exports_say_why() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let export = |size: usize, options: ExportOptions<'_>| {
        let buffer = Buffer::allocate(Arc::clone(&pool), size, &stream).unwrap();
        refused(buffer.into_dlpack::<u32>(&options))
    };
    let dlpack = |error: Error| match error {
        Error::Dlpack(error) => error,
        other => panic!("not a DLPack error: {other}"),
    };
    assert!(matches!(
        export(10, ExportOptions::default()),
        Error::View(ViewError::Size { size: 10, element_size: 4, .. })
    ));
    assert!(matches!(
        export(16, ExportOptions::default().elements(2..5)),
        Error::View(ViewError::SliceOutOfRange { len: 4, .. })
    ));
    let error = dlpack(export(16, ExportOptions::default().shape(&[3])));
    assert!(matches!(error, DlpackError::ShapeSize { elements: 3, len: 4, .. }), "{error}");
    let error = dlpack(export(16, ExportOptions::default().shape_and_strides(&[2, 2], &[2])));
    assert!(matches!(error, DlpackError::StridesLength { ndim: 2, strides: 1 }), "{error}");
    let error = dlpack(export(16, ExportOptions::default().shape_and_strides(&[2, 2], &[3, 1])));
    assert!(matches!(error, DlpackError::OutOfBounds { span: 5, len: 4, .. }), "{error}");

    let misaligned = Arc::new(Buffer::allocate(Arc::clone(&pool), 16, &stream).unwrap());
    // SAFETY: a view of bytes 1..9 of `misaligned`, which outlives it.
    let view = unsafe { Buffer::from_raw(misaligned.ptr() + 1, 8, ForeignMemory::device_memory(device)) };
    let error = refused(view.into_dlpack::<u32>(&ExportOptions::default()));
    assert!(matches!(error, Error::View(ViewError::Alignment { align: 4, .. })), "{error}");
    let packed = cuda_mem_core::dlpark::ffi::DLDataType::F4E2M1FN;
    let error = Buffer::allocate(Arc::clone(&pool), 16, &stream).unwrap().into_dlpack_as(packed, &Default::default());
    assert!(matches!(error, Err(Error::Dlpack(DlpackError::UnsupportedDtype { .. }))));

    // Memory with no DLPack device: a view that knows nothing, or device memory of no device.
    // SAFETY: views of `misaligned`'s bytes, which outlives them.
    let nothing = unsafe { Buffer::from_raw(misaligned.ptr(), 16, ForeignMemory::default()) };
    let error = dlpack(refused(nothing.into_dlpack::<u8>(&Default::default())));
    assert!(matches!(error, DlpackError::NotAccessible { size: 16, .. }), "{error}");
    // SAFETY: as above.
    let nowhere = unsafe {
        Buffer::from_raw(misaligned.ptr(), 16, ForeignMemory::default().device(None).device_accessible(true))
    };
    let error = dlpack(refused(nowhere.into_dlpack::<u8>(&Default::default())));
    assert!(matches!(error, DlpackError::UnknownDevice { .. }), "{error}");
}

#[test]
fn the_tensor_keeps_its_pool_alive_until_the_deleter() {
    in_simulated_machine("the_tensor_keeps_its_pool_alive_until_the_deleter", &[], || {
        let device = common::device();
        // Pools and allocations, where the simulator counts them.
        let counts = || live_objects_if_simulated().map(|live| (live.pools, live.allocations));
        let before = counts();
        let tensor = {
            let stream = common::stream(device);
            let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
            let mut buffer = pool.allocate(4096, &stream).unwrap();
            buffer.copy_from_slice(&[7u32; 1024], &stream).unwrap();
            buffer.into_dlpack::<u32>(&ExportOptions::default().consumer_stream(ConsumerStream::NoSync)).unwrap()
            // The pool's handle, the stream and the buffer's handle go here.
        };
        assert_eq!(counts(), before.map(|(pools, allocations)| (pools + 1, allocations + 1)));
        let import = take(tensor).unwrap();
        let stream = common::stream(device);
        assert_eq!(import.view::<u32>().unwrap().to_vec(&stream).unwrap(), vec![7; 1024]);
        drop(import);
        device.synchronize().unwrap();
        assert_eq!(counts(), before);
    });
}

/// How the consumer names its stream.
type Exchange = fn(&Stream) -> ConsumerStream<'_>;

#[test]
fn the_consumers_stream_waits_for_the_producers_work() {
    let device = common::device();
    let producer = common::stream(device);
    let consumer = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let host: Arc<dyn MemoryResource> = PinnedMemoryResource::new(Default::default()).unwrap();
    let exchanges: [(&str, Exchange); 2] = [
        ("a stream", |s| ConsumerStream::Stream(s)),
        // SAFETY: the consumer stream outlives the tensor.
        ("a raw handle", |s| ConsumerStream::Raw(unsafe { RawStream::new(s.handle()) })),
    ];
    for (how, consumer_stream) in exchanges {
        let mut buffer = filled(&pool, &[0u32; 256], &producer);
        producer.synchronize().unwrap();
        // The producer's write is held behind the gate.
        let (gate, _opens_on_failure) = Gate::new();
        hold(gate, producer.handle());
        buffer.view_mut::<u32>().unwrap().fill(0xfeed, &producer).unwrap();
        let options = ExportOptions::default().consumer_stream(consumer_stream(&consumer));
        let import = take(buffer.into_dlpack::<u32>(&options).unwrap()).unwrap();
        // The consumer copies on its stream: it must see the producer's write.
        let mut out = Buffer::allocate(Arc::clone(&host), 1024, &consumer).unwrap();
        out.copy_from(import.buffer(), &consumer).unwrap();
        gate.open_after(OPEN_DELAY);
        consumer.synchronize().unwrap();
        assert!(gate.is_open(), "{how}: the consumer's stream did not wait for the producer's");
        assert!(out.to_vec::<u32>(&consumer).unwrap().iter().all(|&v| v == 0xfeed), "{how}");
    }

    // Without synchronization the consumer's work does not wait (a watchdog opens the gate if it
    // wrongly does).
    let mut buffer = filled(&pool, &[0u32; 256], &producer);
    producer.synchronize().unwrap();
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, producer.handle());
    buffer.view_mut::<u32>().unwrap().fill(0xfeed, &producer).unwrap();
    let options = ExportOptions::default().consumer_stream(ConsumerStream::NoSync);
    let import = take(buffer.into_dlpack::<u32>(&options).unwrap()).unwrap();
    let mut out = Buffer::allocate(Arc::clone(&host), 1024, &consumer).unwrap();
    out.copy_from(import.buffer(), &consumer).unwrap();
    let fired = gate.watchdog(std::time::Duration::from_secs(5));
    consumer.synchronize().unwrap();
    assert!(!gate.is_open() && !fired.load(Ordering::SeqCst), "NoSync made the consumer wait");
    gate.open();
}

#[test]
fn the_memory_is_freed_after_the_consumers_work() {
    let device = common::device();
    let producer = common::stream(device);
    let consumer = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let buffer = filled(&pool, &[1u32; 64], &producer);
    let options = ExportOptions::default().consumer_stream(ConsumerStream::Stream(&consumer));
    let tensor = buffer.into_dlpack::<u32>(&options).unwrap();
    // The consumer's work on the tensor, held behind the gate; then it releases the tensor.
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, consumer.handle());
    drop(tensor);
    // The free went to the producer's stream, after the consumer's work: the producer's stream
    // is done only once the gate has opened.
    gate.open_after(OPEN_DELAY);
    producer.synchronize().unwrap();
    assert!(gate.is_open(), "the memory was freed before the consumer's work on it");
}

#[test]
fn dropping_an_import_waits_for_its_work_before_the_deleter() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let host: Arc<dyn MemoryResource> = PinnedMemoryResource::new(Default::default()).unwrap();
    let memory = filled(&pool, &[5u32; 64], &stream);
    let (tensor, released) = foreign(memory.ptr(), DLDevice::cuda(0), u32::DTYPE, &[64], &[1]);
    let import = take(tensor).unwrap();
    let mut out = Buffer::allocate(host, 256, &stream).unwrap();
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, stream.handle());
    out.copy_from(import.buffer(), &stream).unwrap();
    gate.open_after(OPEN_DELAY);
    drop(import);
    assert!(gate.is_open(), "the producer's deleter ran while work on its memory was pending");
    assert_eq!(released.load(Ordering::SeqCst), 1);
    assert_eq!(out.to_vec::<u32>(&stream).unwrap(), vec![5; 64]);
}

/// The view moved out of the import (`buffer_mut` lends `&mut Buffer`, so `mem::swap` can):
/// dropping it alone still waits for its work before the producer's deleter runs.
#[test]
fn a_view_swapped_out_of_an_import_waits_for_its_work_before_the_deleter() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    let host: Arc<dyn MemoryResource> = PinnedMemoryResource::new(Default::default()).unwrap();
    let memory = filled(&pool, &[6u32; 64], &stream);
    let (tensor, released) = foreign(memory.ptr(), DLDevice::cuda(0), u32::DTYPE, &[64], &[1]);
    let mut import = take(tensor).unwrap();
    let mut view = Buffer::allocate(Arc::clone(&pool), 256, &stream).unwrap();
    std::mem::swap(import.buffer_mut().unwrap(), &mut view);
    let mut out = Buffer::allocate(host, 256, &stream).unwrap();
    let (gate, _opens_on_failure) = Gate::new();
    hold(gate, stream.handle());
    out.copy_from(&view, &stream).unwrap();
    gate.open_after(OPEN_DELAY);
    drop(view);
    assert!(gate.is_open(), "the producer's deleter ran while work on its memory was pending");
    assert_eq!(released.load(Ordering::SeqCst), 1);
    drop(import);
    assert_eq!(released.load(Ordering::SeqCst), 1, "once");
    assert_eq!(out.to_vec::<u32>(&stream).unwrap(), vec![6; 64]);
}
