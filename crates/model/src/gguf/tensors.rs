//! The output tensors of one GGUF tensor, planned up front and produced on demand.

use std::borrow::Cow;
use std::io::Write;

use half::f16;

use crate::error::{ModelError, Result};
use crate::gguf::dequant::{affine_bits, affine_group_size, affine_groups, dequantize_reference};
use crate::gguf::permute::unpermute_rows;
use crate::gguf::reader::{GgufFile, GgufTensorInfo};
use crate::gguf::types::GgmlType;
use crate::quant::pack;
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
#[derive(Debug)]
pub(crate) struct Output<'a> {
    pub planned: PlannedTensor,
    source: &'a GgufTensorInfo,
    part: Part,
    /// `Some(head_dim)` for llama q/k projections, whose rows llama.cpp permuted.
    rows_per_head: Option<usize>,
}

/// Plans the outputs of `info`, which becomes the Hugging Face `module` + `suffix`.
pub(crate) fn plan<'a>(
    gguf: &GgufFile,
    info: &'a GgufTensorInfo,
    module: &str,
    suffix: &str,
    rows_per_head: Option<usize>,
    norm_offset: bool,
) -> Result<Vec<Output<'a>>> {
    let refuse = |reason: String| ModelError::GgufTensor {
        path: gguf.path().to_owned(),
        tensor: info.name.clone(),
        reason,
    };
    let shape = info.shape();
    let rows = rows(&shape);
    if shape.contains(&0) {
        return Err(refuse(format!(
            "has no elements (shape {shape:?}): a model's tensors are never empty"
        )));
    }
    if let Some(head_dim) = rows_per_head
        && !(rows.is_multiple_of(head_dim) && head_dim.is_multiple_of(2))
    {
        return Err(refuse(format!(
            "{rows} rows are not whole heads of {head_dim}"
        )));
    }
    let output = |name: String, dtype, shape: Vec<usize>, part| Output {
        planned: PlannedTensor { name, dtype, shape },
        source: info,
        part,
        rows_per_head,
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
            let float = if fits_f16(ty, gguf.tensor_data(info)?) {
                safetensors::Dtype::F16
            } else {
                safetensors::Dtype::F32
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

/// Rows of a tensor: the outer dimension of a matrix, every element of a vector.
fn rows(shape: &[usize]) -> usize {
    if shape.len() >= 2 {
        shape[0]
    } else {
        shape.iter().product()
    }
}

/// Whether every scale and bias of a tensor is exact in f16: true for the 32-element types (their
/// scales are f16 in GGUF and their biases f16 or `-8 d`/`-16 d`/`-128 d`, unless that overflows),
/// usually false for the K-quants (`d · scale` needs up to 17 bits, 18 for Q6_K). Otherwise the
/// tensor keeps f32 scales and biases.
fn fits_f16(ty: GgmlType, data: &[u8]) -> bool {
    let (_, block_bytes) = ty.layout().expect("a block type");
    let exact = |v: f32| f16::from_f32(v).to_f32() == v;
    data.chunks_exact(block_bytes).all(|block| {
        affine_groups(ty, block)
            .iter()
            .all(|g| exact(g.scale) && exact(g.bias))
    })
}

impl Output<'_> {
    /// Writes this output's bytes.
    pub(crate) fn write(&self, gguf: &GgufFile, out: &mut dyn Write) -> Result<()> {
        let raw = gguf.tensor_data(self.source)?;
        let data: Cow<'_, [u8]> = match self.rows_per_head {
            Some(head_dim) => Cow::Owned(unpermute_rows(raw, rows(&self.source.shape()), head_dim)),
            None => Cow::Borrowed(raw),
        };
        let io = |e| ModelError::io(gguf.path(), e);
        let ty = self.source.ggml_type;
        let (_, block_bytes) = ty.layout().expect("a readable type");
        let mut buf = Vec::with_capacity(1 << 16);
        match self.part {
            Part::Dense => return out.write_all(&data).map_err(io),
            Part::NormOffset => {
                let values = dequantize_reference(ty, &data).expect("a float type");
                buf.extend(values.iter().flat_map(|v| (v - 1.0).to_le_bytes()));
                return out.write_all(&buf).map_err(io);
            }
            Part::Weight { .. } | Part::Scales | Part::Biases => {}
        }
        let as_f16 = self.planned.dtype == safetensors::Dtype::F16;
        for block in data.chunks_exact(block_bytes) {
            for group in affine_groups(ty, block) {
                let value = match self.part {
                    Part::Weight { bits, .. } => {
                        buf.extend(
                            pack(group.values(), bits)
                                .iter()
                                .flat_map(|w| w.to_le_bytes()),
                        );
                        None
                    }
                    Part::Scales => Some(group.scale),
                    Part::Biases => Some(group.bias),
                    Part::Dense | Part::NormOffset => {
                        unreachable!("handled above")
                    }
                };
                match value {
                    Some(v) if as_f16 => buf.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                    Some(v) => buf.extend_from_slice(&v.to_le_bytes()),
                    None => {}
                }
            }
            if buf.len() >= 1 << 16 {
                out.write_all(&buf).map_err(io)?;
                buf.clear();
            }
        }
        out.write_all(&buf).map_err(io)
    }

    /// Whether this is the packed weight of a quantized module, and its bits and group size.
    pub(crate) fn quantized_spec(&self) -> Option<(u32, usize)> {
        match self.part {
            Part::Weight { bits, group } => Some((bits, group)),
            _ => None,
        }
    }
}
