//! Copies with options and batches of copies (`CopyOptions`, `copy_to_with`, `copy_batch`):
//! what they copy, what the source access order lets the caller do, and every refusal, on the
//! driver versions that have the calls and on those that do not.
//!
//! The copies run on a simulated CUDA 12.8, 13.0 and 13.2 driver each (`CUDA_SIM_DRIVER_VERSION`,
//! a child process per version), and the simulator's call counts show which path each took: a
//! batch is one `cuMemcpyBatchAsync` from CUDA 13.0 and one `cuMemcpyAsync` per copy before; one
//! copy with options is `cuMemcpyWithAttributesAsync` from CUDA 13.2 and `cuMemcpyAsync` before.

mod common;

use std::sync::Arc;

use common::{Gate, device, hold, stream};
use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::{CUgraph, CUstreamCaptureMode};
use cuda_mem_core::{
    BatchCopy, Buffer, CopyError, CopyOptions, Device, DeviceMemoryResource, DriverCapability, Error, ForeignMemory,
    Location, OverlapKind, OverlapMode, PinnedMemoryResource, ScopedBuffer, SourceAccessOrder, Stream, copy_batch,
    copy_batch_within,
};
use cuda_sim::testing::{in_simulated_machine, skip};

fn during_call() -> CopyOptions {
    CopyOptions::default().src_access_order(SourceAccessOrder::DuringApiCall)
}

fn driver_version() -> u32 {
    cuda_sim::testing::driver().expect("the test driver loads").version().expect("the driver has a version")
}

/// The installed driver's version when it is `wanted` (the simulator is configured so in its
/// child); else a declared skip (a real driver of another version).
fn on_driver(wanted: u32) -> bool {
    device();
    let installed = driver_version();
    if installed != wanted {
        skip(&format!("needs a driver reporting {wanted}, this one reports {installed}"));
    }
    installed == wanted
}

/// Runs `body` (the test `test`) in a simulated machine pretending to be the driver of
/// `version`, or where the driver installed is of it (else a declared skip).
fn on_a_driver_of(version: u32, test: &str, body: impl FnOnce()) {
    let version_text = version.to_string();
    in_simulated_machine(test, &[("CUDA_SIM_DRIVER_VERSION", &version_text)], || {
        if on_driver(version) {
            body();
        }
    });
}

/// The simulated drivers every copy test runs on: CUDA 12.8, 13.0 and 13.2.
const DRIVERS: [u32; 3] = [12080, 13000, 13020];

/// Runs `body` (the test `test`) once per driver version of `versions`: on the simulator in a
/// simulated machine pretending to be that driver, a child process each; on a real driver only
/// for the version it is (a declared skip when it is none of them).
fn on_each_driver(test: &str, versions: &[u32], body: impl Fn(u32)) {
    for &version in versions {
        let version_text = version.to_string();
        in_simulated_machine(test, &[("CUDA_SIM_DRIVER_VERSION", &version_text)], || {
            // A child runs every version's closure: the one of its own version runs the body.
            if driver_version() == version {
                body(version);
            }
        });
    }
    if !cuda_sim::testing::on_simulator() && !versions.contains(&driver_version()) {
        skip(&format!("needs a driver of one of {versions:?}, this one reports {}", driver_version()));
    }
}

/// The copy functions whose calls show which path a copy took.
const BATCH: &str = "cuMemcpyBatchAsync_v2";
const WITH_ATTRIBUTES: &str = "cuMemcpyWithAttributesAsync";
const PLAIN: &str = "cuMemcpyAsync";

/// Runs `copy` and checks, where the simulator counts calls, that it made `batches` calls of
/// `cuMemcpyBatchAsync`, `with_attributes` of `cuMemcpyWithAttributesAsync` and `plain` of
/// `cuMemcpyAsync`.
#[track_caller]
fn assert_path<R>(copy: impl FnOnce() -> R, (batches, with_attributes, plain): (u32, u32, u32), what: &str) -> R {
    let (out, counts) = cuda_sim::testing::count_calls_if_simulated(copy);
    counts.assert_calls(BATCH, batches, what);
    counts.assert_calls(WITH_ATTRIBUTES, with_attributes, what);
    counts.assert_calls(PLAIN, plain, what);
    out
}

/// The calls a batch of `copies` copies makes on a driver of `version`: one
/// `cuMemcpyBatchAsync` from CUDA 13.0, one `cuMemcpyAsync` per copy before.
fn batch_path(version: u32, copies: u32) -> (u32, u32, u32) {
    if version >= 13000 { (1, 0, 0) } else { (0, 0, copies) }
}

/// The calls one copy with options makes on a driver of `version`:
/// `cuMemcpyWithAttributesAsync` from CUDA 13.2, `cuMemcpyAsync` before.
fn single_path(version: u32) -> (u32, u32, u32) {
    if version >= 13020 { (0, 1, 0) } else { (0, 0, 1) }
}

fn pinned(bytes: &[u8], stream: &Stream) -> Buffer {
    // A pool of its own rather than the current one, which needs CUDA 13.0: the 12.8 test uses it too.
    let mut buffer = PinnedMemoryResource::new(Default::default()).unwrap().allocate(bytes.len(), stream).unwrap();
    stream.synchronize().unwrap();
    buffer.host_slice_mut().unwrap().copy_from_slice(bytes);
    buffer
}

fn zeroed(len: usize, pool: &Arc<DeviceMemoryResource>, stream: &Stream) -> Buffer {
    let mut buffer = pool.allocate(len, stream).unwrap();
    buffer.fill(cuda_mem_core::FillPattern::U8(0), stream).unwrap();
    buffer
}

/// A pinned source of 8 bytes of 4, and two zeroed 8-byte device buffers of a pool of their own.
fn a_source_and_two_destinations(device: Device, stream: &Stream) -> (Buffer, Buffer, Buffer) {
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    (pinned(&[4; 8], stream), zeroed(8, &pool, stream), zeroed(8, &pool, stream))
}

#[test]
fn a_batch_copies_each_range_with_its_options() {
    on_each_driver("a_batch_copies_each_range_with_its_options", &DRIVERS, a_batch_copies_each_range);
}

fn a_batch_copies_each_range(version: u32) {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let source = pinned(&(0..32).collect::<Vec<u8>>(), &s);
    let (mut a, mut b, mut c) = (zeroed(16, &pool, &s), zeroed(8, &pool, &s), zeroed(8, &pool, &s));
    let hinted = CopyOptions::default()
        .src_location_hint(Location::Host)
        .dst_location_hint(device)
        .overlap_mode(OverlapMode::PreferOverlapWithCompute);
    let options = [hinted, hinted, CopyOptions::default().src_access_order(SourceAccessOrder::Any)];
    let copies = [
        BatchCopy::range(&source, 0, &mut a).unwrap(),
        BatchCopy::range(&source, 16, &mut b).unwrap(),
        BatchCopy::range(&source, 24, &mut c).unwrap(),
    ];
    assert_path(|| copy_batch(&s, copies, &options).unwrap(), batch_path(version, 3), "the batch");
    assert_eq!(a.to_vec::<u8>(&s).unwrap(), (0..16).collect::<Vec<u8>>());
    assert_eq!(b.to_vec::<u8>(&s).unwrap(), (16..24).collect::<Vec<u8>>());
    assert_eq!(c.to_vec::<u8>(&s).unwrap(), (24..32).collect::<Vec<u8>>());
}

#[test]
fn during_api_call_lets_the_source_be_reused_at_once() {
    // A CUDA 12.8 driver has no batch that reads its source during the call (see
    // `a_cuda_12_8_driver_batches_plain_copies_only`).
    on_each_driver("during_api_call_lets_the_source_be_reused_at_once", &DRIVERS[1..], during_api_call_reuses);
}

fn during_api_call_reuses(_version: u32) {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let source = pinned(&[1; 16], &s);
    let (mut early, mut late) = (zeroed(16, &pool, &s), zeroed(16, &pool, &s));
    s.synchronize().unwrap();
    let (gate, _open) = Gate::new();
    hold(gate, s.handle());
    let copy = || copy_batch(&s, [BatchCopy::new(&source, &mut early).unwrap()], during_call()).unwrap();
    assert_path(copy, (1, 0, 0), "one batch, read during the call");
    copy_batch(&s, [BatchCopy::new(&source, &mut late).unwrap()], CopyOptions::default()).unwrap();
    // SAFETY: pinned memory of 16 bytes, host-accessible at its address; the gate holds the
    // stream's work, so nothing reads it now (the during-call copy already has).
    unsafe { std::ptr::write_bytes(source.ptr() as *mut u8, 2, 16) };
    gate.open();
    assert_eq!(early.to_vec::<u8>(&s).unwrap(), [1; 16], "read during the call");
    assert_eq!(late.to_vec::<u8>(&s).unwrap(), [2; 16], "read in stream order");
}

#[test]
fn copies_with_options_between_views_and_buffers() {
    on_each_driver("copies_with_options_between_views_and_buffers", &DRIVERS, copies_between_views_and_buffers);
}

fn copies_between_views_and_buffers(version: u32) {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut a = pool.allocate(16, &s).unwrap();
    a.copy_from_slice(&[7u32, 8, 9, 10], &s).unwrap();
    let mut b = zeroed(16, &pool, &s);
    assert_path(|| a.copy_to_with(&mut b, &s, CopyOptions::default()).unwrap(), single_path(version), "copy_to_with");
    assert_eq!(b.to_vec::<u32>(&s).unwrap(), [7, 8, 9, 10]);
    let mut c = zeroed(16, &pool, &s);
    c.copy_from_with(&b, &s, CopyOptions::default().src_access_order(SourceAccessOrder::Any)).unwrap();
    assert_eq!(c.to_vec::<u32>(&s).unwrap(), [7, 8, 9, 10]);
    let view = a.view::<u32>().unwrap();
    let mut d = zeroed(8, &pool, &s);
    let into_view = || {
        d.view_mut::<u32>().unwrap().copy_from_with(&view.slice(2..).unwrap(), &s, CopyOptions::default()).unwrap();
    };
    assert_path(into_view, single_path(version), "a view's copy_from_with");
    assert_eq!(d.to_vec::<u32>(&s).unwrap(), [9, 10]);
    let mut e = zeroed(4, &pool, &s);
    assert!(matches!(a.copy_to_with(&mut e, &s, CopyOptions::default()), Err(Error::SizeMismatch { .. })));
    // A batch of views.
    let (mut x, mut y) = (zeroed(8, &pool, &s), zeroed(8, &pool, &s));
    let (first, second) = (view.slice(..2).unwrap(), view.slice(2..).unwrap());
    let (mut xv, mut yv) = (x.view_mut::<u32>().unwrap(), y.view_mut::<u32>().unwrap());
    let copies = [BatchCopy::views(&second, &mut xv).unwrap(), BatchCopy::views(&first, &mut yv).unwrap()];
    assert_path(|| copy_batch(&s, copies, CopyOptions::default()).unwrap(), batch_path(version, 2), "a batch of views");
    assert_eq!(x.to_vec::<u32>(&s).unwrap(), [9, 10]);
    assert_eq!(y.to_vec::<u32>(&s).unwrap(), [7, 8]);
}

/// A buffer over `len` bytes of `buffer` from `offset` (memory wrapped from a raw pointer, as
/// interop gives: it may alias other buffers).
fn alias(buffer: &ScopedBuffer<'_>, offset: usize, len: usize) -> Buffer {
    // SAFETY: the bytes lie inside `buffer`, which outlives every alias the tests make.
    unsafe {
        Buffer::from_raw(
            buffer.ptr() + offset as u64,
            len,
            ForeignMemory::default().device(buffer.device()).device_accessible(true),
        )
    }
}

#[test]
fn refusals_come_before_any_driver_call() {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let whole = zeroed(64, &pool, &s);
    let (src, mut dst) = (zeroed(16, &pool, &s), zeroed(16, &pool, &s));
    assert!(matches!(
        copy_batch(&s, Vec::<BatchCopy<'_>>::new(), CopyOptions::default()),
        Err(Error::EmptyBatch { operation: "copy_batch" })
    ));
    let two = [CopyOptions::default(); 2];
    assert!(matches!(
        copy_batch(&s, [BatchCopy::new(&src, &mut dst).unwrap()], &two),
        Err(Error::Copy(CopyError::OptionsLengthMismatch { copies: 1, options: 2 }))
    ));
    // Memory wrapped twice: two destinations that meet, and a destination another copy reads.
    let (mut d1, mut d2, s3) = (alias(&whole, 0, 16), alias(&whole, 8, 16), alias(&whole, 40, 8));
    let mut d4 = alias(&whole, 32, 16);
    let mut d6 = zeroed(8, &pool, &s);
    let r = copy_batch(
        &s,
        [BatchCopy::new(&src, &mut d1).unwrap(), BatchCopy::new(&src, &mut d2).unwrap()],
        CopyOptions::default(),
    );
    assert!(
        matches!(r, Err(Error::Copy(CopyError::Overlap { first: 0, second: 1, kind: OverlapKind::Destinations }))),
        "{r:?}"
    );
    let r = copy_batch(
        &s,
        [BatchCopy::new(&s3, &mut d6).unwrap(), BatchCopy::range(&src, 0, &mut d4).unwrap()],
        CopyOptions::default(),
    );
    assert!(
        matches!(
            r,
            Err(Error::Copy(CopyError::Overlap { first: 1, second: 0, kind: OverlapKind::DestinationAndSource }))
        ),
        "{r:?}"
    );
    // The legacy default stream; the per-thread one is accepted.
    let legacy = Stream::legacy_default(device);
    let r = copy_batch(&legacy, [BatchCopy::new(&src, &mut dst).unwrap()], CopyOptions::default());
    assert!(matches!(r, Err(Error::Copy(CopyError::LegacyStream { operation: "copy_batch" }))), "{r:?}");
    let r = src.copy_to_with(&mut dst, &legacy, CopyOptions::default());
    assert!(matches!(r, Err(Error::Copy(CopyError::LegacyStream { operation: "copy_to_with" }))), "{r:?}");
    let per_thread = Stream::per_thread_default(device);
    // The per-thread stream is not ordered after `s`, where `dst` was filled (ThreadSanitizer
    // saw the copy race the fill): wait for that first.
    s.synchronize().unwrap();
    copy_batch(&per_thread, [BatchCopy::new(&src, &mut dst).unwrap()], CopyOptions::default()).unwrap();
    per_thread.synchronize().unwrap();
    // A capturing stream; the capture is left as it was.
    let d = cuda_sim::testing::driver().unwrap();
    // SAFETY: a live stream of the current context.
    unsafe {
        cu_call!(d, cuStreamBeginCapture_v2(s.shared_handle(), CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED))
    }
    .unwrap();
    let r = copy_batch(&s, [BatchCopy::new(&src, &mut dst).unwrap()], CopyOptions::default());
    assert!(matches!(r, Err(Error::Copy(CopyError::Capturing { operation: "copy_batch" }))), "{r:?}");
    let r = dst.copy_from_with(&src, &s, CopyOptions::default());
    assert!(matches!(r, Err(Error::Copy(CopyError::Capturing { operation: "copy_from_with" }))), "{r:?}");
    assert!(s.is_capturing().unwrap());
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out-pointer; the graph is destroyed once.
    unsafe {
        cu_call!(d, cuStreamEndCapture(s.handle(), &mut graph)).unwrap();
        cu_call!(d, cuGraphDestroy(graph)).unwrap();
    }
}

#[test]
fn a_cuda_13_0_driver_falls_back_for_single_copies_unless_the_source_is_read_during_the_call() {
    let test = "a_cuda_13_0_driver_falls_back_for_single_copies_unless_the_source_is_read_during_the_call";
    on_a_driver_of(13000, test, falls_back_on_cuda_13_0);
}

fn falls_back_on_cuda_13_0() {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let src = pinned(&[3; 8], &s);
    let mut dst = zeroed(8, &pool, &s);
    let hinted = CopyOptions::default().dst_location_hint(device);
    assert_path(|| dst.copy_from_with(&src, &s, hinted).unwrap(), (0, 0, 1), "a plain cuMemcpyAsync");
    assert_eq!(dst.to_vec::<u8>(&s).unwrap(), [3; 8]);
    let r = assert_path(|| src.copy_to_with(&mut dst, &s, during_call()), (0, 0, 0), "refused before any copy");
    let Err(
        error @ Error::DriverTooOld {
            capability: DriverCapability::CopiesWithAttributes,
            needs: 13020,
            installed: 13000,
        },
    ) = r
    else {
        panic!("{r:?}")
    };
    let text = error.to_string();
    assert!(
        text.contains("need CUDA 13.2 or newer") && text.contains("use SourceAccessOrder::Stream or Any"),
        "{text}"
    );
}

#[test]
fn a_cuda_13_2_driver_copies_with_attributes() {
    on_a_driver_of(13020, "a_cuda_13_2_driver_copies_with_attributes", || {
        let device = device();
        let s = stream(device);
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let source = pinned(&[1; 16], &s);
        let mut early = zeroed(16, &pool, &s);
        s.synchronize().unwrap();
        let (gate, _open) = Gate::new();
        hold(gate, s.handle());
        let copy = || source.copy_to_with(&mut early, &s, during_call()).unwrap();
        assert_path(copy, (0, 1, 0), "one cuMemcpyWithAttributesAsync");
        // SAFETY: pinned memory of 16 bytes, host-accessible at its address; the
        // during-call copy has read it, and the gate holds every other use.
        unsafe { std::ptr::write_bytes(source.ptr() as *mut u8, 2, 16) };
        gate.open();
        assert_eq!(early.to_vec::<u8>(&s).unwrap(), [1; 16]);
    });
}

#[test]
fn a_cuda_12_8_driver_batches_plain_copies_only() {
    on_a_driver_of(12080, "a_cuda_12_8_driver_batches_plain_copies_only", || {
        let device = device();
        let s = stream(device);
        let (src, mut a, mut b) = a_source_and_two_destinations(device, &s);
        let any = CopyOptions::default().src_access_order(SourceAccessOrder::Any);
        copy_batch(&s, [BatchCopy::new(&src, &mut a).unwrap(), BatchCopy::new(&src, &mut b).unwrap()], any).unwrap();
        assert_eq!(a.to_vec::<u8>(&s).unwrap(), [4; 8]);
        assert_eq!(b.to_vec::<u8>(&s).unwrap(), [4; 8]);
        let r = copy_batch(&s, [BatchCopy::new(&src, &mut a).unwrap()], during_call());
        let Err(
            error @ Error::DriverTooOld { capability: DriverCapability::CopyBatches, needs: 13000, installed: 12080 },
        ) = r
        else {
            panic!("{r:?}")
        };
        let text = error.to_string();
        assert!(text.contains("batched copies reading their source") && text.contains("is CUDA 12.8"), "{text}");
    });
}

#[test]
fn a_batch_refused_half_way_orders_the_frees_after_the_copies_it_enqueued() {
    // On a CUDA 12.8 driver a batch is one `cuMemcpyAsync` per copy; the second is refused here,
    // the first stays enqueued on the copy's stream, so the destination's free on its own
    // stream must still wait for that stream.
    on_a_driver_of(12080, "a_batch_refused_half_way_orders_the_frees_after_the_copies_it_enqueued", || {
        if !cuda_sim::testing::simulator_only("fault injection") {
            return;
        }
        let device = device();
        let (home, copier) = (stream(device), stream(device));
        let (src, mut a, mut b) = a_source_and_two_destinations(device, &home);
        home.synchronize().unwrap();
        let d = cuda_sim::testing::driver().unwrap();
        cuda_sim::testing::inject_failure(d, c"cuMemcpyAsync", 2).unwrap();
        let copies = [BatchCopy::new(&src, &mut a).unwrap(), BatchCopy::new(&src, &mut b).unwrap()];
        let r = copy_batch(&copier, copies, CopyOptions::default());
        assert!(matches!(r, Err(Error::Cuda(cuda_mem_core::sys::CudaError::Driver(_)))), "{r:?}");
        let (_, counts) = cuda_sim::testing::count_calls_if_simulated(|| drop(a));
        counts.assert_calls("cuStreamWaitEvent", 1, "the free of the copy's destination waits for its stream");
        copier.synchronize().unwrap();
        home.synchronize().unwrap();
    });
}

#[test]
fn copies_within_one_buffer_move_disjoint_ranges_and_refuse_the_rest() {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let mut buffer = pool.allocate(16, &s).unwrap();
    buffer.copy_from_slice(&(0u8..16).collect::<Vec<_>>(), &s).unwrap();
    copy_batch_within(&s, &mut buffer, [(0..4, 12), (4..8, 8), (8..8, 0)], CopyOptions::default()).unwrap();
    assert_eq!(buffer.to_vec::<u8>(&s).unwrap(), [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 0, 1, 2, 3]);

    let refused = |copies: Vec<(std::ops::Range<usize>, usize)>, buffer: &mut Buffer| {
        copy_batch_within(&s, buffer, copies, CopyOptions::default()).unwrap_err()
    };
    // Past the end, through the source or the destination, and a range that runs backwards.
    let e = refused(Vec::new(), &mut buffer);
    assert!(matches!(e, Error::EmptyBatch { .. }), "{e:?}");
    let e = refused(vec![(0..4, 8), (12..17, 0)], &mut buffer);
    assert!(matches!(e, Error::Copy(CopyError::OutOfRange { copy: 1, start: 12, end: 17, size: 16 })), "{e:?}");
    let e = refused(vec![(0..4, 13)], &mut buffer);
    assert!(matches!(e, Error::Copy(CopyError::OutOfRange { copy: 0, start: 13, end: 17, size: 16 })), "{e:?}");
    #[allow(clippy::reversed_empty_ranges)]
    let e = refused(vec![(4..2, 8)], &mut buffer);
    assert!(matches!(e, Error::Copy(CopyError::OutOfRange { copy: 0, start: 4, end: 2, .. })), "{e:?}");
    let e = refused(vec![(0..4, usize::MAX - 1)], &mut buffer);
    assert!(matches!(e, Error::Copy(CopyError::OutOfRange { end: usize::MAX, .. })), "{e:?}");
    // A copy that reads what it writes, and two that meet.
    let e = refused(vec![(0..8, 8), (0..8, 4)], &mut buffer);
    assert!(matches!(e, Error::Copy(CopyError::SelfOverlap { copy: 1 })), "{e:?}");
    assert!(e.to_string().contains("copy 1 of the batch reads bytes it also writes"), "{e}");
    let e = refused(vec![(0..4, 8), (4..8, 10)], &mut buffer);
    assert!(
        matches!(e, Error::Copy(CopyError::Overlap { first: 0, second: 1, kind: OverlapKind::Destinations })),
        "{e:?}"
    );
    // Nothing was copied by a refused batch.
    assert_eq!(buffer.to_vec::<u8>(&s).unwrap(), [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 0, 1, 2, 3]);
}

#[test]
fn a_batched_copy_whose_own_ranges_meet_is_refused() {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let whole = zeroed(32, &pool, &s);
    // Two views of one buffer, made with `unsafe`: the copy's source and destination meet.
    let (src, mut dst) = (alias(&whole, 0, 16), alias(&whole, 8, 16));
    let r = copy_batch(&s, [BatchCopy::new(&src, &mut dst).unwrap()], CopyOptions::default());
    assert!(matches!(r, Err(Error::Copy(CopyError::SelfOverlap { copy: 0 }))), "{r:?}");
}

#[test]
fn a_batched_copy_of_buffers_of_two_sizes_is_refused_whichever_is_larger() {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let (large, small) = (pinned(&[7; 32], &s), pinned(&[9; 16], &s));
    let (mut large_dst, mut small_dst) = (zeroed(32, &pool, &s), zeroed(16, &pool, &s));
    // A larger source was cut short to the destination's size (the first 16 bytes copied).
    let r = BatchCopy::new(&large, &mut small_dst);
    assert!(
        matches!(r, Err(Error::SizeMismatch { what: "the destination buffer", expected: 32, actual: 16 })),
        "{r:?}"
    );
    let r = BatchCopy::new(&small, &mut large_dst);
    assert!(
        matches!(r, Err(Error::SizeMismatch { what: "the destination buffer", expected: 16, actual: 32 })),
        "{r:?}"
    );
    // The copies with options refuse it the same way, before any driver call.
    let r = large.copy_to_with(&mut small_dst, &s, CopyOptions::default());
    assert!(matches!(r, Err(Error::SizeMismatch { expected: 32, actual: 16, .. })), "{r:?}");
    // A part of a larger source is copied when named: `range`.
    copy_batch(&s, [BatchCopy::range(&large, 16, &mut small_dst).unwrap()], CopyOptions::default()).unwrap();
    assert_eq!(small_dst.to_vec::<u8>(&s).unwrap(), [7; 16]);
    assert_eq!(large_dst.to_vec::<u8>(&s).unwrap(), [0; 32], "nothing was copied into the larger destination");
}

#[test]
fn a_copy_whose_own_ranges_meet_is_refused_however_the_batch_is_made() {
    let device = device();
    let s = stream(device);
    let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
    let whole = zeroed(64, &pool, &s);
    let (elsewhere, mut apart) = (zeroed(8, &pool, &s), zeroed(8, &pool, &s));
    let refused = |r: cuda_mem_core::Result<()>, copy: usize| {
        assert!(matches!(r, Err(Error::Copy(CopyError::SelfOverlap { copy: c })) if c == copy), "{r:?}");
    };
    // `range`: bytes 12..20 of a source over 0..32 into a destination over 16..24.
    let (src, mut dst) = (alias(&whole, 0, 32), alias(&whole, 16, 8));
    let batch = [BatchCopy::new(&elsewhere, &mut apart).unwrap(), BatchCopy::range(&src, 12, &mut dst).unwrap()];
    refused(copy_batch(&s, batch, CopyOptions::default()), 1);
    // `views`: typed views of two buffers wrapped over 32..48 and 36..52.
    let (a, mut b) = (alias(&whole, 32, 16), alias(&whole, 36, 16));
    let view = a.view::<u32>().unwrap();
    let mut view_mut = b.view_mut::<u32>().unwrap();
    refused(copy_batch(&s, [BatchCopy::views(&view, &mut view_mut).unwrap()], during_call()), 0);
    // Ranges that only touch are not an overlap: 0..8 into 8..16.
    let (src, mut dst) = (alias(&whole, 0, 8), alias(&whole, 8, 8));
    copy_batch(&s, [BatchCopy::new(&src, &mut dst).unwrap()], CopyOptions::default()).unwrap();
    s.synchronize().unwrap();
}
