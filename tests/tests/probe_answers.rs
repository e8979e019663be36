//! The `probe` binary on the simulator: every question gets an answer, the report holds them,
//! the comparison with the simulator (forced with `PROBE_COMPARE=1`) finds its own answers
//! stable, and the probe tells the two readings of a second pool import apart.
//!
//! The binary is run from the build folder, so these tests do not run from the GPU bundle
//! (where `run.sh` runs the probe itself, as its part `probe`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use cuda_mem_integration::child_process::{KillOnDrop, read_in_background};

/// How long one run of the probe may take.
const TIMEOUT: Duration = Duration::from_secs(300);

/// A folder of this test's own for the report, removed on drop.
struct OutDir(PathBuf);

impl OutDir {
    fn new(name: &str) -> OutDir {
        let dir = std::env::temp_dir().join(format!("cuda-mem-probe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        OutDir(dir)
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the probe on the simulator (two devices) with `args` and extra environment; its exit
/// success and standard output.
fn probe(out: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let simulator = cuda_sim::testing::library_path().expect("the simulator library is built beside the tests");
    let mut command = Command::new(env!("CARGO_BIN_EXE_probe"));
    command
        .args(args)
        .env(cuda_mem_sys::DRIVER_ENV, simulator)
        .env("CUDA_SIM_DEVICES", "2")
        .env("PROBE_OUT", out)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("CUDA_SIM_POOL_IMPORT")
        .env_remove("CUDA_SIM_POOL_HANDLES")
        .env_remove("CUDA_SIM_ADDRESS_HINTS")
        .env_remove("CUDA_SIM_IMEX_CHANNEL")
        .env_remove("CUDA_SIM_DEVICE_ATTRIBUTES")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut process = KillOnDrop::new(command.spawn().expect("starting the probe"));
    let stdout = read_in_background(process.child().stdout.take().expect("piped"));
    let status = process.wait(TIMEOUT).expect("the probe finishes");
    (status.success(), stdout.join().expect("reading the probe's output"))
}

/// The answer lines: name → answer.
fn answers(output: &str) -> Vec<(String, String)> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("PROBE "))
        .filter_map(|l| l.split_once(": "))
        .map(|(n, a)| (n.to_string(), a.to_string()))
        .collect()
}

fn answer<'a>(answers: &'a [(String, String)], name: &str) -> &'a str {
    answers.iter().find(|(n, _)| n == name).map(|(_, a)| a.as_str()).unwrap_or_else(|| panic!("no answer to {name}"))
}

#[test]
fn every_question_is_answered_and_the_simulator_agrees_with_itself() {
    if !cuda_sim::testing::simulator_only("the probe binary runs from the build folder") {
        return;
    }
    let out = OutDir::new("all");
    let list = Command::new(env!("CARGO_BIN_EXE_probe")).arg("--list").output().expect("probe --list");
    let names: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(n, _)| n.to_string()))
        .collect();
    assert!(names.len() >= 8, "the questions: {names:?}");

    let (success, output) = probe(&out.0, &[], &[("PROBE_COMPARE", "1")]);
    assert!(success, "the probe failed:\n{output}");
    let answers = answers(&output);
    let answered: Vec<&String> = answers.iter().map(|(n, _)| n).collect();
    assert_eq!(answered, names.iter().collect::<Vec<_>>(), "one answer per question, in order:\n{output}");
    for (name, answer) in &answers {
        assert!(!answer.starts_with("error:"), "{name}: {answer}");
    }
    the_first_answers_are_the_simulators(&answers);
    the_managed_answers_are_the_simulators(&answers);
    the_conservative_readings_are_the_simulators(&answers);
    the_report_has_every_answer(&out, &names, &output);
}

/// The pools', peer access', copies', capture modes' and IPC events' questions: what the simulator
/// models, as the probe reports it.
fn the_first_answers_are_the_simulators(answers: &[(String, String)]) {
    assert!(answer(answers, "pool-import-twice").starts_with("same fd again: a new handle"));
    assert_eq!(
        answer(answers, "peer-access-after-destroy"),
        "the next pool (a new handle value) starts without device 1's access (the bug is not seen)"
    );
    assert_eq!(
        answer(answers, "zero-byte-pool-allocation"),
        "succeeds: two distinct non-null pointers; cuMemFreeAsync CUDA_SUCCESS, again CUDA_ERROR_INVALID_VALUE"
    );
    assert_eq!(
        answer(answers, "host-pool-before-access"),
        "access NONE; copies: host->pool CUDA_SUCCESS, pool->device CUDA_SUCCESS, device->pool CUDA_SUCCESS, \
         pool->host CUDA_SUCCESS; memset CUDA_ERROR_INVALID_VALUE"
    );
    assert!(answer(answers, "pci-bus-id").starts_with(
        "\"0000:01:00.0\" (matches the attributes); room for 12: \
         CUDA_ERROR_INVALID_VALUE; by id: full device 0, no_function device 0, no_domain device 0, upper device 0"
    ));
    assert_eq!(
        answer(answers, "free-with-pending-work"),
        "cuMemAlloc: CUDA_SUCCESS returned at once; pool: CUDA_SUCCESS returned at once"
    );
    assert!(answer(answers, "failed-alloc-marks").matches("counts unchanged").count() == 3);
    // Capture modes: a global capture refuses another thread's unsafe calls and is invalidated.
    assert_eq!(
        answer(answers, "per-thread-stream-during-capture"),
        "global: another thread's cuStreamIsCapturing(per-thread) NONE, cuMemAllocFromPoolAsync(per-thread) ok, \
         cuMemAlloc STREAM_CAPTURE_UNSUPPORTED, cuMemPoolCreate STREAM_CAPTURE_UNSUPPORTED; the capture then \
         INVALIDATED | relaxed: another thread's cuStreamIsCapturing(per-thread) NONE, \
         cuMemAllocFromPoolAsync(per-thread) ok, cuMemAlloc ok, cuMemPoolCreate ok; the capture then ACTIVE"
    );
    // The delays themselves are details (microseconds, varying from run to run): the
    // simulator's waiter polls, at most about a millisecond late on an idle machine.
    assert_eq!(
        answer(answers, "ipc-event"),
        "without CU_EVENT_INTERPROCESS: CUDA_ERROR_INVALID_HANDLE; opened in the exporting process: \
         CUDA_ERROR_INVALID_VALUE; another process's view before the recording completes: CUDA_ERROR_NOT_READY; then \
         cuEventQuery sees it within 1 s, cuStreamWaitEvent sees it within 1 s"
    );
}

/// Managed memory's questions: ranges, location ids, pool advice and discards.
fn the_managed_answers_are_the_simulators(answers: &[(String, String)]) {
    let refused = "one page past the end CUDA_ERROR_INVALID_VALUE, spanning two CUDA_ERROR_INVALID_VALUE, cuMemAlloc \
                   CUDA_ERROR_INVALID_VALUE, 0 bytes CUDA_ERROR_INVALID_VALUE";
    assert_eq!(
        answer(answers, "managed-range-errors"),
        format!(
            "read-mostly: managed CUDA_SUCCESS, {refused}; preferred location: managed CUDA_SUCCESS, {refused}; \
             prefetch: managed CUDA_SUCCESS, {refused}"
        )
    );
    assert_eq!(
        answer(answers, "managed-ignored-location-ids"),
        "fresh: preferred INVALID id CU_DEVICE_INVALID (legacy CU_DEVICE_INVALID), last prefetch INVALID id \
         CU_DEVICE_INVALID (legacy CU_DEVICE_INVALID); after preferring and prefetching to the host (advice \
         CUDA_SUCCESS, prefetch CUDA_SUCCESS): preferred HOST id CU_DEVICE_INVALID (legacy CU_DEVICE_CPU), last \
         prefetch HOST id CU_DEVICE_INVALID (legacy CU_DEVICE_CPU)"
    );
    assert_eq!(
        answer(answers, "managed-pool-advice"),
        "IS_MANAGED false; advice: read-mostly CUDA_SUCCESS, preferred location CUDA_SUCCESS, accessed by \
         CUDA_SUCCESS; prefetch CUDA_SUCCESS; READ_MOSTLY reads 1"
    );
    assert_eq!(
        answer(answers, "managed-discard"),
        "cuMemDiscardBatchAsync: CUDA_SUCCESS; the memory reads every byte 0xDB"
    );
}

/// Questions 19-38: the readings `cuda_sim::conservative` takes for batch copies, graphs, graph
/// memory, capture modes and user objects; descriptors of other kinds, an exporter freeing first,
/// and IMEX channels; zero bytes allocated in a capture, graph memory's release, a capture's
/// dependencies; single calls' and captures' edges, the primary context's, address ranges,
/// mappings past an allocation, and copies of the wrong memory.
fn the_conservative_readings_are_the_simulators(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "batch-copy-edges"),
        "zero-byte INVALID_VALUE; dependent INVALID_VALUE; on a capturing stream STREAM_CAPTURE_UNSUPPORTED, the \
         capture then ACTIVE, end ok (nodes: MEMSET); malformed hints: unknown type INVALID_VALUE, absent device \
         INVALID_VALUE, NUMA node 4096 INVALID_VALUE"
    );
    // Freed graph memory stays used (its graph keeps it) until trimmed.
    assert_eq!(
        answer(answers, "graph-memory-accounting"),
        "1 MiB: launched used=2 MiB reserved=2 MiB; freed used=2 MiB reserved=2 MiB; trimmed used=0 MiB reserved=0 \
         MiB; 3 MiB: launched used=4 MiB reserved=4 MiB; freed used=4 MiB reserved=4 MiB; trimmed used=0 MiB \
         reserved=0 MiB; USED_MEM_HIGH reset to 0 with 1 MiB in use reads 2 MiB"
    );
    let refused = "STREAM_CAPTURE_UNSUPPORTED, the capture then ACTIVE, end ok (nodes: MEMSET)";
    assert_eq!(
        answer(answers, "graph-launch-into-capture"),
        format!("cuGraphLaunch {refused}; cuGraphUpload {refused}")
    );
    let allocated = "ok, the capture then ACTIVE, end ok (nodes: MEM_ALLOC, MEM_FREE)";
    assert_eq!(
        answer(answers, "pool-alloc-in-capture"),
        format!("cuMemAllocFromPoolAsync {allocated}; cuMemAllocAsync {allocated}")
    );
    let invalidated = "STREAM_CAPTURE_UNSUPPORTED→INVALIDATED: cuMemAlloc, cuMemFree, cuMemAllocHost, \
                       cuMemAllocManaged, cuMemPoolCreate";
    assert_eq!(
        answer(answers, "unsafe-call-invalidates"),
        format!("this thread: {invalidated} | another thread: {invalidated}")
    );
    let destructor = "runs on another thread, the call does not wait for it; in it cuCtxGetCurrent \
                      CUDA_ERROR_NOT_PERMITTED, cuCtxSetCurrent CUDA_ERROR_NOT_PERMITTED, cuMemAlloc \
                      CUDA_ERROR_NOT_PERMITTED";
    assert_eq!(
        answer(answers, "user-object-destructor-thread"),
        format!("cuUserObjectRelease: {destructor}; cuGraphDestroy: {destructor}")
    );

    // Question 25: descriptors of other kinds are refused, and the importer lives on.
    let invalid = "CUDA_ERROR_INVALID_VALUE";
    assert_eq!(
        answer(answers, "pool-import-not-a-pool"),
        format!(
            "/dev/null {invalid}, a socket {invalid}, a memfd of garbage {invalid}, a regular file {invalid}; the \
             process lived on (a pool of its own made after)"
        )
    );
    // Question 26: the exporter's free under an importer poisons the memory and quarantines
    // it (B goes elsewhere), and the freed allocation's export data no longer imports.
    assert_eq!(
        answer(answers, "exporter-frees-first"),
        "B took A's address: no (another address); the importer then read 0xdb (the simulator's poison); A's old \
         export data imported again: CUDA_ERROR_INVALID_VALUE; the importer's free: CUDA_SUCCESS; the importer lived \
         on (a pool of its own made after)"
    );
    // Question 27: no IMEX channel unless the simulator is told of one (the channels listed are
    // this machine's, which the test does not pin).
    let fabric = answer(answers, "fabric-channel");
    assert!(fabric.starts_with("fabric handles supported (attribute): 1; IMEX channels"), "{fabric}");
    assert!(fabric.ends_with("cuMemCreate shareable as a fabric handle: CUDA_ERROR_NOT_PERMITTED"), "{fabric}");
    the_capture_and_graph_memory_readings_are_the_simulators(answers);
    the_call_and_capture_edges_are_the_simulators(answers);
    the_context_edges_are_the_simulators(answers);
    the_address_ranges_are_the_allocations(answers);
    gone_streams_work_is_waited_for(answers);
    visible_devices_are_read_narrowly(answers);
    a_mapping_past_the_allocation_is_refused(answers);
    copies_of_the_wrong_memory_are_refused(answers);
}

/// Questions 28-30: zero bytes allocated in a capture, when graph memory stops counting as
/// used, and a capture's dependencies.
fn the_capture_and_graph_memory_readings_are_the_simulators(answers: &[(String, String)]) {
    let zero = "ok, pointer non-null, end ok (nodes: MEM_ALLOC); launched ok, cuMemFreeAsync after ok";
    assert_eq!(
        answer(answers, "zero-byte-allocation-in-capture"),
        format!("cuMemAllocAsync {zero}; cuMemAllocFromPoolAsync {zero}")
    );
    let (used, reserved, none) =
        ("used=2 MiB reserved=2 MiB", "used=0 MiB reserved=2 MiB", "used=0 MiB reserved=0 MiB");
    assert_eq!(
        answer(answers, "graph-memory-release"),
        format!(
            "freed outside: launched {used}, freed {used}, launched {used}, freed {used}, executable graph destroyed \
             {reserved}, trimmed {none}; freed in the graph: launched {used}, trimmed with the executable graph \
             {none}, launched {used}, executable graph destroyed {reserved}, trimmed {none}"
        )
    );
    assert_eq!(
        answer(answers, "capture-dependencies"),
        "after a memset [MEMSET], after cuEventRecord [the same], the stream waiting for it [the same], after a wait \
         for an event recorded outside [WAIT_EVENT], with CU_EVENT_WAIT_EXTERNAL [WAIT_EVENT]; \
         cuStreamUpdateCaptureDependencies: flags 2 INVALID_VALUE, a node twice INVALID_VALUE, another capture's \
         node INVALID_VALUE, programmatic edge data INVALID_VALUE, set to none ok, then [none], not capturing \
         ILLEGAL_STATE; end ok (nodes: MEMSET, WAIT_EVENT, WAIT_EVENT)"
    );
}

/// Question 33: the primary context's edges; the memory of a free pending when the context went
/// comes back (issue 29: it stayed reserved for good); created contexts refuse execution
/// affinity, an event records on no other context's stream, and a primary context is not
/// `cuCtxDestroy`'s.
fn the_context_edges_are_the_simulators(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "context-edges"),
        "destroy legacy INVALID_HANDLE, per-thread INVALID_HANDLE; last release with a free pending ok (at once); \
         release again INVALID_CONTEXT; retain again ok (a new value); free memory after as before; cuCtxCreate_v4 \
         with an SM-count affinity NOT_SUPPORTED; a created context's event recorded on the primary's stream \
         INVALID_HANDLE; cuCtxDestroy of the primary INVALID_CONTEXT"
    );
}

/// Question 38: copies naming device memory as host memory, and from a freed pointer, are
/// refused, and the context lives on.
fn copies_of_the_wrong_memory_are_refused(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "unsafe-edges"),
        "htod-device-source: INVALID_VALUE; dtoh-device-destination: INVALID_VALUE; freed-pointer-copy: \
         INVALID_VALUE, then cuCtxSynchronize ok"
    );
}

/// Question 36: a mapping past the physical allocation is refused, which `cuda-mem-vmm`'s check
/// of a peer's claimed chunk sizes relies on.
fn a_mapping_past_the_allocation_is_refused(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "vmm-map-past-the-allocation"),
        "two granules CUDA_ERROR_INVALID_VALUE; at offset one granule CUDA_ERROR_INVALID_VALUE"
    );
}

/// Question 37: `cuCtxSynchronize` waits for the work of streams with no handle (issue 29: the
/// simulator forgot an exited thread's per-thread stream).
fn gone_streams_work_is_waited_for(answers: &[(String, String)]) {
    let waited = "cuCtxSynchronize CUDA_SUCCESS waited for it, the memset had run";
    assert_eq!(
        answer(answers, "gone-stream-work"),
        format!("exited thread's per-thread stream: {waited}; destroyed stream: {waited}")
    );
}

/// Questions 39 and 40: `CUDA_VISIBLE_DEVICES` read as narrowly as its documentation's
/// examples, and an import of a pool on a device the importer does not see refused.
fn visible_devices_are_read_narrowly(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "visible-devices"),
        "0: 1 device(s); the GPU-UUID: 1 device(s); an 8-digit prefix: 1 device(s); ' 0': cuInit NO_DEVICE; \
         uppercase: cuInit NO_DEVICE; no GPU-: cuInit NO_DEVICE; bare GPU-: cuInit NO_DEVICE; 0,0: 1 device(s); \
         x,0: cuInit NO_DEVICE; empty: cuInit NO_DEVICE"
    );
    assert_eq!(answer(answers, "hidden-device-import"), "the import INVALID_VALUE");
}

/// Question 34: `cuMemGetAddressRange` names each allocation itself, a VMM mapping included,
/// which the DLPack import's range check relies on.
fn the_address_ranges_are_the_allocations(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "address-range"),
        "cuMemAlloc: the allocation; pool: the allocation; cuMemAllocHost: the allocation; managed: the allocation; \
         VMM: first mapping the allocation, second mapping the allocation, cuMemRetainAllocationHandle CUDA_SUCCESS; \
         retain cuMemAlloc: CUDA_ERROR_INVALID_VALUE"
    );
}

/// Questions 31 and 32: single calls and captures where `cuda.h` is silent, each answered as
/// `cuda_sim::conservative` says.
fn the_call_and_capture_edges_are_the_simulators(answers: &[(String, String)]) {
    assert_eq!(
        answer(answers, "call-edges"),
        "cuMemFree(0) INVALID_VALUE; cuMemFreeHost(NULL) INVALID_VALUE; cuMemAllocHost(0) INVALID_VALUE; \
         cuMemsetD16(odd) INVALID_VALUE; cuMemsetD32(ptr+2) INVALID_VALUE; cuMemsetD8(end, 0 bytes) INVALID_VALUE; \
         cuMemcpyDtoD(end, 0 bytes) INVALID_VALUE; cuPointerGetAttribute(IS_MANAGED) writes 1 byte(s); \
         cuMemFreeAsync(cuMemAlloc memory) INVALID_VALUE; cuMemAllocFromPoolAsync(SIZE_MAX) OUT_OF_MEMORY; managed \
         pool with POSIX fd handles NOT_SUPPORTED; cuCtxRecordEvent(NULL) INVALID_CONTEXT; cuCtxGetLimit: stack 1024, \
         printf FIFO 1048576, malloc heap 8388608, pending launches 2048, L2 fetch granularity 64, sync depth \
         UNSUPPORTED_LIMIT; cuStreamAttachMemAsync(SINGLE, legacy stream) INVALID_VALUE; \
         cuStreamAttachMemAsync(cuMemAlloc memory) INVALID_VALUE; cuStreamAttachMemAsync(half a managed allocation) \
         INVALID_VALUE; cuMemGetMemPool(absent device) INVALID_VALUE; cuMemGetDefaultMemPool(absent device) \
         INVALID_DEVICE; allocation after a free on an idle stream: the pool's reserve then 2 MiB; \
         with no current context: cuEventQuery ok, cuEventSynchronize ok, cuEventDestroy ok, cuMemFree ok"
    );
    assert_eq!(
        answer(answers, "capture-edges"),
        "pageable copy: the bytes at launch time; stream destroyed while capturing: ok; second instantiation: \
             first ok, second INVALID_VALUE; wait for an event recorded outside: ok, the capture then ACTIVE, end ok \
             (nodes: WAIT_EVENT)"
    );
}

/// `probe.json` names every question once, each answered and agreeing with the simulator's side
/// (which wrote its own report), as the printed lines say too.
fn the_report_has_every_answer(out: &OutDir, names: &[String], output: &str) {
    let report = std::fs::read_to_string(out.0.join("probe.json")).expect("the report");
    for name in names {
        assert_eq!(report.matches(&format!("\"name\": \"{name}\"")).count(), 1, "{name} in the report");
    }
    assert_eq!(report.matches("\"answered\": true").count(), names.len());
    assert_eq!(report.matches("\"agrees_with_simulator\": true").count(), names.len(), "{report}");
    assert!(out.0.join("probe-simulator.json").is_file(), "the simulator's side wrote its report");
    assert!(output.lines().filter(|l| l.starts_with("  agrees ")).count() == names.len(), "{output}");
}

#[test]
fn the_probe_tells_the_two_readings_of_a_second_pool_import_apart() {
    if !cuda_sim::testing::simulator_only("CUDA_SIM_POOL_IMPORT is the simulator's") {
        return;
    }
    let questions = ["pool-import-twice", "pointer-import-two-pools"];
    let out = OutDir::new("import");
    let (success, new_handle) = probe(&out.0, &questions, &[]);
    assert!(success, "{new_handle}");
    let (success, same_handle) = probe(&out.0, &questions, &[("CUDA_SIM_POOL_IMPORT", "same-handle")]);
    assert!(success, "{same_handle}");
    let (new_handle, same_handle) = (answers(&new_handle), answers(&same_handle));

    let new = answer(&new_handle, "pool-import-twice");
    assert!(new.contains("same fd again: a new handle; a dup of the fd: a new handle"), "{new}");
    assert!(new.contains("leaves the first usable"), "{new}");
    let same = answer(&same_handle, "pool-import-twice");
    assert!(same.contains("same fd again: the first import's handle; a dup of the fd: the first import's handle"));
    assert!(same.contains("the first answers CUDA_ERROR_INVALID_VALUE"), "one destroy destroys it for all: {same}");

    let new = answer(&new_handle, "pointer-import-two-pools");
    assert!(new.contains("through it: another address, freeing the first import leaves it mapped"), "{new}");
    let same = answer(&same_handle, "pointer-import-two-pools");
    assert!(same.contains("through it: the same address, freeing the first import unmaps it"), "{same}");
    // The duplicate import through one handle is uncounted in both readings (nvbug 5570902).
    for answer in [new, same] {
        assert!(answer.contains("through one handle twice: the same address, second free CUDA_ERROR_INVALID_VALUE"));
    }
}

#[test]
fn the_probe_sees_nvbug_5698116_when_pool_handles_are_recycled() {
    if !cuda_sim::testing::simulator_only("CUDA_SIM_POOL_HANDLES is the simulator's") {
        return;
    }
    let out = OutDir::new("recycle");
    let (success, output) =
        probe(&out.0, &["peer-access-after-destroy"], &[("CUDA_SIM_POOL_HANDLES", "recycle"), ("PROBE_COMPARE", "0")]);
    assert!(success, "the probe failed:\n{output}");
    assert_eq!(
        answer(&answers(&output), "peer-access-after-destroy"),
        "the next pool (the destroyed pool's handle value) starts with device 1's access (READWRITE): nvbug 5698116"
    );
}

#[test]
fn the_probe_sees_refused_address_hints() {
    if !cuda_sim::testing::simulator_only("CUDA_SIM_ADDRESS_HINTS is the simulator's") {
        return;
    }
    let out = OutDir::new("hints");
    let (success, output) =
        probe(&out.0, &["address-hint"], &[("CUDA_SIM_ADDRESS_HINTS", "refuse-every-4"), ("PROBE_COMPARE", "0")]);
    assert!(success, "the probe failed:\n{output}");
    let answers = answers(&output);
    let answer = answer(&answers, "address-hint");
    assert!(answer.contains("24/32"), "{answer}");
}

#[test]
fn the_managed_probes_stop_where_devices_lack_concurrent_managed_access() {
    if !cuda_sim::testing::simulator_only("CUDA_SIM_DEVICE_ATTRIBUTES is the simulator's") {
        return;
    }
    let out = OutDir::new("managed");
    let questions = ["managed-range-errors", "managed-ignored-location-ids", "managed-pool-advice", "managed-discard"];
    // Attribute 89: CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS.
    let (success, output) =
        probe(&out.0, &questions, &[("CUDA_SIM_DEVICE_ATTRIBUTES", "89=0"), ("PROBE_COMPARE", "0")]);
    assert!(success, "the probe failed:\n{output}");
    let answers = answers(&output);
    for name in questions {
        assert_eq!(answer(&answers, name), "not applicable: device 0 has no concurrent managed access", "{output}");
    }
}

#[test]
fn the_probe_asks_two_devices_whether_a_peer_copy_of_pool_memory_needs_the_pools_grant() {
    if !cuda_sim::testing::simulator_only("the device count is the simulator's") {
        return;
    }
    let out = OutDir::new("peer-copy");
    let question = ["peer-copy-pool-access"];
    let (success, output) = probe(&out.0, &question, &[("PROBE_COMPARE", "0")]);
    assert!(success, "the probe failed:\n{output}");
    assert_eq!(
        answer(&answers(&output), "peer-copy-pool-access"),
        "cuMemcpyPeerAsync CUDA_SUCCESS (the bytes arrived), cuMemcpyPeer CUDA_SUCCESS; with the contexts swapped \
         CUDA_ERROR_INVALID_VALUE; cuMemcpyDtoDAsync CUDA_ERROR_INVALID_VALUE"
    );
    // One device: no answer to ask, and no failure.
    let (success, output) = probe(&out.0, &question, &[("PROBE_COMPARE", "0"), ("CUDA_SIM_DEVICES", "1")]);
    assert!(success, "the probe failed:\n{output}");
    assert_eq!(
        answer(&answers(&output), "peer-copy-pool-access"),
        "not applicable: it needs two devices, the driver reports 1"
    );
}
