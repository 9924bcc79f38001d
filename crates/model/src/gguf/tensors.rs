//! The output tensors of one GGUF tensor, planned up front and produced on demand.

use half::f16;

use crate::error::{ModelError, Result};
use crate::gguf::dequant::{
    MAX_GROUPS_PER_BLOCK, affine_bits, affine_group_size, affine_scales_into, dequantize_reference,
    pack_block,
};
use crate::gguf::permute::gguf_row_of_hf_row;
use crate::gguf::reader::{GgufFile, GgufTensorInfo};
use crate::gguf::types::GgmlType;
use crate::safetensors_writer::PlannedTensor;

/// Which part of a converted tensor an output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// F32/F16/BF16 copied as is (rows reordered for q/k).
    Dense,
    /// Packed quantized values (U32), in affine groups of `group` elements (16 for Q6_K, Q3_K
    /// and Q2_K, 32 otherwise).
    Weight {
        bits: u32,
        group: usize,
    },
    Scales,
    Biases,
    /// A Gemma norm weight, which llama.cpp stores as `1 + w`: written as f32 `w` again (the
    /// Hugging Face form; exact whenever `1 + w ≥ 0.5`, so that adding one back at load gives
    /// llama.cpp's weight).
    NormOffset,
}

/// One output tensor and how to produce its bytes from the GGUF.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub planned: PlannedTensor,
    source: GgufTensorInfo,
    part: Part,
    /// `Some(head_dim)` for llama q/k projections, whose rows llama.cpp permuted.
    rows_per_head: Option<usize>,
    /// The first row of the source this output starts at: one expert's rows of a stacked
    /// `[experts, out, in]` tensor (whose experts lie one after another), else 0.
    first_row: usize,
}

/// What a GGUF tensor (or one expert of a stack of them) becomes: the Hugging Face module and
/// suffix (`weight`, `bias`), and for a stack `[experts, out, in]`, which expert.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination<'a> {
    pub module: &'a str,
    pub suffix: &'a str,
    pub expert: Option<usize>,
}

/// Plans the outputs of `info`, which becomes the Hugging Face `module` + `suffix`; with
/// `expert` `Some(j)`, `info` is a stack of experts `[experts, out, in]` and this plans expert
/// `j`'s `[out, in]` (its rows, a sub-range of the tensor's). A quantized
/// tensor's scales and biases are f16 when every one of them is exact in f16 (else f32):
/// `known_scales` gives that choice when an earlier plan of the same file made it, else the
/// tensor's blocks are read to make it.
pub(crate) fn plan(
    gguf: &GgufFile,
    info: &GgufTensorInfo,
    Destination {
        module,
        suffix,
        expert,
    }: Destination<'_>,
    rows_per_head: Option<usize>,
    norm_offset: bool,
    known_scales: Option<safetensors::Dtype>,
) -> Result<Vec<Output>> {
    let refuse = |reason: String| ModelError::GgufTensor {
        path: gguf.path().to_owned(),
        tensor: info.name.clone(),
        reason,
    };
    let whole = info.shape();
    if whole.contains(&0) {
        return Err(refuse(format!(
            "has no elements (shape {whole:?}): a model's tensors are never empty"
        )));
    }
    let (shape, first_row) = match (expert, &whole[..]) {
        (None, [_, _, _, ..]) => {
            return Err(refuse(format!(
                "has {} dimensions (shape {whole:?}) where a matrix is expected",
                whole.len()
            )));
        }
        (None, _) => (whole.clone(), 0),
        (Some(j), &[experts, out, inp]) if j < experts => (vec![out, inp], j * out),
        (Some(_), _) => {
            return Err(refuse(format!(
                "shape {whole:?} is not a stack of experts [experts, out, in]"
            )));
        }
    };
    let rows = rows(&shape);
    if let Some(head_dim) = rows_per_head
        && !(rows.is_multiple_of(head_dim) && head_dim.is_multiple_of(2))
    {
        return Err(refuse(format!(
            "{rows} rows are not whole heads of {head_dim}"
        )));
    }
    let output = |name: String, dtype, shape: Vec<usize>, part| Output {
        planned: PlannedTensor { name, dtype, shape },
        source: info.clone(),
        part,
        rows_per_head,
        first_row,
    };
    let dense = |dtype| {
        Ok(vec![output(
            format!("{module}.{suffix}"),
            dtype,
            shape.clone(),
            Part::Dense,
        )])
    };
    if norm_offset
        && matches!(
            info.ggml_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
        )
    {
        return Ok(vec![output(
            format!("{module}.{suffix}"),
            safetensors::Dtype::F32,
            shape.clone(),
            Part::NormOffset,
        )]);
    }
    match info.ggml_type {
        GgmlType::F32 => dense(safetensors::Dtype::F32),
        GgmlType::F16 => dense(safetensors::Dtype::F16),
        GgmlType::BF16 => dense(safetensors::Dtype::BF16),
        ty => {
            let Some((block_len, _)) = ty.layout() else {
                return Err(ModelError::UnsupportedGgmlType {
                    path: gguf.path().to_owned(),
                    tensor: info.name.clone(),
                    ggml_type: ty.to_string(),
                });
            };
            let Some(bits) = affine_bits(ty) else {
                return Err(ModelError::UnsupportedGgmlType {
                    path: gguf.path().to_owned(),
                    tensor: info.name.clone(),
                    ggml_type: ty.to_string(),
                });
            };
            let group = affine_group_size(ty);
            let [rows, cols] = shape[..] else {
                return Err(refuse(format!("quantized but not 2-D (shape {shape:?})")));
            };
            if !cols.is_multiple_of(block_len) {
                return Err(refuse(format!(
                    "rows of {cols} elements are not whole blocks of {block_len}"
                )));
            }
            let data = gguf.tensor_data(info)?;
            // An MXFP4 block whose scale is past 2^123 has no f32 affine form: refused by name
            // rather than converted to NaN.
            if known_scales.is_none()
                && let Some(reason) = crate::gguf::dequant::affine_form_refusal(ty, data)
            {
                return Err(refuse(reason));
            }
            let float = match known_scales {
                Some(dtype @ (safetensors::Dtype::F16 | safetensors::Dtype::F32)) => dtype,
                _ if fits_f16(ty, data) => safetensors::Dtype::F16,
                _ => safetensors::Dtype::F32,
            };
            let groups = vec![rows, cols / group];
            Ok(vec![
                output(
                    format!("{module}.weight"),
                    safetensors::Dtype::U32,
                    vec![rows, cols * bits as usize / 32],
                    Part::Weight { bits, group },
                ),
                output(
                    format!("{module}.scales"),
                    float,
                    groups.clone(),
                    Part::Scales,
                ),
                output(format!("{module}.biases"), float, groups, Part::Biases),
            ])
        }
    }
}

/// Rows of a tensor: the outer dimensions of a matrix or a stack of them, every element of a
/// vector.
fn rows(shape: &[usize]) -> usize {
    if shape.len() >= 2 {
        shape[..shape.len() - 1].iter().product()
    } else {
        shape.iter().product()
    }
}

/// Whether every scale and bias of a tensor is exact in f16: true for the 32-element types (their
/// scales are f16 in GGUF and their biases f16 or `-8 d`/`-16 d`/`-128 d`, unless that overflows),
/// usually false for the K-quants (`d · scale` needs up to 17 bits, 18 for Q6_K). Otherwise the
/// tensor keeps f32 scales and biases. Blocks are read on every core; the first block that does
/// not fit ends the search.
fn fits_f16(ty: GgmlType, data: &[u8]) -> bool {
    let (_, block_bytes) = ty.layout().expect("a block type");
    let exact = |v: f32| f16::from_f32(v).to_f32() == v;
    let blocks = data.len() / block_bytes;
    let misfit = std::sync::atomic::AtomicBool::new(false);
    for_each_range(blocks, 1024, |range| {
        let mut groups = [(0f32, 0f32); MAX_GROUPS_PER_BLOCK];
        for b in range {
            if misfit.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let block = &data[b * block_bytes..(b + 1) * block_bytes];
            let n = affine_scales_into(ty, block, &mut groups);
            if !groups[..n].iter().all(|&(s, b)| exact(s) && exact(b)) {
                misfit.store(true, std::sync::atomic::Ordering::Relaxed);
                return;
            }
        }
    });
    !misfit.into_inner()
}

/// Runs `work` over `0..n` cut into ranges of at least `min_len`, on up to every core (the
/// machine's available parallelism), and returns when all are done.
fn for_each_range(n: usize, min_len: usize, work: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let parts = threads.min(n.div_ceil(min_len.max(1))).max(1);
    if parts == 1 {
        work(0..n);
        return;
    }
    let per = n.div_ceil(parts);
    std::thread::scope(|scope| {
        for p in 1..parts {
            let work = &work;
            scope.spawn(move || work(p * per..((p + 1) * per).min(n)));
        }
        work(0..per.min(n));
    });
}

impl Output {
    /// Fills `out` (exactly [`PlannedTensor::byte_len`] bytes) with this output's bytes, rows
    /// spread over every core.
    pub(crate) fn fill(&self, gguf: &GgufFile, out: &mut [u8]) -> Result<()> {
        let raw = gguf.tensor_data(&self.source)?;
        assert_eq!(out.len(), self.planned.byte_len(), "{}", self.planned.name);
        let ty = self.source.ggml_type;
        let source_rows = rows(&self.source.shape());
        let row_of = |r: usize| match self.rows_per_head {
            Some(head_dim) => gguf_row_of_hf_row(self.first_row + r, head_dim),
            None => self.first_row + r,
        };
        match self.part {
            Part::Dense => {
                let row_bytes = raw.len() / source_rows;
                fill_rows(out, row_bytes, |r, dst| {
                    let from = row_of(r) * row_bytes;
                    dst.copy_from_slice(&raw[from..from + row_bytes]);
                });
                return Ok(());
            }
            Part::NormOffset => {
                let values = dequantize_reference(ty, raw).expect("a float type");
                for (dst, v) in out.chunks_exact_mut(4).zip(values) {
                    dst.copy_from_slice(&(v - 1.0).to_le_bytes());
                }
                return Ok(());
            }
            Part::Weight { .. } | Part::Scales | Part::Biases => {}
        }
        let (_, block_bytes) = ty.layout().expect("a readable type");
        let source_row_bytes = raw.len() / source_rows;
        let out_row_bytes = out.len() / rows(&self.planned.shape);
        let as_f16 = self.planned.dtype == safetensors::Dtype::F16;
        let part = self.part;
        let (block_len, _) = ty.layout().expect("a readable type");
        fill_rows(out, out_row_bytes, |r, dst| {
            let from = row_of(r) * source_row_bytes;
            let source = &raw[from..from + source_row_bytes];
            match part {
                Part::Weight { bits, .. } => {
                    let per_block = block_len * bits as usize / 8;
                    for (block, dst) in source
                        .chunks_exact(block_bytes)
                        .zip(dst.chunks_exact_mut(per_block))
                    {
                        pack_block(ty, block, dst);
                    }
                }
                Part::Scales | Part::Biases => {
                    let mut groups = [(0f32, 0f32); MAX_GROUPS_PER_BLOCK];
                    let mut at = 0;
                    for block in source.chunks_exact(block_bytes) {
                        let n = affine_scales_into(ty, block, &mut groups);
                        for &(scale, bias) in &groups[..n] {
                            let v = if part == Part::Scales { scale } else { bias };
                            if as_f16 {
                                dst[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                                at += 2;
                            } else {
                                dst[at..at + 4].copy_from_slice(&v.to_le_bytes());
                                at += 4;
                            }
                        }
                    }
                    debug_assert_eq!(at, dst.len());
                }
                Part::Dense | Part::NormOffset => unreachable!("handled above"),
            }
        });
        Ok(())
    }

    /// Whether this is the packed weight of a quantized module, and its bits and group size.
    pub(crate) fn quantized_spec(&self) -> Option<(u32, usize)> {
        match self.part {
            Part::Weight { bits, group } => Some((bits, group)),
            _ => None,
        }
    }

    /// The GGUF tensor this output comes from.
    pub(crate) fn source(&self) -> &GgufTensorInfo {
        &self.source
    }
}

/// A quantized weight's rows as the blocks a GGUF file stores them in, borrowed from the file's
/// map: for a loader that writes its own layout straight from the blocks (mlxcel's int8 layout)
/// instead of reading the affine form converted from them. Rows are in Hugging Face order (a
/// llama q/k projection's rows are found where llama.cpp permuted them).
#[derive(Debug, Clone, Copy)]
pub struct GgufBlocks<'a> {
    /// The blocks' type (one with an affine form).
    pub ggml_type: GgmlType,
    /// Output rows (`[rows, cols]` is the Hugging Face shape).
    pub rows: usize,
    /// Values per row: whole blocks.
    pub cols: usize,
    data: &'a [u8],
    row_bytes: usize,
    /// Of a part split off a fused tensor: its first row in the whole.
    first_row: usize,
    rows_per_head: Option<usize>,
}

impl<'a> GgufBlocks<'a> {
    /// Row `r`'s blocks (`cols / block_len` of them, back to back).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let whole = self.first_row + r;
        let source = match self.rows_per_head {
            Some(head_dim) => gguf_row_of_hf_row(whole, head_dim),
            None => whole,
        };
        &self.data[source * self.row_bytes..(source + 1) * self.row_bytes]
    }
}

impl Output {
    /// The blocks of a quantized weight's rows `first_row .. first_row + rows` (a part split off
    /// this output, or all of it); `None` for any other output.
    pub(crate) fn blocks<'a>(
        &self,
        gguf: &'a GgufFile,
        first_row: usize,
        rows: usize,
    ) -> Option<GgufBlocks<'a>> {
        let Part::Weight { .. } = self.part else {
            return None;
        };
        let data = gguf.tensor_data(&self.source).ok()?;
        let shape = self.source.shape();
        self.source.ggml_type.layout()?;
        let (whole, &cols) = (self::rows(&shape), shape.last()?);
        let first_row = self.first_row + first_row;
        if first_row + rows > whole {
            return None;
        }
        Some(GgufBlocks {
            ggml_type: self.source.ggml_type,
            rows,
            cols,
            data,
            row_bytes: data.len() / whole,
            first_row,
            rows_per_head: self.rows_per_head,
        })
    }
}

/// Fills `out`, rows of `row_bytes`, in parallel: `fill(r, row)` for every row `r`, each core
/// taking a contiguous run of rows.
fn fill_rows(out: &mut [u8], row_bytes: usize, fill: impl Fn(usize, &mut [u8]) + Sync) {
    let n = out.len() / row_bytes.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let per = n.div_ceil(threads.min(n.div_ceil(16)).max(1)).max(1);
    std::thread::scope(|scope| {
        for (p, run) in out.chunks_mut(per * row_bytes).enumerate() {
            let fill = &fill;
            scope.spawn(move || {
                for (i, row) in run.chunks_mut(row_bytes).enumerate() {
                    fill(p * per + i, row);
                }
            });
        }
    });
}
