//! Interprocess events through `IpcChannel`: the receiver's stream waits on the GPU for work the
//! sender enqueued, instead of the sender synchronizing on the host before it tells the other
//! side. The sender's stream is held by a gate (a host function that waits until the test opens
//! it), so its work is provably pending when the receiver enqueues its own: a stream that does
//! not wait for the event sees the bytes from before, one that waits sees the sender's.

#[macro_use]
mod common;

use common::*;
use cuda_mem_core::{Buffer, Event, EventOptions, FillPattern, LegacyPinnedMemoryResource, Stream, StreamOptions};
use cuda_mem_ipc::{IpcError, Received};

const SIZE: usize = 4096;

/// Copies `buffer` into pinned host memory on `stream` (not waited for).
fn copy_out(buffer: &Buffer, stream: &Stream) -> Buffer {
    let mut host = LegacyPinnedMemoryResource::new(stream.device()).allocate(buffer.size(), stream).unwrap();
    host.copy_from(buffer, stream).unwrap();
    host
}

fn all(host: &Buffer, byte: u8) -> bool {
    host.host_slice().unwrap().iter().all(|&b| b == byte)
}

#[test]
fn the_receivers_stream_waits_for_the_senders_work_on_the_gpu() {
    if role().is_some() {
        return waiting_child();
    }
    let (device, stream) = setup();
    let pool = device_pool(device);
    let mut buffer = pool.allocate(SIZE, &stream).unwrap();
    write_bytes(&mut buffer, &[1; SIZE], &stream);
    let event = Event::new(device, EventOptions::default().interprocess()).unwrap();

    // Round 1: the fill waits at the gate; the event and the buffer go out with it pending.
    let (gate, _opens) = hold(&stream);
    buffer.fill(FillPattern::U8(7), &stream).unwrap();
    event.record(&stream).unwrap();
    let (child, channel) = spawn_role(test_name!(), "waiter", &[]);
    channel.send_buffers_after(&event, &[&buffer]).unwrap();
    expect_text(&channel, &stream, "enqueued");
    gate.open();

    // Round 2: the same event, recorded again behind another gate, sent alone.
    let (gate, _opens) = hold(&stream);
    buffer.fill(FillPattern::U8(9), &stream).unwrap();
    event.record(&stream).unwrap();
    channel.send_event(&event).unwrap();
    expect_text(&channel, &stream, "enqueued");
    gate.open();
    expect_text(&channel, &stream, "done");
    child.wait_success();
}

fn waiting_child() {
    let (device, stream) = setup();
    let channel = parent_channel();
    // The pool, then the buffer with the event: one call.
    let buffers = channel.recv_buffers(&stream).unwrap();
    let buffer = &buffers[0];
    assert_eq!(channel.open_events(), 1, "the channel keeps the event open");

    // A stream that does not wait for the event reads what was there before the sender's fill.
    let unordered = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let stale = copy_out(buffer, &unordered);
    unordered.synchronize().unwrap();
    assert!(all(&stale, 1), "without the wait, the sender's pending fill is not seen");

    // The stream given to `recv` waits for it.
    let ordered = copy_out(buffer, &stream);
    assert!(!stream.is_idle().unwrap(), "the copy waits for the other process's work");
    channel.send_data(b"enqueued").unwrap();
    stream.synchronize().unwrap();
    assert!(all(&ordered, 7), "the copy ran after the sender's fill");

    // The event again: the one opened before, and the wait is for its latest recording.
    let Ok(Received::Event(event)) = channel.recv(&stream) else { panic!("expected the event") };
    assert!(event.is_imported() && event.is_ipc_enabled() && !event.is_timing_enabled());
    assert_eq!(channel.open_events(), 1, "opened once for both messages");
    let second = copy_out(buffer, &stream);
    assert!(!stream.is_idle().unwrap(), "the second recording is pending");
    assert!(!event.is_complete().unwrap());
    channel.send_data(b"enqueued").unwrap();
    stream.synchronize().unwrap();
    assert!(all(&second, 9), "the copy ran after the second fill");
    assert!(event.is_complete().unwrap());
    channel.send_data(b"done").unwrap();
}

#[test]
fn an_event_whose_sender_is_gone_is_refused_and_the_receiver_goes_on() {
    if role().is_some() {
        return exiting_child();
    }
    let (_device, stream) = setup();
    let (child, channel) = spawn_role(test_name!(), "exiter", &[]);
    // The child sent its event and exited, destroying it: the handle names nothing any more
    // (the driver's documentation leaves its use undefined; the simulator refuses it).
    child.wait_success();
    let error = channel.recv(&stream).unwrap_err();
    assert!(matches!(error, IpcError::EventImport { .. }), "{error:?}");
    assert!(error.to_string().contains("the peer must hold the event"), "{error}");
    assert_eq!(channel.open_events(), 0);
    // The channel is still in step, and this process's stream still works.
    expect_text(&channel, &stream, "after");
    stream.synchronize().unwrap();
}

fn exiting_child() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let event = Event::new(device, EventOptions::default().interprocess()).unwrap();
    event.record(&stream).unwrap();
    channel.send_event(&event).unwrap();
    channel.send_data(b"after").unwrap();
}
