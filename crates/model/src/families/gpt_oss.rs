//! gpt-oss (`GptOssForCausalLM`): attention with a learned sink logit per head, biases on
//! q/k/v/o, every other layer sliding (window 128, the first one sliding), YaRN rope scaling, and
//! a routed mixture of experts in every layer: the softmax of the top-k router logits (the router
//! has a bias), each expert a gated MLP of `intermediate_size` with biases on its three
//! projections and OpenAI's clamped SwiGLU (`g · sigmoid(1.702 · g) · (u + 1)`, gate clamped
//! above and up on both sides at `swiglu_limit`). llama.cpp writes it as `gpt-oss`.

use std::path::Path;

use serde_json::{Value, json};

use super::family::{Defaults, Family, Features};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config};
use crate::config::blocks::{HiddenActivation, Routing};
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;
use crate::gguf::names::hf_name;

pub(super) struct GptOss;

/// transformers' `swiglu_limit` default, and what llama.cpp hard-codes.
const SWIGLU_LIMIT: f64 = 7.0;

impl Family for GptOss {
    fn hf_name(&self) -> &'static str {
        "GptOssForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "gpt_oss"
    }

    fn gguf_name(&self) -> &'static str {
        "gpt-oss"
    }

    /// transformers' GptOssConfig.
    fn defaults(&self) -> Defaults {
        Defaults {
            rope_theta: 150_000.0,
            rms_norm_eps: 1e-5,
            sliding_window: Some(128),
            head_dim: Some(64),
            rope_scaling: Some(
                r#"{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                    "truncate": false, "original_max_position_embeddings": 4096}"#,
            ),
            ..Defaults::LLAMA
        }
    }

    fn features(&self) -> Features {
        Features {
            attention_sinks: true,
            ..Features::LLAMA
        }
    }

    /// `attention_bias` (transformers' default true) covers q, k, v and o.
    fn attention_biases(&self, raw: &RawConfig) -> (bool, bool) {
        let bias = raw.attention_bias.unwrap_or(true);
        (bias, bias)
    }

    /// Without `layer_types`, transformers alternates from a sliding first layer.
    fn slides(&self, _raw: &RawConfig, window: Option<usize>, layer: usize) -> bool {
        window.is_some() && layer.is_multiple_of(2)
    }

    /// The clamp must be a positive number; `hidden_act` other than silu would be a SwiGLU
    /// variant transformers' gpt-oss does not compute either (its experts ignore the key).
    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        if let Some(limit) = raw.swiglu_limit
            && !(limit > 0.0 && limit.is_finite())
        {
            return Err(ModelError::invalid(
                path,
                "swiglu_limit",
                format!("{limit} is not a positive number"),
            ));
        }
        if let Some(act) = raw.hidden_act.as_deref()
            && act != "silu"
        {
            return Err(ModelError::invalid(
                path,
                "hidden_act",
                format!(
                    "`{act}`: gpt-oss's experts compute a clamped SwiGLU (only silu is accepted)"
                ),
            ));
        }
        Ok(())
    }

    fn has_experts(&self) -> bool {
        true
    }

    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        let limit = raw.swiglu_limit.unwrap_or(SWIGLU_LIMIT) as f32;
        Some(ExpertKeys {
            count: "num_local_experts",
            count_alias: None,
            // OpenAI's config.json writes `experts_per_token` beside `num_experts_per_tok`.
            top_k_alias: Some("experts_per_token"),
            intermediate: None,
            routing: Routing::TopKSoftmax,
            shared_expert: false,
            dense_layers: false,
            activation: Some(HiddenActivation::ClampedSwiglu {
                alpha: HiddenActivation::GPT_OSS_ALPHA,
                limit,
            }),
            biases: true,
        })
    }

    /// llama.cpp's names: `post_attention_norm` is the MLP's input norm, `attn_sinks` the sinks.
    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        if let Some(layer) = gguf_name
            .strip_prefix("blk.")
            .and_then(|rest| rest.strip_suffix(".attn_sinks.weight"))
        {
            let layer: usize = layer.parse().ok()?;
            // Hugging Face's sinks are a bare parameter, not a module's weight.
            return Some((format!("model.layers.{layer}.self_attn"), "sinks"));
        }
        if gguf_name.contains(".ffn_norm.") {
            return None;
        }
        hf_name(gguf_name)
    }

    fn gguf_sliding_period(&self) -> Option<u64> {
        Some(2)
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
        if let Some(width) = header.experts.and_then(|e| e.feed_forward_length) {
            config["intermediate_size"] = json!(width);
        }
        // llama.cpp hard-codes the clamp; an absent rope scaling key would mean transformers'
        // default YaRN here, so a file without one says null (the converter writes YaRN's).
        config["swiglu_limit"] = json!(SWIGLU_LIMIT);
        config["rope_scaling"] = Value::Null;
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
    }
}
