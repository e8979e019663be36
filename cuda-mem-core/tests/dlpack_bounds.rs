//! DLPack (feature `dlpack`) at the edges of its layouts: reaches past what `i128` holds, empty
//! shapes over ranges with elements, and imports whose elements leave gaps in their buffer.

#![cfg(feature = "dlpack")]

mod common;

use std::sync::Arc;

use cuda_mem_core::dlpark::DlpackFlags;
use cuda_mem_core::{
    Buffer, DeviceMemoryResource, DlpackError, DlpackImport, DlpackTensor, Error, ExportOptions, MemoryResource,
    Stream, export_dlpack,
};

/// A buffer of the current device's pool holding `data`.
fn filled(data: &[i32], stream: &Stream) -> Buffer {
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(stream.device()).unwrap();
    let mut buffer = Buffer::allocate(pool, size_of_val(data), stream).unwrap();
    buffer.copy_from_slice(data, stream).unwrap();
    buffer
}

/// Takes a tensor this test made (from memory it keeps valid, which nothing writes behind the
/// import's back).
fn take(tensor: DlpackTensor) -> DlpackImport {
    // SAFETY: every tensor of these tests describes memory the test keeps valid.
    unsafe { DlpackImport::from_dlpack(tensor) }.unwrap()
}

/// The tensor's data pointer.
fn data(tensor: &DlpackTensor) -> u64 {
    tensor.data_ptr()
}

#[test]
fn a_layout_reaching_past_i128_is_refused_not_wrapped() {
    let device = common::device();
    let stream = common::stream(device);
    let pool: Arc<dyn MemoryResource> = DeviceMemoryResource::current(device).unwrap();
    // 16 extents of 2^124 elements: 2^128 in all, which wrapped (or panicked, in debug) and
    // passed for a layout inside one byte.
    let (shape, strides) = ([(1usize << 62) + 1; 16], [1isize << 62; 16]);
    for strides in [strides, strides.map(|s| -s)] {
        let buffer = Buffer::allocate(Arc::clone(&pool), 1, &stream).unwrap();
        let options = ExportOptions::default().shape_and_strides(&shape, &strides);
        let error = match buffer.into_dlpack::<u8>(&options) {
            Ok(_) => panic!("a layout reaching 2^128 elements was exported from one byte"),
            Err(error) => error,
        };
        assert!(matches!(error, Error::Dlpack(DlpackError::OutOfBounds { span: usize::MAX, len: 1, .. })), "{error}");
    }
}

#[test]
fn an_empty_shape_has_a_null_data_pointer_whatever_the_range() {
    let device = common::device();
    let stream = common::stream(device);
    let data_in: Vec<i32> = (0..16).collect();
    // Explicit strides put a shape of no elements over a range of 16: DLPack asks for a null
    // data pointer for a tensor of size zero, the product of its shape.
    for (shape, strides) in [(&[0usize, 4][..], &[4isize, 1][..]), (&[4, 0], &[1, 4]), (&[0], &[1])] {
        let options = ExportOptions::default().shape_and_strides(shape, strides);
        let tensor = filled(&data_in, &stream).into_dlpack::<i32>(&options).unwrap();
        assert_eq!(data(&tensor), 0, "{shape:?} {strides:?}");
        let import = take(tensor);
        assert_eq!((import.shape().iter().product::<i64>(), import.buffer().size()), (0, 0));
    }
    // An empty range too, and a range with elements under a shape that has them is not null.
    let empty = filled(&[], &stream).into_dlpack::<i32>(&ExportOptions::default()).unwrap();
    assert_eq!(data(&empty), 0);
    let some = filled(&data_in, &stream).into_dlpack::<i32>(&ExportOptions::default().shape(&[4, 4])).unwrap();
    assert_ne!(data(&some), 0);
}

#[test]
fn an_import_with_gaps_is_read_only_and_hands_on_read_only() {
    let device = common::device();
    let stream = common::stream(device);
    let data_in: Vec<i32> = (0..16).collect();

    // A column of a 4x4 matrix: elements 0, 4, 8 and 12, a buffer of 13 with 9 not the tensor's.
    let options = ExportOptions::default().shape_and_strides(&[4, 1], &[4, 1]);
    let mut import = take(filled(&data_in, &stream).into_dlpack::<i32>(&options).unwrap());
    assert!(!import.is_read_only() && import.has_gaps() && import.buffer().size() == 13 * 4);
    let error = import.buffer_mut().unwrap_err();
    assert!(
        matches!(&error, Error::Dlpack(DlpackError::Gaps { shape, strides }) if shape == &[4, 1] && strides == &[4, 1])
    );
    assert!(error.to_string().contains("did not lend"), "{error}");
    // Still readable, gaps included, as documented.
    assert_eq!(import.buffer().to_vec::<i32>(&stream).unwrap(), data_in[..13]);
    // Handed on, it is read-only: the consumer must not write the gaps either.
    let again = export_dlpack::<i32>(import, &ExportOptions::default()).unwrap();
    assert_eq!(again.flags(), DlpackFlags::READ_ONLY);
    let second = take(again);
    assert!(second.is_read_only());

    // Without gaps (transposed, reversed, broadcast), the buffer is the tensor's own: writable,
    // and handed on writable.
    let layouts: [(&[usize], &[isize], usize); 3] = [(&[4, 4], &[1, 4], 16), (&[16], &[-1], 16), (&[8, 2], &[0, 1], 2)];
    for (shape, strides, elements) in layouts {
        let options = ExportOptions::default().elements(..elements).shape_and_strides(shape, strides);
        let mut import = take(filled(&data_in, &stream).into_dlpack::<i32>(&options).unwrap());
        assert!(!import.has_gaps(), "{shape:?} {strides:?}");
        assert_eq!(import.buffer_mut().unwrap().size(), elements * 4);
        let again = export_dlpack::<i32>(import, &ExportOptions::default()).unwrap();
        assert_eq!(again.flags(), DlpackFlags::empty(), "{shape:?} {strides:?}");
    }
}
