//! `config.json` of the llama family and its relatives (Mistral, Qwen2, Qwen3, SmolLM3, Gemma 2,
//! Gemma 3, Phi-3/Phi-4-mini), validated into a [`ModelConfig`].
//!
//! The raw JSON is read leniently (Hugging Face and MLX write the same keys with small variations)
//! and then checked once here, so that backends can trust every number they are handed.

pub(crate) mod blocks;
mod describe;
pub(crate) mod layout;
pub(crate) mod raw;
pub(crate) mod rope;
pub(crate) mod rope_override;
mod size;

use std::path::Path;

use serde_json::Value;

use blocks::{FeedForward, HiddenActivation, LayerAttention, LayerSpec, PerLayerInput};
use raw::RawConfig;
use rope::{RopeScaling, long_rope, rope_scaling};

use crate::error::{ModelError, Result};
use crate::families::Architecture;
use crate::quant::Quantization;

/// The most decoder layers a config may declare: a bound on what a hostile file makes mlxcel
/// allocate per layer before any tensor is read.
pub const MAX_LAYERS: usize = 4096;

/// A validated llama-family model description.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    pub tie_word_embeddings: bool,
    /// The checkpoint's context window (`max_position_embeddings`).
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    /// Whether q/k/v projections carry a bias (always for Qwen2; `attention_bias` for llama).
    pub attention_qkv_bias: bool,
    /// Whether the output projection carries a bias (`attention_bias` for llama).
    pub attention_out_bias: bool,
    /// Whether each head of q and k goes through its own RMSNorm (`q_norm`, `k_norm`, weights
    /// `[head_dim]`) before RoPE (Qwen3).
    pub qk_norm: bool,
    /// With `qk_norm`: one RMSNorm over all of q's heads together (`q_norm` `[q_dim]`) and one
    /// over k's (`[kv_dim]`), before the heads are split (OLMoE), instead of one per head.
    pub qk_norm_whole: bool,
    /// Attention sinks (gpt-oss): each head `h` of every layer has a learned logit
    /// `model.layers.{i}.self_attn.sinks[h]` (`[num_attention_heads]`) that joins its softmax's
    /// denominator and contributes no value: `softmax([scores, sink])` with the sink's column
    /// dropped. The sink is a logit as it stands (not scaled by `attention_scale`, not
    /// soft-capped). Set by the family (gpt-oss).
    pub attention_sinks: bool,
    /// Per layer, in order: RoPE or not, and its sliding window if any; or a linear-attention
    /// (gated DeltaNet) layer.
    pub layers: Vec<LayerAttention>,
    /// The attention's output is gated (Qwen3-Next, Qwen3.5): `q_proj` has `2 · q_dim` rows,
    /// per head its `head_dim` queries then `head_dim` gate values, and each head's output is
    /// multiplied by `sigmoid(gate)` before `o_proj`.
    pub attention_output_gate: bool,
    /// Per layer, in order: its feed-forward block, as its family builds it (the dense MLP of
    /// `intermediate_size` and `hidden_activation`, or routed experts).
    pub feed_forward: Vec<FeedForward>,
    /// The head size of the full-attention (not sliding) layers when it differs from `head_dim`
    /// (Gemma 4's `global_head_dim`): their q, k, v, o and q/k norms are sized by it, and RoPE's
    /// `rotary_dim` is theirs ([`ModelConfig::layer_head_dim`]).
    pub global_head_dim: Option<usize>,
    /// The last this-many layers compute no keys or values (no `k_proj`, `v_proj`, `k_norm`):
    /// each attends over those of the last earlier layer of its kind (Gemma 4's
    /// `num_kv_shared_layers`; [`ModelConfig::kv_source`]).
    pub kv_shared_layers: usize,
    /// Gemma 4's per-layer token inputs ([`PerLayerInput`]), when the model has them.
    pub per_layer_input: Option<PerLayerInput>,
    /// The full (not sliding) layers have no `v_proj`: their values are the k projection's
    /// output before k's norm and RoPE, through the v norm (Gemma 4's `attention_k_eq_v`).
    pub keys_as_values: bool,
    /// With `keys_as_values`, the full layers' key/value heads when they differ from
    /// `num_key_value_heads` (`num_global_key_value_heads`; [`ModelConfig::layer_kv_heads`]).
    pub global_key_value_heads: Option<usize>,
    /// Each head of v goes through an RMSNorm without weights before attention (Gemma 4's
    /// `v_norm`; values are not rotated).
    pub value_norm: bool,
    /// Each layer's output (the residual stream after its MLP) is multiplied by the layer's own
    /// scalar, `model.layers.{i}.layer_scalar` (`[1]`; Gemma 4).
    pub layer_scalars: bool,
    /// RMSNorm weights are stored as offsets from one (Gemma): each norm multiplies by `1 + w`.
    pub norm_weight_offset: bool,
    /// Gemma's four norms per layer: the attention's output and the MLP's output each go
    /// through their own norm (`post_attention_layernorm`, `post_feedforward_layernorm`) before
    /// the residual add, and the MLP's input norm is `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// The MLP's gate activation (`hidden_activation` / `hidden_act`).
    pub hidden_activation: HiddenActivation,
    /// A factor on the token embeddings (Gemma: √hidden_size, rounded to bf16 as Hugging Face
    /// and mlx-lm compute it).
    pub embedding_scale: Option<f32>,
    /// The attention's score scale: `1/√query_pre_attn_scalar` (Gemma), else `1/√head_dim`.
    pub attention_scale: f32,
    /// Attention scores become `cap · tanh(score / cap)` (Gemma 2's `attn_logit_softcapping`).
    pub attn_logit_softcapping: Option<f32>,
    /// Logits become `cap · tanh(logit / cap)` (`final_logit_softcapping`).
    pub final_logit_softcapping: Option<f32>,
    /// The RoPE base of sliding-window layers when it differs from `rope_theta` (Gemma 3's
    /// `rope_local_base_freq`; those layers take no `rope_scaling`).
    pub rope_local_theta: Option<f32>,
    /// Features of each head that RoPE rotates (the first ones, in halves layout):
    /// `head_dim · partial_rotary_factor`, `head_dim` unless partial.
    pub rotary_dim: usize,
    /// LongRoPE (`rope_scaling` of type `longrope`/`su`, Phi-3): each rotated pair's period is
    /// multiplied by its factor. mlxcel uses `long_factor`, as mlx-lm does and as llama.cpp does
    /// for a context past `original_max_position_embeddings` (its default, the whole window).
    pub rope_factors: Option<Vec<f32>>,
    /// The factor on the rotated features of q and k (LongRoPE's or YaRN's attention factor), 1
    /// if none. Both q and k carry it, so the scores carry its square (as mlx-lm and
    /// transformers apply it).
    pub rope_attention_factor: f32,
    /// The checkpoint is multimodal (Gemma 3's `Gemma3ForConditionalGeneration`): this is its
    /// text model (`text_config`), whose weights are under `language_model.`; the vision tower
    /// and projector are skipped.
    pub multimodal: bool,
    /// MLX quantization (`quantization`), `None` for a dense checkpoint.
    pub quantization: Option<Quantization>,
    /// `eos_token_id` from config.json, if any.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    /// The model's name (`_name_or_path`), when the checkpoint records one.
    pub name: Option<String>,
}

impl ModelConfig {
    /// Reads and validates `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        Self::from_json(&path, &text)
    }

    /// Parses and validates config.json text; `path` is only used in errors.
    pub fn from_json(path: &Path, text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: path.to_owned(),
            source,
        })?;
        // A multimodal checkpoint of a family that has one (Gemma 3's
        // `Gemma3ForConditionalGeneration`): the text model's config is `text_config`; its weights
        // are loaded, the vision tower's skipped.
        let wrapped = value
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .and_then(Architecture::multimodal_named)
            .or_else(|| {
                value
                    .get("model_type")
                    .and_then(Value::as_str)
                    .and_then(Architecture::multimodal_named)
            });
        let multimodal = wrapped.is_some();
        let value = match (wrapped, value.get("text_config")) {
            (Some(family), Some(text)) if text.is_object() => {
                let mut merged = text.clone();
                merged["architectures"] = Value::from(vec![family.hf_name()]);
                merged["model_type"] = Value::from(family.model_type());
                for key in [
                    "eos_token_id",
                    "bos_token_id",
                    "_name_or_path",
                    "quantization",
                ] {
                    if merged.get(key).is_none_or(Value::is_null)
                        && let Some(v) = value.get(key)
                    {
                        merged[key] = v.clone();
                    }
                }
                merged
            }
            _ => value,
        };
        // transformers' default `rope_scaling` when the key is absent (gpt-oss's YaRN); an
        // explicit null stays null.
        let mut value = value;
        if value.is_object() && value.get("rope_scaling").is_none() {
            let name = value
                .get("architectures")
                .and_then(|a| a.get(0))
                .or_else(|| value.get("model_type"))
                .and_then(Value::as_str);
            if let Some(default) = name
                .and_then(Architecture::named)
                .and_then(|a| a.family().defaults().rope_scaling)
                && let Ok(scaling) = serde_json::from_str::<Value>(default)
            {
                value["rope_scaling"] = scaling;
            }
        }
        let raw: RawConfig = serde_json::from_value(value).map_err(|e| ModelError::Json {
            path: path.to_owned(),
            source: e,
        })?;
        let mut config = Self::from_raw(path, raw)?;
        config.multimodal = multimodal;
        Ok(config)
    }

    /// The context window the checkpoint was trained for (`max_position_embeddings`).
    pub fn window(&self) -> usize {
        self.max_position_embeddings
    }

    /// Rows of the q projection (`num_attention_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Rotary-embedding periods, one per rotated pair (`head_dim / 2`): `rope_theta^(2i/head_dim)`,
    /// with Llama 3.1's scaling when configured (long wavelengths stretched by `factor`, short ones
    /// kept, the band between interpolated smoothly). Every backend derives its RoPE from these.
    pub fn rope_periods(&self) -> Vec<f32> {
        let dims = self.rotary_dim;
        let base = self.rope_theta;
        let plain = (0..dims / 2).map(move |i| base.powf((2 * i) as f32 / dims as f32));
        // Per-pair factors (LongRoPE, llama.cpp's `rope_freqs`) first, then the scaling (only a
        // RoPE override sets both: llama.cpp divides the frequencies by the factors before its
        // linear or YaRN scaling).
        let plain: Vec<f32> = match &self.rope_factors {
            Some(factors) => plain.zip(factors).map(|(p, f)| p * f).collect(),
            None => plain.collect(),
        };
        let plain = plain.into_iter();
        match self.rope_scaling {
            None => plain.collect(),
            Some(RopeScaling::Linear { factor }) => plain.map(|p| p * factor).collect(),
            Some(RopeScaling::Yarn(yarn)) => yarn.periods(plain, base, dims),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                let original = original_max_position_embeddings as f32;
                let low_wavelen = original / low_freq_factor;
                let high_wavelen = original / high_freq_factor;
                plain
                    .map(|period| {
                        let wavelen = 2.0 * std::f32::consts::PI * period;
                        if wavelen > low_wavelen {
                            period * factor
                        } else if wavelen < high_wavelen {
                            period
                        } else {
                            let smooth = (original / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            period / ((1.0 - smooth) / factor + smooth)
                        }
                    })
                    .collect()
            }
        }
    }

    /// The sliding window of the layers that slide (the same for all of them), if any does.
    pub fn sliding_window(&self) -> Option<usize> {
        self.layers.iter().find_map(|l| l.window)
    }

    /// Layer `layer`'s RoPE periods: [`ModelConfig::rope_periods`], or for a sliding layer of a
    /// model with its own local base (Gemma 3), the plain schedule of that base.
    pub fn layer_rope_periods(&self, layer: usize) -> Vec<f32> {
        match (self.rope_local_theta, self.layers[layer].window) {
            (Some(base), Some(_)) => {
                let dims = self.local_rotary_dim();
                (0..dims / 2)
                    .map(|i| base.powf((2 * i) as f32 / dims as f32))
                    .collect()
            }
            _ => self.rope_periods(),
        }
    }

    /// Whether some layers use another RoPE schedule than others.
    pub fn has_local_rope(&self) -> bool {
        self.rope_local_theta.is_some() && self.sliding_window().is_some()
    }

    /// Layer `layer`'s block: its attention and its feed-forward block, what a backend builds.
    pub fn layer_spec(&self, layer: usize) -> LayerSpec {
        LayerSpec {
            attention: self.layers[layer],
            ffn: self.feed_forward[layer],
        }
    }

    /// Rows of each of the k and v projections (`num_key_value_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    fn from_raw(path: &Path, mut raw: RawConfig) -> Result<Self> {
        let architecture = architecture(path, &raw)?;
        let family = architecture.family();
        let (defaults, features) = (family.defaults(), family.features());
        family.adapt(path, &mut raw)?;
        family.check(path, &raw)?;
        rope::flat_rope_parameters(&mut raw);
        let need = |value: Option<usize>, field: &str| -> Result<usize> {
            match value {
                None => Err(ModelError::MissingField {
                    path: path.to_owned(),
                    field: field.to_owned(),
                }),
                Some(0) => Err(ModelError::invalid(path, field, "must be at least 1")),
                Some(v) => Ok(v),
            }
        };
        // Every size config.json leaves out is the family's transformers default.
        let hidden_size = need(
            raw.hidden_size.or(Some(defaults.hidden_size)),
            "hidden_size",
        )?;
        let num_attention_heads = need(
            raw.num_attention_heads
                .or(Some(defaults.num_attention_heads)),
            "num_attention_heads",
        )?;
        let num_key_value_heads = need(
            raw.num_key_value_heads
                .or(defaults.num_key_value_heads)
                .or(Some(num_attention_heads)),
            "num_key_value_heads",
        )?;
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(ModelError::invalid(
                path,
                "num_key_value_heads",
                format!(
                    "{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"
                ),
            ));
        }
        let head_dim = match raw.head_dim.or(defaults.head_dim) {
            Some(d) => need(Some(d), "head_dim")?,
            None if hidden_size.is_multiple_of(num_attention_heads) => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(ModelError::invalid(
                    path,
                    "hidden_size",
                    format!(
                        "{hidden_size} is not a multiple of num_attention_heads {num_attention_heads} and head_dim is absent"
                    ),
                ));
            }
        };
        if !head_dim.is_multiple_of(2) {
            return Err(ModelError::invalid(
                path,
                "head_dim",
                format!("{head_dim} is odd; rotary embeddings need pairs"),
            ));
        }
        if raw.mlp_bias == Some(true) {
            return Err(ModelError::invalid(
                path,
                "mlp_bias",
                "MLP biases are not supported",
            ));
        }
        let (attention_qkv_bias, attention_out_bias) = family.attention_biases(&raw);
        if raw.vision_config.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ModelError::invalid(
                path,
                "vision_config",
                "multimodal checkpoints are supported for Gemma 3 and Gemma 4 only (their text models); use the \
                 text model's own checkpoint",
            ));
        }
        let num_hidden_layers = need(
            raw.num_hidden_layers.or(Some(defaults.num_hidden_layers)),
            "num_hidden_layers",
        )?;
        if num_hidden_layers > MAX_LAYERS {
            return Err(ModelError::invalid(
                path,
                "num_hidden_layers",
                format!(
                    "{num_hidden_layers} is more than the {MAX_LAYERS} layers mlxcel accepts (the \
                     deepest published models have ~130)"
                ),
            ));
        }
        let layers = layer_attention(path, &raw, architecture, num_hidden_layers)?;
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(defaults.rms_norm_eps);
        if !(rms_norm_eps > 0.0 && rms_norm_eps.is_finite()) {
            return Err(ModelError::invalid(
                path,
                "rms_norm_eps",
                format!("{rms_norm_eps} is not a positive number"),
            ));
        }
        // `rope_parameters`' values were read into the old keys above (`flat_rope_parameters`).
        if raw
            .rope_parameters
            .as_ref()
            .is_some_and(|v| !v.is_null() && !v.is_object())
        {
            return Err(ModelError::invalid(
                path,
                "rope_parameters",
                "expected an object",
            ));
        }
        let rope_theta = raw.rope_theta.unwrap_or(defaults.rope_theta);
        if !(rope_theta > 0.0 && rope_theta.is_finite()) {
            return Err(ModelError::invalid(
                path,
                "rope_theta",
                format!("{rope_theta} is not a positive number"),
            ));
        }
        let quantization = raw
            .quantization
            .as_ref()
            .map(|q| Quantization::from_json(path, q))
            .transpose()?;
        let positive = |field: &str, value: Option<f64>| -> Result<Option<f32>> {
            match value {
                Some(v) if !(v > 0.0 && v.is_finite()) => Err(ModelError::invalid(
                    path,
                    field,
                    format!("{v} is not a positive number"),
                )),
                other => Ok(other.map(|v| v as f32)),
            }
        };
        let activation = raw
            .hidden_activation
            .as_deref()
            .or(raw.hidden_act.as_deref());
        let hidden_activation = match activation {
            None => defaults.hidden_activation,
            Some("silu" | "swish") => HiddenActivation::Silu,
            Some("gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" | "gelu_fast") => {
                HiddenActivation::GeluTanh
            }
            Some(other) => {
                return Err(ModelError::invalid(
                    path,
                    if raw.hidden_activation.is_some() {
                        "hidden_activation"
                    } else {
                        "hidden_act"
                    },
                    format!("`{other}` is not supported (supported: silu, gelu_pytorch_tanh)"),
                ));
            }
        };
        let query_pre_attn_scalar = positive(
            "query_pre_attn_scalar",
            raw.query_pre_attn_scalar.or(defaults.query_pre_attn_scalar),
        )?;
        let attn_cap = raw
            .attn_logit_softcapping
            .or(defaults.attn_logit_softcapping);
        let final_cap = raw
            .final_logit_softcapping
            .or(defaults.final_logit_softcapping);
        let rope_local_theta = defaults
            .rope_local_base_freq
            .map(|default| raw.rope_local_base_freq.unwrap_or(default));
        if rope_local_theta.is_some_and(|t| !(t > 0.0 && t.is_finite())) {
            return Err(ModelError::invalid(
                path,
                "rope_local_base_freq",
                "is not a positive number",
            ));
        }
        let partial_rotary_factor = raw.partial_rotary_factor.or(defaults.partial_rotary_factor);
        let rotary_dim = match partial_rotary_factor {
            None => head_dim,
            Some(f) if f > 0.0 && f <= 1.0 => ((head_dim as f64 * f) as usize) & !1,
            Some(f) => {
                return Err(ModelError::invalid(
                    path,
                    "partial_rotary_factor",
                    format!("{f} is not in (0, 1]"),
                ));
            }
        };
        if rotary_dim < 2 {
            return Err(ModelError::invalid(
                path,
                "partial_rotary_factor",
                format!("rotates {rotary_dim} of {head_dim} features; at least one pair must"),
            ));
        }
        let max_position_embeddings = need(
            raw.max_position_embeddings
                .or(Some(defaults.max_position_embeddings)),
            "max_position_embeddings",
        )?;
        let original_max_position_embeddings = raw
            .original_max_position_embeddings
            .or(defaults.original_max_position_embeddings);
        let (rope_factors, long_rope_attention) = long_rope(
            path,
            raw.rope_scaling.as_ref(),
            rotary_dim,
            max_position_embeddings,
            original_max_position_embeddings,
        )?;
        let rope_scaling = if rope_factors.is_some() {
            None
        } else {
            rope_scaling(
                path,
                raw.rope_scaling.as_ref(),
                original_max_position_embeddings,
                max_position_embeddings,
            )?
        };
        // LongRoPE's or YaRN's factor on the rotated features (at most one of them is not 1).
        let mut rope_attention_factor =
            long_rope_attention * rope_scaling.map_or(1.0, |s| s.attention_factor());
        // A family's own schedule (Gemma 4's `rope_parameters` per layer type) replaces them.
        let (mut rope_theta, mut rope_local_theta, mut rope_factors, mut rope_scaling) =
            (rope_theta, rope_local_theta, rope_factors, rope_scaling);
        let mut rotary_dim = rotary_dim;
        let layout = family.attention_layout(path, &raw, head_dim, &layers)?;
        // The full layers' head is RoPE's width where a family schedules it per layer type.
        let full_head_dim = layout.global_head_dim.unwrap_or(head_dim);
        match family.rope_schedule(path, &raw, full_head_dim)? {
            Some(schedule) => {
                rope_theta = schedule.theta;
                rope_local_theta = schedule.local_theta;
                rope_factors = schedule.factors;
                rope_scaling = None;
                rope_attention_factor = 1.0;
                rotary_dim = full_head_dim;
            }
            None if rope::per_layer_type(raw.rope_parameters.as_ref()) => {
                return Err(ModelError::invalid(
                    path,
                    "rope_parameters",
                    format!(
                        "one set per layer type is read for Gemma 4 only; {architecture} takes \
                         one `{{rope_type, rope_theta, ...}}` object"
                    ),
                ));
            }
            None => {}
        }
        let intermediate_size = need(
            raw.intermediate_size.or(Some(defaults.intermediate_size)),
            "intermediate_size",
        )?;
        let dense = FeedForward::Dense {
            intermediate_size,
            activation: hidden_activation,
        };
        let feed_forward: Vec<FeedForward> = (0..num_hidden_layers)
            .map(|i| family.feed_forward(path, &raw, i, dense))
            .collect::<Result<_>>()?;
        // A config that has experts but a family without them: refused, not run dense.
        if !family.has_experts() {
            for (field, value) in [
                ("num_experts", raw.num_experts),
                ("num_local_experts", raw.num_local_experts),
            ] {
                if value.is_some_and(|n| n > 0) {
                    return Err(ModelError::invalid(
                        path,
                        field,
                        format!(
                            "{architecture} has no mixture-of-experts form in mlxcel; the \
                             mixture-of-experts families are {}",
                            Architecture::moe_names()
                        ),
                    ));
                }
            }
        }
        Ok(Self {
            architecture,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: raw
                .tie_word_embeddings
                .unwrap_or(defaults.tie_word_embeddings),
            max_position_embeddings,
            vocab_size: need(raw.vocab_size.or(Some(defaults.vocab_size)), "vocab_size")?,
            attention_qkv_bias,
            attention_out_bias,
            qk_norm: features.qk_norm,
            qk_norm_whole: features.qk_norm_whole,
            attention_sinks: features.attention_sinks,
            global_head_dim: layout.global_head_dim,
            kv_shared_layers: layout.kv_shared_layers,
            per_layer_input: layout.per_layer_input,
            keys_as_values: layout.keys_as_values,
            global_key_value_heads: layout.global_key_value_heads,
            value_norm: features.value_norm,
            layer_scalars: features.layer_scalars,
            layers,
            attention_output_gate: features.attention_output_gate,
            feed_forward,
            norm_weight_offset: features.norm_weight_offset,
            sandwich_norms: features.sandwich_norms,
            hidden_activation,
            // Hugging Face multiplies by √hidden in the weights' dtype (bf16 for every released
            // Gemma) and mlx-lm rounds it to bf16 explicitly.
            embedding_scale: features.scaled_embeddings.then(|| {
                let scale = (hidden_size as f32).sqrt();
                if features.embedding_scale_bf16 {
                    round_bf16(scale)
                } else {
                    scale
                }
            }),
            attention_scale: features
                .attention_scale
                .unwrap_or(1.0 / query_pre_attn_scalar.unwrap_or(head_dim as f32).sqrt()),
            attn_logit_softcapping: positive("attn_logit_softcapping", attn_cap)?,
            final_logit_softcapping: positive("final_logit_softcapping", final_cap)?,
            rope_local_theta,
            rotary_dim,
            rope_factors,
            rope_attention_factor,
            multimodal: false,
            quantization,
            eos_token_ids: token_ids(path, "eos_token_id", raw.eos_token_id.as_ref())?,
            bos_token_id: raw.bos_token_id,
            name: raw.name_or_path.filter(|n| !n.trim().is_empty()),
        })
    }
}

fn architecture(path: &Path, raw: &RawConfig) -> Result<Architecture> {
    let name = raw
        .architectures
        .first()
        .cloned()
        .or_else(|| raw.model_type.clone())
        .ok_or_else(|| ModelError::MissingField {
            path: path.to_owned(),
            field: "architectures".into(),
        })?;
    Architecture::named(&name).ok_or_else(|| ModelError::UnsupportedArchitecture {
        path: path.to_owned(),
        architecture: name,
        supported: Architecture::supported_names(),
    })
}

/// Each layer's RoPE and window, from `layer_types` when the config lists them (Hugging Face's
/// current form), else from the family's own keys (Mistral's `sliding_window` on every layer,
/// Qwen's `use_sliding_window` with `max_window_layers`, SmolLM3's `no_rope_layers`, ...).
fn layer_attention(
    path: &Path,
    raw: &RawConfig,
    architecture: Architecture,
    layers: usize,
) -> Result<Vec<LayerAttention>> {
    let family = architecture.family();
    let linear = family.linear_attention(path, raw, layers)?;
    let conv = family.short_conv(path, raw, layers)?;
    // An absent key is the family's default window; `null` is no window.
    let window = match raw.sliding_window.as_ref() {
        None => family.defaults().sliding_window,
        Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().filter(|&w| w >= 1).ok_or_else(|| {
            ModelError::invalid(path, "sliding_window", "expected a positive integer")
        })? as usize),
    };
    let slides = |i: usize| -> Result<bool> {
        if let Some(types) = &raw.layer_types {
            if types.len() != layers {
                return Err(ModelError::invalid(
                    path,
                    "layer_types",
                    format!(
                        "lists {} layers, num_hidden_layers is {layers}",
                        types.len()
                    ),
                ));
            }
            return match types[i].as_str() {
                "full_attention" => Ok(false),
                "sliding_attention" => Ok(true),
                "linear_attention" if linear[i].is_some() => Ok(false),
                "conv" if conv[i].is_some() => Ok(false),
                "linear_attention" => Err(ModelError::invalid(
                    path,
                    "layer_types",
                    format!(
                        "`linear_attention` layers are not part of {architecture} (the \
                         linear-attention families are qwen3_next, qwen3_5, qwen3_5_moe)"
                    ),
                )),
                other => Err(ModelError::invalid(
                    path,
                    "layer_types",
                    format!(
                        "`{other}` (supported: full_attention, sliding_attention, \
                         linear_attention in the gated-DeltaNet families, and conv in lfm2 and \
                         lfm2_moe)"
                    ),
                )),
            };
        }
        Ok(family.slides(raw, window, i))
    };
    (0..layers)
        .map(|i| {
            let slides = slides(i)?;
            if slides && window.is_none() {
                return Err(ModelError::invalid(
                    path,
                    "sliding_window",
                    format!("layer {i} slides but no window is given"),
                ));
            }
            Ok(LayerAttention {
                rope: family.rope(path, raw, layers, i)?,
                window: if slides { window } else { None },
                linear: linear[i],
                conv: conv[i],
            })
        })
        .collect()
}

/// Reads a token id field that may be a number or a list of numbers.
pub(crate) fn token_ids(path: &Path, field: &str, value: Option<&Value>) -> Result<Vec<u32>> {
    let bad = || ModelError::invalid(path, field, "expected a token id or a list of token ids");
    let one = |v: &Value| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(bad)
    };
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as f32.
fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(rounded)
}
