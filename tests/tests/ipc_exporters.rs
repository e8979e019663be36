//! Pools keyed by the process that sent them: a pool that one process sends on two channels is
//! one import here, whatever the driver answers a second import of a pool with (a handle of its
//! own, or the first import's: `CUDA_SIM_POOL_IMPORT`), and another process that names the same
//! UUID gets none of that import. The processes are told apart by what the kernel vouches for
//! (`Channel::peer_process_id`), also where this process made both socket pairs itself
//! (`spawn_with_channel`), whose peer credentials name this process on both. A relay, which may
//! hold two pools under one UUID, sends a receiver process only one of them, on every channel to
//! it.

#[macro_use]
mod common;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use common::*;
use cuda_mem_core::{Buffer, Device, Stream};
use cuda_mem_ipc::{
    BufferDescriptor, Channel, IpcChannel, IpcError, MappedMemoryResource, allocation_handle, buffer_descriptor,
    registry,
};
use cuda_sim::testing::{in_simulated_machine, live_objects_if_simulated};
use uuid::Uuid;

/// A kind the protocol does not use, for passing a new channel's socket.
const NEW_CHANNEL: u16 = 100;
/// The wire kinds of resource and buffers messages.
const RESOURCE: u16 = 1;
const BUFFERS: u16 = 2;
/// The simulator's setting for a driver that answers a second import of a pool with the first
/// import's handle.
const SAME_HANDLE: &[(&str, &str)] = &[("CUDA_SIM_POOL_IMPORT", "same-handle")];
/// And for one that gives every import a handle of its own (the simulator's default).
const NEW_HANDLE: &[(&str, &str)] = &[("CUDA_SIM_POOL_IMPORT", "new-handle")];
/// The buffers' size.
const SIZE: usize = 4096;

/// The simulator's live pools (`None` on a real driver, which does not count them).
fn live_pools() -> Option<u64> {
    live_objects_if_simulated().map(|live| live.pools)
}

/// A device pool's buffer holding `pattern(seed)`, with its pool.
fn written(device: Device, seed: u32, stream: &Stream) -> (Arc<cuda_mem_core::DeviceMemoryResource>, Buffer) {
    let pool = device_pool(device);
    let mut buffer = pool.allocate(SIZE, stream).unwrap();
    write_bytes(&mut buffer, &pattern(seed, SIZE), stream);
    (pool, buffer)
}

/// The channel whose socket came in a [`NEW_CHANNEL`] message on `channel`.
fn adopt_new_channel(channel: &IpcChannel) -> IpcChannel {
    let message = channel.channel().recv().unwrap();
    assert_eq!((message.kind, message.fds.len()), (NEW_CHANNEL, 1));
    let socket = UnixStream::from(message.fds.into_iter().next().unwrap());
    let adopted = Channel::from_stream(socket).unwrap();
    adopted.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    IpcChannel::new(adopted)
}

// ---------------------------------------------------------------------------------------------

/// This process imports, an exporter child sends its pool and a buffer of it on the channel it
/// was started with and on a second one it makes itself (a socket pair whose end it sends
/// here). Both channels name the exporter, and both give the one import: the same resource, the
/// same mapping, one pool in the simulator's count.
fn one_import_of_a_pool_sent_on_two_channels(test: &str) {
    let (_device, stream) = setup();
    let pools = live_pools();
    let (exporter, first) = spawn_role(test, "exporter", &[]);
    let one = expect_resource(&first, &stream);
    let from_first = expect_buffers(&first, &stream);
    let second = adopt_new_channel(&first);
    // This process made the first socket pair, the exporter the second: the peer is the
    // exporter on both, by the child's id on the one and its peer credentials on the other.
    assert_eq!(first.channel().peer_process_id(), Some(exporter.id()));
    assert_eq!(second.channel().peer_process_id(), Some(exporter.id()));
    let other = expect_resource(&second, &stream);
    let from_second = expect_buffers(&second, &stream);

    assert!(Arc::ptr_eq(&one, &other), "one import of the exporter's pool, whichever channel it came on");
    assert!(Arc::ptr_eq(&second.resource(one.uuid()).unwrap(), &one), "each channel keeps it");
    assert_eq!(live_pools(), pools.map(|n| n + 1), "one pool imported");
    let ptr = from_first[0].ptr();
    assert_eq!(from_second[0].ptr(), ptr, "one mapping");
    assert_eq!(cuda_mem_core::import_holders(ptr), 2, "held by both buffers");
    assert_eq!(read_bytes(&from_second[0], &stream), pattern(31, SIZE));

    // Who frees first: the importer, then it says so.
    drop((from_first, from_second));
    stream.synchronize().unwrap();
    assert_eq!(cuda_mem_core::import_holders(ptr), 0);
    first.send_data(b"done").unwrap();
    exporter.wait_success();
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}

/// The exporter of [`one_import_of_a_pool_sent_on_two_channels`].
fn exporter_on_two_channels() {
    let (device, stream) = setup();
    let first = parent_channel();
    let (_pool, buffer) = written(device, 31, &stream);
    first.send_buffers(&[&buffer]).unwrap();
    let (mine, theirs) = Channel::pair().unwrap();
    first.channel().send(NEW_CHANNEL, b"a second channel", &[theirs.as_fd()]).unwrap();
    drop(theirs);
    mine.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    let second = IpcChannel::new(mine);
    second.send_buffers(&[&buffer]).unwrap();
    expect_text(&first, &stream, "done");
}

#[test]
fn a_pool_sent_on_two_channels_is_one_import() {
    if role().is_some() {
        return exporter_on_two_channels();
    }
    in_simulated_machine(test_name!(), NEW_HANDLE, || one_import_of_a_pool_sent_on_two_channels(test_name!()));
}

#[test]
fn a_pool_sent_on_two_channels_is_one_import_when_the_driver_returns_one_handle() {
    if role().is_some() {
        return exporter_on_two_channels();
    }
    in_simulated_machine(test_name!(), SAME_HANDLE, || one_import_of_a_pool_sent_on_two_channels(test_name!()));
}

// ---------------------------------------------------------------------------------------------

/// Two children, both started here (so both socket pairs are this process's, and their peer
/// credentials name this process on both ends): an exporter, and a squatter that sends a pool
/// of its own under the exporter's pool's UUID, then the exporter's buffer and one of its own
/// under that UUID. The squatter gets an import of its own pool, never the exporter's: the
/// exporter's buffer does not map through it (the driver refuses it, the squatter's error), its
/// own buffer maps its own memory, and the exporter's import and buffer are untouched.
fn a_squatter_gets_none_of_the_exporters_import(test: &str) {
    let (_device, stream) = setup();
    let (exporter, from_exporter) = spawn_role(test, "exporter", &[]);
    let genuine = expect_resource(&from_exporter, &stream);
    let genuine_buffers = expect_buffers(&from_exporter, &stream);
    let uuid = genuine.uuid();
    let (squatter, from_squatter) = spawn_role(test, "squatter", &[]);
    assert_eq!(from_exporter.channel().peer_process_id(), Some(exporter.id()));
    assert_eq!(from_squatter.channel().peer_process_id(), Some(squatter.id()));
    // What the squatter learnt somehow: the UUID, and the genuine buffer's descriptor.
    let descriptor = buffer_descriptor(&genuine_buffers[0]).unwrap();
    from_squatter.send_data(&[&uuid.as_bytes()[..], &descriptor.encode()].concat()).unwrap();

    let squatted = expect_resource(&from_squatter, &stream);
    assert!(!Arc::ptr_eq(&squatted, &genuine), "the exporter's import is not handed to another process");
    assert_ne!(squatted.imported_pool().handle(), genuine.imported_pool().handle());
    assert!(Arc::ptr_eq(&registry().get(uuid).unwrap(), &genuine), "the process's import of the UUID stays");
    match from_squatter.recv(&stream) {
        Err(error @ IpcError::BufferImport { resource, .. }) if resource == uuid => {
            assert!(error.channel_usable(), "{error}");
            assert!(error.to_string().contains("the channel is still usable"), "{error}");
        }
        // A GPU's code for another pool's export data is not known yet (the simulator's is
        // `INVALID_VALUE`, the peer's error above): a refusal all the same.
        Err(IpcError::Core(error)) if !cuda_sim::testing::on_simulator() && error.cuda_code().is_some() => {}
        other => panic!("expected the driver's refusal of the exporter's buffer, got {other:?}"),
    }
    let own = expect_buffers(&from_squatter, &stream);
    assert_eq!(read_bytes(&own[0], &stream), pattern(41, SIZE), "the squatter's own memory");
    assert_eq!(cuda_mem_core::import_holders(genuine_buffers[0].ptr()), 1, "nothing more of the exporter's");
    assert_eq!(read_bytes(&genuine_buffers[0], &stream), pattern(40, SIZE));

    drop(own);
    stream.synchronize().unwrap();
    from_squatter.send_data(b"done").unwrap();
    squatter.wait_success();
    drop(genuine_buffers);
    stream.synchronize().unwrap();
    from_exporter.send_data(b"done").unwrap();
    exporter.wait_success();
}

/// The exporter of [`a_squatter_gets_none_of_the_exporters_import`].
fn exporter_of_one_buffer() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let (_pool, buffer) = written(device, 40, &stream);
    channel.send_buffers(&[&buffer]).unwrap();
    expect_text(&channel, &stream, "done");
}

/// The squatter of [`a_squatter_gets_none_of_the_exporters_import`]: its own pool under the
/// exporter's UUID, then the exporter's buffer, then a buffer of its own, each named so.
fn squatter() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let learnt = expect_data(&channel, &stream);
    let uuid = Uuid::from_slice(&learnt[..16]).unwrap();
    let genuine = BufferDescriptor::decode(&learnt[16..]).unwrap();
    let (pool, buffer) = written(device, 41, &stream);
    let mut resource = uuid.as_bytes().to_vec();
    resource.push(0);
    resource.extend_from_slice(&(device.ordinal() as i32).to_le_bytes());
    resource.extend_from_slice(&[0; 3]);
    resource.extend_from_slice(&device.uuid().unwrap());
    channel.channel().send(RESOURCE, &resource, &[allocation_handle(pool.as_ref()).unwrap().fd()]).unwrap();
    let own = BufferDescriptor { resource: uuid, ..buffer_descriptor(&buffer).unwrap() };
    for descriptor in [genuine, own] {
        let payload = [&1u32.to_le_bytes()[..], &descriptor.encode()].concat();
        channel.channel().send(BUFFERS, &payload, &[]).unwrap();
    }
    expect_text(&channel, &stream, "done");
}

#[test]
fn a_process_naming_another_processs_pool_gets_none_of_its_import() {
    if let Some(role) = role() {
        return match role.as_str() {
            "exporter" => exporter_of_one_buffer(),
            "squatter" => squatter(),
            other => panic!("unknown role {other}"),
        };
    }
    a_squatter_gets_none_of_the_exporters_import(test_name!());
}

// ---------------------------------------------------------------------------------------------

/// A relay holds two pools under one UUID (its own import of a pool under a UUID of its choosing,
/// and another pool a peer named alike). A receiver keys what the relay sends by the relay and the
/// UUID, so the relay sends it only the first, on every channel to it: the second is refused on
/// a second channel to the same receiver before anything of it is sent, while the first goes
/// there as on the first channel.
fn a_relay_sends_one_pool_per_uuid_to_a_process(test: &str) {
    let (device, stream) = setup();
    let uuid = Uuid::new_v4();
    let (first_pool, first_buffer) = written(device, 50, &stream);
    let handle = allocation_handle(first_pool.as_ref()).unwrap();
    let first = MappedMemoryResource::from_fd(handle.fd(), uuid).unwrap();
    let descriptor = BufferDescriptor { resource: uuid, ..buffer_descriptor(&first_buffer).unwrap() };
    let from_first = first.import_buffer(&descriptor, &stream).unwrap();
    // The other pool, from a peer in this process that names it with the same UUID.
    let (second_pool, second_buffer) = written(device, 51, &stream);
    let (peer, here) = Channel::pair().unwrap();
    let here = IpcChannel::new(here);
    let mut resource = uuid.as_bytes().to_vec();
    resource.push(0);
    resource.extend_from_slice(&(device.ordinal() as i32).to_le_bytes());
    resource.extend_from_slice(&[0; 3]);
    resource.extend_from_slice(&device.uuid().unwrap());
    peer.send(RESOURCE, &resource, &[allocation_handle(second_pool.as_ref()).unwrap().fd()]).unwrap();
    let named = BufferDescriptor { resource: uuid, ..buffer_descriptor(&second_buffer).unwrap() };
    peer.send(BUFFERS, &[&1u32.to_le_bytes()[..], &named.encode()].concat(), &[]).unwrap();
    let second = expect_resource(&here, &stream);
    let from_second = expect_buffers(&here, &stream);
    assert!(!Arc::ptr_eq(&first, &second) && second.uuid() == uuid, "two pools under one UUID here");

    let (receiver, to_receiver) = spawn_role(test, "receiver", &[]);
    to_receiver.send_buffers(&[&from_first]).unwrap();
    // A second channel to the receiver, whose socket pair the receiver made.
    let again = adopt_new_channel(&to_receiver);
    assert_eq!(again.channel().peer_process_id(), Some(receiver.id()));
    for refused in [again.send_buffers(&from_second.iter().collect::<Vec<_>>()), again.send_resource(second.as_ref())] {
        match refused {
            Err(error @ IpcError::UuidTakenOnChannel { uuid: taken }) if taken == uuid => {
                assert!(error.channel_usable(), "{error}");
            }
            other => panic!("expected the UUID refused for the second pool, got {other:?}"),
        }
    }
    again.send_buffers(&[&from_first]).unwrap();
    again.send_data(b"after").unwrap();
    expect_text(&to_receiver, &stream, "received");
    to_receiver.send_data(b"done").unwrap();
    receiver.wait_success();
}

/// The receiver of [`a_relay_sends_one_pool_per_uuid_to_a_process`]: the first pool on each
/// channel, nothing else before the data.
fn receiver_of_two_channels() {
    let (_device, stream) = setup();
    let first = parent_channel();
    let one = expect_resource(&first, &stream);
    let from_first = expect_buffers(&first, &stream);
    let (mine, theirs) = Channel::pair().unwrap();
    first.channel().send(NEW_CHANNEL, b"a second channel", &[theirs.as_fd()]).unwrap();
    drop(theirs);
    mine.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    let second = IpcChannel::new(mine);
    // This process made that socket pair: the kernel does not say who holds the other end, so
    // the channel imports on its own; what comes is the first pool all the same.
    assert_eq!(second.channel().peer_process_id(), None);
    assert_eq!(expect_resource(&second, &stream).uuid(), one.uuid());
    let from_second = expect_buffers(&second, &stream);
    assert_eq!(read_bytes(&from_second[0], &stream), pattern(50, SIZE));
    expect_text(&second, &stream, "after");
    drop((from_first, from_second));
    stream.synchronize().unwrap();
    first.send_data(b"received").unwrap();
    expect_text(&first, &stream, "done");
}

#[test]
fn a_relay_sends_one_pool_per_uuid_to_each_process() {
    if role().is_some() {
        return receiver_of_two_channels();
    }
    a_relay_sends_one_pool_per_uuid_to_a_process(test_name!());
}
