//! Rollback: a failure injected at each driver step of allocation, growth (in place and by
//! moving) and import returns the error, leaves the existing buffers working, and leaves the
//! live objects (and, for imports, the open file descriptors) as they were before the attempt.
//!
//! And the full matrix: a failure injected at every driver call of allocating (inherently and
//! through the `MemoryResource` trait), growing in place and by moving, exporting, importing,
//! dropping and closing, the bookkeeping calls included (context binding, the capture check, the
//! stream synchronization, the events that order a release after other streams), leaves nothing
//! behind once everything is dropped: no reservation, mapping, physical allocation or file
//! descriptor, except where the driver refused a release itself, and then that is recorded.

mod common;

use std::ffi::CStr;
use std::sync::Arc;

use common::*;
use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{Device, FillPattern, MemoryResourceExt, Stream, take_drop_errors};
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource, VmmError, release_deferred};
use cuda_sim::testing::{LiveObjects, count_calls, run_failing};

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
        let existing = resource.allocate(G, &s).unwrap();
        let bytes = pattern(1, 4096);
        write(&existing, 0, &bytes, &s);
        let baseline = vmm_live();
        for function in [c"cuMemCreate", c"cuMemAddressReserve", c"cuMemMap", c"cuMemSetAccess"] {
            fails_cleanly(function, 1, || resource.allocate(3 * G, &s));
            still_works(&existing, &bytes, &s);
        }
        // Then allocation works again, and gives everything back when dropped.
        let buffer = resource.allocate(3 * G, &s).unwrap();
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
        let buffer = resource.allocate(G, &s).unwrap();
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
        let one = resource.allocate(G, &s).unwrap();
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
        let one = exporter.allocate(G, &s).unwrap();
        let two = one.grow(2 * G).unwrap();
        let buffer = two.grow(3 * G).unwrap();
        assert_eq!(buffer.chunk_count(), 3);
        let bytes = pattern(4, 3 * G);
        write(&buffer, 0, &bytes, &s);
        let importer = VirtualMemoryResource::new(exporter.device(), Default::default()).unwrap();
        // Per chunk: its import, its properties, and a map of more than its size into a probe
        // reservation (call 1), refused unless its allocation is larger; then the buffer's
        // reservation (call 2), and each chunk mapped there (cuMemMap calls 4 to 6) with its
        // access.
        let steps: [(&CStr, u32); 14] = [
            (c"cuMemImportFromShareableHandle", 1),
            (c"cuMemImportFromShareableHandle", 3),
            (c"cuMemGetAllocationPropertiesFromHandle", 1),
            (c"cuMemGetAllocationPropertiesFromHandle", 2),
            (c"cuMemGetAllocationPropertiesFromHandle", 3),
            (c"cuMemAddressReserve", 1),
            (c"cuMemAddressReserve", 2),
            (c"cuMemMap", 1),
            (c"cuMemMap", 3),
            (c"cuMemMap", 4),
            (c"cuMemMap", 6),
            (c"cuMemSetAccess", 1),
            (c"cuMemSetAccess", 2),
            (c"cuMemSetAccess", 3),
        ];
        for (function, nth) in steps {
            let fds = open_fds();
            let descriptor = buffer.export().unwrap();
            assert_eq!(open_fds(), fds + 3, "one descriptor per chunk");
            fails_cleanly(function, nth, || importer.import(descriptor, &s));
            assert_eq!(open_fds(), fds, "{function:?} (call {nth}): the descriptor's fds are closed");
            still_works(&buffer, &bytes[..4096], &s);
        }
        let imported = importer.import(buffer.export().unwrap(), &s).unwrap();
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
        let one = exporter.allocate(G, &s).unwrap();
        let buffer = one.grow(2 * G).unwrap();
        let importer = VirtualMemoryResource::new(exporter.device(), Default::default()).unwrap();
        let before = vmm_live();
        inject(c"cuMemImportFromShareableHandle", 2);
        let error = importer.import(buffer.export().unwrap(), &s).unwrap_err();
        assert!(matches!(error, VmmError::ChunkImport { chunk: 2, count: 2, .. }), "{error:?}");
        assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{error}");
        let source = std::error::Error::source(&error).expect("the driver's error is the source");
        assert_mentions(&source.to_string(), &["cuMemImportFromShareableHandle", "CUDA_ERROR_OUT_OF_MEMORY"]);
        assert_mentions(&error.to_string(), &["importing chunk 2 of 2"]);
        assert_eq!(vmm_live(), before, "the first chunk's import was released");
    });
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// A resource made, a buffer of it allocated and filled on another stream; both dropped.
    Allocate,
    /// A plain buffer allocated through the `MemoryResource` trait, filled on another stream,
    /// dropped.
    AllocateThroughTheTrait,
    /// A buffer grown in place, the grown one filled on another stream; both dropped.
    GrowInPlace,
    /// A buffer grown where the next buffer of the resource lies, so it moves; all dropped.
    GrowByMoving,
    /// A buffer of two chunks exported and imported by another resource, the import filled on
    /// another stream; all dropped.
    ExportAndImport,
    /// A buffer filled on another stream, then closed (dropped if `close` gives it back).
    Close,
}

const PATHS: [Path; 6] = [
    Path::Allocate,
    Path::AllocateThroughTheTrait,
    Path::GrowInPlace,
    Path::GrowByMoving,
    Path::ExportAndImport,
    Path::Close,
];

/// What a failure may leave behind: the simulator's live objects and the open descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    live: LiveObjects,
    fds: usize,
}

fn driver() -> &'static cuda_mem_core::sys::Driver {
    cuda_sim::testing::driver().expect("the test driver loads")
}

/// The snapshot once the streams' work is done.
fn snapshot(streams: [&Stream; 2]) -> Snapshot {
    for stream in streams {
        stream.synchronize().expect("the stream synchronizes");
    }
    Snapshot { live: cuda_sim::testing::live_objects(driver()).expect("the simulator counts"), fds: open_fds() }
}

/// The long-lived resources of the paths (as a program keeps them), on `device`, and its streams.
struct Setup {
    device: Device,
    resource: Arc<VirtualMemoryResource>,
    importer: Arc<VirtualMemoryResource>,
    own: Stream,
    other: Stream,
}

/// Runs `path`, stopping at the first error (what was made is then dropped, which releases it).
/// Returns the pointers before and after growth, for growth paths that got that far.
fn run_path(path: Path, setup: &Setup) -> Option<(u64, u64)> {
    let Setup { device, resource, importer, own, other } = setup;
    let mut grown_at = None;
    let mut run = || -> cuda_mem_vmm::Result<()> {
        match path {
            Path::Allocate => {
                let resource = VirtualMemoryResource::new(*device, Default::default())?;
                let mut buffer = resource.allocate(G, own)?;
                buffer.fill(FillPattern::U8(1), other)?;
            }
            Path::AllocateThroughTheTrait => {
                let mut buffer = MemoryResourceExt::allocate(resource, G, own)?;
                buffer.fill(FillPattern::U8(1), other)?;
            }
            Path::GrowInPlace | Path::GrowByMoving => {
                let buffer = resource.allocate(G, own)?;
                // The next buffer lies right after the first one: growth must move.
                let _next = if path == Path::GrowByMoving { Some(resource.allocate(G, own)?) } else { None };
                let mut grown = buffer.grow(2 * G)?;
                grown_at = Some((buffer.ptr(), grown.ptr()));
                grown.fill(FillPattern::U8(1), other)?;
            }
            Path::ExportAndImport => {
                let one = resource.allocate(G, own)?;
                let two = one.grow(2 * G)?;
                let mut imported = importer.import(two.export()?, own)?;
                imported.fill(FillPattern::U8(1), other)?;
            }
            Path::Close => {
                let mut buffer = resource.allocate(G, own)?;
                buffer.fill(FillPattern::U8(1), other)?;
                if let Err(failed) = buffer.close(Some(own)) {
                    // Dropping what came back tries once more.
                    drop(failed.buffer);
                    return Err(failed.error);
                }
            }
        }
        Ok(())
    };
    let _ = run();
    grown_at
}

#[test]
fn a_failure_at_any_driver_call_leaves_nothing_behind_unless_the_release_itself_fails() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection and live-object counts") {
            return;
        }
        let device = device(0);
        let setup = Setup {
            device,
            resource: VirtualMemoryResource::new(device, Default::default()).unwrap(),
            importer: VirtualMemoryResource::new(device, Default::default()).unwrap(),
            own: stream(device),
            other: stream(device),
        };
        let streams = [&setup.own, &setup.other];
        let mut injected = 0;
        for path in PATHS {
            // Once first: what is resolved or retained once per process is, before counting.
            run_path(path, &setup);
            let (grown_at, calls) = count_calls(driver(), || run_path(path, &setup)).unwrap();
            let errors = take_drop_errors();
            assert!(errors.is_empty(), "{path:?} without failures: {errors:?}");
            // The counts are those of the path: the checks below are not empty.
            for function in [
                "cuMemCreate",
                "cuMemAddressReserve",
                "cuMemMap",
                "cuMemSetAccess",
                "cuStreamIsCapturing",
                "cuStreamSynchronize",
                "cuStreamWaitEvent",
                "cuCtxGetCurrent",
            ] {
                assert!(calls.of(function) >= 1, "{path:?} calls {function}: {calls:?}");
            }
            match path {
                Path::GrowInPlace => assert!(matches!(grown_at, Some((a, b)) if a == b), "{grown_at:x?}"),
                Path::GrowByMoving => assert!(matches!(grown_at, Some((a, b)) if a != b), "{grown_at:x?}"),
                Path::ExportAndImport => {
                    assert_eq!(calls.of("cuMemExportToShareableHandle"), 2, "{calls:?}");
                    assert_eq!(calls.of("cuMemImportFromShareableHandle"), 2, "{calls:?}");
                }
                _ => {}
            }
            for injection in calls.injections() {
                let before = snapshot(streams);
                let (_, fired) = run_failing(driver(), injection, || run_path(path, &setup)).unwrap();
                let case = format!("{path:?}, {injection}");
                assert!(fired, "{case}: the path did not make that call");
                let mut after = snapshot(streams);
                let errors = take_drop_errors();
                if injection.is_releasing() {
                    assert!(
                        errors.iter().any(|e| e.error.cuda_code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
                        "{case}: the refused release was not recorded: {errors:?}"
                    );
                    // Only what the driver refused to let go of may stay: a physical allocation
                    // it kept keeps the descriptor of its memory (the simulator's), no other.
                    let kept = after.live.physical_allocations.saturating_sub(before.live.physical_allocations);
                    assert!(after.fds <= before.fds + kept as usize, "{case}: a descriptor was left open");
                } else {
                    if injection.function == "cuStreamIsCapturing" && !errors.is_empty() {
                        // Whether the stream captures could not be read: no order is safe (waiting
                        // for a capturing stream would disturb its capture), so the release is
                        // deferred, recorded, and done at the next safe point.
                        assert!(
                            errors.iter().all(|e| e.what == "virtual memory (release deferred)"),
                            "{case}: {errors:?}"
                        );
                        assert_eq!(release_deferred(), 0, "{case}: the deferred release is done now");
                        after = snapshot(streams);
                    } else {
                        assert!(errors.is_empty(), "{case}: a release was given up or deferred: {errors:?}");
                    }
                    assert_eq!(after, before, "{case}: something was left behind ({errors:?})");
                }
                injected += 1;
            }
        }
        assert!(injected > 150, "only {injected} failures were injected");
    });
}

#[test]
fn a_stream_that_cannot_be_waited_for_at_all_keeps_the_memory_and_says_so() {
    machine!(&[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (s, resource) = setup();
        let baseline = vmm_live();
        let buffer = resource.allocate(G, &s).unwrap();
        let mapped = vmm_live();
        // The stream cannot be synchronized, nor waited for through an event: no order is safe,
        // so the memory stays mapped, and that is recorded.
        fail_the_next_wait_for_a_stream();
        let ((), calls) = count_calls(driver(), || drop(buffer)).unwrap();
        assert_eq!(calls.of("cuEventSynchronize"), 1, "waiting through an event was tried: {calls:?}");
        assert_eq!(calls.of("cuMemUnmap"), 0, "nothing was unmapped: {calls:?}");
        let errors = take_drop_errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].what, "virtual memory (release deferred)");
        assert_mentions(&errors[0].error.to_string(), &["deferred", "cuStreamSynchronize", "CUDA_ERROR_OUT_OF_MEMORY"]);
        assert_eq!(vmm_live(), mapped, "kept mapped");
        // Released at the next safe point, once the stream can be waited for.
        assert_eq!(release_deferred(), 0);
        assert_eq!(vmm_live(), baseline);
        assert!(take_drop_errors().is_empty());
    });
}
