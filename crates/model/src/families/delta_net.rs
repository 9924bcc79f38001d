//! What the gated-DeltaNet hybrid families (Qwen3-Next, Qwen3.5) share: which layers are linear
//! attention, and the shape of those layers, read from config.json as transformers reads them.

use std::path::Path;

use crate::config::blocks::GatedDeltaNet;
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};

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
