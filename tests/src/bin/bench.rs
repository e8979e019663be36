//! `bench`: the benchmarks of the cuda-mem crates (`cargo xtask bench`), with a harness of its
//! own: warm-up, many repetitions, and per case the median and the spread (p10/p90).
//!
//! 1. pool allocate+free pairs at 256 B, 64 KiB and 4 MiB, through the safe API (shared and scoped buffers) and through raw
//!    `cuMemAllocFromPoolAsync`/`cuMemFreeAsync`, on one thread and on 4 threads (4 streams);
//! 2. sharing buffers with a child process (this program with `--child`), through
//!    `IpcChannel` and through the two raw driver calls, for batches of 1, 64 and 1,024;
//! 3. VMM growth from 2 MiB to 1 GiB in 2 MiB steps, in place and forced to move, timed per step,
//!    with the driver calls per step counted on the simulator;
//! 4. registry lookups and duplicate-import cache hits per second, in the child, on 1 and 8
//!    threads;
//! 5. the time from spawning a process to its first driver call returning (`--first-call`).
//!
//! The driver is chosen as the demo chooses it (`tests::driver_choice`). Results go to
//! `target/bench/` (`results.json`, `results.md`, two SVG plots); the Markdown tables are printed
//! at the end. `bench --child` and `bench --first-call` are its own children.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cuda_mem_core::sys::types::{
    CUcontext, CUmemAccessDesc, CUmemAllocationGranularity_flags, CUmemAllocationProp, CUmemPoolPtrExportData,
    CUresult, CUstream, CUstreamCaptureStatus,
};
use cuda_mem_core::sys::{DRIVER_ENV, Driver, cu_call};
use cuda_mem_core::{
    Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, DevicePtr, MemoryResourceExt, Stream,
    StreamOptions,
};
use cuda_mem_ipc::{Channel, IpcChannel, Received, buffer_descriptor, registry, spawn_with_channel};
use cuda_mem_vmm::{VirtualBuffer, VirtualMemoryResource, VirtualMemoryResourceOptions};
use tests::driver_choice::{self, How};

/// Any failure of the benchmarks.
type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: bench\n\nRuns the cuda-mem benchmarks (pools, sharing, VMM growth, registry and import \
                     cache, first driver call) and writes target/bench/results.{json,md} and SVG plots. The driver \
                     is the library CUDA_MEM_DRIVER names, else libcuda.so.1 when it finds a GPU, else the cuda-sim \
                     simulator. BENCH_OUT overrides the output folder.\n\n\
                     bench --pool-pairs: case 1 on one thread only, its last line JSON (for --compare).";

const CHILD_ARG: &str = "--child";
const FIRST_CALL_ARG: &str = "--first-call";
/// Case (1) on one thread only, as one JSON line: `cargo xtask bench --compare` alternates it
/// with cuda.core's side, so that both are measured under the same load.
const POOL_PAIRS_ARG: &str = "--pool-pairs";
/// Message kinds of the raw sharing path and of the control socket's handover.
const RAW_KIND: u16 = 100;
const CONTROL_KIND: u16 = 101;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const POOL_SIZES: [usize; 3] = [256, 64 * KIB, 4 * MIB];
/// Allocate+free pairs per timed repetition of case 1.
const PAIRS_PER_REP: usize = 50;
const POOL_THREADS: usize = 4;
const SHARE_BATCHES: [usize; 3] = [1, 64, 1024];
const SHARE_BUFFER: usize = 64 * KIB;
const VMM_STEP: usize = 2 * MIB;
const VMM_LIMIT: usize = 1 << 30;
const FIRST_CALL_RUNS: usize = 20;

fn main() -> ExitCode {
    let started = Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => parent_main(),
        [CHILD_ARG] => child_main(),
        [FIRST_CALL_ARG] => first_call_main(started),
        [POOL_PAIRS_ARG] => pool_pairs_main(),
        ["--help" | "-h"] => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unexpected arguments {other:?}\n{USAGE}").into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.
// ---------------------------------------------------------------------------------------------

/// Median and spread of a sample, in nanoseconds (or whatever unit the sample has).
#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    median: f64,
    p10: f64,
    p90: f64,
    n: usize,
}

impl Stats {
    fn of(mut sample: Vec<f64>) -> Stats {
        if sample.is_empty() {
            return Stats::default();
        }
        sample.sort_by(f64::total_cmp);
        let at = |q: f64| sample[((sample.len() - 1) as f64 * q).round() as usize];
        Stats { median: at(0.5), p10: at(0.1), p90: at(0.9), n: sample.len() }
    }

    fn json(&self) -> String {
        format!(r#"{{"median":{:.1},"p10":{:.1},"p90":{:.1},"n":{}}}"#, self.median, self.p10, self.p90, self.n)
    }

    /// `median (p10–p90)` in a readable unit.
    fn show(&self) -> String {
        format!("{} ({}–{})", ns(self.median), ns(self.p10), ns(self.p90))
    }
}

/// Nanoseconds, readably.
fn ns(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} ms", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.2} µs", value / 1e3)
    } else {
        format!("{value:.0} ns")
    }
}

fn elapsed_ns(since: Instant) -> f64 {
    since.elapsed().as_nanos() as f64
}

// ---------------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------------

/// The CPUs this process may run on: with fewer than the 4 threads of case (1), the threads
/// take turns and the 4-thread rows measure the scheduler as much as the pool.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

/// What the run found, for the outputs.
#[derive(Default)]
struct Results {
    driver: String,
    simulator: bool,
    pools: Vec<PoolRow>,
    sharing: Vec<ShareRow>,
    vmm: Vec<VmmMode>,
    /// One growth from one chunk to two, repeated: (moving, its time).
    first_grows: Vec<(bool, Stats)>,
    /// Case (1)'s additivity check.
    pacing: Option<Pacing>,
    lookups: Vec<RateRow>,
    first_call: Option<(Stats, Stats)>,
}

/// `--pool-pairs`: case (1) on one thread, on the driver the full run would choose; its last
/// line is `{"pools":[…]}`, rows as in `results.json`.
fn pool_pairs_main() -> Result<(), Error> {
    let choice = driver_choice::choose("bench", "`cargo xtask bench` (it builds cuda-sim first)")?;
    cuda_mem_core::sys::install_driver(choice.driver).map_err(|_| "a process-wide driver was already installed")?;
    let rows = pools(Device::new(0)?, &[1])?;
    let rows: Vec<String> = rows.iter().map(PoolRow::json).collect();
    println!(r#"{{"pools":[{}]}}"#, rows.join(","));
    Ok(())
}

fn parent_main() -> Result<(), Error> {
    let total = Instant::now();
    let choice = driver_choice::choose("bench", "`cargo xtask bench` (it builds cuda-sim first)")?;
    let simulator = choice.is_simulator();
    let version = choice.driver.version()?;
    let version = format!("CUDA {}.{} ({version})", version / 1000, (version % 1000) / 10);
    let path = choice.driver.path().to_path_buf();
    let driver = match (&choice.how, simulator) {
        (_, true) => format!("cuda-sim simulator at {} (reports {version}), not a GPU", path.display()),
        (How::Real { devices }, false) => {
            format!("real CUDA driver {} ({devices} device(s)), {version}", path.display())
        }
        (_, false) => format!("driver {} named by {DRIVER_ENV}, {version}", path.display()),
    };
    println!("driver: {driver}");
    if let How::NoGpu { why_not_real } = &choice.how {
        println!("  (no GPU: {why_not_real})");
    }
    cuda_mem_core::sys::install_driver(choice.driver).map_err(|_| "a process-wide driver was already installed")?;
    let mut results = Results { driver, simulator, ..Results::default() };

    let device = Device::new(0)?;
    println!("device 0: {}", device.name()?);

    let step = Instant::now();
    results.first_call = Some(first_call(&path)?);
    println!("[5] first driver call: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.pools = pools(device, &[1, POOL_THREADS])?;
    results.pacing = Some(pacing(device)?);
    println!("[1] pools: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    let (sharing, lookups) = sharing(device, &path)?;
    results.sharing = sharing;
    results.lookups = lookups;
    println!("[2, 4] sharing, registry and import cache: done in {:.1} s", step.elapsed().as_secs_f64());

    let step = Instant::now();
    results.vmm = vmm(device, simulator)?;
    results.first_grows = first_grows(device)?;
    println!("[3] VMM growth: done in {:.1} s", step.elapsed().as_secs_f64());

    let out = output_dir();
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let markdown = markdown(&results);
    write(&out.join("results.json"), &json(&results))?;
    write(&out.join("results.md"), &markdown)?;
    write(&out.join("vmm_steps.svg"), &vmm_svg(&results.vmm))?;
    write(&out.join("pools.svg"), &pools_svg(&results.pools))?;
    println!("\n{markdown}");
    println!(
        "wrote {}/{{results.json, results.md, vmm_steps.svg, pools.svg}} in {:.1} s",
        out.display(),
        total.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `BENCH_OUT`, or `target/bench` under the workspace (`CARGO_TARGET_DIR` respected), or
/// `./bench-results` when this program runs outside the workspace (in the GPU bundle).
fn output_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BENCH_OUT") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).join("target"));
    if target.is_dir() { target.join("bench") } else { PathBuf::from("bench-results") }
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()).into())
}

// ---------------------------------------------------------------------------------------------
// 1. Pools.
// ---------------------------------------------------------------------------------------------

struct PoolRow {
    size: usize,
    threads: usize,
    safe: Stats,
    raw: Stats,
    /// The raw calls with the capture check the safe API makes before each allocation (as
    /// cuda.core does): the same driver work as the safe pair, so the rest is our code's.
    raw_checked: Stats,
    /// The safe API's scoped allocation (`allocate_scoped`: borrows instead of shares).
    scoped: Stats,
}

impl PoolRow {
    fn ratio(&self) -> f64 {
        self.safe.median / self.raw.median
    }

    /// Safe against the raw calls that do the same driver work.
    fn ratio_checked(&self) -> f64 {
        self.safe.median / self.raw_checked.median
    }

    /// Scoped against the raw calls.
    fn ratio_scoped(&self) -> f64 {
        self.scoped.median / self.raw.median
    }

    fn json(&self) -> String {
        format!(
            r#"{{"size":{},"threads":{},"safe_per_pair":{},"raw_per_pair":{},"raw_checked_per_pair":{},"scoped_per_pair":{},"ratio":{:.3},"ratio_checked":{:.3},"ratio_scoped":{:.3}}}"#,
            self.size,
            self.threads,
            self.safe.json(),
            self.raw.json(),
            self.raw_checked.json(),
            self.scoped.json(),
            self.ratio(),
            self.ratio_checked(),
            self.ratio_scoped()
        )
    }
}

fn pools(device: Device, thread_counts: &[usize]) -> Result<Vec<PoolRow>, Error> {
    let mut rows = Vec::new();
    for &threads in thread_counts {
        for size in POOL_SIZES {
            let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
            pool.pool().set_release_threshold(u64::MAX)?;
            let reps = if threads == 1 { 1500 } else { 500 };
            let barrier = Barrier::new(threads);
            let samples: Vec<ThreadSamples> = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        let pool = &pool;
                        let barrier = &barrier;
                        scope.spawn(move || pool_thread(device, pool, size, reps, barrier).map_err(|e| e.to_string()))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
            });
            let [mut safe, mut raw, mut raw_checked, mut scoped] = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            for sample in samples {
                let [s, r, c, b] = sample?;
                safe.extend(s);
                raw.extend(r);
                raw_checked.extend(c);
                scoped.extend(b);
            }
            let row = PoolRow {
                size,
                threads,
                safe: Stats::of(safe),
                raw: Stats::of(raw),
                raw_checked: Stats::of(raw_checked),
                scoped: Stats::of(scoped),
            };
            println!(
                "  {} × {threads} thread(s): safe {} scoped {} raw {} raw+check {} per pair, ratio {:.2} ({:.2} against \
                 raw+check, scoped {:.2})",
                bytes(size),
                row.safe.show(),
                row.scoped.show(),
                row.raw.show(),
                row.raw_checked.show(),
                row.ratio(),
                row.ratio_checked(),
                row.ratio_scoped()
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Caller work added between raw pairs by [`pacing`], in nanoseconds.
const PACING_WORK_NS: u64 = 500;

/// Whether the driver's cost per pair is additive: raw 256 B pairs alone, and with
/// [`PACING_WORK_NS`] of the caller's own work (a spin) after each pair, sampled in turn. An
/// API's overhead is measured as its time minus the raw time, which holds only if the driver
/// takes as long however busy its caller is; a driver that does part of the work on a thread
/// of its own (the simulator frees on its stream's thread, contending with the caller for the
/// process's memory map) hides caller work up to some amount, and overheads below it.
struct Pacing {
    raw: Stats,
    /// Pair and work together, the work's own time (measured alone) taken off.
    raw_with_work: Stats,
}

impl Pacing {
    /// How much of the work did not show in the time: the median pair alone minus the median
    /// pair with the work (its own time taken off). Near zero where the driver is additive.
    fn hidden_ns(&self) -> f64 {
        self.raw.median - self.raw_with_work.median
    }
}

fn pacing(device: Device) -> Result<Pacing, Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    pool.pool().set_release_threshold(u64::MAX)?;
    let spin = || {
        let start = Instant::now();
        while start.elapsed().as_nanos() < u128::from(PACING_WORK_NS) {}
    };
    let rep = |work: bool| {
        per_pair(|| {
            raw_pair(d, &pool, 256, &stream)?;
            if work {
                spin();
            }
            Ok(())
        })
    };
    let work_alone = || {
        per_pair(|| {
            spin();
            Ok(())
        })
    };
    let (mut raw, mut with_work) = (Vec::new(), Vec::new());
    for i in 0..550 {
        let (alone, paced, work) = (rep(false)?, rep(true)?, work_alone()?);
        stream.synchronize()?;
        if i >= 50 {
            raw.push(alone);
            with_work.push(paced - work);
        }
    }
    let pacing = Pacing { raw: Stats::of(raw), raw_with_work: Stats::of(with_work) };
    println!(
        "  additivity: raw 256 B pair {}, with {PACING_WORK_NS} ns of caller work after each (work's time taken off) {}: {:.0} ns less",
        pacing.raw.show(),
        pacing.raw_with_work.show(),
        pacing.hidden_ns()
    );
    Ok(pacing)
}

/// One thread's safe and raw samples, or why it failed.
type ThreadSamples = Result<[Vec<f64>; KINDS], String>;

/// The kinds of pair timed in case (1): safe, raw, raw with the capture check, scoped.
const KINDS: usize = 4;

/// A timed repetition of one kind (safe, raw, raw with the capture check, scoped): ns per pair.
type Rep<'a> = Box<dyn Fn() -> Result<f64, Error> + 'a>;

/// One thread's repetitions on its own stream, safe and raw alternating; ns per pair.
fn pool_thread(
    device: Device,
    pool: &Arc<DeviceMemoryResource>,
    size: usize,
    reps: usize,
    barrier: &Barrier,
) -> Result<[Vec<f64>; KINDS], Error> {
    // Every thread reaches the barrier, even one whose setup or warm-up failed: a thread that
    // returned early would leave the others waiting there forever.
    let prepared = prepare_pool_thread(device);
    let warmed = prepared
        .as_ref()
        .map_err(|e| e.to_string())
        .and_then(|(d, stream)| warm_pool_thread(d, pool, size, stream).map_err(|e| e.to_string()));
    barrier.wait();
    let (d, stream) = prepared?;
    warmed.map_err(|e| -> Error { e.into() })?;
    measure_pool_thread(d, pool, size, reps, &stream)
}

/// A thread's driver and stream, with the device's context current.
fn prepare_pool_thread(device: Device) -> Result<(&'static Driver, Stream), Error> {
    let d = cuda_mem_core::driver()?;
    device.set_current()?;
    Ok((d, Stream::new(device, StreamOptions::default().non_blocking())?))
}

/// The repetitions of [`pool_thread`]: safe, raw, raw with the capture check, and scoped.
fn pool_reps<'a>(
    d: &'static Driver,
    pool: &'a Arc<DeviceMemoryResource>,
    size: usize,
    stream: &'a Stream,
) -> [Rep<'a>; KINDS] {
    let safe_rep = move || {
        per_pair(|| {
            drop(pool.allocate(size, stream)?);
            Ok(())
        })
    };
    let scoped_rep = move || {
        per_pair(|| {
            drop(pool.allocate_scoped(size, stream)?);
            Ok(())
        })
    };
    let raw_rep = move |checked: bool| {
        per_pair(|| {
            if checked {
                let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                // SAFETY: a valid out-pointer and the stream's live handle.
                unsafe { cu_call!(d, cuStreamIsCapturing(stream.handle(), &mut status)) }?;
                if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    return Err("the stream is capturing".into());
                }
            }
            raw_pair(d, pool, size, stream)
        })
    };
    [Box::new(safe_rep), Box::new(move || raw_rep(false)), Box::new(move || raw_rep(true)), Box::new(scoped_rep)]
}

/// Runs `pair` [`PAIRS_PER_REP`] times: nanoseconds per run.
fn per_pair(mut pair: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    let start = Instant::now();
    for _ in 0..PAIRS_PER_REP {
        pair()?;
    }
    Ok(elapsed_ns(start) / PAIRS_PER_REP as f64)
}

/// One allocate+free pair of `size` bytes from `pool` on `stream`, through the raw driver calls.
fn raw_pair(d: &Driver, pool: &DeviceMemoryResource, size: usize, stream: &Stream) -> Result<(), Error> {
    let mut ptr: DevicePtr = 0;
    // SAFETY: a valid out-pointer, the pool's and the stream's live handles.
    unsafe { cu_call!(d, cuMemAllocFromPoolAsync(&mut ptr, size, pool.pool().handle(), stream.handle())) }?;
    // SAFETY: `ptr` was just allocated on this stream and is freed once.
    unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream.handle())) }?;
    Ok(())
}

/// Ten repetitions of each kind, untimed.
fn warm_pool_thread(
    d: &'static Driver,
    pool: &Arc<DeviceMemoryResource>,
    size: usize,
    stream: &Stream,
) -> Result<(), Error> {
    let reps = pool_reps(d, pool, size, stream);
    for _ in 0..10 {
        for rep in &reps {
            rep()?;
        }
    }
    stream.synchronize()?;
    Ok(())
}

/// `reps` timed repetitions of each kind, in turn.
fn measure_pool_thread(
    d: &'static Driver,
    pool: &Arc<DeviceMemoryResource>,
    size: usize,
    reps: usize,
    stream: &Stream,
) -> Result<[Vec<f64>; KINDS], Error> {
    let kinds = pool_reps(d, pool, size, stream);
    let mut samples: [Vec<f64>; KINDS] = std::array::from_fn(|_| Vec::with_capacity(reps));
    for rep in 0..reps {
        // Rotate which goes first, so that none always follows another.
        for k in 0..kinds.len() {
            let kind = (rep + k) % kinds.len();
            samples[kind].push(kinds[kind]()?);
        }
        stream.synchronize()?;
    }
    Ok(samples)
}

// ---------------------------------------------------------------------------------------------
// 2 and 4. Sharing with a child; registry and import cache in the child.
// ---------------------------------------------------------------------------------------------

struct ShareRow {
    batch: usize,
    /// Per buffer: parent side, child side, both (through our layer).
    ours_parent: Stats,
    ours_child: Stats,
    ours: Stats,
    /// The same through the two raw driver calls.
    raw_parent: Stats,
    raw_child: Stats,
    raw: Stats,
}

impl ShareRow {
    /// Our cost per buffer beyond the raw calls (difference of the medians).
    fn overhead(&self) -> f64 {
        self.ours.median - self.raw.median
    }
}

struct RateRow {
    what: &'static str,
    threads: usize,
    /// Operations per second.
    rate: Stats,
}

/// The parent's side of a child: the data channel and a control socket.
struct Child {
    process: std::process::Child,
    ipc: IpcChannel,
    control: BufReader<UnixStream>,
}

impl Child {
    fn command(&mut self, line: &str) -> Result<(), Error> {
        self.control.get_mut().write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }

    fn reply(&mut self) -> Result<String, Error> {
        let mut line = String::new();
        if self.control.read_line(&mut line)? == 0 {
            return Err("the child closed its control socket".into());
        }
        let line = line.trim_end().to_string();
        match line.strip_prefix("error: ") {
            Some(error) => Err(format!("the child failed: {error}").into()),
            None => Ok(line),
        }
    }
}

fn sharing(device: Device, driver_path: &Path) -> Result<(Vec<ShareRow>, Vec<RateRow>), Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    pool.pool().set_release_threshold(u64::MAX)?;
    let max = SHARE_BATCHES.iter().copied().max().unwrap_or(1);
    let buffers = (0..max).map(|_| pool.allocate(SHARE_BUFFER, &stream)).collect::<Result<Vec<Buffer>, _>>()?;
    stream.synchronize()?;

    let mut command = Command::new(std::env::current_exe()?);
    command.arg(CHILD_ARG).env(DRIVER_ENV, driver_path).stdin(Stdio::null());
    let (process, channel) = spawn_with_channel(&mut command)?;
    let ipc = IpcChannel::new(channel);
    // The control socket: commands and replies, apart from the data channel, so that the child
    // starts its clock only when the data is already in its socket.
    let (here, there) = UnixStream::pair()?;
    ipc.channel().send(CONTROL_KIND, b"control", &[std::os::fd::AsFd::as_fd(&there)])?;
    drop(there);
    let mut child = Child { process, ipc, control: BufReader::new(here) };
    child.ipc.send_resource(pool.as_ref())?;
    child.command("resource")?;
    child.reply()?;

    let mut rows = Vec::new();
    for batch in SHARE_BATCHES {
        let refs: Vec<&Buffer> = buffers[..batch].iter().collect();
        let (warmup, reps) = match batch {
            1 => (50, 1000),
            64 => (10, 300),
            _ => (3, 60),
        };
        let (mut ours_parent, mut ours_child, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        let (mut raw_parent, mut raw_child, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..warmup + reps {
            // Ours: export and encode (buffer_descriptor), send.
            let start = Instant::now();
            child.ipc.send_buffers(&refs)?;
            let parent = elapsed_ns(start);
            child.command(&format!("ours {batch}"))?;
            let child_ns: f64 = child.reply()?.parse()?;
            if rep >= warmup {
                ours_parent.push(parent / batch as f64);
                ours_child.push(child_ns / batch as f64);
                ours.push((parent + child_ns) / batch as f64);
            }
            // Raw: cuMemPoolExportPointer per buffer, the 64-byte data sent as plain bytes.
            let start = Instant::now();
            let mut payload = Vec::with_capacity(batch * 64);
            for buffer in &refs {
                let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
                // SAFETY: a valid out-pointer; the buffer is a live allocation of an IPC pool.
                unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, buffer.ptr())) }?;
                payload.extend_from_slice(&data.reserved);
            }
            child.ipc.channel().send(RAW_KIND, &payload, &[])?;
            let parent = elapsed_ns(start);
            child.command(&format!("raw {batch}"))?;
            let child_ns: f64 = child.reply()?.parse()?;
            if rep >= warmup {
                raw_parent.push(parent / batch as f64);
                raw_child.push(child_ns / batch as f64);
                raw.push((parent + child_ns) / batch as f64);
            }
        }
        let row = ShareRow {
            batch,
            ours_parent: Stats::of(ours_parent),
            ours_child: Stats::of(ours_child),
            ours: Stats::of(ours),
            raw_parent: Stats::of(raw_parent),
            raw_child: Stats::of(raw_child),
            raw: Stats::of(raw),
        };
        println!(
            "  batch {batch}: ours {} raw {} per buffer, overhead {}",
            row.ours.show(),
            row.raw.show(),
            ns(row.overhead())
        );
        rows.push(row);
    }

    // 4: one buffer for the child to hold and import again.
    child.ipc.send_buffers(&[&buffers[0]])?;
    child.command("lookups")?;
    let mut rates = Vec::new();
    for item in child.reply()?.split(';').filter(|s| !s.is_empty()) {
        let mut fields = item.split(',');
        let (Some(what), Some(threads), Some(median), Some(p10), Some(p90), Some(n)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("the child's rates are garbled: {item:?}").into());
        };
        let what = if what == "lookup" { "registry lookup" } else { "duplicate import (cache hit)" };
        let rate = Stats { median: median.parse()?, p10: p10.parse()?, p90: p90.parse()?, n: n.parse()? };
        println!("  {what} × {threads} thread(s): {:.0} per second", rate.median);
        rates.push(RateRow { what, threads: threads.parse()?, rate });
    }
    child.command("exit")?;
    let status = child.process.wait()?;
    if !status.success() {
        return Err(format!("the child exited with {status}").into());
    }
    drop(buffers);
    stream.synchronize()?;
    Ok((rows, rates))
}

// ---------------------------------------------------------------------------------------------
// The child.
// ---------------------------------------------------------------------------------------------

fn child_main() -> Result<(), Error> {
    // SAFETY: started by the bench's parent through `spawn_with_channel`; nothing else adopts it.
    let ipc = IpcChannel::new(unsafe { Channel::from_env() }?);
    let message = ipc.channel().recv()?;
    let fd = message.fds.into_iter().next().ok_or("the control socket did not come")?;
    let mut control = BufReader::new(UnixStream::from(fd));
    let mut reply_to = control.get_ref().try_clone()?;
    let result = serve(&ipc, &mut control, &mut reply_to);
    if let Err(error) = &result {
        let _ = reply_to.write_all(format!("error: {}\n", error.to_string().replace('\n', " ")).as_bytes());
    }
    result
}

fn serve(ipc: &IpcChannel, control: &mut BufReader<UnixStream>, reply: &mut UnixStream) -> Result<(), Error> {
    let d = cuda_mem_core::driver()?;
    let device = Device::new(0)?;
    device.set_current()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let mut resource = None;
    let mut line = String::new();
    loop {
        line.clear();
        if control.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut words = line.split_whitespace();
        let answer = match (words.next(), words.next().map(str::parse::<usize>)) {
            (Some("resource"), None) => {
                let Received::Resource(r) = ipc.recv(&stream)? else { return Err("expected the pool".into()) };
                resource = Some(r);
                "ok".to_string()
            }
            (Some("ours"), Some(Ok(batch))) => {
                let start = Instant::now();
                let Received::Buffers(buffers) = ipc.recv(&stream)? else { return Err("expected buffers".into()) };
                let took = elapsed_ns(start);
                if buffers.len() != batch {
                    return Err(format!("expected {batch} buffers, got {}", buffers.len()).into());
                }
                drop(buffers);
                stream.synchronize()?;
                format!("{took:.0}")
            }
            (Some("raw"), Some(Ok(batch))) => {
                let pool = resource.as_ref().ok_or("no pool yet")?.imported_pool().handle();
                let start = Instant::now();
                let message = ipc.channel().recv()?;
                let mut pointers = Vec::with_capacity(batch);
                for chunk in message.payload.chunks_exact(64) {
                    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
                    data.reserved.copy_from_slice(chunk);
                    let mut ptr: DevicePtr = 0;
                    // SAFETY: valid out-pointer and export data; `pool` is a live imported pool.
                    unsafe { cu_call!(d, cuMemPoolImportPointer(&mut ptr, pool, &mut data)) }?;
                    pointers.push(ptr);
                }
                let took = elapsed_ns(start);
                if message.kind != RAW_KIND || pointers.len() != batch {
                    return Err(format!("expected {batch} raw exports, got {}", pointers.len()).into());
                }
                for ptr in pointers {
                    // SAFETY: an imported pointer, unmapped once, used by no work.
                    unsafe { cu_call!(d, cuMemFreeAsync(ptr, stream.handle())) }?;
                }
                stream.synchronize()?;
                format!("{took:.0}")
            }
            (Some("lookups"), None) => {
                let resource = resource.as_ref().ok_or("no pool yet")?;
                let Received::Buffers(mut held) = ipc.recv(&stream)? else { return Err("expected a buffer".into()) };
                let held = held.pop().ok_or("expected a buffer")?;
                let descriptor = buffer_descriptor(&held)?;
                let uuid = resource.uuid();
                let mut out = String::new();
                for threads in [1usize, 8] {
                    let rate = rate(threads, 200_000, |_| {
                        let found = registry().get(uuid)?;
                        std::hint::black_box(found);
                        Ok(())
                    })?;
                    let _ =
                        write!(out, "lookup,{threads},{:.0},{:.0},{:.0},{};", rate.median, rate.p10, rate.p90, rate.n);
                    let rate = rate_with_stream(device, threads, 20_000, |stream| {
                        let again = resource.import_buffer(&descriptor, stream)?;
                        drop(again);
                        Ok(())
                    })?;
                    let _ =
                        write!(out, "import,{threads},{:.0},{:.0},{:.0},{};", rate.median, rate.p10, rate.p90, rate.n);
                }
                drop(held);
                stream.synchronize()?;
                out
            }
            (Some("exit"), None) => return Ok(()),
            _ => return Err(format!("unknown command {:?}", line.trim_end()).into()),
        };
        reply.write_all(format!("{answer}\n").as_bytes())?;
    }
}

/// Operations per second of `op` on `threads` threads, `total` operations per repetition split
/// between them, 5 repetitions after one warm-up.
fn rate(threads: usize, total: usize, op: impl Fn(usize) -> Result<(), Error> + Sync) -> Result<Stats, Error> {
    let each = total / threads;
    let mut sample = Vec::new();
    for rep in 0..6 {
        let barrier = Barrier::new(threads + 1);
        let took = std::thread::scope(|scope| -> Result<f64, Error> {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (op, barrier) = (&op, &barrier);
                    scope.spawn(move || -> Result<(), String> {
                        barrier.wait();
                        (0..each).try_for_each(|_| op(t)).map_err(|e| e.to_string())
                    })
                })
                .collect();
            barrier.wait();
            let start = Instant::now();
            for handle in handles {
                handle.join().map_err(|_| "a thread panicked")??;
            }
            Ok(start.elapsed().as_secs_f64())
        })?;
        if rep > 0 {
            sample.push((each * threads) as f64 / took);
        }
    }
    Ok(Stats::of(sample))
}

/// [`rate`] where each thread has a stream of its own.
fn rate_with_stream(
    device: Device,
    threads: usize,
    total: usize,
    op: impl Fn(&Stream) -> Result<(), Error> + Sync,
) -> Result<Stats, Error> {
    let streams = (0..threads)
        .map(|_| Stream::new(device, StreamOptions::default().non_blocking()))
        .collect::<Result<Vec<_>, _>>()?;
    let stats = rate(threads, total, |t| op(&streams[t]))?;
    for stream in &streams {
        stream.synchronize()?;
    }
    Ok(stats)
}

// ---------------------------------------------------------------------------------------------
// 3. VMM growth.
// ---------------------------------------------------------------------------------------------

struct VmmMode {
    moving: bool,
    /// Per step: the size after it and its time.
    steps: Vec<(usize, f64)>,
    /// Steps whose pointer did not behave as the mode wants (moved in place mode, stayed put
    /// in moving mode).
    unexpected: usize,
    /// Counted steps: chunks before the step, calls per function (simulator only).
    calls: Vec<(usize, Vec<(&'static str, u32)>)>,
}

impl VmmMode {
    fn name(&self) -> &'static str {
        if self.moving { "forced to move" } else { "in place" }
    }

    fn stats(&self, range: std::ops::Range<usize>) -> Stats {
        Stats::of(self.steps[range].iter().map(|&(_, t)| t).collect())
    }

    fn tenth(&self) -> usize {
        (self.steps.len() / 10).max(1)
    }
}

/// The functions counted per step: every function cuda-mem-vmm calls, the context and stream
/// functions it reaches through cuda-mem-core, and the copies (which must stay at zero).
const COUNTED: [&std::ffi::CStr; 14] = [
    c"cuMemAddressReserve",
    c"cuMemAddressFree",
    c"cuMemCreate",
    c"cuMemRelease",
    c"cuMemMap",
    c"cuMemUnmap",
    c"cuMemSetAccess",
    c"cuMemGetAllocationGranularity",
    c"cuStreamSynchronize",
    c"cuCtxGetCurrent",
    c"cuCtxSetCurrent",
    c"cuMemcpy",
    c"cuMemcpyDtoD_v2",
    c"cuMemcpyAsync",
];

/// More calls of one function than any step makes; the probe makes the rest.
const ARM_AT: u32 = 4096;

fn vmm(device: Device, simulator: bool) -> Result<Vec<VmmMode>, Error> {
    let mut modes = Vec::new();
    for moving in [false, true] {
        let (steps, unexpected, _) = grow_all(device, moving, false)?;
        modes.push(VmmMode { moving, steps, unexpected, calls: Vec::new() });
    }
    // Counting arms the simulator's fault injection, which makes every later call slower: last.
    if simulator {
        for mode in &mut modes {
            mode.calls = grow_all(device, mode.moving, true)?.2;
        }
    }
    for mode in &modes {
        let tenth = mode.tenth();
        let n = mode.steps.len();
        println!(
            "  {}: {} steps, {} per step, first 10% {}, last 10% {}{}",
            mode.name(),
            n,
            mode.stats(0..n).show(),
            ns(mode.stats(0..tenth).median),
            ns(mode.stats(n - tenth..n).median),
            calls_summary(mode)
        );
    }
    Ok(modes)
}

fn calls_summary(mode: &VmmMode) -> String {
    let totals: Vec<String> = mode
        .calls
        .iter()
        .map(|(chunks, calls)| format!("{chunks}:{}", calls.iter().map(|c| c.1).sum::<u32>()))
        .collect();
    if totals.is_empty() {
        String::new()
    } else {
        format!("; calls per step by chunks before it: {}", totals.join(" "))
    }
}

/// Whether step `index` (0-based) is one the counting pass counts.
fn counted_step(index: usize, last: usize) -> bool {
    index == last || (index + 1).is_power_of_two()
}

type Counts = Vec<(usize, Vec<(&'static str, u32)>)>;

/// Per step: the size after it and its time.
type Steps = Vec<(usize, f64)>;

/// Grows from one step to the limit; per step its size and time, the unexpected steps, and
/// (when counting) the calls of the counted steps.
fn grow_all(device: Device, moving: bool, count: bool) -> Result<(Steps, usize, Counts), Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
    let mut buffer: VirtualBuffer = vmm.allocate(VMM_STEP, Some(&stream))?;
    let last = VMM_LIMIT / VMM_STEP - 2;
    let (mut steps, mut unexpected, mut counts) = (Vec::new(), 0, Vec::new());
    for index in 0..=last {
        let size = buffer.size() + VMM_STEP;
        let end = buffer.ptr() + buffer.size() as u64;
        let block = if moving { Some(Block::reserve_at(d, end, VMM_STEP)?) } else { None };
        let counting = count && counted_step(index, last);
        if counting {
            arm(d)?;
        }
        let chunks = buffer.chunk_count();
        let before = buffer.ptr();
        let start = Instant::now();
        let grown = buffer.grow(size)?;
        drop(std::mem::replace(&mut buffer, grown));
        let took = elapsed_ns(start);
        if counting {
            counts.push((chunks, probe(d, &stream)?));
        }
        drop(block);
        if (buffer.ptr() != before) != moving {
            unexpected += 1;
        }
        steps.push((size, took));
    }
    drop(buffer);
    stream.synchronize()?;
    Ok((steps, unexpected, counts))
}

/// Repetitions of the single growth (2 MiB to 4 MiB) that cuda.core's side compares with.
const FIRST_GROW_REPS: usize = 300;

/// One growth from 2 MiB to 4 MiB of a fresh buffer, in place and forced to move, repeated: the
/// one growth cuda.core 1.2.2 can make (see BENCHMARKS.md), so the comparison has a number for
/// both. Timed like a step of [`grow_all`]: the grow and dropping the buffer it grew from.
fn first_grows(device: Device) -> Result<Vec<(bool, Stats)>, Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let vmm = VirtualMemoryResource::new(device, VirtualMemoryResourceOptions::default())?;
    let mut rows = Vec::new();
    for moving in [false, true] {
        let (mut sample, mut unexpected) = (Vec::with_capacity(FIRST_GROW_REPS), 0);
        for rep in 0..FIRST_GROW_REPS + FIRST_GROW_REPS / 10 {
            let buffer: VirtualBuffer = vmm.allocate(VMM_STEP, Some(&stream))?;
            let end = buffer.ptr() + buffer.size() as u64;
            let block = if moving { Some(Block::reserve_at(d, end, VMM_STEP)?) } else { None };
            let before = buffer.ptr();
            let start = Instant::now();
            let grown = buffer.grow(2 * VMM_STEP)?;
            drop(buffer);
            let took = elapsed_ns(start);
            let in_mode = (grown.ptr() != before) == moving;
            drop((grown, block));
            // The first tenth warms up; a growth that did not behave as the mode wants (the
            // driver did not give the blocking reservation the address asked for) is left out.
            if rep >= FIRST_GROW_REPS / 10 {
                if in_mode { sample.push(took) } else { unexpected += 1 }
            }
        }
        let stats = Stats::of(sample);
        let mode = if moving { "forced to move" } else { "in place" };
        println!("  one growth 2 MiB -> 4 MiB, {mode}: {} ({unexpected} left out)", stats.show());
        rows.push((moving, stats));
    }
    stream.synchronize()?;
    Ok(rows)
}

/// Arms an injected failure of every counted function at its `ARM_AT`th next call.
fn arm(d: &Driver) -> Result<(), Error> {
    for function in COUNTED {
        cuda_sim::testing::inject_failure(d, function, ARM_AT)?;
    }
    Ok(())
}

/// Calls each counted function with harmless arguments until the armed failure fires: the step
/// made `ARM_AT` minus that many calls of it.
fn probe(d: &Driver, stream: &Stream) -> Result<Vec<(&'static str, u32)>, Error> {
    let oom = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    // SAFETY: all-zero bytes are a valid value of these plain C structs (no references).
    let prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let desc: CUmemAccessDesc = unsafe { std::mem::zeroed() };
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { cu_call!(d, cuCtxGetCurrent(&mut current)) }?;
    let handle: CUstream = stream.handle();
    let mut out = Vec::new();
    for function in COUNTED {
        let name = function.to_str().unwrap_or("?");
        let call = || -> Result<CUresult, Error> {
            let mut ptr: DevicePtr = 0;
            let mut generic = 0;
            let mut granularity = 0usize;
            let mut got: CUcontext = std::ptr::null_mut();
            let minimum = CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
            // SAFETY: every pointer argument points to a live local of the right type, and the
            // calls ask for nothing (zero sizes, null handles the driver refuses, the current
            // context, a synchronize), so that a call that is not the armed failure changes
            // nothing.
            let code = unsafe {
                match name {
                    "cuMemAddressReserve" => d.cuMemAddressReserve()?(&mut ptr, 0, 0, 0, 0),
                    "cuMemAddressFree" => d.cuMemAddressFree()?(0, 0),
                    "cuMemCreate" => d.cuMemCreate()?(&mut generic, 0, &prop, 0),
                    "cuMemRelease" => d.cuMemRelease()?(0),
                    "cuMemMap" => d.cuMemMap()?(0, 0, 0, 0, 0),
                    "cuMemUnmap" => d.cuMemUnmap()?(0, 0),
                    "cuMemSetAccess" => d.cuMemSetAccess()?(0, 0, &desc, 1),
                    "cuMemGetAllocationGranularity" => {
                        d.cuMemGetAllocationGranularity()?(&mut granularity, &prop, minimum)
                    }
                    "cuStreamSynchronize" => d.cuStreamSynchronize()?(handle),
                    "cuCtxGetCurrent" => d.cuCtxGetCurrent()?(&mut got),
                    "cuCtxSetCurrent" => d.cuCtxSetCurrent()?(current),
                    "cuMemcpy" => d.cuMemcpy()?(0, 0, 0),
                    "cuMemcpyDtoD_v2" => d.cuMemcpyDtoD_v2()?(0, 0, 0),
                    "cuMemcpyAsync" => d.cuMemcpyAsync()?(0, 0, 0, handle),
                    _ => return Err(format!("no probe for {name}").into()),
                }
            };
            Ok(code)
        };
        let mut probes = 0;
        loop {
            probes += 1;
            if call()? == oom {
                break;
            }
            if probes > ARM_AT {
                return Err(format!("the armed failure of {name} never fired").into());
            }
        }
        out.push((name, ARM_AT - probes));
    }
    Ok(out)
}

/// An address range reserved with the raw driver API right after a buffer, as another allocator
/// might, so that the buffer cannot grow in place.
struct Block<'a> {
    d: &'a Driver,
    ptr: DevicePtr,
    size: usize,
}

impl<'a> Block<'a> {
    fn reserve_at(d: &'a Driver, hint: DevicePtr, size: usize) -> Result<Block<'a>, Error> {
        let mut ptr: DevicePtr = 0;
        // SAFETY: a valid out-pointer; a hint is only a request.
        unsafe { cu_call!(d, cuMemAddressReserve(&mut ptr, size, 0, hint, 0)) }?;
        Ok(Block { d, ptr, size })
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        // SAFETY: the range this value reserved, freed once; nothing is mapped in it.
        if let Err(error) = unsafe { cu_call!(self.d, cuMemAddressFree(self.ptr, self.size)) } {
            eprintln!("bench: freeing a blocking reservation: {error}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 5. The first driver call.
// ---------------------------------------------------------------------------------------------

/// Spawns `bench --first-call` (2 warm-up runs, then `FIRST_CALL_RUNS`): the parent's time from
/// spawn to the child's line, and the child's own from `main` to the call's return.
fn first_call(driver_path: &Path) -> Result<(Stats, Stats), Error> {
    let exe = std::env::current_exe()?;
    let (mut spawn_to_return, mut main_to_return) = (Vec::new(), Vec::new());
    for run in 0..FIRST_CALL_RUNS + 2 {
        let start = Instant::now();
        let mut child = Command::new(&exe)
            .arg(FIRST_CALL_ARG)
            .env(DRIVER_ENV, driver_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = Vec::new();
        let mut byte = [0u8];
        while stdout.read(&mut byte)? == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let took = elapsed_ns(start);
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("`bench {FIRST_CALL_ARG}` exited with {status}").into());
        }
        let inner: f64 = String::from_utf8(line)?.trim().parse()?;
        if run >= 2 {
            spawn_to_return.push(took);
            main_to_return.push(inner);
        }
    }
    let result = (Stats::of(spawn_to_return), Stats::of(main_to_return));
    println!("  spawn to first call returned {}; main() to returned {}", result.0.show(), result.1.show());
    Ok(result)
}

/// The child of case 5: opens the driver through `cuda_sys::driver()` (`CUDA_MEM_DRIVER`),
/// calls `cuDriverGetVersion`, and prints the nanoseconds since `main` began.
fn first_call_main(started: Instant) -> Result<(), Error> {
    let version = cuda_mem_core::sys::driver()?.version()?;
    let took = elapsed_ns(started);
    std::hint::black_box(version);
    println!("{took:.0}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Outputs.
// ---------------------------------------------------------------------------------------------

fn bytes(size: usize) -> String {
    match size {
        s if s >= MIB && s % MIB == 0 => format!("{} MiB", s / MIB),
        s if s >= KIB && s % KIB == 0 => format!("{} KiB", s / KIB),
        s => format!("{s} B"),
    }
}

fn escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

fn json(results: &Results) -> String {
    let mut out = String::from("{\n");
    let _ = writeln!(out, r#"  "driver": "{}","#, escape(&results.driver));
    let _ = writeln!(out, r#"  "host_cpus": {},"#, host_cpus());
    let _ = writeln!(out, r#"  "simulator": {},"#, results.simulator);
    out.push_str("  \"units\": \"nanoseconds, except rates (operations per second)\",\n");
    out.push_str("  \"pools\": [\n");
    let rows: Vec<String> = results.pools.iter().map(|r| format!("    {}", r.json())).collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n");
    if let Some(p) = &results.pacing {
        let _ = writeln!(
            out,
            r#"  "pacing": {{"work_ns":{PACING_WORK_NS},"raw_per_pair":{},"raw_with_work_per_pair":{},"hidden_ns":{:.1}}},"#,
            p.raw.json(),
            p.raw_with_work.json(),
            p.hidden_ns()
        );
    }
    out.push_str("  \"sharing\": [\n");
    let rows: Vec<String> = results
        .sharing
        .iter()
        .map(|r| {
            format!(
                r#"    {{"batch":{},"per_buffer":{{"ours_parent":{},"ours_child":{},"ours":{},"raw_parent":{},"raw_child":{},"raw":{}}},"overhead_per_buffer":{:.1}}}"#,
                r.batch,
                r.ours_parent.json(),
                r.ours_child.json(),
                r.ours.json(),
                r.raw_parent.json(),
                r.raw_child.json(),
                r.raw.json(),
                r.overhead()
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"vmm\": [\n");
    let rows: Vec<String> = results
        .vmm
        .iter()
        .map(|m| {
            let n = m.steps.len();
            let tenth = m.tenth();
            let sizes: Vec<String> = m.steps.iter().map(|s| s.0.to_string()).collect();
            let times: Vec<String> = m.steps.iter().map(|s| format!("{:.0}", s.1)).collect();
            let calls: Vec<String> = m
                .calls
                .iter()
                .map(|(chunks, calls)| {
                    let per: Vec<String> =
                        calls.iter().filter(|c| c.1 > 0).map(|(f, c)| format!(r#""{f}":{c}"#)).collect();
                    format!(
                        r#"{{"chunks_before":{chunks},"total":{},"by_function":{{{}}}}}"#,
                        calls.iter().map(|c| c.1).sum::<u32>(),
                        per.join(",")
                    )
                })
                .collect();
            format!(
                "    {{\"mode\":\"{}\",\"steps\":{n},\"per_step\":{},\"first_10pct\":{},\"last_10pct\":{},\"unexpected_steps\":{},\"calls\":[{}],\n     \"size_after\":[{}],\n     \"step_ns\":[{}]}}",
                m.name(),
                m.stats(0..n).json(),
                m.stats(0..tenth).json(),
                m.stats(n - tenth..n).json(),
                m.unexpected,
                calls.join(","),
                sizes.join(","),
                times.join(",")
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"vmm_first_grow\": [\n");
    let rows: Vec<String> = results
        .first_grows
        .iter()
        .map(|(moving, stats)| {
            format!(
                r#"    {{"mode":"{}","per_grow":{}}}"#,
                if *moving { "forced to move" } else { "in place" },
                stats.json()
            )
        })
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n  \"rates\": [\n");
    let rows: Vec<String> = results
        .lookups
        .iter()
        .map(|r| format!(r#"    {{"what":"{}","threads":{},"per_second":{}}}"#, r.what, r.threads, r.rate.json()))
        .collect();
    out.push_str(&rows.join(",\n"));
    out.push_str("\n  ],\n");
    match &results.first_call {
        Some((spawn, main)) => {
            let _ = writeln!(
                out,
                r#"  "first_call": {{"spawn_to_return":{},"main_to_return":{}}}"#,
                spawn.json(),
                main.json()
            );
        }
        None => out.push_str("  \"first_call\": null\n"),
    }
    out.push_str("}\n");
    out
}

fn markdown(results: &Results) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# cuda-mem benchmarks\n\ndriver: {}\n\nhost: {} CPUs\n", results.driver, host_cpus());
    md.push_str("Times are medians with p10–p90 in brackets.\n\n");

    md.push_str("## 1. Pool allocate+free pairs (one stream per thread)\n\n");
    md.push_str(
        "Safe: `allocate` (a `Buffer`, which holds shares of its pool and stream). Scoped: `allocate_scoped` (a \
         `ScopedBuffer`, which borrows them). Raw: `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` through cuda-sys. Raw \
         + check: the same with the `cuStreamIsCapturing` the safe API makes before each allocation (as cuda.core \
         does), so that safe / (raw + check) is our code's share alone.\n\n\
         | size | threads | safe API per pair | scoped per pair | raw cuda-sys per pair | raw + check per pair | \
         safe/raw | scoped/raw | safe/(raw + check) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &results.pools {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {:.2}× | {:.2}× | {:.2}× |",
            bytes(r.size),
            r.threads,
            r.safe.show(),
            r.scoped.show(),
            r.raw.show(),
            r.raw_checked.show(),
            r.ratio(),
            r.ratio_scoped(),
            r.ratio_checked()
        );
    }

    if let Some(p) = &results.pacing {
        let _ = writeln!(
            md,
            "\nAdditivity check: a raw 256 B pair takes {}; with {PACING_WORK_NS} ns of the caller's own work after \
             each, the work's own time taken off, {}: {:.0} ns less than alone, where a driver whose cost does not \
             depend on its caller's pace would show about 0. Caller work of up to about {:.0} ns per pair, an API's \
             overhead included, can hide in the driver's time here, so safe minus raw understates it by up to that \
             much.",
            p.raw.show(),
            p.raw_with_work.show(),
            p.hidden_ns(),
            p.hidden_ns().clamp(0.0, PACING_WORK_NS as f64)
        );
    }
    md.push_str("\n## 2. Sharing with a child process, per buffer\n\n");
    md.push_str(
        "| batch | ours: parent (export+encode+send) | ours: child (recv+decode+import) | ours total | raw: parent | \
         raw: child | raw total | our cost beyond the raw calls |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in &results.sharing {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.batch,
            r.ours_parent.show(),
            r.ours_child.show(),
            r.ours.show(),
            r.raw_parent.show(),
            r.raw_child.show(),
            r.raw.show(),
            ns(r.overhead())
        );
    }

    md.push_str("\n## 3. VMM growth, 2 MiB to 1 GiB in 2 MiB steps\n\n");
    md.push_str(
        "| mode | steps | per step | first 10% | last 10% | steps not in their mode |\n|---|---|---|---|---|---|\n",
    );
    for m in &results.vmm {
        let n = m.steps.len();
        let tenth = m.tenth();
        let _ = writeln!(
            md,
            "| {} | {n} | {} | {} | {} | {} |",
            m.name(),
            m.stats(0..n).show(),
            m.stats(0..tenth).show(),
            m.stats(n - tenth..n).show(),
            m.unexpected
        );
    }
    if results.vmm.iter().any(|m| !m.calls.is_empty()) {
        md.push_str("\nDriver calls per step (counted on the simulator), by the chunks the buffer had before it:\n\n");
        md.push_str("| mode | chunks before | calls | by function |\n|---|---|---|---|\n");
        for m in &results.vmm {
            for (chunks, calls) in &m.calls {
                let per: Vec<String> = calls.iter().filter(|c| c.1 > 0).map(|(f, c)| format!("{f} {c}")).collect();
                let total: u32 = calls.iter().map(|c| c.1).sum();
                let _ = writeln!(md, "| {} | {chunks} | {total} | {} |", m.name(), per.join(", "));
            }
        }
    } else {
        md.push_str("\nDriver calls per step are counted on the simulator only.\n");
    }

    if !results.first_grows.is_empty() {
        md.push_str("\nOne growth of a fresh buffer from 2 MiB to 4 MiB (the grow and dropping the old buffer):\n\n");
        md.push_str("| mode | per growth |\n|---|---|\n");
        for (moving, stats) in &results.first_grows {
            let _ = writeln!(md, "| {} | {} |", if *moving { "forced to move" } else { "in place" }, stats.show());
        }
    }

    md.push_str("\n## 4. Registry lookups and duplicate-import cache hits\n\n");
    md.push_str("| operation | threads | per second (all threads) |\n|---|---|---|\n");
    for r in &results.lookups {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} M ({:.2}–{:.2} M) |",
            r.what,
            r.threads,
            r.rate.median / 1e6,
            r.rate.p10 / 1e6,
            r.rate.p90 / 1e6
        );
    }

    md.push_str("\n## 5. First driver call (lazy loading)\n\n");
    if let Some((spawn, main)) = &results.first_call {
        md.push_str("| measured | time |\n|---|---|\n");
        let _ = writeln!(md, "| spawn to the child's report (parent's clock; exec included) | {} |", spawn.show());
        let _ = writeln!(md, "| child's main() to cuDriverGetVersion returned | {} |", main.show());
    }
    md
}

/// One line of a plot: its name, its colour and its (x, y) points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A plot: lines of (x, y) points, log-scale x or y when asked.
struct Plot<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    log_x: bool,
    /// Decades on the y axis: for lines that differ by orders of magnitude, where one outlier
    /// would otherwise flatten everything else against the axis.
    log_y: bool,
    series: Vec<Series<'a>>,
    x_ticks: Vec<(f64, String)>,
}

fn svg(plot: &Plot<'_>) -> String {
    // Room on the left for the tick labels and the axis title, on the right for the last x
    // label, and on top for the legend (drawn in one row, outside the plot so no line hides it).
    let (w, h, left, right, top, bottom) = (780.0, 460.0, 104.0, 48.0, 64.0, 60.0);
    // Non-positive values have no place on a log axis: they are left out of it.
    let points = plot.series.iter().flat_map(|s| s.2.iter().copied()).filter(|&(_, y)| !plot.log_y || y > 0.0);
    let fx = |x: f64| if plot.log_x { x.log2() } else { x };
    let (mut x0, mut x1, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, 0.0f64);
    for (x, y) in points {
        x0 = x0.min(fx(x));
        x1 = x1.max(fx(x));
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // The y axis in its own units: decades (log) or the value, from y0 to y1.
    let (y0, y1) = if plot.log_y {
        let low = if y_min < f64::MAX { y_min.log10().floor() } else { 0.0 };
        let high = if y_max > 0.0 { y_max.log10().ceil() } else { 1.0 };
        (low, if high > low { high } else { low + 1.0 })
    } else {
        (0.0, if y_max > 0.0 { y_max * 1.1 } else { 1.0 })
    };
    let fy = |y: f64| if plot.log_y { y.max(f64::MIN_POSITIVE).log10() } else { y };
    let px = |x: f64| left + (fx(x) - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - (fy(y) - y0) / (y1 - y0) * (h - top - bottom);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{}</text>
"#,
        w / 2.0,
        plot.title,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom,
        (left + w - right) / 2.0,
        h - 15.0,
        plot.x_label,
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0,
        plot.y_label
    );
    let y_ticks: Vec<f64> = if plot.log_y {
        // One tick per decade (y0 and y1 are whole decades).
        (0..=(y1 - y0) as i32).map(|i| 10f64.powf(y0 + f64::from(i))).collect()
    } else {
        (0..=5).map(|i| y1 * f64::from(i) / 5.0).collect()
    };
    for y in y_ticks {
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4}</text>"##,
            py(y),
            w - right,
            left - 6.0,
            py(y) + 4.0,
            ns(y)
        );
    }
    for (x, label) in &plot.x_ticks {
        let _ =
            writeln!(out, r#"<text x="{:.1}" y="{}" text-anchor="middle">{label}</text>"#, px(*x), h - bottom + 18.0);
    }
    for (i, (name, color, points)) in plot.series.iter().enumerate() {
        let shown = || points.iter().filter(|&&(_, y)| !plot.log_y || y > 0.0);
        let path: Vec<String> = shown().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ =
            writeln!(out, r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#, path.join(" "));
        if points.len() <= 16 {
            for &(x, y) in shown() {
                let _ = writeln!(out, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, px(x), py(y));
            }
        }
        let lx = left + 160.0 * i as f64;
        let ly = top - 16.0;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{}">{name}</text>"#,
            lx,
            ly - 4.0,
            lx + 20.0,
            ly
        );
    }
    out.push_str("</svg>\n");
    out
}

fn vmm_svg(modes: &[VmmMode]) -> String {
    let colors = ["#1f77b4", "#d62728"];
    let series = modes
        .iter()
        .zip(colors)
        .map(|(m, color)| (m.name(), color, m.steps.iter().map(|&(s, t)| (s as f64 / MIB as f64, t)).collect()))
        .collect();
    let x_ticks = (0..=4).map(|i| (f64::from(i) * 256.0, format!("{} MiB", i * 256))).collect();
    svg(&Plot {
        title: "VMM grow: time per 2 MiB step vs buffer size",
        x_label: "buffer size after the step",
        y_label: "time per step (log scale)",
        log_x: false,
        log_y: true,
        series,
        x_ticks,
    })
}

/// One kind's median in a row of case (1).
type PoolMedian = fn(&PoolRow) -> f64;

fn pools_svg(rows: &[PoolRow]) -> String {
    let kinds: [(&str, PoolMedian); 3] =
        [("Buffer", |r| r.safe.median), ("ScopedBuffer", |r| r.scoped.median), ("raw", |r| r.raw.median)];
    let colors = [["#1f77b4", "#2ca02c", "#aec7e8"], ["#d62728", "#ff7f0e", "#ff9896"]];
    let mut lines = Vec::new();
    for (threads, colors) in [1, POOL_THREADS].into_iter().zip(colors) {
        for ((kind, median), color) in kinds.into_iter().zip(colors) {
            let points: Vec<(f64, f64)> =
                rows.iter().filter(|r| r.threads == threads).map(|r| (r.size as f64, median(r))).collect();
            let plural = if threads == 1 { "" } else { "s" };
            lines.push((format!("{kind}, {threads} thread{plural}"), color, points));
        }
    }
    let series = lines.iter().map(|(name, color, points)| (name.as_str(), *color, points.clone())).collect();
    let x_ticks = POOL_SIZES.iter().map(|&s| (s as f64, bytes(s))).collect();
    svg(&Plot {
        title: "Pool allocate+free pair: safe API (Buffer, ScopedBuffer) vs raw calls",
        x_label: "allocation size (log scale)",
        y_label: "time per pair (median)",
        log_x: true,
        log_y: false,
        series,
        x_ticks,
    })
}
