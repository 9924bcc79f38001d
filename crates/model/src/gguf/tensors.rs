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
    /// A float tensor whose values llama.cpp's converter changed, written as f32 with the
    /// change undone.
    Values(Values),
}

/// What llama.cpp's converter did to a float tensor's values, undone on import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Values {
    /// Kept as they are.
    Kept,
    /// A norm weight of a family whose norms multiply by `1 + w` (Gemma, the gated-DeltaNet
    /// hybrids), which llama.cpp stores as `1 + w`: written as `w` again (the Hugging Face form;
    /// exact whenever `1 + w ≥ 0.5`, so that adding one back at load gives llama.cpp's weight).
    NormOffset,
    /// A gated DeltaNet's `A_log`, which llama.cpp stores as `ssm_a = -exp(A_log)`: written as
    /// `ln(-ssm_a)` (the loader's `exp` of it gives llama.cpp's rate back to within an ulp).
    NegatedExp,
}

/// Which source row each output row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowOrder {
    /// Row `r` is source row `r`.
    Same,
    /// llama.cpp permuted the rows of each head of `head_dim` rows (llama q/k projections).
    PermutedHeads { head_dim: usize },
    /// Runs of `run` rows every `stride` rows, from `offset` into each stride: one part of a
    /// tensor whose parts llama.cpp interleaves (Qwen3-Next's `ssm_ba`, per key head its value
    /// heads' b, then their a).
    Runs {
        run: usize,
        stride: usize,
        offset: usize,
    },
}

impl RowOrder {
    /// The source row of output row `r`.
    fn source(self, r: usize) -> usize {
        match self {
            Self::Same => r,
            Self::PermutedHeads { head_dim } => gguf_row_of_hf_row(r, head_dim),
            Self::Runs {
                run,
                stride,
                offset,
            } => r / run * stride + offset + r % run,
        }
    }

    /// Output rows of `source_rows` source rows (`None`: not whole strides).
    fn rows(self, source_rows: usize) -> Option<usize> {
        match self {
            Self::Same => Some(source_rows),
            Self::PermutedHeads { head_dim } => (source_rows.is_multiple_of(head_dim)
                && head_dim.is_multiple_of(2))
            .then_some(source_rows),
            Self::Runs {
                run,
                stride,
                offset,
            } => (stride > 0 && offset + run <= stride && source_rows.is_multiple_of(stride))
                .then(|| source_rows / stride * run),
        }
    }
}

/// One output tensor and how to produce its bytes from the GGUF.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    pub planned: PlannedTensor,
    source: GgufTensorInfo,
    part: Part,
    /// Where each row comes from (llama q/k projections' rows were permuted).
    row_order: RowOrder,
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
/// `j`'s `[out, in]` (its rows, a sub-range of the tensor's); `row_order` picks the rows of the
/// output from those, and `values` undoes what llama.cpp did to a float tensor's. A quantized
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
    row_order: RowOrder,
    values: Values,
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
    let (mut shape, first_row) = match (expert, &whole[..]) {
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
    let source_rows = rows(&shape);
    let Some(out_rows) = row_order.rows(source_rows) else {
        return Err(refuse(format!(
            "{source_rows} rows cannot be read as {row_order:?}"
        )));
    };
    if out_rows != source_rows {
        // Only a matrix's rows are picked from (a vector's "rows" are its elements).
        match shape.len() {
            1 | 2 => shape[0] = shape[0] / source_rows * out_rows,
            _ => {
                return Err(refuse(format!(
                    "{row_order:?} of a {}-D tensor",
                    shape.len()
                )));
            }
        }
    }
    let output = |name: String, dtype, shape: Vec<usize>, part| Output {
        planned: PlannedTensor { name, dtype, shape },
        source: info.clone(),
        part,
        row_order,
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
    if values != Values::Kept {
        if !matches!(
            info.ggml_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16
        ) {
            return Err(refuse(format!(
                "is {}, where llama.cpp writes a float tensor",
                info.ggml_type
            )));
        }
        if row_order != RowOrder::Same {
            return Err(refuse(format!("{values:?} values in {row_order:?}")));
        }
        return Ok(vec![output(
            format!("{module}.{suffix}"),
            safetensors::Dtype::F32,
            shape.clone(),
            Part::Values(values),
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
        let row_of = |r: usize| self.first_row + self.row_order.source(r);
        match self.part {
            Part::Dense => {
                let row_bytes = raw.len() / source_rows;
                fill_rows(out, row_bytes, |r, dst| {
                    let from = row_of(r) * row_bytes;
                    dst.copy_from_slice(&raw[from..from + row_bytes]);
                });
                return Ok(());
            }
            Part::Values(kind) => {
                let values = dequantize_reference(ty, raw).expect("a float type");
                for (dst, v) in out.chunks_exact_mut(4).zip(values) {
                    let v = match kind {
                        Values::Kept => v,
                        Values::NormOffset => v - 1.0,
                        Values::NegatedExp => (-v).ln(),
                    };
                    dst.copy_from_slice(&v.to_le_bytes());
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
                Part::Dense | Part::Values(_) => unreachable!("handled above"),
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
    /// The rows of the whole in the source tensor.
    row_order: RowOrder,
    /// Of one expert of a stack: its first row in the source.
    source_first_row: usize,
}

impl<'a> GgufBlocks<'a> {
    /// Row `r`'s blocks (`cols / block_len` of them, back to back).
    pub fn row(&self, r: usize) -> &'a [u8] {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        let source = self.source_first_row + self.row_order.source(self.first_row + r);
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
        if first_row + rows > self::rows(&self.planned.shape) {
            return None;
        }
        Some(GgufBlocks {
            ggml_type: self.source.ggml_type,
            rows,
            cols,
            data,
            row_bytes: data.len() / whole,
            first_row,
            row_order: self.row_order,
            source_first_row: self.first_row,
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
