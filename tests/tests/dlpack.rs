//! DLPack across the crates: virtual-memory buffers (`cuda-mem-vmm`) and buffers imported from
//! an IPC-shared pool (`cuda-mem-ipc`) export as DLPack tensors and come back, and the tensor
//! keeps them (and their resources) alive until its deleter.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_mem_core::dlpark::DlpackFlags;
use cuda_mem_core::dlpark::ffi::{DLDevice, DLDeviceType};
use cuda_mem_core::dlpark::metadata::Dynamic;
use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, DlpackElement, DlpackError, DlpackImport,
    DlpackTensor, Error, ExportOptions, MemoryResource, OwnedBy, Stream, StreamOptions, export_dlpack,
};
use cuda_mem_ipc::{MappedMemoryResource, allocation_handle, buffer_descriptor};
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource};

fn setup() -> (Device, Stream) {
    cuda_sim::testing::driver().expect("the test driver loads");
    let device = Device::new(0).unwrap();
    (device, Stream::new(device, StreamOptions::default().non_blocking()).unwrap())
}

/// Takes a tensor these tests made from memory they keep valid.
fn take(tensor: DlpackTensor) -> DlpackImport {
    // SAFETY: every tensor here owns (or shares) the buffer it describes, and nothing writes
    // the memory behind the import's back.
    unsafe { DlpackImport::from_dlpack(tensor) }.unwrap()
}

#[test]
fn virtual_buffers_export_and_stay_alive_in_the_tensor() {
    let (device, stream) = setup();
    let data: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let tensor = {
        let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
        let mut buffer = vmm.allocate(data.len() * 4, &stream).unwrap();
        // Mapped in whole chunks: the data fills the start of the buffer, which is exported.
        buffer.view_mut::<f32>().unwrap().slice_mut(..data.len()).unwrap().copy_from_slice(&data, &stream).unwrap();
        // The resource's handle goes here; the tensor keeps the buffer, and so the resource.
        let options = ExportOptions::default().elements(..data.len());
        export_dlpack::<f32>(OwnedBy::new(buffer, VirtualBuffer::as_buffer), &options).unwrap()
    };
    assert_eq!(tensor.flags(), DlpackFlags::READ_ONLY, "a virtual buffer may share its memory");
    let import = take(tensor);
    assert_eq!(import.dl_device().device_type, DLDeviceType::CUDA);
    assert_eq!(import.view::<f32>().unwrap().to_vec(&stream).unwrap(), data);

    // Writable when vouched for; and a plain buffer of the resource exports as any buffer.
    let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
    let buffer = vmm.allocate(4096, &stream).unwrap();
    // SAFETY: nothing else (no grown buffer) shares this buffer's memory.
    let source = unsafe { OwnedBy::new_exclusive(buffer, VirtualBuffer::as_buffer) };
    let mut import = take(export_dlpack::<u32>(source, &ExportOptions::default()).unwrap());
    import.view_mut::<u32>().unwrap().fill(9, &stream).unwrap();
    assert_eq!(import.view::<u32>().unwrap().to_vec(&stream).unwrap(), vec![9; import.buffer().size() / 4]);
    let plain = Buffer::allocate(vmm.clone() as Arc<dyn MemoryResource>, 4096, &stream).unwrap();
    drop(vmm);
    let import = take(plain.into_dlpack::<u8>(&ExportOptions::default()).unwrap());
    assert_eq!(import.buffer().size(), 4096);
}

/// Counts the releases of a producer's tensor.
struct Released(Arc<AtomicUsize>);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A virtual buffer of several physical chunks is one range to its owner, though the driver
/// names each chunk's mapping apart (`cuMemGetAddressRange`): it imports whole, and a producer's
/// tensor reaching past its last mapped byte is refused, its deleter called once.
#[test]
fn a_virtual_buffer_of_several_chunks_imports_whole_and_nothing_past_it() {
    let (device, stream) = setup();
    let vmm = VirtualMemoryResource::new(device, Default::default()).unwrap();
    let chunk = vmm.granularity();
    let first = vmm.allocate(chunk, &stream).unwrap();
    let mut grown = first.grow(3 * chunk).unwrap();
    drop(first);
    assert!(grown.chunk_count() >= 2, "{} chunk(s)", grown.chunk_count());
    grown.fill(cuda_mem_core::FillPattern::U8(5), &stream).unwrap();
    let (ptr, mapped) = (grown.ptr(), grown.mapped_size());
    let import = take(export_dlpack::<u8>(OwnedBy::new(grown, VirtualBuffer::as_buffer), &Default::default()).unwrap());
    assert_eq!(import.buffer().size(), 3 * chunk);
    assert!(import.buffer().to_vec::<u8>(&stream).unwrap().iter().all(|&b| b == 5));

    // The same memory, as a producer would describe it: to the last mapped byte, and one past.
    for (len, refused) in [(mapped, false), (mapped + 1, true)] {
        let released = Arc::new(AtomicUsize::new(0));
        let mut tensor =
            Dynamic::new(vec![len as i64], vec![1i64]).initialize(Box::new(Released(Arc::clone(&released)))).unwrap();
        tensor.set_data(ptr as *mut c_void).set_device(DLDevice::cuda(0)).set_dtype(u8::DTYPE);
        // SAFETY: the memory stays mapped while `import` holds the buffer.
        let tensor = unsafe { tensor.finish() };
        // SAFETY: as above; nothing writes it.
        let result = unsafe { DlpackImport::from_dlpack(tensor) };
        match result {
            Ok(other) if !refused => drop(other),
            Err(Error::Dlpack(DlpackError::OutsideAllocation { ptr: p, size, .. })) if refused => {
                assert_eq!((p, size), (ptr, mapped + 1));
            }
            Ok(_) => panic!("{len} bytes from {ptr:#x} imported past the {mapped} mapped"),
            Err(error) => panic!("{len} bytes: {error}"),
        }
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }
    drop(import);
}

#[test]
fn buffers_imported_from_a_shared_pool_export_and_come_back() {
    let (device, stream) = setup();
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let data: Vec<u64> = (0..512).collect();
    let mut original = pool.allocate(data.len() * 8, &stream).unwrap();
    original.copy_from_slice(&data, &stream).unwrap();
    let handle = allocation_handle(&*pool).unwrap();
    let mapped = match MappedMemoryResource::from_fd(handle.fd(), handle.uuid()) {
        Ok(mapped) => mapped,
        Err(error) => {
            cuda_sim::testing::skip(&format!("this driver does not import a pool into its own process: {error}"));
            return;
        }
    };
    let imported = mapped.import_buffer(&buffer_descriptor(&original).unwrap(), &stream).unwrap();
    drop(mapped);
    let import = take(imported.into_dlpack::<u64>(&ExportOptions::default()).unwrap());
    assert_eq!(import.dl_device().device_type, DLDeviceType::CUDA);
    assert_eq!(import.view::<u64>().unwrap().to_vec(&stream).unwrap(), data);
}
