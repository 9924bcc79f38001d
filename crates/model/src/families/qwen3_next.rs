//! Qwen3-Next (`Qwen3NextForCausalLM`): a hybrid of gated-DeltaNet linear attention (three
//! layers in four, `full_attention_interval`) and gated softmax attention (`q_proj` gives each
//! head its queries and an output gate; q/k norms per head; RoPE on the first
//! `partial_rotary_factor` of each head), RMSNorm weights stored zero-centred (`1 + w`; mlx-lm's
//! converted checkpoints store `1 + w` itself, which the checkpoint tells apart by its
//! `conv1d` layout), and, when `num_experts` is set, Qwen2-MoE's routed experts with a gated
//! shared expert (`mlp_only_layers` and `decoder_sparse_step` keep layers dense). The linear
//! layers store their projections fused and grouped by key head (`in_proj_qkvz`, `in_proj_ba`).

use std::path::Path;

use serde_json::Value;

use super::delta_net::{self, delta_net_layers};
use super::family::{Defaults, Family, Features};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config};
use crate::config::blocks::{GatedDeltaNet, Routing};
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

/// How llama.cpp's hybrid files write their experts: routed in every layer, the top-k weights
/// always renormalised (its `qwen3next` and `qwen35moe` graphs), beside a gated shared expert.
pub(super) const HYBRID_GGUF_EXPERTS: GgufExpertKeys = GgufExpertKeys {
    count: "num_experts",
    moe_intermediate: true,
    norm_topk_prob: Some(true),
    shared_expert: true,
};

pub(super) struct Qwen3Next;

/// The features the gated-DeltaNet hybrids share: q/k norms, zero-centred norms, gated output.
pub(super) const HYBRID_FEATURES: Features = Features {
    qk_norm: true,
    norm_weight_offset: true,
    attention_output_gate: true,
    ..Features::LLAMA
};

/// Refuses what the hybrids' attention does not implement: biases (no released checkpoint has
/// them; the gated q projection would need its bias split too).
pub(super) fn check_hybrid(path: &Path, raw: &RawConfig) -> Result<()> {
    if raw.attention_bias == Some(true) {
        return Err(ModelError::invalid(
            path,
            "attention_bias",
            "attention biases are not supported for the gated-DeltaNet hybrids",
        ));
    }
    Ok(())
}

impl Family for Qwen3Next {
    fn hf_name(&self) -> &'static str {
        "Qwen3NextForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen3_next"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen3next"
    }

    /// transformers' Qwen3NextConfig.
    fn defaults(&self) -> Defaults {
        Defaults {
            partial_rotary_factor: Some(0.25),
            ..Defaults::LLAMA
        }
    }

    fn features(&self) -> Features {
        HYBRID_FEATURES
    }

    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        check_hybrid(path, raw)
    }

    fn linear_attention(
        &self,
        path: &Path,
        raw: &RawConfig,
        layers: usize,
    ) -> Result<Vec<Option<GatedDeltaNet>>> {
        delta_net_layers(path, raw, layers, true)
    }

    fn has_experts(&self) -> bool {
        true
    }

    /// Experts when `num_experts` is above zero (mlx-lm's dense form otherwise).
    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        raw.num_experts
            .is_some_and(|n| n > 0)
            .then_some(ExpertKeys {
                count: "num_experts",
                count_alias: None,
                intermediate: Some("moe_intermediate_size"),
                // transformers' Qwen3NextConfig defaults `norm_topk_prob` to true.
                routing: Routing::SoftmaxTopK {
                    renormalize: raw.norm_topk_prob.unwrap_or(true),
                },
                shared_expert: true,
                top_k_alias: None,
                activation: None,
                biases: false,
                dense_layers: true,
            })
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        delta_net::gguf_tensor_name(gguf_name)
    }

    /// llama.cpp's `qwen3next` converter splits `in_proj_qkvz` into `attn_qkv` and `attn_gate`
    /// (value heads still grouped by key head) and keeps `in_proj_ba` (`ssm_ba`), which the
    /// converter splits into `in_proj_b` and `in_proj_a`.
    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        delta_net::gguf_config(header, config, false);
        gguf_expert_config(header, config, HYBRID_GGUF_EXPERTS);
    }
}
