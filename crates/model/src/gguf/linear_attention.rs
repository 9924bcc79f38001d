//! The gated-DeltaNet keys of a hybrid's GGUF file (llama.cpp's `qwen3next`, `qwen35`,
//! `qwen35moe`): the linear-attention layers' shape under `{arch}.ssm.*` and which layers are
//! linear (`attention.recurrent_layers`, else every layer but each `full_attention_interval`-th).

use crate::error::{ModelError, Result};
use crate::gguf::reader::{GgufFile, GgufValue};

/// llama.cpp's `full_attention_interval` when the file leaves it out.
const FULL_ATTENTION_INTERVAL: u64 = 4;

/// A hybrid's linear-attention hyper-parameters, in Hugging Face's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GgufLinearAttention {
    /// `ssm.group_count`: key (and query) heads.
    pub(crate) key_heads: u64,
    /// `ssm.time_step_rank`: value heads.
    pub(crate) value_heads: u64,
    /// `ssm.state_size`: the size of a key head.
    pub(crate) key_head_dim: u64,
    /// `ssm.inner_size / ssm.time_step_rank`: the size of a value head.
    pub(crate) value_head_dim: u64,
    /// `ssm.conv_kernel`: the convolution's taps.
    pub(crate) conv_kernel: u64,
    /// Per layer (of the model's own, not the multi-token-prediction layers), whether it is
    /// linear attention.
    pub(crate) linear_layers: Vec<bool>,
}

/// Reads the keys of a file of architecture `arch` with `layers` decoder layers (`None`: the file
/// has no `ssm.conv_kernel`, so no linear attention). An error names a missing or bad key.
pub(crate) fn read(
    gguf: &GgufFile,
    arch: &str,
    layers: u64,
) -> Result<Option<GgufLinearAttention>> {
    let key = |k: &str| format!("{arch}.{k}");
    let error = |k: &str, reason: String| ModelError::GgufMetadata {
        path: gguf.path().to_owned(),
        key: key(k),
        reason,
    };
    let uint = |k: &str| -> Result<Option<u64>> {
        gguf.get(&key(k))
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| error(k, format!("{v:?} is not an unsigned integer")))
            })
            .transpose()
    };
    let Some(conv_kernel) = uint("ssm.conv_kernel")? else {
        return Ok(None);
    };
    let need = |k: &str| -> Result<u64> {
        match uint(k)? {
            None => Err(error(
                k,
                "missing (a gated-DeltaNet file has every ssm.* key)".into(),
            )),
            Some(0) => Err(error(k, "must be at least 1".into())),
            Some(v) => Ok(v),
        }
    };
    let key_heads = need("ssm.group_count")?;
    let value_heads = need("ssm.time_step_rank")?;
    let key_head_dim = need("ssm.state_size")?;
    let inner = need("ssm.inner_size")?;
    if !inner.is_multiple_of(value_heads) {
        return Err(error(
            "ssm.inner_size",
            format!("{inner} is not whole heads of ssm.time_step_rank {value_heads}"),
        ));
    }
    let listed = "attention.recurrent_layers";
    let linear_layers: Vec<bool> = match gguf.get(&key(listed)) {
        Some(GgufValue::Array(items)) => {
            let flags = items
                .iter()
                .map(|v| {
                    v.as_bool()
                        .ok_or_else(|| error(listed, "expected a list of booleans".into()))
                })
                .collect::<Result<Vec<bool>>>()?;
            // llama.cpp lists the multi-token-prediction layers too (never recurrent).
            if (flags.len() as u64) < layers || flags[layers as usize..].iter().any(|&f| f) {
                return Err(error(
                    listed,
                    format!(
                        "lists {} layers, the model has {layers} (and its prediction layers \
                         are never recurrent)",
                        flags.len()
                    ),
                ));
            }
            flags[..layers as usize].to_vec()
        }
        Some(other) => return Err(error(listed, format!("{other:?} is not a list"))),
        None => {
            let interval = uint("full_attention_interval")?.unwrap_or(FULL_ATTENTION_INTERVAL);
            if interval == 0 {
                return Err(error(
                    "full_attention_interval",
                    "must be at least 1".into(),
                ));
            }
            (0..layers)
                .map(|i| !(i + 1).is_multiple_of(interval))
                .collect()
        }
    };
    Ok(Some(GgufLinearAttention {
        key_heads,
        value_heads,
        key_head_dim,
        value_head_dim: inner / value_heads,
        conv_kernel,
        linear_layers,
    }))
}
