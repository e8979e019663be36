//! [`Location`]: where memory lives, or where it is advised, accessed or prefetched to: a
//! device, or the host (any node, one NUMA node, the calling thread's node). The driver's
//! `CUmemLocation` as a Rust enum, shared by the pools, managed memory and the other memory
//! crates.

use cuda_mem_sys::types::{CUmemLocation, CUmemLocationType};

use crate::device::{Device, NumaNode};
use crate::error::Result;

/// Where memory lives (cuda.core's `Device(n)`, `Host()`, `Host(numa_id=n)` and
/// `Host.numa_current()`).
///
/// Each use takes the locations it can: a pinned pool a host NUMA node, a managed pool's
/// preferred location anything but [`HostNumaCurrent`](Location::HostNumaCurrent), advice the
/// locations [`Advice::accepts`](crate::Advice::accepts) lists. A location a use cannot take is
/// refused before any driver call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[doc(alias = "Host")]
#[non_exhaustive]
pub enum Location {
    /// A device.
    Device(Device),
    /// The host, no NUMA node named.
    Host,
    /// A host NUMA node ([`Device::host_numa_node`] names the one closest to a device).
    HostNuma(NumaNode),
    /// The NUMA node of the CPU the calling thread runs on (resolved by the driver at the
    /// call).
    #[doc(alias = "numa_current")]
    HostNumaCurrent,
}

impl Location {
    /// The driver's form.
    pub fn raw(self) -> CUmemLocation {
        use CUmemLocationType as T;
        let (type_, id) = match self {
            Location::Device(device) => (T::CU_MEM_LOCATION_TYPE_DEVICE, device.raw()),
            Location::Host => (T::CU_MEM_LOCATION_TYPE_HOST, 0),
            Location::HostNuma(node) => (T::CU_MEM_LOCATION_TYPE_HOST_NUMA, node.raw()),
            Location::HostNumaCurrent => (T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0),
        };
        CUmemLocation { type_, id }
    }

    /// The location the driver reported in this process; `None` for no location
    /// (`CU_MEM_LOCATION_TYPE_NONE`, `_INVALID`, a type this crate does not know, or a negative
    /// NUMA id).
    ///
    /// # Errors
    /// [`Error::NoSuchDevice`](crate::Error::NoSuchDevice) for a device ordinal this process
    /// does not see.
    pub fn from_raw(raw: CUmemLocation) -> Result<Option<Location>> {
        use CUmemLocationType as T;
        Ok(match raw.type_ {
            T::CU_MEM_LOCATION_TYPE_DEVICE => {
                Some(Location::Device(Device::new(usize::try_from(raw.id).unwrap_or(usize::MAX))?))
            }
            T::CU_MEM_LOCATION_TYPE_HOST => Some(Location::Host),
            T::CU_MEM_LOCATION_TYPE_HOST_NUMA => u32::try_from(raw.id).ok().map(|id| Location::HostNuma(NumaNode(id))),
            T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Some(Location::HostNumaCurrent),
            _ => None,
        })
    }

    /// Whether the location is host memory (any host location).
    pub fn is_host(self) -> bool {
        !matches!(self, Location::Device(_))
    }
}

impl From<Device> for Location {
    fn from(device: Device) -> Location {
        Location::Device(device)
    }
}

impl From<NumaNode> for Location {
    fn from(node: NumaNode) -> Location {
        Location::HostNuma(node)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Device(device) => write!(f, "{device}"),
            Location::Host => write!(f, "the host"),
            Location::HostNuma(node) => write!(f, "host {node}"),
            Location::HostNumaCurrent => write!(f, "the calling thread's host NUMA node"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_locations_are_their_driver_form() {
        use CUmemLocationType as T;
        let cases = [
            (Location::Host, T::CU_MEM_LOCATION_TYPE_HOST, 0),
            (Location::HostNuma(NumaNode(3)), T::CU_MEM_LOCATION_TYPE_HOST_NUMA, 3),
            (Location::HostNumaCurrent, T::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0),
        ];
        for (location, type_, id) in cases {
            let raw = location.raw();
            assert_eq!((raw.type_, raw.id), (type_, id));
            assert_eq!(Location::from_raw(raw).unwrap(), Some(location));
            assert!(location.is_host());
        }
    }

    #[test]
    fn a_node_beyond_int_is_one_the_driver_refuses() {
        assert_eq!(Location::HostNuma(NumaNode(u32::MAX)).raw().id, i32::MAX);
    }

    #[test]
    fn no_location_and_unknown_types_are_none() {
        use CUmemLocationType as T;
        for type_ in [T::CU_MEM_LOCATION_TYPE_NONE, T::CU_MEM_LOCATION_TYPE_INVALID, CUmemLocationType(77)] {
            assert_eq!(Location::from_raw(CUmemLocation { type_, id: 0 }).unwrap(), None);
        }
        let negative = CUmemLocation { type_: T::CU_MEM_LOCATION_TYPE_HOST_NUMA, id: -1 };
        assert_eq!(Location::from_raw(negative).unwrap(), None);
    }

    #[test]
    fn locations_say_where_they_are() {
        assert_eq!(Location::HostNuma(NumaNode(1)).to_string(), "host NUMA node 1");
        assert_eq!(Location::Host.to_string(), "the host");
    }
}
