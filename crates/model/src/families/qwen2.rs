//! Qwen2 (`Qwen2ForCausalLM`): a llama with biases on the q/k/v projections; the layers from
//! `max_window_layers` on slide when `use_sliding_window` is set.

use super::family::{Defaults, Family, slides_from_max_window_layers};
use crate::config::raw::RawConfig;

pub(super) struct Qwen2;

impl Family for Qwen2 {
    fn hf_name(&self) -> &'static str {
        "Qwen2ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "qwen2"
    }

    fn gguf_name(&self) -> &'static str {
        "qwen2"
    }

    /// transformers' `Qwen2Config` defaults.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 151_936,
            intermediate_size: 22_016,
            num_key_value_heads: Some(32),
            max_position_embeddings: 32_768,
            sliding_window: Some(4096),
            ..Defaults::LLAMA
        }
    }

    fn attention_biases(&self, _raw: &RawConfig) -> (bool, bool) {
        (true, false)
    }

    fn slides(&self, raw: &RawConfig, _window: Option<usize>, layer: usize) -> bool {
        slides_from_max_window_layers(raw, &self.defaults(), layer)
    }
}
