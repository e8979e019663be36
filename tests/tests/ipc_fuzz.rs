//! The receiving end of an `IpcChannel` against arbitrary input: random bytes on the socket,
//! random frames, and valid frames (a resource with its pool's descriptor, buffers, data) with
//! random damage. Whatever arrives, `recv` returns an error or a well-formed message, never
//! panics, and every descriptor that came with the input is closed once the messages are gone.
//!
//! One test only, in a binary of its own: it counts the descriptors of the whole process.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IoSlice, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use cuda_mem_core::{Buffer, Device, DeviceMemoryResource, Stream};
use cuda_mem_ipc::{
    BufferDescriptor, Channel, IpcChannel, IpcError, MappedMemoryResource, Received, allocation_handle,
    buffer_descriptor, registry,
};
use cuda_sim::testing::open_fds;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};

/// What every case shares: a pool, three of its buffers, and the pool mapped back into this
/// process (registered under its UUID). A case's buffers messages come after the pool on the
/// case's own channel, since a channel maps buffers only through the pools it received.
struct World {
    stream: Stream,
    pool: Arc<DeviceMemoryResource>,
    _buffers: Vec<Buffer>,
    descriptors: Vec<BufferDescriptor>,
    _mapped: Arc<MappedMemoryResource>,
    null: File,
    on_simulator: bool,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let (device, stream) = setup();
        let pool = device_pool(device);
        let mut buffers: Vec<Buffer> =
            [4096, 100, 1 << 16].iter().map(|&n| pool.allocate(n, &stream).unwrap()).collect();
        for (i, buffer) in buffers.iter_mut().enumerate() {
            write_bytes(buffer, &pattern(i as u32, buffer.size()), &stream);
        }
        let descriptors = buffers.iter().map(|b| buffer_descriptor(b).unwrap()).collect();
        let (a, b) = Channel::pair().unwrap();
        IpcChannel::new(a).send_resource(&*pool).unwrap();
        let Ok(Received::Resource(mapped)) = IpcChannel::new(b).recv(&stream) else { panic!("the pool maps back") };
        World {
            stream,
            pool,
            _buffers: buffers,
            descriptors,
            _mapped: mapped,
            null: File::open("/dev/null").unwrap(),
            on_simulator: cuda_sim::testing::on_simulator(),
        }
    })
}

/// A frame's bytes (see `cuda_mem_ipc::channel`): header, then payload.
fn frame(kind: u16, payload: &[u8], fds: u32) -> Vec<u8> {
    let mut bytes = b"CUMEMMSG".to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&kind.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&fds.to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(payload);
    bytes
}

fn resource_payload(world: &World) -> Vec<u8> {
    let mut payload = allocation_handle(&*world.pool).unwrap().uuid().as_bytes().to_vec();
    payload.push(0);
    payload.extend_from_slice(&0i32.to_le_bytes());
    payload.extend_from_slice(&[0; 3]);
    let device = cuda_mem_core::MemoryResource::device(&*world.pool).unwrap();
    payload.extend_from_slice(&device.uuid().unwrap());
    payload
}

fn buffers_payload(descriptors: &[BufferDescriptor]) -> Vec<u8> {
    let mut payload = (descriptors.len() as u32).to_le_bytes().to_vec();
    for d in descriptors {
        payload.extend_from_slice(&d.encode());
    }
    payload
}

/// The valid messages damaged inputs start from: kind, payload, whether the pool's descriptor
/// goes with it.
fn valid(world: &World, which: u8) -> (u16, Vec<u8>, bool) {
    match which % 4 {
        0 => (1, resource_payload(world), true),
        1 => (2, buffers_payload(&world.descriptors), false),
        2 => (2, buffers_payload(&world.descriptors[1..2]), false),
        _ => (3, b"some bytes of the application".to_vec(), false),
    }
}

/// What to feed the receiver.
#[derive(Debug, Clone)]
enum Input {
    /// Bytes written on the socket as they are, optionally with /dev/null attached.
    Raw { bytes: Vec<u8>, fd: bool },
    /// A well-framed message with any kind and payload, and up to 3 descriptors.
    Framed { kind: u16, payload: Vec<u8>, fds: u8 },
    /// A valid message's whole frame, damaged (byte changes, cut, extended), written raw.
    DamagedFrame { which: u8, changes: Vec<(usize, u8)>, cut: Option<usize>, extra: Vec<u8> },
    /// A valid message's payload, damaged, in a good frame (optionally of another kind).
    DamagedPayload { which: u8, changes: Vec<(usize, u8)>, cut: Option<usize>, extra: Vec<u8>, kind: Option<u16> },
    /// A buffers message whose descriptors are re-sealed with a valid checksum after their
    /// size or (on the simulator only) their export data changed.
    /// Or naming another resource.
    Resealed { sizes: Vec<(u8, u64)>, export_changes: Vec<(usize, u8)>, resource: Option<u128> },
}

fn changes() -> impl Strategy<Value = Vec<(usize, u8)>> {
    prop::collection::vec((any::<usize>(), 1u8..=255), 0..6)
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        (prop::collection::vec(any::<u8>(), 0..300), any::<bool>()).prop_map(|(bytes, fd)| Input::Raw { bytes, fd }),
        (any::<u16>(), prop::collection::vec(any::<u8>(), 0..400), 0u8..4)
            .prop_map(|(kind, payload, fds)| Input::Framed { kind, payload, fds }),
        ((1u16..5), prop::collection::vec(any::<u8>(), 0..400), 0u8..3)
            .prop_map(|(kind, payload, fds)| Input::Framed { kind, payload, fds }),
        (any::<u8>(), changes(), prop::option::of(any::<usize>()), prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(which, changes, cut, extra)| Input::DamagedFrame { which, changes, cut, extra }),
        (
            any::<u8>(),
            changes(),
            prop::option::of(any::<usize>()),
            prop::collection::vec(any::<u8>(), 0..40),
            prop::option::weighted(0.2, 0u16..6)
        )
            .prop_map(|(which, changes, cut, extra, kind)| Input::DamagedPayload {
                which,
                changes,
                cut,
                extra,
                kind
            }),
        (
            prop::collection::vec((any::<u8>(), prop_oneof![any::<u64>(), 0u64..70_000]), 1..4),
            prop::collection::vec((0usize..64, 1u8..=255), 0..3),
            prop::option::weighted(0.2, 1u128..)
        )
            .prop_map(|(sizes, export_changes, resource)| Input::Resealed { sizes, export_changes, resource }),
    ]
}

fn damage(mut bytes: Vec<u8>, changes: &[(usize, u8)], cut: Option<usize>, extra: &[u8]) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(at, x) in changes {
            let len = bytes.len();
            bytes[at % len] ^= x;
        }
    }
    if let Some(cut) = cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes.extend_from_slice(extra);
    bytes
}

/// Writes `bytes` on `socket` with `fds` attached to the first byte.
fn raw_send(socket: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    if fds.is_empty() {
        (&*socket).write_all(bytes).unwrap();
        return;
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    // With descriptors, at least one byte goes too; an empty input sends one zero byte.
    let first = if bytes.is_empty() { &[0u8][..] } else { bytes };
    let n = sendmsg(socket, &[IoSlice::new(first)], &mut control, SendFlags::empty()).unwrap();
    (&*socket).write_all(&first[n..]).unwrap();
}

/// Sends `input` from `socket` (then closes it), after the pool when the input is meant to be
/// buffers.
fn feed(world: &World, socket: UnixStream, input: &Input) {
    let pool_fd = allocation_handle(&*world.pool).unwrap().fd();
    let buffers = match input {
        Input::DamagedFrame { which, .. } | Input::DamagedPayload { which, .. } => valid(world, *which).0 == 2,
        Input::Resealed { .. } => true,
        Input::Raw { .. } | Input::Framed { .. } => false,
    };
    if buffers {
        raw_send(&socket, &frame(1, &resource_payload(world), 1), &[pool_fd]);
    }
    match input {
        Input::Raw { bytes, fd } => {
            let fds = if *fd { vec![world.null.as_fd()] } else { vec![] };
            raw_send(&socket, bytes, &fds);
        }
        Input::Framed { kind, payload, fds } => {
            let fds: Vec<BorrowedFd<'_>> =
                (0..*fds).map(|i| if i % 2 == 0 { pool_fd } else { world.null.as_fd() }).collect();
            Channel::from_stream(socket).unwrap().send(*kind, payload, &fds).unwrap();
        }
        Input::DamagedFrame { which, changes, cut, extra } => {
            let (kind, payload, with_fd) = valid(world, *which);
            let bytes = damage(frame(kind, &payload, u32::from(with_fd)), changes, *cut, extra);
            let fds = if with_fd { vec![pool_fd] } else { vec![] };
            raw_send(&socket, &bytes, &fds);
        }
        Input::DamagedPayload { which, changes, cut, extra, kind } => {
            let (valid_kind, payload, with_fd) = valid(world, *which);
            let payload = damage(payload, changes, *cut, extra);
            let fds = if with_fd { vec![pool_fd] } else { vec![] };
            Channel::from_stream(socket).unwrap().send(kind.unwrap_or(valid_kind), &payload, &fds).unwrap();
        }
        Input::Resealed { sizes, export_changes, resource } => {
            let descriptors: Vec<BufferDescriptor> = sizes
                .iter()
                .map(|&(which, size)| {
                    let mut d = world.descriptors[usize::from(which) % world.descriptors.len()];
                    d.size = size;
                    if let Some(other) = resource {
                        d.resource = uuid::Uuid::from_u128(*other);
                    }
                    // Garbage export data goes to the driver: the simulator's own business to
                    // refuse; a real driver is not fed it.
                    if world.on_simulator {
                        for &(at, x) in export_changes {
                            d.export_data[at] ^= x;
                        }
                    }
                    d
                })
                .collect();
            Channel::from_stream(socket).unwrap().send(2, &buffers_payload(&descriptors), &[]).unwrap();
        }
    }
}

/// Checks a message `recv` returned: only well-formed things come out.
fn check(message: &Received) -> Vec<u64> {
    let mut pointers = Vec::new();
    match message {
        Received::Data(bytes) => assert!(bytes.len() <= cuda_mem_ipc::MAX_PAYLOAD_LEN),
        Received::Resource(resource) => {
            // The world's import holds the UUID: a case's import of the same pool is its own
            // (this driver gives it another handle), or the world's when the driver confirms it.
            let registered = registry().get(resource.uuid()).expect("a received resource's UUID is registered");
            assert!(
                Arc::ptr_eq(&registered, resource)
                    || registered.imported_pool().handle() != resource.imported_pool().handle(),
                "the registered import, or an import of the case's own"
            );
            if let cuda_mem_core::PoolKind::Device(device) = resource.kind() {
                assert!(device.ordinal() < Device::count().unwrap());
            }
            assert!(resource.imported_pool().is_imported());
        }
        Received::Buffers(buffers) => {
            for buffer in buffers {
                assert!(buffer.size() >= 1 && buffer.ptr() != 0);
                assert!(cuda_mem_core::import_holders(buffer.ptr()) >= 1, "a received buffer holds its import");
                let mapped = cuda_mem_core::mapped_range_size(buffer.ptr()).unwrap();
                assert!(buffer.size() <= mapped, "{} bytes claimed, {mapped} mapped", buffer.size());
                pointers.push(buffer.ptr());
            }
        }
        // No virtual memory resource is registered, so no virtual buffer is imported.
        other => panic!("unexpected {other:?}"),
    }
    pointers
}

/// How often each outcome happened.
static OUTCOMES: Mutex<BTreeMap<&'static str, usize>> = Mutex::new(BTreeMap::new());

fn tally(outcome: &'static str) {
    *OUTCOMES.lock().unwrap().entry(outcome).or_default() += 1;
}

/// One case: feed `input`, receive until an error, check what came, drop it all.
fn one_case(world: &World, input: &Input) -> Result<(), TestCaseError> {
    // Releasing an import is stream-ordered, and the last release of a pool's imports closes its
    // descriptor when that work runs: count only once the stream is idle, here and below.
    world.stream.synchronize().unwrap();
    let before = open_fds();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let receiver = IpcChannel::new(Channel::from_stream(ours).unwrap());
    receiver.channel().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    feed(world, theirs, input);

    let mut received = Vec::new();
    let mut pointers = Vec::new();
    // Every input ends (the sender is closed), in an error at the latest.
    for _ in 0..8 {
        match receiver.recv(&world.stream) {
            Ok(message) => {
                tally(match &message {
                    Received::Resource(_) => "resource",
                    Received::Buffers(_) => "buffers",
                    Received::Data(_) => "data",
                    _ => "other",
                });
                pointers.extend(check(&message));
                received.push(message);
            }
            Err(error) => {
                tally(match &error {
                    IpcError::Protocol(_) => "protocol error",
                    IpcError::BufferDescriptor(_) => "decode error",
                    // The driver refusing what the peer sent, as the peer's error.
                    IpcError::PoolImport { .. } | IpcError::BufferImport { .. } => "driver refusal",
                    IpcError::Core(_) => "driver error",
                    IpcError::PeerClosed => "peer closed",
                    IpcError::UnknownResource(_) => "unknown resource",
                    _ => "other error",
                });
                prop_assert!(!error.to_string().is_empty());
                break;
            }
        }
    }
    drop(received);
    drop(receiver);
    for ptr in pointers {
        prop_assert_eq!(cuda_mem_core::import_holders(ptr), 0, "imports released with their buffers");
    }
    world.stream.synchronize().unwrap();
    prop_assert_eq!(open_fds(), before, "every descriptor of the input is closed");
    Ok(())
}

const CASES: u32 = 3000;

#[test]
fn recv_survives_arbitrary_input() {
    let world = world();
    let config = ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = TestRunner::new(config);
    let started = std::time::Instant::now();
    if let Err(failure) = runner.run(&input(), |input| one_case(world, &input)) {
        panic!("{failure}");
    }
    let outcomes = OUTCOMES.lock().unwrap().clone();
    eprintln!("{CASES} cases in {:?}: {outcomes:?}", started.elapsed());
    // The inputs reach every layer: framing, payloads, descriptors, the driver, and success.
    let expected = [
        "resource",
        "buffers",
        "data",
        "protocol error",
        "decode error",
        "driver refusal",
        "peer closed",
        "unknown resource",
    ];
    for outcome in expected {
        if outcome == "driver refusal" && !world.on_simulator {
            // Garbage export data, the sure way to a driver refusal, goes to the simulator only.
            continue;
        }
        assert!(outcomes.get(outcome).is_some_and(|&n| n > 0), "no {outcome:?} in {outcomes:?}");
    }

    // Afterwards: no errors while dropping, and a normal transfer works.
    let errors = cuda_mem_core::take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
    let (a, b) = Channel::pair().unwrap();
    let (a, b) = (IpcChannel::new(a), IpcChannel::new(b));
    let mut buffer = world.pool.allocate(512, &world.stream).unwrap();
    write_bytes(&mut buffer, &pattern(99, 512), &world.stream);
    a.send_buffers(&[&buffer]).unwrap();
    let imported = b.recv_buffers(&world.stream).unwrap();
    assert_eq!(read_bytes(&imported[0], &world.stream), pattern(99, 512));
}
