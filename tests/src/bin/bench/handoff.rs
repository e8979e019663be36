//! Case (11): hand-off to workers. Buffers of 1 MiB from an IPC-enabled pool, lent to worker
//! processes (`bench --handoff-worker`, [`crate::handoff_worker`]) which hand each straight back:
//! the round trip `lend` → `recv` + `give_back` → `Received::Returned`.
//!
//! - Throughput: buffers per second with 1, 4 and 16 workers at once, one buffer in flight per
//!   worker, served by an [`AsyncIpcChannel`] per worker on one current-thread Tokio runtime (one
//!   task per worker) and by an [`IpcChannel`] per worker on a thread each; and the same round
//!   trip by hand ([`raw_handoff`]: `cuMemPoolExportPointer`, a plain frame, the worker's
//!   `cuMemPoolImportPointer` + `cuMemFreeAsync` + `cuStreamSynchronize`, a plain frame back),
//!   on a thread each; in turn, in the same rounds.
//! - Latency of one hand-off to one worker: the first send of a pool (its resource message and
//!   import with the buffer; a fresh pool each time) apart from re-sends (the buffer only), each
//!   against its raw counterpart (the first with the pool's descriptor exported and imported by
//!   hand).
//!
//! Both servers and the raw baseline serve the same worker processes, the async server through a
//! second channel of each (an `AsyncChannel` cannot go back to a blocking one), so that each
//! sees the same scheduling of the same processes.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cuda_mem_core::sys::types::{CUmemAllocationHandleType, CUmemPoolPtrExportData};
use cuda_mem_core::sys::{DRIVER_ENV, cu_call};
use cuda_mem_core::{Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream, StreamOptions};
use cuda_mem_ipc::{AsyncChannel, AsyncIpcChannel, Channel, IpcChannel, Received, spawn_with_channel};
use serde_json::{Value, json};

use crate::Error;
use crate::cli::HANDOFF_WORKER_ARG;
use crate::handoff_worker::{
    RAW, RAW_END_KIND, RAW_FIRST_KIND, RAW_HANDOFF_KIND, RAW_RETURNED_KIND, SECOND_CHANNEL_KIND, STOP,
};
use crate::stats::{Stats, elapsed_ns, rounded};
use crate::units::MIB;

/// The bytes of each buffer handed off.
pub(crate) const HANDOFF_BUFFER: usize = MIB;
/// The worker counts of the throughput rows.
const WORKERS: [usize; 3] = [1, 4, 16];
/// Timed hand-offs per worker per round (after [`WARM_UP`]).
const HANDOFFS: usize = 100;
/// Untimed hand-offs per worker before each round.
const WARM_UP: usize = 10;
/// Rounds of each throughput row, each server in turn per round: many short rounds, so that
/// each server sees the same scheduling (see [`latency`]).
const ROUNDS: usize = 11;
/// Timed re-sends of the latency rows.
const RESENDS: usize = 200;
/// Timed first sends of the latency rows (a fresh pool each).
const FIRST_SENDS: usize = 20;

/// The driver's handle type for a pool shared by file descriptor.
const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// One worker count: buffers per second (lent and returned) over the rounds.
pub(crate) struct HandoffRow {
    pub(crate) workers: usize,
    /// Our layer, async server (one task per worker, one thread).
    pub(crate) async_rate: Stats,
    /// Our layer, blocking server (one thread per worker).
    pub(crate) blocking_rate: Stats,
    /// The raw round trip, one thread per worker.
    pub(crate) raw_rate: Stats,
}

impl HandoffRow {
    /// The async server's rate over the blocking one's (above 1: async is faster).
    pub(crate) fn async_over_blocking(&self) -> f64 {
        self.async_rate.median / self.blocking_rate.median
    }

    /// Each server's rate over the raw round trip's: async, blocking (1: as fast as raw).
    pub(crate) fn over_raw(&self) -> [f64; 2] {
        [self.async_rate.median / self.raw_rate.median, self.blocking_rate.median / self.raw_rate.median]
    }

    /// As a JSON object (a row of `results.json`'s `handoff.throughput`).
    fn json(&self) -> Value {
        let [async_raw, blocking_raw] = self.over_raw();
        json!({
            "workers": self.workers,
            "async_per_second": self.async_rate.json(),
            "blocking_per_second": self.blocking_rate.json(),
            "raw_per_second": self.raw_rate.json(),
            "async_over_blocking": rounded(self.async_over_blocking(), 3),
            "async_over_raw": rounded(async_raw, 3),
            "blocking_over_raw": rounded(blocking_raw, 3),
        })
    }
}

/// One hand-off to one worker, in nanoseconds: through each server and by hand.
pub(crate) struct LatencyRow {
    /// `first send` or `re-send`.
    pub(crate) what: &'static str,
    pub(crate) blocking: Stats,
    pub(crate) async_: Stats,
    pub(crate) raw: Stats,
}

impl LatencyRow {
    /// Each server's time over the raw round trip's: async, blocking (1: as fast as raw).
    pub(crate) fn over_raw(&self) -> [f64; 2] {
        [self.async_.median / self.raw.median, self.blocking.median / self.raw.median]
    }

    fn json(&self) -> Value {
        let [async_raw, blocking_raw] = self.over_raw();
        json!({
            "what": self.what,
            "async": self.async_.json(),
            "blocking": self.blocking.json(),
            "raw": self.raw.json(),
            "async_over_raw": rounded(async_raw, 3),
            "blocking_over_raw": rounded(blocking_raw, 3),
        })
    }
}

/// Case (11)'s results.
#[derive(Default)]
pub(crate) struct Handoff {
    pub(crate) throughput: Vec<HandoffRow>,
    pub(crate) latency: Vec<LatencyRow>,
}

impl Handoff {
    /// As a JSON object (`results.json`'s `handoff`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "buffer_bytes": HANDOFF_BUFFER,
            "handoffs_per_worker": HANDOFFS,
            "throughput": self.throughput.iter().map(HandoffRow::json).collect::<Vec<_>>(),
            "latency": self.latency.iter().map(LatencyRow::json).collect::<Vec<_>>(),
        })
    }
}

/// A worker process and our channels to it: the blocking server's (and the raw baseline's), and
/// the async server's.
struct Worker {
    process: Child,
    ipc: IpcChannel,
    async_ipc: Arc<AsyncIpcChannel>,
}

/// Starts `bench --handoff-worker` on the driver at `driver_path`, and hands it its second
/// channel, registered with `runtime`'s reactor.
fn spawn(driver_path: &Path, runtime: &tokio::runtime::Runtime) -> Result<Worker, Error> {
    let mut command = Command::new(std::env::current_exe()?);
    command.arg(HANDOFF_WORKER_ARG).env(DRIVER_ENV, driver_path).stdin(Stdio::null());
    let (process, channel) = spawn_with_channel(&mut command)?;
    let (here, there) = UnixStream::pair()?;
    channel.send(SECOND_CHANNEL_KIND, b"async", &[there.as_fd()])?;
    drop(there);
    let second = Channel::from_stream(here)?;
    let second = runtime.block_on(async { AsyncChannel::new(second) })?;
    Ok(Worker { process, ipc: IpcChannel::new(channel), async_ipc: Arc::new(AsyncIpcChannel::new(second)) })
}

/// Case (11): spawns the workers (16), runs the throughput rows and the latency
/// rows, stops the workers; printed as it goes.
pub(crate) fn handoff(device: Device, driver_path: &Path) -> Result<Handoff, Error> {
    let most = WORKERS.iter().copied().max().unwrap_or(1);
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    let workers: Vec<Worker> = (0..most).map(|_| spawn(driver_path, &runtime)).collect::<Result<_, _>>()?;
    // A buffer per worker, lent again and again; the first lend sends the pool too.
    // (`None` only while lent, or once lost in a failed hand-off.)
    let mut buffers: Vec<Option<Buffer>> =
        (0..most).map(|_| pool.allocate(HANDOFF_BUFFER, &stream).map(Some)).collect::<Result<_, _>>()?;
    stream.synchronize()?;
    let mut result = Handoff::default();
    // Pools of the first sends, kept until the workers have exited (they import them).
    let mut first_pools = Vec::new();
    let measured = (|| -> Result<(), Error> {
        for n in WORKERS {
            let (mut async_rates, mut blocking_rates, mut raw_rates) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                blocking_rates.push(blocking_round(device, &workers[..n], &mut buffers[..n])?);
                async_rates.push(async_round(&runtime, device, &workers[..n], &mut buffers[..n])?);
                raw_rates.push(raw_round(device, &workers[..n], &buffers[..n])?);
            }
            let row = HandoffRow {
                workers: n,
                async_rate: Stats::of(async_rates),
                blocking_rate: Stats::of(blocking_rates),
                raw_rate: Stats::of(raw_rates),
            };
            let [async_raw, blocking_raw] = row.over_raw();
            println!(
                "  {n} worker(s): async {:.0}/s, blocking {:.0}/s, raw {:.0}/s; async/blocking {:.2}, \
                 against raw: async {async_raw:.2}, blocking {blocking_raw:.2}",
                row.async_rate.median,
                row.blocking_rate.median,
                row.raw_rate.median,
                row.async_over_blocking(),
            );
            result.throughput.push(row);
        }
        let one = workers.first().ok_or("no workers")?;
        result.latency = latency(&runtime, device, one, &mut buffers[0], &mut first_pools)?;
        Ok(())
    })();
    // Stopped whether or not the rows were measured: each worker hands back what it holds first.
    let stopped = stop(&runtime, workers);
    measured?;
    stopped?;
    drop(first_pools);
    Ok(result)
}

/// One hand-off through a blocking channel: `buffer` lent, and back.
fn lend_blocking(ipc: &IpcChannel, buffer: Buffer, stream: &Stream) -> Result<Buffer, Error> {
    ipc.lend(vec![buffer])?;
    returned(ipc.recv(stream)?)
}

/// One hand-off through an async channel.
async fn lend_async(ipc: &AsyncIpcChannel, buffer: Buffer, stream: &Stream) -> Result<Buffer, Error> {
    ipc.lend(vec![buffer]).await?;
    returned(ipc.recv(stream).await?)
}

/// The one buffer a worker handed back.
fn returned(message: Received) -> Result<Buffer, Error> {
    match message {
        Received::Returned(mut back) if back.len() == 1 => back.pop().ok_or_else(|| "no buffer back".into()),
        _ => Err("the worker did not hand back the buffer it was lent".into()),
    }
}

/// The raw round trip of `buffer` (of the pool the worker received first): its export data sent
/// as a plain frame, answered once the worker's import is freed.
fn raw_handoff(channel: &Channel, buffer: &Buffer) -> Result<(), Error> {
    let d = cuda_mem_core::driver()?;
    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: a valid out-pointer; the buffer is a live allocation of an IPC pool.
    unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, buffer.ptr())) }?;
    channel.send(RAW_HANDOFF_KIND, &data.reserved, &[])?;
    raw_returned(channel)
}

/// The worker's answer to a raw frame.
fn raw_returned(channel: &Channel) -> Result<(), Error> {
    let answer = channel.recv()?;
    if answer.kind != RAW_RETURNED_KIND {
        return Err(format!("expected the raw answer, got a frame of kind {}", answer.kind).into());
    }
    Ok(())
}

/// Buffers per second of `hand_off` run [`HANDOFFS`] times on a thread per worker (after
/// [`WARM_UP`] untimed), timed from a barrier to the last thread's end.
fn threaded_round<W: Sync, B: Send>(
    device: Device,
    workers: &[W],
    buffers: &mut [B],
    hand_off: impl Fn(&W, &mut B, &Stream) -> Result<(), Error> + Sync,
) -> Result<f64, Error> {
    let ready = Barrier::new(workers.len() + 1);
    let (hand_off, ready) = (&hand_off, &ready);
    let (start, outcomes) = std::thread::scope(|scope| {
        let threads: Vec<_> = workers
            .iter()
            .zip(buffers.iter_mut())
            .map(|(worker, buffer)| {
                scope.spawn(move || -> Result<(), String> {
                    let mut run = || -> Result<Stream, Error> {
                        device.set_current()?;
                        let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
                        for _ in 0..WARM_UP {
                            hand_off(worker, buffer, &stream)?;
                        }
                        Ok(stream)
                    };
                    let warmed = run();
                    // Every thread reaches the barrier, warmed up or not, so none waits forever.
                    ready.wait();
                    let stream = warmed.map_err(|e| e.to_string())?;
                    for _ in 0..HANDOFFS {
                        hand_off(worker, buffer, &stream).map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        ready.wait();
        let start = Instant::now();
        let outcomes: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        (start, outcomes)
    });
    let took = elapsed_ns(start);
    for outcome in outcomes {
        outcome.map_err(|_| "a hand-off thread panicked")??;
    }
    Ok((workers.len() * HANDOFFS) as f64 / took * 1e9)
}

/// One round of the blocking server: a thread per worker.
fn blocking_round(device: Device, workers: &[Worker], buffers: &mut [Option<Buffer>]) -> Result<f64, Error> {
    threaded_round(device, workers, buffers, |worker, slot, stream| {
        *slot = Some(lend_blocking(&worker.ipc, lost(slot.take())?, stream)?);
        Ok(())
    })
}

/// The buffer of a slot, or the error of a slot a failed hand-off emptied (its buffer freed).
fn lost(slot: Option<Buffer>) -> Result<Buffer, Error> {
    slot.ok_or_else(|| "a buffer was lost in a failed hand-off".into())
}

/// One round of the raw baseline on the blocking server's workers: a thread per worker.
fn raw_round(device: Device, workers: &[Worker], buffers: &[Option<Buffer>]) -> Result<f64, Error> {
    let mut refs: Vec<&Buffer> =
        buffers.iter().map(|b| b.as_ref().ok_or("a buffer was lost in a failed hand-off")).collect::<Result<_, _>>()?;
    for worker in workers {
        worker.ipc.send_data(RAW)?;
    }
    let rate =
        threaded_round(device, workers, &mut refs, |worker, buffer, _| raw_handoff(worker.ipc.channel(), buffer));
    for worker in workers {
        worker.ipc.channel().send(RAW_END_KIND, &[], &[])?;
    }
    rate
}

/// One round of the async server: a task per worker on `runtime` (one thread), warmed up, then
/// timed from the tasks' spawn to the last one's end.
fn async_round(
    runtime: &tokio::runtime::Runtime,
    device: Device,
    workers: &[Worker],
    slots: &mut [Option<Buffer>],
) -> Result<f64, Error> {
    device.set_current()?;
    let stream = Arc::new(Stream::new(device, StreamOptions::default().non_blocking())?);
    let mut run = |count: usize| -> Result<f64, Error> {
        runtime.block_on(async {
            let start = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for (i, (worker, slot)) in workers.iter().zip(slots.iter_mut()).enumerate() {
                let (ipc, stream) = (worker.async_ipc.clone(), stream.clone());
                let mut buffer = lost(slot.take())?;
                tasks.spawn(async move {
                    for _ in 0..count {
                        buffer = lend_async(&ipc, buffer, &stream).await.map_err(|e| e.to_string())?;
                    }
                    Ok::<_, String>((i, buffer))
                });
            }
            while let Some(done) = tasks.join_next().await {
                let (i, buffer) = done.map_err(|e| e.to_string())??;
                slots[i] = Some(buffer);
            }
            Ok(elapsed_ns(start))
        })
    };
    run(WARM_UP)?;
    Ok((workers.len() * HANDOFFS) as f64 / run(HANDOFFS)? * 1e9)
}

/// The latency rows, with one worker, through each server: re-sends of the buffer in `slot` (its pool
/// sent already), and first sends of a fresh pool's buffer each time (the pools pushed to `keep`).
/// The three paths take turns sample by sample, so that each sees the same scheduling (on a
/// small machine a round trip takes about 3 times longer when the two processes land on
/// different cores, and where they land changes now and then).
fn latency(
    runtime: &tokio::runtime::Runtime,
    device: Device,
    worker: &Worker,
    slot: &mut Option<Buffer>,
    keep: &mut Vec<Arc<DeviceMemoryResource>>,
) -> Result<Vec<LatencyRow>, Error> {
    device.set_current()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let (ipc, aipc) = (&worker.ipc, &*worker.async_ipc);
    // The worker switched to the raw baseline and back around each raw sample, untimed.
    let raw_timed = |hand_off: &dyn Fn() -> Result<(), Error>| -> Result<f64, Error> {
        ipc.send_data(RAW)?;
        let start = Instant::now();
        hand_off()?;
        let took = elapsed_ns(start);
        ipc.channel().send(RAW_END_KIND, &[], &[])?;
        Ok(took)
    };
    let mut resend: [Vec<f64>; 3] = Default::default();
    for _ in 0..RESENDS {
        let start = Instant::now();
        *slot = Some(lend_blocking(ipc, lost(slot.take())?, &stream)?);
        resend[0].push(elapsed_ns(start));
        let buffer = lost(slot.take())?;
        let (buffer, took) = runtime.block_on(async {
            let start = Instant::now();
            let buffer = lend_async(aipc, buffer, &stream).await?;
            Ok::<_, Error>((buffer, elapsed_ns(start)))
        })?;
        resend[1].push(took);
        resend[2].push(raw_timed(&|| raw_handoff(ipc.channel(), &buffer))?);
        *slot = Some(buffer);
    }
    // First sends: a fresh pool and buffer each (made untimed), kept until the workers exit.
    let fresh = |keep: &mut Vec<Arc<DeviceMemoryResource>>| -> Result<(Buffer, cuda_mem_core::sys::types::CUmemoryPool), Error> {
        let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
        let buffer = pool.allocate(HANDOFF_BUFFER, &stream)?;
        stream.synchronize()?;
        let handle = pool.pool().handle();
        keep.push(pool);
        Ok((buffer, handle))
    };
    let mut kept_buffers = Vec::new();
    let mut first: [Vec<f64>; 3] = Default::default();
    for _ in 0..FIRST_SENDS {
        let (buffer, _) = fresh(keep)?;
        let start = Instant::now();
        kept_buffers.push(lend_blocking(ipc, buffer, &stream)?);
        first[0].push(elapsed_ns(start));
        let (buffer, _) = fresh(keep)?;
        let (buffer, took) = runtime.block_on(async {
            let start = Instant::now();
            let buffer = lend_async(aipc, buffer, &stream).await?;
            Ok::<_, Error>((buffer, elapsed_ns(start)))
        })?;
        kept_buffers.push(buffer);
        first[1].push(took);
        let (buffer, pool) = fresh(keep)?;
        first[2].push(raw_timed(&|| raw_first_send(ipc.channel(), pool, &buffer))?);
        kept_buffers.push(buffer);
    }
    drop(kept_buffers);
    stream.synchronize()?;
    let row = |what, [blocking, async_, raw]: [Vec<f64>; 3]| LatencyRow {
        what,
        blocking: Stats::of(blocking),
        async_: Stats::of(async_),
        raw: Stats::of(raw),
    };
    let (first, resend) = (row("first send", first), row("re-send", resend));
    for row in [&first, &resend] {
        let [async_raw, blocking_raw] = row.over_raw();
        println!(
            "  one hand-off, {}: blocking {}, async {}, raw {}; against raw: blocking {blocking_raw:.2}, async {async_raw:.2}",
            row.what,
            row.blocking.show(),
            row.async_.show(),
            row.raw.show()
        );
    }
    Ok(vec![first, resend])
}

/// The raw first send of `buffer` of `pool`: the pool's descriptor exported
/// (`cuMemPoolExportToShareableHandle`) and sent with the buffer's export data, imported by hand
/// by the worker; answered once its import is freed.
fn raw_first_send(
    channel: &Channel,
    pool: cuda_mem_core::sys::types::CUmemoryPool,
    buffer: &Buffer,
) -> Result<(), Error> {
    let d = cuda_mem_core::driver()?;
    let mut raw: std::ffi::c_int = -1;
    // SAFETY: `raw` is a valid out-pointer for the `int` a POSIX-fd export writes.
    unsafe { cu_call!(d, cuMemPoolExportToShareableHandle((&raw mut raw).cast(), pool, POSIX_FD, 0)) }?;
    if raw < 0 {
        return Err("the driver exported the pool without a descriptor".into());
    }
    // SAFETY: the driver returned a new descriptor, owned here alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: a valid out-pointer; the buffer is a live allocation of an IPC pool.
    unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, buffer.ptr())) }?;
    channel.send(RAW_FIRST_KIND, &data.reserved, &[fd.as_fd()])?;
    raw_returned(channel)
}

/// Tells every worker to stop, then waits for each to exit successfully.
fn stop(runtime: &tokio::runtime::Runtime, workers: Vec<Worker>) -> Result<(), Error> {
    let mut processes = Vec::new();
    let mut first_error: Option<Error> = None;
    for worker in workers {
        if let Err(error) = worker.ipc.send_data(STOP) {
            first_error.get_or_insert(error.into());
        }
        processes.push(worker.process);
        // Dropped inside the runtime: its socket leaves the reactor there.
        let _guard = runtime.enter();
        drop(worker.async_ipc);
    }
    for mut process in processes {
        let status = process.wait()?;
        if !status.success() {
            first_error.get_or_insert(format!("a hand-off worker exited with {status}").into());
        }
    }
    first_error.map_or(Ok(()), Err)
}
