//! [`ViewError`]: why a typed view of a buffer's bytes was refused.

use crate::device::DevicePtr;

/// A typed view refused before anything was read or written (inside
/// [`Error::View`](crate::Error::View)): its bytes are not a whole number of elements, its
/// address is not aligned for them, or a sub-range lies outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// A typed view of bytes that are not a whole number of its elements.
    #[error(
        "invalid argument: {size} bytes are not a whole number of `{element}` ({element_size} bytes each): view \
         them as a smaller type, or view a buffer (or sub-range) whose size is a multiple of {element_size}"
    )]
    Size {
        /// The element type's name.
        element: &'static str,
        /// Its size in bytes.
        element_size: usize,
        /// The size of the bytes viewed.
        size: usize,
    },
    /// A typed view of memory whose address is not aligned for its elements.
    #[error(
        "invalid argument: address {ptr:#x} is not aligned for `{element}` (which needs {align}-byte alignment): \
         view it as a type of smaller alignment, or copy it into an aligned buffer"
    )]
    Alignment {
        /// The element type's name.
        element: &'static str,
        /// Its alignment in bytes.
        align: usize,
        /// The address.
        ptr: DevicePtr,
    },
    /// More elements than an address space holds bytes for (a typed allocation's length).
    #[error("invalid argument: {len} elements of `{element}` take more than usize::MAX bytes: ask for fewer")]
    TooManyElements {
        /// The element type's name.
        element: &'static str,
        /// The number of elements asked for.
        len: usize,
    },
    /// A sub-range of a view that does not lie within it (in elements).
    #[error("out of range: elements {start}..{end} of a view of {len} elements: slice within 0..{len}")]
    SliceOutOfRange {
        /// The first element asked for (`usize::MAX` when the bound overflowed).
        start: usize,
        /// One past the last element asked for (`usize::MAX` when the bound overflowed).
        end: usize,
        /// The view's length.
        len: usize,
    },
}
