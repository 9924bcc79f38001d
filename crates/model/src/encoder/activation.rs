//! How llama.cpp's CPU matmuls round a linear layer's input for the weight's type: the input row
//! is converted to the weight's "dot type" before the products, f16 for F16 weights and Q8_0 for
//! Q8_0 weights (`vec_dot_type` in ggml-cpu; AVX2's `quantize_row_q8_0`: per block of 32, the
//! scale `max|x| / 127` stored as f16, each value `x · 127 / max|x|` rounded half to even). An
//! encoder computed in f32 rounds its activations the same way so that its scores are
//! llama.cpp's; other weight types are multiplied in f32 (llama.cpp rounds those to Q8_1 or Q8_K,
//! which mlxcel does not emulate).

use half::f16;

use crate::gguf::GgmlType;

/// Rounds `row` (one input row of a linear layer whose weights are of type `ty`) as llama.cpp's
/// CPU matmul does; a no-op for types it multiplies in f32 or that mlxcel does not emulate. A
/// Q8_0 row whose length is not whole blocks is left as it is (llama.cpp refuses such weights).
pub fn round_activations(ty: GgmlType, row: &mut [f32]) {
    match ty {
        GgmlType::F16 => {
            for x in row.iter_mut() {
                *x = f16::from_f32(*x).to_f32();
            }
        }
        GgmlType::Q8_0 if row.len().is_multiple_of(32) => {
            for block in row.chunks_exact_mut(32) {
                let max = block.iter().fold(0f32, |m, x| m.max(x.abs()));
                let d = f16::from_f32(max / 127.0).to_f32();
                let id = if max != 0.0 { 127.0 / max } else { 0.0 };
                for x in block.iter_mut() {
                    *x = (*x * id).round_ties_even() * d;
                }
            }
        }
        _ => {}
    }
}

/// Whether [`round_activations`] changes rows for weights of type `ty`.
pub fn rounds_activations(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F16 | GgmlType::Q8_0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_and_q8_0_rows_round_as_llama_cpp_and_others_stay() {
        let mut row: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 7.0).collect();
        let original = row.clone();
        round_activations(GgmlType::F32, &mut row);
        assert_eq!(row, original);
        round_activations(GgmlType::Q4_K, &mut row);
        assert_eq!(row, original);
        let mut half = original.clone();
        round_activations(GgmlType::F16, &mut half);
        assert!(
            half.iter()
                .zip(&original)
                .all(|(a, b)| (a - b).abs() <= b.abs() / 1024.0)
        );
        assert_ne!(half, original);
        let mut q8 = original.clone();
        round_activations(GgmlType::Q8_0, &mut q8);
        // max |x| = 15.5/7 maps to ±127 exactly (times the f16 scale); every value is a multiple
        // of the scale.
        let d = f16::from_f32(15.5 / 7.0 / 127.0).to_f32();
        assert_eq!(q8[0], -127.0 * d);
        assert!(q8.iter().all(|x| (x / d - (x / d).round()).abs() < 1e-3));
        assert!(
            q8.iter()
                .zip(&original)
                .all(|(a, b)| (a - b).abs() <= 0.51 * d + 1e-6)
        );
    }
}
