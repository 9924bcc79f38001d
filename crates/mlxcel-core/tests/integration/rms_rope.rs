//! `fast::rms_norm` and `fast::Rope` against scalar Rust implementations.

use mlxcel_core::Array;
use mlxcel_core::fast::{Rope, RopeFrequencies, rms_norm};

use crate::{assert_close, pseudo_random};

#[test]
fn rms_norm_matches_scalar_reference() {
    let (rows, dim, eps) = (3, 8, 1e-5f32);
    let x = pseudo_random(rows * dim, 11);
    let w = pseudo_random(dim, 12);
    let mut expected = Vec::new();
    for row in x.chunks(dim) {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        expected.extend(row.iter().zip(&w).map(|(v, w)| v * inv * w));
    }
    let out = rms_norm(
        &Array::from_f32(&x, &[1, rows as i32, dim as i32]).unwrap(),
        &Array::from_f32(&w, &[dim as i32]).unwrap(),
        eps,
    )
    .unwrap();
    assert_eq!(out.shape(), [1, rows as i32, dim as i32]);
    assert_close(&out.to_vec_f32().unwrap(), &expected, 1e-5);
}

/// Scalar RoPE over `[heads, seq, head_dim]`; `inv_period[i]` is the angle per position of
/// pair `i`; the first `dims` features rotate, the rest pass through.
fn rope_ref(
    x: &[f32],
    (heads, seq, head_dim): (usize, usize, usize),
    dims: usize,
    traditional: bool,
    inv_period: &[f32],
    scale: f32,
    offset: usize,
) -> Vec<f32> {
    let mut out = x.to_vec();
    for h in 0..heads {
        for s in 0..seq {
            let base = (h * seq + s) * head_dim;
            let pos = (offset + s) as f32 * scale;
            for (i, inv) in inv_period.iter().enumerate().take(dims / 2) {
                let (a, b) = if traditional {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + dims / 2)
                };
                let theta = pos * inv;
                let (sin, cos) = theta.sin_cos();
                let (xa, xb) = (x[base + a], x[base + b]);
                out[base + a] = xa * cos - xb * sin;
                out[base + b] = xa * sin + xb * cos;
            }
        }
    }
    out
}

#[test]
fn rope_matches_scalar_reference_in_both_layouts() {
    let (heads, seq, head_dim) = (2, 3, 8);
    let x = pseudo_random(heads * seq * head_dim, 21);
    let xa = Array::from_f32(&x, &[1, heads as i32, seq as i32, head_dim as i32]).unwrap();
    // (dims, traditional, base, scale, offset): full and partial rotation, both layouts.
    let cases = [
        (8, false, 10000.0f32, 1.0f32, 0usize),
        (8, false, 10000.0, 1.0, 5),
        (8, true, 10000.0, 1.0, 5),
        (8, false, 500000.0, 0.5, 7),
        (4, false, 10000.0, 1.0, 2),
        (4, true, 10000.0, 1.0, 2),
    ];
    for (dims, traditional, base, scale, offset) in cases {
        let inv_period: Vec<f32> = (0..dims / 2)
            .map(|i| base.powf(-2.0 * i as f32 / dims as f32))
            .collect();
        let expected = rope_ref(
            &x,
            (heads, seq, head_dim),
            dims,
            traditional,
            &inv_period,
            scale,
            offset,
        );
        let rope = Rope {
            dims: dims as i32,
            traditional,
            scale,
            frequencies: RopeFrequencies::Base(base),
        };
        let out = rope.apply(&xa, offset as i32).unwrap();
        assert_eq!(out.shape(), xa.shape());
        assert_close(&out.to_vec_f32().unwrap(), &expected, 2e-5);
    }
}

#[test]
fn rope_with_custom_frequencies_divides_positions_by_periods() {
    let (heads, seq, head_dim) = (1, 4, 8);
    let x = pseudo_random(heads * seq * head_dim, 22);
    let xa = Array::from_f32(&x, &[1, heads as i32, seq as i32, head_dim as i32]).unwrap();
    // Llama3-style: some periods stretched by a factor, as its rope scaling does.
    let periods: Vec<f32> = (0..4)
        .map(|i| 10000f32.powf(2.0 * i as f32 / 8.0) * if i >= 2 { 8.0 } else { 1.0 })
        .collect();
    let inv_period: Vec<f32> = periods.iter().map(|p| 1.0 / p).collect();
    let expected = rope_ref(&x, (heads, seq, head_dim), 8, false, &inv_period, 1.0, 3);
    let rope = Rope {
        dims: 8,
        traditional: false,
        scale: 1.0,
        frequencies: RopeFrequencies::Custom(Array::from_f32(&periods, &[4]).unwrap()),
    };
    assert_close(
        &rope.apply(&xa, 3).unwrap().to_vec_f32().unwrap(),
        &expected,
        2e-5,
    );
}
