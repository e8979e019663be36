//! Case (10): elastic memory. A group of 256 MiB buffers, 1, 4 and 16 GiB in all (as the
//! device's free memory allows; on the simulator, whose device memory is this machine's, 256
//! MiB and 1 GiB): its offload (`sleep(Release::Offload)`) and restore (`wake`, synchronized)
//! against the pinned host↔device copies of the same buffers in the same run, its staging pool
//! kept between rounds (a release threshold of `u64::MAX`); a discard and the wake after it per
//! GiB, with their VMM driver calls counted on the simulator; each step also against the same
//! driver calls made by hand ([`RawGroup`]), in the same rounds. And an on-demand range of 2 MiB
//! pages: the time to map one more page against how many are mapped, and the memory unmapping
//! all of them gives back to the device.

use std::time::Instant;

use cuda_mem_core::{Buffer, Device, PinnedMemoryResource, Stream, StreamOptions};
use cuda_mem_vmm::{Discarded, ElasticBuffer, ElasticGroup, OnDemandRange, Release, VirtualMemoryResource};
use serde_json::{Value, json};

use crate::Error;
use crate::call_count::{Calls, arm, probe};
use crate::elastic_raw::RawGroup;
use crate::stats::{Stats, elapsed_ns, rounded};
use crate::units::MIB;

/// The bytes of each buffer of a group.
pub(crate) const ELASTIC_BUFFER: usize = 256 * MIB;
/// The page of the on-demand range.
pub(crate) const ON_DEMAND_PAGE: usize = 2 * MIB;
/// Rounds of each timing.
const ROUNDS: usize = 3;

/// One group size.
pub(crate) struct ElasticRow {
    /// The group's bytes.
    pub(crate) bytes: usize,
    /// Its buffers.
    pub(crate) buffers: usize,
    /// Device → pinned host copies of every buffer, synchronized.
    pub(crate) to_host: Stats,
    /// Pinned host → device copies of every buffer, synchronized.
    pub(crate) to_device: Stats,
    /// `sleep(Release::Offload)`.
    pub(crate) offload: Stats,
    /// `wake` after it, synchronized.
    pub(crate) restore: Stats,
    /// `sleep(Release::Discard)`.
    pub(crate) discard: Stats,
    /// `wake` after it, synchronized.
    pub(crate) wake: Stats,
    /// The same four steps by hand through cuda-mem-sys ([`RawGroup`]): offload, restore,
    /// discard, wake.
    pub(crate) raw: [Stats; 4],
    /// The VMM driver calls of a discard and of the wake after it (the simulator only).
    pub(crate) calls: Option<(u32, u32)>,
}

impl ElasticRow {
    /// The offload's share of the copy bandwidth (the copy's time over the offload's).
    pub(crate) fn offload_share(&self) -> f64 {
        self.to_host.median / self.offload.median
    }

    /// The restore's share of the copy bandwidth.
    pub(crate) fn restore_share(&self) -> f64 {
        self.to_device.median / self.restore.median
    }

    /// Each step's time over its raw sequence's: offload, restore, discard, wake.
    pub(crate) fn against_raw(&self) -> [f64; 4] {
        let ours = [&self.offload, &self.restore, &self.discard, &self.wake];
        std::array::from_fn(|i| ours[i].median / self.raw[i].median)
    }

    /// As a JSON object (a row of `results.json`'s `elastic`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "bytes": self.bytes,
            "buffers": self.buffers,
            "to_host": self.to_host.json(),
            "to_device": self.to_device.json(),
            "offload": self.offload.json(),
            "restore": self.restore.json(),
            "offload_share_of_copy": rounded(self.offload_share(), 3),
            "restore_share_of_copy": rounded(self.restore_share(), 3),
            "discard": self.discard.json(),
            "wake": self.wake.json(),
            "raw_offload": self.raw[0].json(),
            "raw_restore": self.raw[1].json(),
            "raw_discard": self.raw[2].json(),
            "raw_wake": self.raw[3].json(),
            "against_raw": self.against_raw().map(|r| rounded(r, 3)),
            "vmm_calls_discard": self.calls.map(|c| c.0),
            "vmm_calls_wake": self.calls.map(|c| c.1),
        })
    }
}

/// The on-demand range's figures.
pub(crate) struct OnDemandRow {
    /// Per mapped count: the time to map one more page.
    pub(crate) per_page: Vec<(usize, Stats)>,
    /// Bytes mapped before unmapping everything, and the device's free memory that unmapping
    /// gave back.
    pub(crate) mapped: usize,
    /// See `mapped`.
    pub(crate) returned: usize,
}

impl OnDemandRow {
    /// As a JSON object (`results.json`'s `on_demand`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "page": ON_DEMAND_PAGE,
            "map_one_more": self.per_page.iter().map(|(n, s)| json!({"mapped_pages": n, "time": s.json()})).collect::<Vec<_>>(),
            "mapped": self.mapped,
            "returned": self.returned,
        })
    }
}

/// The group sizes this device has room for: twice the size (the group, and room to spare)
/// within its free memory.
fn sizes(device: Device, simulator: bool) -> Result<Vec<usize>, Error> {
    let free = device.memory_info()?.free;
    let wanted: &[usize] = if simulator { &[256 * MIB, 1 << 30] } else { &[1 << 30, 4 << 30, 16 << 30] };
    Ok(wanted.iter().copied().filter(|&size| 2 * size <= free).collect())
}

/// Case (10).
pub(crate) fn elastic(device: Device, simulator: bool) -> Result<(Vec<ElasticRow>, OnDemandRow), Error> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let resource = VirtualMemoryResource::new(device, Default::default())?;
    let staging = PinnedMemoryResource::new(Default::default())?;
    staging.pool().set_release_threshold(u64::MAX)?;
    let mut rows = Vec::new();
    for bytes in sizes(device, simulator)? {
        rows.push(group_row(&resource, &staging, bytes, simulator, &stream)?);
    }
    let on_demand = on_demand(&resource, device, &stream)?;
    Ok((rows, on_demand))
}

/// Case (10) for a group of `bytes`.
fn group_row(
    resource: &std::sync::Arc<VirtualMemoryResource>,
    staging: &std::sync::Arc<PinnedMemoryResource>,
    bytes: usize,
    simulator: bool,
    stream: &Stream,
) -> Result<ElasticRow, Error> {
    let group = ElasticGroup::with_staging(resource, "bench", staging.clone());
    let count = bytes / ELASTIC_BUFFER;
    let mut buffers: Vec<ElasticBuffer> =
        (0..count).map(|_| group.allocate(ELASTIC_BUFFER, stream)).collect::<Result<_, _>>()?;
    for buffer in &mut buffers {
        buffer.access_mut()?.fill(cuda_mem_core::FillPattern::U8(1), stream)?;
    }
    // The plain copies, through pinned buffers of the staging pool.
    let mut hosts: Vec<Buffer> =
        (0..count).map(|_| staging.allocate(ELASTIC_BUFFER, stream)).collect::<Result<_, _>>()?;
    let (mut to_host, mut to_device) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for (buffer, host) in buffers.iter().zip(&mut hosts) {
            buffer.access()?.copy_to(host, stream)?;
        }
        stream.synchronize()?;
        to_host.push(elapsed_ns(start));
        let start = Instant::now();
        for (buffer, host) in buffers.iter_mut().zip(&hosts) {
            buffer.access_mut()?.copy_from(host, stream)?;
        }
        stream.synchronize()?;
        to_device.push(elapsed_ns(start));
    }
    drop(hosts);
    let (mut offload, mut restore, mut discard, mut wake) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut raw_group = RawGroup::new(resource.device(), count, ELASTIC_BUFFER)?;
    let mut raw: [Vec<f64>; 4] = Default::default();
    // One round of each first, so that the staging pool holds the memory (pinning it is not
    // the copy).
    group.sleep(Release::Offload, stream)?;
    group.wake(Discarded::Unspecified, stream)?;
    raw_group.offload(staging, stream)?;
    raw_group.restore(stream)?;
    stream.synchronize()?;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        group.sleep(Release::Offload, stream)?;
        offload.push(elapsed_ns(start));
        let start = Instant::now();
        group.wake(Discarded::Unspecified, stream)?;
        stream.synchronize()?;
        restore.push(elapsed_ns(start));
        let start = Instant::now();
        group.sleep(Release::Discard, stream)?;
        discard.push(elapsed_ns(start));
        let start = Instant::now();
        group.wake(Discarded::Unspecified, stream)?;
        stream.synchronize()?;
        wake.push(elapsed_ns(start));
        raw[0].push(raw_group.timed(|g| g.offload(staging, stream))?);
        raw[1].push(raw_group.timed(|g| g.restore(stream))?);
        raw[2].push(raw_group.timed(|g| g.unmap_all(stream))?);
        raw[3].push(raw_group.timed(|g| {
            g.map_all()?;
            stream.synchronize().map_err(Error::from)
        })?);
    }
    drop(raw_group);
    let calls = if simulator { Some(vmm_calls(&group, stream)?) } else { None };
    let row = ElasticRow {
        bytes,
        buffers: count,
        to_host: Stats::of(to_host),
        to_device: Stats::of(to_device),
        offload: Stats::of(offload),
        restore: Stats::of(restore),
        discard: Stats::of(discard),
        wake: Stats::of(wake),
        raw: raw.map(Stats::of),
        calls,
    };
    let against = row.against_raw();
    println!(
        "  {} MiB in {} buffers: offload {} ({:.2} of the copy's bandwidth), restore {} ({:.2}); discard {}, wake {}{}; \
         against the raw calls: {:.2}, {:.2}, {:.2}, {:.2}",
        bytes / MIB,
        count,
        row.offload.show(),
        row.offload_share(),
        row.restore.show(),
        row.restore_share(),
        row.discard.show(),
        row.wake.show(),
        calls.map_or(String::new(), |(d, w)| format!("; VMM calls: discard {d}, wake {w}")),
        against[0],
        against[1],
        against[2],
        against[3]
    );
    drop(buffers);
    Ok(row)
}

/// The VMM calls of a discard and of the wake after it, counted on the simulator.
fn vmm_calls(group: &ElasticGroup, stream: &Stream) -> Result<(u32, u32), Error> {
    let d = cuda_mem_core::driver()?;
    let vmm = |calls: &Calls| -> u32 {
        calls
            .iter()
            .filter(|(name, _)| {
                ["cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess"].contains(name)
            })
            .map(|(_, n)| n)
            .sum()
    };
    arm(d)?;
    group.sleep(Release::Discard, stream)?;
    let discard = vmm(&probe(d, stream)?);
    arm(d)?;
    group.wake(Discarded::Unspecified, stream)?;
    let wake = vmm(&probe(d, stream)?);
    Ok((discard, wake))
}

/// The on-demand range: the time to map one more page at 1, 64 and 512 pages mapped (from 0,
/// one page at a time; each measured alone), then all unmapped.
fn on_demand(
    resource: &std::sync::Arc<VirtualMemoryResource>,
    device: Device,
    stream: &Stream,
) -> Result<OnDemandRow, Error> {
    const AT: [usize; 3] = [1, 64, 512];
    let range = OnDemandRange::new(resource, 64 << 30, ON_DEMAND_PAGE, stream)?;
    let mut per_page = Vec::new();
    let mut mapped = 0;
    for at in AT {
        while mapped < at {
            range.map(mapped..mapped + 1)?;
            mapped += 1;
        }
        let mut times = Vec::new();
        for _ in 0..9 {
            let start = Instant::now();
            range.map(mapped..mapped + 1)?;
            times.push(elapsed_ns(start));
            range.unmap(mapped..mapped + 1, stream)?;
        }
        per_page.push((at, Stats::of(times)));
    }
    let free = device.memory_info()?.free;
    let mapped_bytes = range.statistics().mapped_bytes;
    range.unmap(0..range.page_count(), stream)?;
    let returned = device.memory_info()?.free - free;
    let row = OnDemandRow { per_page, mapped: mapped_bytes, returned };
    println!(
        "  on-demand pages of {} MiB: one more page at {} mapped; {} MiB unmapped gave {} MiB back",
        ON_DEMAND_PAGE / MIB,
        row.per_page.iter().map(|(n, s)| format!("{n}: {}", s.show())).collect::<Vec<_>>().join(", "),
        row.mapped / MIB,
        row.returned / MIB
    );
    Ok(row)
}
