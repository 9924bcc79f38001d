//! What the gated-DeltaNet hybrid families (Qwen3-Next, Qwen3.5) share: which layers are linear
//! attention, and the shape of those layers, read from config.json as transformers reads them.

use std::path::Path;

use serde_json::{Value, json};

use crate::config::blocks::GatedDeltaNet;
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;
use crate::gguf::names::hf_name;

/// transformers' `full_attention_interval` when config.json leaves it out: every fourth layer
/// is softmax attention.
const FULL_ATTENTION_INTERVAL: usize = 4;

/// transformers' `linear_conv_kernel_dim` when config.json leaves it out.
const CONV_KERNEL: usize = 4;

/// The largest convolution mlxcel accepts (released models have 4 taps): a bound on the state a
/// hostile config makes every sequence keep.
const MAX_CONV_KERNEL: usize = 64;

/// Per layer, `Some` for a gated-DeltaNet layer: those `layer_types` lists as
/// `linear_attention`, else all but every `full_attention_interval`-th (mlx-lm reads only the
/// interval; a config whose two keys disagree is refused rather than run one way).
pub(crate) fn delta_net_layers(
    path: &Path,
    raw: &RawConfig,
    layers: usize,
    fused_projections: bool,
) -> Result<Vec<Option<GatedDeltaNet>>> {
    let interval = raw
        .full_attention_interval
        .unwrap_or(FULL_ATTENTION_INTERVAL);
    if interval == 0 {
        return Err(ModelError::invalid(
            path,
            "full_attention_interval",
            "must be at least 1",
        ));
    }
    let by_interval: Vec<bool> = (0..layers)
        .map(|i| !(i + 1).is_multiple_of(interval))
        .collect();
    let linear = match &raw.layer_types {
        None => by_interval,
        Some(types) if types.len() != layers => {
            return Err(ModelError::invalid(
                path,
                "layer_types",
                format!(
                    "lists {} layers, num_hidden_layers is {layers}",
                    types.len()
                ),
            ));
        }
        Some(types) => {
            let listed = types
                .iter()
                .map(|t| t == "linear_attention")
                .collect::<Vec<_>>();
            if raw.full_attention_interval.is_some() && listed != by_interval {
                return Err(ModelError::invalid(
                    path,
                    "layer_types",
                    format!(
                        "its linear_attention layers are not all but every \
                         full_attention_interval-th ({interval}); mlx-lm reads the interval, \
                         transformers the list: make them agree"
                    ),
                ));
            }
            listed
        }
    };
    let need = |value: Option<usize>, key: &str| -> Result<usize> {
        match value {
            None => Err(ModelError::MissingField {
                path: path.to_owned(),
                field: key.to_owned(),
            }),
            Some(0) => Err(ModelError::invalid(path, key, "must be at least 1")),
            Some(v) => Ok(v),
        }
    };
    if !linear.iter().any(|&l| l) {
        return Ok(vec![None; layers]);
    }
    let net = GatedDeltaNet {
        key_heads: need(raw.linear_num_key_heads, "linear_num_key_heads")?,
        value_heads: need(raw.linear_num_value_heads, "linear_num_value_heads")?,
        key_head_dim: need(raw.linear_key_head_dim, "linear_key_head_dim")?,
        value_head_dim: need(raw.linear_value_head_dim, "linear_value_head_dim")?,
        conv_kernel: need(
            raw.linear_conv_kernel_dim.or(Some(CONV_KERNEL)),
            "linear_conv_kernel_dim",
        )?,
        fused_projections,
        tiled_value_heads: match raw.linear_value_head_order.as_deref() {
            None | Some("grouped") => false,
            Some("tiled") => true,
            Some(other) => {
                return Err(ModelError::invalid(
                    path,
                    "linear_value_head_order",
                    format!("`{other}` is not `grouped` or `tiled`"),
                ));
            }
        },
    };
    if !net.value_heads.is_multiple_of(net.key_heads) {
        return Err(ModelError::invalid(
            path,
            "linear_num_value_heads",
            format!(
                "{} is not a multiple of linear_num_key_heads {}",
                net.value_heads, net.key_heads
            ),
        ));
    }
    if net.conv_kernel < 2 || net.conv_kernel > MAX_CONV_KERNEL {
        return Err(ModelError::invalid(
            path,
            "linear_conv_kernel_dim",
            format!(
                "{} taps (mlxcel accepts 2 to {MAX_CONV_KERNEL})",
                net.conv_kernel
            ),
        ));
    }
    Ok(linear.into_iter().map(|l| l.then_some(net)).collect())
}

/// A hybrid's GGUF tensor as its Hugging Face module and suffix: llama.cpp's names for the
/// linear-attention tensors (`attn_qkv`, `attn_gate`, `ssm_*`), else a llama's
/// ([`hf_name`], whose `post_attention_norm` is these families' `post_attention_layernorm`).
/// `ssm_a` (llama.cpp's `-exp(A_log)`, no suffix) becomes `A_log` and `ssm_dt.bias` `dt_bias`
/// under `linear_attn`; the converter undoes what llama.cpp's converter did to their values
/// and to `ssm_conv1d`'s and `ssm_ba`'s layout.
pub(crate) fn gguf_tensor_name(gguf_name: &str) -> Option<(String, &str)> {
    let Some((layer, part)) = gguf_name
        .strip_prefix("blk.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return hf_name(gguf_name);
    };
    let layer: usize = layer.parse().ok()?;
    let a = format!("model.layers.{layer}.linear_attn");
    if part == "ssm_a" {
        return Some((a, "A_log"));
    }
    let (stem, suffix) = part.rsplit_once('.')?;
    let module = match (stem, suffix) {
        ("ssm_dt", "bias") => return Some((a, "dt_bias")),
        (_, "weight") => match stem {
            "attn_qkv" => "in_proj_qkv",
            "attn_gate" => "in_proj_z",
            "ssm_conv1d" => "conv1d",
            "ssm_beta" => "in_proj_b",
            "ssm_alpha" => "in_proj_a",
            "ssm_ba" => "in_proj_ba",
            "ssm_norm" => "norm",
            "ssm_out" => "out_proj",
            _ => return hf_name(gguf_name),
        },
        _ => return hf_name(gguf_name),
    };
    Some((format!("{a}.{module}"), suffix))
}

/// Writes a hybrid GGUF file's linear-attention keys into its config.json: the heads' shape, the
/// convolution's taps, `layer_types`, and (`tiled`: llama.cpp's `qwen35` converter moved the
/// value heads to tiled order whenever they outnumber the key heads) `linear_value_head_order`.
/// The rotated share of each head is always written: the families' default is a quarter.
pub(crate) fn gguf_config(header: &GgufHeader, config: &mut Value, tiled: bool) {
    config["partial_rotary_factor"] = json!(header.rotary_dim as f64 / header.head_dim as f64);
    let Some(l) = &header.linear_attention else {
        return;
    };
    config["linear_num_key_heads"] = json!(l.key_heads);
    config["linear_num_value_heads"] = json!(l.value_heads);
    config["linear_key_head_dim"] = json!(l.key_head_dim);
    config["linear_value_head_dim"] = json!(l.value_head_dim);
    config["linear_conv_kernel_dim"] = json!(l.conv_kernel);
    let types: Vec<&str> = l
        .linear_layers
        .iter()
        .map(|&linear| {
            if linear {
                "linear_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    config["layer_types"] = json!(types);
    if tiled && l.key_heads != l.value_heads {
        config["linear_value_head_order"] = json!("tiled");
    }
}
