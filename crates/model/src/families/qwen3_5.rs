//! Qwen3.5 (`Qwen3_5ForCausalLM`, and `Qwen3_5MoeForCausalLM` with routed experts): Qwen3-Next's
//! hybrid of gated-DeltaNet and gated softmax attention, with the linear layers' projections
//! stored apart (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) and RoPE read from
//! `rope_parameters` (`rope_theta`, `partial_rotary_factor`; its `mrope_section` rotates text
//! positions as plain RoPE). The MoE form routes every layer (softmax, top-k renormalised with
//! `norm_topk_prob`) beside a gated shared expert.

use std::path::Path;

use serde_json::Value;

use super::delta_net::{self, delta_net_layers};
use super::family::{Defaults, Family, Features};
use super::moe::{ExpertKeys, gguf_expert_config};
use super::qwen3_next::{HYBRID_FEATURES, HYBRID_GGUF_EXPERTS, check_hybrid};
use crate::config::blocks::{GatedDeltaNet, Routing};
use crate::config::raw::RawConfig;
use crate::error::Result;
use crate::gguf::header::GgufHeader;

pub(super) struct Qwen35;

pub(super) struct Qwen35Moe;

/// mlx-lm's Qwen3.5 defaults for RoPE (`rope_parameters`' `rope_theta` 100000 and
/// `partial_rotary_factor` 0.25).
const QWEN35_DEFAULTS: Defaults = Defaults {
    rope_theta: 100_000.0,
    partial_rotary_factor: Some(0.25),
    ..Defaults::LLAMA
};

impl Family for Qwen35 {
    fn hf_name(&self) -> &'static str {
        "Qwen3_5ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen3_5"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen35"
    }

    fn defaults(&self) -> Defaults {
        QWEN35_DEFAULTS
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
        delta_net_layers(path, raw, layers, false)
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        delta_net::gguf_tensor_name(gguf_name)
    }

    /// llama.cpp's `qwen35` converter moves the value heads to tiled order.
    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        delta_net::gguf_config(header, config, true);
    }
}

impl Family for Qwen35Moe {
    fn hf_name(&self) -> &'static str {
        "Qwen3_5MoeForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen3_5_moe"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen35moe"
    }

    fn defaults(&self) -> Defaults {
        QWEN35_DEFAULTS
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
        delta_net_layers(path, raw, layers, false)
    }

    fn has_experts(&self) -> bool {
        true
    }

    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        Some(ExpertKeys {
            count: "num_experts",
            count_alias: None,
            intermediate: Some("moe_intermediate_size"),
            // mlx-lm's Qwen3.5 defaults `norm_topk_prob` to true.
            routing: Routing::SoftmaxTopK {
                renormalize: raw.norm_topk_prob.unwrap_or(true),
            },
            shared_expert: true,
            top_k_alias: None,
            activation: None,
            biases: false,
            dense_layers: false,
        })
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        delta_net::gguf_tensor_name(gguf_name)
    }

    /// llama.cpp's `qwen35moe` converter moves the value heads to tiled order; every layer
    /// routes (Qwen3.5-MoE has no dense layers to list).
    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        delta_net::gguf_config(header, config, true);
        gguf_expert_config(header, config, HYBRID_GGUF_EXPERTS);
        if let Some(object) = config.as_object_mut() {
            object.remove("decoder_sparse_step");
            object.remove("mlp_only_layers");
        }
    }
}
