//! Elastic memory in memory snapshots (`cuda_mem_core::snapshot`): a group's buffers and an
//! on-demand range's reservation, each a segment whose mapped bytes are its blocks (none while
//! released), so that memory given back shows as such.

use cuda_mem_core::history::ResourceId;
use cuda_mem_core::snapshot::{BlockState, BlockView, ResourceKind, ResourceSnapshot, SegmentView, SnapshotSource};

use super::backing::Backing;
use super::group::ElasticGroup;
use super::on_demand::OnDemandRange;

/// A backing as a segment: its reservation, and a block per run of mapped chunks (free blocks
/// are not drawn for unmapped addresses: they hold no memory).
fn segment(backing: &Backing) -> SegmentView {
    let chunk = backing.chunk_size() as u64;
    let mut segment = SegmentView::new(backing.ptr(), backing.mapped_bytes() as u64);
    segment.reserved = Some(backing.size() as u64);
    for index in (0..backing.chunks.len()).filter(|&index| backing.is_mapped(index)) {
        let address = backing.ptr() + index as u64 * chunk;
        match segment.blocks.last_mut() {
            Some(run) if run.address + run.size == address => {
                run.size += chunk;
                run.state = BlockState::Allocated { requested: run.size };
            }
            _ => segment.blocks.push(BlockView::new(address, chunk, BlockState::Allocated { requested: chunk })),
        }
    }
    segment
}

impl SnapshotSource for ElasticGroup {
    fn snapshot(&self) -> ResourceSnapshot {
        let state = match self.asleep() {
            None => "awake".to_string(),
            Some(release) => format!("asleep ({release:?})").to_lowercase(),
        };
        let name = format!("elastic group {:?}, {state}", self.tag());
        let mut snapshot = ResourceSnapshot::new(ResourceId::of(self), ResourceKind::VirtualMemory, name);
        snapshot.device = Some(self.resource().device().raw());
        snapshot.upstream = Some(ResourceId::of(&**self.resource()).0);
        self.each_backing(|backing| {
            let segment = segment(backing);
            snapshot.reserved_bytes += segment.size;
            snapshot.used_bytes += segment.size;
            snapshot.live_allocations += 1;
            snapshot.segments.push(segment);
        });
        snapshot.segments.sort_by_key(|segment| segment.address);
        snapshot.reserved_peak = snapshot.reserved_bytes;
        snapshot.used_peak = snapshot.used_bytes;
        snapshot
    }
}

impl SnapshotSource for OnDemandRange {
    fn snapshot(&self) -> ResourceSnapshot {
        let statistics = self.statistics();
        let name = format!(
            "on-demand range, {} of {} pages of {} KiB mapped",
            statistics.mapped_pages,
            statistics.pages,
            statistics.page_size >> 10
        );
        let mut snapshot = ResourceSnapshot::new(ResourceId::of(self), ResourceKind::VirtualMemory, name);
        snapshot.device = Some(self.resource().device().raw());
        snapshot.upstream = Some(ResourceId::of(&**self.resource()).0);
        let segment = self.with_backing(segment);
        snapshot.reserved_bytes = segment.size;
        snapshot.used_bytes = segment.size;
        snapshot.reserved_peak = statistics.peak_mapped_bytes as u64;
        snapshot.used_peak = statistics.peak_mapped_bytes as u64;
        snapshot.live_allocations = segment.blocks.len() as u64;
        snapshot.segments.push(segment);
        snapshot
    }
}
