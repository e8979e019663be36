//! Shapes and strides: checking a caller's against the elements exported, and the span of
//! elements a tensor's reach (for import).

use crate::error::DlpackError;

/// A checked layout, as DLPack stores it: shape and strides (in elements), and where element
/// `[0, …, 0]` lies, in elements from the start of the exported range (past 0 only when a
/// stride is negative: the element reached first is the range's first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) shape: Vec<i64>,
    pub(crate) strides: Vec<i64>,
    pub(crate) origin: usize,
}

/// A layout whose reach does not fit in `i128` (see [`reach`]): it reaches past any range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unbounded;

/// The lowest and highest element offsets (relative to element `[0, …, 0]`) that `shape` with
/// `strides` reaches, or `None` when it has no elements (a dimension is 0). The caller checked
/// that both have the same length and no dimension is negative.
///
/// Each dimension's extent, `(dim - 1) * stride`, fits in `i128` (below 2^126 in magnitude),
/// but their sum over many dimensions may not (16 dimensions of `2^62 + 1` with strides of
/// `2^62` sum to 2^128): the sums are checked, and so is the span `high - low + 1`, which the
/// callers compute, so that `Ok` means both fit. A layout beyond that is [`Unbounded`], which
/// no range of memory holds.
///
/// # Errors
/// [`Unbounded`] when the offsets or the span do not fit in `i128`.
pub(crate) fn reach(shape: &[i64], strides: &[i64]) -> Result<Option<(i128, i128)>, Unbounded> {
    if shape.contains(&0) {
        return Ok(None);
    }
    let (low, high) = shape
        .iter()
        .zip(strides)
        .try_fold((0i128, 0i128), |(low, high), (&dim, &stride)| {
            let extent = i128::from(dim - 1).checked_mul(i128::from(stride))?;
            Some((low.checked_add(extent.min(0))?, high.checked_add(extent.max(0))?))
        })
        .ok_or(Unbounded)?;
    high.checked_sub(low).and_then(|span| span.checked_add(1)).ok_or(Unbounded)?;
    Ok(Some((low, high)))
}

/// Whether the elements `shape` with `strides` reaches leave gaps in their span: offsets
/// between the lowest and the highest reached that no element lies at (a tensor of every other
/// element, or a row of a wider matrix). Such a span holds bytes that are not the tensor's.
/// Reversed, permuted and broadcast (stride 0, overlapping) layouts have none.
///
/// Exact: the dimensions that move (more than one element, a stride other than 0), taken by
/// increasing stride magnitude, each reach a contiguous run of `run` elements from the ones
/// before when their stride is at most `run`; a larger stride leaves the offsets from `run` up
/// to it unreached, since every later dimension moves at least as far. A sign only mirrors a
/// dimension's offsets, which moves the set reached without changing its gaps. The caller
/// checked what [`reach`] needs.
pub(crate) fn has_gaps(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return false;
    }
    let mut moving: Vec<(u64, i64)> = shape
        .iter()
        .zip(strides)
        .filter(|&(&dim, &stride)| dim > 1 && stride != 0)
        .map(|(&dim, &stride)| (stride.unsigned_abs(), dim))
        .collect();
    moving.sort_unstable();
    // How many consecutive elements, from the lowest, the dimensions so far reach; i128, as in
    // `reach` (saturating: a run past any stride has no gap left to find).
    let mut run: i128 = 1;
    for (stride, dim) in moving {
        let stride = i128::from(stride);
        if stride > run {
            return true;
        }
        run = run.saturating_add(i128::from(dim - 1).saturating_mul(stride));
    }
    false
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
    let out_of_bounds =
        |span: usize| DlpackError::OutOfBounds { shape: shape.to_vec(), strides: strides.to_vec(), span, len };
    // A reach beyond i128 is beyond any range: its span is counted as `usize::MAX`.
    let Some((low, high)) = reach(&dims, &steps).map_err(|Unbounded| out_of_bounds(usize::MAX))? else {
        return Ok(Layout { shape: dims, strides: steps, origin: 0 });
    };
    // `reach` checked that the span fits.
    let span = high - low + 1;
    if span > len as i128 {
        return Err(out_of_bounds(usize::try_from(span).unwrap_or(usize::MAX)));
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

    #[test]
    fn a_reach_past_i128_is_out_of_bounds_not_wrapped() {
        // 16 extents of 2^124 sum to 2^128: unchecked, the sum wraps (in release; debug
        // panics), and the layout passed for one that fits in a single element.
        let (shape, strides) = ([(1usize << 62) + 1; 16], [1isize << 62; 16]);
        let error = check(Some(&shape), Some(&strides), 1).unwrap_err();
        assert!(matches!(error, DlpackError::OutOfBounds { span: usize::MAX, len: 1, .. }), "{error:?}");
        let (dims, steps) = (shape.map(|d| d as i64), strides.map(|s| s as i64));
        assert_eq!(reach(&dims, &steps), Err(Unbounded));
        // Negative strides: the low end overflows the same way.
        let error = check(Some(&shape), Some(&strides.map(|s| -s)), usize::MAX).unwrap_err();
        assert!(matches!(error, DlpackError::OutOfBounds { span: usize::MAX, .. }), "{error:?}");
        // Each end fits, the span between them does not: 7 extents up, 7 down, 14 * 2^124 apart.
        let mixed: Vec<i64> = (0..14).map(|axis| if axis < 7 { 1 << 62 } else { -(1 << 62) }).collect();
        assert!(reach(&dims[..7], &mixed[..7]).is_ok() && reach(&dims[7..14], &mixed[7..]).is_ok());
        assert_eq!(reach(&dims[..14], &mixed), Err(Unbounded));
        // The largest single extents still fit, and are merely out of bounds.
        let huge = check(Some(&[usize::MAX >> 1]), Some(&[isize::MIN]), 1).unwrap_err();
        assert!(matches!(huge, DlpackError::OutOfBounds { span: usize::MAX, .. }), "{huge:?}");
    }

    #[test]
    fn gaps_are_the_offsets_in_the_span_nothing_reaches() {
        let gaps = |shape: &[i64], strides: &[i64]| has_gaps(shape, strides);
        // Compact, transposed, reversed, broadcast and overlapping: none.
        assert!(!gaps(&[2, 3, 4], &[12, 4, 1]) && !gaps(&[4, 3], &[1, 4]) && !gaps(&[8], &[-1]));
        assert!(!gaps(&[1000], &[0]) && !gaps(&[3, 3], &[1, 1]) && !gaps(&[], &[]) && !gaps(&[0, 5], &[9, 2]));
        // A column of a wider matrix, every other element, a strided dimension of one.
        assert!(gaps(&[4, 1], &[8, 1]) && gaps(&[6], &[2]) && gaps(&[2, 2], &[1, 3]));
        assert!(!gaps(&[1, 6], &[99, 1]));
        // Extents past i128 do not wrap into a run without gaps.
        assert!(gaps(&[(1 << 62) + 1; 16], &[1 << 62; 16]));
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

        /// A layout has gaps exactly when some offset of its span is reached by no element.
        #[test]
        fn gaps_exactly_when_an_offset_of_the_span_is_unreached(
            dims in proptest::collection::vec((0usize..5, -7isize..8), 0..4),
        ) {
            let (shape, strides): (Vec<usize>, Vec<isize>) = dims.into_iter().unzip();
            let reached = offsets(&shape, &strides);
            let expected = !shape.contains(&0) && {
                let (low, high) = (*reached.iter().min().unwrap(), *reached.iter().max().unwrap());
                (low..=high).any(|offset| !reached.contains(&offset))
            };
            let (dims, steps): (Vec<i64>, Vec<i64>) =
                shape.iter().zip(&strides).map(|(&d, &s)| (d as i64, s as i64)).unzip();
            prop_assert_eq!(has_gaps(&dims, &steps), expected, "{:?} {:?}", shape, strides);
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
