//! Shared helpers of the multi-process IPC tests.
//!
//! A test that needs another process re-runs its own test binary for just itself
//! (`<exe> --exact <test> --nocapture --test-threads=1`), started by
//! [`cuda_mem_ipc::spawn_with_channel`] (spawn and exec, never a bare fork) with [`ROLE_ENV`]
//! naming the part the child plays. The test function checks [`role`] first: in a child it runs
//! the child's side and returns. Each side bounds its waits (channel read time-outs, a wait for
//! the child that kills it when it runs too long), so a hang fails the test instead of hanging
//! CI.
//!
//! On the simulator by default; with `CUDA_MEM_DRIVER` set (a GPU machine), on that driver, in
//! the parent and in every child, which inherit the environment.

#![allow(dead_code)]

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, ForeignMemory, LegacyPinnedMemoryResource,
    PinnedMemoryResource, PinnedMemoryResourceOptions, Stream, StreamOptions,
};
use cuda_mem_ipc::{CHANNEL_FD_ENV, CHANNEL_INODE_ENV, Channel, IpcChannel, MappedMemoryResource, Received};

pub mod python;

/// The environment variable that names the role of a child process.
pub const ROLE_ENV: &str = "CUDA_MEM_TESTS_ROLE";

/// How long any one receive waits before the test fails.
pub const RECV_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a child may run.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// The role of this process, when it is a child started by [`spawn_role`].
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Installs the test driver (the simulator unless `CUDA_MEM_DRIVER` is set) and returns device
/// 0, current on this thread, with a new non-blocking stream.
pub fn setup() -> (Device, Stream) {
    cuda_sim::testing::driver().expect("the test driver loads");
    let device = Device::new(0).expect("device 0 exists");
    device.set_current().expect("device 0's context can be made current");
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).expect("a stream can be created");
    (device, stream)
}

/// A new IPC-enabled device pool on `device`.
pub fn device_pool(device: Device) -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))
        .expect("an IPC-enabled device pool")
}

/// A new IPC-enabled pinned pool, on the host NUMA node nearest `device` (what IPC needs).
pub fn pinned_pool(device: Device) -> Arc<PinnedMemoryResource> {
    PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .expect("an IPC-enabled pinned pool near device 0")
}

/// A child process of this test binary, killed if dropped while it runs.
pub struct ChildProcess {
    child: std::process::Child,
    label: String,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// What a finished child left.
#[derive(Debug)]
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output (the test harness's report).
    pub stdout: String,
    /// Its standard error (a failing assertion's message).
    pub stderr: String,
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Starts this test binary again for the test `test` only, as `role`, with `env` added to its
/// environment and a channel to it. The channel's receives time out after [`RECV_TIMEOUT`].
pub fn spawn_role(test: &str, role: &str, env: &[(&str, &str)]) -> (ChildProcess, IpcChannel) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        // A child of a child must not see its parent's channel variables (spawn_with_channel
        // sets its own; removing them first keeps a failed spawn from pointing at a stale fd).
        .env_remove(CHANNEL_FD_ENV)
        .env_remove(CHANNEL_INODE_ENV)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, channel) = cuda_mem_ipc::spawn_with_channel(&mut command).expect("the child starts");
    channel.set_read_timeout(Some(RECV_TIMEOUT)).expect("a read time-out");
    channel.set_write_timeout(Some(RECV_TIMEOUT)).expect("a write time-out");
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let label = format!("child {role:?} of {test}");
    (ChildProcess { child, label, stdout, stderr }, IpcChannel::new(channel))
}

impl ChildProcess {
    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child to exit, at most `timeout`: past that, kills it and panics.
    pub fn wait_timeout(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait().expect("waiting for the child") {
                Some(status) => break status,
                None if Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    let output = self.collect();
                    panic!("{} ran past {timeout:?} and was killed\n{}\n{}", self.label, output.0, output.1);
                }
                None => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        let (stdout, stderr) = self.collect();
        Finished { status, stdout, stderr }
    }

    /// Waits (at most [`CHILD_TIMEOUT`]) and asserts that the child's test passed.
    pub fn wait_success(self) -> Finished {
        let label = self.label.clone();
        let finished = self.wait_timeout(CHILD_TIMEOUT);
        assert!(
            finished.status.success() && finished.stdout.contains("1 passed"),
            "{label} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            finished.status,
            finished.stdout,
            finished.stderr
        );
        finished
    }

    fn collect(&mut self) -> (String, String) {
        let join = |h: Option<JoinHandle<String>>| h.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        (join(self.stdout.take()), join(self.stderr.take()))
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // Not waited for: the test failed. Do not leave the child behind, and show what it said
        // (the test harness prints this with the failure).
        if self.stdout.is_none() && self.stderr.is_none() {
            return;
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let status = self.child.wait();
        let (stdout, stderr) = self.collect();
        eprintln!("{} ({status:?}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", self.label);
    }
}

/// In a child: the channel its parent passed, with receive time-outs.
pub fn parent_channel() -> IpcChannel {
    // SAFETY: this child was started by its parent test through `spawn_with_channel`, and
    // nothing in the test binaries but this call adopts inherited descriptors.
    let channel = unsafe { Channel::from_env() }.expect("this child was given a channel");
    channel.set_read_timeout(Some(RECV_TIMEOUT)).expect("a read time-out");
    channel.set_write_timeout(Some(RECV_TIMEOUT)).expect("a write time-out");
    IpcChannel::new(channel)
}

/// Holds `stream`'s later work at a new gate until the test opens it; the guard opens it when
/// it drops, so a test that fails first does not leave the stream held.
pub fn hold(stream: &Stream) -> (&'static cuda_sim::testing::Gate, cuda_sim::testing::OpenOnDrop) {
    let (gate, guard) = cuda_sim::testing::Gate::new();
    let driver = cuda_sim::testing::driver().expect("the test driver loads");
    // SAFETY: the tests pass only live streams of their own, on the thread that made them.
    unsafe { gate.hold(driver, stream.handle()) }.expect("a host function can be enqueued");
    (gate, guard)
}

/// Receives a resource, failing the test on anything else.
pub fn expect_resource(channel: &IpcChannel, stream: &Stream) -> Arc<MappedMemoryResource> {
    match channel.recv(stream) {
        Ok(Received::Resource(resource)) => resource,
        other => panic!("expected a resource, got {other:?}"),
    }
}

/// Receives buffers, failing the test on anything else.
pub fn expect_buffers(channel: &IpcChannel, stream: &Stream) -> Vec<Buffer> {
    match channel.recv(stream) {
        Ok(Received::Buffers(buffers)) => buffers,
        other => panic!("expected buffers, got {other:?}"),
    }
}

/// Receives bytes, failing the test on anything else.
pub fn expect_data(channel: &IpcChannel, stream: &Stream) -> Vec<u8> {
    match channel.recv(stream) {
        Ok(Received::Data(bytes)) => bytes,
        other => panic!("expected data, got {other:?}"),
    }
}

/// Receives bytes and checks they are `expected`.
pub fn expect_text(channel: &IpcChannel, stream: &Stream, expected: &str) {
    let bytes = expect_data(channel, stream);
    assert_eq!(String::from_utf8_lossy(&bytes), expected);
}

/// `len` bytes that differ for each `seed` and do not repeat with any short period.
pub fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u32).wrapping_add(seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(0x85EB_CA6B);
            (x >> 24) as u8 ^ (i >> 8) as u8
        })
        .collect()
}

/// FNV-1a of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn staging(stream: &Stream, len: usize) -> Buffer {
    LegacyPinnedMemoryResource::new(stream.device()).allocate(len, stream).expect("a pinned staging buffer")
}

/// Writes `bytes` into `buffer` (device or host memory) on `stream`, and waits for it.
pub fn write_bytes(buffer: &mut Buffer, bytes: &[u8], stream: &Stream) {
    assert_eq!(buffer.size(), bytes.len(), "write_bytes: sizes");
    let mut stage = staging(stream, bytes.len());
    stage.host_slice_mut().expect("staging is host memory").copy_from_slice(bytes);
    buffer.copy_from(&stage, stream).expect("a copy into the buffer");
    stream.synchronize().expect("the copy completes");
}

/// The bytes of `buffer` (device or host memory), copied out on `stream`.
pub fn read_bytes(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let mut stage = staging(stream, buffer.size());
    stage.copy_from(buffer, stream).expect("a copy out of the buffer");
    stage.host_slice().expect("staging is host memory").to_vec()
}

/// A view of `len` bytes of `buffer` at `offset` (which the caller keeps alive and does not
/// free while the view is used).
pub fn view(buffer: &Buffer, offset: usize, len: usize) -> Buffer {
    assert!(offset + len <= buffer.size(), "view out of range");
    // SAFETY: the range lies inside `buffer`'s allocation (checked above); the callers use the
    // view only while `buffer` (which keeps the memory mapped) lives, and never take host slices
    // of it.
    unsafe {
        Buffer::from_raw(
            buffer.ptr() + offset as u64,
            len,
            ForeignMemory::default()
                .device(buffer.device())
                .device_accessible(buffer.is_device_accessible())
                .host_accessible(buffer.is_host_accessible()),
        )
    }
}

/// Little-endian `u64`s, for replies.
pub fn encode_u64s(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The `u64`s [`encode_u64s`] wrote.
pub fn decode_u64s(bytes: &[u8]) -> Vec<u64> {
    assert_eq!(bytes.len() % 8, 0, "a whole number of u64s");
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// The name of the enclosing test function as the test harness knows it (its path without the
/// crate's name), for [`spawn_role`].
#[allow(unused_macros)]
macro_rules! test_name {
    () => {{
        fn f() {}
        let name = std::any::type_name_of_val(&f);
        let mut name = name.strip_suffix("::f").expect("a function path");
        // Used in a closure, the path ends with the closure's.
        while let Some(outer) = name.strip_suffix("::{{closure}}") {
            name = outer;
        }
        name.split_once("::").map_or(name, |(_crate, path)| path)
    }};
}
