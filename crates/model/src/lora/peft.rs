//! PEFT's LoRA adapters: `adapter_config.json` (`peft_type` LORA, `r`, `lora_alpha`) beside
//! `adapter_model.safetensors`, whose tensors are
//! `base_model.model.model.layers.{i}.{module}.lora_A.weight` (`[r, in]`) and `lora_B.weight`
//! (`[out, r]`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value;

use super::types::{LoraAdapter, LoraTarget, checked_weight, refusal};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::safetensors_files::{Dtype, SafetensorsFiles, TensorView};

const CONFIG: &str = "adapter_config.json";
const WEIGHTS: &str = "adapter_model.safetensors";

pub(super) fn open(path: &Path, config: &ModelConfig) -> Result<LoraAdapter> {
    let (dir, weights) = if path.is_dir() {
        (path.to_path_buf(), path.join(WEIGHTS))
    } else {
        let dir = path.parent().map_or_else(PathBuf::new, Path::to_path_buf);
        (dir, path.to_path_buf())
    };
    let config_path = dir.join(CONFIG);
    let text = std::fs::read_to_string(&config_path).map_err(|e| {
        refusal(
            path,
            format!(
                "neither a GGUF adapter nor a PEFT adapter: {} cannot be read ({e})",
                config_path.display()
            ),
        )
    })?;
    let json: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: config_path.clone(),
        source,
    })?;
    let alpha = check_config(&config_path, &json)?;
    let files = SafetensorsFiles::open_files(&[weights])?;
    let mut pairs: BTreeMap<(usize, LoraTarget), (Option<TensorView<'_>>, Option<TensorView<'_>>)> =
        BTreeMap::new();
    for view in files.iter() {
        let name = view.name;
        let (layer, target, is_a) = parse_name(config, name).ok_or_else(|| {
            refusal(
                path,
                format!(
                    "tensor `{name}`: mlxcel applies LoRA (lora_A/lora_B) to a decoder layer's \
                     q/k/v/o and gate/up/down projections only, and the model has no such \
                     projection by this name"
                ),
            )
        })?;
        let entry = pairs.entry((layer, target)).or_default();
        if is_a {
            entry.0 = Some(view);
        } else {
            entry.1 = Some(view);
        }
    }
    let mut weights = Vec::with_capacity(pairs.len());
    for ((layer, target), pair) in pairs {
        let (Some(a), Some(b)) = pair else {
            return Err(refusal(
                path,
                format!(
                    "layer {layer} {}: one of lora_A and lora_B is missing",
                    target.hf_module()
                ),
            ));
        };
        weights.push(checked_weight(
            path,
            config,
            a.name,
            (layer, target),
            (a.shape, floats(path, &a)?),
            (b.shape, floats(path, &b)?),
        )?);
    }
    Ok(LoraAdapter {
        path: path.to_path_buf(),
        alpha,
        task_name: String::new(),
        prompt_prefix: String::new(),
        weights,
    })
}

/// Checks the keys of `adapter_config.json` that change the arithmetic; returns `lora_alpha`.
fn check_config(path: &Path, json: &Value) -> Result<f32> {
    let field = |key: &str, reason: String| ModelError::InvalidField {
        path: path.to_path_buf(),
        field: key.into(),
        reason,
    };
    match json.get("peft_type").and_then(Value::as_str) {
        Some("LORA") | None => {}
        Some(other) => return Err(field("peft_type", format!("`{other}` is not LORA"))),
    }
    for key in ["use_dora", "use_rslora", "fan_in_fan_out"] {
        if json.get(key).and_then(Value::as_bool) == Some(true) {
            return Err(field(key, "true is not supported (plain LoRA only)".into()));
        }
    }
    for key in ["alpha_pattern", "rank_pattern"] {
        if let Some(map) = json.get(key).and_then(Value::as_object)
            && !map.is_empty()
        {
            return Err(field(key, "per-module patterns are not supported".into()));
        }
    }
    let rank = json.get("r").and_then(Value::as_u64);
    match json.get("lora_alpha").and_then(Value::as_f64) {
        Some(alpha) => Ok(alpha as f32),
        // PEFT's default alpha is 8.
        None if rank.is_some() => Ok(8.0),
        None => Err(ModelError::MissingField {
            path: path.to_path_buf(),
            field: "lora_alpha".into(),
        }),
    }
}

/// `(layer, target, is lora_A)` of a PEFT tensor name.
fn parse_name(config: &ModelConfig, name: &str) -> Option<(usize, LoraTarget, bool)> {
    let rest = name.strip_prefix("base_model.model.").unwrap_or(name);
    let rest = rest.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, is_a) = if let Some(m) = rest.strip_suffix(".lora_A.weight") {
        (m, true)
    } else {
        (rest.strip_suffix(".lora_B.weight")?, false)
    };
    let layer: usize = layer.parse().ok()?;
    let _ = config;
    Some((layer, LoraTarget::from_hf_module(module)?, is_a))
}

/// A tensor's values as f32.
fn floats(path: &Path, view: &TensorView<'_>) -> Result<Vec<f32>> {
    let data = view.data;
    Ok(match view.dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(refusal(
                path,
                format!("tensor `{}`: dtype {other:?} is not a float", view.name),
            ));
        }
    })
}
