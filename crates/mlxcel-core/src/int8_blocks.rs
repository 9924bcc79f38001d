//! Quantized weights written into the int8 layout straight from a GGUF file's blocks.
//!
//! The general way to a GGUF weight in the int8 layout takes three passes over it: its blocks
//! are converted to MLX's affine form (u32 codes, f32 scales and biases), copied into MLX
//! arrays, then rewritten by [`QuantizedWeight::interleave_int8`], which also searches each
//! super-block's f32 scales for the factoring `d · c` the compact layout stores. Here the layout
//! is written from the blocks in one pass, 16 rows (one tile) at a time: the codes are packed as
//! the affine form packs them and interleaved while they are in cache, and the scales are taken
//! in the form the blocks store them ([`exact_scales`]), searched only where a block's own
//! factoring may not be the general path's (`general_factoring`). The result is
//! [`Int8Layout::Compact`](crate::Int8Layout::Compact) for the same weights: the kernels compute
//! the same bits from it as from the general path's (tests compare the two).
//!
//! MXFP4 takes the layout without loss too: its doubled E2M1 values plus 16 are codes 4..=28,
//! its E8M0 scale is a power of two (f16 when every block's fits, else f32), and its bias is
//! −16 times the scale, derived by the kernels. Written from its blocks, it keeps its 4-bit E2M1
//! indices (the "E2M1 codes" of the kernels: `bits` 4 and the bias placeholder `[−16, 1]`), which
//! the kernels look up as those codes in registers; the general path's conversion gives the same
//! codes in 5 bits. The kernels compute the same bits from either.

use std::mem::MaybeUninit;

use mlxcel_model::gguf::GgmlType;
use mlxcel_model::gguf::GgufBlocks;
use mlxcel_model::gguf::dequant::{
    ExactScales, MXFP4_MAX_AFFINE_SCALE_BYTE, affine_bits, affine_group_size, bias_multiple,
    exact_scales, half_scale_at, mxfp4_scale, pack_row,
};

use crate::array::Array;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::layout_cache::Place;
use crate::quantized::QuantizedWeight;
use crate::sys::{self, ffi};

/// Output rows per tile of the int8 layout (`kInt8TileRows` of the kernels).
const TILE_ROWS: usize = 16;
/// Values per K-quant super-block, the unit of the factored scales (`kSuperBlock`).
const SUPER_BLOCK: usize = 256;

/// How one GGUF type's weights take the compact int8 layout.
#[derive(Debug, Clone, Copy)]
struct Form {
    ty: GgmlType,
    block_len: usize,
    block_bytes: usize,
    /// Bits per code of the affine form (4 or 8), and in the layout (4, 5, 6 or 8).
    bits: usize,
    out_bits: usize,
    group: usize,
    /// K-quants: scales (and stored biases) factored per super-block; else f16 per group.
    factored: bool,
    /// Biases kept as this multiple of the scales (the symmetric types).
    bias_multiple: Option<f32>,
    /// Per-group scales in f32 rather than f16 (an MXFP4 weight with a scale f16 cannot hold).
    f32_scales: bool,
    /// MXFP4: the codes are the blocks' own 4-bit E2M1 indices (`bits` and `out_bits` 4).
    e2m1: bool,
}

impl Form {
    fn of(ty: GgmlType) -> Option<Form> {
        let (block_len, block_bytes) = ty.layout()?;
        let e2m1 = ty == GgmlType::MXFP4;
        let bits = if e2m1 { 4 } else { affine_bits(ty)? as usize };
        let out_bits = match ty {
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => 5,
            GgmlType::Q6_K => 6,
            _ => bits,
        };
        Some(Form {
            ty,
            block_len,
            block_bytes,
            bits,
            out_bits,
            group: affine_group_size(ty),
            factored: block_len == SUPER_BLOCK,
            bias_multiple: bias_multiple(ty),
            f32_scales: false,
            e2m1,
        })
    }

    /// Bytes of one per-group scale (or stored bias) when the scales are not factored.
    fn scale_bytes(&self) -> usize {
        if self.f32_scales { 4 } else { 2 }
    }

    /// Bytes of one tile's codes.
    fn code_tile_bytes(&self, k: usize) -> usize {
        2 * k * self.out_bits
    }

    /// Bytes of one super-block of one tile's factored scales: 16 f32 `d`, then 16 int8 `c`
    /// per group.
    fn superblock_bytes(&self) -> usize {
        4 * TILE_ROWS + TILE_ROWS * (SUPER_BLOCK / self.group)
    }

    /// Bytes of one tile's scales (and of its stored biases).
    fn scale_tile_bytes(&self, k: usize) -> usize {
        if self.factored {
            k / SUPER_BLOCK * self.superblock_bytes()
        } else {
            TILE_ROWS * (k / self.group) * self.scale_bytes()
        }
    }
}

impl QuantizedWeight {
    /// `parts`' rows, stacked in order, as one weight in the compact int8 layout, written from
    /// their GGUF blocks on up to `threads` threads. `None` when the parts cannot take it this
    /// way: types or widths that differ, a type without an affine form, a row count that is not
    /// a multiple of 16, or a block whose scales have no exact form ([`exact_scales`]: an MXFP4
    /// block with a scale byte above 251 has none, nor an affine form to convert to, so a reader
    /// refuses its tensor); the caller then converts and interleaves the general way.
    pub fn int8_from_gguf_blocks(
        parts: &[GgufBlocks<'_>],
        threads: usize,
    ) -> Result<Option<QuantizedWeight>> {
        Self::int8_from_gguf_blocks_in(parts, threads, &Place::Heap)
    }

    /// [`QuantizedWeight::int8_from_gguf_blocks`] with its arrays built at `place` (the layout
    /// cache's file while it is written).
    pub(crate) fn int8_from_gguf_blocks_in(
        parts: &[GgufBlocks<'_>],
        threads: usize,
        place: &Place<'_>,
    ) -> Result<Option<QuantizedWeight>> {
        let Some(first) = parts.first() else {
            return Ok(None);
        };
        let Some(mut form) = Form::of(first.ggml_type) else {
            return Ok(None);
        };
        let k = first.cols;
        let n: usize = parts.iter().map(|p| p.rows).sum();
        if parts.iter().any(|p| p.ggml_type != form.ty || p.cols != k)
            || n == 0
            || !n.is_multiple_of(TILE_ROWS)
            || !k.is_multiple_of(form.block_len)
            || i32::try_from(n).is_err()
            || i32::try_from(k).is_err()
        {
            return Ok(None);
        }
        let rows: Vec<&[u8]> = parts
            .iter()
            .flat_map(|p| (0..p.rows).map(move |r| p.row(r)))
            .collect();
        if form.ty == GgmlType::MXFP4 {
            let Some(f32_scales) = mxfp4_needs_f32_scales(&rows, form.block_bytes) else {
                return Ok(None);
            };
            form.f32_scales = f32_scales;
        }
        let tiles = n / TILE_ROWS;
        let dim = |d: usize| d as i32;
        let (scale_dtype, scale_shape) = if form.factored {
            (Dtype::U8, [dim(tiles), dim(form.scale_tile_bytes(k))])
        } else if form.f32_scales {
            (Dtype::F32, [dim(n), dim(k / form.group)])
        } else {
            (Dtype::F16, [dim(n), dim(k / form.group)])
        };
        let weight_shape = [dim(n), dim(k * form.out_bits / 32)];
        let stored_bias = form.bias_multiple.is_none();
        // Three arrays, each written in place: the codes, the scales, the stored biases.
        let (weight, inner) = place.filled(&weight_shape, Dtype::U32, |w| {
            place.filled(&scale_shape, scale_dtype, |s| {
                if stored_bias {
                    place
                        .filled(&scale_shape, scale_dtype, |b| {
                            write_tiles(&form, &rows, k, w, s, Some(b), threads)
                        })
                        .map(|(b, written)| (Some(b), written))
                } else {
                    Ok((None, write_tiles(&form, &rows, k, w, s, None, threads)))
                }
            })
        })?;
        let (scales, inner) = inner?;
        let (biases, written) = inner?;
        if !written? {
            return Ok(None);
        }
        let biases = match (biases, form.bias_multiple) {
            (Some(b), _) => b,
            // (E2M1 indices: the placeholder's second value marks them)
            (None, Some(m)) if form.e2m1 => Array::from_f32(&[m, 1.0], &[2])?,
            (None, Some(m)) => Array::from_f32(&[m], &[1])?,
            (None, None) => unreachable!("stored biases are written"),
        };
        Ok(Some(QuantizedWeight {
            weight,
            scales,
            biases,
            group_size: form.group as i32,
            bits: form.out_bits as i32,
            int8: true,
            activations: None,
        }))
    }
}

impl QuantizedWeight {
    /// Whether this weight has the shapes, dtypes, bits and group size that
    /// [`QuantizedWeight::int8_from_gguf_blocks`] gives `parts` (its scales f16 or f32 for
    /// MXFP4, which only the blocks' bytes decide): the layout cache's check of a cached weight
    /// against the checkpoint, reading no block.
    pub(crate) fn is_int8_layout_of(&self, parts: &[GgufBlocks<'_>]) -> bool {
        let Some(form) = parts.first().and_then(|p| Form::of(p.ggml_type)) else {
            return false;
        };
        let k = parts[0].cols;
        let n: usize = parts.iter().map(|p| p.rows).sum();
        if parts.iter().any(|p| p.ggml_type != form.ty || p.cols != k)
            || !n.is_multiple_of(TILE_ROWS)
            || !k.is_multiple_of(form.block_len)
        {
            return false;
        }
        let dim = |d: usize| d as i32;
        let scales_ok = if form.factored {
            self.scales.dtype() == Dtype::U8
                && self.scales.shape() == [dim(n / TILE_ROWS), dim(form.scale_tile_bytes(k))]
        } else {
            let dtype = self.scales.dtype();
            (dtype == Dtype::F16 || (form.ty == GgmlType::MXFP4 && dtype == Dtype::F32))
                && self.scales.shape() == [dim(n), dim(k / form.group)]
        };
        let biases_ok = match form.bias_multiple {
            Some(m) => {
                // The placeholder: the multiple, and 1 after it for E2M1 codes.
                let expected: &[f32] = if form.e2m1 { &[m, 1.0] } else { &[m] };
                self.biases.shape() == [expected.len() as i32]
                    && self.biases.to_vec_f32().is_ok_and(|b| b == expected)
            }
            None => {
                self.biases.dtype() == self.scales.dtype()
                    && self.biases.shape() == self.scales.shape()
            }
        };
        self.int8
            && self.bits == form.out_bits as i32
            && self.group_size == form.group as i32
            && self.weight.dtype() == Dtype::U32
            && self.weight.shape() == [dim(n), dim(k * form.out_bits / 32)]
            && scales_ok
            && biases_ok
    }
}

/// Whether an MXFP4 weight's scales need f32: some block's `2^(e − 128)` is not an f16 (f16
/// reaches 2^−24 .. 2^15, scale bytes 104..=143; real weights sit near 120). `None` when some
/// block has no exact form (a scale byte above 251).
fn mxfp4_needs_f32_scales(rows: &[&[u8]], block_bytes: usize) -> Option<bool> {
    let (mut lo, mut hi) = (u8::MAX, 0u8);
    for row in rows {
        for block in row.chunks_exact(block_bytes) {
            (lo, hi) = (lo.min(block[0]), hi.max(block[0]));
        }
    }
    (hi <= MXFP4_MAX_AFFINE_SCALE_BYTE).then_some(lo < 104 || hi > 143)
}

/// Writes every tile's codes, scales and (when stored) biases; false when some block's scales
/// have no exact form. Tiles are spread over up to `threads` threads in contiguous runs.
fn write_tiles(
    form: &Form,
    rows: &[&[u8]],
    k: usize,
    w: &mut [MaybeUninit<u8>],
    s: &mut [MaybeUninit<u8>],
    b: Option<&mut [MaybeUninit<u8>]>,
    threads: usize,
) -> Result<bool> {
    let tiles = rows.len() / TILE_ROWS;
    let per = tiles.div_ceil(threads.clamp(1, tiles.max(1)));
    let (code_tile, scale_tile) = (form.code_tile_bytes(k), form.scale_tile_bytes(k));
    let mut b_runs: Vec<Option<&mut [MaybeUninit<u8>]>> = match b {
        Some(b) => b.chunks_mut(per * scale_tile).map(Some).collect(),
        None => (0..tiles.div_ceil(per)).map(|_| None).collect(),
    };
    std::thread::scope(|scope| {
        let runs: Vec<_> = w
            .chunks_mut(per * code_tile)
            .zip(s.chunks_mut(per * scale_tile))
            .zip(b_runs.iter_mut())
            .enumerate()
            .map(|(i, ((w, s), b))| {
                let rows = &rows[i * per * TILE_ROWS..((i + 1) * per * TILE_ROWS).min(rows.len())];
                scope.spawn(move || write_run(form, rows, k, w, s, b.as_deref_mut()))
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a tile writer panicked"))
            .try_fold(true, |all, ok| Ok(all && ok?))
    })
}

/// [`write_tiles`] for one run of tiles (`rows` are theirs; `w`, `s`, `b` their bytes).
fn write_run(
    form: &Form,
    rows: &[&[u8]],
    k: usize,
    w: &mut [MaybeUninit<u8>],
    s: &mut [MaybeUninit<u8>],
    mut b: Option<&mut [MaybeUninit<u8>]>,
) -> Result<bool> {
    let row_code_bytes = k * form.bits / 8;
    let (code_tile, scale_tile) = (form.code_tile_bytes(k), form.scale_tile_bytes(k));
    let mut codes = vec![0u32; TILE_ROWS * row_code_bytes / 4];
    let mut tile = vec![0u8; code_tile];
    for (t, tile_rows) in rows.chunks_exact(TILE_ROWS).enumerate() {
        let scales = &mut s[t * scale_tile..(t + 1) * scale_tile];
        let mut biases = b
            .as_deref_mut()
            .map(|b| &mut b[t * scale_tile..(t + 1) * scale_tile]);
        let code_bytes = sys::as_bytes_mut(&mut codes);
        for (j, row) in tile_rows.iter().enumerate() {
            let out = &mut code_bytes[j * row_code_bytes..(j + 1) * row_code_bytes];
            if form.e2m1 {
                pack_e2m1_indices(row, form.block_bytes, out);
            } else {
                pack_row(form.ty, row, out);
            }
            if !write_row_scales(form, row, j, scales, biases.as_deref_mut()) {
                return Ok(false);
            }
        }
        // A kernel of mlxcel's own (no MLX state): no lock, so the runs interleave in parallel.
        ffi::kernels_interleave_tile(
            &codes,
            k as i32,
            form.bits as i32,
            form.out_bits as i32,
            &mut tile,
        )
        .map_err(Error::mlx("int8_from_gguf_blocks"))?;
        for (dst, &src) in w[t * code_tile..(t + 1) * code_tile].iter_mut().zip(&tile) {
            dst.write(src);
        }
    }
    Ok(true)
}

/// An MXFP4 row's E2M1 indices packed as 4-bit codes (value `k` in byte `k / 2`, low nibble
/// first): a block's byte `i` holds values `i` (low nibble) and `i + 16` (high).
fn pack_e2m1_indices(row: &[u8], block_bytes: usize, out: &mut [u8]) {
    for (block, out) in row.chunks_exact(block_bytes).zip(out.chunks_exact_mut(16)) {
        for (i, pair) in block[1..17].chunks_exact(2).enumerate() {
            out[i] = (pair[0] & 0x0F) | (pair[1] << 4);
            out[8 + i] = (pair[0] >> 4) | (pair[1] & 0xF0);
        }
    }
}

/// Tile row `j`'s scales (and stored biases), every block of `row`: false when some block's
/// scales have no exact form. The types whose scales are f16 in the block and MXFP4 are copied
/// with their branch taken once per row (a load's hot loop); the others block by block through
/// [`exact_scales`] and [`write_scales`], which give the same bytes for every type.
fn write_row_scales(
    form: &Form,
    row: &[u8],
    j: usize,
    scales: &mut [MaybeUninit<u8>],
    mut biases: Option<&mut [MaybeUninit<u8>]>,
) -> bool {
    let blocks = row.chunks_exact(form.block_bytes).enumerate();
    let half = half_scale_at(form.ty).filter(|_| !form.factored);
    match (half, biases.as_deref_mut()) {
        // [tile, group, row] f16, as the block stores it.
        (Some((s, None)), None) => {
            for (i, block) in blocks {
                let at = (i * TILE_ROWS + j) * 2;
                scales[at].write(block[s]);
                scales[at + 1].write(block[s + 1]);
            }
            return true;
        }
        (Some((s, Some(b))), Some(dst)) => {
            for (i, block) in blocks {
                let at = (i * TILE_ROWS + j) * 2;
                scales[at].write(block[s]);
                scales[at + 1].write(block[s + 1]);
                dst[at].write(block[b]);
                dst[at + 1].write(block[b + 1]);
            }
            return true;
        }
        (Some(_), _) => return false,
        (None, _) => {}
    }
    if form.ty == GgmlType::MXFP4 && !form.factored && form.bias_multiple.is_some() {
        // [tile, group, row], f32 or f16 (the f16 exact: checked for the whole weight).
        if biases.is_some() {
            return false;
        }
        let bytes = form.scale_bytes();
        for (i, block) in blocks {
            if block[0] > MXFP4_MAX_AFFINE_SCALE_BYTE {
                return false;
            }
            let scale = mxfp4_scale(block[0]);
            let at = (i * TILE_ROWS + j) * bytes;
            let dst = &mut scales[at..at + bytes];
            if form.f32_scales {
                for (d, v) in dst.iter_mut().zip(scale.to_le_bytes()) {
                    d.write(v);
                }
            } else {
                for (d, v) in dst.iter_mut().zip(half::f16::from_f32(scale).to_le_bytes()) {
                    d.write(v);
                }
            }
        }
        return true;
    }
    for (i, block) in blocks {
        let Some(exact) = exact_scales(form.ty, block) else {
            return false;
        };
        if !write_scales(form, exact, i, j, scales, biases.as_deref_mut()) {
            return false;
        }
    }
    true
}

/// The factoring the general path finds for the products `d · c` (`factor_int8_scales`): the
/// kernels multiply the integers and `d` separately (x per superblock, docs/kernels.md), so two
/// factorings of the same scales can round differently. A block's own is that one when its
/// largest integer is 63, the search's first candidate (llama.cpp's K-quant scales and mins
/// always), or −128, the second, with some other integer not 0 or −128 (Q6_K's scales: then 63
/// cannot fit, since −63·c/128 is no integer and is off by at least 1/128 of a step): then
/// nothing is searched. (Q3_K's and Q2_K's are found as a power of two times their own.)
fn general_factoring(d: f32, c: &[i8]) -> Option<(f32, [i8; 16])> {
    // The search's `top` is the first of the largest magnitudes: 63 when the integers are in
    // 0..=63 and reach 63, -128 when any is -128 (checked as min and max, which vectorize).
    let (min, max) = (
        c.iter().copied().min().unwrap_or(0),
        c.iter().copied().max().unwrap_or(0),
    );
    let own = (min >= 0 && max == 63) || (min == -128 && c.iter().any(|&v| v != 0 && v != -128));
    if own && d.is_finite() && d != 0.0 {
        return None;
    }
    let values: Vec<f32> = c.iter().map(|&v| d * v as f32).collect();
    let (mut found, mut out) = (0.0f32, [0i8; 16]);
    // (false never, for a K-quant block: its own factoring is among those searched)
    match ffi::kernels_factor_superblock(&values, &mut found, &mut out[..c.len()]) {
        Ok(true) => Some((found, out)),
        _ => None,
    }
}

/// Block `i` of tile row `j`: its scales (and stored biases) into the tile's bytes. False when
/// the block's form is not the type's (never, for blocks of one type).
fn write_scales(
    form: &Form,
    exact: ExactScales,
    i: usize,
    j: usize,
    scales: &mut [MaybeUninit<u8>],
    biases: Option<&mut [MaybeUninit<u8>]>,
) -> bool {
    let put = |dst: &mut [MaybeUninit<u8>], at: usize, bytes: &[u8]| {
        for (d, &v) in dst[at..at + bytes.len()].iter_mut().zip(bytes) {
            d.write(v);
        }
    };
    match (exact, form.factored) {
        (ExactScales::Half { scale, bias }, false) => {
            // [tile, group, row] f16: group i (one per block).
            let at = (i * TILE_ROWS + j) * 2;
            put(scales, at, &scale.to_le_bytes());
            match (biases, bias) {
                (Some(dst), Some(bias)) => put(dst, at, &bias.to_le_bytes()),
                (None, None) => {}
                _ => return false,
            }
            true
        }
        (ExactScales::Single { scale }, false) if form.bias_multiple.is_some() => {
            // [tile, group, row], f32 or f16 (the f16 exact: checked for the whole weight).
            let at = (i * TILE_ROWS + j) * form.scale_bytes();
            if form.f32_scales {
                put(scales, at, &scale.to_le_bytes());
            } else {
                put(scales, at, &half::f16::from_f32(scale).to_le_bytes());
            }
            biases.is_none()
        }
        (ExactScales::Factored { d, c, bias }, true) => {
            // Super-block i: 16 rows' d, then per group 16 rows' c.
            let base = i * form.superblock_bytes();
            let groups = SUPER_BLOCK / form.group;
            let factored = |dst: &mut [MaybeUninit<u8>], d: f32, c: &[i8]| {
                let general = general_factoring(d, &c[..groups]);
                let (d, c) = general.as_ref().map_or((d, c), |(d, c)| (*d, &c[..]));
                put(dst, base + 4 * j, &d.to_le_bytes());
                for (g, &c) in c[..groups].iter().enumerate() {
                    dst[base + 4 * TILE_ROWS + g * TILE_ROWS + j].write(c as u8);
                }
            };
            factored(scales, d, &c);
            match (biases, bias) {
                (Some(dst), Some((bd, bc))) => factored(dst, bd, &bc),
                (None, None) => {}
                _ => return false,
            }
            true
        }
        _ => false,
    }
}
