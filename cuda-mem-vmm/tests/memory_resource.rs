//! The resource as a `MemoryResource`: plain buffers through `MemoryResourceExt` (shared and
//! scoped) and through `Arc<dyn MemoryResource>`, each a chunk, a reservation and a mapping of
//! its own, holding data and giving everything back when freed; virtual buffers passed where
//! a `Buffer` is expected through `as_buffer`; and a release deferred through the trait, recorded
//! with the driver's code, once however often it fails the same way again.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::*;
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{
    Buffer, Device, DevicePtr, Error, FillPattern, ForeignMemory, Location, MemoryResource, MemoryResourceExt,
    PinnedMemoryResource, Stream,
};
use cuda_mem_vmm::{
    DeferCause, VirtualBuffer, VirtualBufferDescriptor, VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError,
    release_deferred,
};

/// The bytes of `buffer`, copied to pinned memory on `stream`.
fn bytes_of(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let mut host = PinnedMemoryResource::current().unwrap().allocate(buffer.size(), stream).unwrap();
    host.copy_from(buffer, stream).unwrap();
    host.host_slice().unwrap().to_vec()
}

#[test]
fn plain_buffers_come_through_the_trait_and_go_back() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();

        // Shared: exactly the size asked for, over one rounded-up chunk.
        let mut shared = MemoryResourceExt::allocate(&resource, 1000, &s).unwrap();
        assert_eq!(shared.size(), 1000);
        assert_eq!(shared.ptr() % G as u64, 0);
        assert_eq!(
            (shared.device(), shared.is_device_accessible(), shared.is_host_accessible()),
            (Some(d0), true, false)
        );
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)));
        shared.fill(FillPattern::U8(0x42), &s).unwrap();
        assert_eq!(bytes_of(&shared, &s), vec![0x42; 1000]);

        // Scoped: borrows the resource and the stream.
        {
            let mut scoped = resource.allocate_scoped(G + 4, &s).unwrap();
            assert_eq!(sim_live(), baseline.map(|b| plus(b, 2, 2, 2)));
            scoped.fill(FillPattern::U32(0x0102_0304), &s).unwrap();
            let mut back = PinnedMemoryResource::current().unwrap().allocate(4, &s).unwrap();
            // SAFETY: the first 4 bytes of `scoped`, which outlives the view's only use below.
            let head = unsafe { Buffer::from_raw(scoped.ptr(), 4, ForeignMemory::device_memory(d0)) };
            back.copy_from(&head, &s).unwrap();
            assert_eq!(back.host_slice().unwrap(), 0x0102_0304u32.to_ne_bytes());
        }
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 1, 1, 1)), "the scoped buffer gave its memory back");

        // As any memory resource.
        let dynamic: Arc<dyn MemoryResource> = Arc::clone(&resource) as _;
        let mut through_dyn = dynamic.allocate(G, &s).unwrap();
        through_dyn.copy_from(&MemoryResourceExt::allocate(&resource, G, &s).unwrap(), &s).unwrap();
        assert_eq!(sim_live(), baseline.map(|b| plus(b, 2, 2, 2)), "the copy's source went back at once");
        drop((shared, through_dyn, dynamic));
        assert_eq!(sim_live(), baseline, "everything went back");
        assert!(cuda_mem_core::take_drop_errors().is_empty());
    });
}

#[test]
fn host_located_memory_belongs_to_no_device() {
    let d0 = device(0);
    let s = stream(d0);
    let options = VirtualMemoryResourceOptions::default().location(Location::Host).handle_type(None);
    let resource = VirtualMemoryResource::new(d0, options).unwrap();
    assert_eq!(MemoryResource::device(&*resource), None);
    assert_eq!(resource.device(), d0, "the resource's own device stays the one it allocates for");
    let buffer = MemoryResourceExt::allocate(&resource, 64, &s).unwrap();
    assert_eq!(buffer.device(), None);
    assert!(!buffer.is_host_accessible(), "no access descriptor names the host");
}

#[test]
fn a_virtual_buffer_is_a_buffer_of_its_resource_where_one_is_expected() {
    machine!(&[], || {
        let d0 = device(0);
        let s = stream(d0);
        let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let baseline = sim_live();
        let mut virtual_buffer = resource.allocate(G, &s).unwrap();
        virtual_buffer.fill(FillPattern::U8(9), &s).unwrap();
        let buffer: &Buffer = virtual_buffer.as_buffer();
        assert_eq!((buffer.ptr(), buffer.size()), (virtual_buffer.ptr(), virtual_buffer.size()));
        assert!(buffer.is_owning(), "the buffer is freed through the resource");
        assert_eq!(bytes_of(buffer, &s), vec![9; G]);
        // Copies in both directions, through the buffer and through the virtual buffer.
        let mut other = MemoryResourceExt::allocate(&resource, G, &s).unwrap();
        virtual_buffer.copy_to(&mut other, &s).unwrap();
        assert_eq!(bytes_of(&other, &s), vec![9; G]);
        other.fill(FillPattern::U8(5), &s).unwrap();
        virtual_buffer.copy_from(&other, &s).unwrap();
        assert_eq!(bytes_of(virtual_buffer.as_buffer(), &s), vec![5; G]);
        drop((virtual_buffer, other));
        assert_eq!(sim_live(), baseline);
    });
}

/// A memory resource of the application's that hands out memory another process exported: each
/// allocation imports the next descriptor through a virtual memory resource. Its errors are the
/// VMM crate's, converted with `?` into the core error the trait names, and kept whole.
#[derive(Debug)]
struct ImportingResource {
    importer: Arc<VirtualMemoryResource>,
    pending: Mutex<Vec<VirtualBufferDescriptor>>,
    live: Mutex<HashMap<DevicePtr, VirtualBuffer>>,
}

// SAFETY: every pointer handed out is the start of an imported virtual buffer of at least the
// size asked for, kept in `live` (so mapped) until `deallocate_raw` takes it out; the memory is
// device memory, never host-accessible.
unsafe impl MemoryResource for ImportingResource {
    fn allocate_raw(&self, size: usize, stream: &Stream) -> cuda_mem_core::Result<DevicePtr> {
        let descriptor = self.pending.lock().unwrap().pop().ok_or_else(|| Error::resource("nothing left to import"))?;
        let buffer = self.importer.import(descriptor, stream)?;
        if buffer.size() < size {
            return Err(Error::SizeMismatch { what: "the imported buffer", expected: size, actual: buffer.size() });
        }
        let ptr = buffer.ptr();
        self.live.lock().unwrap().insert(ptr, buffer);
        Ok(ptr)
    }

    unsafe fn deallocate_raw(&self, ptr: DevicePtr, _size: usize, _stream: &Stream) -> cuda_mem_core::Result<()> {
        self.live.lock().unwrap().remove(&ptr);
        Ok(())
    }

    fn is_device_accessible(&self) -> bool {
        true
    }

    fn is_host_accessible(&self) -> bool {
        false
    }

    fn device(&self) -> Option<Device> {
        Some(self.importer.device())
    }
}

#[test]
fn a_chunk_import_out_of_memory_keeps_its_code_through_the_trait() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let d0 = device(0);
        let s = stream(d0);
        let exporter = VirtualMemoryResource::new(d0, Default::default()).unwrap();
        let shared = exporter.allocate(G, &s).unwrap().grow(2 * G).unwrap();
        let resource = Arc::new(ImportingResource {
            importer: VirtualMemoryResource::new(d0, Default::default()).unwrap(),
            pending: Mutex::new(vec![shared.export().unwrap(), shared.export().unwrap()]),
            live: Mutex::default(),
        });
        let before = vmm_live();
        inject(c"cuMemImportFromShareableHandle", 2);
        let error = MemoryResourceExt::allocate(&resource, 2 * G, &s).unwrap_err();
        // The driver's code, found through the VMM error the core error carries.
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{error}");
        let Error::Resource(source) = &error else { panic!("expected the resource's own error, got {error:?}") };
        assert!(
            matches!(source.downcast_ref::<VmmError>(), Some(VmmError::ChunkImport { chunk: 2, count: 2, .. })),
            "{source:?}"
        );
        assert!(error.to_string().starts_with("importing chunk 2 of 2: "), "the VMM error's text: {error}");
        assert_eq!(vmm_live(), before, "nothing stayed imported");
        // The next import works, and the memory goes back when the buffer does.
        let buffer = MemoryResourceExt::allocate(&resource, 2 * G, &s).unwrap();
        assert_eq!(buffer.size(), 2 * G);
        drop(buffer);
        assert!(resource.live.lock().unwrap().is_empty());
    });
}

#[test]
fn a_vmm_error_through_the_trait_is_the_source_not_text() {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
    let error = MemoryResourceExt::allocate(&resource, usize::MAX, &s).unwrap_err();
    let Error::Resource(source) = &error else { panic!("expected the VMM error as the source, got {error:?}") };
    assert!(
        matches!(source.downcast_ref::<VmmError>(), Some(&VmmError::SizeOverflow { size: usize::MAX, granularity: G })),
        "{source:?}"
    );
    assert_eq!(error.cuda_code(), None);
    // A driver error needs no wrapping: it comes through as the core error it is.
    assert!(matches!(cuda_mem_core::Error::from(VmmError::Core(Error::CapturingStream)), Error::CapturingStream));
}

/// A buffer of a new resource on device 0, dropped while its stream cannot be waited for, so
/// that its release is deferred: the drop errors recorded meanwhile, the live objects from before
/// the buffer, and the stream and resource, kept for the rest of the test (the resource's drop
/// would be a safe point that releases what was deferred).
fn a_deferred_release()
-> (Vec<cuda_mem_core::DropError>, Option<cuda_sim::testing::LiveObjects>, (Stream, Arc<VirtualMemoryResource>)) {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
    let baseline = sim_live();
    let _ = cuda_mem_core::take_drop_errors();
    let buffer = MemoryResourceExt::allocate(&resource, G, &s).unwrap();
    fail_the_next_wait_for_a_stream();
    drop(buffer);
    (cuda_mem_core::take_drop_errors(), baseline, (s, resource))
}

#[test]
fn a_deferred_release_recorded_through_the_trait_keeps_the_drivers_code() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (errors, baseline, _kept) = a_deferred_release();
        let [recorded] = &errors[..] else { panic!("one deferred release is recorded: {errors:?}") };
        let error = &recorded.error;
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{error}");
        let Error::Resource(source) = error else { panic!("expected the VMM error as the source, got {error:?}") };
        assert!(
            matches!(
                source.downcast_ref::<VmmError>(),
                Some(VmmError::ReleaseDeferred { cause: DeferCause::Synchronize(_), .. })
            ),
            "{source:?}"
        );
        // Released at the next safe point, now that the stream can be waited for.
        assert_eq!(release_deferred(), 0);
        assert_eq!(sim_live(), baseline);
    });
}

#[test]
fn a_deferred_release_failing_the_same_way_again_is_recorded_once() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (errors, baseline, _kept) = a_deferred_release();
        assert_eq!(errors.len(), 1, "the deferral is recorded: {errors:?}");

        // Every later safe point fails the same way: nothing new to record.
        for _ in 0..5 {
            fail_the_next_wait_for_a_stream();
            assert_eq!(release_deferred(), 1, "still kept");
        }
        let errors = cuda_mem_core::take_drop_errors();
        assert!(errors.is_empty(), "the same failure is not recorded again: {errors:?}");

        // Another failure is news: recorded, once.
        for _ in 0..3 {
            inject(c"cuStreamIsCapturing", 1);
            assert_eq!(release_deferred(), 1, "still kept");
        }
        let errors = cuda_mem_core::take_drop_errors();
        let [recorded] = &errors[..] else { panic!("the new failure is recorded once: {errors:?}") };
        let message = recorded.error.to_string();
        assert!(message.contains("capture status") && message.contains("cuStreamIsCapturing"), "{message}");

        // Released once the stream can be waited for.
        assert_eq!(release_deferred(), 0);
        assert_eq!(sim_live(), baseline);
        assert!(cuda_mem_core::take_drop_errors().is_empty());
    });
}
