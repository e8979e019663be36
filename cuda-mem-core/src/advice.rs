//! [`Advice`]: what managed memory can be advised (`CUmem_advise`), and the locations each
//! piece of advice takes. A word of the vocabulary the managed-memory operations and their
//! errors share.

use cuda_mem_sys::types::CUmem_advise;

use crate::location::Location;

/// A piece of advice about how managed memory is used (`CUmem_advise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// Mostly read: reads create read-only copies where they happen.
    SetReadMostly,
    /// Undoes [`SetReadMostly`](Advice::SetReadMostly).
    UnsetReadMostly,
    /// Prefer to keep the memory at a location.
    SetPreferredLocation,
    /// Drop the preferred location.
    UnsetPreferredLocation,
    /// Keep the memory mapped for a processor.
    SetAccessedBy,
    /// Undoes [`SetAccessedBy`](Advice::SetAccessedBy) for a processor.
    UnsetAccessedBy,
}

impl Advice {
    /// Whether the advice takes `location` (cuda.core's table): the read-mostly advice and
    /// [`UnsetPreferredLocation`](Advice::UnsetPreferredLocation) take a device, the host or a
    /// host NUMA node (the driver ignores it); [`SetPreferredLocation`](Advice::SetPreferredLocation)
    /// takes every location; the accessed-by advice takes a device or the host (a processor).
    pub fn accepts(self, location: Location) -> bool {
        match self {
            Advice::SetReadMostly | Advice::UnsetReadMostly | Advice::UnsetPreferredLocation => {
                !matches!(location, Location::HostNumaCurrent)
            }
            Advice::SetPreferredLocation => true,
            Advice::SetAccessedBy | Advice::UnsetAccessedBy => {
                matches!(location, Location::Device(_) | Location::Host)
            }
        }
    }

    /// Whether the driver reads the location given with the advice (it ignores it for the
    /// read-mostly advice and for unsetting the preferred location).
    pub(crate) fn uses_location(self) -> bool {
        matches!(self, Advice::SetPreferredLocation | Advice::SetAccessedBy | Advice::UnsetAccessedBy)
    }

    /// What [`accepts`](Advice::accepts) accepts, in words.
    pub(crate) fn accepted(self) -> &'static str {
        match self {
            Advice::SetReadMostly | Advice::UnsetReadMostly | Advice::UnsetPreferredLocation => {
                "a device, the host or a host NUMA node"
            }
            Advice::SetPreferredLocation => "any location",
            Advice::SetAccessedBy | Advice::UnsetAccessedBy => "a device or the host",
        }
    }

    /// The driver's value.
    pub(crate) fn raw(self) -> CUmem_advise {
        use CUmem_advise as A;
        match self {
            Advice::SetReadMostly => A::CU_MEM_ADVISE_SET_READ_MOSTLY,
            Advice::UnsetReadMostly => A::CU_MEM_ADVISE_UNSET_READ_MOSTLY,
            Advice::SetPreferredLocation => A::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            Advice::UnsetPreferredLocation => A::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
            Advice::SetAccessedBy => A::CU_MEM_ADVISE_SET_ACCESSED_BY,
            Advice::UnsetAccessedBy => A::CU_MEM_ADVISE_UNSET_ACCESSED_BY,
        }
    }
}
