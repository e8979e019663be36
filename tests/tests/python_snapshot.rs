//! A memory snapshot of this process, read by `python/cuda_mem_exchange.py`'s `read_snapshot`:
//! the Rust side takes a snapshot of a caching resource and a pool on the simulator and writes
//! its JSON; plain Python (no cuda.core) reads it back, checks its figures against the ones the
//! Rust side printed, prints its table, and refuses a newer schema.
//!
//! And Python asks a Rust process for its snapshot over the channel (`request_snapshot`), which
//! this side answers (`answer_snapshot_request`).
//!
//! It needs only a Python 3 (`python3` on the `PATH`); without one it says SKIP on stderr and
//! passes without running.

mod common;

use std::io::Write;
use std::process::Command;

use common::python::{PythonProcess, workspace};
use cuda_mem_core::history::{self, HistoryOptions, ResourceId};
use cuda_mem_core::snapshot::take_snapshot;
use cuda_mem_core::{CachingOptions, CachingResource, Device, DeviceMemoryResource, Stream, StreamOptions};
use cuda_mem_ipc::{IpcChannel, Received};

#[test]
fn python_reads_a_memory_snapshot_rust_wrote() {
    cuda_sim::testing::driver().unwrap();
    let device = Device::new(0).unwrap();
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let cache =
        CachingResource::new(DeviceMemoryResource::new(device, Default::default()).unwrap(), CachingOptions::default())
            .unwrap();
    let kept = cache.allocate(64 << 10, &stream).unwrap();
    let snapshot = take_snapshot();
    let ours = snapshot.resource(ResourceId::of(&*cache)).unwrap();
    // A name of this process's own (removed at the end).
    let path = std::env::temp_dir().join(format!("cuda-mem-snapshot-{}.json", std::process::id()));
    snapshot.write_json(&path).unwrap();
    let script = format!(
        "import sys\n\
         sys.path.insert(0, {module:?})\n\
         import cuda_mem_exchange as cx\n\
         s = cx.read_snapshot({path:?})\n\
         r = [r for r in s['resources'] if r['id'] == {id}][0]\n\
         assert (r['kind'], r['reserved_bytes'], r['used_bytes']) == ('caching', {reserved}, {used}), r\n\
         assert r['segments'][0]['blocks'][0]['address'] == {block}, r\n\
         print(cx.snapshot_summary(s))\n\
         try:\n    cx.read_snapshot(open({path:?}).read().replace('\"version\":1', '\"version\":2', 1))\n\
         except cx.SnapshotError as e:\n    print('refused:', e)\n",
        module = workspace().join("python").display().to_string(),
        path = path.display().to_string(),
        id = ours.id,
        reserved = ours.reserved_bytes,
        used = ours.used_bytes,
        block = kept.ptr(),
    );
    let ran = Command::new("python3").arg("-c").arg(&script).output();
    let _ = std::fs::remove_file(&path);
    let output = match ran {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let _ = std::io::stderr().write_all(format!("SKIP {test}: no python3 on the PATH\n").as_bytes());
            return;
        }
        Err(e) => panic!("starting python3: {e}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("{:#x}", ours.id)) && stdout.contains("caching"), "{stdout}");
    assert!(stdout.contains("refused: memory snapshot schema 2 is newer than 1"), "{stdout}");
    drop((kept, cache));
}

/// Python asks this (Rust) process for its memory snapshot over the channel: plain Python (no
/// cuda.core) sends `request_snapshot(max_events=10)`, this side answers with
/// `answer_snapshot_request`, and the Python side checks the figures and the events it got
/// against this side's, prints the table, and says so.
#[test]
fn python_asks_a_rust_process_for_its_snapshot_over_the_channel() {
    if let Err(e) = Command::new("python3").arg("--version").output() {
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "starting python3: {e}");
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = std::io::stderr().write_all(format!("SKIP {test}: no python3 on the PATH\n").as_bytes());
        return;
    }
    cuda_sim::testing::driver().unwrap();
    let _serial = history::tests_serial();
    let device = Device::new(0).unwrap();
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let cache =
        CachingResource::new(DeviceMemoryResource::new(device, Default::default()).unwrap(), CachingOptions::default())
            .unwrap();
    history::start_recording(HistoryOptions::default());
    let mut kept = Vec::new();
    for i in 0..40 {
        let buffer = cache.allocate(4096 * (1 + i % 3), &stream).unwrap();
        if i % 4 == 0 {
            kept.push(buffer);
        }
    }
    history::stop_recording();
    let before = take_snapshot();
    let ours = before.resource(ResourceId::of(&*cache)).unwrap();
    let script = format!(
        "import sys\n\
         sys.path.insert(0, {module:?})\n\
         import cuda_mem_exchange as cx\n\
         ch = cx.IpcChannel(cx.Channel.from_env())\n\
         ch.channel.settimeout(60)\n\
         ch.request_snapshot(max_events=10)\n\
         got = ch.recv(None)\n\
         assert isinstance(got, cx.Snapshot), got\n\
         s = got.snapshot\n\
         r = [r for r in s['resources'] if r['id'] == {id}][0]\n\
         assert (r['kind'], r['used_bytes'], r['live_allocations']) == ('caching', {used}, {live}), r\n\
         assert len(s['events']) == 10, len(s['events'])\n\
         assert s['dropped_events'] == {dropped} + {events} - 10, s['dropped_events']\n\
         assert s['events'][-1]['address'] == {last}, s['events'][-1]\n\
         print(cx.snapshot_summary(s))\n\
         ch.send_data(b'checked')\n\
         print('snapshot over the channel: ok')\n",
        module = workspace().join("python").display().to_string(),
        id = ours.id,
        used = ours.used_bytes,
        live = ours.live_allocations,
        dropped = before.dropped_events,
        events = before.events.len(),
        last = before.events.last().map_or(0, |event| event.address),
    );
    let mut command = Command::new("python3");
    command.arg("-c").arg(&script).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let (child, channel) = cuda_mem_ipc::spawn_with_channel(&mut command).unwrap();
    let child = PythonProcess::new(child);
    channel.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let channel = IpcChannel::new(channel);
    let Received::SnapshotRequest(request) = channel.recv(&stream).unwrap() else { panic!("a snapshot request") };
    assert_eq!(request.max_events, Some(10));
    channel.answer_snapshot_request(&request).unwrap();
    let Received::Data(reply) = channel.recv(&stream).unwrap() else { panic!("the Python side's reply") };
    assert_eq!(reply, b"checked");
    child.wait("snapshot over the channel: ok");
    drop((kept, cache));
}
