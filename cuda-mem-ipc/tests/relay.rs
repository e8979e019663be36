//! Passing on (A→B→C) what two peers sent under one UUID: a process that imported two different
//! pools named alike (each peer names its own pool, and the names are only the peers' word) and
//! forwards buffers of both on one channel sends the first pool only; the second is refused there
//! before anything of it is sent, so the receiver never maps its buffers through the first. Both
//! peers are played in this process (the simulator imports a process's own pools), by raw
//! channel messages that name the pools with one chosen UUID.

mod common;

use common::{pair, setup};
use std::sync::Arc;

use cuda_mem_core::{Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream};
use cuda_mem_ipc::{
    BufferDescriptor, Channel, IpcChannel, IpcError, MappedMemoryResource, Received, allocation_handle,
    buffer_descriptor,
};
use uuid::Uuid;

/// Message kinds on the wire (`IpcChannel`'s table).
const RESOURCE: u16 = 1;
const BUFFERS: u16 = 2;

/// A peer that sends its own pool `pool` and a buffer of it under the name `uuid`, on a channel
/// of its own to this process: what this side receives (the mapped pool and the buffer).
fn from_peer_named(
    uuid: Uuid,
    device: Device,
    pool: &DeviceMemoryResource,
    buffer: &Buffer,
    stream: &Stream,
) -> (Arc<MappedMemoryResource>, Buffer) {
    let (peer, here) = Channel::pair().unwrap();
    let here = IpcChannel::new(here);
    let mut resource = [0u8; 40];
    resource[..16].copy_from_slice(uuid.as_bytes());
    resource[17..21].copy_from_slice(&(device.ordinal() as i32).to_le_bytes());
    resource[24..40].copy_from_slice(&device.uuid().unwrap());
    peer.send(RESOURCE, &resource, &[allocation_handle(pool).unwrap().fd()]).unwrap();
    let descriptor = BufferDescriptor { resource: uuid, ..buffer_descriptor(buffer).unwrap() };
    let mut buffers = 1u32.to_le_bytes().to_vec();
    buffers.extend_from_slice(&descriptor.encode());
    peer.send(BUFFERS, &buffers, &[]).unwrap();
    let Received::Resource(mapped) = here.recv(stream).unwrap() else { panic!("the resource comes first") };
    let Received::Buffers(mut received) = here.recv(stream).unwrap() else { panic!("then the buffer") };
    (mapped, received.remove(0))
}

fn is_uuid_taken(error: &IpcError, uuid: Uuid) -> bool {
    matches!(error, IpcError::UuidTakenOnChannel { uuid: taken } if *taken == uuid)
        && error.to_string().contains(&uuid.to_string())
        && error.to_string().contains("send it on another channel")
}

#[test]
fn two_pools_imported_under_one_uuid_are_not_passed_on_as_one() {
    let (device, stream) = setup();
    let options = || DeviceMemoryResourceOptions::default().ipc_enabled(true);
    let (first_pool, second_pool) =
        (DeviceMemoryResource::new(device, options()).unwrap(), DeviceMemoryResource::new(device, options()).unwrap());
    let first_buffer = first_pool.allocate(4096, &stream).unwrap();
    let second_buffer = second_pool.allocate(8192, &stream).unwrap();
    let uuid = Uuid::new_v4();
    let (first, from_first) = from_peer_named(uuid, device, &first_pool, &first_buffer, &stream);
    let (second, from_second) = from_peer_named(uuid, device, &second_pool, &second_buffer, &stream);
    assert!(!Arc::ptr_eq(&first, &second), "two pools under one UUID, each its own import");
    assert_eq!((first.uuid(), second.uuid()), (uuid, uuid));

    let (out, next) = pair();
    out.send_buffers(&[&from_first]).unwrap();
    // The second pool, whether by its buffer (alone or beside the first's) or by itself: refused,
    // and nothing of it sent.
    for error in [
        out.send_buffers(&[&from_second]).unwrap_err(),
        out.send_buffers(&[&from_first, &from_second]).unwrap_err(),
        out.send_resource(second.as_ref()).unwrap_err(),
    ] {
        assert!(is_uuid_taken(&error, uuid), "{error:?}: {error}");
    }
    // The first pool goes on as before, and the channel is in step.
    out.send_buffers(&[&from_first]).unwrap();
    out.send_data(b"end").unwrap();

    let Received::Resource(kept) = next.recv(&stream).unwrap() else { panic!("the first pool") };
    assert_eq!(kept.uuid(), uuid);
    for _ in 0..2 {
        let Received::Buffers(buffers) = next.recv(&stream).unwrap() else { panic!("the first pool's buffer") };
        assert_eq!(buffers[0].size(), 4096);
        assert_eq!(buffer_descriptor(&buffers[0]).unwrap(), buffer_descriptor(&from_first).unwrap());
    }
    assert!(matches!(next.recv(&stream).unwrap(), Received::Data(bytes) if bytes == b"end"));
    next.release_resources();

    // One message naming both pools is refused before any resource is sent, on a fresh channel.
    let (out, next) = pair();
    let error = out.send_buffers(&[&from_first, &from_second]).unwrap_err();
    assert!(is_uuid_taken(&error, uuid), "{error}");
    // The second pool alone can go on a channel of its own.
    out.send_buffers(&[&from_second]).unwrap();
    let Received::Resource(kept) = next.recv(&stream).unwrap() else { panic!("only now a resource") };
    let Received::Buffers(buffers) = next.recv(&stream).unwrap() else { panic!("the second pool's buffer") };
    assert_eq!(buffers[0].size(), 8192);
    assert_eq!(buffer_descriptor(&buffers[0]).unwrap(), buffer_descriptor(&from_second).unwrap());
    drop((kept, buffers));
    stream.synchronize().unwrap();
    assert!(cuda_mem_core::take_drop_errors().is_empty());
}
