//! Pools and buffers shared between processes: a parent and its children (the test binary run
//! again for one test, see `common`) read and write the same memory.
//!
//! Every exchange follows the rule that makes it correct on a GPU: whoever wrote synchronizes
//! its stream before telling the other side (the helpers `write_bytes` and `read_bytes` wait for
//! their copies).

#[macro_use]
mod common;

use std::sync::Arc;

use common::*;
use cuda_mem_core::{Buffer, MemoryResource, MemoryResourceExt, PoolKind, Stream};
use cuda_mem_ipc::{IpcError, MappedMemoryResource, allocation_handle, registry};
use uuid::Uuid;

/// Whether `buffer` is owned by `resource` (the same object).
fn belongs_to(buffer: &Buffer, resource: &Arc<MappedMemoryResource>) -> bool {
    let owner = buffer.resource().expect("an owning buffer");
    std::ptr::addr_eq(Arc::as_ptr(owner), Arc::as_ptr(resource))
}

fn uuid_of(resource: &dyn MemoryResource) -> Uuid {
    allocation_handle(resource).expect("an IPC-enabled resource").uuid()
}

fn uuids_from(bytes: &[u8]) -> Vec<Uuid> {
    assert_eq!(bytes.len() % 16, 0, "whole UUIDs");
    bytes.chunks_exact(16).map(|c| Uuid::from_slice(c).expect("16 bytes")).collect()
}

fn used_mem(resource: &dyn MemoryResource) -> u64 {
    resource.memory_pool().expect("a pool").attributes().expect("pool attributes").used_mem_current
}

fn assert_no_drop_errors() {
    let errors = cuda_mem_core::take_drop_errors();
    assert!(errors.is_empty(), "errors while dropping: {errors:?}");
}

// ---------------------------------------------------------------------------------------------
// 1. One parent, one child, device and pinned pools.

const ROUND_TRIP_SIZES: [usize; 3] = [1 << 16, 1000, 1];

#[test]
fn device_pool_round_trip() {
    if let Some(role) = role() {
        return round_trip_child(&role);
    }
    let (device, stream) = setup();
    round_trip_parent(test_name!(), device_pool(device), &stream);
}

#[test]
fn pinned_pool_round_trip() {
    if let Some(role) = role() {
        return round_trip_child(&role);
    }
    let (device, stream) = setup();
    round_trip_parent(test_name!(), pinned_pool(device), &stream);
}

fn round_trip_parent<R: MemoryResource + 'static>(test: &str, pool: Arc<R>, stream: &Stream) {
    let pinned = pool.is_host_accessible();
    let mut buffers: Vec<Buffer> = ROUND_TRIP_SIZES.iter().map(|&n| pool.allocate(n, stream).unwrap()).collect();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        write_bytes(buffer, &pattern(1 + i as u32, buffer.size()), stream);
    }
    assert!(used_mem(&*pool) >= ROUND_TRIP_SIZES.iter().sum::<usize>() as u64);

    let (child, channel) = spawn_role(test, if pinned { "pinned" } else { "device" }, &[]);
    channel.send_data(uuid_of(&*pool).as_bytes()).unwrap();
    channel.send_buffers(&buffers.iter().collect::<Vec<_>>()).unwrap();
    expect_text(&channel, stream, "written");
    for (i, buffer) in buffers.iter().enumerate() {
        let expected = pattern(100 + i as u32, buffer.size());
        assert_eq!(read_bytes(buffer, stream), expected, "buffer {i}: the child's write");
        if pinned {
            // The exporter's own pinned buffers are not lent to the host (the child may write
            // them at any time), but they are copied out.
            let refused = buffer.host_slice().unwrap_err();
            assert!(matches!(refused, cuda_mem_core::Error::WritableElsewhere { .. }), "buffer {i}: {refused}");
            let copied = buffer.to_vec::<u8>(stream).unwrap();
            assert_eq!(copied, expected, "buffer {i} through to_vec");
        }
    }
    channel.send_data(b"done").unwrap();
    expect_text(&channel, stream, "released");
    child.wait_success();

    // The child's unmapping freed nothing of ours.
    for (i, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, stream), pattern(100 + i as u32, buffer.size()), "buffer {i} after the child");
    }
    drop(buffers);
    stream.synchronize().unwrap();
    assert_eq!(used_mem(&*pool), 0, "every buffer freed");
    assert_no_drop_errors();
}

fn round_trip_child(role: &str) {
    let (device, stream) = setup();
    let channel = parent_channel();
    let pinned = role == "pinned";
    let uuid = uuids_from(&expect_data(&channel, &stream))[0];

    let mapped = expect_resource(&channel, &stream);
    assert_eq!(mapped.uuid(), uuid, "the exporter's UUID");
    assert_eq!(mapped.kind(), if pinned { PoolKind::Pinned } else { PoolKind::Device(device) });
    assert!(Arc::ptr_eq(&registry().get(uuid).unwrap(), &mapped), "registered");

    let mut buffers = expect_buffers(&channel, &stream);
    assert_eq!(buffers.iter().map(Buffer::size).collect::<Vec<_>>(), ROUND_TRIP_SIZES);
    for (i, buffer) in buffers.iter().enumerate() {
        assert!(belongs_to(buffer, &mapped), "buffer {i} is mapped through the resource");
        assert_eq!(cuda_mem_core::import_holders(buffer.ptr()), 1);
        // Mapped memory is never lent to the host: the exporter may write it at any time.
        assert!(!buffer.is_host_accessible());
        let expected = pattern(1 + i as u32, buffer.size());
        assert_eq!(read_bytes(buffer, &stream), expected, "buffer {i} as the parent wrote it");
        assert!(buffer.host_slice().is_err(), "buffer {i}: no host slice of mapped memory");
    }
    for (i, buffer) in buffers.iter_mut().enumerate() {
        let new = pattern(100 + i as u32, buffer.size());
        assert!(buffer.host_slice_mut().is_err(), "buffer {i}: no host slice of mapped memory");
        write_bytes(buffer, &new, &stream);
    }
    stream.synchronize().unwrap();
    channel.send_data(b"written").unwrap();

    expect_text(&channel, &stream, "done");
    let pointers: Vec<_> = buffers.iter().map(Buffer::ptr).collect();
    drop(buffers);
    for ptr in pointers {
        assert_eq!(cuda_mem_core::import_holders(ptr), 0, "unmapped");
    }
    drop(mapped);
    assert!(registry().get(uuid).is_ok(), "the channel keeps what it received");
    assert!(channel.release_resource(uuid).is_some());
    assert!(matches!(registry().get(uuid), Err(IpcError::UnknownResource(_))), "unregistered with its resource");
    stream.synchronize().unwrap();
    assert_no_drop_errors();
    channel.send_data(b"released").unwrap();
}

// ---------------------------------------------------------------------------------------------
// 2. Several processes.

const SHARED_SIZE: usize = 1 << 16;

/// Two children map the same two buffers; both read everything, each writes its own half of
/// each, and each then sees the other's half.
#[test]
fn two_children_share_the_same_buffers() {
    if let Some(role) = role() {
        return two_children_child(role.parse().expect("a child index"));
    }
    let (device, stream) = setup();
    let pool = device_pool(device);
    let mut buffers: Vec<Buffer> = (0..2).map(|_| pool.allocate(SHARED_SIZE, &stream).unwrap()).collect();
    for (j, buffer) in buffers.iter_mut().enumerate() {
        write_bytes(buffer, &pattern(j as u32, SHARED_SIZE), &stream);
    }
    let children: Vec<_> = (0..2).map(|k| spawn_role(test_name!(), &k.to_string(), &[])).collect();
    for (_, channel) in &children {
        channel.send_buffers(&[&buffers[0], &buffers[1]]).unwrap();
    }
    for step in ["read", "wrote", "checked"] {
        for (_, channel) in &children {
            expect_text(channel, &stream, step);
        }
        for (_, channel) in &children {
            channel.send_data(b"next").unwrap();
        }
        if step == "wrote" {
            for (j, buffer) in buffers.iter().enumerate() {
                assert_eq!(read_bytes(buffer, &stream), two_children_expected(j), "buffer {j}");
            }
        }
    }
    for (child, _) in children {
        child.wait_success();
    }
    drop(buffers);
    stream.synchronize().unwrap();
    assert_eq!(used_mem(&*pool), 0);
}

/// What child `k` writes into its half of buffer `j`.
fn half_pattern(k: usize, j: usize) -> Vec<u8> {
    pattern(10 * (k as u32 + 1) + j as u32, SHARED_SIZE / 2)
}

fn two_children_expected(j: usize) -> Vec<u8> {
    [half_pattern(0, j), half_pattern(1, j)].concat()
}

fn two_children_child(k: usize) {
    let (_device, stream) = setup();
    let channel = parent_channel();
    let buffers = channel.recv_buffers(&stream).unwrap();
    assert_eq!(buffers.len(), 2);
    for (j, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, &stream), pattern(j as u32, SHARED_SIZE), "buffer {j} before any write");
    }
    channel.send_data(b"read").unwrap();
    expect_text(&channel, &stream, "next");

    let half = SHARED_SIZE / 2;
    for (j, buffer) in buffers.iter().enumerate() {
        let mut mine = view(buffer, k * half, half);
        write_bytes(&mut mine, &half_pattern(k, j), &stream);
    }
    stream.synchronize().unwrap();
    channel.send_data(b"wrote").unwrap();
    expect_text(&channel, &stream, "next");

    // Both children have written: each sees the other's half too.
    for (j, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, &stream), two_children_expected(j), "buffer {j} after both wrote");
    }
    channel.send_data(b"checked").unwrap();
    expect_text(&channel, &stream, "next");
}

/// One resource sent to two children, before the buffers exist; each child then gets only the
/// buffers (the resource is not sent again on that channel), and a second explicit send is a
/// registry hit there.
#[test]
fn one_resource_handle_sent_to_two_children() {
    if let Some(role) = role() {
        return one_resource_child(role.parse().expect("a child index"));
    }
    let (device, stream) = setup();
    let pool = pinned_pool(device);
    let fd = {
        use std::os::fd::AsRawFd;
        allocation_handle(&*pool).unwrap().fd().as_raw_fd()
    };
    let children: Vec<_> = (0..2).map(|k| spawn_role(test_name!(), &k.to_string(), &[])).collect();
    for (_, channel) in &children {
        channel.send_data(uuid_of(&*pool).as_bytes()).unwrap();
        channel.send_resource(&*pool).unwrap();
    }
    // Allocated after the resource went out: the children map them through what they have.
    let mut buffers: Vec<Buffer> = (0..2).map(|k| pool.allocate(4096 * (k + 1), &stream).unwrap()).collect();
    for (k, buffer) in buffers.iter_mut().enumerate() {
        write_bytes(buffer, &pattern(40 + k as u32, buffer.size()), &stream);
    }
    for ((_, channel), buffer) in children.iter().zip(&buffers) {
        channel.send_buffers(&[buffer]).unwrap();
        channel.send_resource(&*pool).unwrap();
    }
    for (k, ((_, channel), buffer)) in children.iter().zip(&buffers).enumerate() {
        expect_text(channel, &stream, "wrote");
        let written = buffer.to_vec::<u8>(&stream).unwrap();
        assert_eq!(written, pattern(50 + k as u32, buffer.size()), "child {k}'s write");
    }
    {
        use std::os::fd::AsRawFd;
        assert_eq!(allocation_handle(&*pool).unwrap().fd().as_raw_fd(), fd, "the pool was exported once");
    }
    for (child, channel) in children {
        channel.send_data(b"done").unwrap();
        child.wait_success();
    }
}

fn one_resource_child(k: usize) {
    let (_device, stream) = setup();
    let channel = parent_channel();
    let uuid = uuids_from(&expect_data(&channel, &stream))[0];
    let mapped = expect_resource(&channel, &stream);
    assert_eq!((mapped.uuid(), mapped.kind()), (uuid, PoolKind::Pinned));
    let mut buffers = expect_buffers(&channel, &stream);
    assert_eq!(buffers.len(), 1);
    let buffer = &mut buffers[0];
    assert_eq!(buffer.size(), 4096 * (k + 1));
    assert!(belongs_to(buffer, &mapped));
    assert_eq!(read_bytes(buffer, &stream), pattern(40 + k as u32, buffer.size()));
    let again = expect_resource(&channel, &stream);
    assert!(Arc::ptr_eq(&again, &mapped), "a resource received twice is the same mapped resource");
    write_bytes(buffer, &pattern(50 + k as u32, buffer.size()), &stream);
    channel.send_data(b"wrote").unwrap();
    expect_text(&channel, &stream, "done");
}

const SEVEN_SIZES: [usize; 7] = [4096, 1, 65536 + 3, 12345, 1 << 20, 777, 8];
/// Which of the three pools each of the seven buffers comes from.
const SEVEN_POOLS: [usize; 7] = [0, 1, 2, 0, 2, 1, 0];

/// Seven buffers from three pools (two device pools, one pinned) in one `send_buffers` call:
/// the three resources arrive first, in the order the buffers first name them, then one message
/// with the seven buffers, each mapped through its own resource; the child replies with a
/// checksum of each buffer's contents.
#[test]
fn seven_buffers_from_three_pools_in_one_message() {
    if let Some(_role) = role() {
        return seven_buffers_child();
    }
    let (device, stream) = setup();
    let pools: [Arc<dyn MemoryResource>; 3] = [device_pool(device), device_pool(device), pinned_pool(device)];
    let mut buffers: Vec<Buffer> =
        SEVEN_SIZES.iter().zip(SEVEN_POOLS).map(|(&n, p)| pools[p].allocate(n, &stream).unwrap()).collect();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        write_bytes(buffer, &pattern(200 + i as u32, buffer.size()), &stream);
    }
    let (child, channel) = spawn_role(test_name!(), "child", &[]);
    let uuids: Vec<u8> = pools.iter().flat_map(|p| uuid_of(p.as_ref()).into_bytes()).collect();
    channel.send_data(&uuids).unwrap();
    channel.send_buffers(&buffers.iter().collect::<Vec<_>>()).unwrap();
    let sums = decode_u64s(&expect_data(&channel, &stream));
    let expected: Vec<u64> =
        SEVEN_SIZES.iter().enumerate().map(|(i, &n)| checksum(&pattern(200 + i as u32, n))).collect();
    assert_eq!(sums, expected, "the child's checksum of each buffer");
    child.wait_success();
}

fn seven_buffers_child() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let uuids = uuids_from(&expect_data(&channel, &stream));
    let resources: Vec<_> = (0..3).map(|_| expect_resource(&channel, &stream)).collect();
    assert_eq!(resources.iter().map(|r| r.uuid()).collect::<Vec<_>>(), uuids, "resources in order of first use");
    let kinds: Vec<_> = resources.iter().map(|r| r.kind()).collect();
    assert_eq!(kinds, [PoolKind::Device(device), PoolKind::Device(device), PoolKind::Pinned]);
    let buffers = expect_buffers(&channel, &stream);
    assert_eq!(buffers.len(), 7);
    let mut sums = Vec::new();
    for (i, buffer) in buffers.iter().enumerate() {
        assert_eq!(buffer.size(), SEVEN_SIZES[i], "buffer {i}'s size");
        assert!(belongs_to(buffer, &resources[SEVEN_POOLS[i]]), "buffer {i}'s resource");
        let bytes = read_bytes(buffer, &stream);
        assert_eq!(bytes, pattern(200 + i as u32, SEVEN_SIZES[i]), "buffer {i}'s contents");
        if SEVEN_POOLS[i] == 2 {
            assert!(buffer.host_slice().is_err(), "pinned buffer {i}: no host slice of mapped memory");
        }
        sums.push(checksum(&bytes));
    }
    channel.send_data(&encode_u64s(&sums)).unwrap();
}

/// A→B→C: the parent sends buffers to child B, which sends the buffers it imported on to its
/// own child C; C writes, and A sees the writes.
#[test]
fn buffers_re_exported_to_a_grandchild() {
    if let Some(role) = role() {
        return match role.as_str() {
            "b" => re_export_b(test_name!()),
            "c" => re_export_c(),
            other => panic!("unknown role {other}"),
        };
    }
    let (device, stream) = setup();
    let device_resource = device_pool(device);
    let pinned_resource = pinned_pool(device);
    let mut buffers =
        [device_resource.allocate(32 << 10, &stream).unwrap(), pinned_resource.allocate(8000, &stream).unwrap()];
    for (k, buffer) in buffers.iter_mut().enumerate() {
        write_bytes(buffer, &pattern(300 + k as u32, buffer.size()), &stream);
    }
    let (b, channel) = spawn_role(test_name!(), "b", &[]);
    let uuids = [uuid_of(&*device_resource).into_bytes(), uuid_of(&*pinned_resource).into_bytes()].concat();
    channel.send_data(&uuids).unwrap();
    channel.send_buffers(&[&buffers[0], &buffers[1]]).unwrap();
    expect_text(&channel, &stream, "c wrote");
    for (k, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, &stream), pattern(400 + k as u32, buffer.size()), "C's write into buffer {k}");
    }
    channel.send_data(b"done").unwrap();
    b.wait_success();
}

fn re_export_b(test: &str) {
    let (_device, stream) = setup();
    let parent = parent_channel();
    let uuids = expect_data(&parent, &stream);
    // Two pools, then their buffers.
    let buffers = parent.recv_buffers(&stream).unwrap();
    for (k, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, &stream), pattern(300 + k as u32, buffer.size()), "B reads buffer {k}");
    }
    let (c, channel) = spawn_role(test, "c", &[]);
    channel.send_data(&uuids).unwrap();
    channel.send_buffers(&buffers.iter().collect::<Vec<_>>()).unwrap();
    expect_text(&channel, &stream, "c wrote");
    c.wait_success();
    for (k, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, &stream), pattern(400 + k as u32, buffer.size()), "B sees C's write {k}");
    }
    parent.send_data(b"c wrote").unwrap();
    expect_text(&parent, &stream, "done");
}

fn re_export_c() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let uuids = uuids_from(&expect_data(&channel, &stream));
    let resources = [expect_resource(&channel, &stream), expect_resource(&channel, &stream)];
    assert_eq!([resources[0].uuid(), resources[1].uuid()], [uuids[0], uuids[1]], "A's UUIDs, through B");
    assert_eq!([resources[0].kind(), resources[1].kind()], [PoolKind::Device(device), PoolKind::Pinned]);
    let mut buffers = expect_buffers(&channel, &stream);
    assert_eq!(buffers.iter().map(Buffer::size).collect::<Vec<_>>(), [32 << 10, 8000]);
    for (k, buffer) in buffers.iter_mut().enumerate() {
        assert!(belongs_to(buffer, &resources[k]));
        assert_eq!(read_bytes(buffer, &stream), pattern(300 + k as u32, buffer.size()), "C reads buffer {k}");
        write_bytes(buffer, &pattern(400 + k as u32, buffer.size()), &stream);
    }
    stream.synchronize().unwrap();
    channel.send_data(b"c wrote").unwrap();
}

const WORKERS: usize = 4;
const JOBS: usize = 100;

fn job_size(i: usize) -> usize {
    512 + 97 * i
}

/// Four worker processes; the parent hands out 100 buffers (from a device and a pinned pool)
/// round-robin, each worker adds one to every byte of each buffer it gets and acknowledges it.
#[test]
fn a_pool_of_four_workers_processes_100_buffers() {
    if let Some(_role) = role() {
        return worker();
    }
    let (device, stream) = setup();
    let pools: [Arc<dyn MemoryResource>; 2] = [device_pool(device), pinned_pool(device)];
    let mut buffers: Vec<Buffer> = (0..JOBS).map(|i| pools[i % 2].allocate(job_size(i), &stream).unwrap()).collect();
    for (i, buffer) in buffers.iter_mut().enumerate() {
        write_bytes(buffer, &pattern(1000 + i as u32, buffer.size()), &stream);
    }
    let workers: Vec<_> = (0..WORKERS).map(|w| spawn_role(test_name!(), &format!("worker{w}"), &[])).collect();
    for (i, buffer) in buffers.iter().enumerate() {
        workers[i % WORKERS].1.send_buffers(&[buffer]).unwrap();
    }
    let incremented =
        |i: usize| pattern(1000 + i as u32, job_size(i)).iter().map(|b| b.wrapping_add(1)).collect::<Vec<u8>>();
    for (w, (_, channel)) in workers.iter().enumerate() {
        for i in (w..JOBS).step_by(WORKERS) {
            let ack = decode_u64s(&expect_data(channel, &stream));
            assert_eq!(ack, [i as u64 / WORKERS as u64, checksum(&incremented(i))], "worker {w}'s ack for buffer {i}");
        }
    }
    for (child, channel) in workers {
        channel.send_data(b"done").unwrap();
        child.wait_success();
    }
    for (i, buffer) in buffers.iter().enumerate() {
        assert_eq!(read_bytes(buffer, &stream), incremented(i), "buffer {i}");
    }
    drop(buffers);
    stream.synchronize().unwrap();
    assert_eq!(pools.iter().map(|p| used_mem(p.as_ref())).sum::<u64>(), 0);
}

fn worker() {
    let (_device, stream) = setup();
    let channel = parent_channel();
    let mut resources = Vec::new();
    let mut processed = 0u64;
    loop {
        match channel.recv(&stream) {
            Ok(cuda_mem_ipc::Received::Resource(resource)) => resources.push(resource),
            Ok(cuda_mem_ipc::Received::Buffers(mut buffers)) => {
                assert_eq!(buffers.len(), 1);
                let buffer = &mut buffers[0];
                let mut bytes = read_bytes(buffer, &stream);
                bytes.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                write_bytes(buffer, &bytes, &stream);
                let ptr = buffer.ptr();
                drop(buffers);
                assert_eq!(cuda_mem_core::import_holders(ptr), 0);
                channel.send_data(&encode_u64s(&[processed, checksum(&bytes)])).unwrap();
                processed += 1;
            }
            Ok(cuda_mem_ipc::Received::Data(bytes)) => {
                assert_eq!(bytes, b"done");
                break;
            }
            Ok(other) => panic!("worker: unexpected {other:?}"),
            Err(e) => panic!("worker: {e}"),
        }
    }
    assert_eq!(processed as usize, JOBS / WORKERS);
    assert!(!resources.is_empty() && resources.len() <= 2, "{} resources", resources.len());
}
