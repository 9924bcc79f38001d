//! Affine quantization: `quantized_matmul` vs. dequantize+matmul and vs. a scalar dequant
//! reference over hand-packed values (4 bits: eight per u32, lowest nibble first).

use mlxcel_core::{Array, Dtype, QuantizedWeight};

use crate::{assert_close, matmul_ref, pseudo_random};

/// Scalar affine dequantization of a packed `[rows, cols·bits/32]` u32 matrix.
fn dequant_ref(
    packed: &[u32],
    scales: &[f32],
    biases: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
    bits: usize,
) -> Vec<f32> {
    let per_word = 32 / bits;
    let words_per_row = cols / per_word;
    let mask = (1u32 << bits) - 1;
    let groups_per_row = cols / group;
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let word = packed[r * words_per_row + c / per_word];
            let q = (word >> (bits * (c % per_word))) & mask;
            let g = r * groups_per_row + c / group;
            out.push(scales[g] * q as f32 + biases[g]);
        }
    }
    out
}

/// Packs `q[r][c]` (each < 2^bits) row-major, lowest bits first.
fn pack(q: &[u32], rows: usize, cols: usize, bits: usize) -> Vec<u32> {
    let per_word = 32 / bits;
    let mut packed = vec![0u32; rows * cols / per_word];
    for r in 0..rows {
        for c in 0..cols {
            packed[(r * cols + c) / per_word] |= q[r * cols + c] << (bits * (c % per_word));
        }
    }
    packed
}

#[test]
fn hand_packed_4_and_8_bit_weights_dequantize_and_multiply_as_expected() {
    let (rows, cols, group) = (2usize, 64usize, 32usize);
    let scales = [0.5f32, 0.25, 0.125, 2.0];
    let biases = [-1.0f32, 0.5, 0.0, -3.0];
    for bits in [4usize, 8] {
        let q: Vec<u32> = (0..rows * cols)
            .map(|i| ((i / cols) * 7 + (i % cols) * 3) as u32 % (1 << bits))
            .collect();
        let packed = pack(&q, rows, cols, bits);
        if bits == 4 {
            // Row 0 holds 0, 3, 6, 9, 12, 15, 2, 5: nibbles from the lowest up.
            assert_eq!(packed[0], 0x52FC_9630);
        }
        // The same values, computed directly from q rather than by unpacking.
        let expected: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let g = (i / cols) * (cols / group) + (i % cols) / group;
                scales[g] * q[i] as f32 + biases[g]
            })
            .collect();
        assert_eq!(
            dequant_ref(&packed, &scales, &biases, rows, cols, group, bits),
            expected
        );

        let qw = QuantizedWeight {
            weight: Array::from_u32(&packed, &[rows as i32, (cols * bits / 32) as i32]).unwrap(),
            scales: Array::from_f32(&scales, &[2, 2]).unwrap(),
            biases: Array::from_f32(&biases, &[2, 2]).unwrap(),
            group_size: group as i32,
            bits: bits as i32,
            int8: false,
            activations: None,
        };
        assert_close(
            &qw.dequantize().unwrap().to_vec_f32().unwrap(),
            &expected,
            1e-6,
        );

        let x = pseudo_random(3 * cols, 61);
        let y = qw
            .matmul(&Array::from_f32(&x, &[3, cols as i32]).unwrap(), true)
            .unwrap();
        assert_eq!(y.shape(), [3, rows as i32]);
        let w_t: Vec<f32> = (0..cols * rows)
            .map(|i| expected[(i % rows) * cols + i / rows])
            .collect();
        assert_close(
            &y.to_vec_f32().unwrap(),
            &matmul_ref(&x, &w_t, 3, cols, rows),
            1e-4,
        );
    }
}

#[test]
fn quantize_round_trips_for_every_supported_layout() {
    let (rows, cols) = (8usize, 256usize);
    let w = pseudo_random(rows * cols, 71);
    let wa = Array::from_f32(&w, &[rows as i32, cols as i32]).unwrap();
    let x = Array::from_f32(&pseudo_random(5 * cols, 72), &[5, cols as i32]).unwrap();
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            let qw = QuantizedWeight::quantize(&wa, group, bits).unwrap();
            assert_eq!(qw.weight.dtype(), Dtype::U32);
            assert_eq!(qw.weight.shape(), [rows as i32, cols as i32 * bits / 32]);
            assert_eq!(qw.scales.shape(), [rows as i32, cols as i32 / group]);
            assert_eq!(qw.biases.shape(), qw.scales.shape());

            // MLX's dequantize agrees with the scalar reference on MLX's own packing.
            let scales = qw.scales.to_vec_f32().unwrap();
            let reference = dequant_ref(
                &qw.weight.to_vec_u32().unwrap(),
                &scales,
                &qw.biases.to_vec_f32().unwrap(),
                rows,
                cols,
                group as usize,
                bits as usize,
            );
            let deq = qw.dequantize().unwrap();
            assert_close(&deq.to_vec_f32().unwrap(), &reference, 1e-6);
            // Error stays within one step: MLX snaps the range edge onto the grid (so zero
            // is exact) before rounding, which can cost up to a full step, not half.
            let max_scale = scales.iter().cloned().fold(0.0, f32::max);
            let worst = reference
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                worst <= max_scale + 1e-5,
                "bits {bits} group {group}: {worst} vs step {max_scale}"
            );

            // quantized_matmul == x · dequantize(W)ᵀ.
            let fused = qw.matmul(&x, true).unwrap();
            let unfused = x.matmul(&deq.transpose(&[1, 0]).unwrap()).unwrap();
            assert_close(
                &fused.to_vec_f32().unwrap(),
                &unfused.to_vec_f32().unwrap(),
                1e-4,
            );
        }
    }
}

#[test]
fn quantized_matmul_without_transpose_multiplies_by_w_itself() {
    // W: [in 64, out 32] quantized along `out`; x: [2, 64].
    let w = Array::from_f32(&pseudo_random(64 * 32, 81), &[64, 32]).unwrap();
    let qw = QuantizedWeight::quantize(&w, 32, 4).unwrap();
    let x = Array::from_f32(&pseudo_random(2 * 64, 82), &[2, 64]).unwrap();
    let fused = qw.matmul(&x, false).unwrap();
    assert_eq!(fused.shape(), [2, 32]);
    let unfused = x.matmul(&qw.dequantize().unwrap()).unwrap();
    assert_close(
        &fused.to_vec_f32().unwrap(),
        &unfused.to_vec_f32().unwrap(),
        1e-4,
    );
}
