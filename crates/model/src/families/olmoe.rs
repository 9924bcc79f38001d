//! OLMoE (`OlmoeForCausalLM`): a llama whose q and k projections each go through one RMSNorm over
//! the whole projection (all heads together) before RoPE, with a routed mixture of experts in
//! every layer (`num_experts`, `num_experts_per_tok` per token, each a gated MLP of
//! `intermediate_size`), routed by softmax then top-k, renormalised with `norm_topk_prob`.

use std::path::Path;

use serde_json::Value;

use super::family::{Defaults, Family, Features};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config};
use crate::config::blocks::Routing;
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

pub(super) struct Olmoe;

impl Family for Olmoe {
    fn hf_name(&self) -> &'static str {
        "OlmoeForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "olmoe"
    }

    fn gguf_name(&self) -> &'static str {
        "olmoe"
    }

    /// transformers' OlmoeConfig.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 50_304,
            hidden_size: 2048,
            intermediate_size: 2048,
            num_hidden_layers: 16,
            num_attention_heads: 16,
            max_position_embeddings: 4096,
            rms_norm_eps: 1e-5,
            ..Defaults::LLAMA
        }
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: true,
            qk_norm_whole: true,
            ..Features::LLAMA
        }
    }

    /// `clip_qkv` clamps q, k and v in transformers; mlxcel does not, so a checkpoint that
    /// sets it is refused rather than run without it.
    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        match &raw.clip_qkv {
            Some(value) if !value.is_null() => Err(ModelError::invalid(
                path,
                "clip_qkv",
                format!("{value}: clamping q, k and v is not supported (only null is)"),
            )),
            _ => Ok(()),
        }
    }

    fn has_experts(&self) -> bool {
        true
    }

    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        Some(ExpertKeys {
            count: "num_experts",
            // transformers' OlmoeConfig reads `num_local_experts` as the same count.
            count_alias: Some("num_local_experts"),
            intermediate: None,
            // transformers' OlmoeConfig defaults `norm_topk_prob` to false.
            routing: Routing::SoftmaxTopK {
                renormalize: raw.norm_topk_prob.unwrap_or(false),
            },
            shared_expert: false,
            top_k_alias: None,
            activation: None,
            biases: false,
            dense_layers: false,
        })
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gguf_expert_config(
            header,
            config,
            GgufExpertKeys {
                count: "num_experts",
                moe_intermediate: false,
                // llama.cpp's olmoe never renormalises the top-k weights.
                norm_topk_prob: Some(false),
                shared_expert: false,
            },
        );
    }
}
