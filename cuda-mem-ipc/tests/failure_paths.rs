//! Failure paths of sharing: a failure injected at each driver call of sending pools and buffers
//! (exporting the pool's shareable handle and each allocation's pointer) and of receiving them
//! (importing the pool, asking where its memory lives, granting a pinned pool to the devices,
//! the counted import of each allocation and its range-size check; then dropping the buffers,
//! letting go of the channel's resources and dropping the channel) leaves nothing behind: no
//! pool, no import, no allocation, no open file descriptor, except where the driver refused a
//! free or a destroy itself, and then the refusal is recorded.
//!
//! The calls are counted first (`cuda_sim::testing::count_calls`), then each call of each
//! driver function is made to fail in turn, in one child process per test (fault injection and
//! the counts are process-wide). Within one process over `Channel::pair()` for both kinds of
//! pool and two ways of receiving (and, with the feature `vmm`, for a virtual buffer); across
//! processes (the receiving side in a spawned child) for one representative case.

use std::process::{Command, Stdio};
use std::sync::Arc;

use cuda_mem_core::sys::types::CUresult;
use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, MemoryResource, MemoryResourceExt,
    PinnedMemoryResource, PinnedMemoryResourceOptions, Stream, StreamOptions, take_drop_errors,
};
use cuda_mem_ipc::{Channel, IpcChannel, IpcError, Received, Result, spawn_with_channel};
use cuda_sim::testing::{
    CallCounts, Injection, LiveObjects, count_calls, in_simulated_machine, open_fds, run_failing, simulator_only,
};

const SIZE: usize = 1 << 16;
const OOM: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;

/// The role of a child spawned by [`the_receiving_side_in_another_process_leaves_nothing_behind`].
const ROLE: &str = "CUDA_MEM_IPC_FAILURE_PATHS_ROLE";

#[derive(Debug, Clone, Copy)]
enum Kind {
    DevicePool,
    PinnedPool,
}

const KINDS: [Kind; 2] = [Kind::DevicePool, Kind::PinnedPool];

#[derive(Debug, Clone, Copy)]
enum Path {
    /// One buffer sent (its pool first) and received, used on another stream, dropped; then the
    /// receiving channel lets go of the pool, and both ends are dropped.
    OneBuffer,
    /// The same buffer sent twice and received on two streams (two holders of one import, the
    /// first release noting where its stream's work ends, the last waiting for it); the
    /// receiving channel is dropped first, so that the last buffer destroys the imported pool.
    SharedTwice,
}

const PATHS: [Path; 2] = [Path::OneBuffer, Path::SharedTwice];

fn driver() -> &'static cuda_mem_core::sys::Driver {
    cuda_sim::testing::driver().expect("the test driver loads")
}

/// What a failure may leave behind: the simulator's live objects and this process's open file
/// descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    live: LiveObjects,
    fds: usize,
}

/// The snapshot once the work enqueued on `streams` is done (freeing is stream-ordered: what a
/// free lets go of goes only then).
fn snapshot(streams: [&Stream; 2]) -> Snapshot {
    for stream in streams {
        stream.synchronize().expect("the stream synchronizes");
    }
    Snapshot { live: cuda_sim::testing::live_objects(driver()).expect("the simulator counts"), fds: open_fds() }
}

/// Device 0 (its context current) and two streams on it; two devices, so that a pinned pool is
/// granted to more than one.
fn setup() -> (Device, Stream, Stream) {
    driver();
    let device = Device::new(0).expect("device 0 exists");
    Device::new(1).expect("device 1 exists").set_current().expect("device 1's context is current");
    device.set_current().expect("device 0's context is current");
    let stream = || Stream::new(device, StreamOptions::default().non_blocking()).expect("a stream");
    (device, stream(), stream())
}

/// An IPC-enabled pool resource of `kind`.
fn resource(kind: Kind, device: Device) -> Result<Arc<dyn MemoryResource>> {
    Ok(match kind {
        Kind::DevicePool => {
            DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?
        }
        Kind::PinnedPool => PinnedMemoryResource::new(
            PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node()?),
        )?,
    })
}

/// Receives the next message, which must be buffers (the scenario sends nothing else then).
fn expect_buffers(channel: &IpcChannel, stream: &Stream) -> Result<Vec<cuda_mem_core::Buffer>> {
    match channel.recv(stream)? {
        Received::Buffers(buffers) => Ok(buffers),
        other => panic!("expected buffers, got {other:?}"),
    }
}

/// Waits for the work on both streams when dropped. cuda.h: "The imported memory must be freed
/// from all importing processes before being freed in the exporting process", and the imports'
/// frees are on either stream, unordered with the exporter's: this orders them (a failure of the
/// wait itself is one of the failures injected, and then they may run out of order).
struct ImportersFreeFirst<'a>([&'a Stream; 2]);

impl Drop for ImportersFreeFirst<'_> {
    fn drop(&mut self) {
        for stream in self.0 {
            let _ = stream.synchronize();
        }
    }
}

/// Makes a pool of `kind` and a buffer of it, sends it over a channel pair and receives it along
/// `path`, stopping at the first error; what was made is then dropped, which releases it.
fn scenario(kind: Kind, path: Path, device: Device, own: &Stream, other: &Stream) {
    let run = || -> Result<()> {
        let (a, b) = Channel::pair()?;
        let (sender, receiver) = (IpcChannel::new(a), IpcChannel::new(b));
        let resource = resource(kind, device)?;
        let mut buffer = resource.allocate(SIZE, own)?;
        // Dropped after the imports below and before `buffer`, however `run` ends.
        let _importers_first = ImportersFreeFirst([own, other]);
        buffer.fill(FillPattern::U8(1), own)?;
        sender.send_buffers(&[&buffer])?;
        // The receiver may drop the pool at once: the channel keeps it.
        match receiver.recv(own)? {
            Received::Resource(_) => {}
            other => panic!("expected the pool, got {other:?}"),
        }
        match path {
            Path::OneBuffer => {
                let mut received = expect_buffers(&receiver, own)?;
                // The same memory as `buffer`: its second writer waits for the first.
                other.wait(&own.record_event()?)?;
                received[0].fill(FillPattern::U8(2), other)?;
                drop(received);
                receiver.release_resources();
            }
            Path::SharedTwice => {
                sender.send_buffers(&[&buffer])?;
                let mut first = expect_buffers(&receiver, own)?;
                let mut second = expect_buffers(&receiver, other)?;
                first[0].fill(FillPattern::U8(2), own)?;
                // Both imports are `buffer`'s memory: the second writer waits for the first.
                other.wait(&own.record_event()?)?;
                second[0].fill(FillPattern::U8(3), other)?;
                drop(receiver);
                drop(first);
                drop(second);
            }
        }
        Ok(())
    };
    let _ = run();
}

/// The granularity of every simulated device.
#[cfg(feature = "vmm")]
const G: usize = 2 << 20;

/// A virtual buffer of two chunks sent over a channel pair and received with the resource
/// registered for its device, used on another stream, dropped; then both ends.
#[cfg(feature = "vmm")]
fn virtual_buffer_scenario(device: Device, own: &Stream, other: &Stream) {
    use cuda_mem_vmm::VirtualMemoryResource;
    let run = || -> Result<()> {
        let (a, b) = Channel::pair()?;
        let (sender, receiver) = (IpcChannel::new(a), IpcChannel::new(b));
        let exporter = VirtualMemoryResource::new(device, Default::default())?;
        receiver.import_virtual_buffers_into(VirtualMemoryResource::new(device, Default::default())?);
        let buffer = exporter.allocate(G, own)?.grow(2 * G)?;
        sender.send_virtual_buffer(&buffer)?;
        match receiver.recv(own)? {
            Received::VirtualBuffer(mut received) => received.fill(FillPattern::U8(2), other)?,
            other => panic!("expected a virtual buffer, got {other:?}"),
        }
        Ok(())
    };
    let _ = run();
}

/// Checks what `injection` left behind, from `before` to now, and the errors recorded meanwhile.
fn check_case(case: &str, injection: Injection, before: Snapshot, after: Snapshot) {
    let errors = take_drop_errors();
    if injection.is_releasing() {
        assert!(
            errors.iter().any(|e| e.error.cuda_code() == Some(OOM)),
            "{case}: the refused release was not recorded: {errors:?}"
        );
        // Only what the driver refused to let go of may stay: a pool or a physical allocation
        // it kept keeps the simulator's descriptors of its memory (a pool two: its file, and the
        // description it records its holds on), no other stays open.
        let kept = 2 * after.live.pools.saturating_sub(before.live.pools)
            + after.live.physical_allocations.saturating_sub(before.live.physical_allocations);
        assert!(
            after.fds <= before.fds + kept as usize,
            "{case}: a file descriptor was left open ({before:?} -> {after:?}, {errors:?})"
        );
    } else {
        assert_eq!(after, before, "{case}: something was left behind ({errors:?})");
        // A pool whose peer access could not be revoked is still destroyed; a virtual buffer
        // whose stream's capture status could not be read has no safe order to be released in,
        // so it is deferred (to the resource's drop here). Only those may be recorded.
        let allowed = |what: &str| {
            what == "MemoryPool (revoking peer access)"
                || (injection.function == "cuStreamIsCapturing" && what == "virtual memory (release deferred)")
        };
        assert!(errors.iter().all(|e| allowed(e.what)), "{case}: a release was given up: {errors:?}");
    }
}

/// Runs `scenario` once (what is retained once per process is retained), then counts its calls.
fn counted(scenario: &dyn Fn()) -> CallCounts {
    scenario();
    let ((), calls) = count_calls(driver(), scenario).expect("the simulator counts");
    let errors = take_drop_errors();
    assert!(errors.is_empty(), "without failures: {errors:?}");
    calls
}

#[test]
fn a_failure_at_any_driver_call_of_sharing_leaves_nothing_behind() {
    in_simulated_machine(
        "a_failure_at_any_driver_call_of_sharing_leaves_nothing_behind",
        &[("CUDA_SIM_DEVICES", "2")],
        || {
            if !simulator_only("fault injection and live-object counts") {
                return;
            }
            let (device, own, other) = setup();
            let mut injected = 0;
            let mut matrix = |name: &str, scenario: &dyn Fn(), calls_expected: &[&str]| {
                let calls = counted(scenario);
                // The counts are those of the steps named above: the checks below are not empty.
                for function in calls_expected {
                    assert!(calls.of(function) >= 1, "{name} calls {function}: {calls:?}");
                }
                for injection in calls.injections() {
                    let before = snapshot([&own, &other]);
                    let ((), fired) = run_failing(driver(), injection, scenario).expect("the simulator injects");
                    let case = format!("{name}, {injection}");
                    assert!(fired, "{case}: the scenario did not make that call");
                    check_case(&case, injection, before, snapshot([&own, &other]));
                    injected += 1;
                }
            };
            for kind in KINDS {
                for path in PATHS {
                    let mut expected = vec![
                        "cuMemPoolExportToShareableHandle",
                        "cuMemPoolExportPointer",
                        "cuMemPoolImportFromShareableHandle",
                        "cuMemPoolGetAccess",
                        "cuMemPoolImportPointer",
                        "cuPointerGetAttribute",
                        "cuMemPoolDestroy",
                    ];
                    if matches!(kind, Kind::PinnedPool) {
                        // Granted to the devices.
                        expected.push("cuMemPoolSetAccess");
                    }
                    if matches!(path, Path::SharedTwice) {
                        // The last release waits for the first one's stream.
                        expected.push("cuStreamWaitEvent");
                    }
                    let name = format!("{kind:?} {path:?}");
                    matrix(&name, &|| scenario(kind, path, device, &own, &other), &expected);
                }
            }
            #[cfg(feature = "vmm")]
            matrix(
                "a virtual buffer",
                &|| virtual_buffer_scenario(device, &own, &other),
                &["cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemMap", "cuMemUnmap"],
            );
            assert!(injected > 100, "only {injected} failures were injected");
        },
    );
}

/// The receiving side of one round in the child: the pool, the buffer (used on another
/// stream), the end of the round; then the channel lets go of the pool.
fn receive_round(channel: &IpcChannel, own: &Stream, other: &Stream) {
    let mut kept = Vec::new();
    loop {
        match channel.recv(own) {
            Ok(Received::Data(end)) => {
                assert_eq!(end, b"end");
                break;
            }
            Ok(Received::Buffers(mut buffers)) => {
                let _ = buffers[0].fill(FillPattern::U8(2), other);
                kept.push(buffers);
            }
            Ok(_) => {}
            Err(error @ (IpcError::PeerClosed | IpcError::Io { .. } | IpcError::Protocol(_))) => {
                panic!("the channel broke: {error}")
            }
            // An injected failure: the message was refused, and the channel stays in step.
            Err(_) => {}
        }
    }
    drop(kept);
    channel.release_resources();
}

/// The child: counts the calls of receiving a round, then asks for one more round per call
/// and fails that call in it, checking each time that nothing is left.
fn child() {
    let (_, own, other) = setup();
    // SAFETY: started by `spawn_with_channel` from this test binary, and nothing else in this
    // process adopts inherited descriptors.
    let channel = IpcChannel::new(unsafe { Channel::from_env() }.expect("the parent's channel"));
    let round = |what: &[u8]| {
        channel.send_data(what).expect("the parent listens");
        receive_round(&channel, &own, &other);
    };
    let calls = counted(&|| round(b"round"));
    assert!(calls.of("cuMemPoolImportFromShareableHandle") == 1 && calls.of("cuMemPoolImportPointer") == 1);
    let mut injected = 0;
    for injection in calls.injections() {
        let before = snapshot([&own, &other]);
        let ((), fired) = run_failing(driver(), injection, || round(b"round")).expect("the simulator injects");
        let case = format!("the receiving side in a child, {injection}");
        assert!(fired, "{case}: the round did not make that call");
        check_case(&case, injection, before, snapshot([&own, &other]));
        injected += 1;
    }
    channel.send_data(format!("done {injected}").as_bytes()).expect("the parent listens");
}

#[test]
fn the_receiving_side_in_another_process_leaves_nothing_behind() {
    if std::env::var_os(ROLE).is_some() {
        return child();
    }
    in_simulated_machine(
        "the_receiving_side_in_another_process_leaves_nothing_behind",
        &[("CUDA_SIM_DEVICES", "2")],
        || {
            if !simulator_only("fault injection and live-object counts") {
                return;
            }
            let (device, own, _) = setup();
            let pool = resource(Kind::DevicePool, device).unwrap();
            let mut buffer = pool.allocate(SIZE, &own).unwrap();
            buffer.fill(FillPattern::U8(1), &own).unwrap();
            own.synchronize().unwrap();
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", "the_receiving_side_in_another_process_leaves_nothing_behind", "--nocapture"])
                .env(ROLE, "receiver")
                .env_remove(cuda_sim::testing::CHILD_ENV)
                .stdout(Stdio::null());
            let (mut child, channel) = spawn_with_channel(&mut command).unwrap();
            let channel = IpcChannel::new(channel);
            // Each round: the pool (sent again, as the child let go of it), the buffer, the end.
            let rounds = loop {
                let reply = match channel.recv(&own) {
                    Ok(Received::Data(reply)) => reply,
                    other => panic!("the child failed: {other:?}"),
                };
                if let Some(count) = reply.strip_prefix(b"done ") {
                    break String::from_utf8_lossy(count).parse::<usize>().unwrap();
                }
                channel.send_resource(pool.as_ref()).unwrap();
                channel.send_buffers(&[&buffer]).unwrap();
                channel.send_data(b"end").unwrap();
            };
            assert!(child.wait().unwrap().success(), "the child's checks failed (its stderr says which)");
            assert!(rounds > 20, "only {rounds} failures were injected in the child");
        },
    );
}
