//! Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention (q/k norm, no biases) with a routed
//! mixture of experts (`num_experts`, `num_experts_per_tok` of them per token, softmax then top-k,
//! renormalised with `norm_topk_prob`); `mlp_only_layers` and `decoder_sparse_step` keep some
//! layers dense.

use serde_json::Value;

use super::family::{Defaults, Family, Features};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config};
use crate::config::blocks::Routing;
use crate::config::raw::RawConfig;
use crate::gguf::header::GgufHeader;

pub(super) struct Qwen3Moe;

impl Family for Qwen3Moe {
    fn hf_name(&self) -> &'static str {
        "Qwen3MoeForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen3_moe"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen3moe"
    }

    /// transformers' `Qwen3MoeConfig` defaults.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 151_936,
            hidden_size: 2048,
            intermediate_size: 6144,
            num_hidden_layers: 24,
            num_key_value_heads: Some(4),
            max_position_embeddings: 32_768,
            sliding_window: Some(4096),
            ..Defaults::LLAMA
        }
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: true,
            ..Features::LLAMA
        }
    }

    /// transformers' Qwen3-MoE slides every layer when `use_sliding_window` is set (it has no
    /// `max_window_layers`; mlx-lm slides none, and no released checkpoint sets it).
    fn slides(&self, raw: &RawConfig, window: Option<usize>, _layer: usize) -> bool {
        raw.use_sliding_window == Some(true) && window.is_some()
    }

    fn has_experts(&self) -> bool {
        true
    }

    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        Some(ExpertKeys {
            count: "num_experts",
            count_alias: None,
            intermediate: Some("moe_intermediate_size"),
            // transformers' Qwen3MoeConfig defaults `norm_topk_prob` to false.
            routing: Routing::SoftmaxTopK {
                renormalize: raw.norm_topk_prob.unwrap_or(false),
            },
            shared_expert: false,
            top_k_alias: None,
            activation: None,
            biases: false,
            dense_layers: true,
        })
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gguf_expert_config(
            header,
            config,
            GgufExpertKeys {
                count: "num_experts",
                moe_intermediate: true,
                // llama.cpp's qwen3moe always renormalises the top-k weights.
                norm_topk_prob: Some(true),
                shared_expert: false,
            },
        );
    }
}
