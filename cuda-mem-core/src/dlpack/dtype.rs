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

/// Whether `dtype` is one DLPack defines: a type code of `dlpack.h` (1.3: 0 to 17) with a width
/// that code takes, and at least one lane. Integers take 8 to 64 bits and the packed 1, 2 and 4
/// (which [`element_bytes`] then refuses unless lanes make whole bytes), floats 16, 32 and 64,
/// `bfloat` 16, complex numbers 32, 64 and 128, `bool` 8 (its storage, as `dlpack.h` says), the
/// FP8 codes 8, the FP6 codes 6 and FP4 4 (`dlpack.h`: "the consumer must stop importing if the
/// value is unexpected"); an opaque handle any width its producer and consumer agree on.
pub(crate) fn is_defined(dtype: DLDataType) -> bool {
    use dlpark::ffi::DLDataTypeCode as C;
    let bits = dtype.bits;
    let width_known = match dtype.code {
        C::INT | C::UINT => matches!(bits, 1 | 2 | 4 | 8 | 16 | 32 | 64),
        C::FLOAT => matches!(bits, 16 | 32 | 64),
        C::BFLOAT => bits == 16,
        C::COMPLEX => matches!(bits, 32 | 64 | 128),
        C::BOOL => bits == 8,
        C::OPAQUEHANDLE => bits > 0,
        C::FLOAT6_E2M3FN | C::FLOAT6_E3M2FN => bits == 6,
        C::FLOAT4_E2M1FN => bits == 4,
        C(code) if (C::FLOAT8_E3M4.0..=C::FLOAT8_E8M0FNU.0).contains(&code) => bits == 8,
        C(_) => false,
    };
    width_known && dtype.lanes > 0
}

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
    fn only_the_data_types_dlpack_defines_are_known() {
        for element in [u8::DTYPE, i64::DTYPE, f32::DTYPE, f64::DTYPE, bool::DTYPE, DLDataType::F4E2M1FN] {
            assert!(is_defined(element), "{element:?}");
        }
        let defined = |code: u8, bits: u8, lanes: u16| is_defined(DLDataType::new(DLDataTypeCode(code), bits, lanes));
        assert!(defined(2, 16, 1) && defined(4, 16, 1) && defined(5, 64, 1) && defined(2, 32, 4));
        assert!(defined(8, 8, 1) && defined(14, 8, 1) && defined(15, 6, 1) && defined(3, 24, 1));
        // Unknown codes, widths a code does not take, no lanes.
        assert!(!defined(18, 8, 1) && !defined(99, 32, 1) && !defined(255, 8, 1));
        assert!(!defined(2, 24, 1) && !defined(2, 8, 1) && !defined(6, 16, 1) && !defined(4, 32, 1));
        assert!(!defined(10, 16, 1) && !defined(17, 8, 1) && !defined(0, 128, 1) && !defined(0, 32, 0));
    }

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
