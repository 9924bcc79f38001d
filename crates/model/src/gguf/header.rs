//! The hyper-parameters a GGUF file's `{arch}.*` metadata gives, read once for the converter and
//! the family that writes its config.json.

use crate::error::{ModelError, Result};
use crate::gguf::linear_attention::{self, GgufLinearAttention};
use crate::gguf::reader::{GgufFile, GgufValue};
use crate::gguf::types::GgmlType;

/// The hyper-parameters from `{arch}.*` metadata.
#[derive(Debug)]
pub(crate) struct GgufHeader {
    /// `{arch}.attention.sliding_window`, and per layer whether it slides.
    pub(crate) sliding_window: Option<u64>,
    pub(crate) sliding_layers: Vec<bool>,
    pub(crate) attn_softcap: Option<f64>,
    pub(crate) final_softcap: Option<f64>,
    /// `{arch}.rope.freq_base_swa`: the sliding layers' RoPE base (Gemma 3).
    pub(crate) rope_theta_swa: Option<f32>,
    /// `{arch}.rope.scaling.factor` of linear scaling.
    pub(crate) rope_linear: Option<f64>,
    /// `{arch}.rope.scaling.factor` of YaRN scaling (`rope.scaling.type` `yarn`); its original
    /// window is `rope_original_context`, else `context_length`, as llama.cpp reads it.
    pub(crate) rope_yarn: Option<f64>,
    /// Features RoPE rotates (`rope.dimension_count`), and Phi-3's LongRoPE: the
    /// `rope_factors_long` tensor, `rope.scaling.attn_factor` and the original context length.
    pub(crate) rotary_dim: usize,
    pub(crate) long_factors: Option<Vec<f32>>,
    /// The file has `blk.0.attn_q.bias` (Hugging Face's `attention_bias`).
    pub(crate) attention_bias: bool,
    pub(crate) rope_attn_factor: Option<f64>,
    pub(crate) rope_original_context: Option<u64>,
    pub(crate) block_count: u64,
    pub(crate) context_length: usize,
    pub(crate) embedding_length: u64,
    pub(crate) feed_forward_length: u64,
    pub(crate) head_count: u64,
    pub(crate) head_count_kv: u64,
    /// `{arch}.attention.head_count_kv` when the file gives one count per layer (LFM2: 0 for
    /// its short-convolution layers); `head_count_kv` is then the largest of them.
    pub(crate) head_count_kv_per_layer: Option<Vec<u64>>,
    /// `{arch}.shortconv.l_cache`: LFM2's convolution taps.
    pub(crate) shortconv_l_cache: Option<u64>,
    /// `{arch}.leading_dense_block_count`: the dense layers before the routed ones.
    pub(crate) leading_dense_layers: Option<u64>,
    pub(crate) head_dim: usize,
    pub(crate) rope_theta: f32,
    pub(crate) rms_norm_eps: f32,
    pub(crate) vocab_size: usize,
    /// The mixture of experts, when `{arch}.expert_count` is above zero.
    pub(crate) experts: Option<GgufExperts>,
    /// A gated-DeltaNet hybrid's linear attention, when the file has `{arch}.ssm.conv_kernel`.
    pub(crate) linear_attention: Option<GgufLinearAttention>,
    /// `{arch}.nextn_predict_layers`: multi-token-prediction layers after the model's own
    /// (`block_count` counts only the model's; mlxcel does not read those layers' tensors).
    pub(crate) nextn_layers: u64,
    /// Gemma 4's keys: the sliding layers' head size (`attention.key_length_swa`; the full
    /// layers' is `head_dim`), the layers that reuse keys and values
    /// (`attention.shared_kv_layers`) and the per-layer inputs' width
    /// (`embedding_length_per_layer_input`).
    pub(crate) key_length_swa: Option<u64>,
    pub(crate) shared_kv_layers: Option<u64>,
    pub(crate) embedding_length_per_layer: Option<u64>,
    /// `{arch}.feed_forward_length` when the file gives one width per layer (Gemma 4's
    /// double-wide MLP on its shared layers); `feed_forward_length` is then the first.
    pub(crate) feed_forward_length_per_layer: Option<Vec<u64>>,
    /// Some layer has `attn_k` but no `attn_v` (Gemma 4's keys used as values).
    pub(crate) keys_as_values: bool,
}

/// A mixture of experts' `{arch}.expert_*` keys, as llama.cpp writes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GgufExperts {
    /// `expert_count`.
    pub(crate) count: u64,
    /// `expert_used_count`: experts per token.
    pub(crate) used: u64,
    /// `expert_feed_forward_length`: each expert's hidden size, if written.
    pub(crate) feed_forward_length: Option<u64>,
    /// `expert_shared_feed_forward_length`: the shared expert's, if written.
    pub(crate) shared_feed_forward_length: Option<u64>,
    /// `expert_weights_norm`: whether the top-k weights are renormalised, if written.
    pub(crate) weights_norm: Option<bool>,
}

impl GgufHeader {
    /// Reads the `{arch}.*` keys of `gguf`, whose `general.architecture` is `arch`; a file with a
    /// sliding window and no pattern makes every `sliding_period`-th layer global (`None`: the
    /// family's files carry no sliding layers).
    pub(crate) fn read(gguf: &GgufFile, arch: &str, sliding_period: Option<u64>) -> Result<Self> {
        let error = |key: &str, reason: String| ModelError::GgufMetadata {
            path: gguf.path().to_owned(),
            key: key.to_owned(),
            reason,
        };
        let key = |k: &str| format!("{arch}.{k}");
        let uint = |k: &str| -> Result<Option<u64>> {
            let k = key(k);
            gguf.get(&k)
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| error(&k, format!("{v:?} is not an unsigned integer")))
                })
                .transpose()
        };
        let need = |k: &str| uint(k)?.ok_or_else(|| error(&key(k), "missing".into()));
        let float = |k: &str, default: f64| -> Result<f64> {
            let k = key(k);
            gguf.get(&k).map_or(Ok(default), |v| {
                v.as_f64()
                    .ok_or_else(|| error(&k, format!("{v:?} is not a number")))
            })
        };
        let (mut rope_linear, mut rope_yarn) = (None, None);
        if let Some(kind) = gguf
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
            && kind != "none"
        {
            let factor = float("rope.scaling.factor", 1.0)?;
            match kind {
                "linear" if factor != 1.0 => rope_linear = Some(factor),
                "linear" => {}
                "yarn" => {
                    // llama.cpp's YaRN for the architectures mlxcel imports reads none of these
                    // keys (betas 32 and 1, full extrapolation mix, no log multiplier, its
                    // attention factor 0.1·ln(factor) + 1): a file that sets one otherwise
                    // describes a model llama.cpp does not compute, so it is refused by name.
                    for (k, neutral) in [
                        ("rope.scaling.yarn_beta_fast", 32.0),
                        ("rope.scaling.yarn_beta_slow", 1.0),
                        ("rope.scaling.yarn_ext_factor", 1.0),
                        ("rope.scaling.yarn_log_multiplier", 0.0),
                        ("rope.scaling.yarn_attn_factor", 1.0),
                    ] {
                        let value = float(k, neutral)?;
                        if value != neutral {
                            return Err(error(
                                &key(k),
                                format!(
                                    "{value}: only {neutral} is imported (what llama.cpp computes)"
                                ),
                            ));
                        }
                    }
                    if !(factor > 0.0 && factor.is_finite()) {
                        return Err(error(
                            &key("rope.scaling.factor"),
                            format!("{factor} is not a positive number"),
                        ));
                    }
                    rope_yarn = Some(factor);
                }
                other => {
                    return Err(error(
                        &key("rope.scaling.type"),
                        format!(
                            "rope scaling `{other}` is not supported for GGUF import (supported: \
                             linear, yarn)"
                        ),
                    ));
                }
            }
        }
        // llama.cpp counts the multi-token-prediction layers in `block_count`.
        let nextn_layers = uint("nextn_predict_layers")?.unwrap_or(0);
        let block_count = need("block_count")?
            .checked_sub(nextn_layers)
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                error(
                    &key("nextn_predict_layers"),
                    format!("{nextn_layers} is not fewer than block_count"),
                )
            })?;
        // llama.cpp's sliding layers: a per-layer list, else a period (every `period`-th layer
        // global): 2 for Gemma 2, 6 for Gemma 3.
        let sliding_window = uint("attention.sliding_window")?.filter(|&w| w > 0);
        let pattern_key = key("attention.sliding_window_pattern");
        let sliding_layers: Vec<bool> = match (sliding_period, sliding_window) {
            (Some(default), Some(_)) => match gguf.get(&pattern_key) {
                Some(GgufValue::Array(items)) => items
                    .iter()
                    .map(|v| {
                        v.as_bool().ok_or_else(|| {
                            error(&pattern_key, "expected a list of booleans".into())
                        })
                    })
                    .collect::<Result<_>>()?,
                other => {
                    let period = match other {
                        Some(v) => v.as_u64().ok_or_else(|| {
                            error(&pattern_key, format!("{v:?} is not an integer"))
                        })?,
                        None => default,
                    }
                    .max(1);
                    (0..block_count).map(|i| i % period < period - 1).collect()
                }
            },
            _ => Vec::new(),
        };
        if !sliding_layers.is_empty() && sliding_layers.len() as u64 != block_count {
            return Err(error(
                &pattern_key,
                format!(
                    "lists {} layers, block_count is {block_count}",
                    sliding_layers.len()
                ),
            ));
        }
        let optional_float = |k: &str| -> Result<Option<f64>> {
            let k = key(k);
            gguf.get(&k)
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| error(&k, format!("{v:?} is not a number")))
                })
                .transpose()
        };
        let head_count = need("attention.head_count")?;
        let kv_key = key("attention.head_count_kv");
        let (head_count_kv, head_count_kv_per_layer) =
            match gguf.get(&kv_key).and_then(GgufValue::as_array) {
                Some(items) => {
                    let counts = items
                        .iter()
                        .map(|v| {
                            v.as_u64().ok_or_else(|| {
                                error(&kv_key, format!("{v:?} is not an unsigned integer"))
                            })
                        })
                        .collect::<Result<Vec<u64>>>()?;
                    let largest = counts.iter().copied().max().unwrap_or(0);
                    (
                        if largest == 0 { head_count } else { largest },
                        Some(counts),
                    )
                }
                None => (uint("attention.head_count_kv")?.unwrap_or(head_count), None),
            };
        let embedding_length = need("embedding_length")?;
        // The head size is the key length; RoPE may rotate fewer features (Phi-3/Phi-4-mini's
        // partial rotary writes those as `rope.dimension_count`).
        let rope_dims = uint("rope.dimension_count")?;
        // As llama.cpp reads them: the key length, else hidden / heads; RoPE's width, else the
        // head's.
        let head_dim = match uint("attention.key_length")? {
            Some(d) => d,
            None => embedding_length / head_count.max(1),
        } as usize;
        let rotary_dim = rope_dims.map_or(head_dim, |d| d as usize);
        if rotary_dim == 0 || rotary_dim > head_dim || !rotary_dim.is_multiple_of(2) {
            return Err(error(
                &key("rope.dimension_count"),
                format!("{rotary_dim} rotated features for a head of {head_dim}"),
            ));
        }
        let tokens = gguf
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
            .map_or(0, <[GgufValue]>::len);
        // Per-pair factors on the RoPE periods: Phi-3's LongRoPE (`rope_factors_long`), or
        // Llama 3.1's scaling, which llama.cpp's converter precomputes into `rope_freqs`.
        let factors_tensor = ["rope_factors_long.weight", "rope_freqs.weight"]
            .into_iter()
            .find_map(|name| gguf.tensor_info(name));
        let long_factors = match factors_tensor {
            None => None,
            Some(info) if info.ggml_type == GgmlType::F32 => Some(
                gguf.tensor_data(info)?
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect::<Vec<f32>>(),
            ),
            Some(info) => {
                return Err(ModelError::GgufTensor {
                    path: gguf.path().to_owned(),
                    tensor: info.name.clone(),
                    reason: format!("is {}, expected F32", info.ggml_type),
                });
            }
        };
        let experts = match uint("expert_count")?.filter(|&n| n > 0) {
            None => None,
            Some(count) => Some(GgufExperts {
                count,
                used: need("expert_used_count")?,
                feed_forward_length: uint("expert_feed_forward_length")?,
                shared_feed_forward_length: uint("expert_shared_feed_forward_length")?,
                weights_norm: gguf
                    .get(&key("expert_weights_norm"))
                    .map(|v| {
                        v.as_bool().ok_or_else(|| {
                            error(&key("expert_weights_norm"), format!("{v:?} is not a bool"))
                        })
                    })
                    .transpose()?,
            }),
        };
        // One width per layer (Gemma 4): the first is the model's, the list its family's.
        let ffn_key = key("feed_forward_length");
        let feed_forward_length_per_layer = match gguf.get(&ffn_key).and_then(GgufValue::as_array) {
            Some(items) => Some(
                items
                    .iter()
                    .map(|v| {
                        v.as_u64().ok_or_else(|| {
                            error(&ffn_key, format!("{v:?} is not an unsigned integer"))
                        })
                    })
                    .collect::<Result<Vec<u64>>>()?,
            ),
            None => None,
        };
        let first_width = match &feed_forward_length_per_layer {
            Some(widths) => widths.first().copied(),
            None => uint("feed_forward_length")?,
        };
        // A mixture of experts' file may leave the dense size out (Qwen3.5-MoE): its experts'.
        let feed_forward_length = match (first_width, experts) {
            (Some(n), _) => n,
            (
                None,
                Some(GgufExperts {
                    feed_forward_length: Some(n),
                    ..
                }),
            ) => n,
            (None, _) => need("feed_forward_length")?,
        };
        Ok(Self {
            linear_attention: linear_attention::read(gguf, arch, block_count)?,
            nextn_layers,
            feed_forward_length_per_layer,
            keys_as_values: (0..block_count).any(|i| {
                gguf.tensor_info(&format!("blk.{i}.attn_k.weight"))
                    .is_some()
                    && gguf
                        .tensor_info(&format!("blk.{i}.attn_v.weight"))
                        .is_none()
            }),
            key_length_swa: uint("attention.key_length_swa")?,
            shared_kv_layers: uint("attention.shared_kv_layers")?,
            embedding_length_per_layer: uint("embedding_length_per_layer_input")?,
            experts,
            attention_bias: gguf.tensor_info("blk.0.attn_q.bias").is_some(),
            rotary_dim,
            long_factors,
            // rope_freqs carries no attention factor: 1.
            rope_attn_factor: optional_float("rope.scaling.attn_factor")?.or(factors_tensor
                .filter(|t| t.name == "rope_freqs.weight")
                .map(|_| 1.0)),
            rope_original_context: uint("rope.scaling.original_context_length")?,
            sliding_window,
            sliding_layers,
            attn_softcap: optional_float("attn_logit_softcapping")?,
            final_softcap: optional_float("final_logit_softcapping")?,
            rope_theta_swa: optional_float("rope.freq_base_swa")?.map(|v| v as f32),
            rope_linear,
            rope_yarn,
            block_count,
            context_length: need("context_length")? as usize,
            embedding_length,
            feed_forward_length,
            head_count,
            head_count_kv,
            head_count_kv_per_layer,
            shortconv_l_cache: uint("shortconv.l_cache")?,
            leading_dense_layers: uint("leading_dense_block_count")?,
            head_dim,
            rope_theta: float("rope.freq_base", 10_000.0)? as f32,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-5)? as f32,
            vocab_size: uint("vocab_size")?.map_or(tokens, |v| v as usize),
        })
    }
}

/// The f64 with the shortest decimal form that rounds to `v`: GGUF stores f32, and `1e-5` reads
/// better in config.json than its exact widening `9.999999747378752e-6`.
pub(crate) fn shortest(v: f32) -> f64 {
    v.to_string().parse().unwrap_or(f64::from(v))
}
