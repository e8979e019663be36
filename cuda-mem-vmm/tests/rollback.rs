//! Rollback: a failure injected at each driver step of allocation, growth (in place and by
//! moving) and import returns the error, leaves the existing buffers working, and leaves the
//! live objects (and, for imports, the open file descriptors) as they were before the attempt.

mod common;

use std::ffi::CStr;
use std::sync::Arc;

use common::*;
use cuda_mem_core::Stream;
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource, VmmError};

/// The buffer still holds `expected` at its start and takes a new write there.
fn still_works(buffer: &VirtualBuffer, expected: &[u8], s: &Stream) {
    assert_eq!(read(buffer, 0, expected.len(), s), expected, "the old buffer keeps its bytes");
    write(buffer, buffer.size() - 3, &[1, 2, 3], s);
    assert_eq!(read(buffer, buffer.size() - 3, 3, s), [1, 2, 3], "and takes writes");
}

/// Arms `function` to fail at its `nth` next call, runs `attempt`, and checks that it failed
/// with that injected error and undid everything.
#[track_caller]
fn fails_cleanly<T: std::fmt::Debug>(function: &CStr, nth: u32, attempt: impl FnOnce() -> cuda_mem_vmm::Result<T>) {
    let before = vmm_live();
    inject(function, nth);
    let name = function.to_str().unwrap();
    let error = attempt().expect_err("the attempt must fail");
    assert_mentions(&error.to_string(), &[name, "CUDA_ERROR_OUT_OF_MEMORY"]);
    assert_eq!(vmm_live(), before, "a failure in {name} (call {nth}) left nothing behind");
}

fn setup() -> (Stream, Arc<VirtualMemoryResource>) {
    let d0 = device(0);
    let s = stream(d0);
    let resource = VirtualMemoryResource::new(d0, Default::default()).unwrap();
    (s, resource)
}

#[test]
fn a_failure_at_any_step_of_allocate_is_undone() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, resource) = setup();
        let existing = resource.allocate(G, Some(&s)).unwrap();
        let bytes = pattern(1, 4096);
        write(&existing, 0, &bytes, &s);
        let baseline = vmm_live();
        for function in [c"cuMemCreate", c"cuMemAddressReserve", c"cuMemMap", c"cuMemSetAccess"] {
            fails_cleanly(function, 1, || resource.allocate(3 * G, Some(&s)));
            still_works(&existing, &bytes, &s);
        }
        // Then allocation works again, and gives everything back when dropped.
        let buffer = resource.allocate(3 * G, Some(&s)).unwrap();
        assert_eq!(vmm_live(), plus(baseline, 1, 1, 1));
        drop(buffer);
        assert_eq!(vmm_live(), baseline);
    });
}

#[test]
fn a_failure_at_any_step_of_in_place_growth_is_undone() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, resource) = setup();
        let buffer = resource.allocate(G, Some(&s)).unwrap();
        let bytes = pattern(2, 4096);
        write(&buffer, 0, &bytes, &s);
        // In place: reserve after the buffer, create the chunk, map it, set its access.
        for function in [c"cuMemCreate", c"cuMemMap", c"cuMemSetAccess"] {
            fails_cleanly(function, 1, || buffer.grow(2 * G));
            still_works(&buffer, &bytes, &s);
        }
        // The reservation after the buffer was given back each time: growth is still in place.
        let grown = buffer.grow(2 * G).unwrap();
        assert_eq!(grown.ptr(), buffer.ptr());
        drop(grown);

        // A refused in-place reservation is not an error: growth moves instead.
        let before = vmm_live();
        inject(c"cuMemAddressReserve", 1);
        let moved = buffer.grow(2 * G).unwrap();
        assert_ne!(moved.ptr(), buffer.ptr(), "the in-place reservation failed, so it moved");
        assert_eq!(read(&moved, 0, 4096, &s), bytes);
        drop(moved);
        assert_eq!(vmm_live(), before);
        // Both reservations refused: an error, and nothing left.
        fails_cleanly(c"cuMemAddressReserve", 1, || {
            inject(c"cuMemAddressReserve", 2);
            buffer.grow(2 * G)
        });
        still_works(&buffer, &bytes, &s);
    });
}

#[test]
fn a_failure_at_any_step_of_moving_growth_is_undone() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, resource) = setup();
        let one = resource.allocate(G, Some(&s)).unwrap();
        let buffer = one.grow(2 * G).unwrap();
        assert_eq!(buffer.ptr(), one.ptr());
        let bytes = pattern(3, 2 * G);
        write(&buffer, 0, &bytes, &s);
        let _blocker = block_after(&buffer, G);
        // Moving: the in-place reservation lands elsewhere and is given back (call 1), then a new
        // reservation (call 2), the two existing chunks mapped again (cuMemMap and cuMemSetAccess
        // calls 1 and 2), the new chunk created, mapped and given access (call 3).
        let steps: [(&CStr, u32); 8] = [
            (c"cuMemAddressReserve", 2),
            (c"cuMemMap", 1),
            (c"cuMemMap", 2),
            (c"cuMemMap", 3),
            (c"cuMemSetAccess", 1),
            (c"cuMemSetAccess", 2),
            (c"cuMemSetAccess", 3),
            (c"cuMemCreate", 1),
        ];
        for (function, nth) in steps {
            fails_cleanly(function, nth, || buffer.grow(3 * G));
            still_works(&buffer, &bytes[..4096], &s);
            assert_eq!(read(&one, 0, 4096, &s), bytes[..4096]);
        }
        let moved = buffer.grow(3 * G).unwrap();
        assert_ne!(moved.ptr(), buffer.ptr());
        assert_eq!(read(&moved, 0, 4096, &s), bytes[..4096]);
        assert_eq!(read(&moved, 2 * G - 3, 3, &s), [1, 2, 3], "the last write through the old buffer");
    });
}

#[test]
fn a_failure_at_any_step_of_import_is_undone() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, exporter) = setup();
        let one = exporter.allocate(G, Some(&s)).unwrap();
        let two = one.grow(2 * G).unwrap();
        let buffer = two.grow(3 * G).unwrap();
        assert_eq!(buffer.chunk_count(), 3);
        let bytes = pattern(4, 3 * G);
        write(&buffer, 0, &bytes, &s);
        let importer = VirtualMemoryResource::new(exporter.device(), Default::default()).unwrap();
        let steps: [(&CStr, u32); 11] = [
            (c"cuMemImportFromShareableHandle", 1),
            (c"cuMemImportFromShareableHandle", 3),
            (c"cuMemGetAllocationPropertiesFromHandle", 1),
            (c"cuMemGetAllocationPropertiesFromHandle", 2),
            (c"cuMemGetAllocationPropertiesFromHandle", 3),
            (c"cuMemAddressReserve", 1),
            (c"cuMemMap", 1),
            (c"cuMemMap", 3),
            (c"cuMemSetAccess", 1),
            (c"cuMemSetAccess", 2),
            (c"cuMemSetAccess", 3),
        ];
        for (function, nth) in steps {
            let fds = open_fds();
            let descriptor = buffer.export().unwrap();
            assert_eq!(open_fds(), fds + 3, "one descriptor per chunk");
            fails_cleanly(function, nth, || importer.import(descriptor, Some(&s)));
            assert_eq!(open_fds(), fds, "{function:?} (call {nth}): the descriptor's fds are closed");
            still_works(&buffer, &bytes[..4096], &s);
        }
        let imported = importer.import(buffer.export().unwrap(), Some(&s)).unwrap();
        assert_eq!(read(&imported, 0, 4096, &s), bytes[..4096]);
        assert_eq!(read(&imported, 3 * G - 3, 3, &s), [1, 2, 3]);
    });
}

#[test]
fn running_out_of_memory_while_importing_a_chunk_keeps_the_drivers_code() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, exporter) = setup();
        let one = exporter.allocate(G, Some(&s)).unwrap();
        let buffer = one.grow(2 * G).unwrap();
        let importer = VirtualMemoryResource::new(exporter.device(), Default::default()).unwrap();
        let before = vmm_live();
        inject(c"cuMemImportFromShareableHandle", 2);
        let error = importer.import(buffer.export().unwrap(), Some(&s)).unwrap_err();
        assert!(matches!(error, VmmError::ChunkImport { chunk: 2, count: 2, .. }), "{error:?}");
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{error}");
        let source = std::error::Error::source(&error).expect("the driver's error is the source");
        assert_mentions(&source.to_string(), &["cuMemImportFromShareableHandle", "CUDA_ERROR_OUT_OF_MEMORY"]);
        assert_mentions(&error.to_string(), &["importing chunk 2 of 2"]);
        assert_eq!(vmm_live(), before, "the first chunk's import was released");
    });
}
