//! Which driver each capability needs: [`DriverCapability`] and its table (the check made
//! before using one, against the installed driver, is in `driver`).
//!
//! The table is `driver_versions.md` (in the crate documentation and the README); the versions
//! here are the same, and a test keeps them so.

/// A capability that needs a newer driver than the crates load with (see the crate
/// documentation's "Driver versions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DriverCapability {
    /// Stream-ordered memory pools (`cuMemPoolCreate`, CUDA 11.2).
    MemoryPools,
    /// Graph memory (`cuDeviceGraphMemTrim` and the graph-memory attributes, CUDA 11.4).
    GraphMemory,
    /// Managed memory's advice and single prefetches naming a host NUMA node, which only the
    /// `CUmemLocation` forms can (`cuMemAdvise_v2`, `cuMemPrefetchAsync_v2`, CUDA 12.2); for
    /// devices and the host, older drivers get CUDA 8.0's `cuMemAdvise` and `cuMemPrefetchAsync`.
    ManagedLocations,
    /// Exporting and importing memory as fabric handles (`CU_MEM_HANDLE_TYPE_FABRIC`, CUDA 12.3).
    FabricHandles,
    /// Pools of pinned host memory (CUDA 12.6).
    PinnedPools,
    /// Pools of managed memory (CUDA 13.0).
    ManagedPools,
    /// A location's current pool (`cuMemGetMemPool`, CUDA 13.0).
    CurrentPools,
    /// Batched prefetches and discards (`cuMemPrefetchBatchAsync`, `cuMemDiscardBatchAsync`,
    /// CUDA 13.0).
    BatchPrefetchDiscard,
    /// Batched copies that read their source during the call
    /// ([`SourceAccessOrder::DuringApiCall`](crate::SourceAccessOrder::DuringApiCall):
    /// `cuMemcpyBatchAsync_v2`, CUDA 13.0); other orders fall back to plain copies.
    CopyBatches,
    /// Single copies that read their source during the call
    /// ([`SourceAccessOrder::DuringApiCall`](crate::SourceAccessOrder::DuringApiCall):
    /// `cuMemcpyWithAttributesAsync`, CUDA 13.2); other orders fall back to plain copies.
    CopiesWithAttributes,
}

impl DriverCapability {
    /// Every capability, oldest first.
    pub const ALL: [DriverCapability; 10] = [
        DriverCapability::MemoryPools,
        DriverCapability::GraphMemory,
        DriverCapability::ManagedLocations,
        DriverCapability::FabricHandles,
        DriverCapability::PinnedPools,
        DriverCapability::ManagedPools,
        DriverCapability::CurrentPools,
        DriverCapability::BatchPrefetchDiscard,
        DriverCapability::CopyBatches,
        DriverCapability::CopiesWithAttributes,
    ];

    /// The CUDA version it needs, as `cuDriverGetVersion` encodes it (`12060` for 12.6).
    pub const fn needs(self) -> u32 {
        match self {
            DriverCapability::MemoryPools => 11020,
            DriverCapability::GraphMemory => 11040,
            DriverCapability::ManagedLocations => 12020,
            DriverCapability::FabricHandles => 12030,
            DriverCapability::PinnedPools => 12060,
            DriverCapability::ManagedPools
            | DriverCapability::CurrentPools
            | DriverCapability::BatchPrefetchDiscard
            | DriverCapability::CopyBatches => 13000,
            DriverCapability::CopiesWithAttributes => cuda_mem_sys::MEMCPY_WITH_ATTRIBUTES_VERSION,
        }
    }

    /// What it is, in the words of the version table.
    pub const fn describe(self) -> &'static str {
        match self {
            DriverCapability::MemoryPools => "stream-ordered pools",
            DriverCapability::GraphMemory => "graph memory",
            DriverCapability::ManagedLocations => "managed memory's advice and single prefetches to host NUMA nodes",
            DriverCapability::PinnedPools => "pinned (host) pools",
            DriverCapability::ManagedPools => "managed pools",
            DriverCapability::CurrentPools => "current pinned and managed pools",
            DriverCapability::BatchPrefetchDiscard => "batched prefetches and discards",
            DriverCapability::FabricHandles => "fabric handles",
            DriverCapability::CopyBatches => "batched copies reading their source during the call",
            DriverCapability::CopiesWithAttributes => "single copies reading their source during the call",
        }
    }

    /// What else to do than updating the driver, where something is (said after "update the
    /// driver" in [`Error::DriverTooOld`]); empty otherwise.
    pub(crate) const fn alternative(self) -> &'static str {
        match self {
            DriverCapability::CopyBatches | DriverCapability::CopiesWithAttributes => {
                ", or use SourceAccessOrder::Stream or Any, which fall back to plain copies"
            }
            _ => "",
        }
    }
}

impl std::fmt::Display for DriverCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// A version as `cuDriverGetVersion` encodes it, written `major.minor` (`12080` → `12.8`).
pub(crate) fn dotted(version: u32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = include_str!("driver_versions.md");

    #[test]
    fn versions_are_written_as_cuda_names_them() {
        assert_eq!(dotted(12080), "12.8");
        assert_eq!(dotted(11020), "11.2");
        assert_eq!(dotted(13000), "13.0");
    }

    #[test]
    fn the_table_gives_each_capability_its_version() {
        for capability in DriverCapability::ALL {
            let version = capability.needs();
            let row = TABLE
                .lines()
                .find(|line| line.starts_with(&format!("| {}", capability.describe())))
                .unwrap_or_else(|| panic!("no row for {capability:?} in driver_versions.md"));
            let cell = format!("| {} (`{version}`) |", dotted(version));
            assert!(row.contains(&cell), "{capability:?}: the row says {row:?}, the code {cell:?}");
        }
    }
}
