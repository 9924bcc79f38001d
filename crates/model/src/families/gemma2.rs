//! Gemma 2 (`Gemma2ForCausalLM`): scaled embeddings, `1 + w` norms around attention and MLP, a
//! GELU-tanh MLP, logit soft-capping (attention and final), every other layer sliding. What
//! Gemma 3 shares with it is here too ([`GEMMA_FEATURES`], [`gemma_tensor_name`],
//! [`gemma_gguf_config`]).

use serde_json::{Value, json};

use super::family::{Defaults, Family, Features};
use crate::config::blocks::HiddenActivation;
use crate::config::raw::RawConfig;
use crate::gguf::header::{GgufHeader, shortest};
use crate::gguf::names::hf_name;

pub(super) struct Gemma2;

/// transformers' Gemma 2 defaults.
pub(super) const GEMMA2_DEFAULTS: Defaults = Defaults {
    vocab_size: 256_000,
    hidden_size: 2304,
    intermediate_size: 9216,
    num_hidden_layers: 26,
    num_attention_heads: 8,
    num_key_value_heads: Some(4),
    head_dim: Some(256),
    max_position_embeddings: 8192,
    tie_word_embeddings: true,
    hidden_activation: HiddenActivation::GeluTanh,
    sliding_window: Some(4096),
    query_pre_attn_scalar: Some(256.0),
    attn_logit_softcapping: Some(50.0),
    final_logit_softcapping: Some(30.0),
    ..Defaults::LLAMA
};

/// Gemma's four norms per layer, stored as offsets from one, and its scaled embeddings.
pub(super) const GEMMA_FEATURES: Features = Features {
    qk_norm: false,
    qk_norm_whole: false,
    norm_weight_offset: true,
    sandwich_norms: true,
    scaled_embeddings: true,
    attention_output_gate: false,
    attention_sinks: false,
    embedding_scale_bf16: true,
    value_norm: false,
    layer_scalars: false,
    attention_scale: None,
};

impl Family for Gemma2 {
    fn hf_name(&self) -> &'static str {
        "Gemma2ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "gemma2"
    }

    fn gguf_name(&self) -> &'static str {
        "gemma2"
    }

    fn defaults(&self) -> Defaults {
        GEMMA2_DEFAULTS
    }

    fn features(&self) -> Features {
        GEMMA_FEATURES
    }

    /// Gemma 2 alternates: the first layer slides.
    fn slides(&self, _raw: &RawConfig, window: Option<usize>, layer: usize) -> bool {
        window.is_some() && !(layer + 1).is_multiple_of(2)
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        gemma_tensor_name(gguf_name)
    }

    fn gguf_sliding_period(&self) -> Option<u64> {
        Some(2)
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gemma_gguf_config(header, 46, config);
    }
}

/// A Gemma GGUF tensor's Hugging Face name: its `ffn_norm` is the MLP's input norm
/// (`pre_feedforward_layernorm`); its `post_attention_layernorm` is llama.cpp's
/// `post_attention_norm`.
pub(super) fn gemma_tensor_name(gguf_name: &str) -> Option<(String, &str)> {
    let (module, suffix) = hf_name(gguf_name)?;
    if gguf_name.contains(".ffn_norm.") {
        let layer = module.strip_suffix(".post_attention_layernorm")?;
        return Some((format!("{layer}.pre_feedforward_layernorm"), suffix));
    }
    Some((module, suffix))
}

/// config.json's Gemma keys from a GGUF header; `big_layers` is the layer count of the family's
/// 27B model, which llama.cpp scales queries differently for.
pub(super) fn gemma_gguf_config(header: &GgufHeader, big_layers: u64, config: &mut Value) {
    config["hidden_activation"] = json!("gelu_pytorch_tanh");
    config["hidden_act"] = json!("gelu_pytorch_tanh");
    // GGUF has no query_pre_attn_scalar: llama.cpp scales by 1/√head_dim, except for the 27B
    // models (46 layers for Gemma 2, 62 for Gemma 3), which use hidden/heads.
    config["query_pre_attn_scalar"] = if header.block_count == big_layers {
        json!(header.embedding_length / header.head_count.max(1))
    } else {
        json!(header.head_dim)
    };
    // Absent keys mean "none" in llama.cpp, not Hugging Face's Gemma 2 defaults.
    config["attn_logit_softcapping"] = json!(header.attn_softcap);
    config["final_logit_softcapping"] = json!(header.final_softcap);
    match header.sliding_window {
        Some(window) => {
            config["sliding_window"] = json!(window);
            config["layer_types"] = json!(
                header
                    .sliding_layers
                    .iter()
                    .map(|&s| if s {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    })
                    .collect::<Vec<_>>()
            );
        }
        None => {
            config["sliding_window"] = Value::Null;
            config["layer_types"] = json!(vec!["full_attention"; header.block_count as usize]);
        }
    }
    if let Some(theta) = header.rope_theta_swa {
        config["rope_local_base_freq"] = json!(shortest(theta));
    }
}
