//! [`DlpackElement`]: the Rust element types a DLPack tensor's data type (`DLDataType`) names,
//! and how many bytes one element of a data type takes.

use dlpark::ffi::DLDataType;

mod sealed {
    /// Only the element types listed in this module map to DLPack data types.
    pub trait Sealed {}
}

/// A Rust element type and the DLPack data type that describes it (`float32` for `f32`, ...):
/// what a typed export writes into the tensor and what a typed import checks. Sealed: `u8`,
/// `u16`, `u32`, `u64`, `i8`, `i16`, `i32`, `i64`, `f32`, `f64` and `bool` (DLPack's `bool` is
/// one byte, as Rust's). Other data types (`float16`, `bfloat16`, complex, vectors) are exported
/// from raw bytes with an explicit `dlpark::ffi::DLDataType`
/// ([`into_dlpack_as`](crate::ScopedBuffer::into_dlpack_as)).
pub trait DlpackElement: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The DLPack data type of one element.
    const DTYPE: DLDataType;
}

macro_rules! elements {
    ($($rust:ty => $dtype:ident),* $(,)?) => {
        $(
            impl sealed::Sealed for $rust {}
            impl DlpackElement for $rust {
                const DTYPE: DLDataType = DLDataType::$dtype;
            }
        )*
        /// Every element's DLPack size equals its Rust size: checked at compile time.
        const _: () = { $(assert!(DLDataType::$dtype.element_size() == size_of::<$rust>());)* };
    };
}

elements!(
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    f32 => F32, f64 => F64, bool => BOOL,
);

/// The bytes one element of `dtype` takes, or `None` for a data type whose elements are not a
/// whole number of bytes (packed sub-byte types, a zero width or zero lanes), which this crate
/// neither exports nor imports.
pub(crate) fn element_bytes(dtype: DLDataType) -> Option<usize> {
    let bits = usize::from(dtype.bits) * usize::from(dtype.lanes);
    (bits > 0 && bits.is_multiple_of(8)).then_some(bits / 8)
}

#[cfg(test)]
mod tests {
    use dlpark::ffi::DLDataTypeCode;

    use super::*;

    #[test]
    fn element_sizes_are_whole_bytes_or_refused() {
        assert_eq!(element_bytes(f64::DTYPE), Some(8));
        assert_eq!(element_bytes(bool::DTYPE), Some(1));
        assert_eq!(element_bytes(DLDataType::new(DLDataTypeCode::FLOAT, 32, 4)), Some(16));
        assert_eq!(element_bytes(DLDataType::F4E2M1FN), None);
        assert_eq!(element_bytes(DLDataType::new(DLDataTypeCode::INT, 0, 1)), None);
        assert_eq!(element_bytes(DLDataType::new(DLDataTypeCode::INT, 8, 0)), None);
    }
}
