//! PyTorch's memory-viewer pickle of a real snapshot on the simulator: a caching resource's
//! recorded history (allocations, frees, a free pending on another stream, a released segment,
//! an out-of-memory failure, a free whose allocation predates the recording) and a pool's own
//! allocation, written by `write_torch_pickle` and read by the workspace's
//! `tests/python/torch_snapshot.py`: every opcode one the viewer's unpickler reads, the
//! structure PyTorch's, the viewer's backward walk from the final segments through every event
//! without a missing block or segment, and the figures the Rust side's. Where `torch` is
//! importable, `torch.cuda._memory_viz`'s `segsum` and `trace` read it too.
//!
//! It needs a Python 3 (`python3` on the `PATH`); without one it says SKIP on stderr and passes
//! without running.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Gate, hold};
use cuda_mem_core::history::{self, HistoryOptions, ResourceId};
use cuda_mem_core::snapshot::{BlockState, MemorySnapshot, take_snapshot};
use cuda_mem_core::{Buffer, CachingOptions, CachingResource, DeviceMemoryResource, FillPattern, Stream};
use cuda_sim::testing::{OpenOnDrop, in_simulated_machine};

const KIB: usize = 1 << 10;

/// The resources and buffers of [`workload`], kept alive until the snapshot is written.
struct Held {
    cache: std::sync::Arc<CachingResource>,
    buffers: Vec<Buffer>,
    /// Opens the gate that holds the pending free's stream when dropped.
    opens: OpenOnDrop,
}

/// Records a caching resource's work (with `options`) over a pool, and takes the snapshot.
// Never inlined, so that release builds (the GPU bundle's) keep its frame in backtraces.
#[inline(never)]
fn workload(options: HistoryOptions, a: &Stream, b: &Stream) -> (MemorySnapshot, Held) {
    let pool = DeviceMemoryResource::new(common::device(), Default::default()).unwrap();
    let cache = CachingResource::new(pool.clone(), CachingOptions::default()).unwrap();
    let early = cache.allocate(96 * KIB, a).unwrap();
    history::start_recording(options);
    let mut buffers = Vec::new();
    for round in 0..24usize {
        let buffer = cache.allocate(16 * KIB * (1 + round % 5), a).unwrap();
        if round % 3 == 0 {
            buffers.push(buffer);
        }
    }
    // A large segment of its own, given back once its block is free.
    drop(cache.allocate(8 << 20, a).unwrap());
    a.synchronize().unwrap();
    assert!(cache.empty_cache().unwrap() > 0);
    // Freed on another stream whose work is held: pending until it runs.
    let mut pending = cache.allocate(64 * KIB, a).unwrap();
    let (gate, opens) = Gate::new();
    hold(gate, b.handle());
    pending.set_deallocation_stream(b);
    pending.fill(FillPattern::U8(1), b).unwrap();
    drop(pending);
    assert!(cache.allocate(1 << 50, a).is_err(), "out of memory");
    // The pool's own allocation: its memory lies in no segment, so the trace leaves it out.
    buffers.push(pool.allocate(1 << 20, a).unwrap());
    drop(early);
    history::stop_recording();
    (take_snapshot(), Held { cache, buffers, opens })
}

/// What the Python side checks the pickle's figures against, as a JSON object.
fn expected(snapshot: &MemorySnapshot, cache: &CachingResource) -> String {
    let ours = snapshot.resource(ResourceId::of(cache)).expect("the cache is in the snapshot");
    let blocks = || ours.segments.iter().flat_map(|segment| &segment.blocks);
    let allocated = blocks().filter(|block| matches!(block.state, BlockState::Allocated { .. })).count();
    let pending = blocks().filter(|block| block.state == BlockState::Pending).count();
    let events = |kind: &str| snapshot.events.iter().filter(|e| e.resource == ours.id && e.kind == kind).count();
    // The pool's failure under the cache's is kept too: a failure needs no segment.
    let failures = snapshot
        .events
        .iter()
        .filter(|e| e.kind == "out_of_memory" && snapshot.resource_of_event(e.resource).is_some());
    format!(
        r#"{{"segments": {}, "reserved": {}, "used": {}, "allocated_blocks": {allocated}, "pending_blocks": {pending},
            "alloc": {}, "free_requested": {}, "segment_alloc": {}, "segment_free": {}, "oom": {}, "first_time_us": {}}}"#,
        ours.segments.len(),
        ours.reserved_bytes,
        ours.used_bytes,
        events("allocate"),
        events("free_requested"),
        events("segment_allocate"),
        events("segment_free"),
        failures.count(),
        snapshot.events.iter().find(|e| e.resource == ours.id).map_or(0, |e| e.time_ns / 1000),
    )
}

/// The workspace's root: where this test was built, or the folder `CUDA_MEM_WORKSPACE` names
/// (the GPU bundle's copy of the Python files).
fn workspace() -> PathBuf {
    std::env::var_os("CUDA_MEM_WORKSPACE")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."), PathBuf::from)
}

/// Whether `python3` runs here; if not, says SKIP on stderr. Asked in the test's own process:
/// what a simulated machine's child process prints is shown only when it fails.
fn python_runs() -> bool {
    match Command::new("python3").arg("--version").output() {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let _ = std::io::stderr().write_all(format!("SKIP {test}: no python3 on the PATH\n").as_bytes());
            false
        }
        Err(e) => panic!("starting python3: {e}"),
    }
}

/// Runs the checker on `pickle` against `expected`, and returns its output.
fn python_checks(pickle: &Path, expected: &str) -> String {
    let script = workspace().join("tests/python/torch_snapshot.py");
    let output = Command::new("python3").arg(&script).arg(pickle).arg(expected).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// The whole check, recording with `options` (with backtraces when `backtraces`).
fn pickle_is_read_as_pytorchs_viewer_reads_it(options: HistoryOptions, backtraces: bool) {
    let _serial = history::tests_serial();
    let device = common::device();
    let (a, b) = (common::stream(device), common::stream(device));
    let (snapshot, held) = workload(options, &a, &b);
    let folder = tempfile::tempdir().unwrap();
    let pickle = folder.path().join("snapshot.pickle");
    snapshot.write_torch_pickle(&pickle).unwrap();
    let bytes = std::fs::read(&pickle).unwrap();
    let named = bytes.windows(b"torch_snapshot::workload".len()).any(|w| w == b"torch_snapshot::workload");
    assert_eq!(named, backtraces, "the frames name the function that allocated");
    let expected = expected(&snapshot, &held.cache);
    let stdout = python_checks(&pickle, &expected);
    println!("{stdout}");
    assert!(stdout.contains("opcodes: protocol 3"), "{stdout}");
    assert!(stdout.contains("walked back"), "{stdout}");
    assert!(stdout.contains("figures agree"), "{stdout}");
    drop(held.opens);
    b.synchronize().unwrap();
    drop(held.buffers);
}

/// Runs the check in a simulated machine of its own (the test `name`), where Python runs.
fn in_own_machine(name: &str, options: HistoryOptions, backtraces: bool) {
    if python_runs() {
        in_simulated_machine(name, &[], || pickle_is_read_as_pytorchs_viewer_reads_it(options, backtraces));
    }
}

/// Frees recorded without their completions: each gets one beside it in the trace.
#[test]
fn pytorchs_viewer_reads_the_pickle_of_a_history_without_free_completions() {
    let name = "pytorchs_viewer_reads_the_pickle_of_a_history_without_free_completions";
    in_own_machine(name, HistoryOptions::default().backtraces(true), true);
}

/// Frees recorded with their completions (from the driver's thread, after the stream's work).
#[test]
fn pytorchs_viewer_reads_the_pickle_of_a_history_with_free_completions() {
    let name = "pytorchs_viewer_reads_the_pickle_of_a_history_with_free_completions";
    in_own_machine(name, HistoryOptions::default().free_completions(true), false);
}
