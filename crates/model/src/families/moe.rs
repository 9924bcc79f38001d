//! What the mixture-of-experts families share: reading the routed-expert block of a layer from
//! config.json's expert keys, the way transformers' and mlx-lm's MoE models read them.

use std::path::Path;

use serde_json::{Value, json};

use crate::config::blocks::{FeedForward, HiddenActivation, RoutedExperts, Routing};
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

/// The most experts a layer may have: more than any released model (gpt-oss 32, Qwen3-MoE 128,
/// DeepSeek 256), small enough that a hostile config cannot ask for millions of tensors.
pub(crate) const MAX_EXPERTS: usize = 1024;

/// How a family names and routes its experts; the numbers come from config.json.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExpertKeys {
    /// The key holding the expert count (`num_experts`, Mixtral's `num_local_experts`).
    pub count: &'static str,
    /// Another key transformers reads as the count for this family (its `attribute_map`:
    /// Mixtral's `num_experts`, OLMoE's `num_local_experts`); `None` when it reads no other.
    pub count_alias: Option<&'static str>,
    /// Another key the family's config.json may hold the experts per token in (gpt-oss's
    /// `experts_per_token`, which OpenAI's configs write beside `num_experts_per_tok`); both
    /// and different is refused.
    pub top_k_alias: Option<&'static str>,
    /// The key holding each expert's hidden size; `None`: `intermediate_size` (Mixtral).
    pub intermediate: Option<&'static str>,
    pub routing: Routing,
    /// Whether the family has a shared expert (`shared_expert_intermediate_size`).
    pub shared_expert: bool,
    /// Whether the family keeps some layers dense by `mlp_only_layers` and
    /// `decoder_sparse_step` (the Qwen MoE families); the others route every layer and refuse
    /// those keys rather than ignore them.
    pub dense_layers: bool,
    /// The experts' activation when it is not the dense MLP's (gpt-oss's clamped SwiGLU).
    pub activation: Option<HiddenActivation>,
    /// Whether the router and the experts' projections carry biases (gpt-oss).
    pub biases: bool,
}

/// Layer `layer`'s block for a family with experts: routed where transformers makes it sparse
/// (not in `mlp_only_layers`, and `(layer + 1) % decoder_sparse_step == 0`), `dense` otherwise.
pub(crate) fn routed_or_dense(
    path: &Path,
    raw: &RawConfig,
    layer: usize,
    dense: FeedForward,
    keys: ExpertKeys,
) -> Result<FeedForward> {
    let FeedForward::Dense {
        activation,
        intermediate_size,
    } = dense
    else {
        return Ok(dense);
    };
    let value = |key: &str| match key {
        "num_local_experts" => raw.num_local_experts,
        _ => raw.num_experts,
    };
    let count = match (value(keys.count), keys.count_alias) {
        (Some(n), Some(alias)) => match value(alias) {
            Some(m) if m != n => {
                return Err(ModelError::invalid(
                    path,
                    alias,
                    format!("{m} contradicts {} {n} (the same count)", keys.count),
                ));
            }
            _ => Some(n),
        },
        (None, Some(alias)) => value(alias),
        (count, None) => count,
    };
    let num_experts = positive(path, keys.count, count)?;
    if num_experts > MAX_EXPERTS {
        return Err(ModelError::invalid(
            path,
            keys.count,
            format!("{num_experts} experts is more than the {MAX_EXPERTS} mlxcel accepts"),
        ));
    }
    if !keys.dense_layers {
        if raw.decoder_sparse_step.is_some_and(|s| s != 1) {
            return Err(ModelError::invalid(
                path,
                "decoder_sparse_step",
                "this family routes every layer (only 1 is accepted)",
            ));
        }
        if raw.mlp_only_layers.as_ref().is_some_and(|l| !l.is_empty()) {
            return Err(ModelError::invalid(
                path,
                "mlp_only_layers",
                "this family routes every layer (only [] is accepted)",
            ));
        }
    }
    let step = raw.decoder_sparse_step.unwrap_or(1);
    if step == 0 {
        return Err(ModelError::invalid(
            path,
            "decoder_sparse_step",
            "must be at least 1",
        ));
    }
    let dense_only = raw
        .mlp_only_layers
        .as_ref()
        .is_some_and(|layers| layers.contains(&layer));
    if dense_only || !(layer + 1).is_multiple_of(step) {
        return Ok(dense);
    }
    let top_k = match (raw.num_experts_per_tok, keys.top_k_alias) {
        (Some(n), Some(alias)) => match raw.experts_per_token {
            Some(m) if m != n => {
                return Err(ModelError::invalid(
                    path,
                    alias,
                    format!("{m} contradicts num_experts_per_tok {n} (the same count)"),
                ));
            }
            _ => Some(n),
        },
        (None, Some(_)) => raw.experts_per_token,
        (n, None) => n,
    };
    let top_k = positive(path, "num_experts_per_tok", top_k)?;
    if top_k > num_experts {
        return Err(ModelError::invalid(
            path,
            "num_experts_per_tok",
            format!("{top_k} experts per token, but the layer has {num_experts}"),
        ));
    }
    let expert_intermediate_size = match keys.intermediate {
        Some(key) => positive(path, key, raw.moe_intermediate_size)?,
        // The dense block's size: config.json's `intermediate_size`, else the family default.
        None => intermediate_size,
    };
    let shared_expert_intermediate_size = if keys.shared_expert {
        match raw.shared_expert_intermediate_size {
            None => {
                return Err(ModelError::MissingField {
                    path: path.to_owned(),
                    field: "shared_expert_intermediate_size".into(),
                });
            }
            Some(0) => None,
            Some(n) => Some(n),
        }
    } else {
        None
    };
    Ok(FeedForward::RoutedExperts(RoutedExperts {
        num_experts,
        top_k,
        expert_intermediate_size,
        activation: keys.activation.unwrap_or(activation),
        routing: keys.routing,
        biases: keys.biases,
        shared_expert_intermediate_size,
        parallel_dense: None,
    }))
}

pub(crate) fn positive(path: &Path, field: &str, value: Option<usize>) -> Result<usize> {
    match value {
        None => Err(ModelError::MissingField {
            path: path.to_owned(),
            field: field.to_owned(),
        }),
        Some(0) => Err(ModelError::invalid(path, field, "must be at least 1")),
        Some(v) => Ok(v),
    }
}

/// How a family's GGUF header becomes its config.json expert keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GgufExpertKeys {
    /// config.json's count key (`num_experts`, Mixtral's `num_local_experts`).
    pub count: &'static str,
    /// Whether the experts' size is `moe_intermediate_size` (`expert_feed_forward_length`, else
    /// llama.cpp's fallback `feed_forward_length / expert_used_count`); `false`: llama.cpp
    /// sizes them by `feed_forward_length`, which config.json already has as
    /// `intermediate_size` (Mixtral, OLMoE).
    pub moe_intermediate: bool,
    /// `norm_topk_prob` as llama.cpp computes the family (it hard-codes it per architecture);
    /// `None` for a family without the key (Mixtral).
    pub norm_topk_prob: Option<bool>,
    /// Whether the family has a shared expert (`expert_shared_feed_forward_length`, else
    /// `feed_forward_length`, as llama.cpp sizes it).
    pub shared_expert: bool,
}

/// Writes the expert keys of a GGUF file's config.json; a file without `expert_count` gets
/// none, and its config is then refused naming the missing count.
pub(crate) fn gguf_expert_config(header: &GgufHeader, config: &mut Value, keys: GgufExpertKeys) {
    let Some(experts) = header.experts else {
        return;
    };
    config[keys.count] = json!(experts.count);
    config["num_experts_per_tok"] = json!(experts.used);
    if keys.moe_intermediate {
        config["moe_intermediate_size"] = json!(
            experts
                .feed_forward_length
                .unwrap_or(header.feed_forward_length / experts.used.max(1))
        );
        // llama.cpp's MoE files have experts in every layer.
        config["decoder_sparse_step"] = json!(1);
        config["mlp_only_layers"] = json!([]);
    }
    if let Some(norm) = keys.norm_topk_prob {
        config["norm_topk_prob"] = json!(norm);
    }
    if keys.shared_expert {
        config["shared_expert_intermediate_size"] = json!(
            experts
                .shared_feed_forward_length
                .unwrap_or(header.feed_forward_length)
        );
    }
}
