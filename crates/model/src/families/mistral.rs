//! Mistral (`MistralForCausalLM`): a llama whose layers may all slide (`sliding_window`).
//! llama.cpp converts it as a llama.

use super::family::Family;
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

    fn slides(&self, raw: &RawConfig, window: Option<usize>, _layer: usize) -> bool {
        window.is_some() && raw.use_sliding_window != Some(false)
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }
}
