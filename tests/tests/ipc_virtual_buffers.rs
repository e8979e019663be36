//! Virtual buffers on the channel that carries pools, buffers and data (`cuda-mem-ipc`'s feature
//! `vmm`): one `IpcChannel` carries them all, in either order, to another process; the receiver
//! imports each virtual buffer with the resource it registered for where the memory lives; every
//! malformed virtual buffer is a typed error that closes the descriptors that came with it and
//! leaves the channel usable.

#[macro_use]
mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use common::*;
use cuda_mem_core::{Buffer, Device, HandleType, LegacyPinnedMemoryResource, Location, NumaNode, Stream};
use cuda_mem_ipc::wire::{EnvelopeError, SharedVirtualBufferError as Decode};
use cuda_mem_ipc::{IpcChannel, IpcError, MAX_BUFFER_SIZE, Received, SharedVirtualBuffer};
use cuda_mem_vmm::{
    ChunkHandle, DescriptorError, VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions, VmmError,
};
use cuda_sim::testing::open_fds;
use uuid::Uuid;

/// The granularity of every simulated device.
const G: usize = 2 << 20;

/// The wire kind of a virtual buffer.
const VIRTUAL_BUFFER: u16 = cuda_mem_ipc::wire::MessageKind::VirtualBuffer.code();

/// Writes `bytes` at the start of `buffer` through a pinned staging buffer, and waits.
fn write_virtual(buffer: &mut VirtualBuffer, bytes: &[u8], stream: &Stream) {
    assert_eq!(bytes.len(), buffer.size(), "write_virtual: sizes");
    let mut stage = LegacyPinnedMemoryResource::new(stream.device()).allocate(bytes.len(), stream).unwrap();
    stage.host_slice_mut().unwrap().copy_from_slice(bytes);
    buffer.copy_from(&stage, stream).unwrap();
    stream.synchronize().unwrap();
}

/// A virtual buffer of `chunks` chunks (one allocated, the others added by growth, one at a time)
/// holding
/// `pattern(seed)`.
fn virtual_buffer(resource: &Arc<VirtualMemoryResource>, chunks: usize, seed: u32, stream: &Stream) -> VirtualBuffer {
    let mut buffer = resource.allocate(G, stream).unwrap();
    for size in 2..=chunks {
        buffer = buffer.grow(size * G).unwrap();
    }
    assert_eq!(buffer.chunk_count(), chunks);
    write_virtual(&mut buffer, &pattern(seed, chunks * G), stream);
    buffer
}

/// What one receive gave, by kind.
#[derive(Default)]
struct Arrivals {
    kinds: Vec<&'static str>,
    resources: Vec<Arc<cuda_mem_ipc::MappedMemoryResource>>,
    buffers: Vec<Buffer>,
    virtual_buffers: Vec<VirtualBuffer>,
    data: Vec<Vec<u8>>,
}

/// Receives `n` messages, whatever their kinds.
fn receive(channel: &IpcChannel, stream: &Stream, n: usize) -> Arrivals {
    let mut arrivals = Arrivals::default();
    for _ in 0..n {
        match channel.recv(stream).unwrap() {
            Received::Resource(resource) => {
                arrivals.kinds.push("resource");
                arrivals.resources.push(resource);
            }
            Received::Buffers(buffers) => {
                arrivals.kinds.push("buffers");
                arrivals.buffers.extend(buffers);
            }
            Received::VirtualBuffer(buffer) => {
                arrivals.kinds.push("virtual buffer");
                arrivals.virtual_buffers.push(buffer);
            }
            Received::Data(bytes) => {
                arrivals.kinds.push("data");
                arrivals.data.push(bytes);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    arrivals
}

// ---------------------------------------------------------------------------------------------

/// A pool with two buffers, a three-chunk virtual buffer and data on one channel; then, on the
/// same channel, a virtual buffer first and a new pool with its buffer after. The child maps
/// everything, checks it, writes new patterns, and this process reads them.
#[test]
fn one_channel_carries_pools_buffers_virtual_buffers_and_data_in_both_orders() {
    if role().is_some() {
        return receiver();
    }
    let (device, stream) = setup();
    let pool = device_pool(device);
    let mut small = pool.allocate(4000, &stream).unwrap();
    let mut large = pool.allocate(G + 17, &stream).unwrap();
    write_bytes(&mut small, &pattern(1, 4000), &stream);
    write_bytes(&mut large, &pattern(2, G + 17), &stream);
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default()).unwrap();
    let three = virtual_buffer(&vmm, 3, 3, &stream);
    let (child, channel) = spawn_role(test_name!(), "receiver", &[]);

    // The pool first: its resource, its buffers, then the virtual buffer and data.
    channel.send_buffers(&[&small, &large]).unwrap();
    channel.send_virtual_buffer(&three).unwrap();
    channel.send_data(b"pool first").unwrap();
    expect_text(&channel, &stream, "written");
    assert_eq!(read_bytes(&small, &stream), pattern(11, 4000), "the child's write into a pool buffer");
    assert_eq!(read_bytes(&large, &stream), pattern(12, G + 17));
    assert_eq!(read_bytes(three.as_buffer(), &stream), pattern(13, 3 * G), "the child's write into the virtual buffer");

    // The virtual buffer first, then data, then another pool and its buffer.
    let one = virtual_buffer(&vmm, 1, 4, &stream);
    let second_pool = device_pool(device);
    let mut other = second_pool.allocate(3000, &stream).unwrap();
    write_bytes(&mut other, &pattern(5, 3000), &stream);
    channel.send_virtual_buffer(&one).unwrap();
    channel.send_data(b"virtual buffer first").unwrap();
    channel.send_buffers(&[&other]).unwrap();
    expect_text(&channel, &stream, "written");
    assert_eq!(read_bytes(one.as_buffer(), &stream), pattern(14, G));
    assert_eq!(read_bytes(&other, &stream), pattern(15, 3000));
    channel.send_data(b"done").unwrap();
    child.wait_success();
}

fn receiver() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default()).unwrap();
    assert!(channel.import_virtual_buffers_into(Arc::clone(&vmm)).is_none(), "nothing registered before");
    let fds = open_fds();

    let mut first = receive(&channel, &stream, 4);
    assert_eq!(first.kinds, ["resource", "buffers", "virtual buffer", "data"]);
    assert_eq!(first.data, [b"pool first"]);
    let three = &mut first.virtual_buffers[0];
    assert!(three.is_imported());
    assert!(Arc::ptr_eq(three.resource(), &vmm), "imported with the registered resource");
    assert_eq!((three.size(), three.chunk_count()), (3 * G, 3));
    assert_eq!(read_bytes(three.as_buffer(), &stream), pattern(3, 3 * G));
    assert_eq!(read_bytes(&first.buffers[0], &stream), pattern(1, 4000));
    assert_eq!(read_bytes(&first.buffers[1], &stream), pattern(2, G + 17));
    write_virtual(three, &pattern(13, 3 * G), &stream);
    write_bytes(&mut first.buffers[0], &pattern(11, 4000), &stream);
    write_bytes(&mut first.buffers[1], &pattern(12, G + 17), &stream);
    channel.send_data(b"written").unwrap();

    let mut second = receive(&channel, &stream, 4);
    assert_eq!(second.kinds, ["virtual buffer", "data", "resource", "buffers"]);
    assert_eq!(second.data, [b"virtual buffer first"]);
    let one = &mut second.virtual_buffers[0];
    assert_eq!((one.size(), one.chunk_count()), (G, 1));
    assert_eq!(read_bytes(one.as_buffer(), &stream), pattern(4, G));
    assert_eq!(read_bytes(&second.buffers[0], &stream), pattern(5, 3000));
    write_virtual(one, &pattern(14, G), &stream);
    write_bytes(&mut second.buffers[0], &pattern(15, 3000), &stream);
    channel.send_data(b"written").unwrap();
    expect_text(&channel, &stream, "done");
    // Nothing received holds a descriptor once it is gone (the channel's own goes with it).
    drop((first, second, channel));
    assert_eq!(open_fds(), fds - 1, "every descriptor that came over the channel is closed");
}

// ---------------------------------------------------------------------------------------------

/// The malformed virtual buffers the parent sends, in order, each named; then a valid one.
const REFUSALS: [&str; 22] = [
    "nothing registered",
    "magic",
    "version 1",
    "checksum",
    "flags",
    "reserved",
    "handle type",
    "location code",
    "too many chunks",
    "a count past the bytes",
    "a zero chunk",
    "a size too large",
    "size 0 with chunks",
    "a nil device",
    "a device this process cannot see",
    "host memory nothing is registered for",
    "one fd too few",
    "one fd too many",
    "fds with fabric handles",
    "a chunk off the granularity",
    "a chunk size the driver refuses",
    "one chunk's descriptor twice",
];

/// CRC-32 (IEEE), bit by bit: to re-seal bytes this test changes on purpose.
fn crc32(bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |mut crc, &b| {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { 0xEDB8_8320 ^ (crc >> 1) } else { crc >> 1 };
        }
        crc
    })
}

/// `bytes` with `value` at `at` and, when `seal`, a checksum that matches again.
fn patched(mut bytes: Vec<u8>, at: usize, value: &[u8], seal: bool) -> Vec<u8> {
    bytes[at..at + value.len()].copy_from_slice(value);
    if seal {
        let end = bytes.len() - 4;
        let checksum = crc32(&bytes[..end]);
        bytes[end..].copy_from_slice(&checksum.to_le_bytes());
    }
    bytes
}

/// The bytes and descriptors of the refusal `name` for a two-chunk virtual buffer: its export,
/// spoiled in bytes (re-sealed unless the checksum is the point) or in fields (then encoded).
fn spoiled(name: &str, buffer: &VirtualBuffer) -> (Vec<u8>, Vec<OwnedFd>) {
    let mut shared = SharedVirtualBuffer::export(buffer).unwrap();
    match name {
        "a zero chunk" => shared.descriptor.chunk_sizes[0] = 0,
        "a size too large" => shared.descriptor.size = MAX_BUFFER_SIZE + 1,
        "size 0 with chunks" => shared.descriptor.size = 0,
        "a chunk off the granularity" => shared.descriptor.chunk_sizes[1] = (G + 4096) as u64,
        "a chunk size the driver refuses" => shared.descriptor.chunk_sizes[1] = 2 * G as u64,
        _ => {}
    }
    let (bytes, fds) = shared.encode();
    let mut fds: Vec<OwnedFd> = fds.iter().map(|fd| fd.try_clone_to_owned().unwrap()).collect();
    let bytes = match name {
        "magic" => patched(bytes, 0, b"CUMEMBUF", false),
        "version 1" => patched(bytes, 8, &1u16.to_le_bytes(), false),
        "checksum" => patched(bytes, 40, &[0xFF], false),
        "flags" => patched(bytes, 10, &[0, 1], true),
        "reserved" => patched(bytes, 12, &[1, 0, 0, 0], true),
        "handle type" => patched(bytes, 16, &[0], true),
        "location code" => patched(bytes, 17, &[9], true),
        // The location: its code (17), the sender's ordinal or NUMA node (20..24) and the
        // device's UUID (24..40).
        "a nil device" => patched(patched(bytes, 20, &7i32.to_le_bytes(), false), 24, Uuid::nil().as_bytes(), true),
        "a device this process cannot see" => {
            let elsewhere = Uuid::from_u128(0x0bad_0000_de71_ce00);
            patched(patched(bytes, 20, &7i32.to_le_bytes(), false), 24, elsewhere.as_bytes(), true)
        }
        "host memory nothing is registered for" => {
            let host = patched(bytes, 17, &[2], false);
            patched(patched(host, 20, &0i32.to_le_bytes(), false), 24, &[0; 16], true)
        }
        "too many chunks" => patched(bytes, 18, &254u16.to_le_bytes(), true),
        "a count past the bytes" => patched(bytes, 18, &3u16.to_le_bytes(), true),
        "fds with fabric handles" => {
            shared.descriptor.handle_type = HandleType::Fabric;
            shared.descriptor.handles = vec![ChunkHandle::Fabric([1; 64]), ChunkHandle::Fabric([2; 64])];
            shared.encode().0
        }
        _ => bytes,
    };
    match name {
        "one fd too few" => drop(fds.pop()),
        "one fd too many" => fds.push(fds[0].try_clone().unwrap()),
        // The first chunk's descriptor in the second's place: its memory twice.
        "one chunk's descriptor twice" => fds[1] = fds[0].try_clone().unwrap(),
        _ => {}
    }
    (bytes, fds)
}

/// Whether `error` is the refusal `name` must give.
fn refused_as(name: &str, error: &IpcError) -> bool {
    let decode = |expected: fn(&Decode) -> bool| matches!(error, IpcError::SharedVirtualBuffer(e) if expected(e));
    match name {
        "nothing registered" => {
            matches!(error, IpcError::NoVirtualMemoryResource { location: Location::Device(d) } if d.ordinal() == 0)
        }
        "magic" => {
            decode(|e| matches!(e, Decode::Envelope(EnvelopeError::Magic { found, .. }) if found == b"CUMEMBUF"))
        }
        "version 1" => {
            decode(|e| matches!(e, Decode::Envelope(EnvelopeError::UnsupportedVersion { found: 1, supported: 2 })))
        }
        "checksum" => decode(|e| matches!(e, Decode::Envelope(EnvelopeError::Checksum { .. }))),
        "flags" => decode(|e| matches!(e, Decode::Envelope(EnvelopeError::Flags { found: 0x100 }))),
        "reserved" => decode(|e| matches!(e, Decode::Envelope(EnvelopeError::Reserved { found: 1 }))),
        "handle type" => decode(|e| matches!(e, Decode::HandleType { found: 0 })),
        "location code" => decode(|e| matches!(e, Decode::Location { found: 9 })),
        "too many chunks" => decode(|e| matches!(e, Decode::TooManyChunks { count: 254, max: 253 })),
        "a count past the bytes" => decode(|e| matches!(e, Decode::Length { count: 3, .. })),
        "a zero chunk" => decode(|e| matches!(e, Decode::ChunkSize { chunk: 1, size: 0, .. })),
        "a size too large" => decode(|e| matches!(e, Decode::SizeTooLarge { .. })),
        "size 0 with chunks" => decode(|e| matches!(e, Decode::ZeroSizeWithChunks { count: 2 })),
        "a nil device" => decode(|e| matches!(e, Decode::NilDevice)),
        "a device this process cannot see" => {
            matches!(error, IpcError::DeviceNotVisible { sender_ordinal: 7, .. })
        }
        "host memory nothing is registered for" => {
            matches!(error, IpcError::NoVirtualMemoryResource { location: Location::HostNuma(NumaNode(0)) })
        }
        "one fd too few" => decode(|e| matches!(e, Decode::FdCount { fds: 1, count: 2 })),
        "one fd too many" => decode(|e| matches!(e, Decode::FdCount { fds: 3, count: 2 })),
        "fds with fabric handles" => decode(|e| matches!(e, Decode::FdsWithFabricHandles { fds: 2 })),
        "a chunk off the granularity" => {
            matches!(error, IpcError::Vmm(VmmError::Descriptor(DescriptorError::ChunkSize { size, .. })) if *size == (G + 4096) as u64)
        }
        "a chunk size the driver refuses" => {
            matches!(error, IpcError::Vmm(e @ VmmError::ChunkMap { chunk: 2, count: 2, .. }) if e.cuda_code().is_some())
        }
        "one chunk's descriptor twice" => {
            matches!(error, IpcError::Vmm(VmmError::Descriptor(DescriptorError::RepeatedChunk { chunk: 2, first: 1 })))
        }
        other => panic!("no expectation for {other:?}"),
    }
}

/// Each malformed virtual buffer gets its typed error in a child process, whose descriptors are
/// back where they were after each; then a valid one still arrives on the same channel.
#[test]
fn malformed_virtual_buffers_are_refused_with_their_descriptors_closed() {
    if role().is_some() {
        return refuser();
    }
    let (device, stream) = setup();
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default()).unwrap();
    let two = virtual_buffer(&vmm, 2, 21, &stream);
    let (child, channel) = spawn_role(test_name!(), "refuser", &[]);
    for name in REFUSALS {
        let (bytes, fds) = spoiled(name, &two);
        let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
        channel.channel().send(VIRTUAL_BUFFER, &bytes, &borrowed).unwrap();
    }
    channel.send_virtual_buffer(&two).unwrap();
    let texts = String::from_utf8(expect_data(&channel, &stream)).unwrap();
    for needle in [
        "no VirtualMemoryResource is registered on this channel",
        "import_virtual_buffers_into",
        "invalid virtual buffer descriptor: magic is b\"CUMEMBUF\", expected b\"CUMEMVMM\"",
        "version 1, expected 2",
        "checksum mismatch",
        "254 chunks, more than the 253",
        "2 file descriptors came with fabric handles",
        "1 file descriptors for 2 chunks",
        "CUDA_VISIBLE_DEVICES",
        "mapping chunk 2 of 2",
        "buffer size 0 with 2 chunks",
        "chunk 2 is the memory of chunk 1 again",
    ] {
        assert!(texts.contains(needle), "{needle:?} not in the child's errors:\n{texts}");
    }
    expect_text(&channel, &stream, "imported");
    child.wait_success();
}

fn refuser() {
    let (device, stream) = setup();
    let channel = parent_channel();
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default()).unwrap();
    // Whatever the driver opens once is open before descriptors are counted.
    drop(vmm.allocate(G, &stream).unwrap().export().unwrap());
    let mut texts = Vec::new();
    for name in REFUSALS {
        let fds = open_fds();
        let error = match channel.recv(&stream) {
            Err(error) => error,
            Ok(other) => panic!("{name}: accepted as {other:?}"),
        };
        assert!(refused_as(name, &error), "{name}: refused as {error:?}");
        assert_eq!(open_fds(), fds, "{name}: the descriptors that came with it are closed");
        texts.push(error.to_string());
        if name == "nothing registered" {
            channel.import_virtual_buffers_into(Arc::clone(&vmm));
        }
    }
    channel.send_data(texts.join("\n").as_bytes()).unwrap();
    let fds = open_fds();
    let Received::VirtualBuffer(buffer) = channel.recv(&stream).unwrap() else { panic!("expected the valid one") };
    assert_eq!(read_bytes(buffer.as_buffer(), &stream), pattern(21, 2 * G), "the channel is still in step");
    drop(buffer);
    assert_eq!(open_fds(), fds);
    channel.send_data(b"imported").unwrap();
}

// ---------------------------------------------------------------------------------------------

/// Each virtual buffer is imported with the resource registered for where its memory lives: the
/// device (found by UUID) or the host NUMA node; registering another for a location replaces the
/// first.
#[test]
fn each_virtual_buffer_goes_to_the_resource_registered_for_its_location() {
    cuda_sim::testing::in_simulated_machine(test_name!(), &[("CUDA_SIM_DEVICES", "2")], || {
        let (device0, stream) = setup();
        let count = Device::count().unwrap();
        let numa =
            VirtualMemoryResourceOptions::default().location(Location::HostNuma(device0.host_numa_node().unwrap()));
        let (a, b) = cuda_mem_ipc::Channel::pair().unwrap();
        let (sender, receiver) = (IpcChannel::new(a), IpcChannel::new(b));

        let on_device_0 = VirtualMemoryResource::new(device0, Default::default()).unwrap();
        let on_numa = VirtualMemoryResource::new(device0, numa.clone()).unwrap();
        let replaced = VirtualMemoryResource::new(device0, Default::default()).unwrap();
        assert!(receiver.import_virtual_buffers_into(Arc::clone(&replaced)).is_none());
        assert!(receiver.import_virtual_buffers_into(Arc::clone(&on_numa)).is_none());
        let previous = receiver.import_virtual_buffers_into(Arc::clone(&on_device_0));
        assert!(previous.is_some_and(|p| Arc::ptr_eq(&p, &replaced)), "one resource per location");

        let device1 = (count >= 2).then(|| Device::new(1).unwrap());
        let mut cases = vec![
            (VirtualMemoryResource::new(device0, Default::default()).unwrap(), Arc::clone(&on_device_0)),
            (VirtualMemoryResource::new(device0, numa).unwrap(), Arc::clone(&on_numa)),
        ];
        if let Some(device1) = device1 {
            let on_device_1 = VirtualMemoryResource::new(device1, Default::default()).unwrap();
            assert!(receiver.import_virtual_buffers_into(Arc::clone(&on_device_1)).is_none());
            cases.push((VirtualMemoryResource::new(device1, Default::default()).unwrap(), on_device_1));
        }
        for (seed, (exporter, importer)) in cases.into_iter().enumerate() {
            let seed = 30 + seed as u32;
            let stream = if exporter.device() == device0 {
                stream.clone()
            } else {
                Stream::new(exporter.device(), Default::default()).unwrap()
            };
            let buffer = virtual_buffer(&exporter, 2, seed, &stream);
            // The shared form names the same location, through its wire form and back.
            let shared = SharedVirtualBuffer::export(&buffer).unwrap();
            let (bytes, fds) = shared.encode();
            let fds = fds.iter().map(|fd| fd.try_clone_to_owned().unwrap()).collect();
            let decoded = SharedVirtualBuffer::decode(&bytes, fds).unwrap();
            assert_eq!(decoded.location().unwrap(), exporter.location(), "{seed}: the location on the wire");
            drop((decoded, shared));
            sender.send_virtual_buffer(&buffer).unwrap();
            let Received::VirtualBuffer(received) = receiver.recv(&stream).unwrap() else {
                panic!("expected a virtual buffer")
            };
            assert!(Arc::ptr_eq(received.resource(), &importer), "{seed}: the resource for its location");
            assert_eq!(received.resource().location(), exporter.location());
            assert_eq!(read_bytes(received.as_buffer(), &stream), pattern(seed, 2 * G));
        }
        if device1.is_none() {
            cuda_sim::testing::skip("the device-1 case needs two devices");
        }
    });
}

/// Running out of memory while importing a chunk of a virtual buffer received on the channel:
/// the channel's error keeps the driver's code (through the VMM error it wraps), and so does the
/// core error it becomes where a `MemoryResource` method must return one.
#[test]
fn a_chunk_import_out_of_memory_on_the_channel_keeps_the_drivers_code() {
    cuda_sim::testing::in_simulated_machine(test_name!(), &[], || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let (device, stream) = setup();
        let (a, b) = cuda_mem_ipc::Channel::pair().unwrap();
        let (sender, receiver) = (IpcChannel::new(a), IpcChannel::new(b));
        let exporter = VirtualMemoryResource::new(device, Default::default()).unwrap();
        receiver.import_virtual_buffers_into(VirtualMemoryResource::new(device, Default::default()).unwrap());
        let buffer = virtual_buffer(&exporter, 2, 50, &stream);
        sender.send_virtual_buffer(&buffer).unwrap();
        let driver = cuda_sim::testing::driver().unwrap();
        cuda_sim::testing::inject_failure(driver, c"cuMemImportFromShareableHandle", 2).unwrap();
        let error = receiver.recv(&stream).unwrap_err();
        assert!(matches!(error, IpcError::Vmm(VmmError::ChunkImport { chunk: 2, count: 2, .. })), "{error:?}");
        let oom = Some(cuda_mem_core::sys::types::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(error.cuda_code(), oom, "{error}");
        let core = cuda_mem_core::Error::from(error);
        assert_eq!(core.cuda_code(), oom, "{core}");
        let cuda_mem_core::Error::Resource(source) = &core else { panic!("expected the VMM error kept, got {core:?}") };
        assert!(matches!(source.downcast_ref::<VmmError>(), Some(VmmError::ChunkImport { .. })), "{source:?}");
        // The channel goes on: the same buffer sent again arrives.
        sender.send_virtual_buffer(&buffer).unwrap();
        assert!(matches!(receiver.recv(&stream).unwrap(), Received::VirtualBuffer(_)));
    });
}
