//! Mistral (`MistralForCausalLM`): a llama whose layers may all slide (`sliding_window`).
//! llama.cpp converts it as a llama.

use super::family::{Defaults, Family};
use crate::config::raw::RawConfig;

pub(super) struct Mistral;

impl Family for Mistral {
    fn hf_name(&self) -> &'static str {
        "MistralForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "mistral"
    }

    fn gguf_name(&self) -> &'static str {
        "llama"
    }

    /// transformers' `MistralConfig` defaults (its window, 4096, slides every layer unless
    /// config.json says `sliding_window: null`, as the released checkpoints since v0.2 do).
    fn defaults(&self) -> Defaults {
        Defaults {
            intermediate_size: 14_336,
            num_key_value_heads: Some(8),
            max_position_embeddings: 131_072,
            sliding_window: Some(4096),
            ..Defaults::LLAMA
        }
    }

    fn slides(&self, raw: &RawConfig, window: Option<usize>, _layer: usize) -> bool {
        window.is_some() && raw.use_sliding_window != Some(false)
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }
}
