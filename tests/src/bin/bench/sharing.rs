//! Cases (2) and (4), the parent's side: sharing buffers with `bench --child` in batches, through
//! `IpcChannel` (each repetition new buffers: first sends) and through the two raw driver calls,
//! per buffer on each side; a re-send of buffers already sent, which the child still holds; then
//! the child's registry lookups and duplicate-import cache hits per second.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::sys::types::CUmemPoolPtrExportData;
use cuda_mem_core::{Buffer, Device, DeviceMemoryResource, DeviceMemoryResourceOptions, Stream, StreamOptions};
use serde_json::{Value, json};

use crate::Error;
use crate::child::{Child, RAW_KIND};
use crate::stats::{Stats, elapsed_ns, rounded};
use crate::units::{KIB, ns};

/// The batches: buffers sent at once.
const SHARE_BATCHES: [usize; 3] = [1, 64, 1024];
/// Bytes per shared buffer.
const SHARE_BUFFER: usize = 64 * KIB;

/// One batch size: ns per buffer on each side.
pub(crate) struct ShareRow {
    /// Buffers sent at once.
    pub(crate) batch: usize,
    /// Per buffer: parent side, child side, both (through our layer).
    pub(crate) ours_parent: Stats,
    pub(crate) ours_child: Stats,
    pub(crate) ours: Stats,
    /// The same through the two raw driver calls.
    pub(crate) raw_parent: Stats,
    pub(crate) raw_child: Stats,
    pub(crate) raw: Stats,
}

impl ShareRow {
    /// Our cost per buffer beyond the raw calls (difference of the medians).
    pub(crate) fn overhead(&self) -> f64 {
        self.ours.median - self.raw.median
    }
}

/// A re-send of the largest batch, already sent and still held by the child: ns per buffer on
/// each side, against the raw export+import of the same batch.
pub(crate) struct ResendRow {
    /// Buffers re-sent at once.
    pub(crate) batch: usize,
    /// Per buffer: parent side (send), child side (recv, found in its imports), both.
    pub(crate) parent: Stats,
    pub(crate) child: Stats,
    pub(crate) both: Stats,
    /// Per buffer, both sides, through the two raw driver calls (the batch's [`ShareRow::raw`]).
    pub(crate) raw: Stats,
}

impl ResendRow {
    /// The target: a re-send costs at most this fraction of the raw export+import per buffer.
    pub(crate) const TARGET: f64 = 0.1;

    /// Both sides' median over the raw path's.
    pub(crate) fn ratio(&self) -> f64 {
        self.both.median / self.raw.median
    }

    /// As a JSON object, `results.json`'s `sharing_resend`.
    pub(crate) fn json(&self) -> Value {
        json!({
            "batch": self.batch,
            "per_buffer": {
                "parent": self.parent.json(),
                "child": self.child.json(),
                "both": self.both.json(),
                "raw": self.raw.json(),
            },
            "ratio_to_raw": rounded(self.ratio(), 4),
            "target_ratio": Self::TARGET,
        })
    }
}

/// One operation of case (4) on one thread count.
pub(crate) struct RateRow {
    /// The operation, in words.
    pub(crate) what: &'static str,
    /// The threads doing it at once.
    pub(crate) threads: usize,
    /// Operations per second.
    pub(crate) rate: Stats,
}

/// One path's samples, in nanoseconds per buffer: the parent's side, the child's, and both.
#[derive(Default)]
struct PerBuffer {
    parent: Vec<f64>,
    child: Vec<f64>,
    both: Vec<f64>,
}

impl PerBuffer {
    /// Adds one repetition: each side's time for the whole batch of `batch` buffers.
    fn push(&mut self, parent: f64, child: f64, batch: usize) {
        self.parent.push(parent / batch as f64);
        self.child.push(child / batch as f64);
        self.both.push((parent + child) / batch as f64);
    }
}

/// What cases (2) and (4) found.
pub(crate) struct Sharing {
    /// A row per batch (first sends).
    pub(crate) rows: Vec<ShareRow>,
    /// The re-send of the largest batch (none without batches).
    pub(crate) resend: Option<ResendRow>,
    /// A row per operation and thread count of case (4).
    pub(crate) rates: Vec<RateRow>,
}

/// Cases (2) and (4) with a child on the driver at `driver_path`.
pub(crate) fn sharing(device: Device, driver_path: &Path) -> Result<Sharing, Error> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default().ipc_enabled(true))?;
    pool.pool().set_release_threshold(u64::MAX)?;
    let max = SHARE_BATCHES.iter().copied().max().unwrap_or(1);
    let buffers = allocate(&pool, &stream, max)?;
    stream.synchronize()?;

    let mut child = Child::spawn(driver_path)?;
    child.ipc.send_resource(pool.as_ref())?;
    child.command("resource")?;
    child.reply()?;
    let mut rows = Vec::new();
    for batch in SHARE_BATCHES {
        rows.push(batch_row(&mut child, &pool, &stream, &buffers[..batch])?);
    }
    let resend = resend(&mut child, &buffers, &rows)?;
    let rates = rates(&mut child, &buffers[0])?;
    child.exit()?;
    drop(buffers);
    stream.synchronize()?;
    Ok(Sharing { rows, resend, rates })
}

/// `count` new buffers of [`SHARE_BUFFER`] bytes from `pool`.
fn allocate(pool: &Arc<DeviceMemoryResource>, stream: &Stream, count: usize) -> Result<Vec<Buffer>, Error> {
    Ok((0..count).map(|_| pool.allocate(SHARE_BUFFER, stream)).collect::<Result<Vec<Buffer>, _>>()?)
}

/// One batch of case (2): ours and raw in turn, per buffer on each side, printed.
fn batch_row(
    child: &mut Child,
    pool: &Arc<DeviceMemoryResource>,
    stream: &Stream,
    sent: &[Buffer],
) -> Result<ShareRow, Error> {
    let batch = sent.len();
    let (warmup, reps) = match batch {
        1 => (50, 1000),
        64 => (10, 300),
        _ => (3, 60),
    };
    let (mut ours, mut raw) = (PerBuffer::default(), PerBuffer::default());
    for rep in 0..warmup + reps {
        // Ours: new buffers each time, as a buffer keeps its export once made (the re-send is
        // measured apart).
        let fresh = allocate(pool, stream, batch)?;
        let (parent, child_ns) = send_ours(child, &fresh)?;
        drop(fresh);
        if rep >= warmup {
            ours.push(parent, child_ns, batch);
        }
        let (parent, child_ns) = send_raw(child, sent)?;
        if rep >= warmup {
            raw.push(parent, child_ns, batch);
        }
    }
    let row = ShareRow {
        batch,
        ours_parent: Stats::of(ours.parent),
        ours_child: Stats::of(ours.child),
        ours: Stats::of(ours.both),
        raw_parent: Stats::of(raw.parent),
        raw_child: Stats::of(raw.child),
        raw: Stats::of(raw.both),
    };
    println!(
        "  batch {batch}: ours {} raw {} per buffer, overhead {} (parent {} against {}, child {} against {})",
        row.ours.show(),
        row.raw.show(),
        ns(row.overhead()),
        ns(row.ours_parent.median),
        ns(row.raw_parent.median),
        ns(row.ours_child.median),
        ns(row.raw_child.median)
    );
    Ok(row)
}

/// Sends `buffers` through our layer (export and encode, send) and has the child receive them:
/// the parent's nanoseconds and the child's.
fn send_ours(child: &mut Child, buffers: &[Buffer]) -> Result<(f64, f64), Error> {
    let refs: Vec<&Buffer> = buffers.iter().collect();
    let start = Instant::now();
    child.ipc.send_buffers(&refs)?;
    let parent = elapsed_ns(start);
    child.command(&format!("ours {}", buffers.len()))?;
    Ok((parent, child.reply()?.parse()?))
}

/// Sends `buffers` the raw way (`cuMemPoolExportPointer` per buffer, the 64-byte data sent as
/// plain bytes) and has the child import them: the parent's nanoseconds and the child's.
fn send_raw(child: &mut Child, buffers: &[Buffer]) -> Result<(f64, f64), Error> {
    let d = cuda_mem_core::driver()?;
    let start = Instant::now();
    let mut payload = Vec::with_capacity(buffers.len() * 64);
    for buffer in buffers {
        let mut data = CUmemPoolPtrExportData { reserved: [0; 64] };
        // SAFETY: a valid out-pointer; the buffer is a live allocation of an IPC pool.
        unsafe { cu_call!(d, cuMemPoolExportPointer(&mut data, buffer.ptr())) }?;
        payload.extend_from_slice(&data.reserved);
    }
    child.ipc.channel().send(RAW_KIND, &payload, &[])?;
    let parent = elapsed_ns(start);
    child.command(&format!("raw {}", buffers.len()))?;
    Ok((parent, child.reply()?.parse()?))
}

/// Case (4): `held` sent for the child to hold and import again; its rates, printed.
fn rates(child: &mut Child, held: &Buffer) -> Result<Vec<RateRow>, Error> {
    child.ipc.send_buffers(&[held])?;
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
    Ok(rates)
}

/// A re-send of the largest batch, already sent and still held by the child: per buffer on each
/// side and both, against the raw export+import of the same batch (ratio of the medians).
fn resend(child: &mut Child, buffers: &[Buffer], rows: &[ShareRow]) -> Result<Option<ResendRow>, Error> {
    let Some(raw) = rows.last() else { return Ok(None) };
    let batch = raw.batch.min(buffers.len());
    let refs: Vec<&Buffer> = buffers[..batch].iter().collect();
    child.ipc.send_buffers(&refs)?;
    child.command(&format!("hold {batch}"))?;
    child.reply()?;
    let mut again = PerBuffer::default();
    for rep in 0..3 + 60 {
        let start = Instant::now();
        child.ipc.send_buffers(&refs)?;
        let parent = elapsed_ns(start);
        child.command(&format!("resend {batch}"))?;
        let child_ns: f64 = child.reply()?.parse()?;
        if rep >= 3 {
            again.push(parent, child_ns, batch);
        }
    }
    child.command("release")?;
    child.reply()?;
    let row = ResendRow {
        batch,
        parent: Stats::of(again.parent),
        child: Stats::of(again.child),
        both: Stats::of(again.both),
        raw: raw.raw,
    };
    println!(
        "  re-send of {batch} already-sent buffers: parent {} child {} both {} per buffer; raw {} ({:.3} of raw)",
        row.parent.show(),
        row.child.show(),
        row.both.show(),
        row.raw.show(),
        row.ratio()
    );
    Ok(Some(row))
}
