//! A memory snapshot of this process, read by `python/cuda_mem_exchange.py`'s `read_snapshot`:
//! the Rust side takes a snapshot of a caching resource and a pool on the simulator and writes
//! its JSON; plain Python (no cuda.core) reads it back, checks its figures against the ones the
//! Rust side printed, prints its table, and refuses a newer schema.
//!
//! It needs only a Python 3 (`python3` on the `PATH`); without one it says SKIP on stderr and
//! passes without running.

mod common;

use std::io::Write;
use std::process::Command;

use common::python::workspace;
use cuda_mem_core::history::ResourceId;
use cuda_mem_core::snapshot::take_snapshot;
use cuda_mem_core::{CachingOptions, CachingResource, Device, DeviceMemoryResource, Stream, StreamOptions};

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
