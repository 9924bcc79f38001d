//! The one trait a model family implements, and the small descriptions it answers with.
//!
//! Every method but the names has the llama answer as its default, so a llama-shaped family is
//! its names and the few answers where it differs.

use std::path::Path;

use serde_json::Value;

use crate::config::blocks::{
    AttentionLayout, FeedForward, GatedDeltaNet, HiddenActivation, LayerAttention, ShortConv,
};
use crate::config::raw::RawConfig;
use crate::error::Result;
use crate::gguf::header::GgufHeader;
use crate::gguf::names::hf_name;

use super::moe::{ExpertKeys, routed_or_dense};

/// Everything that is particular to one model family: how it is named, how its config.json reads,
/// how its GGUF files name things. What is common to all of them (the checks of every number, the
/// tensors every layer has) lives with the config and the converter.
pub(crate) trait Family: Sync {
    /// The `architectures[0]` Hugging Face writes, e.g. `LlamaForCausalLM`.
    fn hf_name(&self) -> &'static str;

    /// The `model_type` Hugging Face writes, e.g. `llama`; also what logs print.
    fn model_type(&self) -> &'static str;

    /// llama.cpp's `general.architecture` for the family: what a GGUF of it is written as and
    /// read back from (Mistral is written as a `llama`; the registry's first family of a name
    /// reads it).
    fn gguf_name(&self) -> &'static str;

    /// Why a GGUF file of the family is refused, when mlxcel cannot import it yet (`None`: it
    /// reads the family's GGUF files).
    fn gguf_refusal(&self) -> Option<&'static str> {
        None
    }

    /// A multimodal checkpoint (`architectures[0]`, `model_type`) whose `text_config` is a model
    /// of this family, read without its vision tower (Gemma 3's `Gemma3ForConditionalGeneration`).
    fn multimodal_wrapper(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Rewrites the family's own spellings of config.json's keys into the ones mlxcel reads
    /// (LFM2's `norm_eps`, `block_ff_dim`, `full_attn_idxs`), and refuses by name what it
    /// cannot honour; runs before anything else reads `raw`.
    fn adapt(&self, path: &Path, raw: &mut RawConfig) -> Result<()> {
        let _ = (path, raw);
        Ok(())
    }

    /// What transformers assumes for the keys config.json may leave out.
    fn defaults(&self) -> Defaults {
        Defaults::LLAMA
    }

    /// The family's fixed traits, which no key of config.json changes.
    fn features(&self) -> Features {
        Features::LLAMA
    }

    /// Whether the q/k/v projections and the output projection carry biases.
    fn attention_biases(&self, raw: &RawConfig) -> (bool, bool) {
        let bias = raw.attention_bias.unwrap_or(false);
        (bias, bias)
    }

    /// Whether layer `layer` slides, for a config.json without `layer_types` (which says it for
    /// every family); `window` is the sliding window, if the config (or the family) has one.
    fn slides(&self, raw: &RawConfig, window: Option<usize>, layer: usize) -> bool {
        let _ = (raw, window, layer);
        false
    }

    /// Whether layer `layer` of `layers` rotates q and k.
    fn rope(&self, path: &Path, raw: &RawConfig, layers: usize, layer: usize) -> Result<bool> {
        let _ = (path, raw, layers, layer);
        Ok(true)
    }

    /// The family's own RoPE schedule, when it reads one from keys of its own (an error names a
    /// bad one); `None`: `rope_theta`, `rope_local_base_freq` and `rope_scaling` as usual.
    fn rope_schedule(
        &self,
        path: &Path,
        raw: &RawConfig,
        head_dim: usize,
    ) -> Result<Option<RopeSchedule>> {
        let _ = (path, raw, head_dim);
        Ok(None)
    }

    /// How the family's attention layers differ from one another in shape (Gemma 4's larger
    /// full-layer head, shared keys and values, per-layer inputs), read from its keys once
    /// `layers` (each layer's window) is known; an error names a bad key. Default: they do not.
    fn attention_layout(
        &self,
        path: &Path,
        raw: &RawConfig,
        head_dim: usize,
        layers: &[LayerAttention],
    ) -> Result<AttentionLayout> {
        let _ = (path, raw, head_dim, layers);
        Ok(AttentionLayout::default())
    }

    /// Refuses the keys of config.json the family's transformers model reads but mlxcel does not
    /// implement (an error names the key), rather than run without them.
    fn check(&self, path: &Path, raw: &RawConfig) -> Result<()> {
        let _ = (path, raw);
        Ok(())
    }

    /// Whether the family's layers may be mixtures of experts (names it in the refusal of an
    /// expert config of another family).
    fn has_experts(&self) -> bool {
        false
    }

    /// Layer `layer`'s feed-forward block; `dense` is the gated MLP config.json describes
    /// (`intermediate_size`, the activation), every llama-shaped family's answer. A
    /// mixture-of-experts family reads its experts here (an error names a missing or bad key).
    fn feed_forward(
        &self,
        path: &Path,
        raw: &RawConfig,
        layer: usize,
        dense: FeedForward,
    ) -> Result<FeedForward> {
        match self.expert_keys(raw) {
            Some(keys) => routed_or_dense(path, raw, layer, dense, keys),
            None => Ok(dense),
        }
    }

    /// How a mixture-of-experts family names and routes its experts (`None`: a dense family);
    /// [`Family::feed_forward`] reads each layer's block from them.
    fn expert_keys(&self, raw: &RawConfig) -> Option<ExpertKeys> {
        let _ = raw;
        None
    }

    /// Per layer, `Some` for a linear-attention (gated DeltaNet) layer, read from the family's
    /// keys (`layer_types`, `full_attention_interval`, `linear_*`); every layer is softmax
    /// attention in the families without them.
    fn linear_attention(
        &self,
        path: &Path,
        raw: &RawConfig,
        layers: usize,
    ) -> Result<Vec<Option<GatedDeltaNet>>> {
        let _ = (path, raw);
        Ok(vec![None; layers])
    }

    /// Per layer, `Some` for a short-convolution layer (LFM2's `conv` layers in `layer_types`);
    /// every layer is attention in the families without them.
    fn short_conv(
        &self,
        path: &Path,
        raw: &RawConfig,
        layers: usize,
    ) -> Result<Vec<Option<ShortConv>>> {
        let _ = (path, raw);
        Ok(vec![None; layers])
    }

    /// A checkpoint's tensor or module name under mlxcel's (llama's) name, for a family whose
    /// checkpoints name their modules their own way (LFM2's `operator_norm`,
    /// `feed_forward.w1`); `None`: the name as it stands.
    fn canonical_name(&self, name: &str) -> Option<String> {
        let _ = name;
        None
    }

    /// Projections the checkpoint stores fused, which load as their parts.
    fn fused_projections(&self) -> &'static [FusedProjection] {
        &[]
    }

    /// The Hugging Face module and suffix (`weight`, `bias`) of a GGUF tensor of the family.
    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        llama_tensor_name(gguf_name)
    }

    /// Whether llama.cpp's converter permuted the rows of q and k (the families it converts as
    /// llamas).
    fn gguf_permuted_qk(&self) -> bool {
        false
    }

    /// Of a GGUF with a sliding window: every how-many-th layer is global when the file lists no
    /// pattern (`None`: the family's GGUF carries no sliding layers).
    fn gguf_sliding_period(&self) -> Option<u64> {
        None
    }

    /// Writes what config.json needs beyond the llama keys, from a GGUF file's header.
    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        let _ = (header, config);
    }
}

/// transformers' values for the keys a config.json may leave out (its config class's field
/// defaults): a config.json transformers loads, mlxcel loads with the same numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `None`: `num_attention_heads` (no grouping).
    pub num_key_value_heads: Option<usize>,
    /// `None`: `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    pub max_position_embeddings: usize,
    /// The RoPE scaling's pretraining window when neither config.json nor `rope_scaling` gives
    /// one (Phi-3's `original_max_position_embeddings`, 4096); `None`: the family has no such
    /// default.
    pub original_max_position_embeddings: Option<usize>,
    /// The first layer that slides when `use_sliding_window` is set (Qwen2's and Qwen3's
    /// `max_window_layers`).
    pub max_window_layers: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub tie_word_embeddings: bool,
    pub hidden_activation: HiddenActivation,
    pub sliding_window: Option<usize>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    /// `Some(default)` when the family reads `rope_local_base_freq` (its sliding layers' own RoPE
    /// base); `None` when it ignores the key.
    pub rope_local_base_freq: Option<f32>,
    /// The share of each head RoPE rotates when config.json does not say (`None`: all of it).
    pub partial_rotary_factor: Option<f64>,
    /// `rope_scaling` (JSON) when config.json leaves the key out; an explicit `null` means none.
    pub rope_scaling: Option<&'static str>,
}

impl Defaults {
    /// transformers' `LlamaConfig`.
    pub const LLAMA: Self = Self {
        vocab_size: 32_000,
        hidden_size: 4096,
        intermediate_size: 11_008,
        num_hidden_layers: 32,
        num_attention_heads: 32,
        num_key_value_heads: None,
        head_dim: None,
        max_position_embeddings: 2048,
        original_max_position_embeddings: None,
        max_window_layers: 28,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        hidden_activation: HiddenActivation::Silu,
        sliding_window: None,
        query_pre_attn_scalar: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        rope_local_base_freq: None,
        partial_rotary_factor: None,
        rope_scaling: None,
    };
}

/// What a family always does (each a field of [`crate::ModelConfig`] of the same name).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features {
    pub qk_norm: bool,
    /// q and k each normalised as one vector, not head by head.
    pub qk_norm_whole: bool,
    pub norm_weight_offset: bool,
    pub sandwich_norms: bool,
    /// Token embeddings multiplied by √hidden_size.
    pub scaled_embeddings: bool,
    /// The attention's output is gated: `q_proj` gives each head its queries and then as many
    /// gate values, and the attention's output is multiplied by `sigmoid(gate)` before `o_proj`
    /// (Qwen3-Next, Qwen3.5).
    pub attention_output_gate: bool,
    /// A learned logit per head in each attention softmax (`self_attn.sinks`, gpt-oss).
    pub attention_sinks: bool,
    /// That factor rounded to bf16 (Gemma 2 and 3, as Hugging Face and mlx-lm compute it).
    pub embedding_scale_bf16: bool,
    /// Each head of v goes through an RMSNorm without weights (Gemma 4's `v_norm`).
    pub value_norm: bool,
    /// Each layer's output is multiplied by its `layer_scalar` (Gemma 4).
    pub layer_scalars: bool,
    /// The attention's score scale when the family fixes it (Gemma 4: 1, its q and k normed);
    /// `None`: `1/√query_pre_attn_scalar`, else `1/√head_dim`.
    pub attention_scale: Option<f32>,
}

impl Features {
    pub const LLAMA: Self = Self {
        qk_norm: false,
        qk_norm_whole: false,
        norm_weight_offset: false,
        sandwich_norms: false,
        scaled_embeddings: false,
        attention_output_gate: false,
        attention_sinks: false,
        embedding_scale_bf16: false,
        value_norm: false,
        layer_scalars: false,
        attention_scale: None,
    };
}

/// A family's own RoPE schedule, read from its own keys (Gemma 4's `rope_parameters` per layer
/// type), in place of `rope_theta`, `rope_local_base_freq` and `rope_scaling`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RopeSchedule {
    /// The base of the layers that do not slide.
    pub theta: f32,
    /// The base of the sliding layers, when it differs.
    pub local_theta: Option<f32>,
    /// A factor on each rotated pair's period of the layers that do not slide (infinite: the
    /// pair does not rotate), `head_dim / 2` of them.
    pub factors: Option<Vec<f32>>,
}

/// A projection stored fused in the checkpoint (per layer, e.g. `self_attn.qkv_proj`), and the
/// parts its rows are, in order.
#[derive(Debug, Clone, Copy)]
pub struct FusedProjection {
    /// The fused module under `model.layers.{i}.`.
    pub module: &'static str,
    /// What logs call it, e.g. `qkv`.
    pub label: &'static str,
    /// Each part's module under `model.layers.{i}.` and how many rows it takes.
    pub parts: &'static [(&'static str, Rows)],
}

/// How many rows a part of a fused projection has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// The q projection's (`num_attention_heads * head_dim`).
    Query,
    /// The k or v projection's (`num_key_value_heads * head_dim`).
    KeyValue,
    /// The MLP's hidden size (`intermediate_size`).
    Intermediate,
}

/// Sliding layers as Qwen2 and Qwen3 read them: with `use_sliding_window`, those from
/// `max_window_layers` on (transformers' default 28).
pub(crate) fn slides_from_max_window_layers(
    raw: &RawConfig,
    defaults: &Defaults,
    layer: usize,
) -> bool {
    raw.use_sliding_window == Some(true)
        && layer >= raw.max_window_layers.unwrap_or(defaults.max_window_layers)
}

/// A llama's GGUF tensor as its Hugging Face module and suffix: [`hf_name`], but for
/// `post_attention_norm`, which a llama has none of (its `ffn_norm` is its
/// `post_attention_layernorm`).
pub(crate) fn llama_tensor_name(gguf_name: &str) -> Option<(String, &str)> {
    if gguf_name.contains(".post_attention_norm.") {
        return None;
    }
    hf_name(gguf_name)
}
