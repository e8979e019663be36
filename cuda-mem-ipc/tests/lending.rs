//! Lending (`IpcChannel::lend`, `give_back`, `Received::Returned`, `into_outstanding`) between
//! two channels of one process, blocking and async, and the hostile hand-backs a worker could
//! send.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{pair, setup};
use cuda_mem_core::{
    Buffer, DeviceMemoryResource, DeviceMemoryResourceOptions, Event, EventOptions, FillPattern, MemoryResource,
    PinnedMemoryResource, SharingError, Stream, StreamOptions,
};
use cuda_mem_ipc::wire::MessageKind;
use cuda_mem_ipc::{AsyncChannel, AsyncIpcChannel, Channel, IpcChannel, IpcError, Received, buffer_descriptor};
use cuda_sim::testing::{Gate, count_calls_if_simulated};

fn pool(device: cuda_mem_core::Device) -> Arc<DeviceMemoryResource> {
    DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true)).unwrap()
}

/// `buffer`'s bytes, copied to the host.
fn bytes_of(buffer: &Buffer, stream: &Stream) -> Vec<u8> {
    let pinned = PinnedMemoryResource::new(Default::default()).unwrap();
    let mut host = pinned.allocate(buffer.size(), stream).unwrap();
    buffer.copy_to(&mut host, stream).unwrap();
    stream.synchronize().unwrap();
    host.host_slice().unwrap().to_vec()
}

fn returned(channel: &IpcChannel, stream: &Stream) -> Vec<Buffer> {
    match channel.recv(stream) {
        Ok(Received::Returned(buffers)) => buffers,
        other => panic!("returned buffers expected, got {other:?}"),
    }
}

#[test]
fn lent_buffers_come_back_as_the_lenders_own_with_the_workers_writes() {
    let (device, stream) = setup();
    let pool = pool(device);
    let (server, worker) = pair();
    let blocks: Vec<Buffer> = (0..3).map(|_| pool.allocate(4096, &stream).unwrap()).collect();
    let ptrs: Vec<_> = blocks.iter().map(Buffer::ptr).collect();
    server.lend(blocks).unwrap();
    assert_eq!(server.held().buffers, 3);
    assert_eq!(server.held().bytes, 3 * 4096);
    assert_eq!(server.lent_buffers().iter().map(|&(p, _)| p).collect::<Vec<_>>(), {
        let mut sorted = ptrs.clone();
        sorted.sort_unstable();
        sorted
    });

    let mut lent = worker.recv_buffers(&stream).unwrap();
    for buffer in &mut lent {
        buffer.fill(FillPattern::U8(7), &stream).unwrap();
    }
    // Handed back in two messages: the server takes each as it comes.
    let last = lent.split_off(2);
    worker.give_back(lent, &stream).unwrap();
    let back = returned(&server, &stream);
    assert_eq!(server.held().buffers, 1);
    worker.give_back(last, &stream).unwrap();
    let mut back: Vec<Buffer> = back.into_iter().chain(returned(&server, &stream)).collect();
    assert_eq!(server.held(), Default::default());
    back.sort_by_key(Buffer::ptr);
    let mut sorted = ptrs;
    sorted.sort_unstable();
    assert_eq!(back.iter().map(Buffer::ptr).collect::<Vec<_>>(), sorted, "the server's own buffers");
    for buffer in &back {
        assert!(bytes_of(buffer, &stream).iter().all(|&b| b == 7), "the worker's writes");
    }
    // Lent again: the pool is not sent twice, and the buffers map again.
    server.lend(back).unwrap();
    let again = worker.recv_buffers(&stream).unwrap();
    assert_eq!(again.len(), 3);
    worker.give_back(again, &stream).unwrap();
    assert_eq!(returned(&server, &stream).len(), 3);
}

#[test]
fn a_buffer_not_received_on_the_channel_is_not_given_back_and_nothing_is_freed() {
    let (device, stream) = setup();
    let pool = pool(device);
    let (server, worker) = pair();
    let own = pool.allocate(256, &stream).unwrap();
    let error = worker.give_back(vec![own], &stream).unwrap_err();
    assert!(matches!(error, IpcError::NotReceivedHere { .. }), "{error:?}");
    assert!(error.channel_usable());
    // A buffer received on another channel is not this one's either.
    let (other_server, other_worker) = pair();
    other_server.lend(vec![pool.allocate(256, &stream).unwrap()]).unwrap();
    let elsewhere = other_worker.recv_buffers(&stream).unwrap();
    let ptr = elsewhere[0].ptr();
    let error = worker.give_back(elsewhere, &stream).unwrap_err();
    assert!(matches!(error, IpcError::NotReceivedHere { ptr: p } if p == ptr), "{error:?}");
    // Nothing went to the server: the next message is this one.
    worker.send_data(b"next").unwrap();
    assert!(matches!(server.recv(&stream), Ok(Received::Data(d)) if d == b"next"));
}

#[test]
fn hostile_hand_backs_are_refused_whole_and_the_loans_stay() {
    let (device, stream) = setup();
    let pool = pool(device);
    let (raw, server) = Channel::pair().unwrap();
    let server = IpcChannel::new(server);
    let worker = IpcChannel::new(raw);
    let blocks: Vec<Buffer> = (0..2).map(|_| pool.allocate(512, &stream).unwrap()).collect();
    let descriptors: Vec<_> = blocks.iter().map(|b| buffer_descriptor(b).unwrap()).collect();
    let stranger = pool.allocate(512, &stream).unwrap();
    server.lend(blocks).unwrap();
    let lent = worker.recv_buffers(&stream).unwrap();

    let send_returned = |descriptors: &[cuda_mem_ipc::BufferDescriptor]| {
        // A buffers message's payload: the count, then each descriptor.
        let mut payload = (descriptors.len() as u32).to_le_bytes().to_vec();
        for descriptor in descriptors {
            payload.extend_from_slice(&descriptor.encode());
        }
        worker.channel().send(MessageKind::Returned.code(), &payload, &[]).unwrap();
    };
    // A buffer never lent, beside one that was.
    send_returned(&[descriptors[0], buffer_descriptor(&stranger).unwrap()]);
    let error = server.recv(&stream).unwrap_err();
    assert!(matches!(error, IpcError::NotLent { size: 512, .. }), "{error:?}");
    assert!(error.channel_usable());
    assert_eq!(server.held().buffers, 2, "nothing taken back");
    // One buffer twice.
    send_returned(&[descriptors[1], descriptors[1]]);
    assert!(matches!(server.recv(&stream), Err(IpcError::NotLent { .. })));
    assert_eq!(server.held().buffers, 2);
    // Garbage.
    worker.channel().send(MessageKind::Returned.code(), b"\x01\x00\x00\x00garbage", &[]).unwrap();
    let error = server.recv(&stream).unwrap_err();
    assert!(error.channel_usable(), "{error:?}");
    assert_eq!(server.held().buffers, 2);
    // The real hand-back still works.
    worker.give_back(lent, &stream).unwrap();
    assert_eq!(returned(&server, &stream).len(), 2);
    assert_eq!(server.held().buffers, 0);
}

#[test]
fn a_lend_that_cannot_go_out_gives_the_buffers_back() {
    let (device, stream) = setup();
    let pool = pool(device);
    let (server, worker) = pair();
    drop(worker);
    let block = pool.allocate(256, &stream).unwrap();
    let ptr = block.ptr();
    let unlent = server.lend(vec![block]).unwrap_err();
    assert!(matches!(unlent.error, IpcError::PeerClosed), "{:?}", unlent.error);
    assert_eq!(unlent.buffers.iter().map(Buffer::ptr).collect::<Vec<_>>(), [ptr]);
    assert_eq!(server.held().buffers, 0);
}

#[test]
fn a_lend_after_an_event_that_is_not_interprocess_sends_nothing_and_gives_the_buffers_back() {
    let (device, stream) = setup();
    let pool = pool(device);
    let event = Event::new(device, EventOptions::default()).unwrap();
    let is_refusal = |error: &IpcError| matches!(error, IpcError::Core(cuda_mem_core::Error::EventNotInterprocess));
    let (server, worker) = pair();
    let block = pool.allocate(256, &stream).unwrap();
    let ptr = block.ptr();
    let unlent = server.lend_after(&event, vec![block]).unwrap_err();
    assert!(is_refusal(&unlent.error), "{:?}", unlent.error);
    assert_eq!(unlent.buffers.iter().map(Buffer::ptr).collect::<Vec<_>>(), [ptr]);
    assert_eq!(server.held().buffers, 0);
    // Nothing went out, not even the pool: the next message is this one.
    server.send_data(b"next").unwrap();
    assert!(matches!(worker.recv(&stream), Ok(Received::Data(d)) if d == b"next"));

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (server, worker) = AsyncIpcChannel::pair().unwrap();
        let unlent = server.lend_after(&event, unlent.buffers).await.unwrap_err();
        assert!(is_refusal(&unlent.error), "{:?}", unlent.error);
        assert_eq!(unlent.buffers.len(), 1);
        assert_eq!(server.held().buffers, 0);
        server.send_data(b"next").await.unwrap();
        assert!(matches!(worker.recv(&stream).await, Ok(Received::Data(d)) if d == b"next"));
    });
}

#[test]
fn loans_left_with_a_peer_the_kernel_does_not_name_are_kept_allocated_never_freed() {
    let (device, stream) = setup();
    let pool = pool(device);
    let (server, worker) = pair();
    let block = pool.allocate(1 << 16, &stream).unwrap();
    server.lend(vec![block]).unwrap();
    let lent = worker.recv_buffers(&stream).unwrap();
    // A socket pair of this process: the kernel names no other process, so nothing is known
    // to have exited.
    let outstanding = server.into_outstanding();
    assert_eq!(outstanding.peer_process_id(), None);
    assert_eq!(outstanding.held().buffers, 1);
    let outstanding = outstanding.try_reclaim().unwrap_err();
    let outstanding = outstanding.wait_for_exit(Some(Duration::from_millis(10))).unwrap_err();
    drop(outstanding);
    // Other tests of this binary record errors too: this one's is found among them.
    let errors = cuda_mem_core::take_drop_errors();
    assert!(
        errors.iter().any(|e| matches!(
            e.error,
            cuda_mem_core::Error::Sharing(SharingError::LentBuffersKept { buffers: 1, bytes: 65536, pid: None })
        )),
        "{errors:?}"
    );
    // The worker's mapping is still good: the memory was not freed under it.
    assert_eq!(pool.memory_pool().unwrap().attributes().unwrap().used_mem_current, 1 << 16);
    drop(lent);
}

#[test]
fn the_async_channel_lends_and_takes_back_across_tasks() {
    let (device, stream) = setup();
    let pool = pool(device);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let (server, worker) = AsyncIpcChannel::pair().unwrap();
        let worker_task = tokio::spawn(async move {
            let (_, stream) = setup();
            let mut handed = 0;
            loop {
                match worker.recv(&stream).await.unwrap() {
                    Received::Resource(_) => {}
                    Received::Buffers(mut buffers) => {
                        for buffer in &mut buffers {
                            buffer.fill(FillPattern::U8(9), &stream).unwrap();
                        }
                        handed += buffers.len();
                        worker.give_back(buffers, &stream).await.unwrap();
                    }
                    Received::Data(d) if d == b"stop" => return handed,
                    other => panic!("{other:?}"),
                }
            }
        });
        let mut back = 0;
        for round in 0..20 {
            let blocks: Vec<Buffer> = (0..(round % 3 + 1)).map(|_| pool.allocate(1024, &stream).unwrap()).collect();
            let count = blocks.len();
            server.lend(blocks).await.unwrap();
            let Received::Returned(buffers) = server.recv(&stream).await.unwrap() else { panic!("returned") };
            assert_eq!(buffers.len(), count);
            for buffer in &buffers {
                assert!(bytes_of(buffer, &stream).iter().all(|&b| b == 9));
            }
            back += count;
        }
        server.send_data(b"stop").await.unwrap();
        assert_eq!(worker_task.await.unwrap(), back);
        assert_eq!(server.held().buffers, 0);
    });
}

#[test]
fn a_cancelled_async_lend_either_lent_the_buffers_or_freed_them() {
    let (device, stream) = setup();
    let pool = pool(device);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        for attempt in 0..8u64 {
            let (server, worker) = AsyncChannel::pair().unwrap();
            let server = AsyncIpcChannel::new(server);
            let worker = AsyncIpcChannel::new(worker);
            // Fill the socket until a send waits: the peer does not read.
            let filler = vec![0u8; 64 * 1024];
            while tokio::time::timeout(Duration::from_millis(5), server.send_data(&filler)).await.is_ok() {}
            let block = pool.allocate(256, &stream).unwrap();
            // Cancelled at a different point each attempt (or before it began).
            let _ = tokio::time::timeout(Duration::from_micros(attempt * 50), server.lend(vec![block])).await;
            let lent = server.held().buffers;
            // The worker reads everything (while the server's last message goes out): the lent
            // buffers come whole, or none come.
            let read_all = async {
                let mut received = 0;
                loop {
                    match worker.recv(&stream).await.unwrap() {
                        Received::Data(d) if d == b"end" => return received,
                        Received::Data(_) | Received::Resource(_) => {}
                        Received::Buffers(buffers) => {
                            received += buffers.len();
                            worker.give_back(buffers, &stream).await.unwrap();
                        }
                        other => panic!("{other:?}"),
                    }
                }
            };
            let (sent, received) = tokio::join!(server.send_data(b"end"), read_all);
            sent.unwrap();
            assert_eq!(received, lent, "attempt {attempt}: what the server kept lent is what the worker got");
            if lent == 1 {
                assert!(matches!(server.recv(&stream).await.unwrap(), Received::Returned(b) if b.len() == 1));
            }
            assert_eq!(server.held().buffers, 0);
        }
    });
}

#[test]
fn an_async_hand_back_of_pending_work_waits_once_instead_of_polling() {
    let (device, stream) = setup();
    let pool = pool(device);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (server, worker) = runtime.block_on(async { AsyncIpcChannel::pair() }).unwrap();
    let worker_stream = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
    let mut lent = runtime.block_on(async {
        server.lend(vec![pool.allocate(4096, &stream).unwrap()]).await.unwrap();
        worker.recv_buffers(&worker_stream).await.unwrap()
    });
    // The worker's write waits behind a gate, opened from another thread later.
    let (gate, _opens) = Gate::new();
    // SAFETY: a live stream this test created, on this thread.
    unsafe { gate.hold(cuda_sim::testing::driver().unwrap(), worker_stream.handle()) }.unwrap();
    lent[0].fill(FillPattern::U8(3), &worker_stream).unwrap();
    gate.open_after(Duration::from_millis(50));
    let (given, counted) = count_calls_if_simulated(|| runtime.block_on(worker.give_back(lent, &worker_stream)));
    given.unwrap();
    assert!(gate.is_open(), "the hand-back waited for the worker's write");
    counted.assert_calls("cuEventQuery", 1, "one query, not a poll");
    counted.assert_calls("cuEventSynchronize", 1, "then one blocking wait");
    let back = runtime.block_on(async {
        match server.recv(&stream).await.unwrap() {
            Received::Returned(back) => back,
            other => panic!("returned buffers expected, got {other:?}"),
        }
    });
    assert!(bytes_of(&back[0], &stream).iter().all(|&b| b == 3), "the worker's write");
}
