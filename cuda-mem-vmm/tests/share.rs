//! Sharing: export and import of a three-chunk buffer (one chunk allocated, one from an
//! in-place growth, one from a moving growth), fabric handles in the same process, imports
//! refused for the wrong device, every descriptor check, file descriptors closed after export
//! and import, and imported buffers not exported again.
//!
//! The descriptor's bytes on the wire and the cross-process tests are `cuda-mem-ipc`'s (feature
//! `vmm`) and `tests`': this crate makes the driver calls only.

mod common;

use std::os::fd::OwnedFd;
use std::sync::Arc;

use common::*;
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{HandleType, Location, Stream};
use cuda_mem_vmm::{
    ChunkHandle, DescriptorError, DeviceFeature, MAX_CHUNKS, VirtualBuffer, VirtualBufferDescriptor,
    VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError,
};

fn setup(options: VirtualMemoryResourceOptions) -> (Stream, Arc<VirtualMemoryResource>) {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, options).unwrap();
    (s, resource)
}

/// Builds a three-chunk buffer: one chunk allocated, one added in place, one added by moving.
/// Returns all three buffers (the last spans the three chunks); chunk `i` holds `pattern(i)`.
fn three_chunks(resource: &Arc<VirtualMemoryResource>, s: &Stream) -> [VirtualBuffer; 3] {
    let (one, two) = grown_in_place(resource, s);
    let blocker = block_after(&two, G);
    let three = two.grow(3 * G).unwrap();
    assert_ne!(three.ptr(), two.ptr(), "the third chunk came with a move");
    drop(blocker);
    for i in 0..3 {
        write(&three, i * G, &chunk_pattern(i), s);
    }
    [one, two, three]
}

/// A one-chunk buffer and the two-chunk buffer it grew into in place. A real driver honours the
/// address hint of an in-place growth only when the addresses after the buffer are free, which
/// they need not be after a fresh allocation (an H100 with driver 580 placed the first buffer
/// of these tests right before another reservation): the attempts that moved are kept until one
/// grows in place, so that the next allocation lands elsewhere.
fn grown_in_place(resource: &Arc<VirtualMemoryResource>, s: &Stream) -> (VirtualBuffer, VirtualBuffer) {
    let mut moved = Vec::new();
    for _ in 0..8 {
        let one = resource.allocate(G, s).unwrap();
        let two = one.grow(2 * G).unwrap();
        if two.ptr() == one.ptr() {
            return (one, two);
        }
        moved.push((one, two));
    }
    panic!("the second chunk never came in place in {} attempts", moved.len());
}

fn chunk_pattern(i: usize) -> Vec<u8> {
    pattern(0x10 + i as u8, G)
}

/// A warm-up, so that whatever the driver opens once (in the simulator: nothing, but a real
/// driver may) is open before file descriptors are counted.
fn warm_up(resource: &Arc<VirtualMemoryResource>, s: &Stream) {
    let buffer = resource.allocate(G, s).unwrap();
    write(&buffer, 0, &[1], s);
    assert_eq!(read(&buffer, 0, 1, s), [1]);
    if resource.options().handle_type.is_some() {
        drop(buffer.export().unwrap());
    }
}

/// The simulator's setting that grants the process an IMEX channel, without which fabric memory
/// cannot be made (as on a machine without `/dev/nvidia-caps-imex-channels`).
const IMEX_CHANNEL: (&str, &str) = ("CUDA_SIM_IMEX_CHANNEL", "0");

/// The device supports fabric handles, but a process without an IMEX channel gets no fabric
/// memory (`CUDA_ERROR_NOT_PERMITTED` from `cuMemCreate`): the resource is refused at once,
/// naming the channel, rather than at its first allocation.
#[test]
fn a_process_without_an_imex_channel_is_refused_a_fabric_resource() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("the simulator grants no IMEX channel unless told to") {
            return;
        }
        let device = device(0);
        assert!(device.properties().unwrap().fabric_handles_supported);
        let baseline = vmm_live();
        let fabric = VirtualMemoryResourceOptions::default().handle_type(HandleType::Fabric);
        let error = VirtualMemoryResource::new(device, fabric).unwrap_err();
        assert!(
            matches!(error, VmmError::Unsupported { feature: DeviceFeature::ImexChannel, .. }),
            "expected the missing IMEX channel, got {error:?}"
        );
        let message = error.to_string();
        for needed in ["CUDA_ERROR_NOT_PERMITTED", "IMEX channel", "HandleType::PosixFd"] {
            assert!(message.contains(needed), "{message}");
        }
        assert_eq!(vmm_live(), baseline, "nothing left of the probe");
        let fd = VirtualMemoryResourceOptions::default().handle_type(HandleType::PosixFd);
        VirtualMemoryResource::new(device, fd).unwrap();
    });
}

#[test]
fn fabric_handles_in_the_same_process() {
    machine!(&[IMEX_CHANNEL], || {
        if !cuda_sim::testing::simulator_only("fabric handles are tested on the simulator only") {
            return;
        }
        let fabric = VirtualMemoryResourceOptions::default().handle_type(HandleType::Fabric);
        let (s, resource) = setup(fabric.clone());
        let [_one, _two, three] = three_chunks(&resource, &s);
        let baseline = vmm_live();
        let fds = open_fds();
        let descriptor = three.export().unwrap();
        assert_eq!(descriptor.handle_type, HandleType::Fabric);
        assert!(descriptor.handles.iter().all(|h| matches!(h, ChunkHandle::Fabric(_))));
        assert_eq!(open_fds(), fds, "no descriptor is opened");

        // With a resource of its own.
        let importer = VirtualMemoryResource::new(resource.device(), fabric.clone()).unwrap();
        let imported = importer.import(descriptor, &s).unwrap();
        assert_eq!(vmm_live(), plus(baseline, 1, 3, 3));
        for i in 0..3 {
            assert_bytes(&read(&imported, i * G, G, &s), &chunk_pattern(i), &format!("chunk {i}"));
        }
        write(&imported, G, &[0x77; 32], &s);
        assert_eq!(read(&three, G, 32, &s), [0x77; 32], "the same memory");
        write(&imported, G, &chunk_pattern(1)[..32], &s);
        assert!(imported.export().is_err(), "not exported again");
        drop(imported);
        assert_eq!(vmm_live(), baseline);
        assert_eq!(open_fds(), fds);
    });
}

#[test]
fn a_fabric_handle_of_freed_memory_does_not_import() {
    machine!(&[IMEX_CHANNEL], || {
        if !cuda_sim::testing::simulator_only("fabric handles are tested on the simulator only") {
            return;
        }
        let fabric = VirtualMemoryResourceOptions::default().handle_type(HandleType::Fabric);
        let (s, resource) = setup(fabric);
        let buffer = resource.allocate(G, &s).unwrap();
        let descriptor = buffer.export().unwrap();
        drop(buffer);
        let baseline = vmm_live();
        let error = resource.import(descriptor, &s).unwrap_err();
        assert!(matches!(error, VmmError::ChunkImport { chunk: 1, count: 1, .. }), "{error:?}");
        assert!(error.cuda_code().is_some(), "the driver's refusal is kept: {error:?}");
        assert_mentions(&error.to_string(), &["importing chunk 1 of 1", "cuMemImportFromShareableHandle"]);
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn memory_of_another_device_is_refused() {
    machine!(&[("CUDA_SIM_DEVICES", "2")], || {
        let Some(d1) = try_device(1) else { return };
        let (s, resource) = setup(Default::default());
        let buffer = resource.allocate(2 * G, &s).unwrap();
        let grown = buffer.grow(3 * G).unwrap();
        write(&buffer, 0, &[8; 8], &s);
        let on_device_1 = VirtualMemoryResource::new(d1, Default::default()).unwrap();
        warm_up(&on_device_1, &stream(d1));
        let (baseline, fds) = (sim_live(), open_fds());
        let descriptor = grown.export().unwrap();
        assert_eq!(descriptor.handles.len(), 2);
        let error = on_device_1.import(descriptor, &s).unwrap_err();
        let (found, wanted) = (Some(Location::Device(device(0))), Location::Device(d1));
        assert!(
            matches!(error, VmmError::ChunkLocation { chunk: 1, count: 2, found: f, wanted: w } if f == found && w == wanted),
            "{error:?}"
        );
        let text = error.to_string();
        // Names the chunk, both locations (device 0's memory, device 1's resource), and the way
        // out.
        assert_mentions(
            &text,
            &["chunk 1 of 2", "device 0, but", "device 1;", "import it with a resource for that location"],
        );
        assert_eq!(sim_live(), baseline, "nothing imported or mapped stays");
        assert_eq!(open_fds(), fds, "the descriptor's fds are closed");
        // A resource of the right device imports it.
        let on_device_0 = VirtualMemoryResource::new(resource.device(), Default::default()).unwrap();
        let imported = on_device_0.import(grown.export().unwrap(), &s).unwrap();
        assert_eq!(read(&imported, 0, 8, &s), [8; 8]);
    });
}

/// What importing `descriptor` must fail with, what its message must mention, and whether the
/// error is the expected variant.
type Case = (&'static str, fn(&mut VirtualBufferDescriptor), &'static [&'static str], fn(&VmmError) -> bool);

/// Whether the error is a descriptor refused before any driver call.
fn refused_descriptor(error: &VmmError) -> bool {
    matches!(error, VmmError::Descriptor(_))
}

#[test]
fn every_descriptor_check_refuses_before_anything_stays_mapped() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("live-object counts") {
            return;
        }
        let (s, resource) = setup(Default::default());
        let one = resource.allocate(G, &s).unwrap();
        let buffer = one.grow(2 * G).unwrap();
        assert_eq!(buffer.chunk_count(), 2);
        write(&buffer, 0, &pattern(1, 64), &s);
        warm_up(&resource, &s);
        let cases: [Case; 10] = [
            (
                "handle type",
                |d| d.handle_type = HandleType::Fabric,
                &["handle type is Fabric", "PosixFd"],
                |e| matches!(e, VmmError::Descriptor(DescriptorError::HandleTypeMismatch { .. })),
            ),
            ("a size too many", |d| d.chunk_sizes.push(G as u64), &["3 chunk sizes for 2 handles"], refused_descriptor),
            (
                "a size too few",
                |d| {
                    d.chunk_sizes.pop();
                },
                &["1 chunk sizes for 2 handles"],
                refused_descriptor,
            ),
            ("a handle too few", |d| drop(d.handles.pop()), &["2 chunk sizes for 1 handles"], refused_descriptor),
            (
                "not a multiple",
                |d| d.chunk_sizes[1] = G as u64 + 4096,
                &["2101248", "2097152-byte granularity"],
                refused_descriptor,
            ),
            ("a zero chunk", |d| d.chunk_sizes[0] = 0, &["chunk size 0", "positive multiple"], refused_descriptor),
            (
                "size past the chunks",
                |d| d.size = 2 * G as u64 + 1,
                &["4194305", "exceeds", "4194304 bytes"],
                refused_descriptor,
            ),
            (
                "no chunks but a size",
                |d| {
                    d.chunk_sizes.clear();
                    d.handles.clear();
                },
                &["size 4194304 with no exported chunks"],
                refused_descriptor,
            ),
            (
                "a chunk larger than exported",
                |d| d.chunk_sizes[1] = 2 * G as u64,
                &["mapping chunk 2 of 2"],
                |e| matches!(e, VmmError::ChunkMap { chunk: 2, count: 2, .. }) && e.cuda_code().is_some(),
            ),
            (
                "not a VMM file",
                |d| {
                    let file: OwnedFd = std::fs::File::open("/proc/self/status").unwrap().into();
                    d.handles[1] = ChunkHandle::Fd(file);
                },
                &["importing chunk 2 of 2"],
                |e| matches!(e, VmmError::ChunkImport { chunk: 2, count: 2, .. }) && e.cuda_code().is_some(),
            ),
        ];
        for (what, spoil, mentions, expected) in cases {
            let (baseline, fds) = (vmm_live(), open_fds());
            let mut descriptor = buffer.export().unwrap();
            spoil(&mut descriptor);
            let error = resource.import(descriptor, &s).unwrap_err();
            assert!(expected(&error), "{what}: {error:?}");
            let text = error.to_string();
            assert!(mentions.iter().all(|m| text.contains(m)), "{what}: {text:?} should mention {mentions:?}");
            assert_eq!(vmm_live(), baseline, "{what}: nothing imported or mapped stays");
            assert_eq!(open_fds(), fds, "{what}: every descriptor is closed");
        }
        // The unspoiled descriptor imports, and a smaller claimed size is a smaller buffer.
        let mut descriptor = buffer.export().unwrap();
        descriptor.size = 64;
        let imported = resource.import(descriptor, &s).unwrap();
        assert_eq!((imported.size(), imported.mapped_size()), (64, 2 * G));
        assert_eq!(read(&imported, 0, 64, &s), pattern(1, 64));
    });
}

#[test]
fn a_fabric_handle_in_an_fd_descriptor_is_refused_before_the_driver_sees_it() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, resource) = setup(Default::default());
        let buffer = resource.allocate(G, &s).unwrap();
        let baseline = vmm_live();
        // The driver is told "POSIX fd" but given a pointer to 64 bytes: on a real driver the
        // pointer's low bits are taken as a descriptor number, which may be any open file.
        let mut descriptor = buffer.export().unwrap();
        descriptor.handles[0] = ChunkHandle::Fabric([0; 64]);
        // Were the driver called, this armed failure would be spent on that call.
        inject(c"cuMemImportFromShareableHandle", 1);
        let error = resource.import(descriptor, &s).unwrap_err();
        let fabric_in_fd =
            DescriptorError::HandleKind { chunk: 1, carries: "a fabric handle", handle_type: HandleType::PosixFd };
        assert!(matches!(&error, VmmError::Descriptor(e) if *e == fabric_in_fd), "{error:?}");
        assert_eq!(vmm_live(), baseline);
        let unspent = resource.import(buffer.export().unwrap(), &s);
        assert!(
            unspent.as_ref().is_err_and(|e| e.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY")),
            "the mismatched handle reached cuMemImportFromShareableHandle (the armed failure was spent on it; \
             the refusal was {error})"
        );
    });
}

#[test]
fn an_fd_handle_in_a_fabric_descriptor_is_refused_before_the_driver_sees_it() {
    machine!(&[IMEX_CHANNEL], || {
        if !cuda_sim::testing::simulator_only("fabric handles are tested on the simulator only") {
            return;
        }
        let fabric = VirtualMemoryResourceOptions::default().handle_type(HandleType::Fabric);
        let (s, resource) = setup(fabric);
        let buffer = resource.allocate(G, &s).unwrap();
        let baseline = vmm_live();
        // The driver is told "fabric handle" and given a descriptor number as the pointer to its
        // 64 bytes: it reads memory at address 5 or so (this child dies of SIGSEGV if it does).
        let mut descriptor = buffer.export().unwrap();
        let file: OwnedFd = std::fs::File::open("/proc/self/status").unwrap().into();
        descriptor.handles[0] = ChunkHandle::Fd(file);
        let error = resource.import(descriptor, &s).unwrap_err();
        let fd_in_fabric =
            DescriptorError::HandleKind { chunk: 1, carries: "a file descriptor", handle_type: HandleType::Fabric };
        assert!(matches!(&error, VmmError::Descriptor(e) if *e == fd_in_fabric), "{error:?}");
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn export_opens_one_fd_per_chunk_and_closes_them_on_drop() {
    machine!(&[], || {
        let (s, resource) = setup(Default::default());
        let [one, two, three] = three_chunks(&resource, &s);
        warm_up(&resource, &s);
        let fds = open_fds();
        for (buffer, chunks) in [(&one, 1), (&two, 2), (&three, 3)] {
            let descriptor = buffer.export().unwrap();
            assert_eq!(descriptor.handles.len(), chunks);
            assert_eq!(descriptor.size, buffer.size() as u64);
            assert_eq!(open_fds(), fds + chunks);
            drop(descriptor);
            assert_eq!(open_fds(), fds);
        }
        // A buffer grown from an imported one is still an imported buffer.
        let imported = resource.import(one.export().unwrap(), &s).unwrap();
        let grown = imported.grow(2 * G).unwrap();
        assert!(grown.is_imported());
        assert!(matches!(grown.export(), Err(VmmError::ImportedBuffer)));
        write(&grown, G, &[3; 3], &s);
        assert_eq!(read(&grown, 0, 16, &s), chunk_pattern(0)[..16]);
    });
}

#[test]
fn export_refuses_more_chunks_than_a_descriptor_can_name() {
    machine!(&[], || {
        let (s, resource) = setup(Default::default());
        let mut buffer = resource.allocate(G, &s).unwrap();
        for chunks in 2..=MAX_CHUNKS + 1 {
            buffer = buffer.grow(chunks * G).unwrap();
        }
        assert_eq!(buffer.chunk_count(), MAX_CHUNKS + 1);
        // A descriptor of MAX_CHUNKS + 1 chunks could be neither sent in one message nor decoded:
        // export says so instead of handing one out.
        match buffer.export() {
            Err(error) => assert_mentions(&error.to_string(), &[&MAX_CHUNKS.to_string()]),
            Ok(descriptor) => panic!(
                "export of {} chunks succeeded: its {} descriptors fit in no message",
                MAX_CHUNKS + 1,
                descriptor.handles.len()
            ),
        }
    });
}

#[test]
fn an_export_that_fails_part_way_closes_what_it_opened_and_says_so() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection in the simulator") {
            return;
        }
        let (s, resource) = setup(Default::default());
        let [_, _, three] = three_chunks(&resource, &s);
        warm_up(&resource, &s);
        let fds = open_fds();
        // The second chunk's export fails, as when the process runs out of descriptors.
        inject(c"cuMemExportToShareableHandle", 2);
        let error = three.export().unwrap_err();
        assert!(matches!(error, VmmError::ExportFailed { chunk: 2, count: 3, exported: 1, .. }), "{error:?}");
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "the driver's error is kept");
        assert_mentions(&error.to_string(), &["chunk 2 of 3", "after 1 were exported", "descriptors are closed"]);
        assert_eq!(open_fds(), fds, "the descriptor opened for chunk 1 is closed");
        // The buffer is untouched and exports again.
        assert_eq!(three.export().unwrap().handles.len(), 3);
    });
}

/// `descriptor`'s first handle repeated to fill `count` chunks of `chunk` bytes each (file
/// descriptors duplicated, fabric handles copied), the size their total: the same chunk named
/// again and again, as a descriptor built field by field can.
fn repeated(descriptor: &VirtualBufferDescriptor, count: usize, chunk: u64) -> VirtualBufferDescriptor {
    let handles = (0..count)
        .map(|_| match &descriptor.handles[0] {
            ChunkHandle::Fd(fd) => ChunkHandle::Fd(fd.try_clone().unwrap()),
            ChunkHandle::Fabric(data) => ChunkHandle::Fabric(*data),
        })
        .collect();
    VirtualBufferDescriptor {
        handle_type: descriptor.handle_type,
        size: count as u64 * chunk,
        chunk_sizes: vec![chunk; count],
        handles,
    }
}

/// Descriptors built field by field that no export gives are refused at import, each with its
/// own error, with nothing left imported or mapped and every descriptor closed: more chunks than
/// [`MAX_CHUNKS`], a size of 0 with chunks, a chunk claimed smaller than its physical
/// allocation (the importer would map only its first part, and every later chunk at the wrong
/// offset), and the same chunk named more than once (by duplicated descriptors, by two exports
/// of it, by copies of its fabric handle: the buffer would alias itself).
#[test]
fn descriptors_no_export_gives_are_refused_at_import() {
    machine!(&[IMEX_CHANNEL], || {
        if !cuda_sim::testing::simulator_only("live-object counts") {
            return;
        }
        let (s, resource) = setup(Default::default());
        let small = resource.allocate(G, &s).unwrap();
        let large = resource.allocate(2 * G, &s).unwrap();
        assert_eq!((small.chunk_count(), large.chunk_count()), (1, 1));
        write(&large, 0, &pattern(2, 64), &s);
        warm_up(&resource, &s);
        let g = G as u64;
        let refuse = |what: &str, descriptor: VirtualBufferDescriptor, expected: DescriptorError, mentions: &[&str]| {
            let (baseline, fds) = (vmm_live(), open_fds());
            // The descriptor's own file descriptors are closed by the import.
            let own = descriptor.handles.iter().filter(|h| matches!(h, ChunkHandle::Fd(_))).count();
            let error = resource.import(descriptor, &s).unwrap_err();
            assert!(matches!(&error, VmmError::Descriptor(e) if *e == expected), "{what}: {error:?}");
            assert_mentions(&error.to_string(), mentions);
            assert_eq!(vmm_live(), baseline, "{what}: nothing imported or mapped stays");
            assert_eq!(open_fds(), fds - own, "{what}: every descriptor is closed");
        };
        let one = small.export().unwrap();
        refuse(
            "254 chunks",
            repeated(&one, MAX_CHUNKS + 1, g),
            DescriptorError::TooManyChunks { chunks: MAX_CHUNKS + 1, max: MAX_CHUNKS },
            &["254 chunks", "at most 253"],
        );
        let mut empty = small.export().unwrap();
        empty.size = 0;
        refuse("size 0 with a chunk", empty, DescriptorError::ZeroSizeWithChunks { chunks: 1 }, &["size 0", "1 chunk"]);
        let mut understated = large.export().unwrap();
        understated.chunk_sizes[0] = g;
        understated.size = g;
        refuse(
            "a chunk claimed smaller than its allocation",
            understated,
            DescriptorError::ChunkLargerThanClaimed { chunk: 1, claimed: g },
            &["chunk 1", "2097152 bytes", "larger"],
        );
        refuse(
            "the same descriptor 253 times",
            repeated(&one, MAX_CHUNKS, g),
            DescriptorError::RepeatedChunk { chunk: 2, first: 1 },
            &["chunk 2", "chunk 1"],
        );
        let mut twice = small.export().unwrap();
        twice.handles.extend(small.export().unwrap().handles);
        twice.chunk_sizes.push(g);
        twice.size = 2 * g;
        refuse("two exports of one chunk", twice, DescriptorError::RepeatedChunk { chunk: 2, first: 1 }, &["chunk 2"]);
        drop(one);
        // The same chunk through its fabric handle, with a resource that shares them.
        let fabric = VirtualMemoryResource::new(
            resource.device(),
            VirtualMemoryResourceOptions::default().handle_type(HandleType::Fabric),
        )
        .unwrap();
        let shared = fabric.allocate(G, &s).unwrap();
        let (baseline, fds) = (vmm_live(), open_fds());
        let error = fabric.import(repeated(&shared.export().unwrap(), 3, g), &s).unwrap_err();
        let expected = DescriptorError::RepeatedChunk { chunk: 2, first: 1 };
        assert!(matches!(&error, VmmError::Descriptor(e) if *e == expected), "fabric: {error:?}");
        assert_eq!((vmm_live(), open_fds()), (baseline, fds), "fabric: nothing stays");
        // What an export gives still imports.
        let imported = resource.import(large.export().unwrap(), &s).unwrap();
        assert_eq!((imported.size(), imported.mapped_size()), (2 * G, 2 * G));
        assert_eq!(read(&imported, 0, 64, &s), pattern(2, 64));
    });
}

/// With the memory history recording, an export and an import are recorded with the buffer's
/// address and size, each named by its resource.
#[test]
fn exports_and_imports_are_recorded_in_the_history() {
    machine!(&[], || {
        use cuda_mem_core::history::{self, HistoryOptions, MemoryEventKind, ResourceId};
        let _serial = history::tests_serial();
        let (s, resource) = setup(VirtualMemoryResourceOptions::default());
        let buffer = resource.allocate(G, &s).unwrap();
        let importer = VirtualMemoryResource::new(resource.device(), VirtualMemoryResourceOptions::default()).unwrap();
        history::start_recording(HistoryOptions::default());
        let descriptor = buffer.export().unwrap();
        let imported = importer.import(descriptor, &s).unwrap();
        history::stop_recording();
        // The recording is the process's: on a real driver (and the GPU bundle's hidden
        // simulator) this body runs in the test process, beside other tests that export and
        // import, so only this test's two resources are looked at.
        let ours = [ResourceId::of(&*resource), ResourceId::of(&*importer)];
        let events: Vec<_> = history::history()
            .events
            .into_iter()
            .filter(|e| matches!(e.kind, MemoryEventKind::Export | MemoryEventKind::Import))
            .filter(|e| ours.contains(&e.resource))
            .map(|e| (e.kind, e.address, e.size, e.resource))
            .collect();
        assert_eq!(
            events,
            [
                (MemoryEventKind::Export, buffer.ptr(), G, ResourceId::of(&*resource)),
                (MemoryEventKind::Import, imported.ptr(), G, ResourceId::of(&*importer)),
            ]
        );
    });
}
