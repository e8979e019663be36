//! The resources a snapshot asks: each registers a weak reference of itself when made, so that
//! taking part costs nothing while it lives and nothing keeps it alive.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::model::{BlockState, BlockView, MemorySnapshot, ResourceKind, ResourceSnapshot, SegmentView};
use crate::history::{self, ResourceId};
use crate::pool::{MemoryPool, PoolKind};
use crate::resources::caching::{BlockUse, CachingResource};
use crate::resources::{DeviceMemoryResource, ManagedMemoryResource, PinnedMemoryResource};

/// A resource that describes itself in a [`MemorySnapshot`].
pub trait SnapshotSource: Send + Sync {
    /// What it holds now.
    fn snapshot(&self) -> ResourceSnapshot;
}

/// Every source registered and perhaps alive, in the order registered.
static SOURCES: Mutex<Vec<Weak<dyn SnapshotSource>>> = Mutex::new(Vec::new());

/// Makes `resource` part of every [`take_snapshot`] while it lives; only a weak reference is
/// kept (the resources of this crate register themselves when made; another crate's resource
/// registers with this).
pub fn register<T: SnapshotSource + 'static>(resource: &Arc<T>) {
    let source: Weak<dyn SnapshotSource> = Arc::downgrade(resource) as Weak<T>;
    let mut sources = SOURCES.lock().unwrap_or_else(PoisonError::into_inner);
    // The gone are dropped when the list would grow: registering stays amortized O(1).
    if sources.len() == sources.capacity() {
        sources.retain(|source| source.strong_count() > 0);
    }
    sources.push(source);
}

/// A snapshot of every registered resource alive now, and of the recorded history.
pub fn take_snapshot() -> MemorySnapshot {
    let alive: Vec<Arc<dyn SnapshotSource>> =
        SOURCES.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect();
    // Asked outside the registry's lock: a source may take locks of its own, or allocate.
    let resources = alive.iter().map(|source| source.snapshot()).collect();
    let taken_at_ns = u64::try_from(history::now().as_nanos()).unwrap_or(u64::MAX);
    MemorySnapshot::new(resources, &history::history(), taken_at_ns)
}

/// A resource `id` that allocates from the driver pool `pool`: the pool's kind, handle, device
/// and figures (what a pool resource of another crate describes itself with: change the kind
/// and name to suit).
pub fn pool_snapshot(id: ResourceId, pool: &MemoryPool) -> ResourceSnapshot {
    let kind = match pool.kind() {
        PoolKind::Device(_) => ResourceKind::DevicePool,
        PoolKind::Pinned => ResourceKind::PinnedPool,
        PoolKind::Managed => ResourceKind::ManagedPool,
    };
    let mut snapshot = ResourceSnapshot::new(id, kind, format!("pool {:#x}", pool.handle() as usize));
    snapshot.device = pool.kind().device().map(|device| device.raw());
    snapshot.pool = Some(pool.handle() as usize as u64);
    // A pool whose figures cannot be read (its device lost, say) is listed with zeros.
    if let Ok(usage) = pool.usage() {
        snapshot.reserved_bytes = usage.reserved_bytes;
        snapshot.used_bytes = usage.used_bytes;
        snapshot.reserved_peak = usage.reserved_bytes_high;
        snapshot.used_peak = usage.used_bytes_high;
        snapshot.live_allocations = usage.live_allocations;
    }
    snapshot
}

impl SnapshotSource for DeviceMemoryResource {
    fn snapshot(&self) -> ResourceSnapshot {
        pool_snapshot(ResourceId::of(self), self.pool())
    }
}

impl SnapshotSource for PinnedMemoryResource {
    fn snapshot(&self) -> ResourceSnapshot {
        pool_snapshot(ResourceId::of(self), self.pool())
    }
}

impl SnapshotSource for ManagedMemoryResource {
    fn snapshot(&self) -> ResourceSnapshot {
        pool_snapshot(ResourceId::of(self), self.pool())
    }
}

impl SnapshotSource for CachingResource {
    fn snapshot(&self) -> ResourceSnapshot {
        let upstream = &**self.inner();
        let name = format!("caching over {}", std::any::type_name_of_val(upstream).rsplit("::").next().unwrap_or(""));
        let mut snapshot = ResourceSnapshot::new(ResourceId::of(self), ResourceKind::Caching, name);
        snapshot.device = crate::MemoryResource::device(self).map(|device| device.raw());
        snapshot.upstream = Some(ResourceId::of(upstream).0);
        let all = self.statistics().all;
        snapshot.reserved_bytes = all.reserved_bytes.current;
        snapshot.used_bytes = all.allocated_bytes.current;
        snapshot.reserved_peak = all.reserved_bytes.peak;
        snapshot.used_peak = all.allocated_bytes.peak;
        snapshot.live_allocations = all.allocations.current;
        snapshot.segments = self
            .snapshot()
            .into_iter()
            .map(|segment| SegmentView {
                address: segment.address,
                size: segment.size as u64,
                reserved: segment.expandable_reservation.map(|bytes| bytes as u64),
                stream: segment.stream.handle() as usize as u64,
                blocks: segment
                    .blocks
                    .iter()
                    .map(|block| {
                        let state = match block.state {
                            BlockUse::Allocated { requested } => BlockState::Allocated { requested: requested as u64 },
                            BlockUse::Free => BlockState::Free,
                            BlockUse::Pending => BlockState::Pending,
                        };
                        BlockView::new(block.address, block.size as u64, state)
                    })
                    .collect(),
            })
            .collect();
        snapshot
    }
}
