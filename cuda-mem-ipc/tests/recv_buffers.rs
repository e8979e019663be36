//! `IpcChannel::recv_buffers`: one call receives what one `send_buffers` sent (the resource
//! messages before the buffers, then the buffers), and refuses a message of another kind without
//! importing it. (An event opens only in another process: `tests/tests/ipc_events.rs` receives
//! buffers sent after one with `recv_buffers`.)

mod common;

use common::{pair, setup};

use cuda_mem_core::{
    DeviceMemoryResource, DeviceMemoryResourceOptions, Event, EventOptions, PinnedMemoryResource,
    PinnedMemoryResourceOptions,
};
use cuda_mem_ipc::wire::MessageKind;
use cuda_mem_ipc::{IpcError, Received};

#[test]
fn the_buffers_of_one_send_come_in_one_call_with_their_pools() {
    let (device, stream) = setup();
    let options = || DeviceMemoryResourceOptions::default().ipc_enabled(true);
    let (first, second) =
        (DeviceMemoryResource::new(device, options()).unwrap(), DeviceMemoryResource::new(device, options()).unwrap());
    let pinned = PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .unwrap();
    let buffers = [
        first.allocate(4096, &stream).unwrap(),
        second.allocate(1000, &stream).unwrap(),
        pinned.allocate(64, &stream).unwrap(),
        first.allocate(1, &stream).unwrap(),
    ];
    let (tx, rx) = pair();
    // Three pools go first, each once, then the buffers.
    tx.send_buffers(&buffers.iter().collect::<Vec<_>>()).unwrap();
    let received = rx.recv_buffers(&stream).unwrap();
    let sizes: Vec<usize> = received.iter().map(|b| b.size()).collect();
    assert_eq!(sizes, [4096, 1000, 64, 1]);
    for pool in [first.as_ref() as &dyn cuda_mem_core::MemoryResource, second.as_ref(), pinned.as_ref()] {
        let uuid = cuda_mem_ipc::allocation_handle(pool).unwrap().uuid();
        assert!(rx.resource(uuid).is_some(), "the channel keeps the pool {uuid}");
    }
    // The pools are known now: the next send is one message, and one call again.
    tx.send_buffers(&[&buffers[1]]).unwrap();
    let again = rx.recv_buffers(&stream).unwrap();
    assert_eq!(again[0].ptr(), received[1].ptr(), "the same mapping");
}

#[test]
fn a_message_of_another_kind_is_refused_unimported_and_the_channel_goes_on() {
    let (device, stream) = setup();
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap();
    let buffer = pool.allocate(256, &stream).unwrap();
    let event = Event::new(device, EventOptions::default().interprocess()).unwrap();
    event.record(&stream).unwrap();
    let (tx, rx) = pair();
    tx.send_data(b"not buffers").unwrap();
    tx.send_event(&event).unwrap();
    tx.send_buffers(&[&buffer]).unwrap();
    for found in [MessageKind::Data, MessageKind::Event] {
        let error = rx.recv_buffers(&stream).unwrap_err();
        assert!(
            matches!(error, IpcError::UnexpectedMessage { expected: MessageKind::Buffers, found: f } if f == found),
            "{error:?}"
        );
        assert!(error.to_string().contains(&format!("but a {found} message came")), "{error}");
    }
    assert_eq!(rx.open_events(), 0, "the event was not opened");
    // The resource message is received, then the buffers.
    assert_eq!(rx.recv_buffers(&stream).unwrap().len(), 1);
    tx.send_data(b"in step").unwrap();
    assert!(matches!(rx.recv(&stream), Ok(Received::Data(bytes)) if bytes == b"in step"));
}
