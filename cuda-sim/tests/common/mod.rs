//! Helpers shared by the simulator's integration tests: the drivers, contexts, buffers, child
//! processes for tests that need a fresh simulator, and gates that hold a stream.
//!
//! Every test binary includes this module, and none uses all of it.
#![allow(dead_code, unused_macros, unused_imports)]

use std::ffi::{c_int, c_void};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

pub use cuda_mem_sys::types::{
    CUcontext, CUdevice_attribute, CUdeviceptr, CUevent, CUevent_flags, CUmemAccess_flags, CUmemAccessDesc,
    CUmemLocation, CUmemLocationType, CUmemoryPool, CUpointer_attribute, CUresult, CUstream, CUstream_flags,
};
pub use cuda_mem_sys::{Driver, DriverOptions, StreamMode, cu_call};
pub use cuda_sim::testing::{Gate, OpenOnDrop, wait_for_gate};

/// `CU_STREAM_LEGACY`.
pub const STREAM_LEGACY: CUstream = 0x1 as CUstream;
/// `CU_STREAM_PER_THREAD`.
pub const STREAM_PER_THREAD: CUstream = 0x2 as CUstream;
/// The legacy default stream, as handle 0.
pub const NULL_STREAM: CUstream = std::ptr::null_mut();

/// Calls a driver function through `driver` and gives back its raw `CUresult`. Must be used
/// inside an `unsafe` block (the call itself is unsafe).
macro_rules! code {
    ($driver:expr, $function:ident ( $($arg:expr),* $(,)? )) => {
        ($driver.$function().expect(concat!(stringify!($function), " resolves")))($($arg),*)
    };
}
pub(crate) use code;

/// The name of the enclosing function, without the test binary's crate name (`mod::test`), as
/// libtest's `--exact` filter expects it.
macro_rules! test_name {
    () => {{
        fn here() {}
        let full = std::any::type_name_of_val(&here);
        let full = full.strip_suffix("::here").expect("type_name of a nested fn ends in ::here");
        full.split_once("::").map_or(full, |(_, rest)| rest).to_owned()
    }};
}
pub(crate) use test_name;

/// Runs the enclosing test's `body` in a fresh process (the simulator's state is per process
/// and configured at its first `cuInit`) with the given `CUDA_SIM_*` (and
/// `CUDA_VISIBLE_DEVICES`) settings.
macro_rules! in_child {
    ($env:expr, $body:expr) => {
        $crate::common::run_in_child(&$crate::common::test_name!(), $env, $body)
    };
}
pub(crate) use in_child;

/// The variable that tells a re-spawned test binary which test it is the child for.
const CHILD_ENV: &str = "CUDA_SIM_TEST_CHILD";
/// The variable that tells it which of that test's configurations it runs (a test may run
/// several children, one per configuration).
const CONFIG_ENV: &str = "CUDA_SIM_TEST_CONFIG";
/// Settings cleared in every child so that the parent's environment does not leak in.
const SIM_VARS: [&str; 10] = [
    "CUDA_SIM_DRIVER_VERSION",
    "CUDA_SIM_IMEX_CHANNEL",
    "CUDA_SIM_POOL_HANDLES",
    "CUDA_SIM_ADDRESS_HINTS",
    "CUDA_SIM_DEVICES",
    "CUDA_SIM_PEER_ACCESS",
    "CUDA_SIM_MEMORY",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MEM_DRIVER",
    "CUDA_SIM_LIB",
];
/// How long a child may run before it is killed and the test fails (it should take
/// milliseconds; this only turns a hang into a failure).
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `body` in a child process: re-runs this test binary with `--exact name` and the
/// settings in `env`. In the child (recognized by [`CHILD_ENV`]), runs `body` itself if `env`
/// is the configuration it was started for, and does nothing otherwise.
#[track_caller]
pub fn run_in_child(name: &str, env: &[(&str, &str)], body: impl FnOnce()) {
    let config = format!("{env:?}");
    if std::env::var(CHILD_ENV).is_ok_and(|child| child == name) {
        if std::env::var(CONFIG_ENV).is_ok_and(|c| c == config) {
            body();
        }
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let library = cuda_sim::testing::library_path().expect("libcuda_sim.so is built beside the test binary");
    let mut command = Command::new(exe);
    command.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for var in SIM_VARS {
        command.env_remove(var);
    }
    command.env(CHILD_ENV, name).env(CONFIG_ENV, &config).env(cuda_sim::testing::LIBRARY_ENV, library);
    for (key, value) in env {
        command.env(key, value);
    }
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("the test binary re-spawns");
    let pipe = |reader: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut reader) = reader {
                let _ = reader.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = pipe(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let stderr = pipe(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break Some(status);
        }
        if started.elapsed() > CHILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    let Some(status) = status else {
        panic!("child for `{name}` hung for {CHILD_TIMEOUT:?} and was killed\n{stdout}\n{stderr}");
    };
    assert!(
        status.success(),
        "child for `{name}` ({env:?}) failed: {status}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "child for `{name}` did not run exactly that test\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
}

/// The simulator, opened with legacy default-stream semantics (once per process).
pub fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    // SAFETY: the library is the simulator, which implements each driver function it exports
    // with the signature and behaviour `cuda.h` documents.
    DRIVER.get_or_init(|| unsafe { Driver::open(library()) }.expect("the simulator opens as a driver"))
}

/// The simulator, opened again with per-thread default-stream semantics (the same library, so
/// the same simulated devices).
pub fn per_thread_driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        // SAFETY: as in `driver`; the per-thread variants are implemented the same way.
        unsafe { Driver::open_with(library(), DriverOptions::default().with_stream_mode(StreamMode::PerThread)) }
            .expect("the simulator opens as a driver")
    })
}

fn library() -> std::path::PathBuf {
    cuda_sim::testing::library_path().expect("libcuda_sim.so is built beside the test binary")
}

/// `cuInit(0)`, then the legacy driver.
pub fn init() -> &'static Driver {
    let d = driver();
    // SAFETY: cuInit takes no pointers; flags are 0.
    unsafe { cu_call!(d, cuInit(0)) }.unwrap();
    d
}

/// Initializes, retains device `ordinal`'s primary context (never released: other tests of the
/// process may share it) and makes it current on the calling thread.
pub fn use_device(ordinal: i32) -> CUcontext {
    let d = init();
    let ctx = retain(ordinal);
    // SAFETY: `ctx` is a live context handle.
    unsafe { cu_call!(d, cuCtxSetCurrent(ctx)) }.unwrap();
    ctx
}

/// Retains device `ordinal`'s primary context.
pub fn retain(ordinal: i32) -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuDevicePrimaryCtxRetain(&mut ctx, ordinal)) }.unwrap();
    assert!(!ctx.is_null());
    ctx
}

/// The calling thread's current context (null when none).
pub fn current() -> CUcontext {
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuCtxGetCurrent(&mut ctx)) }.unwrap();
    ctx
}

/// Runs `f` on a new thread, which has no current context, and returns its result.
pub fn on_fresh_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().expect("the thread panicked")
}

/// Device memory (`cuMemAlloc`), freed on drop if still live.
pub struct DeviceBuffer {
    pub ptr: CUdeviceptr,
    pub len: usize,
}

impl DeviceBuffer {
    /// `len` bytes in the current context.
    pub fn new(len: usize) -> DeviceBuffer {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(driver(), cuMemAlloc_v2(&mut ptr, len)) }.unwrap();
        assert_ne!(ptr, 0);
        DeviceBuffer { ptr, len }
    }

    /// `len` bytes holding `bytes`, written by the time it returns. (A synchronous copy from
    /// pageable memory returns before the copy lands, so the legacy stream is synchronized too:
    /// otherwise work on a non-blocking stream could run before the copy.)
    pub fn with(bytes: &[u8]) -> DeviceBuffer {
        let buffer = DeviceBuffer::new(bytes.len());
        htod(buffer.ptr, bytes);
        sync(NULL_STREAM);
        buffer
    }

    /// The whole contents, read with a synchronous copy on the legacy stream.
    pub fn read(&self) -> Vec<u8> {
        dtoh(self.ptr, self.len)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: cuMemFree takes no host pointers; an error (context gone) is ignored.
        let _ = unsafe { code!(driver(), cuMemFree_v2(self.ptr)) };
    }
}

/// Page-locked host memory (`cuMemAllocHost`), freed on drop. It is read and written with
/// volatile accesses, since stream workers write it behind the test's back.
pub struct Pinned {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: the memory is plain host memory owned by this value until it is dropped.
unsafe impl Send for Pinned {}
// SAFETY: all accesses are volatile byte accesses; ordering comes from the driver's
// synchronization, as with any host memory a stream writes.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// `len` zeroed bytes in the current context.
    pub fn new(len: usize) -> Pinned {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu_call!(driver(), cuMemAllocHost_v2(&mut ptr, len)) }.unwrap();
        assert!(!ptr.is_null());
        let pinned = Pinned { ptr: ptr.cast(), len };
        pinned.fill(0);
        pinned
    }

    /// Its address as a device pointer (unified addressing).
    pub fn dptr(&self) -> CUdeviceptr {
        self.ptr as CUdeviceptr
    }

    /// Its contents now.
    pub fn read(&self) -> Vec<u8> {
        // SAFETY: `ptr` is valid for `len` bytes while `self` lives.
        (0..self.len).map(|i| unsafe { self.ptr.add(i).read_volatile() }).collect()
    }

    /// Writes `value` to every byte.
    pub fn fill(&self, value: u8) {
        for i in 0..self.len {
            // SAFETY: `ptr` is valid for `len` bytes while `self` lives.
            unsafe { self.ptr.add(i).write_volatile(value) };
        }
    }

    /// Writes `bytes` from the start.
    pub fn write(&self, bytes: &[u8]) {
        assert!(bytes.len() <= self.len);
        for (i, &b) in bytes.iter().enumerate() {
            // SAFETY: `ptr` is valid for `len` bytes while `self` lives.
            unsafe { self.ptr.add(i).write_volatile(b) };
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: the pointer came from cuMemAllocHost; an error (context gone) is ignored.
        let _ = unsafe { code!(driver(), cuMemFreeHost(self.ptr.cast())) };
    }
}

/// Synchronous host-to-device copy on the legacy stream.
pub fn htod(dst: CUdeviceptr, src: &[u8]) {
    // SAFETY: `src` is valid for `src.len()` bytes during the (synchronous) call.
    unsafe { cu_call!(driver(), cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len())) }.unwrap();
}

/// Synchronous device-to-host copy on the legacy stream.
pub fn dtoh(src: CUdeviceptr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `out` is valid for `len` bytes; a device-to-pageable copy returns when done.
    unsafe { cu_call!(driver(), cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, len)) }.unwrap();
    out
}

/// A stream created in the current context.
pub fn stream(flags: CUstream_flags) -> CUstream {
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuStreamCreate(&mut s, flags.0)) }.unwrap();
    assert!(!s.is_null());
    s
}

/// A non-blocking stream (does not synchronize with the legacy stream).
pub fn non_blocking_stream() -> CUstream {
    stream(CUstream_flags::CU_STREAM_NON_BLOCKING)
}

/// A blocking stream (synchronizes with the legacy stream).
pub fn blocking_stream() -> CUstream {
    stream(CUstream_flags::CU_STREAM_DEFAULT)
}

/// An event created in the current context.
pub fn event(flags: CUevent_flags) -> CUevent {
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer.
    unsafe { cu_call!(driver(), cuEventCreate(&mut e, flags.0)) }.unwrap();
    assert!(!e.is_null());
    e
}

/// `cuStreamSynchronize`.
pub fn sync(s: CUstream) {
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuStreamSynchronize(s)) }.unwrap();
}

/// `cuStreamQuery`, as a raw code.
pub fn query(s: CUstream) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuStreamQuery(s)) }
}

/// `cuEventQuery`, as a raw code.
pub fn event_query(e: CUevent) -> CUresult {
    // SAFETY: no pointers.
    unsafe { code!(driver(), cuEventQuery(e)) }
}

/// `cuMemsetD8Async` on `s`.
pub fn memset_async(dst: CUdeviceptr, value: u8, len: usize, s: CUstream) {
    // SAFETY: no host pointers; the range is checked by the driver.
    unsafe { cu_call!(driver(), cuMemsetD8Async(dst, value, len, s)) }.unwrap();
}

/// `cuEventRecord` of `e` on `s`.
pub fn record(e: CUevent, s: CUstream) {
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuEventRecord(e, s)) }.unwrap();
}

/// `cuStreamWaitEvent(s, e, 0)`.
pub fn wait_event(s: CUstream, e: CUevent) {
    // SAFETY: no pointers.
    unsafe { cu_call!(driver(), cuStreamWaitEvent(s, e, 0)) }.unwrap();
}

/// [`Gate::hold`] on a stream the test made and has not destroyed, or a special handle.
pub fn hold(gate: &'static Gate, d: &Driver, s: CUstream) {
    // SAFETY: the tests pass only their own live streams and the special handles.
    unsafe { gate.hold(d, s) }.unwrap();
}

/// How long a watchdog waits before declaring that a call waited when it should not have.
pub const WATCHDOG: Duration = Duration::from_secs(10);
/// How long an opener waits before opening a gate a call must wait for.
pub const OPEN_DELAY: Duration = Duration::from_millis(30);

/// The location of device `device`.
pub fn device_location(device: c_int) -> CUmemLocation {
    CUmemLocation { type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device }
}

/// The access `device` has to `pool`'s memory (`cuMemPoolGetAccess`).
pub fn access(pool: CUmemoryPool, device: c_int) -> CUmemAccess_flags {
    let mut flags = CUmemAccess_flags(99);
    let mut location = device_location(device);
    // SAFETY: both pointers are valid.
    unsafe { cu_call!(driver(), cuMemPoolGetAccess(&mut flags, pool, &mut location)) }.unwrap();
    flags
}

/// Sets `device`'s access to `pool`'s memory (`cuMemPoolSetAccess`).
pub fn set_access(pool: CUmemoryPool, device: c_int, flags: CUmemAccess_flags) -> CUresult {
    let desc = CUmemAccessDesc { location: device_location(device), flags };
    // SAFETY: `desc` is one valid descriptor.
    unsafe { code!(driver(), cuMemPoolSetAccess(pool, &desc, 1)) }
}

/// `cuMemGetAddressRange`: the base and size of the allocation (or mapping) `ptr` lies in, or
/// the error.
pub fn address_range(ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize), CUresult> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: both are valid out-pointers.
    match unsafe { code!(driver(), cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) } {
        CUresult::CUDA_SUCCESS => Ok((base, size)),
        error => Err(error),
    }
}
