//! Shapes and strides: checking a caller's against the elements exported, and the span of
//! elements a tensor's reach (for import).

use super::error::DlpackError;

/// A checked layout, as DLPack stores it: shape and strides (in elements), and where element
/// `[0, …, 0]` lies, in elements from the start of the exported range (past 0 only when a
/// stride is negative: the element reached first is the range's first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Vec<i64>,
    pub(crate) origin: usize,
}

/// The lowest and highest element offsets (relative to element `[0, …, 0]`) that `shape` with
/// `strides` reaches, or `None` when it has no elements (a dimension is 0). The caller checked
/// that both have the same length and no dimension is negative.
pub(crate) fn reach(shape: &[i64], strides: &[i64]) -> Option<(i128, i128)> {
    if shape.contains(&0) {
        return None;
    }
    // i128: a dimension below 2^63 times a stride of magnitude at most 2^63, summed over at most
    // 2^31 dimensions, stays below 2^127.
    Some(shape.iter().zip(strides).fold((0, 0), |(low, high), (&dim, &stride)| {
        let extent = i128::from(dim - 1) * i128::from(stride);
        (low + extent.min(0), high + extent.max(0))
    }))
}

/// Checks a caller's shape (and strides) against `len` elements: without strides, the shape's
/// elements must be exactly `len` (compact row-major strides are written); with strides, every
/// element they reach must lie within the `len` elements. No shape means one dimension of `len`.
pub(crate) fn check(shape: Option<&[usize]>, strides: Option<&[isize]>, len: usize) -> Result<Layout, DlpackError> {
    let Some(shape) = shape else {
        let len_i64 = i64::try_from(len).map_err(|_| DlpackError::ShapeTooLarge { shape: vec![len] })?;
        return Ok(Layout { shape: vec![len_i64], strides: vec![1], origin: 0 });
    };
    let too_large = || DlpackError::ShapeTooLarge { shape: shape.to_vec() };
    if i32::try_from(shape.len()).is_err() {
        return Err(too_large());
    }
    let dims: Vec<i64> = shape.iter().map(|&d| i64::try_from(d)).collect::<Result<_, _>>().map_err(|_| too_large())?;
    let Some(strides) = strides else {
        let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX);
        if elements != len {
            return Err(DlpackError::ShapeSize { shape: shape.to_vec(), elements, len });
        }
        // The product is `len`, so every suffix product fits too (unless a later dimension is 0).
        let mut compact = vec![0i64; dims.len()];
        let mut step = 1i64;
        for (axis, &dim) in dims.iter().enumerate().rev() {
            compact[axis] = step;
            step = step.saturating_mul(dim);
        }
        return Ok(Layout { shape: dims, strides: compact, origin: 0 });
    };
    if strides.len() != shape.len() {
        return Err(DlpackError::StridesLength { ndim: shape.len(), strides: strides.len() });
    }
    // `isize` and `i64` are the same width on every target this crate builds for.
    let steps: Vec<i64> = strides.iter().map(|&s| s as i64).collect();
    let Some((low, high)) = reach(&dims, &steps) else {
        return Ok(Layout { shape: dims, strides: steps, origin: 0 });
    };
    let span = high - low + 1;
    if span > len as i128 {
        let span = usize::try_from(span).unwrap_or(usize::MAX);
        return Err(DlpackError::OutOfBounds { shape: shape.to_vec(), strides: strides.to_vec(), span, len });
    }
    // `-low` < span <= len, so it fits.
    Ok(Layout { shape: dims, strides: steps, origin: (-low) as usize })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_shape_is_one_dimension_of_everything() {
        assert_eq!(check(None, None, 12).unwrap(), Layout { shape: vec![12], strides: vec![1], origin: 0 });
    }

    #[test]
    fn a_shape_alone_is_compact_and_must_cover_the_range() {
        let layout = check(Some(&[2, 3, 4]), None, 24).unwrap();
        assert_eq!((layout.strides, layout.origin), (vec![12, 4, 1], 0));
        let short = check(Some(&[2, 3]), None, 8).unwrap_err();
        assert!(matches!(short, DlpackError::ShapeSize { elements: 6, len: 8, .. }), "{short:?}");
        let overflow = check(Some(&[1 << 40, 1 << 40]), None, 8).unwrap_err();
        assert!(matches!(overflow, DlpackError::ShapeSize { elements: usize::MAX, .. }), "{overflow:?}");
        assert!(matches!(check(Some(&[usize::MAX]), None, 8), Err(DlpackError::ShapeTooLarge { .. })));
        assert_eq!(check(Some(&[]), None, 1).unwrap().shape, Vec::<i64>::new());
    }

    #[test]
    fn strides_are_checked_against_the_range() {
        // A transposed 2x3 in 6 elements; every other element of 6 in 11.
        assert_eq!(check(Some(&[2, 3]), Some(&[1, 2]), 6).unwrap().strides, vec![1, 2]);
        assert!(check(Some(&[6]), Some(&[2]), 11).is_ok());
        let past = check(Some(&[6]), Some(&[2]), 10).unwrap_err();
        assert!(matches!(past, DlpackError::OutOfBounds { span: 11, len: 10, .. }), "{past:?}");
        let length = check(Some(&[2, 3]), Some(&[1]), 6).unwrap_err();
        assert!(matches!(length, DlpackError::StridesLength { ndim: 2, strides: 1 }), "{length:?}");
        // Reversed: element [0] is the range's last; broadcast: one element for all.
        assert_eq!(check(Some(&[4]), Some(&[-1]), 4).unwrap().origin, 3);
        assert!(check(Some(&[1000]), Some(&[0]), 1).is_ok());
        // No elements reach nothing, whatever the strides.
        assert!(check(Some(&[0, 5]), Some(&[isize::MAX, isize::MIN]), 0).is_ok());
        // Spans past 2^64 elements are counted, not wrapped.
        let huge = check(Some(&[4]), Some(&[isize::MAX]), usize::MAX).unwrap_err();
        assert!(matches!(huge, DlpackError::OutOfBounds { span: usize::MAX, .. }), "{huge:?}");
    }

    /// Every offset `shape` with `strides` reaches from element `[0, …, 0]`.
    fn offsets(shape: &[usize], strides: &[isize]) -> Vec<i128> {
        let mut all = vec![0i128];
        for (&dim, &stride) in shape.iter().zip(strides) {
            all = all.iter().flat_map(|&o| (0..dim).map(move |i| o + i as i128 * stride as i128)).collect();
        }
        all
    }

    proptest! {
        /// Accepted layouts keep every element they reach inside the range, and refused ones
        /// reach past it: the check is exact.
        #[test]
        fn accepted_exactly_when_every_element_is_inside(
            dims in proptest::collection::vec((0usize..5, -7isize..8), 0..4),
            len in 0usize..80,
        ) {
            let (shape, strides): (Vec<usize>, Vec<isize>) = dims.into_iter().unzip();
            let reached = offsets(&shape, &strides);
            match check(Some(&shape), Some(&strides), len) {
                Ok(layout) => {
                    for offset in reached {
                        let at = layout.origin as i128 + offset;
                        prop_assert!((0..len as i128).contains(&at), "element at {at} of {len}");
                    }
                }
                Err(DlpackError::OutOfBounds { span, .. }) => {
                    let (low, high) = (reached.iter().min().unwrap(), reached.iter().max().unwrap());
                    prop_assert_eq!(span as i128, high - low + 1);
                    prop_assert!(span > len);
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }

        /// A shape alone is accepted exactly when it has `len` elements, with strides that are
        /// compact row-major.
        #[test]
        fn a_shape_alone_is_compact(shape in proptest::collection::vec(0usize..5, 0..4), len in 0usize..80) {
            let elements: usize = shape.iter().product();
            match check(Some(&shape), None, len) {
                Ok(layout) => {
                    prop_assert_eq!(elements, len);
                    let strides: Vec<usize> = layout.strides.iter().map(|&s| s as usize).collect();
                    for axis in 0..shape.len() {
                        prop_assert_eq!(strides[axis], shape[axis + 1..].iter().product::<usize>());
                    }
                }
                Err(DlpackError::ShapeSize { .. }) => prop_assert_ne!(elements, len),
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
