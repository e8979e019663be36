//! The receiving side of an `IpcChannel` against what a peer says, in one process (the peer
//! writes on a raw `Channel`): a receiver that drops the resource it got still maps the buffers
//! that follow; buffers resolve only against the pools their own channel received; a UUID this
//! process knows is not handed to another peer, nor one a peer named first to the program's own
//! `from_fd`; the memory kind and device of a pool are the
//! driver's word; a pool imported twice is never owned twice, whether the driver gives the second
//! import a handle of its own or the first import's (`CUDA_SIM_POOL_IMPORT=same-handle`). Every
//! refusal leaves the process and its pools as they were.

mod common;

use common::setup;
use std::sync::Arc;
use std::time::Duration;

use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, FillPattern, PinnedMemoryResource,
    PinnedMemoryResourceOptions, PoolKind, Stream,
};
use cuda_mem_ipc::wire::BuffersMessageError;
use cuda_mem_ipc::{
    BufferDescriptor, Channel, IpcChannel, IpcError, MAX_BUFFERS_PER_MESSAGE, MappedMemoryResource, ProtocolError,
    Received, allocation_handle, buffer_descriptor, lookup, registry,
};
use cuda_sim::testing::{in_simulated_machine, live_objects_if_simulated};
use uuid::Uuid;

/// The wire kinds of resource and buffers messages (`cuda_mem_ipc::protocol`).
const RESOURCE: u16 = 1;
const BUFFERS: u16 = 2;
/// The simulator's setting for a driver that answers a second import of a pool with the first
/// import's handle.
const SAME_HANDLE: &[(&str, &str)] = &[("CUDA_SIM_POOL_IMPORT", "same-handle")];

fn device_pool(device: Device) -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap()
}

fn pinned_pool(device: Device) -> Arc<PinnedMemoryResource> {
    PinnedMemoryResource::new(
        PinnedMemoryResourceOptions::default().ipc_enabled(true).numa_node(device.host_numa_node().unwrap()),
    )
    .unwrap()
}

/// A buffer of `pool` filled with `byte`, written before it is shared.
fn filled(pool: &Arc<DeviceMemoryResource>, byte: u8, stream: &Stream) -> Buffer {
    let mut buffer = pool.allocate(4096, stream).unwrap();
    buffer.fill(FillPattern::U8(byte), stream).unwrap();
    stream.synchronize().unwrap();
    buffer
}

/// The bytes of `buffer`, through a pinned copy.
fn read(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let host = PinnedMemoryResource::new(PinnedMemoryResourceOptions::default()).unwrap();
    let mut copy = host.allocate(buffer.size(), stream).unwrap();
    copy.copy_from(buffer, stream).unwrap();
    stream.synchronize().unwrap();
    copy.host_slice().unwrap().to_vec()
}

fn uuid_of(pool: &Arc<DeviceMemoryResource>) -> Uuid {
    allocation_handle(pool.as_ref()).unwrap().uuid()
}

/// How long a receive may wait before the test fails (rather than hangs).
const RECV_TIMEOUT: Duration = Duration::from_secs(30);

/// A sending and a receiving `IpcChannel`, connected.
fn pair() -> (IpcChannel, IpcChannel) {
    let (peer, ours) = from_raw_peer();
    (IpcChannel::new(peer), ours)
}

/// A receiving `IpcChannel`, and the raw channel a peer writes on.
fn from_raw_peer() -> (Channel, IpcChannel) {
    let (peer, ours) = Channel::pair().unwrap();
    ours.set_read_timeout(Some(RECV_TIMEOUT)).unwrap();
    (peer, IpcChannel::new(ours))
}

/// A resource message as a peer may write it: any UUID, memory kind (0 device, 1 pinned), sender
/// ordinal and device UUID.
fn resource_payload(uuid: Uuid, kind: u8, ordinal: i32, device_uuid: [u8; 16]) -> Vec<u8> {
    let mut payload = uuid.as_bytes().to_vec();
    payload.push(kind);
    payload.extend_from_slice(&ordinal.to_le_bytes());
    payload.extend_from_slice(&[0; 3]);
    payload.extend_from_slice(&device_uuid);
    payload
}

/// A resource message that says "device memory of `device`".
fn as_device(uuid: Uuid, device: Device) -> Vec<u8> {
    resource_payload(uuid, 0, device.ordinal() as i32, device.uuid().unwrap())
}

/// A resource message that says "pinned host memory".
fn as_pinned(uuid: Uuid) -> Vec<u8> {
    resource_payload(uuid, 1, -1, [0; 16])
}

fn buffers_payload(descriptors: &[BufferDescriptor]) -> Vec<u8> {
    let mut payload = (descriptors.len() as u32).to_le_bytes().to_vec();
    for descriptor in descriptors {
        payload.extend_from_slice(&descriptor.encode());
    }
    payload
}

/// Sends `pool`'s descriptor with a resource message of the peer's own making.
fn send_pool(peer: &Channel, pool: &Arc<DeviceMemoryResource>, payload: &[u8]) {
    let handle = allocation_handle(pool.as_ref()).unwrap();
    peer.send(RESOURCE, payload, &[handle.fd()]).unwrap();
}

fn expect_resource(channel: &IpcChannel, stream: &Stream) -> Arc<MappedMemoryResource> {
    match channel.recv(stream) {
        Ok(Received::Resource(resource)) => resource,
        other => panic!("expected a resource, got {other:?}"),
    }
}

fn expect_buffers(channel: &IpcChannel, stream: &Stream) -> Vec<Buffer> {
    match channel.recv(stream) {
        Ok(Received::Buffers(buffers)) => buffers,
        other => panic!("expected buffers, got {other:?}"),
    }
}

/// The simulator's live pools (`None` on a real driver, which does not count them).
fn live_pools() -> Option<u64> {
    live_objects_if_simulated().map(|live| live.pools)
}

// ---------------------------------------------------------------------------------------------
// The receiver written the obvious way.

#[test]
fn a_receiver_that_drops_the_resource_still_maps_the_buffers_that_follow() {
    let (device, stream) = setup();
    let pool = device_pool(device);
    let buffer = filled(&pool, 0x31, &stream);
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer]).unwrap();
    let Received::Resource(_) = rx.recv(&stream).unwrap() else { panic!("the pool comes first") };
    let Received::Buffers(buffers) = rx.recv(&stream).unwrap() else { panic!("then the buffers") };
    assert_eq!(read(&buffers[0], &stream), vec![0x31; 4096]);
    drop(buffers);
    // More buffers of the same pool, on the same channel: the pool is not sent again.
    let later = filled(&pool, 0x32, &stream);
    tx.send_buffers(&[&later]).unwrap();
    let buffers = expect_buffers(&rx, &stream);
    assert_eq!(read(&buffers[0], &stream), vec![0x32; 4096]);
}

#[test]
fn the_channel_keeps_what_it_received_until_it_goes_or_lets_go() {
    in_simulated_machine("the_channel_keeps_what_it_received_until_it_goes_or_lets_go", &[], || {
        let (device, stream) = setup();
        let pool = device_pool(device);
        let buffer = filled(&pool, 0x33, &stream);
        let uuid = uuid_of(&pool);
        let pools = live_pools();
        let (tx, rx) = pair();
        tx.send_buffers(&[&buffer]).unwrap();
        drop(expect_resource(&rx, &stream));
        drop(expect_buffers(&rx, &stream));
        assert_eq!(live_pools(), pools.map(|n| n + 1), "the import lives with the channel");
        assert!(rx.resource(uuid).is_some());

        // Let go: the import goes, and buffers naming it are refused until it is sent again.
        let released = rx.release_resource(uuid).unwrap();
        assert_eq!(released.uuid(), uuid);
        drop(released);
        assert_eq!(live_pools(), pools, "released, and nothing else held it");
        tx.channel().send(BUFFERS, &buffers_payload(&[buffer_descriptor(&buffer).unwrap()]), &[]).unwrap();
        assert!(matches!(rx.recv(&stream), Err(IpcError::UnknownResource(u)) if u == uuid));
        tx.send_resource(pool.as_ref()).unwrap();
        tx.send_buffers(&[&buffer]).unwrap();
        drop(expect_resource(&rx, &stream));
        let kept = expect_buffers(&rx, &stream);

        // A buffer keeps its pool alive past the channel.
        drop(rx);
        assert_eq!(live_pools(), pools.map(|n| n + 1), "the buffer holds the import");
        assert_eq!(read(&kept[0], &stream), vec![0x33; 4096]);
        drop(kept);
        assert_eq!(live_pools(), pools, "gone with its last buffer");
        assert!(registry().get(uuid).is_err());
    });
}

// ---------------------------------------------------------------------------------------------
// Importing one pool twice.

/// `from_fd` twice with one UUID gives the one import; with another UUID, a driver that answers
/// with the first import's handle is refused and the first import is left intact.
fn from_fd_twice(same_handle: bool) {
    // On a real driver the answer to a second import is the driver's own (the GPU probe
    // pool-import-twice reports it): the invariants are checked, not the simulator's model.
    let same_handle = cuda_sim::testing::on_simulator().then_some(same_handle);
    let (device, stream) = setup();
    let pool = device_pool(device);
    let buffer = filled(&pool, 0x41, &stream);
    let descriptor = buffer_descriptor(&buffer).unwrap();
    let handle = allocation_handle(pool.as_ref()).unwrap();
    let pools = live_pools();

    let first = MappedMemoryResource::from_fd(handle.fd(), handle.uuid()).unwrap();
    let second = MappedMemoryResource::from_fd(handle.fd(), handle.uuid()).unwrap();
    assert!(Arc::ptr_eq(&first, &second), "one import per UUID");
    assert_eq!(live_pools(), pools.map(|n| n + 1));
    assert_eq!(first.kind(), PoolKind::Device(device), "the driver's word");

    let other = Uuid::new_v4();
    match MappedMemoryResource::from_fd(handle.fd(), other) {
        Ok(alias) => {
            assert_ne!(same_handle, Some(true), "the first import's handle is never owned twice");
            assert_ne!(alias.imported_pool().handle(), first.imported_pool().handle());
        }
        Err(error @ IpcError::PoolAlreadyImported { .. }) => {
            assert_ne!(same_handle, Some(false), "{error}");
            assert!(error.to_string().contains("already holds under another UUID"), "{error}");
            assert!(registry().get(other).is_err());
        }
        Err(error) => panic!("{error}"),
    }

    // Whichever goes first, the other still maps the pool's buffers.
    drop(first);
    let imported = second.import_buffer(&descriptor, &stream).unwrap();
    assert_eq!(read(&imported, &stream), vec![0x41; 4096]);
    drop((imported, second));
    assert_eq!(live_pools(), pools, "one import, destroyed once");
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}

#[test]
fn from_fd_twice_gives_one_import() {
    in_simulated_machine("from_fd_twice_gives_one_import", &[], || from_fd_twice(false));
}

#[test]
fn from_fd_twice_gives_one_import_when_the_driver_returns_one_handle() {
    in_simulated_machine("from_fd_twice_gives_one_import_when_the_driver_returns_one_handle", SAME_HANDLE, || {
        from_fd_twice(true)
    });
}

/// A peer sends one pool under two UUIDs: a driver that answers the second import with the
/// first's handle gets it refused; one that gives a handle of its own, two imports that each
/// work.
fn one_pool_under_two_uuids(same_handle: bool) {
    // On a real driver the answer to a second import is the driver's own (the GPU probe
    // pool-import-twice reports it): the invariants are checked, not the simulator's model.
    let same_handle = cuda_sim::testing::on_simulator().then_some(same_handle);
    let (device, stream) = setup();
    let pool = device_pool(device);
    let buffer = filled(&pool, 0x42, &stream);
    let genuine = buffer_descriptor(&buffer).unwrap();
    let (peer, rx) = from_raw_peer();
    send_pool(&peer, &pool, &as_device(genuine.resource, device));
    let first = expect_resource(&rx, &stream);
    let alias = Uuid::new_v4();
    send_pool(&peer, &pool, &as_device(alias, device));
    match rx.recv(&stream) {
        Ok(Received::Resource(second)) => {
            assert_ne!(same_handle, Some(true));
            assert_ne!(second.imported_pool().handle(), first.imported_pool().handle());
        }
        Err(error @ IpcError::PoolAlreadyImported { uuid, .. }) => {
            assert_ne!(same_handle, Some(false), "{error}");
            assert_eq!(uuid, alias);
        }
        other => panic!("{other:?}"),
    }
    drop(first);
    peer.send(BUFFERS, &buffers_payload(&[genuine]), &[]).unwrap();
    let buffers = expect_buffers(&rx, &stream);
    assert_eq!(read(&buffers[0], &stream), vec![0x42; 4096], "the first import is intact");
}

#[test]
fn one_pool_under_two_uuids_is_two_imports_of_their_own() {
    in_simulated_machine("one_pool_under_two_uuids_is_two_imports_of_their_own", &[], || {
        one_pool_under_two_uuids(false)
    });
}

#[test]
fn one_pool_under_two_uuids_is_refused_when_the_driver_returns_one_handle() {
    in_simulated_machine("one_pool_under_two_uuids_is_refused_when_the_driver_returns_one_handle", SAME_HANDLE, || {
        one_pool_under_two_uuids(true)
    });
}

/// The same pool on two channels: shared when the driver confirms it (same handle), else an
/// import of each channel's own; either way both map the same memory.
fn one_pool_on_two_channels(same_handle: bool) {
    // On a real driver the answer to a second import is the driver's own (the GPU probe
    // pool-import-twice reports it): the invariants are checked, not the simulator's model.
    let same_handle = cuda_sim::testing::on_simulator().then_some(same_handle);
    let (device, stream) = setup();
    let pool = device_pool(device);
    let buffer = filled(&pool, 0x43, &stream);
    let (tx1, rx1) = pair();
    let (tx2, rx2) = pair();
    tx1.send_buffers(&[&buffer]).unwrap();
    tx2.send_buffers(&[&buffer]).unwrap();
    let (first, second) = (expect_resource(&rx1, &stream), expect_resource(&rx2, &stream));
    if let Some(same_handle) = same_handle {
        assert_eq!(Arc::ptr_eq(&first, &second), same_handle);
    }
    let (one, two) = (expect_buffers(&rx1, &stream), expect_buffers(&rx2, &stream));
    assert_eq!(read(&one[0], &stream), read(&two[0], &stream));
}

#[test]
fn one_pool_on_two_channels_maps_the_same_memory() {
    in_simulated_machine("one_pool_on_two_channels_maps_the_same_memory", &[], || one_pool_on_two_channels(false));
}

#[test]
fn one_pool_on_two_channels_when_the_driver_returns_one_handle() {
    in_simulated_machine("one_pool_on_two_channels_when_the_driver_returns_one_handle", SAME_HANDLE, || {
        one_pool_on_two_channels(true)
    });
}

// ---------------------------------------------------------------------------------------------
// A hostile peer.

#[test]
fn a_peer_cannot_name_a_pool_another_channel_received() {
    let (device, stream) = setup();
    let pool = device_pool(device);
    let buffer = filled(&pool, 0x51, &stream);
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer]).unwrap();
    let _legit = expect_resource(&rx, &stream);
    let legit = expect_buffers(&rx, &stream);

    // Another peer names that pool (it learnt the descriptor somehow) without sending it.
    let (peer, other) = from_raw_peer();
    peer.send(BUFFERS, &buffers_payload(&[buffer_descriptor(&buffer).unwrap()]), &[]).unwrap();
    let error = other.recv(&stream).unwrap_err();
    assert!(matches!(error, IpcError::UnknownResource(uuid) if uuid == uuid_of(&pool)), "{error}");
    assert!(error.to_string().contains("only through the pools it received itself"), "{error}");
    assert_eq!(cuda_mem_core::import_holders(legit[0].ptr()), 1, "nothing new mapped");
    assert_eq!(read(&legit[0], &stream), vec![0x51; 4096], "the first channel's buffer is intact");
}

#[test]
fn a_peer_squatting_a_known_uuid_gets_only_its_own_pool() {
    let (device, stream) = setup();
    let genuine_pool = device_pool(device);
    let genuine = filled(&genuine_pool, 0x52, &stream);
    let uuid = uuid_of(&genuine_pool);
    let (tx, rx) = pair();
    tx.send_buffers(&[&genuine]).unwrap();
    let legit = expect_resource(&rx, &stream);
    let legit_buffers = expect_buffers(&rx, &stream);

    // The squatter sends a pool of its own under the genuine pool's UUID.
    let squat_pool = device_pool(device);
    let (peer, other) = from_raw_peer();
    send_pool(&peer, &squat_pool, &as_device(uuid, device));
    let squatted = expect_resource(&other, &stream);
    assert!(!Arc::ptr_eq(&squatted, &legit), "the genuine import is not handed to another peer");
    assert_ne!(squatted.imported_pool().handle(), legit.imported_pool().handle());
    assert!(Arc::ptr_eq(&registry().get(uuid).unwrap(), &legit), "the process's import of the UUID stays");
    // Buffers of the genuine pool named through the squatted UUID do not map the genuine memory.
    peer.send(BUFFERS, &buffers_payload(&[buffer_descriptor(&genuine).unwrap()]), &[]).unwrap();
    let error = other.recv(&stream).unwrap_err();
    // The simulator's code is `INVALID_VALUE`, the peer's error; a GPU's is not known yet.
    assert!(
        matches!(error, IpcError::BufferImport { resource, .. } if resource == uuid)
            || !cuda_sim::testing::on_simulator() && matches!(error, IpcError::Core(_)),
        "the driver refuses another pool's allocation, the peer's error: {error}"
    );
    assert!(error.channel_usable() && error.cuda_code().is_some(), "{error}");
    // The genuine channel is untouched.
    tx.send_buffers(&[&genuine]).unwrap();
    let again = expect_buffers(&rx, &stream);
    assert_eq!(again[0].ptr(), legit_buffers[0].ptr());
    assert_eq!(read(&again[0], &stream), vec![0x52; 4096]);
}

#[test]
fn a_squatter_that_comes_first_does_not_capture_the_genuine_pool() {
    let (device, stream) = setup();
    let genuine_pool = device_pool(device);
    let genuine = filled(&genuine_pool, 0x53, &stream);
    let uuid = uuid_of(&genuine_pool);
    let squat_pool = device_pool(device);
    let (peer, other) = from_raw_peer();
    send_pool(&peer, &squat_pool, &as_device(uuid, device));
    let squatted = expect_resource(&other, &stream);

    let (tx, rx) = pair();
    tx.send_buffers(&[&genuine]).unwrap();
    let legit = expect_resource(&rx, &stream);
    assert!(!Arc::ptr_eq(&legit, &squatted), "the genuine channel gets the genuine pool");
    let buffers = expect_buffers(&rx, &stream);
    assert_eq!(read(&buffers[0], &stream), vec![0x53; 4096]);
}

#[test]
fn a_squatter_that_comes_first_does_not_capture_the_uuid_for_from_fd() {
    let (device, stream) = setup();
    let genuine_pool = device_pool(device);
    let genuine = filled(&genuine_pool, 0x55, &stream);
    let uuid = uuid_of(&genuine_pool);
    let squat_pool = device_pool(device);
    let (peer, other) = from_raw_peer();
    send_pool(&peer, &squat_pool, &as_device(uuid, device));
    let squatted = expect_resource(&other, &stream);
    assert!(Arc::ptr_eq(&registry().get(uuid).unwrap(), &squatted), "registered under the UUID the peer named");

    // The program imports the genuine pool by its own descriptor: the driver cannot confirm the
    // peer's import is that pool, so the program's import replaces it in the registry.
    let handle = allocation_handle(genuine_pool.as_ref()).unwrap();
    let mine = MappedMemoryResource::from_fd(handle.fd(), uuid).unwrap();
    assert!(!Arc::ptr_eq(&mine, &squatted), "the genuine descriptor gives the genuine pool");
    assert!(Arc::ptr_eq(&registry().get(uuid).unwrap(), &mine));
    assert!(Arc::ptr_eq(&lookup(uuid, PoolKind::Device(device)).unwrap(), &mine));
    let buffer = mine.import_buffer(&buffer_descriptor(&genuine).unwrap(), &stream).unwrap();
    assert_eq!(read(&buffer, &stream), vec![0x55; 4096]);
    // The program's own import is trusted from now on; the peer's channel keeps its own pool.
    assert!(Arc::ptr_eq(&MappedMemoryResource::from_fd(handle.fd(), uuid).unwrap(), &mine));
    assert!(Arc::ptr_eq(&other.resource(uuid).unwrap(), &squatted));
}

/// A pool a peer sent first, then imported by the program from its own descriptor: the peer's
/// import when the driver confirms it is the same pool (it answers with that import's handle),
/// else an import of the program's own that takes its place; either maps the same memory.
fn a_pool_a_peer_sent_then_from_fd(same_handle: bool) {
    // On a real driver the answer to a second import is the driver's own (the GPU probe
    // pool-import-twice reports it): the invariants are checked, not the simulator's model.
    let same_handle = cuda_sim::testing::on_simulator().then_some(same_handle);
    let (device, stream) = setup();
    let pool = device_pool(device);
    let buffer = filled(&pool, 0x56, &stream);
    let (tx, rx) = pair();
    tx.send_buffers(&[&buffer]).unwrap();
    let received = expect_resource(&rx, &stream);
    let via_channel = expect_buffers(&rx, &stream);
    let handle = allocation_handle(pool.as_ref()).unwrap();
    let mine = MappedMemoryResource::from_fd(handle.fd(), handle.uuid()).unwrap();
    if let Some(same_handle) = same_handle {
        assert_eq!(Arc::ptr_eq(&mine, &received), same_handle, "confirmed only by the driver");
    }
    assert!(Arc::ptr_eq(&registry().get(handle.uuid()).unwrap(), &mine));
    match mine.import_buffer(&buffer_descriptor(&buffer).unwrap(), &stream) {
        Ok(imported) => assert_eq!(read(&imported, &stream), vec![0x56; 4096]),
        // Two handles of one pool, and a driver that maps the allocation where the channel's
        // import holds it already (GPU probe pointer-import-two-pools): refused, left alone.
        Err(IpcError::Core(cuda_mem_core::Error::Sharing(cuda_mem_core::SharingError::ImportHeldElsewhere {
            ptr,
        }))) => {
            assert!(!Arc::ptr_eq(&mine, &received) && ptr == via_channel[0].ptr());
        }
        Err(error) => panic!("{error}"),
    }
    assert_eq!(read(&via_channel[0], &stream), vec![0x56; 4096]);
}

#[test]
fn a_pool_a_peer_sent_is_imported_again_unless_the_driver_confirms_it() {
    in_simulated_machine("a_pool_a_peer_sent_is_imported_again_unless_the_driver_confirms_it", &[], || {
        a_pool_a_peer_sent_then_from_fd(false)
    });
}

#[test]
fn a_pool_a_peer_sent_is_shared_when_the_driver_confirms_it() {
    in_simulated_machine("a_pool_a_peer_sent_is_shared_when_the_driver_confirms_it", SAME_HANDLE, || {
        a_pool_a_peer_sent_then_from_fd(true)
    });
}

#[test]
fn device_memory_labelled_pinned_is_refused() {
    in_simulated_machine("device_memory_labelled_pinned_is_refused", &[], || {
        let (device, stream) = setup();
        let pool = device_pool(device);
        let buffer = filled(&pool, 0x54, &stream);
        let uuid = uuid_of(&pool);
        let pools = live_pools();
        let (peer, rx) = from_raw_peer();
        send_pool(&peer, &pool, &as_pinned(uuid));
        let error = rx.recv(&stream).unwrap_err();
        assert!(
            matches!(
                error,
                IpcError::MisdescribedResource { uuid: u, claimed: PoolKind::Pinned, actual: PoolKind::Device(d) }
                    if u == uuid && d == device
            ),
            "{error}"
        );
        assert!(error.to_string().contains("as a pinned host memory pool, but the driver reports a device"), "{error}");
        assert_eq!(live_pools(), pools, "nothing stayed imported");
        assert!(rx.resource(uuid).is_none() && registry().get(uuid).is_err());
        // Buffers that would have relied on it are unknown; the exporter's pool is intact.
        peer.send(BUFFERS, &buffers_payload(&[buffer_descriptor(&buffer).unwrap()]), &[]).unwrap();
        assert!(matches!(rx.recv(&stream), Err(IpcError::UnknownResource(_))));
        assert_eq!(read(&buffer, &stream), vec![0x54; 4096]);
        // Described truthfully, the same pool is taken.
        send_pool(&peer, &pool, &as_device(uuid, device));
        assert_eq!(expect_resource(&rx, &stream).kind(), PoolKind::Device(device));
    });
}

#[test]
fn pinned_memory_labelled_device_is_refused() {
    let (device, stream) = setup();
    let pool = pinned_pool(device);
    let handle = allocation_handle(pool.as_ref()).unwrap();
    let (peer, rx) = from_raw_peer();
    peer.send(RESOURCE, &as_device(handle.uuid(), device), &[handle.fd()]).unwrap();
    let error = rx.recv(&stream).unwrap_err();
    assert!(
        matches!(error, IpcError::MisdescribedResource { claimed: PoolKind::Device(_), actual: PoolKind::Pinned, .. }),
        "{error}"
    );
    peer.send(RESOURCE, &as_pinned(handle.uuid()), &[handle.fd()]).unwrap();
    assert_eq!(expect_resource(&rx, &stream).kind(), PoolKind::Pinned);
}

#[test]
fn a_buffer_count_over_the_limit_is_reported_as_such() {
    let (_device, stream) = setup();
    let (peer, rx) = from_raw_peer();
    let count = MAX_BUFFERS_PER_MESSAGE + 1;
    let mut payload = (count as u32).to_le_bytes().to_vec();
    payload.resize(4 + count * cuda_mem_ipc::wire::BUFFER_DESCRIPTOR_LEN, 0);
    // More than a socket buffer holds: sent while the receiver reads.
    let received = std::thread::scope(|scope| {
        scope.spawn(|| peer.send(BUFFERS, &payload, &[]).unwrap());
        rx.recv(&stream)
    });
    let error = received.unwrap_err();
    let expected = BuffersMessageError::TooManyBuffers { count, max: MAX_BUFFERS_PER_MESSAGE };
    assert!(matches!(&error, IpcError::Protocol(ProtocolError::BuffersMessage(e)) if *e == expected), "{error:?}");
    let text = error.to_string();
    assert!(text.contains(&format!("for {count} buffers; the most one message may carry is 65536")), "{text}");
}
