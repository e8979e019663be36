//! [`DlpackError`]: why a buffer could not be exported as a DLPack tensor, or a tensor imported
//! as a buffer (feature `dlpack`). It reaches callers as [`Error::Dlpack`](crate::Error::Dlpack).

use dlpark::ffi::{DLDataType, DLDataTypeCode};

use crate::device::DevicePtr;

/// What went wrong exporting or importing a DLPack tensor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DlpackError {
    /// A buffer that neither devices nor the host can access (an empty view that knows nothing
    /// of its memory) has no DLPack device.
    #[error(
        "not supported: the buffer ({size} bytes at {ptr:#x}) is neither device- nor host-accessible, so it has no \
         DLPack device"
    )]
    NotAccessible {
        /// The buffer's address.
        ptr: DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// Device memory whose device is unknown (a view made without one) cannot name its DLPack
    /// device id.
    #[error(
        "not supported: the buffer ({size} bytes at {ptr:#x}) is device memory of no known device: make the view \
         with its device (Buffer::from_raw) to export it"
    )]
    UnknownDevice {
        /// The buffer's address.
        ptr: DevicePtr,
        /// Its size in bytes.
        size: usize,
    },
    /// A data type whose elements are not a whole number of bytes (packed sub-byte types, zero
    /// bits or lanes).
    #[error("not supported: DLPack data type {} is not a whole number of bytes per element", describe(*.dtype))]
    UnsupportedDtype {
        /// The data type.
        dtype: DLDataType,
    },
    /// A data type DLPack does not define: an unknown type code, or a width its code does not
    /// take (`dlpack.h` asks a consumer to stop importing when the width is unexpected). It is
    /// neither imported as raw bytes nor exported.
    #[error(
        "not supported: DLPack data type code {} with {} bits and {} lanes is not one DLPack defines (codes 0 to \
         17, each with its widths)", .dtype.code.0, .dtype.bits, .dtype.lanes
    )]
    UnknownDtype {
        /// The data type.
        dtype: DLDataType,
    },
    /// A shape (without strides) whose element count is not the number of elements exported.
    #[error(
        "invalid argument: shape {shape:?} has {elements} elements, the exported range has {len}: give a shape \
         whose dimensions multiply to {len}, or explicit strides"
    )]
    ShapeSize {
        /// The shape given.
        shape: Vec<usize>,
        /// Its element count (`usize::MAX` when the product overflows).
        elements: usize,
        /// The elements exported.
        len: usize,
    },
    /// Strides of another length than the shape.
    #[error("invalid argument: {strides} strides for a shape of {ndim} dimensions: give one stride per dimension")]
    StridesLength {
        /// The shape's dimensions.
        ndim: usize,
        /// The strides given.
        strides: usize,
    },
    /// A shape and strides that reach elements outside the exported range.
    #[error(
        "out of range: shape {shape:?} with strides {strides:?} reaches {span} elements, the exported range has \
         {len}: every element the strides reach must lie in the range"
    )]
    OutOfBounds {
        /// The shape given.
        shape: Vec<usize>,
        /// The strides given (in elements).
        strides: Vec<isize>,
        /// How many elements lie between the first and the last element reached, both included
        /// (`usize::MAX` when more).
        span: usize,
        /// The elements exported.
        len: usize,
    },
    /// A shape with more dimensions, or a dimension larger, than DLPack's integers hold.
    #[error(
        "invalid argument: shape {shape:?} does not fit DLPack's dimensions (at most i32::MAX of at most i64::MAX)"
    )]
    ShapeTooLarge {
        /// The shape given.
        shape: Vec<usize>,
    },
    /// A typed view exported with a share of another buffer than the one it views.
    #[error(
        "invalid argument: the view is not of the buffer given to keep it alive: pass the Arc of the buffer the \
         view was made from"
    )]
    NotTheViewsBuffer,
    /// dlpark could not build the tensor's metadata.
    #[error("building the DLPack tensor: {0}")]
    Metadata(#[source] dlpark::metadata::Error),
    /// A tensor of a DLPack major version this crate does not read (it was released, as
    /// DLPack requires).
    #[error("not supported: DLPack major version {major}; this crate reads version {supported}.x tensors")]
    UnsupportedVersion {
        /// The tensor's major version.
        major: u32,
        /// The major version this crate reads.
        supported: u32,
    },
    /// A tensor of memory that is not CUDA device, CUDA pinned host or CUDA managed memory.
    #[error(
        "not supported: DLPack device type {device_type} (id {device_id}): only CUDA (2), CUDA host (3) and CUDA \
         managed (13) memory is imported"
    )]
    UnsupportedDevice {
        /// The tensor's `DLDeviceType`.
        device_type: u32,
        /// The tensor's device id.
        device_id: i32,
    },
    /// A tensor of a CUDA device this process does not see.
    #[error("CUDA device {device_id} of the DLPack tensor is not visible to this process ({count} device(s))")]
    DeviceNotVisible {
        /// The tensor's device id.
        device_id: i32,
        /// How many devices this process sees.
        count: usize,
    },
    /// A tensor with elements but no data pointer.
    #[error("invalid DLPack tensor: {bytes} bytes of elements at a null data pointer")]
    NullData {
        /// The size its shape and data type give.
        bytes: usize,
    },
    /// A device or managed tensor whose bytes lie in no allocation the driver knows
    /// (`cuMemGetAddressRange`): its data pointer and byte offset point at memory that is not
    /// allocated (or not mapped).
    #[error(
        "invalid DLPack tensor: its {size} bytes at {ptr:#x} lie in no allocation the driver knows: the data \
         pointer and byte_offset must point into the producer's memory"
    )]
    NotAllocated {
        /// The address of the lowest byte the tensor reaches (data pointer + byte offset +
        /// the lowest element's offset).
        ptr: DevicePtr,
        /// The bytes from there to the end of the highest element.
        size: usize,
    },
    /// A tensor whose bytes run past the allocation they start in, into unmapped memory or
    /// another allocation (memory mapped through the VMM API counts the mappings that follow
    /// it without a gap as one).
    #[error(
        "invalid DLPack tensor: its bytes {ptr:#x}..{:#x} run past the allocation {base:#x}..{:#x} they start in: \
         every element must lie inside the producer's allocation",
        u128::from(*.ptr) + *.size as u128, u128::from(*.base) + *.allocation as u128
    )]
    OutsideAllocation {
        /// The address of the lowest byte the tensor reaches.
        ptr: DevicePtr,
        /// The bytes from there to the end of the highest element.
        size: usize,
        /// Where the allocation the tensor starts in begins.
        base: DevicePtr,
        /// Its size in bytes (with the mappings that follow it, for memory mapped through the
        /// VMM API).
        allocation: usize,
    },
    /// A null tensor pointer.
    #[error("invalid argument: a null DLPack tensor pointer")]
    NullTensor,
    /// A tensor whose metadata is inconsistent (negative dimensions or rank, a null shape,
    /// element counts, sizes or addresses that overflow: a shape whose product, or a data
    /// pointer and byte offset whose sum with the elements' extent, does not fit).
    #[error("invalid DLPack tensor: {0}")]
    Malformed(#[source] dlpark::tensor::Error),
    /// A contiguous view asked of a tensor that is not compact row-major.
    #[error(
        "not contiguous: shape {shape:?} with strides {strides:?} is not compact row-major, which a typed view \
         needs: read it through buffer(), which covers every element the strides reach"
    )]
    NotContiguous {
        /// The tensor's shape.
        shape: Vec<i64>,
        /// Its strides (in elements).
        strides: Vec<i64>,
    },
    /// Write access asked of the buffer of a tensor whose elements leave gaps in their span
    /// (see [`DlpackImport::has_gaps`](crate::DlpackImport::has_gaps)): the buffer covers bytes
    /// between them that the producer did not lend.
    #[error(
        "not writable: shape {shape:?} with strides {strides:?} leaves gaps between its elements, and the buffer \
         over them covers bytes the producer did not lend: read it through buffer(), or write a tensor without gaps"
    )]
    Gaps {
        /// The tensor's shape.
        shape: Vec<i64>,
        /// Its strides (in elements).
        strides: Vec<i64>,
    },
    /// A typed view asked of a tensor of another data type.
    #[error(
        "dtype mismatch: the view is of {}, the tensor holds {}: view it as its own type, or reinterpret the bytes \
         through buffer().view()", describe(*.expected), describe(*.actual)
    )]
    DtypeMismatch {
        /// The view's data type.
        expected: DLDataType,
        /// The tensor's.
        actual: DLDataType,
    },
    /// Write access asked of a tensor its producer marked read-only.
    #[error("the DLPack tensor is read-only (its producer set DLPACK_FLAG_BITMASK_READ_ONLY): read it only")]
    ReadOnly,
}

// The feature must not grow `Error`, which other crates' errors carry (a larger one trips
// clippy's `result_large_err` across the workspace): a DLPack error is no larger than a driver
// error.
const _: () = assert!(size_of::<DlpackError>() <= size_of::<cuda_mem_sys::CudaError>());

/// The data type as NumPy and PyTorch spell it (`float32`, `uint8`, `int64x4` for four lanes),
/// for error messages.
pub(crate) fn describe(dtype: DLDataType) -> String {
    let kind = match dtype.code {
        DLDataTypeCode::INT => "int".to_owned(),
        DLDataTypeCode::UINT => "uint".to_owned(),
        DLDataTypeCode::FLOAT => "float".to_owned(),
        DLDataTypeCode::BFLOAT => "bfloat".to_owned(),
        DLDataTypeCode::COMPLEX => "complex".to_owned(),
        DLDataTypeCode::BOOL => "bool".to_owned(),
        DLDataTypeCode(code) => format!("type-code-{code}-"),
    };
    let lanes = if dtype.lanes == 1 { String::new() } else { format!("x{}", dtype.lanes) };
    format!("{kind}{}{lanes}", dtype.bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_types_read_as_numpy_names() {
        assert_eq!(describe(DLDataType::F32), "float32");
        assert_eq!(describe(DLDataType::U8), "uint8");
        assert_eq!(describe(DLDataType::BOOL), "bool8");
        assert_eq!(describe(DLDataType::new(DLDataTypeCode::INT, 64, 4)), "int64x4");
    }
}
