//! Dequantization of GGUF tensors exactly as llama.cpp does it (`dequantize_row_q4_0` & co. in
//! ggml-quants.c), and the lossless mapping of its 32-element blocks onto MLX affine groups.

use half::{bf16, f16};

use crate::gguf::types::GgmlType;

/// One 32-element block as MLX affine quantization: `value[i] = scale * q[i] + bias`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffineBlock {
    /// Unsigned quantized values (`< 16` for 4-bit types, any `u8` for Q8_0).
    pub q: [u8; 32],
    pub scale: f32,
    pub bias: f32,
}

/// Bits of the MLX affine form of a block-quantized type.
pub fn affine_bits(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some(4),
        GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

fn half_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// Rewrites one Q4_0 (18 bytes), Q4_1 (20) or Q8_0 (34) block as an affine group of 32.
///
/// Q4_0 stores `(q - 8) * d`, so its bias is `-8 d`; Q8_0 stores signed `q * d`, shifted to
/// unsigned `q + 128` with bias `-128 d`. Both products are exact in f32 (a 4- or 8-bit integer times
/// an 11-bit f16 mantissa), so `scale * q + bias` reproduces llama.cpp's value bit for bit.
pub fn to_affine(ty: GgmlType, block: &[u8]) -> AffineBlock {
    let mut q = [0u8; 32];
    let d = half_at(block, 0);
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (bias, qs) = if ty == GgmlType::Q4_0 {
                (-8.0 * d, &block[2..18])
            } else {
                (half_at(block, 2), &block[4..20])
            };
            for (j, &byte) in qs.iter().enumerate() {
                q[j] = byte & 0x0F;
                q[j + 16] = byte >> 4;
            }
            AffineBlock { q, scale: d, bias }
        }
        GgmlType::Q8_0 => {
            for (j, &byte) in block[2..34].iter().enumerate() {
                q[j] = (byte as i8 as i16 + 128) as u8;
            }
            AffineBlock {
                q,
                scale: d,
                bias: -128.0 * d,
            }
        }
        other => unreachable!("to_affine called with non-block type {other}"),
    }
}

/// Dequantizes `data` (a whole tensor of a supported type) to f32 the way llama.cpp does.
/// Returns `None` for types mlxcel does not import.
pub fn dequantize_reference(ty: GgmlType, data: &[u8]) -> Option<Vec<f32>> {
    let (block_len, block_bytes) = ty.block()?;
    let mut out = Vec::with_capacity(data.len() / block_bytes * block_len);
    for block in data.chunks_exact(block_bytes) {
        match ty {
            GgmlType::F32 => out.push(f32::from_le_bytes([block[0], block[1], block[2], block[3]])),
            GgmlType::F16 => out.push(half_at(block, 0)),
            GgmlType::BF16 => out.push(bf16::from_le_bytes([block[0], block[1]]).to_f32()),
            GgmlType::Q4_0 => {
                let d = half_at(block, 0);
                let qs = &block[2..18];
                let mut y = [0f32; 32];
                for j in 0..16 {
                    y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
                    y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
                }
                out.extend_from_slice(&y);
            }
            GgmlType::Q4_1 => {
                let (d, m) = (half_at(block, 0), half_at(block, 2));
                let qs = &block[4..20];
                let mut y = [0f32; 32];
                for j in 0..16 {
                    y[j] = (qs[j] & 0x0F) as f32 * d + m;
                    y[j + 16] = (qs[j] >> 4) as f32 * d + m;
                }
                out.extend_from_slice(&y);
            }
            GgmlType::Q8_0 => {
                let d = half_at(block, 0);
                out.extend(block[2..34].iter().map(|&q| (q as i8) as f32 * d));
            }
            _ => return None,
        }
    }
    Some(out)
}
