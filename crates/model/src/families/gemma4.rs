//! Gemma 4 (`Gemma4ForCausalLM`, `gemma4_text`): Gemma 3's four norms per layer and q/k norms,
//! but plain RMSNorm weights (not `1 + w`), an RMSNorm without weights on each head of v, an
//! attention scale of 1 (q and k are normed), each layer's output multiplied by its
//! `layer_scalar`, the embeddings scaled by √hidden unrounded (as mlx-lm does), RoPE per layer type
//! (`rope_parameters`: the sliding layers a plain schedule, the full ones "proportional": the
//! first `partial_rotary_factor` of each head's pairs rotate, with periods of the whole head's
//! schedule, the rest not at all), and final logit soft-capping when configured. Its multimodal
//! checkpoints (`Gemma4ForConditionalGeneration`) are read as their text model.
//!
//! The released models' larger head on the full layers (`global_head_dim`), layers that reuse an
//! earlier layer's keys and values (`num_kv_shared_layers`, with twice as wide an MLP there when
//! `use_double_wide_mlp`) and per-layer token inputs (`hidden_size_per_layer_input`) are read
//! here ([`Family::attention_layout`]), and so are the full layers' keys used as values
//! (`attention_k_eq_v`, with `num_global_key_value_heads`), and the 26B-A4B's
//! mixture-of-experts block (`enable_moe_block`: routed experts beside the dense MLP,
//! [`RoutedExperts::parallel_dense`]), whose router and experts are read under the shared
//! expert names (`router.proj` as `mlp.gate`, mlx-lm's `experts.switch_glu.*` and Hugging
//! Face's `experts.gate_up_proj`/`down_proj` as the stacked `mlp.switch_mlp.*`).

use std::path::Path;

use serde_json::Value;

use super::family::{Defaults, Family, Features, RopeSchedule};
use super::gemma2::{GEMMA_FEATURES, GEMMA2_DEFAULTS};
use super::gemma4_gguf;
use super::moe::{MAX_EXPERTS, positive};
use crate::config::blocks::{
    AttentionLayout, FeedForward, LayerAttention, PerLayerInput, RoutedExperts, Routing,
};
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

pub(super) struct Gemma4;

/// transformers' `Gemma4TextConfig` head size (`head_dim`) and that of the full layers
/// (`global_head_dim`) when config.json leaves them out.
const HEAD_DIM: usize = 256;
const GLOBAL_HEAD_DIM: usize = 512;
/// transformers' `hidden_size_per_layer_input` and `vocab_size_per_layer_input` defaults.
const PER_LAYER_INPUT: usize = 256;
const PER_LAYER_VOCAB: usize = 262_144;
/// Every sixth layer is full when config.json has no `layer_types` (transformers' pattern).
const PATTERN: usize = 6;

impl Family for Gemma4 {
    fn hf_name(&self) -> &'static str {
        "Gemma4ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "gemma4_text"
    }

    fn gguf_name(&self) -> &'static str {
        "gemma4"
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        gemma4_gguf::gguf_tensor(gguf_name)
    }

    /// llama.cpp's `gemma4` lists its sliding layers (`sliding_window_pattern`).
    fn gguf_sliding_period(&self) -> Option<u64> {
        Some(PATTERN as u64)
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gemma4_gguf::gguf_config(header, config);
    }

    fn multimodal_wrapper(&self) -> Option<(&'static str, &'static str)> {
        Some(("Gemma4ForConditionalGeneration", "gemma4"))
    }

    /// transformers' `Gemma4TextConfig` defaults. mlx-lm 0.32.2 differs where config.json is
    /// silent: it soft-caps the logits at 30 (transformers: none) and slides four layers of
    /// five (transformers: five of six, the last layer always full).
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 262_144,
            num_hidden_layers: 30,
            head_dim: Some(HEAD_DIM),
            max_position_embeddings: 131_072,
            sliding_window: Some(512),
            query_pre_attn_scalar: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            ..GEMMA2_DEFAULTS
        }
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: true,
            norm_weight_offset: false,
            embedding_scale_bf16: false,
            value_norm: true,
            layer_scalars: true,
            attention_scale: Some(1.0),
            ..GEMMA_FEATURES
        }
    }

    /// Five layers of six slide, the last always full (transformers' default `layer_types`).
    fn slides(&self, raw: &RawConfig, window: Option<usize>, layer: usize) -> bool {
        let last = raw.num_hidden_layers.map(|n| n.saturating_sub(1));
        window.is_some() && !(layer + 1).is_multiple_of(PATTERN) && Some(layer) != last
    }

    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        let refuse = |field: &str, reason: String| Err(ModelError::invalid(path, field, reason));
        // `"vision"` (the released configs) makes image tokens attend to each other both ways;
        // text is causal under it, and this model reads text only. `false` is causal too.
        match raw.use_bidirectional_attention.as_ref() {
            None | Some(Value::Null | Value::Bool(false)) => {}
            Some(Value::String(s)) if s == "vision" => {}
            Some(other) => {
                return refuse(
                    "use_bidirectional_attention",
                    format!(
                        "{other}: bidirectional attention over text is not implemented in mlxcel \
                         (\"vision\", which concerns image tokens only, and false are accepted)"
                    ),
                );
            }
        }
        if raw.attn_logit_softcapping.is_some() {
            return refuse(
                "attn_logit_softcapping",
                "Gemma 4 has no attention soft-capping (transformers and mlx-lm ignore the key); \
                 remove it"
                    .into(),
            );
        }
        if raw.sliding_window_pattern.is_some() && raw.layer_types.is_none() {
            return refuse(
                "sliding_window_pattern",
                "transformers ignores it for Gemma 4 (five sliding layers of six) and mlx-lm \
                 reads it (default five): give `layer_types` instead"
                    .into(),
            );
        }
        if let (Some(types), Some(n)) = (&raw.layer_types, raw.num_hidden_layers)
            && types.len() == n
            && types.last().is_some_and(|t| t != "full_attention")
        {
            return refuse(
                "layer_types",
                "the last layer must be `full_attention` (transformers forces it, mlx-lm does \
                 not)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The full layers' head (`global_head_dim`, transformers' default 512), the layers that
    /// reuse keys and values (`num_kv_shared_layers`), and the per-layer token inputs
    /// (`hidden_size_per_layer_input`, default 256; `vocab_size_per_layer_input`, default
    /// 262144; 0 turns them off).
    fn attention_layout(
        &self,
        path: &Path,
        raw: &RawConfig,
        head_dim: usize,
        layers: &[LayerAttention],
    ) -> Result<AttentionLayout> {
        let global = raw.global_head_dim.unwrap_or(GLOBAL_HEAD_DIM);
        if global == 0 || !global.is_multiple_of(2) {
            return Err(ModelError::invalid(
                path,
                "global_head_dim",
                format!("{global} is not a positive even number"),
            ));
        }
        let shared = raw.num_kv_shared_layers.unwrap_or(0);
        if shared > 0 {
            let first = layers.len().saturating_sub(shared);
            let slides = |i: usize| layers[i].window.is_some();
            if let Some(orphan) =
                (first..layers.len()).find(|&i| !(0..first).any(|j| slides(j) == slides(i)))
            {
                return Err(ModelError::invalid(
                    path,
                    "num_kv_shared_layers",
                    format!(
                        "{shared} of {} layers reuse earlier layers' keys and values, but layer \
                         {orphan} ({}) has no earlier layer of its kind to reuse",
                        layers.len(),
                        if slides(orphan) { "sliding" } else { "full" }
                    ),
                ));
            }
        }
        let per_layer = raw.hidden_size_per_layer_input.unwrap_or(PER_LAYER_INPUT);
        let per_layer_input = match (per_layer, raw.vocab_size_per_layer_input) {
            (0, _) => None,
            (_, Some(0)) => {
                return Err(ModelError::invalid(
                    path,
                    "vocab_size_per_layer_input",
                    "must be at least 1 when hidden_size_per_layer_input is not 0",
                ));
            }
            (hidden, vocab) => Some(PerLayerInput {
                hidden,
                vocab: vocab.unwrap_or(PER_LAYER_VOCAB),
            }),
        };
        let keys_as_values = raw.attention_k_eq_v == Some(true);
        let heads = raw
            .num_attention_heads
            .unwrap_or(self.defaults().num_attention_heads);
        let global_key_value_heads = match raw.num_global_key_value_heads {
            Some(n) if n == 0 || !heads.is_multiple_of(n) => {
                return Err(ModelError::invalid(
                    path,
                    "num_global_key_value_heads",
                    format!("{n} does not divide num_attention_heads {heads}"),
                ));
            }
            // Read only where keys are values (as mlx-lm and transformers read it).
            Some(n) if keys_as_values => Some(n),
            _ => None,
        };
        Ok(AttentionLayout {
            global_head_dim: (global != head_dim).then_some(global),
            kv_shared_layers: shared,
            per_layer_input,
            keys_as_values,
            global_key_value_heads,
        })
    }

    fn has_experts(&self) -> bool {
        true
    }

    /// Gemma 4 keeps its mixture of experts out of the stacked-expert renaming of the other
    /// families: its router is `router.proj`, its experts `experts.switch_glu.*` (mlx-lm) or
    /// `experts.gate_up_proj`/`experts.down_proj` (Hugging Face, no `.weight`), read as
    /// `mlp.gate` and the stacked `mlp.switch_mlp.*` that become one tensor per expert.
    fn canonical_name(&self, name: &str) -> Option<String> {
        let (stem, rest) = [".router.proj", ".experts.switch_glu.", ".experts."]
            .iter()
            .find_map(|marker| {
                let (stem, rest) = name.split_once(marker)?;
                Some((stem, (*marker, rest)))
            })?;
        match rest {
            (".router.proj", rest) if rest.is_empty() || rest.starts_with('.') => {
                Some(format!("{stem}.mlp.gate{rest}"))
            }
            (".experts.switch_glu.", rest) => Some(format!("{stem}.mlp.switch_mlp.{rest}")),
            (".experts.", projection @ ("gate_up_proj" | "down_proj")) => {
                Some(format!("{stem}.mlp.switch_mlp.{projection}.weight"))
            }
            _ => None,
        }
    }

    /// The dense MLP, twice as wide on the layers that reuse keys and values when
    /// `use_double_wide_mlp` (mlx-lm's default, true, when the key is absent); with
    /// `enable_moe_block`, every layer's routed experts beside it (`num_experts`,
    /// `top_k_experts`, `moe_intermediate_size`; the top-k logits' softmax, as mlx-lm and
    /// transformers route it).
    fn feed_forward(
        &self,
        path: &Path,
        raw: &RawConfig,
        layer: usize,
        dense: FeedForward,
    ) -> Result<FeedForward> {
        let layers = raw
            .num_hidden_layers
            .unwrap_or(self.defaults().num_hidden_layers);
        let first_shared = layers.saturating_sub(raw.num_kv_shared_layers.unwrap_or(0));
        let wide =
            raw.use_double_wide_mlp.unwrap_or(true) && first_shared > 0 && layer >= first_shared;
        let dense = match dense {
            FeedForward::Dense {
                intermediate_size,
                activation,
            } if wide => FeedForward::Dense {
                intermediate_size: 2 * intermediate_size,
                activation,
            },
            other => other,
        };
        let FeedForward::Dense {
            intermediate_size,
            activation,
        } = dense
        else {
            return Ok(dense);
        };
        if raw.enable_moe_block != Some(true) {
            return Ok(dense);
        }
        let num_experts = positive(path, "num_experts", raw.num_experts)?;
        if num_experts > MAX_EXPERTS {
            return Err(ModelError::invalid(
                path,
                "num_experts",
                format!("{num_experts} experts is more than the {MAX_EXPERTS} mlxcel accepts"),
            ));
        }
        let top_k = positive(path, "top_k_experts", raw.top_k_experts)?;
        if top_k > num_experts {
            return Err(ModelError::invalid(
                path,
                "top_k_experts",
                format!("{top_k} experts per token, but the layer has {num_experts}"),
            ));
        }
        Ok(FeedForward::RoutedExperts(RoutedExperts {
            num_experts,
            top_k,
            expert_intermediate_size: positive(
                path,
                "moe_intermediate_size",
                raw.moe_intermediate_size,
            )?,
            activation,
            routing: Routing::TopKSoftmax,
            biases: false,
            shared_expert_intermediate_size: None,
            parallel_dense: Some(intermediate_size),
        }))
    }

    fn rope_schedule(
        &self,
        path: &Path,
        raw: &RawConfig,
        head_dim: usize,
    ) -> Result<Option<RopeSchedule>> {
        let params = raw.rope_parameters.as_ref().filter(|v| !v.is_null());
        let set = |layer_type: &str| params.and_then(|p| p.get(layer_type));
        let field = |layer_type: &str| format!("rope_parameters.{layer_type}");
        let kind = |layer_type: &str, default: &'static str| -> String {
            set(layer_type)
                .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let number = |layer_type: &str, key: &str, default: f64| -> Result<f64> {
            match set(layer_type).and_then(|s| s.get(key)) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_f64()
                    .filter(|x| *x > 0.0 && x.is_finite())
                    .ok_or_else(|| {
                        ModelError::invalid(
                            path,
                            format!("{}.{key}", field(layer_type)),
                            "expected a positive number",
                        )
                    }),
            }
        };
        if params.is_some_and(|p| !p.is_object()) {
            return Err(ModelError::invalid(
                path,
                "rope_parameters",
                "expected one object per layer type (full_attention, sliding_attention)",
            ));
        }
        let local = kind("sliding_attention", "default");
        if local != "default" {
            return Err(ModelError::invalid(
                path,
                format!("{}.rope_type", field("sliding_attention")),
                format!("`{local}` (supported: default)"),
            ));
        }
        let local_theta = number("sliding_attention", "rope_theta", 10_000.0)? as f32;
        let global = kind("full_attention", "proportional");
        let theta = number("full_attention", "rope_theta", 1_000_000.0)? as f32;
        let factors = match global.as_str() {
            "default" => None,
            "proportional" => {
                let proportion = number("full_attention", "partial_rotary_factor", 0.25)?;
                let factor = number("full_attention", "factor", 1.0)? as f32;
                if proportion > 1.0 {
                    return Err(ModelError::invalid(
                        path,
                        format!("{}.partial_rotary_factor", field("full_attention")),
                        format!("{proportion} is more than 1"),
                    ));
                }
                // transformers: `int(proportion * head_dim // 2)` pairs rotate, each with the
                // period of its place in the whole head's schedule; the rest keep their
                // features (an infinite period).
                let pairs = head_dim / 2;
                let rotated = ((proportion * head_dim as f64) / 2.0).floor() as usize;
                let factors: Vec<f32> = (0..pairs)
                    .map(|i| if i < rotated { factor } else { f32::INFINITY })
                    .collect();
                (rotated < pairs || factor != 1.0).then_some(factors)
            }
            other => {
                return Err(ModelError::invalid(
                    path,
                    format!("{}.rope_type", field("full_attention")),
                    format!("`{other}` (supported: proportional, default)"),
                ));
            }
        };
        Ok(Some(RopeSchedule {
            theta,
            local_theta: Some(local_theta),
            factors,
        }))
    }
}
