//! Sharing with Python processes that use cuda.core: a Rust process and a Python process share
//! pools and buffers both ways, through `python/cuda_mem_exchange.py` on the Python side
//! (cuda.core as published, unchanged) and cuda-mem-ipc on ours.
//!
//! - Rust parent, Python child (`tests/python/exchange_child.py`): a device and a pinned pool's
//!   buffers, written here, are checked and rewritten there, and the new bytes are seen here.
//! - Python parent (`tests/python/exchange_parent.py`), Rust child (this test binary, re-run for
//!   one test with a role): the same, the other way.
//! - Events: a buffer goes to the Python child behind an interprocess event recorded after a
//!   fill held pending here, and the child's copy on its receiving stream sees the fill; the
//!   child hands its own write back with a cuda.core IPC event, which this side's stream waits
//!   for.
//! - Mismatches: a message of an unknown kind, a pool of an unknown memory kind, a buffer
//!   descriptor of another version and a frame of another version are refused on each side with
//!   an error naming what was expected and what came; both processes go on (the round trip runs
//!   after the refusals) and exit cleanly. The Python side also refuses, with the module's own
//!   errors, a buffer claimed larger than its allocation (cuda.core's `ValueError`) and a pool
//!   whose earlier import it closed (cuda.core's `RuntimeError` from its registry).
//!
//! The Python side needs a Python with cuda.core, named by `CUDA_MEM_PYTHON`: `cargo xtask ci`
//! sets it (its step "cuda.core exchange on the simulator" installs cuda.core into a private
//! virtual environment and runs this file). Without it these tests say SKIP on stderr and pass
//! without running: the CI step, which runs them with it set, is where they count. On the
//! simulator, the Python process loads the same simulator as this one (a `libcuda.so.1` link
//! to it, first in `LD_LIBRARY_PATH`) with the same settings, so both simulate one machine.

#[macro_use]
mod common;

use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::python::{PythonProcess, python, workspace};
use common::*;
use cuda_mem_core::{Buffer, Event, EventOptions, MemoryResource, PoolKind, Stream};
use cuda_mem_ipc::wire::{BufferDescriptorError, EnvelopeError, FrameError, MessageError};
use cuda_mem_ipc::{
    CHANNEL_FD_ENV, CHANNEL_INODE_ENV, IpcChannel, IpcError, ProtocolError, Received, allocation_handle,
    buffer_descriptor,
};

/// `python script mode`, with the simulator this process uses as its `libcuda.so.1` (on a real
/// driver, the system's).
fn python_command(python: &Path, script: &str, mode: &str) -> Command {
    let mut command = Command::new(python);
    command
        .arg(workspace().join("tests/python").join(script))
        .arg(mode)
        .env_remove(CHANNEL_FD_ENV)
        .env_remove(CHANNEL_INODE_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    common::python::use_this_simulator(&mut command);
    command
}

const DEVICE_SIZES: [usize; 3] = [1 << 16, 1000, 1];
const PINNED_SIZE: usize = 4096;

/// Buffers of a device and a pinned pool, buffer i holding `pattern(1 + i)`, and their seeds.
fn written_buffers(stream: &Stream) -> (Vec<Arc<dyn MemoryResource>>, Vec<Buffer>, Vec<u32>) {
    let device = device_pool(stream.device());
    let pinned = pinned_pool(stream.device());
    let mut buffers: Vec<Buffer> = DEVICE_SIZES.iter().map(|&n| device.allocate(n, stream).unwrap()).collect();
    buffers.push(pinned.allocate(PINNED_SIZE, stream).unwrap());
    let seeds: Vec<u32> = (1..=buffers.len() as u32).collect();
    for (buffer, &seed) in buffers.iter_mut().zip(&seeds) {
        write_bytes(buffer, &pattern(seed, buffer.size()), stream);
    }
    (vec![device, pinned], buffers, seeds)
}

fn seeds_bytes(seeds: &[u32]) -> Vec<u8> {
    seeds.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// Sends the seeds and the buffers (each pool first), and checks the child's rewrite.
fn round_trip_to_child(channel: &IpcChannel, buffers: &[Buffer], seeds: &[u32], stream: &Stream) {
    channel.send_data(&seeds_bytes(seeds)).unwrap();
    channel.send_buffers(&buffers.iter().collect::<Vec<_>>()).unwrap();
    expect_text(channel, stream, "rewritten");
    for (i, (buffer, &seed)) in buffers.iter().zip(seeds).enumerate() {
        assert_eq!(
            read_bytes(buffer, stream),
            pattern(seed + 100, buffer.size()),
            "buffer {i}: the Python child's bytes"
        );
    }
}

/// Starts the Python child with a channel to it.
fn spawn_python_child(python: &Path, mode: &str) -> (PythonProcess, IpcChannel) {
    let mut command = python_command(python, "exchange_child.py", mode);
    let (child, channel) = cuda_mem_ipc::spawn_with_channel(&mut command).expect("the Python child starts");
    channel.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    channel.set_write_timeout(Some(RECV_TIMEOUT)).unwrap();
    (PythonProcess::new(child), IpcChannel::new(channel))
}

#[test]
fn rust_parent_python_child_round_trip() {
    let Some(python) = python() else { return };
    let (_, stream) = setup();
    let (_pools, buffers, seeds) = written_buffers(&stream);
    let (child, channel) = spawn_python_child(&python, "roundtrip");
    round_trip_to_child(&channel, &buffers, &seeds, &stream);
    child.wait("python-child: ok roundtrip");
}

#[test]
fn rust_parent_python_child_mismatches() {
    let Some(python) = python() else { return };
    let (_, stream) = setup();
    let (pools, buffers, seeds) = written_buffers(&stream);
    let (child, channel) = spawn_python_child(&python, "mismatch");

    // A kind the Python side does not know.
    channel.channel().send(77, b"an unknown kind", &[]).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    assert!(
        answer.contains(
            "expected 1 (resource), 2 (buffers), 3 (data), 5 (event), 6 (buffers-after-event), 7 (snapshot request), 8 \
             (snapshot) or 9 (returned buffers), received 77"
        ),
        "{answer}"
    );

    // A pool described as memory kind 7, with its real descriptor.
    let handle = allocation_handle(&*pools[0]).unwrap();
    let mut payload = [0u8; 40];
    payload[..16].copy_from_slice(handle.uuid().as_bytes());
    payload[16] = 7;
    channel.channel().send(1, &payload, &[handle.fd()]).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    assert!(answer.contains("memory kind: expected 0 (device) or 1 (pinned), received 7"), "{answer}");

    // The device pool described as pinned memory: the Python side asks the driver what the
    // imported pool holds, as this side does, and refuses it in the same words.
    let mut payload = [0u8; 40];
    payload[..16].copy_from_slice(handle.uuid().as_bytes());
    payload[16] = 1;
    payload[17..21].copy_from_slice(&(-1i32).to_le_bytes());
    channel.channel().send(1, &payload, &[handle.fd()]).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    let rust = IpcError::MisdescribedResource {
        uuid: handle.uuid(),
        claimed: PoolKind::Pinned,
        actual: PoolKind::Device(stream.device()),
    };
    assert_eq!(answer, rust.to_string(), "both languages word it the same");
    // A descriptor that is no pool: the driver's refusal, as the peer's error.
    let null = std::fs::File::open("/dev/null").unwrap();
    payload[16] = 0;
    payload[17..21].copy_from_slice(&(stream.device().ordinal() as i32).to_le_bytes());
    payload[24..].copy_from_slice(&stream.device().uuid().unwrap());
    channel.channel().send(1, &payload, &[null.as_fd()]).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    // A GPU's code for it is the probe's open question 25; the simulator's, INVALID_VALUE.
    if cuda_sim::testing::on_simulator() {
        assert!(answer.contains(&format!("the peer's pool {} could not be imported", handle.uuid())), "{answer}");
        assert!(answer.ends_with("the channel is still usable"), "{answer}");
    }

    // Both processes and the channel go on.
    round_trip_to_child(&channel, &buffers, &seeds, &stream);

    // A buffer of the device pool claimed far larger than its allocation: cuda.core's own
    // refusal, as the module's ProtocolError.
    let mut descriptor = buffer_descriptor(&buffers[1]).unwrap();
    descriptor.size = 1 << 40;
    let mut payload = 1u32.to_le_bytes().to_vec();
    payload.extend_from_slice(&descriptor.encode());
    channel.channel().send(2, &payload, &[]).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    assert!(answer.contains("received 1099511627776 bytes (the peer sent a bad size; cuda.core: "), "{answer}");

    // The device pool again, after the child closed its import of it: cuda.core's registry
    // keeps the closed import, and the module says so.
    channel.send_resource(&*pools[0]).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    assert!(answer.contains("was imported in this process before and that import has been closed"), "{answer}");

    // A frame of another version: the channel's header, version 2.
    let mut frame = Vec::from(*b"CUMEMMSG");
    frame.extend_from_slice(&2u16.to_le_bytes());
    frame.extend_from_slice(&3u16.to_le_bytes());
    frame.extend_from_slice(&[0; 12]);
    rustix::io::write(channel.channel(), &frame).unwrap();
    let answer = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    assert!(answer.contains("frame version: expected 1, received 2"), "{answer}");
    child.wait("python-child: ok mismatch");
}

#[test]
fn rust_parent_python_child_events() {
    let Some(python) = python() else { return };
    let (device, stream) = setup();
    let pool = device_pool(device);
    let mut buffer = pool.allocate(4096, &stream).unwrap();
    write_bytes(&mut buffer, &[1; 4096], &stream);
    let (child, channel) = spawn_python_child(&python, "events");
    // The fill is held pending until the child has enqueued its copy: only a stream that waits
    // for the event sees it.
    let (gate, _opens) = hold(&stream);
    buffer.fill(cuda_mem_core::FillPattern::U8(7), &stream).unwrap();
    let filled = Event::new(device, EventOptions::default().interprocess()).unwrap();
    filled.record(&stream).unwrap();
    channel.send_buffers_after(&filled, &[&buffer]).unwrap();
    expect_text(&channel, &stream, "enqueued");
    // Time for a copy that did not wait to run before the fill (it would read the 1s).
    std::thread::sleep(std::time::Duration::from_millis(20));
    gate.open();
    // The child's cuda.core event: this stream waits for its fill of 9s.
    let Ok(Received::Event(written)) = channel.recv(&stream) else { panic!("expected the child's event") };
    assert!(written.is_imported());
    assert_eq!(read_bytes(&buffer, &stream), vec![9; 4096], "read after the child's fill");
    channel.send_data(b"bye").unwrap();
    child.wait("python-child: ok events");
}

/// Runs the Python parent, whose child is this test binary re-run for `test` only.
fn run_python_parent(python: &Path, test: &str, mode: &str) {
    let mut command = python_command(python, "exchange_parent.py", mode);
    command
        .env("CUDA_MEM_EXCHANGE_CHILD", std::env::current_exe().unwrap())
        .env("CUDA_MEM_EXCHANGE_TEST", test)
        .env_remove(ROLE_ENV);
    let parent = PythonProcess::new(command.spawn().expect("the Python parent starts"));
    parent.wait(&format!("python-parent: ok {mode}"));
}

/// The Rust child of the Python parent: receives the seeds, the pools and the buffers, checks
/// the Python side's bytes and writes its own. `kinds` holds the kinds of the pools received
/// before.
fn round_trip_from_parent(channel: &IpcChannel, stream: &Stream, mut kinds: Vec<PoolKind>) {
    let seeds: Vec<u32> =
        expect_data(channel, stream).chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    let mut buffers = loop {
        match channel.recv(stream).unwrap() {
            Received::Resource(resource) => kinds.push(resource.kind()),
            Received::Buffers(buffers) => break buffers,
            other => panic!("expected a pool or buffers, got {other:?}"),
        }
    };
    assert_eq!(buffers.len(), seeds.len());
    assert_eq!(kinds, [PoolKind::Device(stream.device()), PoolKind::Pinned], "cuda.core's device and pinned pools");
    for (buffer, &seed) in buffers.iter_mut().zip(&seeds) {
        assert_eq!(read_bytes(buffer, stream), pattern(seed, buffer.size()), "buffer of seed {seed}: the Python bytes");
        write_bytes(buffer, &pattern(seed + 100, buffer.size()), stream);
    }
    channel.send_data(b"rewritten").unwrap();
}

/// Receives a message that must be refused, answers with the error's text, returns the error.
fn refuse(channel: &IpcChannel, stream: &Stream) -> IpcError {
    let error = channel.recv(stream).expect_err("a refused message");
    channel.send_data(error.to_string().as_bytes()).unwrap();
    error
}

#[test]
fn python_parent_rust_child_round_trip() {
    if role().is_some() {
        let (_, stream) = setup();
        return round_trip_from_parent(&parent_channel(), &stream, Vec::new());
    }
    let Some(python) = python() else { return };
    run_python_parent(&python, test_name!(), "roundtrip");
}

#[test]
fn python_parent_rust_child_mismatches() {
    if role().is_some() {
        let (_, stream) = setup();
        let channel = parent_channel();
        let error = refuse(&channel, &stream);
        let unknown = ProtocolError::Message(MessageError::UnknownKind { kind: 77 });
        assert!(matches!(&error, IpcError::Protocol(e) if *e == unknown), "{error:?}");
        // cuda.core's device pool described as pinned memory, then a descriptor that is no pool.
        let error = refuse(&channel, &stream);
        assert!(
            matches!(
                error,
                IpcError::MisdescribedResource { claimed: PoolKind::Pinned, actual: PoolKind::Device(d), .. }
                    if d == stream.device()
            ),
            "{error:?}"
        );
        let error = refuse(&channel, &stream);
        // A GPU's code for it is the probe's open question 25; the simulator's, INVALID_VALUE.
        let peers = matches!(error, IpcError::PoolImport { .. });
        assert!(peers || !cuda_sim::testing::on_simulator() && error.cuda_code().is_some(), "{error:?}");
        assert!(error.channel_usable(), "{error:?}");
        // The pool arrives whole; its buffer's descriptor is of version 2.
        let Ok(Received::Resource(device_pool)) = channel.recv(&stream) else { panic!("expected the device pool") };
        let error = refuse(&channel, &stream);
        assert!(
            matches!(
                error,
                IpcError::BufferDescriptor(BufferDescriptorError::Envelope(EnvelopeError::UnsupportedVersion {
                    found: 2,
                    supported: 1
                }))
            ),
            "{error:?}"
        );
        round_trip_from_parent(&channel, &stream, vec![device_pool.kind()]);
        let error = refuse(&channel, &stream);
        assert!(
            matches!(
                &error,
                IpcError::Protocol(ProtocolError::Frame(FrameError::UnsupportedVersion { found: 2, supported: 1 }))
            ),
            "{error:?}"
        );
        return;
    }
    let Some(python) = python() else { return };
    run_python_parent(&python, test_name!(), "mismatch");
}
