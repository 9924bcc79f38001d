//! Mixtral (`MixtralForCausalLM`): Mistral's attention with a routed mixture of experts in every
//! layer (`num_local_experts`, `num_experts_per_tok` of them per token, each a gated MLP of
//! `intermediate_size`), routed by a softmax over the top-k logits. llama.cpp writes it as a
//! `llama` with `llama.expert_count`.

use serde_json::Value;

use super::family::{Defaults, Family};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config};
use crate::config::blocks::Routing;
use crate::config::raw::RawConfig;
use crate::gguf::header::GgufHeader;

pub(super) struct Mixtral;

impl Family for Mixtral {
    fn hf_name(&self) -> &'static str {
        "MixtralForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "mixtral"
    }

    fn gguf_name(&self) -> &'static str {
        "llama"
    }

    /// transformers' MixtralConfig.
    fn defaults(&self) -> Defaults {
        Defaults {
            intermediate_size: 14_336,
            num_key_value_heads: Some(8),
            max_position_embeddings: 131_072,
            rope_theta: 1_000_000.0,
            rms_norm_eps: 1e-5,
            ..Defaults::LLAMA
        }
    }

    /// Every layer slides when `sliding_window` is set (transformers' MixtralAttention); the
    /// released checkpoints set it to null.
    fn slides(&self, raw: &RawConfig, window: Option<usize>, _layer: usize) -> bool {
        window.is_some() && raw.use_sliding_window != Some(false)
    }

    fn has_experts(&self) -> bool {
        true
    }

    fn expert_keys(&self, _raw: &RawConfig) -> Option<ExpertKeys> {
        Some(ExpertKeys {
            count: "num_local_experts",
            // transformers' MixtralConfig reads `num_experts` as the same count.
            count_alias: Some("num_experts"),
            intermediate: None,
            // transformers takes the top-k of the softmax and renormalises them, mlx-lm takes
            // the softmax of the top-k logits: the same weights.
            routing: Routing::TopKSoftmax,
            shared_expert: false,
            top_k_alias: None,
            activation: None,
            biases: false,
            dense_layers: false,
        })
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gguf_expert_config(
            header,
            config,
            GgufExpertKeys {
                count: "num_local_experts",
                moe_intermediate: false,
                norm_topk_prob: None,
                shared_expert: false,
            },
        );
    }
}
