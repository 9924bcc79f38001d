//! SmolLM3 (`SmolLM3ForCausalLM`): a llama whose every `no_rope_layer_interval`-th layer has no
//! RoPE (or as `no_rope_layers` lists them).

use std::path::Path;

use serde_json::{Value, json};

use super::family::{Defaults, Family};
use crate::config::raw::RawConfig;
use crate::error::{ModelError, Result};
use crate::gguf::header::GgufHeader;

pub(super) struct SmolLm3;

impl Family for SmolLm3 {
    fn hf_name(&self) -> &'static str {
        "SmolLM3ForCausalLM"
    }

    fn model_type(&self) -> &'static str {
        "smollm3"
    }

    fn gguf_name(&self) -> &'static str {
        "smollm3"
    }

    /// transformers' `SmolLM3Config` defaults.
    fn defaults(&self) -> Defaults {
        Defaults {
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 11_008,
            num_hidden_layers: 36,
            num_attention_heads: 16,
            num_key_value_heads: Some(4),
            max_position_embeddings: 32_768,
            rope_theta: 2_000_000.0,
            tie_word_embeddings: true,
            ..Defaults::LLAMA
        }
    }

    /// transformers' SmolLM3 slides the layers without RoPE when `use_sliding_window` is set
    /// and there is a window (no released checkpoint sets it; mlx-lm slides none).
    fn slides(&self, raw: &RawConfig, window: Option<usize>, layer: usize) -> bool {
        raw.use_sliding_window == Some(true)
            && window.is_some()
            && raw.no_rope_layers.as_ref().map_or_else(
                || {
                    let interval = raw.no_rope_layer_interval.unwrap_or(4);
                    interval > 0 && (layer + 1).is_multiple_of(interval)
                },
                |list| list.get(layer) == Some(&0),
            )
    }

    fn rope(&self, path: &Path, raw: &RawConfig, layers: usize, layer: usize) -> Result<bool> {
        if let Some(list) = &raw.no_rope_layers {
            if list.len() != layers {
                return Err(ModelError::invalid(
                    path,
                    "no_rope_layers",
                    format!("lists {} layers, num_hidden_layers is {layers}", list.len()),
                ));
            }
            // 1 = the layer uses RoPE (the name notwithstanding).
            return Ok(list[layer] != 0);
        }
        let interval = raw.no_rope_layer_interval.unwrap_or(4);
        if interval == 0 {
            return Err(ModelError::invalid(
                path,
                "no_rope_layer_interval",
                "must be at least 1",
            ));
        }
        Ok(!(layer + 1).is_multiple_of(interval))
    }

    fn gguf_permuted_qk(&self) -> bool {
        true
    }

    fn gguf_config(&self, _header: &GgufHeader, config: &mut Value) {
        // llama.cpp runs every fourth SmolLM3 layer without RoPE and stores no key for it.
        config["no_rope_layer_interval"] = json!(4);
    }
}
