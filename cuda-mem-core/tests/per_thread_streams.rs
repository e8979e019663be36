//! A per-thread default stream used from another thread than its own: the work goes to the
//! calling thread's per-thread stream, as `CU_STREAM_PER_THREAD` means there, and the buffer must
//! wait for that stream before lending its bytes or freeing them.
//!
//! Each test holds the other thread's per-thread stream behind a gate before the work is
//! enqueued there, and opens it a little later from a third thread: a call that waits for the
//! work returns with the gate open and the work done; one that does not returns at once, with
//! the gate still closed.

mod common;

use std::sync::Arc;
use std::sync::mpsc;

use common::{Gate, OPEN_DELAY, expect_host_read_waited, hold};
use cuda_mem_core::sys::types::CUstream;
use cuda_mem_core::{Device, FillPattern, MemoryResourceExt, PinnedMemoryResource, Stream, take_drop_errors};

const SIZE: usize = 1 << 16;

/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
const PER_THREAD: CUstream = std::ptr::without_provenance_mut(0x2);

fn pinned() -> Arc<PinnedMemoryResource> {
    PinnedMemoryResource::new(Default::default()).unwrap()
}

/// Runs `work` on another thread, behind a gate on that thread's per-thread stream (so all that
/// `work` enqueues there is still pending when it returns); then, on this thread, with the other
/// thread still alive and the gate opening after [`OPEN_DELAY`], runs `check` on what `work`
/// returned.
fn behind_another_threads_gate<T: Send>(device: Device, work: impl FnOnce() -> T + Send, check: impl FnOnce(T, &Gate)) {
    let (gate, _opens_on_failure) = Gate::new();
    std::thread::scope(|scope| {
        // Made inside the scope, so that a failed check drops the sender and the other thread
        // ends before the scope waits for it.
        let (sent, received) = mpsc::channel();
        let (finished, done) = mpsc::channel::<()>();
        scope.spawn(move || {
            device.set_current().unwrap();
            hold(gate, PER_THREAD);
            sent.send(work()).unwrap();
            // Alive until the check is over: its per-thread stream is the one being waited for.
            let _ = done.recv();
        });
        let value = received.recv().expect("the other thread's work ran");
        gate.open_after(OPEN_DELAY);
        check(value, gate);
        drop(finished);
    });
}

#[test]
fn host_access_waits_for_a_fill_through_another_threads_per_thread_stream() {
    let device = common::device();
    let pool = pinned();
    let ours = Stream::per_thread_default(device);
    let mut buffer = pool.allocate(SIZE, &ours).unwrap();
    buffer.host_slice_mut().unwrap().fill(0);
    let theirs = ours.clone();
    behind_another_threads_gate(
        device,
        move || {
            buffer.fill(FillPattern::U8(0xAB), &theirs).unwrap();
            buffer
        },
        |buffer, gate| {
            expect_host_read_waited(&buffer, gate, 0xAB);
        },
    );
}

#[test]
fn host_access_waits_for_a_copy_through_another_threads_per_thread_stream() {
    let device = common::device();
    let pool = pinned();
    let ours = Stream::per_thread_default(device);
    let mut source = pool.allocate(SIZE, &ours).unwrap();
    source.host_slice_mut().unwrap().fill(0xCD);
    let mut destination = pool.allocate(SIZE, &ours).unwrap();
    destination.host_slice_mut().unwrap().fill(0);
    let theirs = ours.clone();
    behind_another_threads_gate(
        device,
        move || {
            destination.copy_from(&source, &theirs).unwrap();
            (source, destination)
        },
        |(mut source, destination), gate| {
            expect_host_read_waited(&destination, gate, 0xCD);
            // The source was read by the copy: writing it waits for the copy too.
            source.host_slice_mut().unwrap().fill(0);
        },
    );
}

#[test]
fn buffers_allocated_through_another_threads_per_thread_stream_record_the_stream_used() {
    let device = common::device();
    let pool = pinned();
    let ours = Stream::per_thread_default(device);
    let theirs = ours.clone();
    let pool_there = Arc::clone(&pool);
    behind_another_threads_gate(
        device,
        move || {
            let mut shared = pool_there.allocate(SIZE, &theirs).unwrap();
            shared.fill(FillPattern::U8(0xEF), &theirs).unwrap();
            let recorded = shared.deallocation_stream().cloned();
            (shared, recorded)
        },
        |(shared, recorded), gate| {
            assert_ne!(recorded.as_ref(), Some(&ours), "the buffer recorded a stream its work did not go to");
            expect_host_read_waited(&shared, gate, 0xEF);
        },
    );
    // The same for a scoped buffer, which borrows the stream when it can and here cannot.
    behind_another_threads_gate(
        device,
        || {
            let mut scoped = pool.allocate_scoped(SIZE, &ours).unwrap();
            scoped.fill(FillPattern::U8(0x5A), &ours).unwrap();
            scoped
        },
        |scoped, gate| {
            expect_host_read_waited(&scoped, gate, 0x5A);
        },
    );
}

#[test]
fn freeing_waits_for_work_through_another_threads_per_thread_stream() {
    let device = common::device();
    let pool = pinned();
    let ours = Stream::per_thread_default(device);
    let mut buffer = pool.allocate(SIZE, &ours).unwrap();
    let theirs = ours.clone();
    behind_another_threads_gate(
        device,
        move || {
            buffer.fill(FillPattern::U8(1), &theirs).unwrap();
            buffer
        },
        |buffer, gate| {
            drop(buffer);
            assert!(gate.is_open(), "the buffer was freed while a fill of it was still pending");
        },
    );
    ours.synchronize().unwrap();
    assert_eq!(pool.pool().attributes().unwrap().used_mem_current, 0);
    let errors = take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn host_access_waits_for_a_view_fill_through_another_threads_per_thread_stream() {
    let device = common::device();
    let pool = pinned();
    let ours = Stream::per_thread_default(device);
    let mut buffer = pool.allocate(SIZE, &ours).unwrap();
    buffer.host_slice_mut().unwrap().fill(0);
    let theirs = ours.clone();
    behind_another_threads_gate(
        device,
        move || {
            buffer.view_mut::<u32>().unwrap().slice_mut(..).unwrap().fill(0x5A5A_5A5A, &theirs).unwrap();
            buffer
        },
        |buffer, gate| {
            expect_host_read_waited(&buffer, gate, 0x5A);
        },
    );
}
