//! Property tests for the invariants the KV cache and the forward rely on.

use mlxcel_core::Array;
use proptest::prelude::*;

/// A shape of 1–3 dimensions, each 1–5, and matching data.
fn shaped_data() -> impl Strategy<Value = (Vec<i32>, Vec<f32>)> {
    prop::collection::vec(1i32..=5, 1..=3).prop_flat_map(|shape| {
        let n = shape.iter().product::<i32>() as usize;
        (Just(shape), prop::collection::vec(-100.0f32..100.0, n))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn host_data_round_trips((shape, data) in shaped_data()) {
        let a = Array::from_f32(&data, &shape).unwrap();
        prop_assert_eq!(a.shape(), shape);
        prop_assert_eq!(a.to_vec_f32().unwrap(), data);
    }

    #[test]
    fn reversing_axes_twice_is_the_identity((shape, data) in shaped_data()) {
        let axes: Vec<i32> = (0..shape.len() as i32).rev().collect();
        let a = Array::from_f32(&data, &shape).unwrap();
        let back = a.transpose(&axes).unwrap().transpose(&axes).unwrap();
        prop_assert_eq!(back.to_vec_f32().unwrap(), data);
    }

    /// Writing a block with slice_update and reading it back with slice returns the block,
    /// and every position outside it keeps its old value.
    #[test]
    fn slice_update_then_slice_returns_the_update(
        rows in 1i32..8, cols in 1i32..6, start in 0i32..8, len in 1i32..8,
    ) {
        let start = start % rows;
        let stop = (start + len).min(rows);
        let base: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        let update: Vec<f32> = (0..(stop - start) * cols).map(|v| -1.0 - v as f32).collect();
        let a = Array::from_f32(&base, &[rows, cols]).unwrap();
        let u = Array::from_f32(&update, &[stop - start, cols]).unwrap();
        let written = a.slice_update(&u, &[start, 0], &[stop, cols]).unwrap();
        let read = written.slice(&[start, 0], &[stop, cols]).unwrap();
        prop_assert_eq!(read.to_vec_f32().unwrap(), update.clone());
        let all = written.to_vec_f32().unwrap();
        for (i, v) in all.iter().enumerate() {
            let row = i as i32 / cols;
            if row < start || row >= stop {
                prop_assert_eq!(*v, base[i]);
            }
        }
        // The source array is unchanged: slice_update is functional.
        prop_assert_eq!(a.to_vec_f32().unwrap(), base);
    }
}
