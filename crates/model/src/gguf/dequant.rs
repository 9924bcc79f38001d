//! Dequantization of GGUF tensors exactly as llama.cpp does it (`dequantize_row_q4_0` & co. in
//! ggml-quants.c), and the lossless mapping of its blocks onto MLX-style affine groups (of 32
//! elements, or of 16 for Q6_K, Q3_K and Q2_K). MXFP4 is an affine group too: its doubled E2M1
//! values are integers in −12..12 and its scale a power of two (`mxfp4_scale`).

use half::bf16;

use crate::gguf::types::GgmlType;

/// One group of a block as affine quantization: `value[i] = scale * q[i] + bias` for
/// `i < len` (32, or 16 for Q6_K, Q3_K and Q2_K; `q[len..]` is zero).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffineBlock {
    /// Unsigned quantized values (`< 16` for 4-bit types, any `u8` for Q8_0).
    pub q: [u8; 32],
    /// Elements in the group: [`affine_group_size`] of the type.
    pub len: usize,
    pub scale: f32,
    pub bias: f32,
}

impl AffineBlock {
    /// The group's quantized values.
    pub fn values(&self) -> &[u8] {
        &self.q[..self.len]
    }
}

/// Bits of the affine form of a block-quantized type, for the types that map onto affine groups
/// without loss. Q5_0, Q5_1, Q5_K and Q6_K take 8 bits (their 5- or 6-bit values unchanged);
/// Q3_K and Q2_K take 4 (their 3- and 2-bit values unchanged); MXFP4 takes 8 (its doubled values
/// plus 16, 4..=28: its 16 codes are not evenly spaced, so they do not fit 4 bits).
pub fn affine_bits(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q3_K | GgmlType::Q2_K => {
            Some(4)
        }
        GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Q8_0
        | GgmlType::MXFP4 => Some(8),
        _ => None,
    }
}

/// Elements per affine group of a type with an affine form: 16 for Q6_K, Q3_K and Q2_K (one
/// scale per 16 elements), 32 for the others. MLX's own group sizes start at 32, so only
/// mlxcel's kernels read the 16-element form.
pub fn affine_group_size(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q6_K | GgmlType::Q3_K | GgmlType::Q2_K => 16,
        _ => 32,
    }
}

/// The affine groups of one block of a type with an affine form ([`affine_bits`]), in order:
/// one for the 32-element types, eight for a Q4_K/Q5_K super-block, sixteen groups of 16 for a
/// Q6_K/Q3_K/Q2_K super-block.
///
/// Every value is `scale · q + bias` with the same f32 arithmetic llama.cpp uses, so it equals
/// llama.cpp's dequantization bit for bit: Q5_0's `(q − 16) · d` is `q · d − 16 d`, both products
/// exact; Q5_1's `q · d + m` as it is; Q4_K/Q5_K's `d1 · q − m1` with `d1 = d · scale` and
/// `m1 = dmin · min` (exact in f32, an 11-bit mantissa times a 6-bit integer) as scale `d1` and
/// bias `−m1` (`x − y` and `x + (−y)` round alike, and `d1 · q` is exact, so a fused multiply-add
/// gives the same bits).
///
/// The 16-element groups, with `s` llama.cpp's per-group f32 product (exact: an f16 times an
/// integer of at most 8 bits):
/// - Q6_K: `s · (q − 32)` with `s = d · scale`, q in 0..63: scale `s`, bias `−32 s`. `s · q` and
///   `32 s` are exact (at most 24 significant bits), and so is their difference `s · (q − 32)`,
///   which llama.cpp computes as one exact product.
/// - Q3_K: `s · v` with `s = d · (scale − 32)`, v in −4..3: q = v + 4, scale `s`, bias `−4 s`;
///   the same argument.
/// - Q2_K: `fl(dl · q) − ml` with `dl = d · (scale & 15)`, `ml = dmin · (scale >> 4)`: scale
///   `dl`, bias `−ml`, as Q4_K (one rounding, after an exact product).
pub fn affine_groups(ty: GgmlType, block: &[u8]) -> Vec<AffineBlock> {
    let mut groups = [AffineBlock::EMPTY; MAX_GROUPS_PER_BLOCK];
    let n = affine_groups_into(ty, block, &mut groups);
    groups[..n].to_vec()
}

/// The most affine groups one block has: sixteen groups of 16 in a K-quant super-block.
pub const MAX_GROUPS_PER_BLOCK: usize = 16;

impl AffineBlock {
    /// A placeholder group (no elements), to initialize buffers for [`affine_groups_into`].
    pub const EMPTY: AffineBlock = AffineBlock {
        q: [0; 32],
        len: 0,
        scale: 0.0,
        bias: 0.0,
    };
}

/// [`affine_groups`] without allocating: writes the block's groups to the front of `out` and
/// returns how many there are (what a converter calls once per block of a whole model).
pub fn affine_groups_into(
    ty: GgmlType,
    block: &[u8],
    out: &mut [AffineBlock; MAX_GROUPS_PER_BLOCK],
) -> usize {
    match ty {
        GgmlType::Q6_K | GgmlType::Q3_K | GgmlType::Q2_K => {
            let mut scales = [(0f32, 0f32); MAX_GROUPS_PER_BLOCK];
            affine_scales_into(ty, block, &mut scales);
            for (g, (out, &(scale, bias))) in out.iter_mut().zip(&scales).enumerate() {
                *out = match ty {
                    GgmlType::Q6_K => group16(scale, bias, |i| q6_k_value(block, 16 * g + i)),
                    GgmlType::Q3_K => {
                        group16(scale, bias, |i| (q3_k_value(block, 16 * g + i) + 4) as u8)
                    }
                    _ => group16(scale, bias, |i| two_bit_field(&block[16..80], 16 * g + i)),
                };
            }
            16
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let d = half_at(block, 0);
            let (bias, q) = if ty == GgmlType::Q5_0 {
                (-16.0 * d, five_bit_quants(&block[2..6], &block[6..22]))
            } else {
                (
                    half_at(block, 2),
                    five_bit_quants(&block[4..8], &block[8..24]),
                )
            };
            out[0] = AffineBlock {
                q,
                len: 32,
                scale: d,
                bias,
            };
            1
        }
        GgmlType::MXFP4 => {
            let (scale, bias) = mxfp4_affine_scale(block[0]);
            let mut q = [0u8; 32];
            for (q, v) in q.iter_mut().zip(mxfp4_values(block)) {
                *q = (v + MXFP4_OFFSET) as u8;
            }
            out[0] = AffineBlock {
                q,
                len: 32,
                scale,
                bias,
            };
            1
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for ((d1, m1, q), out) in q45_k_sub_blocks(ty, block).zip(out.iter_mut()) {
                *out = AffineBlock {
                    q,
                    len: 32,
                    scale: d1,
                    bias: -m1,
                };
            }
            8
        }
        _ => {
            out[0] = to_affine(ty, block);
            1
        }
    }
}

fn half_at(block: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// An f16 (IEEE binary16 bits) widened to f32, exactly, as `half::f16::to_f32` and F16C's
/// `vcvtph2ps` widen it (a NaN keeps its payload and becomes quiet), but inlined: a converter
/// widens every block's scales, and `half`'s call per value cost as much as the rest of the
/// scales' work.
#[inline]
fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1F;
    let mant = u32::from(h & 0x3FF);
    match (exp, mant) {
        (0, 0) => f32::from_bits(sign),
        // Subnormal: mant · 2⁻²⁴, exact in f32.
        (0, _) => {
            let magnitude = mant as f32 * f32::from_bits(0x3380_0000);
            f32::from_bits(sign | magnitude.to_bits())
        }
        (0x1F, 0) => f32::from_bits(sign | 0x7F80_0000),
        (0x1F, _) => f32::from_bits(sign | 0x7FC0_0000 | (mant << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (mant << 13)),
    }
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
            AffineBlock {
                q,
                len: 32,
                scale: d,
                bias,
            }
        }
        GgmlType::Q8_0 => {
            for (j, &byte) in block[2..34].iter().enumerate() {
                q[j] = (byte as i8 as i16 + 128) as u8;
            }
            AffineBlock {
                q,
                len: 32,
                scale: d,
                bias: -128.0 * d,
            }
        }
        other => unreachable!("to_affine called with non-block type {other}"),
    }
}

/// Dequantizes `data` (a whole tensor of a readable type) to f32 the way llama.cpp does
/// (`dequantize_row_*` in ggml-quants.c): the same products in the same order, so the values are
/// bit for bit llama.cpp's. Returns `None` for types mlxcel does not read, and for data that is
/// not whole blocks of the type (a short or malformed tensor).
pub fn dequantize_reference(ty: GgmlType, data: &[u8]) -> Option<Vec<f32>> {
    let (block_len, block_bytes) = ty.layout()?;
    if !data.len().is_multiple_of(block_bytes) {
        return None;
    }
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
            GgmlType::Q5_0 => {
                let d = half_at(block, 0);
                let q = five_bit_quants(&block[2..6], &block[6..22]);
                out.extend(q.iter().map(|&q| (q as i32 - 16) as f32 * d));
            }
            GgmlType::Q5_1 => {
                let (d, m) = (half_at(block, 0), half_at(block, 2));
                let q = five_bit_quants(&block[4..8], &block[8..24]);
                out.extend(q.iter().map(|&q| q as f32 * d + m));
            }
            GgmlType::Q8_0 => {
                let d = half_at(block, 0);
                out.extend(block[2..34].iter().map(|&q| (q as i8) as f32 * d));
            }
            GgmlType::Q2_K => out.extend_from_slice(&dequantize_q2_k(block)),
            GgmlType::Q3_K => out.extend_from_slice(&dequantize_q3_k(block)),
            GgmlType::Q4_K | GgmlType::Q5_K => out.extend_from_slice(&dequantize_q45_k(ty, block)),
            GgmlType::Q6_K => out.extend_from_slice(&dequantize_q6_k(block)),
            GgmlType::MXFP4 => {
                // `kvalues_mxfp4[code] * d`: an int8 widened to f32, times the halved scale.
                let d = mxfp4_scale(block[0]);
                out.extend(mxfp4_values(block).iter().map(|&v| f32::from(v) * d));
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The 5-bit values of a Q5_0/Q5_1 block: element `j` takes its low four bits from nibble `j`
/// of `qs` (low nibbles for 0..16, high for 16..32) and its fifth bit from bit `j` of `qh`.
fn five_bit_quants(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((high >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((high >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// MXFP4's E2M1 values by 4-bit code, doubled so that they are integers (llama.cpp's
/// `kvalues_mxfp4`): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negations, times two. Code 8 is
/// E2M1's −0, which llama.cpp reads as +0.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// What the affine form adds to a doubled MXFP4 value to make its code (4..=28, five bits): a
/// power of two, so that the bias is `−16 · scale` exactly and mlxcel's int8 layout can derive it
/// from the scale ([`bias_multiple`]).
const MXFP4_OFFSET: i8 = 16;

/// The largest MXFP4 scale byte whose block has an affine form. Above it the values reach 2^124
/// and a block's span (up to 24 · 2^124 = 1.5 · 2^128) no longer fits an f32 `scale · q`: no
/// affine group holds such a block ([`affine_form_refusal`]). Real weights sit near 2^−7
/// (bytes near 120).
pub const MXFP4_MAX_AFFINE_SCALE_BYTE: u8 = 251;

/// An MXFP4 block's scale from its E8M0 byte `e`, halved because the values are doubled:
/// `2^(e − 128)`, llama.cpp's `ggml_e8m0_to_fp32_half`. Bytes 0 and 1 give the f32 subnormals
/// 2^−128 and 2^−127; byte 255 gives 2^127 (the OCP format's NaN encoding, which llama.cpp does
/// not treat as NaN: its products with codes of magnitude 2 and more overflow to ±∞ instead,
/// as do byte 254's with magnitude 4 and more).
pub fn mxfp4_scale(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        u32::from(e - 1) << 23
    })
}

/// The 32 doubled values of an MXFP4 block (17 bytes: the scale byte, then `qs[16]`): element
/// `j` from the low nibble of `qs[j]`, element `j + 16` from its high nibble.
fn mxfp4_values(block: &[u8]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for (j, &byte) in block[1..17].iter().enumerate() {
        v[j] = MXFP4_VALUES[usize::from(byte & 0x0F)];
        v[j + 16] = MXFP4_VALUES[usize::from(byte >> 4)];
    }
    v
}

/// The affine scale and bias of an MXFP4 block with scale byte `e`: `2^(e − 128)` and `−16`
/// times it, both exact, so `fl(fl(scale · q) + bias)` (or a fused multiply-add) is
/// `(q − 16) · scale` exactly, llama.cpp's value bit for bit (never −0: llama.cpp's zero is
/// `0 · d` with `d > 0`). Above [`MXFP4_MAX_AFFINE_SCALE_BYTE`] there is no such form: NaN
/// scale and bias, so that nothing finite and wrong comes out of a block a reader should have
/// refused ([`affine_form_refusal`]).
fn mxfp4_affine_scale(e: u8) -> (f32, f32) {
    if e > MXFP4_MAX_AFFINE_SCALE_BYTE {
        return (f32::NAN, f32::NAN);
    }
    let d = mxfp4_scale(e);
    (d, -f32::from(MXFP4_OFFSET) * d)
}

/// Why `data`, a whole tensor of `ty`, has no exact affine form, naming its first block that
/// has none; `None` when every block has one, as every block of every type but MXFP4 does. An
/// MXFP4 block with a scale byte above [`MXFP4_MAX_AFFINE_SCALE_BYTE`] has none (its values
/// reach 2^124; llama.cpp's own products overflow to ±∞ from byte 253 on), so a reader that
/// converts to the affine form refuses such a tensor with this reason.
pub fn affine_form_refusal(ty: GgmlType, data: &[u8]) -> Option<String> {
    if ty != GgmlType::MXFP4 {
        return None;
    }
    let (_, block_bytes) = ty.layout()?;
    let (at, block) = data
        .chunks_exact(block_bytes)
        .enumerate()
        .find(|(_, block)| block[0] > MXFP4_MAX_AFFINE_SCALE_BYTE)?;
    Some(format!(
        "MXFP4 block {at} has scale byte {e} (2^{p}): values of 2^124 and more have no exact \
         affine form (scale bytes up to {MXFP4_MAX_AFFINE_SCALE_BYTE} are read; real weights \
         use bytes near 120)",
        e = block[0],
        p = i32::from(block[0]) - 128,
    ))
}

/// The 2-bit field of element `e` of a 256-element super-block whose values are packed four to
/// a byte, 32 bytes per 128 elements (Q2_K and Q3_K's low bits): byte `32 · (e / 128) + e % 32`,
/// shifted by `2 · (e % 128 / 32)`.
fn two_bit_field(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3
}

/// A 16-element affine group from its values (`q[e]` for element `e` of the group).
fn group16(scale: f32, bias: f32, q: impl Fn(usize) -> u8) -> AffineBlock {
    let mut values = [0u8; 32];
    for (e, v) in values[..16].iter_mut().enumerate() {
        *v = q(e);
    }
    AffineBlock {
        q: values,
        len: 16,
        scale,
        bias,
    }
}

/// Q2_K (84 bytes): 16 groups of 16, each with a 4-bit scale and a 4-bit min (`scales[16]`),
/// the 2-bit values (`qs[64]`), then the super-block's `d` and `dmin` (f16):
/// `(d · scale) · q − (dmin · min)`.
fn dequantize_q2_k(block: &[u8]) -> [f32; 256] {
    let (scales, qs) = (&block[0..16], &block[16..80]);
    let (d, dmin) = (half_at(block, 80), half_at(block, 82));
    let mut y = [0f32; 256];
    for (e, y) in y.iter_mut().enumerate() {
        let sc = scales[e / 16];
        let dl = d * (sc & 0x0F) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *y = dl * two_bit_field(qs, e) as f32 - ml;
    }
    y
}

/// Q3_K (110 bytes): a high-bit mask (`hmask[32]`, element `e` at bit `e / 32` of byte `e % 32`),
/// the low 2 bits (`qs[64]`), 16 six-bit scales packed in 12 bytes, then `d` (f16). The value is
/// `(d · (scale − 32)) · (q − 4 · (1 − high bit))`.
fn dequantize_q3_k(block: &[u8]) -> [f32; 256] {
    let d = half_at(block, 108);
    let mut y = [0f32; 256];
    for (e, y) in y.iter_mut().enumerate() {
        let dl = d * q3_k_scale(&block[96..108], e / 16) as f32;
        *y = dl * q3_k_value(block, e) as f32;
    }
    y
}

/// The signed 6-bit scale of group `g` of a Q3_K super-block, minus 32: low four bits from
/// nibble `g / 8` of byte `g % 8`, high two from bits `2 · (g / 4)` of byte `8 + g % 4`.
fn q3_k_scale(packed: &[u8], g: usize) -> i32 {
    let low = (packed[g % 8] >> (4 * (g / 8))) & 0x0F;
    let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 0x03;
    (low | (high << 4)) as i32 - 32
}

/// Element `e`'s value of a Q3_K super-block, in −4..3: the low two bits minus 4 when its bit of
/// the high mask is clear.
fn q3_k_value(block: &[u8], e: usize) -> i32 {
    let (hmask, qs) = (&block[0..32], &block[32..96]);
    let missing_high = 1 - ((hmask[e % 32] >> (e / 32)) & 1) as i32;
    two_bit_field(qs, e) as i32 - 4 * missing_high
}

/// The 6-bit scale and min of sub-block `j` (of 8) of a Q4_K/Q5_K super-block, packed in 12 bytes
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, packed: &[u8]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// The 8 sub-blocks of 32 of a Q4_K (144 bytes: `d`, `dmin`, 12 bytes of scales and mins,
/// `qs[128]`) or Q5_K (176: the same with `qh[32]` before `qs`) super-block, as llama.cpp's
/// `d1 = d · scale`, `m1 = dmin · min` and the 4- or 5-bit values. Sub-block `s` takes nibble
/// `s % 2` of bytes `32 · (s / 2) ..`; Q5_K's fifth bit of its element `l` is bit `s` of `qh[l]`.
fn q45_k_sub_blocks(ty: GgmlType, block: &[u8]) -> impl Iterator<Item = (f32, f32, [u8; 32])> {
    let (d, dmin) = (half_at(block, 0), half_at(block, 2));
    let packed = &block[4..16];
    let (qh, qs) = if ty == GgmlType::Q5_K {
        (Some(&block[16..48]), &block[48..176])
    } else {
        (None, &block[16..144])
    };
    (0..8).map(move |s| {
        let (sc, m) = scale_min_k4(s, packed);
        let mut q = [0u8; 32];
        for (l, q) in q.iter_mut().enumerate() {
            *q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
            if let Some(qh) = qh {
                *q |= ((qh[l] >> s) & 1) << 4;
            }
        }
        (d * sc as f32, dmin * m as f32, q)
    })
}

/// Q4_K and Q5_K: `d1 · q − m1` per sub-block of 32.
fn dequantize_q45_k(ty: GgmlType, block: &[u8]) -> [f32; 256] {
    let mut y = [0f32; 256];
    for ((d1, m1, q), y) in q45_k_sub_blocks(ty, block).zip(y.chunks_exact_mut(32)) {
        for (y, &q) in y.iter_mut().zip(&q) {
            *y = d1 * q as f32 - m1;
        }
    }
    y
}

/// Q6_K (210 bytes): the low four bits (`ql[128]`), the high two (`qh[64]`), 16 signed 8-bit
/// scales of 16-element groups, then `d` (f16): `(d · scale) · (q − 32)`. In each half of 128,
/// element `h` takes nibble `h / 64` of `ql[64 · half + h % 64]` and bits `2 · (h / 32)` of
/// `qh[32 · half + h % 32]`.
fn dequantize_q6_k(block: &[u8]) -> [f32; 256] {
    let d = half_at(block, 208);
    let mut y = [0f32; 256];
    for (e, y) in y.iter_mut().enumerate() {
        let q = q6_k_value(block, e) as i32 - 32;
        *y = d * (block[192 + e / 16] as i8) as f32 * q as f32;
    }
    y
}

/// Element `e`'s stored 6-bit value (0..63) of a Q6_K super-block.
fn q6_k_value(block: &[u8], e: usize) -> u8 {
    let (ql, qh) = (&block[0..128], &block[128..192]);
    let (half, h) = (e / 128, e % 128);
    let low = (ql[64 * half + h % 64] >> (4 * (h / 64))) & 0x0F;
    let high = (qh[32 * half + h % 32] >> (2 * (h / 32))) & 0x03;
    low | (high << 4)
}

/// The `(scale, bias)` of each affine group of one block, as [`affine_groups`] gives them,
/// without unpacking the values; returns how many groups the block has.
pub(crate) fn affine_scales_into(
    ty: GgmlType,
    block: &[u8],
    out: &mut [(f32, f32); MAX_GROUPS_PER_BLOCK],
) -> usize {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (half_at(block, 0), half_at(block, 2));
            for (s, out) in out[..8].iter_mut().enumerate() {
                let (sc, m) = scale_min_k4(s, &block[4..16]);
                *out = (d * sc as f32, -(dmin * m as f32));
            }
            8
        }
        GgmlType::Q6_K => {
            let d = half_at(block, 208);
            for (g, out) in out.iter_mut().enumerate() {
                let s = d * (block[192 + g] as i8) as f32;
                *out = (s, -32.0 * s);
            }
            16
        }
        GgmlType::Q3_K => {
            let d = half_at(block, 108);
            for (g, out) in out.iter_mut().enumerate() {
                let s = d * q3_k_scale(&block[96..108], g) as f32;
                *out = (s, -4.0 * s);
            }
            16
        }
        GgmlType::Q2_K => {
            let (d, dmin) = (half_at(block, 80), half_at(block, 82));
            for (g, out) in out.iter_mut().enumerate() {
                let sc = block[g];
                *out = (d * (sc & 0x0F) as f32, -(dmin * (sc >> 4) as f32));
            }
            16
        }
        GgmlType::Q4_0 => {
            let d = half_at(block, 0);
            out[0] = (d, -8.0 * d);
            1
        }
        GgmlType::Q8_0 => {
            let d = half_at(block, 0);
            out[0] = (d, -128.0 * d);
            1
        }
        GgmlType::Q5_0 => {
            let d = half_at(block, 0);
            out[0] = (d, -16.0 * d);
            1
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            out[0] = (half_at(block, 0), half_at(block, 2));
            1
        }
        GgmlType::MXFP4 => {
            out[0] = mxfp4_affine_scale(block[0]);
            1
        }
        _ => {
            let mut groups = [AffineBlock::EMPTY; MAX_GROUPS_PER_BLOCK];
            let n = affine_groups_into(ty, block, &mut groups);
            for (out, g) in out.iter_mut().zip(&groups[..n]) {
                *out = (g.scale, g.bias);
            }
            n
        }
    }
}

/// The bias of every affine group of `ty` as a fixed multiple of its scale, for the types whose
/// codes are signed values stored with an offset (the bias is `−offset · scale`, one exact f32
/// product): Q4_0 −8, Q5_0 −16, Q8_0 −128, Q6_K −32, Q3_K −4, MXFP4 −16. `None` for the types
/// that store a bias (Q4_1, Q5_1, Q4_K, Q5_K, Q2_K) and for types without an affine form.
pub fn bias_multiple(ty: GgmlType) -> Option<f32> {
    match ty {
        GgmlType::Q4_0 => Some(-8.0),
        GgmlType::Q5_0 | GgmlType::MXFP4 => Some(-16.0),
        GgmlType::Q8_0 => Some(-128.0),
        GgmlType::Q6_K => Some(-32.0),
        GgmlType::Q3_K => Some(-4.0),
        _ => None,
    }
}

/// One block's affine scales and biases in the form the block stores them, from which
/// [`affine_scales_into`]'s f32 values follow exactly: what a layout that keeps the scales
/// compact needs, with no search for a factoring.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExactScales {
    /// A 32-element type's one group: its scale is the f16 `scale` (bits) widened; its bias the
    /// f16 `bias` widened (Q4_1, Q5_1), or `bias_multiple · scale` (Q4_0, Q5_0, Q8_0).
    Half { scale: u16, bias: Option<u16> },
    /// An MXFP4 block's one group: its scale is `scale` (a power of two, [`mxfp4_scale`]), its
    /// bias `bias_multiple · scale`.
    Single { scale: f32 },
    /// A K-quant super-block's groups (eight of 32 for Q4_K/Q5_K, sixteen of 16 for Q6_K, Q3_K,
    /// Q2_K): group `g`'s scale is `d · c[g]` (f32 product of the f16 super-block scale and an
    /// integer sub-scale), its bias `bias.0 · bias.1[g]` (Q4_K, Q5_K, Q2_K: the negated f16 `dmin`
    /// times the integer minimum) or `bias_multiple · scale` (Q6_K, Q3_K).
    Factored {
        d: f32,
        c: [i8; MAX_GROUPS_PER_BLOCK],
        bias: Option<(f32, [i8; MAX_GROUPS_PER_BLOCK])>,
    },
}

/// Where a block of `ty` keeps its [`ExactScales::Half`] scales: the byte offset of its f16
/// scale and, for the types with a stored bias (Q4_1, Q5_1), of its f16 bias; `None` for the
/// types whose scales take another form.
pub fn half_scale_at(ty: GgmlType) -> Option<(usize, Option<usize>)> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => Some((0, None)),
        GgmlType::Q4_1 | GgmlType::Q5_1 => Some((0, Some(2))),
        _ => None,
    }
}

/// [`ExactScales`] of one block of `ty`; `None` for a type without an affine form, for a
/// Q4_K/Q5_K/Q2_K block whose `dmin` is not finite (a NaN's sign would then depend on where the
/// negation is applied), and for an MXFP4 block without an affine form ([`affine_form_refusal`]).
///
/// Every product is the one [`affine_scales_into`] computes, so the values agree bit for bit:
/// Q4_K's bias `−(dmin · m)` is `(−dmin) · m` (negation commutes with rounding).
pub fn exact_scales(ty: GgmlType, block: &[u8]) -> Option<ExactScales> {
    let bits = |at: usize| u16::from_le_bytes([block[at], block[at + 1]]);
    let mut c = [0i8; MAX_GROUPS_PER_BLOCK];
    let mut m = [0i8; MAX_GROUPS_PER_BLOCK];
    if let Some((scale, bias)) = half_scale_at(ty) {
        return Some(ExactScales::Half {
            scale: bits(scale),
            bias: bias.map(bits),
        });
    }
    Some(match ty {
        GgmlType::MXFP4 if block[0] <= MXFP4_MAX_AFFINE_SCALE_BYTE => ExactScales::Single {
            scale: mxfp4_scale(block[0]),
        },
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for g in 0..8 {
                let (sc, min) = scale_min_k4(g, &block[4..16]);
                (c[g], m[g]) = (sc as i8, min as i8);
            }
            let dmin = half_at(block, 2);
            if !dmin.is_finite() {
                return None;
            }
            ExactScales::Factored {
                d: half_at(block, 0),
                c,
                bias: Some((-dmin, m)),
            }
        }
        GgmlType::Q6_K => {
            for (g, c) in c.iter_mut().enumerate() {
                *c = block[192 + g] as i8;
            }
            ExactScales::Factored {
                d: half_at(block, 208),
                c,
                bias: None,
            }
        }
        GgmlType::Q3_K => {
            for (g, c) in c.iter_mut().enumerate() {
                *c = q3_k_scale(&block[96..108], g) as i8;
            }
            ExactScales::Factored {
                d: half_at(block, 108),
                c,
                bias: None,
            }
        }
        GgmlType::Q2_K => {
            for g in 0..16 {
                (c[g], m[g]) = ((block[g] & 0x0F) as i8, (block[g] >> 4) as i8);
            }
            let dmin = half_at(block, 82);
            if !dmin.is_finite() {
                return None;
            }
            ExactScales::Factored {
                d: half_at(block, 80),
                c,
                bias: Some((-dmin, m)),
            }
        }
        _ => return None,
    })
}

/// Eight 4-bit values, one in the low nibble of each byte of `x` (byte `i` = value `i`), packed
/// into one little-endian word as [`crate::pack`] packs 4-bit values (value `i` at bits `4 i`).
fn pack_nibbles(x: u64) -> u32 {
    let x = x & 0x0F0F_0F0F_0F0F_0F0F;
    let x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
    let x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    ((x | (x >> 16)) & 0xFFFF_FFFF) as u32
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Q4_0's and Q4_1's 16 bytes of nibbles: values 0..16 are the low nibbles, 16..32 the high ones.
#[inline]
fn pack_q4_legacy(qs: &[u8], out: &mut [u8]) {
    for w in 0..4 {
        let x = u64_at(qs, 8 * (w % 2)) >> (4 * (w / 2) as u32);
        out[4 * w..4 * w + 4].copy_from_slice(&pack_nibbles(x).to_le_bytes());
    }
}

/// Q8_0: the signed values stored as `q + 128`.
#[inline]
fn pack_q8_0(block: &[u8], out: &mut [u8]) {
    for (o, &b) in out[..32].iter_mut().zip(&block[2..34]) {
        *o = b ^ 0x80;
    }
}

/// MXFP4's codes by 4-bit E2M1 code: the doubled value plus [`MXFP4_OFFSET`] (what
/// [`mxfp4_code`] computes; the test compares them).
#[cfg(test)]
const MXFP4_CODES: [u8; 16] = {
    let mut codes = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        codes[i] = (MXFP4_VALUES[i] + MXFP4_OFFSET) as u8;
        i += 1;
    }
    codes
};

/// [`MXFP4_CODES`]`[n]` for a 4-bit E2M1 code `n`, computed with byte compares, selects and
/// adds only, so that a loop over a block's 16 bytes vectorizes (a table lookup per nibble does
/// not: it was most of a gpt-oss load's packing time). The magnitude `m = n & 7` doubled is `m`
/// below 4, `2m − 4` for 4 and 5 (4, 6), `4m − 16` for 6 and 7 (8, 12); the sign bit `n & 8`
/// subtracts it from 16 instead of adding it. The same bytes as the table for every `n`
/// (a test compares all 16).
#[inline(always)]
fn mxfp4_code(n: u8) -> u8 {
    let m = n & 7;
    let doubled = if m < 4 {
        m
    } else if m < 6 {
        m.wrapping_mul(2).wrapping_sub(4)
    } else {
        m.wrapping_mul(4).wrapping_sub(16)
    };
    if n & 8 == 0 {
        16u8.wrapping_add(doubled)
    } else {
        16u8.wrapping_sub(doubled)
    }
}

/// MXFP4, 8-bit: the packed bytes are the doubled values plus 16 ([`mxfp4_values`]' order).
#[inline]
fn pack_mxfp4(block: &[u8], out: &mut [u8]) {
    let bytes: &[u8; 16] = block[1..17]
        .try_into()
        .expect("an MXFP4 block holds 17 bytes");
    let (low, high) = out[..32].split_at_mut(16);
    let (low, high): (&mut [u8; 16], &mut [u8; 16]) = (
        low.try_into().expect("16 bytes"),
        high.try_into().expect("16 bytes"),
    );
    for i in 0..16 {
        low[i] = mxfp4_code(bytes[i] & 0x0F);
        high[i] = mxfp4_code(bytes[i] >> 4);
    }
}

/// [`pack_block`] for each block of a row of `ty` (`out` holds the row's packed bytes), the
/// type's branch taken once rather than per block: a load's hot loop for the common types.
pub fn pack_row(ty: GgmlType, row: &[u8], out: &mut [u8]) {
    let (Some((len, block_bytes)), Some(bits)) = (ty.layout(), affine_bits(ty)) else {
        return;
    };
    let blocks = row
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(len * bits as usize / 8));
    match ty {
        GgmlType::Q4_0 => blocks.for_each(|(b, o)| pack_q4_legacy(&b[2..18], o)),
        GgmlType::Q4_1 => blocks.for_each(|(b, o)| pack_q4_legacy(&b[4..20], o)),
        GgmlType::Q8_0 => blocks.for_each(|(b, o)| pack_q8_0(b, o)),
        GgmlType::MXFP4 => blocks.for_each(|(b, o)| pack_mxfp4(b, o)),
        _ => blocks.for_each(|(b, o)| pack_block(ty, b, o)),
    }
}

/// Writes one block's values packed as its affine form's weight ([`affine_bits`] bits per value,
/// groups in order, packed as [`crate::pack`] packs them) to `out`, which holds exactly
/// `values × bits / 8` bytes: the same bytes as packing [`affine_groups`]' values, straight from
/// the block's bits for the common types.
pub fn pack_block(ty: GgmlType, block: &[u8], out: &mut [u8]) {
    match ty {
        GgmlType::Q4_K => {
            // Sub-block s: nibble s % 2 of bytes 32 · (s / 2) .. + 32.
            let qs = &block[16..144];
            for s in 0..8 {
                let shift = 4 * (s % 2) as u32;
                for w in 0..4 {
                    let x = u64_at(qs, 32 * (s / 2) + 8 * w) >> shift;
                    let at = 16 * s + 4 * w;
                    out[at..at + 4].copy_from_slice(&pack_nibbles(x).to_le_bytes());
                }
            }
        }
        GgmlType::Q4_0 => pack_q4_legacy(&block[2..18], out),
        GgmlType::Q4_1 => pack_q4_legacy(&block[4..20], out),
        GgmlType::Q8_0 => pack_q8_0(block, out),
        GgmlType::MXFP4 => pack_mxfp4(block, out),
        GgmlType::Q6_K => {
            // 8-bit: the packed bytes are the values. Each half of 128 takes 64 bytes of the low
            // nibbles and 32 of the high bits (layout at `dequantize_q6_k`).
            for half in 0..2 {
                let ql = &block[64 * half..64 * half + 64];
                let qh = &block[128 + 32 * half..128 + 32 * half + 32];
                let out = &mut out[128 * half..128 * half + 128];
                for l in 0..32 {
                    let h = qh[l];
                    out[l] = (ql[l] & 0x0F) | ((h & 3) << 4);
                    out[l + 32] = (ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4);
                    out[l + 64] = (ql[l] >> 4) | (((h >> 4) & 3) << 4);
                    out[l + 96] = (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4);
                }
            }
        }
        GgmlType::Q5_K => {
            // 8-bit: sub-block s takes nibble s % 2 of qs and bit s of qh.
            let (qh, qs) = (&block[16..48], &block[48..176]);
            for s in 0..8 {
                let shift = 4 * (s % 2);
                for l in 0..32 {
                    out[32 * s + l] =
                        ((qs[32 * (s / 2) + l] >> shift) & 0x0F) | (((qh[l] >> s) & 1) << 4);
                }
            }
        }
        _ => {
            let mut groups = [AffineBlock::EMPTY; MAX_GROUPS_PER_BLOCK];
            let n = affine_groups_into(ty, block, &mut groups);
            let bits = affine_bits(ty).expect("a type with an affine form") as usize;
            let per_word = 32 / bits;
            let mut at = 0;
            for group in &groups[..n] {
                for chunk in group.values().chunks_exact(per_word) {
                    let word = chunk
                        .iter()
                        .enumerate()
                        .fold(0u32, |w, (i, &q)| w | (u32::from(q) << (bits * i)));
                    out[at..at + 4].copy_from_slice(&word.to_le_bytes());
                    at += 4;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The computed MXFP4 codes are the table's, the doubled E2M1 value plus 16, for every
    /// 4-bit code, and a whole block packs as the table packs it.
    #[test]
    fn mxfp4_codes_computed_match_the_table() {
        for n in 0..16u8 {
            assert_eq!(mxfp4_code(n), MXFP4_CODES[usize::from(n)], "code {n}");
        }
        let mut block = [0u8; 17];
        for (i, b) in block.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        let mut packed = [0u8; 32];
        pack_mxfp4(&block, &mut packed);
        for i in 0..16 {
            assert_eq!(packed[i], MXFP4_CODES[usize::from(block[1 + i] & 0x0F)]);
            assert_eq!(packed[16 + i], MXFP4_CODES[usize::from(block[1 + i] >> 4)]);
        }
    }

    /// Every f16 widens to the bits `half` gives it.
    #[test]
    fn f16_widening_matches_half_on_every_value() {
        for h in 0..=u16::MAX {
            assert_eq!(
                f16_bits_to_f32(h).to_bits(),
                half::f16::from_bits(h).to_f32().to_bits(),
                "{h:#06x}"
            );
        }
    }

    /// The straight-from-the-bits paths (`pack_block`, `affine_scales_into`, `exact_scales`) give
    /// the bytes and values of the generic path (every group unpacked by `affine_groups`, packed by
    /// `crate::pack`), on random blocks of every type with an affine form.
    #[test]
    fn fast_packing_and_scales_match_the_unpacked_groups() {
        let types = [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::MXFP4,
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for ty in types {
            let (block_len, block_bytes) = ty.layout().unwrap();
            let bits = affine_bits(ty).unwrap();
            for _ in 0..200 {
                let block: Vec<u8> = (0..block_bytes).map(|_| next() as u8).collect();
                let groups = affine_groups(ty, &block);
                let expected: Vec<u8> = groups
                    .iter()
                    .flat_map(|g| crate::pack(g.values(), bits))
                    .flat_map(|w| w.to_le_bytes())
                    .collect();
                let mut packed = vec![0u8; block_len * bits as usize / 8];
                pack_block(ty, &block, &mut packed);
                assert_eq!(packed, expected, "{ty}");
                let mut scales = [(0f32, 0f32); MAX_GROUPS_PER_BLOCK];
                let n = affine_scales_into(ty, &block, &mut scales);
                assert_eq!(n, groups.len(), "{ty}");
                // Bit for bit, except that a NaN (random bits make f16 NaN scales) may come with
                // either sign: which operand's NaN a product keeps depends on the generated code
                // (on an AMD Zen 3 machine the two paths' signs differed), and the weights are NaN
                // either way.
                let same =
                    |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                for (g, &(scale, bias)) in groups.iter().zip(&scales[..n]) {
                    assert!(same(g.scale, scale), "{ty} scale {} {}", g.scale, scale);
                    assert!(same(g.bias, bias), "{ty} bias {} {}", g.bias, bias);
                }
                // The exact form gives the same f32 values, each with one product.
                let Some(form) = exact_scales(ty, &block) else {
                    if ty == GgmlType::MXFP4 {
                        assert!(
                            block[0] > MXFP4_MAX_AFFINE_SCALE_BYTE,
                            "MXFP4: no exact form"
                        );
                        assert!(scales[0].0.is_nan() && scales[0].1.is_nan());
                        continue;
                    }
                    let dmin = match ty {
                        GgmlType::Q4_K | GgmlType::Q5_K => half_at(&block, 2),
                        GgmlType::Q2_K => half_at(&block, 82),
                        _ => panic!("{ty}: no exact form"),
                    };
                    assert!(!dmin.is_finite(), "{ty}: no exact form for a finite dmin");
                    continue;
                };
                let exact: Vec<(f32, f32)> = match form {
                    ExactScales::Half { scale, bias } => {
                        let scale = f16_bits_to_f32(scale);
                        let bias = match bias {
                            Some(b) => f16_bits_to_f32(b),
                            None => bias_multiple(ty).unwrap() * scale,
                        };
                        vec![(scale, bias)]
                    }
                    ExactScales::Single { scale } => {
                        vec![(scale, bias_multiple(ty).unwrap() * scale)]
                    }
                    ExactScales::Factored { d, c, bias } => (0..n)
                        .map(|g| {
                            let scale = d * f32::from(c[g]);
                            let bias = match bias {
                                Some((bd, bc)) => bd * f32::from(bc[g]),
                                None => bias_multiple(ty).unwrap() * scale,
                            };
                            (scale, bias)
                        })
                        .collect(),
                };
                let stores_bias = matches!(
                    form,
                    ExactScales::Half { bias: Some(_), .. }
                        | ExactScales::Factored { bias: Some(_), .. }
                );
                assert_eq!(bias_multiple(ty).is_some(), !stores_bias, "{ty}");
                assert_eq!(exact.len(), n, "{ty}");
                for (&(s, b), &(es, eb)) in scales[..n].iter().zip(&exact) {
                    assert_eq!(s.to_bits(), es.to_bits(), "{ty} exact scale");
                    assert_eq!(b.to_bits(), eb.to_bits(), "{ty} exact bias");
                }
            }
        }
    }
}
