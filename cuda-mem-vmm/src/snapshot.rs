//! `VirtualMemoryResource` in memory snapshots (`cuda_mem_core::snapshot`): each live buffer's
//! range and each expandable range, as a segment.

use cuda_mem_core::history::ResourceId;
use cuda_mem_core::snapshot::{BlockState, BlockView, ResourceKind, ResourceSnapshot, SegmentView, SnapshotSource};

use crate::resource::VirtualMemoryResource;

impl SnapshotSource for VirtualMemoryResource {
    fn snapshot(&self) -> ResourceSnapshot {
        let name = format!("virtual memory, granularity {} KiB", self.granularity() >> 10);
        let mut snapshot = ResourceSnapshot::new(ResourceId::of(self), ResourceKind::VirtualMemory, name);
        snapshot.device = Some(self.device().raw());
        let mut buffers = self.live.views();
        buffers.sort_unstable();
        // Buffers of one range (a buffer and its growths) share its first bytes: the largest
        // of them stands for the range.
        buffers.dedup_by(|later, earlier| {
            later.0 == earlier.0 && {
                earlier.1 = earlier.1.max(later.1);
                earlier.2 = earlier.2.max(later.2);
                true
            }
        });
        for (ptr, size, mapped) in buffers {
            let mut segment = SegmentView::new(ptr, mapped as u64);
            segment.blocks.push(BlockView::new(ptr, size as u64, BlockState::Allocated { requested: size as u64 }));
            if mapped > size {
                segment.blocks.push(BlockView::new(ptr + size as u64, (mapped - size) as u64, BlockState::Free));
            }
            snapshot.used_bytes += size as u64;
            snapshot.reserved_bytes += mapped as u64;
            snapshot.live_allocations += 1;
            snapshot.segments.push(segment);
        }
        for (base, mapped, reserved) in self.expandable.views() {
            let mut segment = SegmentView::new(base, mapped as u64);
            segment.reserved = Some(reserved as u64);
            if mapped > 0 {
                // What uses it (a caching resource) shows its blocks; here it is one range in use.
                segment.blocks.push(BlockView::new(
                    base,
                    mapped as u64,
                    BlockState::Allocated { requested: mapped as u64 },
                ));
            }
            snapshot.used_bytes += mapped as u64;
            snapshot.reserved_bytes += mapped as u64;
            snapshot.segments.push(segment);
        }
        snapshot.segments.sort_by_key(|segment| segment.address);
        snapshot.reserved_peak = snapshot.reserved_bytes;
        snapshot.used_peak = snapshot.used_bytes;
        snapshot
    }
}
