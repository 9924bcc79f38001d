//! config.json as written, read leniently: every key optional, so that the families and the
//! validation in [`super`] decide what is required and what a missing key defaults to.

use serde::Deserialize;
use serde_json::Value;

/// The keys of a config.json that mlxcel reads, none of them required yet.
#[derive(Debug, Deserialize)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub hidden_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub rms_norm_eps: Option<f32>,
    pub rope_theta: Option<f32>,
    pub rope_scaling: Option<Value>,
    pub tie_word_embeddings: Option<bool>,
    pub max_position_embeddings: Option<usize>,
    pub vocab_size: Option<usize>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    /// `Some(Value::Null)` when config.json says `null` (no window), `None` when it leaves the
    /// key out (the family's default window).
    #[serde(default, deserialize_with = "present")]
    pub sliding_window: Option<Value>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub no_rope_layers: Option<Vec<u8>>,
    pub no_rope_layer_interval: Option<usize>,
    pub num_experts: Option<usize>,
    pub sliding_window_pattern: Option<usize>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub rope_local_base_freq: Option<f32>,
    pub hidden_activation: Option<String>,
    pub hidden_act: Option<String>,
    pub partial_rotary_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
    pub num_local_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub experts_per_token: Option<usize>,
    pub swiglu_limit: Option<f64>,
    pub moe_intermediate_size: Option<usize>,
    pub shared_expert_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    pub clip_qkv: Option<Value>,
    pub qkv_bias: Option<bool>,
    pub full_attention_interval: Option<usize>,
    pub linear_num_key_heads: Option<usize>,
    pub linear_num_value_heads: Option<usize>,
    pub linear_key_head_dim: Option<usize>,
    pub linear_value_head_dim: Option<usize>,
    pub linear_conv_kernel_dim: Option<usize>,
    /// mlxcel's own key, written by GGUF import: `tiled` when the linear layers' value heads are
    /// in llama.cpp's tiled order (`grouped`, the default, is Hugging Face's).
    pub linear_value_head_order: Option<String>,
    /// transformers 5's RoPE keys (and Qwen3.5's `partial_rotary_factor`): one `{rope_type,
    /// rope_theta, ...}` object, or one per layer type (`full_attention`, `sliding_attention`).
    pub rope_parameters: Option<Value>,
    pub global_head_dim: Option<usize>,
    pub attention_k_eq_v: Option<bool>,
    pub num_global_key_value_heads: Option<usize>,
    pub num_kv_shared_layers: Option<usize>,
    pub enable_moe_block: Option<bool>,
    pub top_k_experts: Option<usize>,
    pub hidden_size_per_layer_input: Option<usize>,
    pub vocab_size_per_layer_input: Option<usize>,
    pub use_double_wide_mlp: Option<bool>,
    pub use_bidirectional_attention: Option<Value>,
    #[serde(default)]
    pub vision_config: Option<Value>,
    pub quantization: Option<Value>,
    /// LFM2's spellings and keys (`families/lfm2.rs` reads them into the ones above).
    pub norm_eps: Option<f32>,
    pub block_norm_eps: Option<f32>,
    #[serde(rename = "conv_L_cache")]
    pub conv_l_cache: Option<usize>,
    pub conv_bias: Option<bool>,
    pub conv_dim: Option<usize>,
    pub conv_dim_out: Option<usize>,
    pub block_dim: Option<usize>,
    pub block_ff_dim: Option<usize>,
    pub block_multiple_of: Option<usize>,
    /// `Some(Value::Null)` for `null` (no multiplier), `None` when left out.
    #[serde(default, deserialize_with = "present")]
    pub block_ffn_dim_multiplier: Option<Value>,
    pub block_auto_adjust_ff_dim: Option<bool>,
    pub block_use_swiglu: Option<bool>,
    pub use_pos_enc: Option<bool>,
    pub full_attn_idxs: Option<Vec<usize>>,
    pub tie_embedding: Option<bool>,
    pub num_heads: Option<usize>,
    pub num_dense_layers: Option<usize>,
    pub use_expert_bias: Option<bool>,
    pub routed_scaling_factor: Option<f64>,
    pub eos_token_id: Option<Value>,
    pub bos_token_id: Option<u32>,
    #[serde(rename = "_name_or_path")]
    pub name_or_path: Option<String>,
}

/// A key that is present, `null` included: `Some(Value::Null)` for `null`, where serde's own
/// `Option` would make it `None`, the same as an absent key.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}
