//! Gemma 3 (`Gemma3ForCausalLM`, `gemma3_text`): Gemma 2 without soft-capping by default, with
//! q/k norms, five sliding layers per global one, and a separate RoPE base for the sliding ones.
//! Its multimodal checkpoints (`Gemma3ForConditionalGeneration`) are read as their text model.

use serde_json::Value;

use super::family::{Defaults, Family, Features};
use super::gemma2::{GEMMA_FEATURES, GEMMA2_DEFAULTS, gemma_gguf_config, gemma_tensor_name};
use crate::config::raw::RawConfig;
use crate::gguf::header::GgufHeader;

pub(super) struct Gemma3;

impl Family for Gemma3 {
    fn hf_name(&self) -> &'static str {
        "Gemma3ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "gemma3_text"
    }

    fn gguf_name(&self) -> &'static str {
        "gemma3"
    }

    fn multimodal_wrapper(&self) -> Option<(&'static str, &'static str)> {
        Some(("Gemma3ForConditionalGeneration", "gemma3"))
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 262_208,
            max_position_embeddings: 131_072,
            rope_theta: 1_000_000.0,
            // Gemma 3 caps nothing unless asked.
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
            rope_local_base_freq: Some(10_000.0),
            ..GEMMA2_DEFAULTS
        }
    }

    fn features(&self) -> Features {
        Features {
            qk_norm: true,
            ..GEMMA_FEATURES
        }
    }

    /// All but every `sliding_window_pattern`-th layer (default 6) slide.
    fn slides(&self, raw: &RawConfig, window: Option<usize>, layer: usize) -> bool {
        let pattern = raw.sliding_window_pattern.unwrap_or(6).max(1);
        window.is_some() && !(layer + 1).is_multiple_of(pattern)
    }

    fn gguf_tensor_name<'a>(&self, gguf_name: &'a str) -> Option<(String, &'a str)> {
        gemma_tensor_name(gguf_name)
    }

    fn gguf_sliding_period(&self) -> Option<u64> {
        Some(6)
    }

    fn gguf_config(&self, header: &GgufHeader, config: &mut Value) {
        gemma_gguf_config(header, 62, config);
    }
}
