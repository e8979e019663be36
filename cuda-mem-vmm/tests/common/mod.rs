//! Shared setup of the VMM tests: the driver (the simulator unless `CUDA_MEM_DRIVER` is set),
//! devices and streams, host round trips through pinned staging buffers, the simulator's live
//! VMM objects, fault injection, raw reservations that block in-place growth, and open file
//! descriptors.
//!
//! Tests that count live objects or file descriptors, inject faults, or depend on where the
//! next reservation lands run in a child process of their own (`machine!`), so that the other
//! tests of the same binary, running on other threads, cannot disturb them.

#![allow(dead_code, unused_macros, unused_imports)]

use std::ffi::CStr;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::{Buffer, Device, ForeignMemory, MemoryResourceExt, PinnedMemoryResource, Stream, StreamOptions};
use cuda_mem_vmm::VirtualBuffer;
use cuda_sim::testing::LiveObjects;

/// The granularity of every simulated device (minimum and recommended).
pub const G: usize = 2 << 20;

/// The name of the enclosing test function as libtest's `--exact` filter expects it (the path
/// without the test binary's crate name), also from inside closures.
macro_rules! test_name {
    () => {{
        fn here() {}
        let full = std::any::type_name_of_val(&here);
        let full = full.strip_suffix("::here").expect("type_name of a nested fn ends in ::here");
        // Inside a closure (a `machine!` body), the closures are part of the path.
        let full = full.replace("::{{closure}}", "");
        full.split_once("::").map_or(full.as_str(), |(_, rest)| rest).to_owned()
    }};
}
pub(crate) use test_name;

/// Runs the enclosing test's body in a fresh process on a simulated machine configured by the
/// given `CUDA_SIM_*` settings (on a real driver, in this process).
macro_rules! machine {
    ($env:expr, $body:expr) => {
        cuda_sim::testing::in_simulated_machine(&$crate::common::test_name!(), $env, $body)
    };
}
pub(crate) use machine;

/// Installs the test driver and returns device `ordinal` with its context current on this
/// thread, or `None` (a declared skip) when the machine has fewer devices.
pub fn try_device(ordinal: usize) -> Option<Device> {
    cuda_sim::testing::driver().expect("the test driver loads");
    let count = Device::count().expect("devices can be counted");
    if ordinal >= count {
        cuda_sim::testing::skip(&format!("needs device {ordinal}, this machine has {count} device(s)"));
        return None;
    }
    let device = Device::new(ordinal).expect("the device exists");
    device.set_current().expect("the device's context can be made current");
    Some(device)
}

/// Device `ordinal` (which must exist), its context current.
pub fn device(ordinal: usize) -> Device {
    try_device(ordinal).expect("the device exists")
}

/// A new non-blocking stream on `device`.
pub fn stream(device: Device) -> Stream {
    Stream::new(device, StreamOptions::default().non_blocking()).expect("a stream can be created")
}

/// A view of `len` bytes at `offset` of `buffer`'s [`Buffer`] (which must outlive every use of
/// the view).
pub fn view(buffer: &VirtualBuffer, offset: usize, len: usize) -> Buffer {
    assert!(offset + len <= buffer.size(), "view [{offset}, +{len}) of a {}-byte buffer", buffer.size());
    // SAFETY: the range lies inside `buffer`, which the callers keep alive while they use the
    // view; the view claims no host access, so no host slice of it is ever lent.
    unsafe {
        Buffer::from_raw(
            buffer.ptr() + offset as u64,
            len,
            ForeignMemory::default().device(buffer.device()).device_accessible(true),
        )
    }
}

/// Writes `bytes` at `offset` of `buffer` on `stream` through a pinned staging buffer.
pub fn try_write(buffer: &VirtualBuffer, offset: usize, bytes: &[u8], stream: &Stream) -> cuda_mem_core::Result<()> {
    let mut staging = PinnedMemoryResource::current()?.allocate(bytes.len(), stream)?;
    staging.host_slice_mut()?.copy_from_slice(bytes);
    view(buffer, offset, bytes.len()).copy_from(&staging, stream)?;
    stream.synchronize()
}

/// [`try_write`], which must succeed.
pub fn write(buffer: &VirtualBuffer, offset: usize, bytes: &[u8], stream: &Stream) {
    try_write(buffer, offset, bytes, stream).expect("the write succeeds");
}

/// Reads `len` bytes at `offset` of `buffer` on `stream` through a pinned staging buffer.
pub fn try_read(buffer: &VirtualBuffer, offset: usize, len: usize, stream: &Stream) -> cuda_mem_core::Result<Vec<u8>> {
    let mut staging = PinnedMemoryResource::current()?.allocate(len, stream)?;
    staging.copy_from(&view(buffer, offset, len), stream)?;
    stream.synchronize()?;
    Ok(staging.host_slice()?.to_vec())
}

/// [`try_read`], which must succeed.
pub fn read(buffer: &VirtualBuffer, offset: usize, len: usize, stream: &Stream) -> Vec<u8> {
    try_read(buffer, offset, len, stream).expect("the read succeeds")
}

/// Fills `len` bytes at `offset` of `buffer` with `byte` on `stream` and waits.
pub fn fill(buffer: &VirtualBuffer, offset: usize, len: usize, byte: u8, stream: &Stream) {
    view(buffer, offset, len).fill(cuda_mem_core::FillPattern::U8(byte), stream).expect("the fill succeeds");
    stream.synchronize().expect("the stream synchronizes");
}

/// `len` bytes that differ from one position to the next (a period of 251, a prime that no
/// power-of-two offset divides) and with `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    let period: Vec<u8> = (0..251u32).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
    let mut bytes = Vec::with_capacity(len);
    while bytes.len() < len {
        let n = (len - bytes.len()).min(period.len());
        bytes.extend_from_slice(&period[..n]);
    }
    bytes
}

/// The simulator's live VMM objects (reservations, mappings, physical allocations); the pool
/// counts are zeroed, as the pinned staging buffers come and go in stream order.
pub fn vmm_live() -> LiveObjects {
    let live = cuda_sim::testing::live_objects(cuda_sim::testing::driver().expect("the test driver loads"))
        .expect("the simulator reports its live objects");
    LiveObjects { pools: 0, allocations: 0, ..live }
}

/// [`vmm_live`] on the simulator; `None` on a real driver, which does not count its objects (so
/// that comparisons of two such values hold there trivially).
pub fn sim_live() -> Option<LiveObjects> {
    cuda_sim::testing::on_simulator().then(vmm_live)
}

/// `base` plus the given reservations, mappings and physical allocations.
pub fn plus(base: LiveObjects, reservations: u64, mappings: u64, physical_allocations: u64) -> LiveObjects {
    LiveObjects {
        reservations: base.reservations + reservations,
        mappings: base.mappings + mappings,
        physical_allocations: base.physical_allocations + physical_allocations,
        ..base
    }
}

/// Makes the `nth` next call of `function` fail with `CUDA_ERROR_OUT_OF_MEMORY`.
pub fn inject(function: &CStr, nth: u32) {
    cuda_sim::testing::inject_failure(cuda_sim::testing::driver().expect("the test driver loads"), function, nth)
        .expect("the simulator arms the failure");
}

/// Makes both ways of waiting for a stream fail once (synchronizing it, then an event recorded
/// at its end), as a release that must wait for the stream tries them: it is deferred.
pub fn fail_the_next_wait_for_a_stream() {
    inject(c"cuStreamSynchronize", 1);
    inject(c"cuEventSynchronize", 1);
}

/// A raw address reservation, freed on drop.
#[derive(Debug)]
pub struct RawReservation {
    pub ptr: u64,
    pub size: usize,
}

impl RawReservation {
    /// Reserves `size` bytes, at `hint` if it is free.
    pub fn try_new(size: usize, hint: u64) -> cuda_mem_core::Result<RawReservation> {
        let d = cuda_sim::testing::driver().expect("the test driver loads");
        let mut ptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the other arguments are plain values.
        unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, 0, hint, 0)) }?;
        Ok(RawReservation { ptr, size })
    }
}

impl Drop for RawReservation {
    fn drop(&mut self) {
        let d = cuda_sim::testing::driver().expect("the test driver loads");
        // SAFETY: the exact range this value reserved, with nothing mapped in it.
        unsafe { cu_call!(d, cuMemAddressFree(self.ptr, self.size)) }.expect("the raw reservation is freed");
    }
}

/// Reserves the addresses right after `buffer`'s mapped bytes, so that growing it must move.
pub fn block_after(buffer: &VirtualBuffer, size: usize) -> RawReservation {
    let end = buffer.ptr() + buffer.mapped_size() as u64;
    let blocker = RawReservation::try_new(size, end).expect("the blocking reservation is made");
    assert_eq!(blocker.ptr, end, "the addresses after the buffer were free, so the hint was honoured");
    blocker
}

/// How many file descriptors this process has open.
pub use cuda_sim::testing::open_fds;

/// Asserts that `actual` equals `expected`, reporting the first difference rather than every
/// byte (buffers here are megabytes).
#[track_caller]
pub fn assert_bytes(actual: &[u8], expected: &[u8], what: &str) {
    if actual != expected {
        let at = actual.iter().zip(expected).position(|(a, b)| a != b);
        let show = |bytes: &[u8], at: usize| bytes[at..bytes.len().min(at + 16)].to_vec();
        match at {
            Some(at) => panic!(
                "{what}: differs at byte {at} of {}: {:?}, expected {:?}",
                expected.len(),
                show(actual, at),
                show(expected, at)
            ),
            None => panic!("{what}: {} bytes, expected {}", actual.len(), expected.len()),
        }
    }
}

/// The error's text, for a result that must be an error.
pub fn error_text<T: std::fmt::Debug, E: std::fmt::Display>(result: Result<T, E>) -> String {
    result.expect_err("the call must fail").to_string()
}

/// Asserts that `text` contains every one of `parts`.
#[track_caller]
pub fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{text:?} does not mention {part:?}");
    }
}
