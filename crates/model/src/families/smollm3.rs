//! SmolLM3 (`SmolLM3ForCausalLM`): a llama whose every `no_rope_layer_interval`-th layer has no
//! RoPE (or as `no_rope_layers` lists them).

use std::path::Path;

use serde_json::{Value, json};

use super::family::{Family, slides_from_max_window_layers};
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

    fn slides(&self, raw: &RawConfig, _window: Option<usize>, layer: usize) -> bool {
        slides_from_max_window_layers(raw, layer)
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
