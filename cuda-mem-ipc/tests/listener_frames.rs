//! Hostile frames through the listeners: an `IpcChannel` accepted by a `ChannelListener`, and an
//! `AsyncIpcChannel` accepted by an `AsyncChannelListener`, answer each with the same error as
//! an `IpcChannel` over a socket pair, and where that error leaves the channel usable, the next
//! message still comes.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;

use common::{pair, setup};
use cuda_mem_core::{DeviceMemoryResource, DeviceMemoryResourceOptions, Stream};
use cuda_mem_ipc::wire::{FrameHeader, MessageKind};
use cuda_mem_ipc::{AsyncChannelListener, AsyncIpcChannel, Channel, ChannelListener, IpcChannel, IpcError, Received};

/// A frame's bytes: its header, then its payload (no descriptors).
fn frame(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut bytes = FrameHeader { kind, payload_len: payload.len(), fds: 0 }.encode().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// A well-formed buffers message's payload naming a pool the receiver never got: captured from
/// a real send on another channel.
fn buffers_payload(stream: &Stream) -> Vec<u8> {
    let (device, _) = setup();
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = pool.allocate(4096, stream).unwrap();
    let (sender, sink) = Channel::pair().unwrap();
    IpcChannel::new(sender).send_buffers(&[&buffer]).unwrap();
    let resource = sink.recv().unwrap();
    assert_eq!(resource.kind, MessageKind::Resource.code());
    let buffers = sink.recv().unwrap();
    assert_eq!(buffers.kind, MessageKind::Buffers.code());
    buffers.payload
}

/// What a hostile peer sends, by name.
fn hostile_inputs(stream: &Stream) -> Vec<(&'static str, Vec<u8>)> {
    let buffers = buffers_payload(stream);
    vec![
        ("bytes that are no frame", b"not a frame header at all, but long enough".to_vec()),
        ("a kind no channel knows", frame(0x7777, b"?")),
        ("a resource message of garbage", frame(MessageKind::Resource.code(), &[0xff; 7])),
        ("buffers of a pool never sent", frame(MessageKind::Buffers.code(), &buffers)),
        ("buffers handed back that were never lent", frame(MessageKind::Returned.code(), &buffers)),
        ("an event message cut short", frame(MessageKind::Event.code(), &[1, 2, 3])),
        ("buffers after an event of garbage", frame(MessageKind::BuffersAfterEvent.code(), &[0; 9])),
    ]
}

/// Writes `bytes` on `hostile`, then the next message, a data message saying "next".
fn send(hostile: &mut UnixStream, bytes: &[u8]) {
    hostile.write_all(bytes).unwrap();
    hostile.write_all(&frame(MessageKind::Data.code(), b"next")).unwrap();
}

/// How a receive ended: the error's text, whether the channel is still usable, and then, if it
/// is, whether the next message came whole.
type Outcome = (String, bool, Option<bool>);

fn outcome(first: Result<Received, IpcError>, next: impl FnOnce() -> Result<Received, IpcError>) -> Outcome {
    let error = match first {
        Ok(received) => panic!("a hostile frame was received: {received:?}"),
        Err(error) => error,
    };
    let usable = error.channel_usable();
    let next = usable.then(|| matches!(next(), Ok(Received::Data(d)) if d == b"next"));
    (error.to_string(), usable, next)
}

fn connect(name: &str) -> UnixStream {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    UnixStream::connect_addr(&address).unwrap()
}

#[test]
fn hostile_frames_through_a_listener_get_the_errors_they_get_on_any_channel() {
    let (_device, stream) = setup();
    let name = format!("cuda-mem-ipc-hostile-{}", uuid::Uuid::new_v4());
    let blocking = ChannelListener::bind_abstract(&name).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let asynchronous =
        runtime.block_on(async { AsyncChannelListener::bind_abstract(format!("{name}-async")) }).unwrap();

    for (what, bytes) in hostile_inputs(&stream) {
        // A socket pair.
        let (mut hostile, ours) = UnixStream::pair().unwrap();
        let paired = IpcChannel::new(Channel::from_stream(ours).unwrap());
        send(&mut hostile, &bytes);
        let expected = outcome(paired.recv(&stream), || paired.recv(&stream));

        // The blocking listener.
        let mut hostile = connect(&name);
        let accepted = IpcChannel::new(blocking.accept().unwrap());
        send(&mut hostile, &bytes);
        let through_blocking = outcome(accepted.recv(&stream), || accepted.recv(&stream));
        assert_eq!(through_blocking, expected, "{what}: the blocking listener's channel");

        // The async listener.
        let through_async = runtime.block_on(async {
            let mut hostile = connect(&format!("{name}-async"));
            let accepted = AsyncIpcChannel::new(asynchronous.accept().await.unwrap());
            send(&mut hostile, &bytes);
            let first = accepted.recv(&stream).await;
            let usable = first.as_ref().err().is_some_and(IpcError::channel_usable);
            let next = if usable { Some(accepted.recv(&stream).await) } else { None };
            outcome(first, || next.unwrap_or(Err(IpcError::PeerClosed)))
        });
        assert_eq!(through_async, expected, "{what}: the async listener's channel");
    }
    // Every channel above was dropped with its hostile peer: nothing was imported, and an
    // ordinary pair still works.
    let (a, b) = pair();
    a.send_data(b"after").unwrap();
    assert!(matches!(b.recv(&stream), Ok(Received::Data(d)) if d == b"after"));
}
