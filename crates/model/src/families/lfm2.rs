//! LFM2 (`Lfm2ForCausalLM`) and LFM2-MoE (`Lfm2MoeForCausalLM`), Liquid AI's hybrids: softmax
//! attention layers (per-head q/k norms, no biases, RoPE) interleaved with short-convolution
//! layers ([`ShortConv`]), which `layer_types` (`full_attention` / `conv`) or `full_attn_idxs`
//! place. The final norm is `model.embedding_norm`; the layers' modules are named their own way
//! (`operator_norm`, `ffn_norm`, `self_attn.out_proj`, `q_layernorm`, `feed_forward.w1`/`w3`/
//! `w2`), read under llama's names ([`Family::canonical_name`]). LFM2's dense MLP sizes itself
//! from `block_ff_dim` with `block_auto_adjust_ff_dim`; LFM2-MoE keeps its first
//! `num_dense_layers` dense and routes the others by sigmoid scores, picked with a per-expert
//! bias (`use_expert_bias`) and renormalised (`norm_topk_prob`).

use std::path::Path;

use serde_json::{Value, json};

use super::family::{Defaults, Family, Features};
use super::moe::{ExpertKeys, GgufExpertKeys, gguf_expert_config, routed_or_dense};
use crate::config::blocks::{FeedForward, Routing, ShortConv};
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

pub(super) struct Lfm2;

pub(super) struct Lfm2Moe;

/// transformers' `conv_L_cache` when config.json leaves it out.
const CONV_KERNEL: usize = 3;

/// The largest convolution mlxcel accepts (released models have 3 taps): a bound on the state a
/// hostile config makes every sequence keep.
const MAX_CONV_KERNEL: usize = 64;

/// Per-head q/k norms; everything else as a llama.
const FEATURES: Features = Features {
    qk_norm: true,
    ..Features::LLAMA
};

/// transformers' `Lfm2Config`.
const LFM2_DEFAULTS: Defaults = Defaults {
    vocab_size: 65_536,
    hidden_size: 2560,
    intermediate_size: 12_288,
    num_hidden_layers: 32,
    num_attention_heads: 32,
    num_key_value_heads: Some(8),
    max_position_embeddings: 128_000,
    rope_theta: 1_000_000.0,
    rms_norm_eps: 1e-5,
    tie_word_embeddings: true,
    ..Defaults::LLAMA
};

/// transformers' `Lfm2MoeConfig`.
const LFM2_MOE_DEFAULTS: Defaults = Defaults {
    hidden_size: 2048,
    intermediate_size: 7168,
    ..LFM2_DEFAULTS
};

/// transformers' `Lfm2MoeConfig` defaults of its expert keys.
const MOE_EXPERTS: usize = 32;
const MOE_TOP_K: usize = 4;
const MOE_INTERMEDIATE: usize = 1792;
const MOE_DENSE_LAYERS: usize = 2;

impl Family for Lfm2 {
    fn hf_name(&self) -> &'static str {
        "Lfm2ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "lfm2"
    }

    fn gguf_name(&self) -> &'static str {
        "lfm2"
    }

    fn adapt(&self, path: &Path, raw: &mut RawConfig) -> Result<()> {
        adapt_common(path, raw)?;
        raw.intermediate_size = Some(dense_size(path, raw)?);
        Ok(())
    }

    fn defaults(&self) -> Defaults {
        LFM2_DEFAULTS
    }

    fn features(&self) -> Features {
        FEATURES
    }

    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        check_common(path, raw)
    }

    fn short_conv(
        &self,
        path: &Path,
        raw: &RawConfig,
        layers: usize,
    ) -> Result<Vec<Option<ShortConv>>> {
        conv_layers(path, raw, layers)
    }

    fn canonical_name(&self, name: &str) -> Option<String> {
        canonical(name)
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        gguf_tensor(gguf_name)
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gguf_layers(header, config);
    }
}

impl Family for Lfm2Moe {
    fn hf_name(&self) -> &'static str {
        "Lfm2MoeForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "lfm2_moe"
    }

    fn gguf_name(&self) -> &'static str {
        "lfm2moe"
    }

    fn adapt(&self, path: &Path, raw: &mut RawConfig) -> Result<()> {
        adapt_common(path, raw)?;
        // transformers' defaults of the expert keys, which the routed block reads.
        raw.num_experts.get_or_insert(MOE_EXPERTS);
        raw.num_experts_per_tok.get_or_insert(MOE_TOP_K);
        raw.moe_intermediate_size.get_or_insert(MOE_INTERMEDIATE);
        if let Some(factor) = raw.routed_scaling_factor
            && factor != 1.0
        {
            return Err(ModelError::invalid(
                path,
                "routed_scaling_factor",
                format!("{factor} (mlxcel runs LFM2-MoE with 1.0 only)"),
            ));
        }
        Ok(())
    }

    fn defaults(&self) -> Defaults {
        LFM2_MOE_DEFAULTS
    }

    fn features(&self) -> Features {
        FEATURES
    }

    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        check_common(path, raw)
    }

    fn short_conv(
        &self,
        path: &Path,
        raw: &RawConfig,
        layers: usize,
    ) -> Result<Vec<Option<ShortConv>>> {
        conv_layers(path, raw, layers)
    }

    fn canonical_name(&self, name: &str) -> Option<String> {
        canonical(name)
    }

    fn has_experts(&self) -> bool {
        true
    }

    /// The first `num_dense_layers` layers are the dense MLP of `intermediate_size`, the others
    /// routed.
    fn feed_forward(
        &self,
        path: &Path,
        raw: &RawConfig,
        layer: usize,
        dense: FeedForward,
    ) -> Result<FeedForward> {
        if layer < raw.num_dense_layers.unwrap_or(MOE_DENSE_LAYERS) {
            return Ok(dense);
        }
        match self.expert_keys(raw) {
            Some(keys) => routed_or_dense(path, raw, layer, dense, keys),
            None => Ok(dense),
        }
    }

    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        Some(ExpertKeys {
            count: "num_experts",
            count_alias: None,
            intermediate: Some("moe_intermediate_size"),
            routing: Routing::SigmoidTopK {
                renormalize: raw.norm_topk_prob.unwrap_or(true),
                selection_bias: raw.use_expert_bias.unwrap_or(true),
            },
            shared_expert: false,
            top_k_alias: None,
            activation: None,
            biases: false,
            dense_layers: false,
        })
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        gguf_tensor(gguf_name)
    }

    /// llama.cpp's LFM2-MoE: sigmoid routing (its `expert_gating_func`), always picked with
    /// `exp_probs_b` and renormalised.
    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gguf_layers(header, config);
        gguf_expert_config(
            header,
            config,
            GgufExpertKeys {
                count: "num_experts",
                moe_intermediate: true,
                norm_topk_prob: Some(true),
                shared_expert: false,
            },
        );
        config["num_dense_layers"] = json!(header.leading_dense_layers.unwrap_or(0));
        config["use_expert_bias"] = json!(true);
    }
}

/// What both families read alike: the norm's eps, the tied embeddings, the layer kinds, and the
/// keys that must agree with the ones mlxcel reads.
fn adapt_common(path: &Path, raw: &mut RawConfig) -> Result<()> {
    if let Some(eps) = raw.norm_eps {
        if raw.rms_norm_eps.is_some_and(|e| e != eps) {
            return Err(ModelError::invalid(
                path,
                "rms_norm_eps",
                "contradicts norm_eps (LFM2 reads norm_eps)",
            ));
        }
        raw.rms_norm_eps = Some(eps);
    }
    if let (Some(block), Some(eps)) = (raw.block_norm_eps, raw.rms_norm_eps)
        && block != eps
    {
        return Err(ModelError::invalid(
            path,
            "block_norm_eps",
            format!("{block} differs from norm_eps {eps}, which transformers and mlx-lm use"),
        ));
    }
    if let Some(tie) = raw.tie_embedding {
        if raw.tie_word_embeddings.is_some_and(|t| t != tie) {
            return Err(ModelError::invalid(
                path,
                "tie_embedding",
                "contradicts tie_word_embeddings",
            ));
        }
        raw.tie_word_embeddings = Some(tie);
    }
    if let Some(heads) = raw.num_heads {
        if raw.num_attention_heads.is_some_and(|h| h != heads) {
            return Err(ModelError::invalid(
                path,
                "num_heads",
                "contradicts num_attention_heads",
            ));
        }
        raw.num_attention_heads.get_or_insert(heads);
    }
    let layers = raw
        .num_hidden_layers
        .unwrap_or(LFM2_DEFAULTS.num_hidden_layers);
    let by_index = raw.full_attn_idxs.as_ref().map(|idxs| {
        (0..layers)
            .map(|i| {
                if idxs.contains(&i) {
                    "full_attention"
                } else {
                    "conv"
                }
                .to_owned()
            })
            .collect::<Vec<_>>()
    });
    if let Some(idxs) = &raw.full_attn_idxs
        && let Some(&bad) = idxs.iter().find(|&&i| i >= layers)
    {
        return Err(ModelError::invalid(
            path,
            "full_attn_idxs",
            format!("layer {bad} is past num_hidden_layers {layers}"),
        ));
    }
    match (&raw.layer_types, by_index) {
        (Some(types), Some(by_index)) if *types != by_index => {
            return Err(ModelError::invalid(
                path,
                "full_attn_idxs",
                "disagrees with layer_types (transformers reads the list, mlx-lm the indices): \
                 make them agree",
            ));
        }
        (Some(types), _) => {
            if let Some(other) = types
                .iter()
                .find(|t| !matches!(t.as_str(), "full_attention" | "conv"))
            {
                return Err(ModelError::invalid(
                    path,
                    "layer_types",
                    format!("`{other}` (LFM2's layers are full_attention or conv)"),
                ));
            }
        }
        (None, Some(by_index)) => raw.layer_types = Some(by_index),
        // transformers: every layer attention when neither key says otherwise.
        (None, None) => raw.layer_types = Some(vec!["full_attention".to_owned(); layers]),
    }
    Ok(())
}

/// Refuses what LFM2's reference models do not compute or mlxcel does not implement.
fn check_common(path: &Path, raw: &RawConfig) -> Result<()> {
    let hidden = raw.hidden_size.unwrap_or(LFM2_DEFAULTS.hidden_size);
    for (key, value) in [
        ("block_dim", raw.block_dim),
        ("conv_dim", raw.conv_dim),
        ("conv_dim_out", raw.conv_dim_out),
    ] {
        if let Some(v) = value
            && v != hidden
        {
            return Err(ModelError::invalid(
                path,
                key,
                format!(
                    "{v} differs from hidden_size {hidden} (the reference models use hidden_size)"
                ),
            ));
        }
    }
    let heads = raw
        .num_attention_heads
        .unwrap_or(LFM2_DEFAULTS.num_attention_heads);
    if let Some(head_dim) = raw.head_dim
        && heads > 0
        && head_dim * heads != hidden
    {
        return Err(ModelError::invalid(
            path,
            "head_dim",
            format!(
                "{head_dim} is not hidden_size / num_attention_heads (mlx-lm's LFM2 head size)"
            ),
        ));
    }
    for (key, value, why) in [
        (
            "conv_bias",
            raw.conv_bias,
            "convolution biases are not implemented",
        ),
        (
            "attention_bias",
            raw.attention_bias,
            "LFM2's attention has no biases",
        ),
    ] {
        if value == Some(true) {
            return Err(ModelError::invalid(path, key, why));
        }
    }
    for (key, value, why) in [
        (
            "block_use_swiglu",
            raw.block_use_swiglu,
            "LFM2's MLP is SwiGLU",
        ),
        (
            "use_pos_enc",
            raw.use_pos_enc,
            "LFM2's attention rotates q and k",
        ),
    ] {
        if value == Some(false) {
            return Err(ModelError::invalid(path, key, why));
        }
    }
    Ok(())
}

/// Per layer, the short convolution of the `conv` layers `layer_types` lists (after
/// [`adapt_common`] wrote it).
fn conv_layers(path: &Path, raw: &RawConfig, layers: usize) -> Result<Vec<Option<ShortConv>>> {
    let kernel = raw.conv_l_cache.unwrap_or(CONV_KERNEL);
    if !(1..=MAX_CONV_KERNEL).contains(&kernel) {
        return Err(ModelError::invalid(
            path,
            "conv_L_cache",
            format!("{kernel} taps (mlxcel accepts 1 to {MAX_CONV_KERNEL})"),
        ));
    }
    Ok(match &raw.layer_types {
        Some(types) if types.len() == layers => types
            .iter()
            .map(|t| (t == "conv").then_some(ShortConv { kernel }))
            .collect(),
        // A list of the wrong length is refused, naming it, where the layers are read.
        _ => vec![None; layers],
    })
}

/// LFM2's MLP size: `block_ff_dim` (else `intermediate_size`), with `block_auto_adjust_ff_dim`
/// two thirds of it, times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`, as
/// transformers and mlx-lm compute it. They differ only for a `null` multiplier (transformers
/// then does not round, mlx-lm does), which is refused unless both give the same size.
fn dense_size(path: &Path, raw: &RawConfig) -> Result<usize> {
    let ff = raw
        .block_ff_dim
        .or(raw.intermediate_size)
        .unwrap_or(LFM2_DEFAULTS.intermediate_size);
    if !raw.block_auto_adjust_ff_dim.unwrap_or(true) {
        return Ok(ff);
    }
    let multiple = raw.block_multiple_of.unwrap_or(256);
    if multiple == 0 {
        return Err(ModelError::invalid(
            path,
            "block_multiple_of",
            "must be at least 1",
        ));
    }
    let round = |n: usize| n.div_ceil(multiple) * multiple;
    // Python's `int(2 * ff / 3)`: a float division, truncated.
    let two_thirds = (2.0 * ff as f64 / 3.0) as usize;
    match &raw.block_ffn_dim_multiplier {
        None => Ok(round(two_thirds)),
        Some(Value::Null) if round(two_thirds) == two_thirds => Ok(two_thirds),
        Some(Value::Null) => Err(ModelError::invalid(
            path,
            "block_ffn_dim_multiplier",
            "null: transformers then leaves the MLP size unrounded and mlx-lm rounds it to \
             block_multiple_of; give a number (1.0) so that both agree",
        )),
        Some(v) => {
            let m = v
                .as_f64()
                .filter(|m| *m > 0.0 && m.is_finite())
                .ok_or_else(|| {
                    ModelError::invalid(
                        path,
                        "block_ffn_dim_multiplier",
                        "expected a positive number",
                    )
                })?;
            Ok(round((m * two_thirds as f64) as usize))
        }
    }
}

/// An LFM2 checkpoint's name under llama's: `model.embedding_norm` is `model.norm`; a layer's
/// `operator_norm`, `ffn_norm`, `self_attn.out_proj`, `q_layernorm`, `k_layernorm` are
/// `input_layernorm`, `post_attention_layernorm`, `o_proj`, `q_norm`, `k_norm`; its
/// `feed_forward` is `mlp`, whose (and whose experts') `w1`, `w3`, `w2` are `gate_proj`,
/// `up_proj`, `down_proj`.
fn canonical(name: &str) -> Option<String> {
    let mut parts: Vec<&str> = name.split('.').collect();
    if parts.len() >= 2 && parts[0] == "model" && parts[1] == "embedding_norm" {
        parts[1] = "norm";
    }
    if parts.len() >= 4 && parts[0] == "model" && parts[1] == "layers" {
        parts[3] = match parts[3] {
            "operator_norm" => "input_layernorm",
            "ffn_norm" => "post_attention_layernorm",
            "feed_forward" => "mlp",
            other => other,
        };
        if parts[3] == "self_attn" && parts.len() >= 5 {
            parts[4] = match parts[4] {
                "out_proj" => "o_proj",
                "q_layernorm" => "q_norm",
                "k_layernorm" => "k_norm",
                other => other,
            };
        }
        let projection = if parts.get(4) == Some(&"experts") {
            6
        } else {
            4
        };
        if parts[3] == "mlp" && parts.len() > projection {
            parts[projection] = match parts[projection] {
                "w1" => "gate_proj",
                "w3" => "up_proj",
                "w2" => "down_proj",
                other => other,
            };
        }
    }
    let canonical = parts.join(".");
    (canonical != name).then_some(canonical)
}

/// llama.cpp's LFM2 tensor names: llama's, but the final norm (`token_embd_norm`), the short
/// convolution's (`shortconv.conv`, `in_proj`, `out_proj`) and LFM2-MoE's expert bias
/// (`exp_probs_b.bias`, read as the tensor `mlp.expert_bias`).
fn gguf_tensor(gguf_name: &str) -> Option<(String, &str)> {
    let (stem, suffix) = gguf_name.rsplit_once('.')?;
    if stem == "token_embd_norm" && suffix == "weight" {
        return Some(("model.norm".to_owned(), suffix));
    }
    if let Some(rest) = stem.strip_prefix("blk.")
        && let Some((layer, part)) = rest.split_once('.')
        && let Ok(layer) = layer.parse::<usize>()
    {
        let p = format!("model.layers.{layer}");
        match (part, suffix) {
            ("shortconv.conv", "weight") => return Some((format!("{p}.conv.conv"), suffix)),
            ("shortconv.in_proj", "weight") => return Some((format!("{p}.conv.in_proj"), suffix)),
            ("shortconv.out_proj", "weight") => {
                return Some((format!("{p}.conv.out_proj"), suffix));
            }
            // The bias is a tensor of its own, not a module's: its name is the module's plus
            // `expert_bias`.
            ("exp_probs_b", "bias") => return Some((format!("{p}.mlp"), "expert_bias")),
            _ => {}
        }
    }
    super::family::llama_tensor_name(gguf_name)
}

/// config.json's layer kinds from a GGUF header: a layer whose `attention.head_count_kv` is 0 is
/// a short convolution (llama.cpp's reading), `shortconv.l_cache` its taps; the file's
/// `feed_forward_length` is the MLP's own size, already adjusted.
fn gguf_layers(header: &GgufHeader, config: &mut Value) {
    if let Some(counts) = &header.head_count_kv_per_layer {
        let types: Vec<&str> = counts
            .iter()
            .map(|&h| if h == 0 { "conv" } else { "full_attention" })
            .collect();
        config["layer_types"] = json!(types);
    }
    if let Some(taps) = header.shortconv_l_cache {
        config["conv_L_cache"] = json!(taps);
    }
    config["block_auto_adjust_ff_dim"] = json!(false);
}
