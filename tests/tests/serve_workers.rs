//! One async server, one pool, many worker processes that connect by name (this test binary
//! again, in a role): 32 at once, workers SIGKILLed while they hold and import blocks, and a
//! worker killed partway through a frame, and blocks lent after an event the worker's stream
//! waits for. The server keeps serving, takes back what a dead worker held, and leaks nothing.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{ROLE_ENV, device_pool, hold, read_bytes, role, setup};
use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, Event, EventOptions, FillPattern, MemoryResource, Stream, StreamOptions,
};
use cuda_mem_ipc::wire::{FrameHeader, MessageKind};
use cuda_mem_ipc::{AsyncChannelListener, AsyncIpcChannel, Channel, ChannelListener, IpcChannel, IpcError, Received};
use cuda_sim::testing::{Gate, OpenOnDrop, open_fds};

/// The listener's abstract name, for the workers.
const NAME_ENV: &str = "CUDA_MEM_TESTS_SERVER_NAME";
const BLOCK: usize = 64 << 10;

/// Starts this test binary as a worker of `test` in `role`, connecting to `name`.
fn worker(test: &str, role: &str, name: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_ENV, role)
        .env(NAME_ENV, name)
        .env_remove(cuda_mem_ipc::CHANNEL_FD_ENV)
        .env_remove(cuda_mem_ipc::CHANNEL_INODE_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// What a worker does, by its role.
fn work(role: &str) {
    let (device, stream) = setup();
    let name = std::env::var(NAME_ENV).unwrap();
    match role {
        // Fills and gives back what it is lent until "stop".
        "borrower" => {
            let channel = IpcChannel::new(Channel::connect_abstract(&name).unwrap());
            loop {
                match channel.recv(&stream).unwrap() {
                    Received::Resource(_) => {}
                    Received::Buffers(mut blocks) => {
                        for block in &mut blocks {
                            block.fill(FillPattern::U8(0x5a), &stream).unwrap();
                        }
                        channel.give_back(blocks, &stream).unwrap();
                    }
                    Received::Data(word) if word == b"stop" => return,
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        // Receives (imports) everything it is lent and keeps it until it is killed.
        "hoarder" => {
            let channel = IpcChannel::new(Channel::connect_abstract(&name).unwrap());
            let mut held = Vec::new();
            loop {
                match channel.recv(&stream).unwrap() {
                    Received::Resource(_) => {}
                    Received::Buffers(blocks) => {
                        held.extend(blocks);
                        channel.send_data(b"holding").unwrap();
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        // Enqueues a read of each block it is lent (after the event that came with them), says
        // so while the server's fill is still held, then checks it read the fill, writes and
        // gives the blocks back, until "stop".
        "ordered" => {
            let channel = IpcChannel::new(Channel::connect_abstract(&name).unwrap());
            loop {
                match channel.recv(&stream).unwrap() {
                    Received::Resource(_) => {}
                    Received::Buffers(mut blocks) => {
                        assert_eq!(channel.open_events(), 1, "the event came with the blocks");
                        let pinned = cuda_mem_core::LegacyPinnedMemoryResource::new(device);
                        let copies: Vec<Buffer> = blocks
                            .iter()
                            .map(|block| {
                                let mut host = pinned.allocate(block.size(), &stream).unwrap();
                                host.copy_from(block, &stream).unwrap();
                                host
                            })
                            .collect();
                        assert!(!stream.is_idle().unwrap(), "the reads wait for the server's fill");
                        channel.send_data(b"enqueued").unwrap();
                        stream.synchronize().unwrap();
                        for copy in &copies {
                            assert!(copy.host_slice().unwrap().iter().all(|&b| b == FILLED), "the server's fill");
                        }
                        for block in &mut blocks {
                            block.fill(FillPattern::U8(WRITTEN), &stream).unwrap();
                        }
                        channel.give_back(blocks, &stream).unwrap();
                    }
                    Received::Data(word) if word == b"stop" => return,
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        // Sends the first half of a buffers frame, then waits to be killed.
        "half-frame" => {
            use std::io::Write;
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let mut socket = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
            let header = FrameHeader { kind: MessageKind::Buffers.code(), payload_len: 4 + 108, fds: 0 }.encode();
            socket.write_all(&header).unwrap();
            socket.write_all(&[1, 0, 0, 0, 0xaa]).unwrap();
            let _ = device;
            std::thread::sleep(Duration::from_secs(120));
        }
        other => panic!("unknown role {other}"),
    }
}

/// What the server's held fill writes, and what the "ordered" worker writes back.
const FILLED: u8 = 0x77;
const WRITTEN: u8 = 0x5a;

/// Two blocks whose fill with [`FILLED`] is queued on `stream` behind a closed gate, and
/// `event` recorded after it: the fill is provably pending until the gate opens.
fn blocks_filled_behind_a_gate(
    pool: &Arc<DeviceMemoryResource>,
    stream: &Stream,
    event: &Event,
) -> (Vec<Buffer>, &'static Gate, OpenOnDrop) {
    let mut blocks: Vec<Buffer> = (0..2).map(|_| pool.allocate(BLOCK, stream).unwrap()).collect();
    for block in &mut blocks {
        block.fill(FillPattern::U8(1), stream).unwrap();
    }
    stream.synchronize().unwrap();
    let (gate, opens) = hold(stream);
    for block in &mut blocks {
        block.fill(FillPattern::U8(FILLED), stream).unwrap();
    }
    event.record(stream).unwrap();
    (blocks, gate, opens)
}

/// Lends `blocks` blocks to a borrower, two at a time, checks each comes back written, tells
/// it to stop, and sees it leave holding nothing.
async fn serve_borrower(channel: AsyncIpcChannel, pool: Arc<DeviceMemoryResource>, device: Device, blocks: usize) {
    let stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let (mut lent, mut back) = (0, 0);
    while back < blocks {
        while lent < blocks && lent - back < 2 {
            channel.lend(vec![pool.allocate(BLOCK, &stream).unwrap()]).await.unwrap();
            lent += 1;
        }
        match channel.recv(&stream).await.unwrap() {
            Received::Returned(returned) => back += returned.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    channel.send_data(b"stop").await.unwrap();
    let error = channel.recv(&stream).await.unwrap_err();
    assert!(matches!(error, IpcError::PeerClosed), "{error:?}");
    let outstanding = channel.into_outstanding();
    assert_eq!(outstanding.held().buffers, 0);
}

/// The tests count this process's descriptors: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Descriptors open now, once `pool`'s shareable descriptor (made when it is first sent, then
/// kept by the pool) exists.
fn open_fds_with(pool: &DeviceMemoryResource) -> usize {
    cuda_mem_ipc::allocation_handle(pool).unwrap();
    open_fds()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap()
}

#[test]
fn thirty_two_workers_connect_borrow_and_leave_concurrently() {
    const TEST: &str = "thirty_two_workers_connect_borrow_and_leave_concurrently";
    if let Some(role) = role() {
        return work(&role);
    }
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (device, _stream) = setup();
    let pool = device_pool(device);
    let name = format!("cuda-mem-tests-32-{}", std::process::id());
    let before = open_fds_with(&pool);
    runtime().block_on(async {
        let listener = AsyncChannelListener::bind_abstract(&name).unwrap();
        let mut workers: Vec<Child> = (0..32).map(|_| worker(TEST, "borrower", &name)).collect();
        let mut serving = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let channel = AsyncIpcChannel::new(listener.accept().await.unwrap());
            serving.spawn(serve_borrower(channel, Arc::clone(&pool), device, 6));
        }
        while let Some(served) = serving.join_next().await {
            served.unwrap();
        }
        for worker in &mut workers {
            assert!(worker.wait().unwrap().success());
        }
    });
    assert_eq!(pool.memory_pool().unwrap().attributes().unwrap().used_mem_current, 0);
    assert_eq!(open_fds(), before, "every connection's descriptor closed");
}

#[test]
fn workers_killed_while_they_hold_and_import_blocks_give_them_back_and_the_server_goes_on() {
    const TEST: &str = "workers_killed_while_they_hold_and_import_blocks_give_them_back_and_the_server_goes_on";
    if let Some(role) = role() {
        return work(&role);
    }
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (device, stream) = setup();
    let pool = device_pool(device);
    let name = format!("cuda-mem-tests-kill-{}", std::process::id());
    let before = open_fds_with(&pool);
    runtime().block_on(async {
        let listener = AsyncChannelListener::bind_abstract(&name).unwrap();
        for round in 0..4u64 {
            // A hoarder, lent a batch, then killed: after it said it holds them (round 0), or
            // while it may still be receiving and importing them (later rounds, killed after a
            // little time).
            let mut hoarder = worker(TEST, "hoarder", &name);
            let channel = AsyncIpcChannel::new(listener.accept().await.unwrap());
            let blocks: Vec<_> = (0..16).map(|_| pool.allocate(BLOCK, &stream).unwrap()).collect();
            channel.lend(blocks).await.unwrap();
            if round == 0 {
                assert!(matches!(channel.recv(&stream).await.unwrap(), Received::Data(d) if d == b"holding"));
            } else {
                std::thread::sleep(Duration::from_micros(300 * round));
            }
            hoarder.kill().unwrap();
            // The server learns of it from the channel, and the blocks come back once the
            // process has exited (not reaped yet: a zombie holds nothing).
            loop {
                match channel.recv(&stream).await {
                    Ok(Received::Data(_)) => {}
                    Ok(other) => panic!("unexpected {other:?}"),
                    Err(error) => {
                        assert!(!error.channel_usable(), "{error:?}");
                        break;
                    }
                }
            }
            let outstanding = channel.into_outstanding();
            assert_eq!(outstanding.held().buffers, 16, "round {round}");
            let back = outstanding.exited().await.expect("the killed worker's blocks come back");
            assert_eq!(back.len(), 16);
            drop(back);
            hoarder.wait().unwrap();

            // A worker killed partway through a frame: the server's receive fails, nothing
            // is imported, and it goes on.
            let mut half = worker(TEST, "half-frame", &name);
            let channel = AsyncIpcChannel::new(listener.accept().await.unwrap());
            // Give the worker time to send its half, then kill it.
            std::thread::sleep(Duration::from_millis(50));
            half.kill().unwrap();
            let error = channel.recv(&stream).await.unwrap_err();
            assert!(!error.channel_usable(), "{error:?}");
            half.wait().unwrap();
            drop(channel);

            // The server still serves a good worker.
            let mut good = worker(TEST, "borrower", &name);
            let channel = AsyncIpcChannel::new(listener.accept().await.unwrap());
            serve_borrower(channel, Arc::clone(&pool), device, 4).await;
            assert!(good.wait().unwrap().success());
        }
    });
    stream.synchronize().unwrap();
    assert_eq!(pool.memory_pool().unwrap().attributes().unwrap().used_mem_current, 0, "every block freed");
    assert_eq!(open_fds(), before, "every connection's descriptor closed");
    let errors = cuda_mem_core::take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn blocks_lent_after_an_event_are_read_by_the_worker_only_after_the_servers_work() {
    const TEST: &str = "blocks_lent_after_an_event_are_read_by_the_worker_only_after_the_servers_work";
    if let Some(role) = role() {
        return work(&role);
    }
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (device, stream) = setup();
    let pool = device_pool(device);
    let event = Event::new(device, EventOptions::default().interprocess()).unwrap();
    let expect_written = |blocks: &[Buffer]| {
        assert_eq!(blocks.len(), 2);
        for block in blocks {
            assert!(read_bytes(block, &stream).iter().all(|&b| b == WRITTEN), "the worker's writes");
        }
    };

    // A blocking server.
    let name = format!("cuda-mem-tests-after-{}", std::process::id());
    let listener = ChannelListener::bind_abstract(&name).unwrap();
    let mut ordered = worker(TEST, "ordered", &name);
    let channel = IpcChannel::new(listener.accept().unwrap());
    for _ in 0..2 {
        let (blocks, gate, _opens) = blocks_filled_behind_a_gate(&pool, &stream, &event);
        channel.lend_after(&event, blocks).unwrap();
        assert_eq!(channel.held().buffers, 2);
        assert!(matches!(channel.recv(&stream).unwrap(), Received::Data(d) if d == b"enqueued"));
        gate.open();
        let Received::Returned(back) = channel.recv(&stream).unwrap() else { panic!("returned blocks expected") };
        expect_written(&back);
        assert_eq!(channel.held().buffers, 0);
    }
    channel.send_data(b"stop").unwrap();
    assert!(ordered.wait().unwrap().success());

    // An async one.
    let name = format!("cuda-mem-tests-after-async-{}", std::process::id());
    runtime().block_on(async {
        let listener = AsyncChannelListener::bind_abstract(&name).unwrap();
        let mut ordered = worker(TEST, "ordered", &name);
        let channel = AsyncIpcChannel::new(listener.accept().await.unwrap());
        for _ in 0..2 {
            let (blocks, gate, _opens) = blocks_filled_behind_a_gate(&pool, &stream, &event);
            channel.lend_after(&event, blocks).await.unwrap();
            assert_eq!(channel.held().buffers, 2);
            assert!(matches!(channel.recv(&stream).await.unwrap(), Received::Data(d) if d == b"enqueued"));
            gate.open();
            let Received::Returned(back) = channel.recv(&stream).await.unwrap() else {
                panic!("returned blocks expected")
            };
            expect_written(&back);
            assert_eq!(channel.held().buffers, 0);
        }
        channel.send_data(b"stop").await.unwrap();
        assert!(ordered.wait().unwrap().success());
    });
    stream.synchronize().unwrap();
    assert_eq!(pool.memory_pool().unwrap().attributes().unwrap().used_mem_current, 0, "every block freed");
}
