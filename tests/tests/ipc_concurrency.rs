//! Concurrent imports of one buffer in one process: eight threads import the same descriptor
//! through the same mapped resource at the same moment, all get the one mapping, and the last
//! to drop unmaps it; no deadlock, no double free, and a fresh import afterwards works.

#[macro_use]
mod common;

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use cuda_mem_core::DevicePtr;
use cuda_mem_ipc::{BufferDescriptor, MappedMemoryResource, buffer_descriptor};

const THREADS: usize = 8;
const ROUNDS: usize = 25;
const SIZE: usize = 1 << 16;
/// How long all the rounds may take before the test calls it a deadlock.
const DEADLOCK: Duration = Duration::from_secs(30);

#[test]
fn eight_threads_import_the_same_descriptor_at_once() {
    if role().is_some() {
        return child();
    }
    let (device, stream) = setup();
    let pool = device_pool(device);
    let mut buffer = pool.allocate(SIZE, &stream).unwrap();
    write_bytes(&mut buffer, &pattern(70, SIZE), &stream);
    let (child, channel) = spawn_role(test_name!(), "importer", &[]);
    channel.send_resource(&*pool).unwrap();
    channel.send_data(&buffer_descriptor(&buffer).unwrap().encode()).unwrap();
    expect_text(&channel, &stream, "wrote");
    assert_eq!(read_bytes(&buffer, &stream), pattern(71, SIZE), "the child's write through a fresh import");
    child.wait_success();
}

/// One round: every thread imports at once, all hold their import together (when the holder
/// count must be `THREADS`), then all drop. Returns each thread's pointer.
fn round(
    mapped: &Arc<MappedMemoryResource>,
    descriptor: &BufferDescriptor,
    stream: &cuda_mem_core::Stream,
) -> Vec<DevicePtr> {
    let start = Barrier::new(THREADS);
    let imported = Barrier::new(THREADS);
    let counted = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let result = mapped.import_buffer(descriptor, stream);
                    // Every thread passes every barrier, whatever happened, so that a failure
                    // is reported as itself and not as a hang.
                    let holders = result.as_ref().map(|b| cuda_mem_core::import_holders(b.ptr())).unwrap_or(0);
                    imported.wait();
                    let all_holding = result.as_ref().map(|b| cuda_mem_core::import_holders(b.ptr())).unwrap_or(0);
                    counted.wait();
                    let buffer = result.unwrap_or_else(|e| panic!("a concurrent import failed: {e}"));
                    assert!((1..=THREADS).contains(&holders), "{holders} holders right after an import");
                    assert_eq!(all_holding, THREADS, "holders while every thread holds its import");
                    assert_eq!(buffer.size(), SIZE);
                    buffer.ptr()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

fn child() {
    let (_device, stream) = setup();
    let channel = parent_channel();
    let mapped = expect_resource(&channel, &stream);
    let descriptor = BufferDescriptor::decode(&expect_data(&channel, &stream)).unwrap();

    let (done, finished) = mpsc::channel();
    let worker = {
        let (mapped, stream) = (Arc::clone(&mapped), stream.clone());
        std::thread::spawn(move || {
            let mut first = None;
            for r in 0..ROUNDS {
                let pointers = round(&mapped, &descriptor, &stream);
                assert!(pointers.iter().all(|&p| p == pointers[0]), "round {r}: one mapping for all: {pointers:x?}");
                assert_eq!(cuda_mem_core::import_holders(pointers[0]), 0, "round {r}: unmapped by the last holder");
                first.get_or_insert(pointers[0]);
            }
            let _ = done.send(());
        })
    };
    match finished.recv_timeout(DEADLOCK) {
        Ok(()) => worker.join().unwrap(),
        // The worker panicked: report its panic.
        Err(mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(worker.join().unwrap_err()),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{ROUNDS} rounds of {THREADS} imports took over {DEADLOCK:?}: a deadlock")
        }
    }

    // An import dropped on a thread that never used CUDA.
    let elsewhere = mapped.import_buffer(&descriptor, &stream).unwrap();
    let ptr = elsewhere.ptr();
    std::thread::spawn(move || drop(elsewhere)).join().unwrap();
    assert_eq!(cuda_mem_core::import_holders(ptr), 0);

    // A fresh import after all that.
    let mut buffer = mapped.import_buffer(&descriptor, &stream).unwrap();
    assert_eq!(cuda_mem_core::import_holders(buffer.ptr()), 1);
    assert_eq!(read_bytes(&buffer, &stream), pattern(70, SIZE));
    write_bytes(&mut buffer, &pattern(71, SIZE), &stream);
    let errors = cuda_mem_core::take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
    channel.send_data(b"wrote").unwrap();
}
