//! Qwen2-MoE (`Qwen2MoeForCausalLM`): Qwen2's attention (biases on q/k/v, `qkv_bias`) with a
//! routed mixture of experts (`num_experts`, `num_experts_per_tok` per token, each a gated MLP of
//! `moe_intermediate_size`; softmax then top-k, renormalised with `norm_topk_prob`) plus a shared
//! expert of `shared_expert_intermediate_size` whose output is scaled by
//! `sigmoid(shared_expert_gate · x)`; `mlp_only_layers` and `decoder_sparse_step` keep layers
//! dense.

use std::path::Path;

use serde_json::{Value, json};

use super::family::{Defaults, Family};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config};
use crate::config::blocks::Routing;
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

pub(super) struct Qwen2Moe;

impl Family for Qwen2Moe {
    fn hf_name(&self) -> &'static str {
        "Qwen2MoeForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen2_moe"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen2moe"
    }

    /// transformers' `Qwen2MoeConfig` defaults.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 151_936,
            hidden_size: 2048,
            intermediate_size: 5632,
            num_hidden_layers: 24,
            num_attention_heads: 16,
            num_key_value_heads: Some(16),
            max_position_embeddings: 32_768,
            sliding_window: Some(4096),
            ..Defaults::LLAMA
        }
    }

    /// transformers' Qwen2MoeConfig: `qkv_bias`, default true; no bias on the output.
    fn attention_biases(&self, raw: &RawConfig) -> (bool, bool) {
        (raw.qkv_bias.unwrap_or(true), false)
    }

    /// transformers' releases disagree on which layers `use_sliding_window` makes slide (those
    /// from `max_window_layers` on, then every other one below it) and mlx-lm ignores it, so a
    /// config that asks for it is refused; no released Qwen2-MoE does.
    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        if raw.use_sliding_window == Some(true) && raw.layer_types.is_none() {
            return Err(ModelError::invalid(
                path,
                "use_sliding_window",
                "Qwen2-MoE's sliding layers are not supported without `layer_types`",
            ));
        }
        Ok(())
    }

    fn has_experts(&self) -> bool {
        true
    }

    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        Some(ExpertKeys {
            count: "num_experts",
            count_alias: None,
            intermediate: Some("moe_intermediate_size"),
            // transformers' Qwen2MoeConfig defaults `norm_topk_prob` to false.
            routing: Routing::SoftmaxTopK {
                renormalize: raw.norm_topk_prob.unwrap_or(false),
            },
            shared_expert: true,
            top_k_alias: None,
            activation: None,
            biases: false,
            dense_layers: true,
        })
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        config["qkv_bias"] = json!(header.attention_bias);
        gguf_expert_config(
            header,
            config,
            GgufExpertKeys {
                count: "num_experts",
                moe_intermediate: true,
                // llama.cpp's qwen2moe never renormalises the top-k weights.
                norm_topk_prob: Some(false),
                shared_expert: true,
            },
        );
    }
}
