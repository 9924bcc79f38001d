//! llama.cpp's GGUF LoRA adapters: `general.type = adapter`, `adapter.type = lora`,
//! `adapter.lora.alpha`, and per projection `blk.{i}.{name}.weight.lora_a` (`[rank, in]`) and
//! `.lora_b` (`[out, rank]`); q and k's `lora_b` rows permuted as llama.cpp permutes the model's.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::types::{LoraAdapter, LoraTarget, checked_weight, refusal};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::dequant::dequantize_reference;
use crate::gguf::permute::gguf_row_of_hf_row;
use crate::gguf::{GgufFile, GgufTensorInfo, hf_name_in};

/// Whether the file at `path` starts with GGUF's magic.
pub(super) fn is_gguf(path: &Path) -> Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    Ok(file.read_exact(&mut magic).is_ok() && &magic == b"GGUF")
}

fn text(gguf: &GgufFile, key: &str) -> Option<String> {
    gguf.get(key).and_then(|v| v.as_str()).map(str::to_owned)
}

pub(super) fn open(path: &Path, config: &ModelConfig) -> Result<LoraAdapter> {
    let gguf = GgufFile::open(path)?;
    let general_type = text(&gguf, "general.type").unwrap_or_default();
    if general_type != "adapter" {
        return Err(refusal(
            path,
            format!(
                "`general.type` is `{general_type}`, expected `adapter` (a model, not an adapter?)"
            ),
        ));
    }
    let adapter_type = text(&gguf, "adapter.type").unwrap_or_default();
    if adapter_type != "lora" {
        return Err(refusal(
            path,
            format!("`adapter.type` is `{adapter_type}`, expected `lora`"),
        ));
    }
    let arch = text(&gguf, "general.architecture").unwrap_or_default();
    let model_arch = config.architecture.gguf_name();
    if arch != model_arch {
        return Err(refusal(
            path,
            format!(
                "the adapter is for architecture `{arch}`, the model is `{model_arch}` (an \
                 adapter for another base model)"
            ),
        ));
    }
    let alpha = gguf
        .get("adapter.lora.alpha")
        .and_then(|v| v.as_f64())
        .unwrap_or(0.0) as f32;
    // Pair each projection's lora_a with its lora_b.
    let mut pairs: BTreeMap<&str, (Option<&GgufTensorInfo>, Option<&GgufTensorInfo>)> =
        BTreeMap::new();
    for info in &gguf.tensors {
        if let Some(base) = info.name.strip_suffix(".lora_a") {
            pairs.entry(base).or_default().0 = Some(info);
        } else if let Some(base) = info.name.strip_suffix(".lora_b") {
            pairs.entry(base).or_default().1 = Some(info);
        } else {
            return Err(refusal(
                path,
                format!(
                    "tensor `{}` is not a LoRA tensor (no `.lora_a`/`.lora_b` suffix)",
                    info.name
                ),
            ));
        }
    }
    let mut weights = Vec::with_capacity(pairs.len());
    for (base, pair) in pairs {
        let (Some(a), Some(b)) = pair else {
            return Err(refusal(
                path,
                format!("LoRA tensor pair for `{base}` is missing one of lora_a and lora_b"),
            ));
        };
        let (layer, target) = target_of(config, base).ok_or_else(|| {
            refusal(
                path,
                format!(
                    "tensor `{base}`: mlxcel applies LoRA to a decoder layer's q/k/v/o and \
                     gate/up/down projections only, and the model has no such projection by \
                     this name"
                ),
            )
        })?;
        let values = |info: &GgufTensorInfo| -> Result<Vec<f32>> {
            let data = gguf.tensor_data(info)?;
            dequantize_reference(info.ggml_type, data).ok_or_else(|| {
                refusal(
                    path,
                    format!(
                        "tensor `{}`: type {} is not readable as an adapter",
                        info.name,
                        info.ggml_type.name()
                    ),
                )
            })
        };
        let (a_shape, b_shape) = (a.shape(), b.shape());
        let mut b_values = values(b)?;
        if matches!(target, LoraTarget::Q | LoraTarget::K)
            && config.architecture.gguf_permuted_qk()
            && b_shape.len() == 2
            && b_shape[0] % config.head_dim == 0
        {
            b_values = unpermute(&b_values, b_shape[0], config.head_dim);
        }
        weights.push(checked_weight(
            path,
            config,
            base,
            (layer, target),
            (&a_shape, values(a)?),
            (&b_shape, b_values),
        )?);
    }
    Ok(LoraAdapter {
        path: path.to_path_buf(),
        alpha,
        task_name: text(&gguf, "adapter.lora.task_name").unwrap_or_default(),
        prompt_prefix: text(&gguf, "adapter.lora.prompt_prefix").unwrap_or_default(),
        weights,
    })
}

/// The layer and target of GGUF projection `base` (`blk.{i}.attn_q.weight`) in the model's
/// family naming.
fn target_of(config: &ModelConfig, base: &str) -> Option<(usize, LoraTarget)> {
    let (module, suffix) = hf_name_in(config.architecture, base)?;
    if suffix != "weight" {
        return None;
    }
    let rest = module.strip_prefix("model.layers.")?;
    let (layer, module) = rest.split_once('.')?;
    Some((layer.parse().ok()?, LoraTarget::from_hf_module(module)?))
}

/// Rows of `b` (`rows` rows) from llama.cpp's permuted order back to Hugging Face's.
fn unpermute(b: &[f32], rows: usize, head_dim: usize) -> Vec<f32> {
    let width = b.len() / rows;
    let mut out = Vec::with_capacity(b.len());
    for hf_row in 0..rows {
        let g = gguf_row_of_hf_row(hf_row, head_dim);
        out.extend_from_slice(&b[g * width..(g + 1) * width]);
    }
    out
}
