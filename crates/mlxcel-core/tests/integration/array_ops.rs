//! Construction, read-back and the general ops against hand-computed results.

use mlxcel_core::{Array, Dtype, eval};

use crate::{assert_close, matmul_ref, pseudo_random};

#[test]
fn constructors_round_trip_every_host_type() {
    let f = Array::from_f32(&[1.5, -2.0, 3.25], &[3]).unwrap();
    assert_eq!((f.shape(), f.dtype()), (vec![3], Dtype::F32));
    assert_eq!(f.to_vec_f32().unwrap(), [1.5, -2.0, 3.25]);

    let u = Array::from_u32(&[0, 7, u32::MAX], &[1, 3]).unwrap();
    assert_eq!((u.shape(), u.dtype()), (vec![1, 3], Dtype::U32));
    assert_eq!(u.to_vec_u32().unwrap(), [0, 7, u32::MAX]);

    let i = Array::from_i32(&[-4, 0, 9, 1], &[2, 2]).unwrap();
    assert_eq!(i.dtype(), Dtype::I32);
    assert_eq!(i.to_vec_i32().unwrap(), [-4, 0, 9, 1]);

    // 1.0, -2.0, 0.5 in IEEE half and in bfloat16.
    let h = Array::from_f16_bits(&[0x3C00, 0xC000, 0x3800], &[3]).unwrap();
    assert_eq!(h.dtype(), Dtype::F16);
    assert_eq!(h.to_vec_f32().unwrap(), [1.0, -2.0, 0.5]);
    let b = Array::from_bf16_bits(&[0x3F80, 0xC000, 0x3F00], &[3]).unwrap();
    assert_eq!(b.dtype(), Dtype::BF16);
    assert_eq!(b.to_vec_f32().unwrap(), [1.0, -2.0, 0.5]);

    let s = Array::scalar_f32(2.5);
    assert_eq!((s.shape(), s.ndim(), s.size()), (vec![], 0, 1));
}

/// An array already evaluated is read as it is only when it is f32 and row-contiguous (a step's
/// logits); evaluated views (a transpose, a strided slice, a row range) and other types still
/// read in logical order, and a view read first leaves its source readable.
#[test]
fn evaluated_arrays_and_views_read_back_in_logical_order() {
    let a = Array::from_f32(&(0..12).map(|v| v as f32).collect::<Vec<_>>(), &[3, 4]).unwrap();
    let doubled = a.add(&a).unwrap();
    let t = a.transpose(&[1, 0]).unwrap();
    let rows = a.slice(&[1, 0], &[3, 4]).unwrap();
    let every_other = a.slice_strided(&[0, 1], &[3, 4], &[1, 2]).unwrap();
    let half = a.astype(Dtype::F16).unwrap();
    eval(&[&doubled, &t, &rows, &every_other, &half]).unwrap();
    let expect = |f: fn(usize) -> f32, n: usize| (0..n).map(f).collect::<Vec<f32>>();
    assert_eq!(
        doubled.to_vec_f32().unwrap(),
        expect(|i| 2.0 * i as f32, 12)
    );
    assert_eq!(
        t.to_vec_f32().unwrap(),
        [0.0, 4.0, 8.0, 1.0, 5.0, 9.0, 2.0, 6.0, 10.0, 3.0, 7.0, 11.0]
    );
    assert_eq!(rows.to_vec_f32().unwrap(), expect(|i| (i + 4) as f32, 8));
    assert_eq!(
        every_other.to_vec_f32().unwrap(),
        [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    );
    assert_eq!(half.to_vec_f32().unwrap(), expect(|i| i as f32, 12));
    assert_eq!(a.to_vec_f32().unwrap(), expect(|i| i as f32, 12));
    // Read twice: the fast path does not consume or alias anything.
    assert_eq!(
        doubled.to_vec_f32().unwrap(),
        expect(|i| 2.0 * i as f32, 12)
    );
}

/// `to_rows_f32` hands back the same elements as `to_vec_f32`, one vector per row, for
/// evaluated arrays, views (transposed, strided) and other dtypes alike; rows that do not divide
/// the array are refused.
#[test]
fn rows_read_back_like_the_whole_array_split() {
    let a = Array::from_f32(&(0..12).map(|v| v as f32).collect::<Vec<_>>(), &[3, 4]).unwrap();
    let doubled = a.add(&a).unwrap();
    let t = a.transpose(&[1, 0]).unwrap();
    let every_other = a.slice_strided(&[0, 1], &[3, 4], &[1, 2]).unwrap();
    let half = a.astype(Dtype::F16).unwrap();
    eval(&[&doubled, &t, &every_other, &half]).unwrap();
    // Not evaluated yet: read as the others, its graph run once.
    let lazy = a.multiply(&a).unwrap().transpose(&[1, 0]).unwrap();
    let cases = [
        (&doubled, 4),
        (&t, 3),
        (&every_other, 2),
        (&half, 6),
        (&a, 12),
        (&lazy, 3),
    ];
    for (array, row) in cases {
        let rows = array.to_rows_f32(row).unwrap();
        let whole = array.to_vec_f32().unwrap();
        assert_eq!(rows.len(), whole.len() / row);
        assert!(rows.iter().all(|r| r.len() == row));
        assert_eq!(rows.concat(), whole);
    }
    for bad in [0, 5, 24] {
        let err = a.to_rows_f32(bad).unwrap_err().to_string();
        assert!(err.contains("not rows of"), "{err}");
    }
    let empty = Array::from_f32(&[], &[0, 4]).unwrap();
    assert!(empty.to_rows_f32(4).unwrap().is_empty());
}

#[test]
fn from_bytes_copies_unaligned_borrowed_data_once() {
    // Little-endian f32 bytes at an odd offset, as a safetensors mmap may hand them out.
    let values = [1.0f32, -0.5, 8.0, 3.0];
    let mut buffer = vec![0xAAu8];
    for v in values {
        buffer.extend_from_slice(&v.to_le_bytes());
    }
    let a = Array::from_bytes(&buffer[1..], &[2, 2], Dtype::F32).unwrap();
    buffer.fill(0); // The array owns its copy.
    assert_eq!(a.to_vec_f32().unwrap(), values);

    let half_bytes: Vec<u8> = [0x3C00u16, 0x4000]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let h = Array::from_bytes(&half_bytes, &[2], Dtype::F16).unwrap();
    assert_eq!(h.to_vec_f32().unwrap(), [1.0, 2.0]);
}

#[test]
fn reshape_transpose_swapaxes() {
    let a = Array::from_f32(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
    assert_eq!(a.reshape(&[3, -1]).unwrap().shape(), [3, 2]);
    let t = a.transpose(&[1, 0]).unwrap();
    assert_eq!(t.shape(), [3, 2]);
    assert_eq!(t.to_vec_f32().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let s = a.reshape(&[1, 2, 3]).unwrap().swapaxes(-1, -2).unwrap();
    assert_eq!(s.shape(), [1, 3, 2]);
    assert_eq!(s.to_vec_f32().unwrap(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}

#[test]
fn broadcast_arithmetic() {
    let a = Array::from_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let row = Array::from_f32(&[1.0, 2.0, 4.0], &[3]).unwrap();
    let col = Array::from_f32(&[10.0, 20.0], &[2, 1]).unwrap();
    assert_eq!(
        a.add(&row).unwrap().to_vec_f32().unwrap(),
        [2.0, 4.0, 7.0, 5.0, 7.0, 10.0]
    );
    assert_eq!(
        a.subtract(&col).unwrap().to_vec_f32().unwrap(),
        [-9.0, -8.0, -7.0, -16.0, -15.0, -14.0]
    );
    assert_eq!(
        a.multiply(&row).unwrap().to_vec_f32().unwrap(),
        [1.0, 4.0, 12.0, 4.0, 10.0, 24.0]
    );
    assert_eq!(
        a.divide(&row).unwrap().to_vec_f32().unwrap(),
        [1.0, 1.0, 0.75, 4.0, 2.5, 1.5]
    );
    let scaled = a.multiply(&Array::scalar_f32(0.5)).unwrap();
    assert_eq!(scaled.to_vec_f32().unwrap(), [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
}

#[test]
fn matmul_matches_reference_including_batch_broadcast() {
    let (m, k, n) = (3, 5, 4);
    let a = pseudo_random(2 * m * k, 1);
    let b = pseudo_random(k * n, 2);
    let out = Array::from_f32(&a, &[2, m as i32, k as i32])
        .unwrap()
        .matmul(&Array::from_f32(&b, &[k as i32, n as i32]).unwrap())
        .unwrap();
    assert_eq!(out.shape(), [2, m as i32, n as i32]);
    let mut expected = matmul_ref(&a[..m * k], &b, m, k, n);
    expected.extend(matmul_ref(&a[m * k..], &b, m, k, n));
    assert_close(&out.to_vec_f32().unwrap(), &expected, 1e-5);
}

#[test]
fn astype_converts_and_rounds() {
    let a = Array::from_f32(&[1.0, 0.1, -3.75], &[3]).unwrap();
    let h = a.astype(Dtype::F16).unwrap();
    assert_eq!(h.dtype(), Dtype::F16);
    assert_close(&h.to_vec_f32().unwrap(), &[1.0, 0.1, -3.75], 1e-3);
    let b = a.astype(Dtype::BF16).unwrap().astype(Dtype::F32).unwrap();
    assert_close(&b.to_vec_f32().unwrap(), &[1.0, 0.1, -3.75], 1e-2);
    assert_eq!(
        a.astype(Dtype::I32).unwrap().to_vec_i32().unwrap(),
        [1, 0, -3]
    );
}

#[test]
fn take_gathers_embedding_rows() {
    let vocab = 5;
    let dim = 3;
    let table: Vec<f32> = (0..vocab * dim).map(|v| v as f32).collect();
    let table = Array::from_f32(&table, &[vocab, dim]).unwrap();
    let ids = Array::from_u32(&[2, 0, 4, 2], &[1, 4]).unwrap();
    let rows = table.take(&ids, 0).unwrap();
    assert_eq!(rows.shape(), [1, 4, dim]);
    assert_eq!(
        rows.to_vec_f32().unwrap(),
        [
            6.0, 7.0, 8.0, 0.0, 1.0, 2.0, 12.0, 13.0, 14.0, 6.0, 7.0, 8.0
        ]
    );
    let cols = table
        .take(&Array::from_i32(&[2, 0], &[2]).unwrap(), 1)
        .unwrap();
    assert_eq!(
        cols.to_vec_f32().unwrap(),
        [2.0, 0.0, 5.0, 3.0, 8.0, 6.0, 11.0, 9.0, 14.0, 12.0]
    );
}

#[test]
fn concatenate_slice_and_slice_update_make_a_kv_cache() {
    // Cache [batch 1, kv_heads 2, capacity 4, head_dim 2], written one step at a time.
    let mut cache = Array::zeros(&[1, 2, 4, 2], Dtype::F32).unwrap();
    assert_eq!(cache.to_vec_f32().unwrap(), [0.0; 16]);
    for step in 0..3 {
        let v = step as f32 + 1.0;
        let new = Array::from_f32(&[v, v, -v, -v], &[1, 2, 1, 2]).unwrap();
        cache = cache
            .slice_update(&new, &[0, 0, step, 0], &[1, 2, step + 1, 2])
            .unwrap();
    }
    let live = cache.slice(&[0, 0, 0, 0], &[1, 2, 3, 2]).unwrap();
    assert_eq!(live.shape(), [1, 2, 3, 2]);
    assert_eq!(
        live.to_vec_f32().unwrap(),
        [
            1.0, 1.0, 2.0, 2.0, 3.0, 3.0, -1.0, -1.0, -2.0, -2.0, -3.0, -3.0
        ]
    );

    let a = Array::from_f32(&[1.0, 2.0], &[1, 2]).unwrap();
    let b = Array::from_f32(&[3.0, 4.0, 5.0, 6.0], &[2, 2]).unwrap();
    let joined = Array::concatenate(&[&a, &b], 0).unwrap();
    assert_eq!(joined.shape(), [3, 2]);
    assert_eq!(joined.to_vec_f32().unwrap(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let every_other = joined.slice_strided(&[0, 0], &[3, 2], &[2, 1]).unwrap();
    assert_eq!(every_other.to_vec_f32().unwrap(), [1.0, 2.0, 5.0, 6.0]);
}

#[test]
fn silu_softmax_argmax() {
    let xs = [-2.0f32, -0.5, 0.0, 1.0, 3.0, 0.25];
    let a = Array::from_f32(&xs, &[2, 3]).unwrap();
    let silu: Vec<f32> = xs.iter().map(|x| x / (1.0 + (-x).exp())).collect();
    assert_close(&a.silu().unwrap().to_vec_f32().unwrap(), &silu, 1e-6);

    let mut softmax = Vec::new();
    for row in xs.chunks(3) {
        let max = row.iter().cloned().fold(f32::MIN, f32::max);
        let sum: f32 = row.iter().map(|x| (x - max).exp()).sum();
        softmax.extend(row.iter().map(|x| (x - max).exp() / sum));
    }
    assert_close(
        &a.softmax(-1, true).unwrap().to_vec_f32().unwrap(),
        &softmax,
        1e-6,
    );

    let arg = a.argmax(-1, false).unwrap();
    assert_eq!((arg.shape(), arg.dtype()), (vec![2], Dtype::U32));
    assert_eq!(arg.to_vec_u32().unwrap(), [2, 1]);
    assert_eq!(a.argmax(0, true).unwrap().shape(), [1, 3]);
}

#[test]
fn eval_of_several_arrays_and_clones_share_results() {
    let a = Array::from_f32(&[1.0, 2.0], &[2]).unwrap();
    let b = a.add(&a).unwrap();
    let c = b.multiply(&a).unwrap();
    let c2 = c.clone();
    eval(&[&b, &c]).unwrap();
    c.eval().unwrap();
    assert_eq!(c2.to_vec_f32().unwrap(), [2.0, 8.0]);
    assert_eq!(b.to_vec_f32().unwrap(), [2.0, 4.0]);
    eval(&[]).unwrap();
}

#[test]
fn debug_shows_shape_and_dtype() {
    let a = Array::from_f32(&[0.0; 6], &[2, 3]).unwrap();
    assert_eq!(format!("{a:?}"), "Array { shape: [2, 3], dtype: F32 }");
}

/// gpt-oss's expert activation: the gate clamped above, the linear half on both sides, then
/// `(u + 1) · g · sigmoid(alpha · g)`; values on both sides of each clamp.
#[test]
fn clamped_swiglu_clamps_the_gate_above_and_the_linear_half_both_ways() {
    let (alpha, limit) = (1.702f32, 7.0f32);
    let gate = [-9.0f32, -1.5, 0.0, 2.0, 6.99, 7.0, 12.0, 30.0];
    let up = [-30.0f32, -7.5, -0.25, 1.0, 6.5, 8.0, -12.0, 3.0];
    let g = Array::from_f32(&gate, &[2, 4]).unwrap();
    let u = Array::from_f32(&up, &[2, 4]).unwrap();
    let got = g
        .clamped_swiglu(&u, alpha, limit)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let want: Vec<f32> = gate
        .iter()
        .zip(&up)
        .map(|(&g, &u)| {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            (u + 1.0) * (g / (1.0 + (-alpha * g).exp()))
        })
        .collect();
    assert_close(&got, &want, 1e-5);
    // The clamp bites: gates of 12 and 30 both act as 7 (with up clamped to -7, and 3).
    let glu7 = 7.0 / (1.0 + (-alpha * 7.0f32).exp());
    assert_close(&[got[6], got[7]], &[-6.0 * glu7, 4.0 * glu7], 1e-5);
}
