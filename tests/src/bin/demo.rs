//! `demo`: the first thing to run on a new machine (`cargo xtask demo`).
//!
//! It picks a driver (the library `CUDA_MEM_DRIVER` names; else the real driver when it finds a
//! GPU; else the `cuda-sim` simulator, saying so), prints what the driver reports about each
//! device, then makes a round trip through device memory on a stream with raw `cuda-sys` calls
//! (upload, memset part of it, download) and checks every byte. Each step is timed; the run ends
//! with a table of the steps and exits non-zero on any error or mismatch.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cuda_sys::types::{CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUstream, CUstream_flags};
use cuda_sys::{DEFAULT_LIBRARY, DRIVER_ENV, Driver, cu_call};

/// Any failure of the demo, printed as is.
type Error = Box<dyn std::error::Error>;

/// Bytes of device memory the round trip goes through.
const BUFFER_BYTES: usize = 64 << 20;
/// Where the memset starts, in bytes from the start of the buffer (a multiple of 4, as
/// `cuMemsetD32` needs, but not of the pattern's period).
const MEMSET_OFFSET: usize = (1 << 20) + 12;
/// How many 32-bit words the memset writes (16 MiB).
const MEMSET_WORDS: usize = 4 << 20;
/// The word the memset writes.
const MEMSET_VALUE: u32 = 0xC0FF_EE11;
/// The period of the byte pattern uploaded (a prime, so that no word-aligned shift of it
/// matches itself).
const PATTERN_PERIOD: usize = 251;
/// What the download buffer holds before the download, so that a copy that never happened
/// shows.
const SENTINEL: u8 = 0xA5;

fn main() -> ExitCode {
    if let Some(arg) = std::env::args().nth(1) {
        let help = arg == "--help" || arg == "-h";
        let usage = "usage: demo\n\nRuns a round trip through device memory and checks it. The driver is the \
                     library CUDA_MEM_DRIVER names, else libcuda.so.1 when it finds a GPU, else the \
                     cuda-sim simulator (CUDA_SIM_LIB, or libcuda_sim.so beside this program).";
        if help {
            println!("{usage}");
            return ExitCode::SUCCESS;
        }
        eprintln!("demo: unexpected argument {arg:?}\n{usage}");
        return ExitCode::FAILURE;
    }
    let mut report = Report::default();
    let result = run(&mut report);
    report.print();
    match result {
        Ok(()) => {
            println!("\nall steps passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\ndemo failed: {e}");
            let mut source = e.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// The whole demo: choose and install a driver, describe the devices, make the round trip,
/// and release everything it took (even after a failure).
fn run(report: &mut Report) -> Result<(), Error> {
    let driver = report.step("open driver", choose_driver)?;
    let driver = cuda_sys::install_driver(driver).map_err(|_| "a process-wide driver was already installed")?;
    report.step("cuInit", || {
        // SAFETY: cuInit takes no pointers; flags must be 0.
        unsafe { cu_call!(driver, cuInit(0)) }
    })?;
    report.step("describe devices", || describe(driver))?;

    let mut resources = Resources::default();
    let outcome = round_trip(driver, report, &mut resources);
    let released = resources.release(driver, report);
    outcome.and(released)
}

/// Picks the driver and prints, as the first line of output, which one it is.
fn choose_driver() -> Result<Driver, Error> {
    if let Some(path) = std::env::var_os(DRIVER_ENV) {
        let path = PathBuf::from(path);
        println!("driver: {} (named by {DRIVER_ENV})", path.display());
        return Ok(Driver::open(&path)?);
    }
    let why_not_real = match probe_real_driver() {
        Ok((driver, count)) => {
            println!("driver: the CUDA driver {DEFAULT_LIBRARY} ({count} device(s) found)");
            return Ok(driver);
        }
        Err(why) => why,
    };
    let Some(path) = simulator_path() else {
        return Err(format!(
            "no GPU found ({DEFAULT_LIBRARY}: {why_not_real}) and the simulator library was not found: \
             run `cargo xtask demo` (it builds cuda-sim first) or `cargo build -p cuda-sim`, or set \
             CUDA_SIM_LIB to the path of libcuda_sim.so"
        )
        .into());
    };
    println!("no GPU found: using the simulator at {}", path.display());
    println!("  ({DEFAULT_LIBRARY}: {why_not_real})");
    Ok(Driver::open(&path)?)
}

/// Opens the real driver and checks that it sees at least one device.
fn probe_real_driver() -> Result<(Driver, c_int), Error> {
    let driver = Driver::open(DEFAULT_LIBRARY)?;
    // SAFETY: cuInit takes no pointers; flags must be 0.
    unsafe { cu_call!(&driver, cuInit(0)) }?;
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid, writable int for the duration of the call.
    unsafe { cu_call!(&driver, cuDeviceGetCount(&mut count)) }?;
    if count > 0 { Ok((driver, count)) } else { Err("the driver reports no devices".into()) }
}

/// The simulator library: where `cuda_sim::testing` finds it, or in `deps/` beside this program
/// (where cargo builds it as a dependency).
fn simulator_path() -> Option<PathBuf> {
    cuda_sim::testing::library_path().or_else(|| {
        let exe = std::env::current_exe().ok()?;
        let candidate = exe.parent()?.join("deps").join(cuda_sim::testing::LIBRARY_NAME);
        candidate.is_file().then_some(candidate)
    })
}

/// Prints the driver version and, for each device, what the demo's users want to know first.
fn describe(driver: &Driver) -> Result<(), Error> {
    let version = driver.version()?;
    println!("driver version: CUDA {}.{} ({version})", version / 1000, (version % 1000) / 10);
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid, writable int for the duration of the call.
    unsafe { cu_call!(driver, cuDeviceGetCount(&mut count)) }?;
    println!("devices: {count}");
    for ordinal in 0..count {
        let device = get_device(driver, ordinal)?;
        let mut name: [c_char; 256] = [0; 256];
        // SAFETY: `name` is writable for the 256 bytes the length argument allows.
        unsafe { cu_call!(driver, cuDeviceGetName(name.as_mut_ptr(), 256, device)) }?;
        // SAFETY: the driver wrote a NUL-terminated string, and the last byte is still 0 (the
        // driver writes at most len - 1 characters and a NUL), so the read stays in `name`.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let mut bytes: usize = 0;
        // SAFETY: `bytes` is a valid, writable size_t for the duration of the call.
        unsafe { cu_call!(driver, cuDeviceTotalMem_v2(&mut bytes, device)) }?;
        let major = attribute(driver, device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(driver, device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let pools = attribute(driver, device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
        let vmm =
            attribute(driver, device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?;
        println!("  device {ordinal}: {name}");
        println!("    total memory: {}", format_bytes(bytes));
        println!("    compute capability: {major}.{minor}");
        println!("    memory pools supported: {}", yes_no(pools));
        println!("    virtual memory management supported: {}", yes_no(vmm));
    }
    if count == 0 {
        return Err("the driver reports no devices".into());
    }
    Ok(())
}

/// The device with the given ordinal.
fn get_device(driver: &Driver, ordinal: c_int) -> Result<CUdevice, Error> {
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid, writable CUdevice for the duration of the call.
    unsafe { cu_call!(driver, cuDeviceGet(&mut device, ordinal)) }?;
    Ok(device)
}

/// One integer attribute of a device.
fn attribute(driver: &Driver, device: CUdevice, attribute: CUdevice_attribute) -> Result<c_int, Error> {
    let mut value: c_int = 0;
    // SAFETY: `value` is a valid, writable int for the duration of the call.
    unsafe { cu_call!(driver, cuDeviceGetAttribute(&mut value, attribute, device)) }?;
    Ok(value)
}

/// What the demo holds, so that it can all be released whatever step failed.
#[derive(Default)]
struct Resources {
    /// The device whose primary context is retained.
    context_device: Option<CUdevice>,
    stream: Option<CUstream>,
    device_buffer: Option<CUdeviceptr>,
    /// Pinned host buffer the upload reads.
    upload: Option<*mut c_void>,
    /// Pinned host buffer the download writes.
    download: Option<*mut c_void>,
    /// Whether work may still be in flight on the stream.
    pending: bool,
}

/// Retains device 0's primary context, then uploads a pattern, overwrites part of it with a
/// memset and downloads the result, all on one stream, and checks every byte.
fn round_trip(driver: &Driver, report: &mut Report, res: &mut Resources) -> Result<(), Error> {
    let device = get_device(driver, 0)?;
    let context = report.step("cuDevicePrimaryCtxRetain", || {
        let mut context: CUcontext = std::ptr::null_mut();
        // SAFETY: `context` is a valid, writable CUcontext for the duration of the call.
        unsafe { cu_call!(driver, cuDevicePrimaryCtxRetain(&mut context, device)) }.map(|()| context)
    })?;
    res.context_device = Some(device);
    report.step("cuCtxSetCurrent", || {
        // SAFETY: `context` is the primary context just retained, which stays alive until released.
        unsafe { cu_call!(driver, cuCtxSetCurrent(context)) }
    })?;
    let stream = report.step("cuStreamCreate", || {
        let mut stream: CUstream = std::ptr::null_mut();
        let flags = CUstream_flags::CU_STREAM_NON_BLOCKING.0;
        // SAFETY: `stream` is a valid, writable CUstream; a context is current.
        unsafe { cu_call!(driver, cuStreamCreate(&mut stream, flags)) }.map(|()| stream)
    })?;
    res.stream = Some(stream);
    let buffer = report.step("cuMemAlloc_v2 (64 MiB)", || {
        let mut buffer: CUdeviceptr = 0;
        // SAFETY: `buffer` is a valid, writable CUdeviceptr; a context is current.
        unsafe { cu_call!(driver, cuMemAlloc_v2(&mut buffer, BUFFER_BYTES)) }.map(|()| buffer)
    })?;
    res.device_buffer = Some(buffer);
    let upload = report.step("cuMemAllocHost_v2 (upload)", || alloc_host(driver))?;
    res.upload = Some(upload);
    let download = report.step("cuMemAllocHost_v2 (download)", || alloc_host(driver))?;
    res.download = Some(download);

    report.step("fill host buffers", || {
        // SAFETY: `upload` and `download` are distinct live pinned allocations of BUFFER_BYTES
        // bytes each, and no copy that uses them has been enqueued yet.
        let (upload, download) = unsafe { (host_slice(upload), host_slice(download)) };
        fill_pattern(upload);
        download.fill(SENTINEL);
        Ok::<(), Error>(())
    })?;
    res.pending = true;
    report.step("cuMemcpyHtoDAsync_v2", || {
        // SAFETY: `upload` holds BUFFER_BYTES readable bytes and stays alive (and unwritten)
        // until the stream is synchronized; `buffer` is a device allocation of that size.
        unsafe { cu_call!(driver, cuMemcpyHtoDAsync_v2(buffer, upload, BUFFER_BYTES, stream)) }
    })?;
    report.step("cuMemsetD32Async", || {
        let start = buffer + MEMSET_OFFSET as CUdeviceptr;
        // SAFETY: the range [MEMSET_OFFSET, MEMSET_OFFSET + 4 * MEMSET_WORDS) lies inside the
        // device allocation and its start is 4-byte aligned.
        unsafe { cu_call!(driver, cuMemsetD32Async(start, MEMSET_VALUE, MEMSET_WORDS, stream)) }
    })?;
    report.step("cuMemcpyDtoHAsync_v2", || {
        // SAFETY: `download` holds BUFFER_BYTES writable bytes that nothing else touches until
        // the stream is synchronized; `buffer` is a device allocation of that size.
        unsafe { cu_call!(driver, cuMemcpyDtoHAsync_v2(download, buffer, BUFFER_BYTES, stream)) }
    })?;
    report.step("cuStreamSynchronize", || {
        // SAFETY: `stream` is a live stream of the current context.
        unsafe { cu_call!(driver, cuStreamSynchronize(stream)) }
    })?;
    res.pending = false;
    report.step("verify every byte", || {
        // SAFETY: the stream is synchronized, so nothing writes `download` any more; it is a
        // live pinned allocation of BUFFER_BYTES bytes.
        let got = unsafe { host_slice(download) };
        verify(got)
    })?;
    println!(
        "round trip of {} verified: pattern uploaded, {} overwritten with {MEMSET_VALUE:#010x} at offset {MEMSET_OFFSET}, downloaded",
        format_bytes(BUFFER_BYTES),
        format_bytes(MEMSET_WORDS * 4)
    );
    Ok(())
}

impl Resources {
    /// Releases whatever is held, in reverse order, each release a step of its own. Goes on
    /// after a failed release and returns the first error.
    fn release(self, driver: &Driver, report: &mut Report) -> Result<(), Error> {
        let mut first_error: Option<Error> = None;
        let mut keep = |result: Result<(), Error>| {
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        };
        if let (true, Some(stream)) = (self.pending, self.stream) {
            // After a failure, wait for what was enqueued before freeing what it uses.
            keep(report.step("cuStreamSynchronize (cleanup)", || {
                // SAFETY: `stream` is a live stream of the current context.
                unsafe { cu_call!(driver, cuStreamSynchronize(stream)) }
            }));
        }
        for (name, buffer) in [("cuMemFreeHost (download)", self.download), ("cuMemFreeHost (upload)", self.upload)] {
            if let Some(buffer) = buffer {
                keep(report.step(name, || {
                    // SAFETY: `buffer` came from cuMemAllocHost_v2, is freed once, and no
                    // enqueued work uses it any more.
                    unsafe { cu_call!(driver, cuMemFreeHost(buffer)) }
                }));
            }
        }
        if let Some(buffer) = self.device_buffer {
            keep(report.step("cuMemFree_v2", || {
                // SAFETY: `buffer` came from cuMemAlloc_v2, is freed once, and no enqueued work
                // uses it any more.
                unsafe { cu_call!(driver, cuMemFree_v2(buffer)) }
            }));
        }
        if let Some(stream) = self.stream {
            keep(report.step("cuStreamDestroy_v2", || {
                // SAFETY: `stream` is a live stream, destroyed once.
                unsafe { cu_call!(driver, cuStreamDestroy_v2(stream)) }
            }));
        }
        if let Some(device) = self.context_device {
            keep(report.step("cuDevicePrimaryCtxRelease_v2", || {
                // SAFETY: the primary context of `device` was retained once by this program.
                unsafe { cu_call!(driver, cuDevicePrimaryCtxRelease_v2(device)) }
            }));
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Allocates BUFFER_BYTES of pinned host memory.
fn alloc_host(driver: &Driver) -> Result<*mut c_void, Error> {
    let mut pointer: *mut c_void = std::ptr::null_mut();
    // SAFETY: `pointer` is a valid, writable pointer for the duration of the call; a context is
    // current.
    unsafe { cu_call!(driver, cuMemAllocHost_v2(&mut pointer, BUFFER_BYTES)) }?;
    if pointer.is_null() {
        return Err("cuMemAllocHost_v2 succeeded but returned a null pointer".into());
    }
    Ok(pointer)
}

/// The BUFFER_BYTES bytes of a pinned host allocation.
///
/// # Safety
/// `pointer` must be a live allocation of at least BUFFER_BYTES bytes from `cuMemAllocHost_v2`
/// that nothing else (no other slice, no enqueued copy) reads or writes while the slice lives.
unsafe fn host_slice<'a>(pointer: *mut c_void) -> &'a mut [u8] {
    // SAFETY: the caller guarantees the allocation's size, liveness and exclusivity.
    unsafe { std::slice::from_raw_parts_mut(pointer.cast::<u8>(), BUFFER_BYTES) }
}

/// One period of the uploaded byte pattern.
fn pattern_period() -> [u8; PATTERN_PERIOD] {
    std::array::from_fn(|i| (i as u8).wrapping_mul(37).wrapping_add(11))
}

/// Fills `bytes` with the pattern, byte `i` being `pattern_period()[i % PATTERN_PERIOD]`.
fn fill_pattern(bytes: &mut [u8]) {
    let period = pattern_period();
    for chunk in bytes.chunks_mut(PATTERN_PERIOD) {
        chunk.copy_from_slice(&period[..chunk.len()]);
    }
}

/// What the download must hold: the pattern, with the memset's range overwritten.
fn expected() -> Vec<u8> {
    let mut expected = vec![0; BUFFER_BYTES];
    fill_pattern(&mut expected);
    let word = MEMSET_VALUE.to_le_bytes();
    for chunk in expected[MEMSET_OFFSET..MEMSET_OFFSET + 4 * MEMSET_WORDS].chunks_exact_mut(4) {
        chunk.copy_from_slice(&word);
    }
    expected
}

/// Compares the download with what it must hold, describing the first mismatch.
fn verify(got: &[u8]) -> Result<(), Error> {
    let expected = expected();
    if got == expected.as_slice() {
        return Ok(());
    }
    let mismatches = got.iter().zip(&expected).filter(|(g, e)| g != e).count();
    let first = got.iter().zip(&expected).position(|(g, e)| g != e).unwrap_or(0);
    let got_byte = got.get(first).copied().unwrap_or(0);
    let expected_byte = expected.get(first).copied().unwrap_or(0);
    Err(format!(
        "{mismatches} of {BUFFER_BYTES} bytes differ; the first at offset {first}: got {got_byte:#04x}, \
         expected {expected_byte:#04x}{}",
        if got_byte == SENTINEL { " (the sentinel: the download did not write there)" } else { "" }
    )
    .into())
}

fn yes_no(value: c_int) -> &'static str {
    if value != 0 { "yes" } else { "no" }
}

/// Formats a byte count in the largest binary unit that keeps it at least 1.
fn format_bytes(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// Formats a duration with a unit suited to its size.
fn format_duration(duration: Duration) -> String {
    let micros = duration.as_secs_f64() * 1e6;
    if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 1e6 {
        format!("{:.1} ms", micros / 1e3)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}

/// The timed steps, in the order they ran.
#[derive(Default)]
struct Report {
    rows: Vec<(String, Duration, bool)>,
}

impl Report {
    /// Runs one step, timing it and recording whether it succeeded; a failure is printed at
    /// once, and its message names the step.
    fn step<T, E: Into<Error>>(&mut self, name: &str, f: impl FnOnce() -> Result<T, E>) -> Result<T, Error> {
        let start = Instant::now();
        let result = f();
        self.rows.push((name.to_string(), start.elapsed(), result.is_ok()));
        result.map_err(|e| {
            let message = format!("{name}: {}", e.into());
            eprintln!("error: {message}");
            message.into()
        })
    }

    /// Prints the table of steps.
    fn print(&self) {
        let width = self.rows.iter().map(|(name, _, _)| name.len()).max().unwrap_or(0).max(4);
        println!("\n{:<width$}  {:>10}  ok", "step", "time");
        for (name, time, ok) in &self.rows {
            println!("{name:<width$}  {:>10}  {}", format_duration(*time), if *ok { "yes" } else { "NO" });
        }
    }
}
