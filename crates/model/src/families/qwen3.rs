//! Qwen3 (`Qwen3ForCausalLM`): no biases, RMSNorm on each head of q and k before RoPE.

use super::family::{Defaults, Family, Features, slides_from_max_window_layers};
use crate::config::raw::RawConfig;

pub(super) struct Qwen3;

impl Family for Qwen3 {
    fn hf_name(&self) -> &'static str {
        "Qwen3ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen3"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen3"
    }

    /// transformers' `Qwen3Config` defaults.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 151_936,
            intermediate_size: 22_016,
            num_key_value_heads: Some(32),
            head_dim: Some(128),
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

    fn slides(&self, raw: &RawConfig, _window: Option<usize>, layer: usize) -> bool {
        slides_from_max_window_layers(raw, &self.defaults(), layer)
    }
}
