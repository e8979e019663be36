//! Random programs against a host model, and many threads at once.
//!
//! The property test runs random sequences of memsets, uploads, device-to-device copies and
//! checks on three device buffers across the legacy stream, a blocking stream and a non-blocking
//! stream. Before each operation it orders its stream after every other stream that touched the
//! same buffers, with `cuEventRecord` + `cuStreamWaitEvent` (or relying on the legacy stream's
//! implicit synchronization with the blocking stream), exactly as a correct program must; the
//! final contents must then match the model. A missing or broken ordering makes the contents
//! depend on timing, which the model catches.

mod common;

use std::collections::BTreeSet;

use common::{
    DeviceBuffer, NULL_STREAM, Pinned, blocking_stream, code, driver, event, non_blocking_stream, record, sync,
    use_device, wait_event,
};
use cuda_mem_sys::cu_call;
use cuda_mem_sys::types::{CUevent, CUevent_flags, CUresult, CUstream};
use proptest::prelude::*;

const BUFFERS: usize = 3;
const SIZE: usize = 64;
/// Stream 0 is the legacy default stream (used through the synchronous calls), 1 a blocking
/// stream, 2 a non-blocking stream.
const STREAMS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// `cuMemsetD8[Async]` of `len` bytes at `offset`.
    Memset8 { buf: usize, offset: usize, len: usize, value: u8, stream: usize },
    /// `cuMemsetD32[Async]` of `count` words at word `index`.
    Memset32 { buf: usize, index: usize, count: usize, value: u32, stream: usize },
    /// `cuMemcpyHtoD[Async]` from pageable or pinned memory.
    Upload { buf: usize, offset: usize, data: Vec<u8>, pinned: bool, stream: usize },
    /// `cuMemcpyDtoD[Async]` (or `cuMemcpy[Async]`) between two different buffers.
    Copy { src: usize, src_offset: usize, dst: usize, dst_offset: usize, len: usize, generic: bool, stream: usize },
    /// Reads a buffer on a stream, synchronizes that stream, and compares with the model.
    Check { buf: usize, stream: usize },
}

/// An offset inside a buffer and a length that fits after it (possibly 0).
fn range() -> impl Strategy<Value = (usize, usize)> {
    (0..SIZE).prop_flat_map(|offset| (Just(offset), 0..=SIZE - offset))
}

fn op() -> impl Strategy<Value = Op> {
    let buf = 0..BUFFERS;
    let stream = 0..STREAMS;
    prop_oneof![
        3 => (buf.clone(), range(), any::<u8>(), stream.clone())
            .prop_map(|(buf, (offset, len), value, stream)| Op::Memset8 { buf, offset, len, value, stream }),
        1 => (buf.clone(), 0..SIZE / 4, any::<u32>(), stream.clone()).prop_flat_map(|(buf, index, value, stream)| {
            (0..=SIZE / 4 - index).prop_map(move |count| Op::Memset32 { buf, index, count, value, stream })
        }),
        2 => (buf.clone(), range(), any::<bool>(), stream.clone(), any::<u8>()).prop_map(
            |(buf, (offset, len), pinned, stream, seed)| {
                let data = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
                Op::Upload { buf, offset, data, pinned, stream }
            }
        ),
        3 => (buf.clone(), 1..BUFFERS, 0..SIZE, 0..SIZE, 0..=SIZE, any::<bool>(), stream.clone()).prop_map(
            |(src, step, src_offset, dst_offset, len, generic, stream)| {
                let len = len.min(SIZE - src_offset).min(SIZE - dst_offset);
                Op::Copy { src, src_offset, dst: (src + step) % BUFFERS, dst_offset, len, generic, stream }
            }
        ),
        1 => (buf, stream).prop_map(|(buf, stream)| Op::Check { buf, stream }),
    ]
}

/// The streams and events of one run, and which streams touched each buffer since they were
/// last ordered.
struct Run {
    streams: [CUstream; STREAMS],
    events: [CUevent; STREAMS],
    touched: Vec<BTreeSet<usize>>,
    buffers: Vec<DeviceBuffer>,
    /// Pinned sources of asynchronous uploads, kept until the run is synchronized.
    keep: Vec<Pinned>,
}

impl Run {
    fn new() -> Run {
        let streams = [NULL_STREAM, blocking_stream(), non_blocking_stream()];
        let events = [(); STREAMS].map(|()| event(CUevent_flags::CU_EVENT_DISABLE_TIMING));
        let buffers = (0..BUFFERS).map(|_| DeviceBuffer::with(&[0; SIZE])).collect();
        Run { streams, events, touched: vec![BTreeSet::new(); BUFFERS], buffers, keep: Vec::new() }
    }

    /// Orders `stream` after every other stream that touched `buffers`, then records that only
    /// `stream` has (everything before is ordered before it).
    fn order(&mut self, stream: usize, buffers: &[usize]) {
        let mut after = BTreeSet::new();
        for &b in buffers {
            after.extend(self.touched[b].iter().copied().filter(|&t| t != stream));
        }
        for t in after {
            // The legacy stream and the blocking stream synchronize implicitly.
            if matches!((t, stream), (0, 1) | (1, 0)) {
                continue;
            }
            record(self.events[t], self.streams[t]);
            wait_event(self.streams[stream], self.events[t]);
        }
        for &b in buffers {
            self.touched[b] = BTreeSet::from([stream]);
        }
    }

    fn ptr(&self, buf: usize, offset: usize) -> u64 {
        self.buffers[buf].ptr + offset as u64
    }

    /// Runs one operation; returns what a check read, if it was a check.
    fn apply(&mut self, op: &Op) -> Option<Vec<u8>> {
        let d = driver();
        match *op {
            Op::Memset8 { buf, offset, len, value, stream } => {
                self.order(stream, &[buf]);
                let (dst, s) = (self.ptr(buf, offset), self.streams[stream]);
                // SAFETY: no host pointers; the range is inside the buffer.
                unsafe {
                    if stream == 0 {
                        cu_call!(d, cuMemsetD8_v2(dst, value, len))
                    } else {
                        cu_call!(d, cuMemsetD8Async(dst, value, len, s))
                    }
                }
                .unwrap();
            }
            Op::Memset32 { buf, index, count, value, stream } => {
                self.order(stream, &[buf]);
                let (dst, s) = (self.ptr(buf, 4 * index), self.streams[stream]);
                // SAFETY: as above.
                unsafe {
                    if stream == 0 {
                        cu_call!(d, cuMemsetD32_v2(dst, value, count))
                    } else {
                        cu_call!(d, cuMemsetD32Async(dst, value, count, s))
                    }
                }
                .unwrap();
            }
            Op::Upload { buf, offset, ref data, pinned, stream } => {
                self.order(stream, &[buf]);
                let (dst, s, len) = (self.ptr(buf, offset), self.streams[stream], data.len());
                let source = if pinned && len > 0 {
                    let source = Pinned::new(len);
                    source.write(data);
                    let ptr = source.ptr.cast_const().cast();
                    self.keep.push(source);
                    ptr
                } else {
                    data.as_ptr().cast()
                };
                // SAFETY: `source` is valid for `len` bytes: pageable data is staged by the call,
                // pinned sources are kept until the run is synchronized.
                unsafe {
                    if stream == 0 {
                        cu_call!(d, cuMemcpyHtoD_v2(dst, source, len))
                    } else {
                        cu_call!(d, cuMemcpyHtoDAsync_v2(dst, source, len, s))
                    }
                }
                .unwrap();
            }
            Op::Copy { src, src_offset, dst, dst_offset, len, generic, stream } => {
                self.order(stream, &[src, dst]);
                let (to, from, s) = (self.ptr(dst, dst_offset), self.ptr(src, src_offset), self.streams[stream]);
                // SAFETY: no host pointers; both ranges are inside their buffers.
                unsafe {
                    match (stream == 0, generic) {
                        (true, false) => cu_call!(d, cuMemcpyDtoD_v2(to, from, len)),
                        (true, true) => cu_call!(d, cuMemcpy(to, from, len)),
                        (false, false) => cu_call!(d, cuMemcpyDtoDAsync_v2(to, from, len, s)),
                        (false, true) => cu_call!(d, cuMemcpyAsync(to, from, len, s)),
                    }
                }
                .unwrap();
            }
            Op::Check { buf, stream } => {
                self.order(stream, &[buf]);
                let out = Pinned::new(SIZE);
                let (src, s) = (self.ptr(buf, 0), self.streams[stream]);
                // SAFETY: `out` is valid for SIZE bytes until the stream is synchronized below.
                unsafe { cu_call!(d, cuMemcpyDtoHAsync_v2(out.ptr.cast(), src, SIZE, s)) }.unwrap();
                sync(s);
                return Some(out.read());
            }
        }
        None
    }

    /// Waits for everything, then reads every buffer.
    fn finish(mut self) -> Vec<Vec<u8>> {
        for &s in &self.streams {
            sync(s);
        }
        self.keep.clear();
        let contents = self.buffers.iter().map(DeviceBuffer::read).collect();
        let d = driver();
        // SAFETY: the handles were created by this run and are destroyed once.
        unsafe {
            for &s in &self.streams[1..] {
                cu_call!(d, cuStreamDestroy_v2(s)).unwrap();
            }
            for &e in &self.events {
                cu_call!(d, cuEventDestroy_v2(e)).unwrap();
            }
        }
        contents
    }
}

/// What the buffers hold after `op`, on the host.
fn model(buffers: &mut [[u8; SIZE]], op: &Op) {
    match *op {
        Op::Memset8 { buf, offset, len, value, .. } => buffers[buf][offset..offset + len].fill(value),
        Op::Memset32 { buf, index, count, value, .. } => {
            for word in buffers[buf][4 * index..4 * (index + count)].chunks_mut(4) {
                word.copy_from_slice(&value.to_le_bytes());
            }
        }
        Op::Upload { buf, offset, ref data, .. } => buffers[buf][offset..offset + data.len()].copy_from_slice(data),
        Op::Copy { src, src_offset, dst, dst_offset, len, .. } => {
            let bytes = buffers[src][src_offset..src_offset + len].to_vec();
            buffers[dst][dst_offset..dst_offset + len].copy_from_slice(&bytes);
        }
        Op::Check { .. } => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_programs_match_the_host_model(ops in proptest::collection::vec(op(), 1..40)) {
        use_device(0);
        let mut expected = vec![[0u8; SIZE]; BUFFERS];
        let mut run = Run::new();
        for (i, op) in ops.iter().enumerate() {
            model(&mut expected, op);
            if let Some(seen) = run.apply(op) {
                let Op::Check { buf, .. } = *op else { unreachable!() };
                prop_assert_eq!(&seen[..], &expected[buf][..], "check at step {} ({:?})", i, op);
            }
        }
        let contents = run.finish();
        for (buf, (seen, expected)) in contents.iter().zip(&expected).enumerate() {
            prop_assert_eq!(&seen[..], &expected[..], "buffer {} at the end", buf);
        }
    }
}

/// A small deterministic generator for the threads test.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % below
    }
}

#[test]
fn many_threads_allocate_copy_and_free_at_once() {
    const THREADS: usize = 8;
    const ROUNDS: usize = 25;
    let ctx = use_device(0) as usize;
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            scope.spawn(move || {
                let d = driver();
                // SAFETY: `ctx` is the live primary context.
                unsafe { cu_call!(d, cuCtxSetCurrent(ctx as cuda_mem_sys::types::CUcontext)) }.unwrap();
                let mut rng = Lcg(t as u64 + 1);
                let s = if t % 2 == 0 { non_blocking_stream() } else { blocking_stream() };
                for round in 0..ROUNDS {
                    let len = 1 + rng.next(20_000);
                    let data: Vec<u8> = (0..len).map(|i| (i + t + round) as u8).collect();
                    let (a, b) = (DeviceBuffer::new(len), DeviceBuffer::new(len));
                    let pinned = Pinned::new(len);
                    // SAFETY: `data` and `pinned` are valid for `len` bytes until the stream is
                    // synchronized below.
                    unsafe {
                        cu_call!(d, cuMemcpyHtoDAsync_v2(a.ptr, data.as_ptr().cast(), len, s)).unwrap();
                        cu_call!(d, cuMemcpyDtoDAsync_v2(b.ptr, a.ptr, len, s)).unwrap();
                        cu_call!(d, cuMemcpyDtoHAsync_v2(pinned.ptr.cast(), b.ptr, len, s)).unwrap();
                    }
                    sync(s);
                    assert_eq!(pinned.read(), data, "thread {t} round {round}");
                    let value = rng.next(256) as u8;
                    // SAFETY: no host pointers.
                    unsafe { cu_call!(d, cuMemsetD8Async(b.ptr, value, len, s)) }.unwrap();
                    sync(s);
                    assert_eq!(b.read(), vec![value; len], "thread {t} round {round}");
                    // Synchronous copies on the legacy stream, shared by every thread.
                    common::htod(a.ptr, &data[..len / 2]);
                    assert_eq!(common::dtoh(a.ptr, len / 2), &data[..len / 2]);
                    let (pa, pb) = (a.ptr, b.ptr);
                    drop((a, b));
                    // Freed pointers are invalid at once, in this thread and every other.
                    // SAFETY: no host pointers.
                    unsafe {
                        assert_eq!(code!(d, cuMemFree_v2(pa)), CUresult::CUDA_ERROR_INVALID_VALUE);
                        assert_eq!(code!(d, cuMemsetD8_v2(pb, 0, 1)), CUresult::CUDA_ERROR_INVALID_VALUE);
                    }
                }
                // SAFETY: the stream was created by this thread and is destroyed once.
                unsafe { cu_call!(d, cuStreamDestroy_v2(s)) }.unwrap();
            });
        }
    });
}
