//! Shareable handle types: [`HandleType`], one kind of OS handle memory can be exported as, and
//! [`HandleTypes`], a set of them (what a device supports, what a pool is created with).

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use cuda_mem_sys::types::CUmemAllocationHandleType as T;

/// One kind of OS handle a pool or an allocation can be exported as
/// (`CUmemAllocationHandleType`). Memory that cannot be exported has no handle type: options
/// that choose one take an `Option<HandleType>`, and a pool's set of them may be empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HandleType {
    /// A POSIX file descriptor (Linux).
    PosixFd,
    /// A Windows NT handle.
    Win32,
    /// A Windows KMT handle.
    Win32Kmt,
    /// A fabric handle (multi-node NVLink).
    Fabric,
}

impl HandleType {
    /// Every handle type, in the order of their driver codes.
    pub const ALL: [HandleType; 4] = [HandleType::PosixFd, HandleType::Win32, HandleType::Win32Kmt, HandleType::Fabric];

    /// The driver's code for this handle type.
    pub fn raw(self) -> T {
        match self {
            HandleType::PosixFd => T::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            HandleType::Fabric => T::CU_MEM_HANDLE_TYPE_FABRIC,
            HandleType::Win32 => T::CU_MEM_HANDLE_TYPE_WIN32,
            HandleType::Win32Kmt => T::CU_MEM_HANDLE_TYPE_WIN32_KMT,
        }
    }

    /// The handle type of a driver code naming exactly one; `None` for
    /// `CU_MEM_HANDLE_TYPE_NONE`, a combination, or a code `cuda.h` does not define.
    pub fn from_raw(raw: T) -> Option<HandleType> {
        HandleType::ALL.into_iter().find(|t| t.raw() == raw)
    }

    /// This type's bit in a driver bit mask.
    fn bit(self) -> u32 {
        self.raw().0
    }
}

impl fmt::Display for HandleType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandleType::PosixFd => "POSIX file descriptor",
            HandleType::Fabric => "fabric handle",
            HandleType::Win32 => "Windows NT handle",
            HandleType::Win32Kmt => "Windows KMT handle",
        })
    }
}

/// A set of [`HandleType`]s, as the driver's bit mask of `CUmemAllocationHandleType` codes: the
/// handle types a device supports for pools
/// ([`DeviceProperties::mempool_supported_handle_types`](crate::DeviceProperties)), or that a
/// pool is created with. Empty by default (not exportable).
///
/// ```
/// use cuda_mem_core::{HandleType, HandleTypes};
///
/// let set = HandleTypes::from(HandleType::PosixFd) | HandleType::Fabric;
/// assert!(set.contains(HandleType::PosixFd));
/// assert!(!set.contains(HandleType::Win32));
/// assert_eq!(set.iter().collect::<Vec<_>>(), [HandleType::PosixFd, HandleType::Fabric]);
/// assert_eq!(HandleTypes::from_raw(set.raw()), set);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HandleTypes(u32);

impl HandleTypes {
    /// The empty set.
    pub const fn empty() -> HandleTypes {
        HandleTypes(0)
    }

    /// The set a driver bit mask names. Bits `cuda.h` does not define are dropped: this crate
    /// cannot name them, so it never relies on them.
    pub fn from_raw(raw: T) -> HandleTypes {
        HandleType::ALL.into_iter().filter(|t| raw.0 & t.bit() != 0).collect()
    }

    /// The driver's bit mask (`CU_MEM_HANDLE_TYPE_NONE` when empty).
    pub fn raw(self) -> T {
        T(self.0)
    }

    /// Whether the set is empty (nothing exportable).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every handle type of `types` (one [`HandleType`] or a set) is in this set.
    pub fn contains(self, types: impl Into<HandleTypes>) -> bool {
        let types = types.into();
        self.0 & types.0 == types.0
    }

    /// Adds `types` (one [`HandleType`] or a set).
    pub fn insert(&mut self, types: impl Into<HandleTypes>) {
        self.0 |= types.into().0;
    }

    /// The handle types in the set, in the order of their driver codes.
    pub fn iter(self) -> impl Iterator<Item = HandleType> {
        HandleType::ALL.into_iter().filter(move |&t| self.contains(t))
    }
}

impl From<HandleType> for HandleTypes {
    fn from(handle_type: HandleType) -> HandleTypes {
        HandleTypes(handle_type.bit())
    }
}

impl From<Option<HandleType>> for HandleTypes {
    /// The set of one handle type, or the empty set for `None` (not exportable).
    fn from(handle_type: Option<HandleType>) -> HandleTypes {
        handle_type.map_or(HandleTypes::empty(), HandleTypes::from)
    }
}

impl FromIterator<HandleType> for HandleTypes {
    fn from_iter<I: IntoIterator<Item = HandleType>>(types: I) -> HandleTypes {
        let mut set = HandleTypes::empty();
        for t in types {
            set.insert(t);
        }
        set
    }
}

impl<I: Into<HandleTypes>> BitOr<I> for HandleTypes {
    type Output = HandleTypes;

    fn bitor(self, other: I) -> HandleTypes {
        HandleTypes(self.0 | other.into().0)
    }
}

impl<I: Into<HandleTypes>> BitOrAssign<I> for HandleTypes {
    fn bitor_assign(&mut self, other: I) {
        self.insert(other);
    }
}

impl fmt::Debug for HandleTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_type_is_its_driver_code() {
        assert_eq!(HandleType::PosixFd.raw(), T::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        assert_eq!(HandleType::Fabric.raw(), T::CU_MEM_HANDLE_TYPE_FABRIC);
        assert_eq!(HandleType::Win32.raw(), T::CU_MEM_HANDLE_TYPE_WIN32);
        assert_eq!(HandleType::Win32Kmt.raw(), T::CU_MEM_HANDLE_TYPE_WIN32_KMT);
        for t in HandleType::ALL {
            assert_eq!(HandleType::from_raw(t.raw()), Some(t));
            assert_eq!(HandleTypes::from(t).raw(), t.raw(), "a set of one is that type's code");
        }
    }

    #[test]
    fn no_type_and_combinations_are_not_one_type() {
        assert_eq!(HandleType::from_raw(T::CU_MEM_HANDLE_TYPE_NONE), None);
        let both = HandleTypes::from(HandleType::PosixFd) | HandleType::Fabric;
        assert_eq!(HandleType::from_raw(both.raw()), None);
        assert_eq!(HandleTypes::from(None), HandleTypes::empty());
        assert_eq!(HandleTypes::empty().raw(), T::CU_MEM_HANDLE_TYPE_NONE);
        assert!(HandleTypes::default().is_empty());
    }

    #[test]
    fn unknown_bits_are_dropped() {
        let raw = T(T::CU_MEM_HANDLE_TYPE_FABRIC.0 | 0x100);
        let set = HandleTypes::from_raw(raw);
        assert_eq!(set, HandleTypes::from(HandleType::Fabric));
        assert_eq!(format!("{set:?}"), "{Fabric}");
    }

    proptest! {
        // Proptest reads its regression files, which Miri's isolation refuses.
        #[cfg_attr(miri, ignore)]
        #[test]
        fn a_set_is_its_members(members in proptest::collection::vec(0..HandleType::ALL.len(), 0..6)) {
            let types: Vec<HandleType> = members.iter().map(|&i| HandleType::ALL[i]).collect();
            let set: HandleTypes = types.iter().copied().collect();
            for t in HandleType::ALL {
                prop_assert_eq!(set.contains(t), types.contains(&t));
            }
            prop_assert_eq!(set.is_empty(), types.is_empty());
            prop_assert_eq!(HandleTypes::from_raw(set.raw()), set);
            prop_assert_eq!(set.iter().collect::<HandleTypes>(), set);
            prop_assert!(set.contains(HandleTypes::empty()));
            prop_assert!((set | HandleType::PosixFd).contains(set));
        }
    }
}
