//! Checkpoint tensors as the program's weight arguments.
//!
//! Under the f32 and f16 formats, quantized linears are dequantized on the host (`scale · q +
//! bias`, exactly the MLX backend's arithmetic) and widened to the program's weight format; dense
//! tensors are widened; `[out, in]` weights are transposed to `[in, out]`. Under the packed format
//! a quantized weight is passed as stored: its packed words reinterpreted as 4- or 8-bit
//! integers (MLX packs the first element in the lowest bits of a little-endian word, which is
//! IREE's sub-byte order), its scales and its biases. See docs/xla.md for the measurements.

use std::collections::BTreeMap;

use half::{bf16, f16};
use mlxcel_model::{Checkpoint, Dtype, FeedForward, HiddenActivation, ModelConfig};

use crate::abi::{
    Layout, LlamaDims, Packing, WeightFormat, WeightSpec, weight_specs, weight_type, weight_types,
};
use crate::error::{Error, Result};
use crate::hlo::ElementType;

/// The program's MLP from the layers' feed-forward blocks: where a new kind of block enters the
/// OpenXLA program, which builds every layer alike (each is the gated MLP config.json describes):
/// its hidden size and whether its gate is GELU-tanh. A mixture-of-experts block is refused by
/// name: the program has no routed-expert MLP (docs/model.md says which backend runs them).
fn feed_forward(c: &ModelConfig) -> Result<(usize, bool)> {
    let routed = (0..c.num_hidden_layers).find_map(|i| c.layer_spec(i).ffn.routed().copied());
    let ffn = match routed {
        Some(moe) => FeedForward::RoutedExperts(moe),
        None => c.layer_spec(0).ffn,
    };
    match ffn {
        FeedForward::Dense {
            intermediate_size,
            activation,
        } => Ok((intermediate_size, activation == HiddenActivation::GeluTanh)),
        FeedForward::RoutedExperts(moe) => Err(Error::Unsupported(format!(
            "{} is a mixture-of-experts model ({} experts, {} per token): the OpenXLA backend has \
             no routed-expert MLP; run it with --backend mlx",
            c.architecture, moe.num_experts, moe.top_k
        ))),
    }
}

/// The program's dimensions for a checkpoint's config; an error names what the program cannot
/// express (a mixture-of-experts block).
pub fn llama_dims(c: &ModelConfig) -> Result<LlamaDims> {
    let linear = c.layers.iter().filter(|l| l.linear.is_some()).count();
    if linear > 0 || c.attention_output_gate {
        return Err(Error::Unsupported(format!(
            "{} is a hybrid model ({linear} of its {} layers are gated-DeltaNet linear attention, \
             its softmax attention gated): the OpenXLA backend has no linear attention; run it \
             with --backend mlx",
            c.architecture, c.num_hidden_layers
        )));
    }
    let conv = c.layers.iter().filter(|l| l.conv.is_some()).count();
    if conv > 0 {
        return Err(Error::Unsupported(format!(
            "{} is a hybrid model ({conv} of its {} layers are short convolutions): the OpenXLA \
             backend has no convolution layers; run it with --backend mlx",
            c.architecture, c.num_hidden_layers
        )));
    }
    let (intermediate, gelu) = feed_forward(c)?;
    if c.qk_norm_whole {
        return Err(Error::Unsupported(format!(
            "{}'s q/k norms span all heads at once; the OpenXLA program normalises each head",
            c.architecture
        )));
    }
    if c.attention_sinks {
        return Err(Error::Unsupported(format!(
            "{}'s attention has sinks (a learned logit per head in each softmax); the OpenXLA \
             program has none: run it with --backend mlx",
            c.architecture
        )));
    }
    if c.value_norm || c.layer_scalars {
        return Err(Error::Unsupported(format!(
            "{} normalises each head of v and scales each layer's output (Gemma 4's v_norm and \
             layer_scalar); the OpenXLA program does neither: run it with --backend mlx",
            c.architecture
        )));
    }
    Ok(LlamaDims {
        layers: c.num_hidden_layers,
        hidden: c.hidden_size,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        intermediate,
        vocab: c.vocab_size,
        rms_norm_eps: c.rms_norm_eps,
        inv_freq: c.rope_periods().iter().map(|p| 1.0 / p).collect(),
        qkv_bias: c.attention_qkv_bias,
        out_bias: c.attention_out_bias,
        tied_embeddings: c.tie_word_embeddings,
        rotary_dim: c.rotary_dim,
        rope_mscale: c.rope_attention_factor,
        qk_norm: c.qk_norm,
        layer_attention: c.layers.clone(),
        local_inv_freq: c.has_local_rope().then(|| {
            let sliding = c
                .layers
                .iter()
                .position(|l| l.window.is_some())
                .unwrap_or(0);
            c.layer_rope_periods(sliding)
                .iter()
                .map(|p| 1.0 / p)
                .collect()
        }),
        norm_offset: c.norm_weight_offset,
        sandwich_norms: c.sandwich_norms,
        gelu,
        embedding_scale: c.embedding_scale,
        attention_scale: c.attention_scale,
        attn_softcap: c.attn_logit_softcapping,
        final_softcap: c.final_logit_softcapping,
        packed: Default::default(),
    })
}

/// The program's dimensions for a checkpoint, with the quantized weights the packed format can
/// pass packed (4- and 8-bit, whole groups); other quantized weights are dequantized on the host
/// under every format.
pub fn checkpoint_dims(checkpoint: &Checkpoint) -> Result<LlamaDims> {
    let mut dims = llama_dims(checkpoint.config())?;
    let mut packed = BTreeMap::new();
    for spec in weight_specs(&dims) {
        let Some(module) = spec.name.strip_suffix(".weight") else {
            continue;
        };
        let (Some(q), Some(scales), Some(biases)) = (
            checkpoint.quantization_of(module),
            checkpoint.tensor_info(&format!("{module}.scales")),
            checkpoint.tensor_info(&format!("{module}.biases")),
        ) else {
            continue;
        };
        let in_dim = match spec.layout {
            Layout::AsIs => spec.dims[1],
            Layout::Transposed => spec.dims[0],
        } as usize;
        if !matches!(q.bits, 4 | 8)
            || q.group_size == 0
            || !in_dim.is_multiple_of(q.group_size)
            || scales.dtype != biases.dtype
        {
            continue;
        }
        let scales = match scales.dtype {
            Dtype::F16 => ElementType::F16,
            _ => ElementType::F32,
        };
        packed.insert(
            spec.name.clone(),
            Packing {
                bits: q.bits,
                group: q.group_size,
                scales,
            },
        );
    }
    dims.packed = packed;
    Ok(dims)
}

fn tensor_error(name: &str, reason: impl Into<String>) -> Error {
    Error::Tensor {
        name: name.to_owned(),
        reason: reason.into(),
    }
}

fn floats(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => return Err(tensor_error(name, format!("unsupported dtype {other:?}"))),
    })
}

/// The checkpoint tensor `spec` names, as f32 in the checkpoint's `[rows, cols]` layout.
fn checkpoint_f32(checkpoint: &Checkpoint, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
    let view = checkpoint
        .tensor(name)
        .ok_or_else(|| tensor_error(name, "missing from the checkpoint"))?;
    let module = name.strip_suffix(".weight");
    let spec = module.and_then(|m| checkpoint.quantization_of(m));
    match (module, spec) {
        (Some(module), Some(spec))
            if checkpoint
                .tensor_info(&format!("{module}.scales"))
                .is_some() =>
        {
            let scales_name = format!("{module}.scales");
            let biases_name = format!("{module}.biases");
            let scales = checkpoint
                .tensor(&scales_name)
                .ok_or_else(|| tensor_error(&scales_name, "missing"))?;
            let biases = checkpoint
                .tensor(&biases_name)
                .ok_or_else(|| tensor_error(&biases_name, "missing"))?;
            let rows = view.shape[0];
            let cols = scales.shape.get(1).copied().unwrap_or(0) * spec.group_size;
            let values = dequantize(
                spec,
                rows,
                cols,
                view.data,
                &floats(&scales_name, scales.dtype, scales.data)?,
                &floats(&biases_name, biases.dtype, biases.data)?,
            )
            .ok_or_else(|| tensor_error(name, "quantized sizes do not fit its shape"))?;
            Ok((values, vec![rows, cols]))
        }
        _ => Ok((floats(name, view.dtype, view.data)?, view.shape.to_vec())),
    }
}

/// MLX affine dequantization, `scale · q + bias` in f32: the arithmetic of
/// `mlxcel_model::dequantize_affine`, here so that it runs optimised with this crate (see the
/// workspace's `profile.dev.package` entry) when loading a model in a debug build.
fn dequantize(
    spec: mlxcel_model::QuantSpec,
    rows: usize,
    cols: usize,
    packed: &[u8],
    scales: &[f32],
    biases: &[f32],
) -> Option<Vec<f32>> {
    let bits = spec.bits as usize;
    let group = spec.group_size;
    if bits == 0 || !32usize.is_multiple_of(bits) || group == 0 || !cols.is_multiple_of(group) {
        return None;
    }
    let per_word = 32 / bits;
    let width = cols / per_word;
    let groups = cols / group;
    if packed.len() != rows * width * 4
        || scales.len() != rows * groups
        || biases.len() != rows * groups
    {
        return None;
    }
    let mask = (1u32 << bits) - 1;
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        let row = &packed[r * width * 4..(r + 1) * width * 4];
        let out_row = &mut out[r * cols..(r + 1) * cols];
        for (w, word) in row.chunks_exact(4).enumerate() {
            let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            for k in 0..per_word {
                let c = w * per_word + k;
                let g = r * groups + c / group;
                let q = (word >> (bits * k)) & mask;
                out_row[c] = scales[g] * q as f32 + biases[g];
            }
        }
    }
    Some(out)
}

/// One buffer's bytes, dims and element type.
pub type Buffer = (Vec<u8>, Vec<usize>, ElementType);

/// The argument buffers of one weight under `format`, in argument order (see
/// [`weight_types`]): one, or the integers, scales and biases of a packed weight.
pub fn weight_buffers(
    checkpoint: &Checkpoint,
    spec: &WeightSpec,
    format: WeightFormat,
) -> Result<Vec<Buffer>> {
    let types = weight_types(spec, format);
    let [q_ty, s_ty, b_ty] = &types[..] else {
        return Ok(vec![weight_bytes(checkpoint, spec, format)?]);
    };
    let module = spec.name.strip_suffix(".weight").unwrap_or(&spec.name);
    let dims = |ty: &crate::hlo::TensorType| ty.dims.iter().map(|&d| d as usize).collect();
    let view = checkpoint
        .tensor(&spec.name)
        .ok_or_else(|| tensor_error(&spec.name, "missing from the checkpoint"))?;
    let q_bytes = q_ty.elements() as usize * q_ty.element.bits() / 8;
    if view.dtype != Dtype::U32 || view.data.len() != q_bytes {
        return Err(tensor_error(
            &spec.name,
            format!(
                "{:?} of {} bytes, the program expects {q_ty} ({q_bytes} bytes)",
                view.dtype,
                view.data.len()
            ),
        ));
    }
    let mut buffers = vec![(view.data.to_vec(), dims(q_ty), q_ty.element)];
    for (suffix, ty) in [("scales", s_ty), ("biases", b_ty)] {
        let name = format!("{module}.{suffix}");
        let t = checkpoint
            .tensor(&name)
            .ok_or_else(|| tensor_error(&name, "missing"))?;
        if t.shape.iter().map(|&d| d as i64).collect::<Vec<_>>() != ty.dims {
            return Err(tensor_error(
                &name,
                format!("shape {:?}, the program expects {ty}", t.shape),
            ));
        }
        let bytes = match (t.dtype, ty.element) {
            (Dtype::F16, ElementType::F16) | (Dtype::F32, ElementType::F32) => t.data.to_vec(),
            (_, ElementType::F32) => floats(&name, t.dtype, t.data)?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            (dtype, element) => {
                return Err(tensor_error(
                    &name,
                    format!("{dtype:?} cannot be passed as {element:?}"),
                ));
            }
        };
        buffers.push((bytes, dims(ty), ty.element));
    }
    Ok(buffers)
}

/// One dense weight argument's bytes, dims and element type under `format`.
pub fn weight_bytes(
    checkpoint: &Checkpoint,
    spec: &WeightSpec,
    format: WeightFormat,
) -> Result<(Vec<u8>, Vec<usize>, ElementType)> {
    let (values, shape) = checkpoint_f32(checkpoint, &spec.name)?;
    let (values, shape) = match spec.layout {
        Layout::AsIs => (values, shape),
        Layout::Transposed => {
            let [rows, cols] = shape[..] else {
                return Err(tensor_error(
                    &spec.name,
                    format!("expected 2-D, got {shape:?}"),
                ));
            };
            let mut t = vec![0f32; values.len()];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = values[r * cols + c];
                }
            }
            (t, vec![cols, rows])
        }
    };
    let want: Vec<usize> = spec.dims.iter().map(|&d| d as usize).collect();
    if shape != want {
        return Err(tensor_error(
            &spec.name,
            format!("shape {shape:?}, the program expects {want:?}"),
        ));
    }
    let ty = weight_type(spec, format);
    let element = ty.element;
    let (values, shape) = match (spec.block(), &shape[..]) {
        // `[in, out]` as `[out / block, in, block]`.
        (Some(block), &[input, out]) => {
            let block = block as usize;
            let mut blocked = vec![0f32; values.len()];
            for (b, chunk) in blocked.chunks_exact_mut(input * block).enumerate() {
                for (r, row) in chunk.chunks_exact_mut(block).enumerate() {
                    let from = r * out + b * block;
                    row.copy_from_slice(&values[from..from + block]);
                }
            }
            (blocked, ty.dims.iter().map(|&d| d as usize).collect())
        }
        _ => (values, shape),
    };
    let bytes = match element {
        ElementType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    Ok((bytes, shape, element))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_hybrid_model_is_refused_by_name() {
        let config = ModelConfig::from_json(
            Path::new("config.json"),
            r#"{"architectures": ["Qwen3_5ForCausalLM"], "hidden_size": 64,
                "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 128, "vocab_size": 384,
                "max_position_embeddings": 1024, "full_attention_interval": 2,
                "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "linear_key_head_dim": 16, "linear_value_head_dim": 8}"#,
        )
        .unwrap();
        let err = llama_dims(&config).unwrap_err().to_string();
        assert!(
            err.contains("qwen3_5 is a hybrid model (2 of its 4 layers"),
            "{err}"
        );
        assert!(
            err.contains("the OpenXLA backend has no linear attention"),
            "{err}"
        );
    }
}
