//! Qwen3 (`Qwen3ForCausalLM`): no biases, RMSNorm on each head of q and k before RoPE.

use super::family::{Family, Features, slides_from_max_window_layers};
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

    fn features(&self) -> Features {
        Features {
            qk_norm: true,
            ..Features::LLAMA
        }
    }

    fn slides(&self, raw: &RawConfig, _window: Option<usize>, layer: usize) -> bool {
        slides_from_max_window_layers(raw, layer)
    }
}
