//! LoRA adapters: low-rank deltas `y = W x + s · B (A x)` on a decoder layer's projections, read
//! from llama.cpp's GGUF adapters (`convert_lora_to_gguf.py`) and from PEFT's safetensors
//! (`adapter_config.json` beside `adapter_model.safetensors`), checked against the model they are
//! applied to before any backend sees them.
//!
//! The scale of one projection's delta is llama.cpp's: the user's scale times `alpha / rank`
//! (GGUF `adapter.lora.alpha`, PEFT `lora_alpha`), or the user's scale alone when alpha is 0.

mod gguf;
mod peft;
#[cfg(test)]
mod tests;
mod types;

use std::path::Path;

use crate::config::ModelConfig;
use crate::error::Result;
use types::refusal;
pub use types::{LoraAdapter, LoraTarget, LoraWeight};

impl LoraAdapter {
    /// Loads the adapter at `path` for a model of `config`: a GGUF file, a PEFT directory
    /// (`adapter_config.json` and `adapter_model.safetensors`) or a PEFT `.safetensors` file with
    /// its `adapter_config.json` beside it. Refuses a tensor the model has no projection for,
    /// a shape that is not the model's, or a GGUF adapter of another architecture, naming it.
    pub fn open(path: &Path, config: &ModelConfig) -> Result<Self> {
        let mut adapter = if path.is_dir() {
            peft::open(path, config)?
        } else if gguf::is_gguf(path)? {
            gguf::open(path, config)?
        } else {
            peft::open(path, config)?
        };
        adapter.path = path.to_path_buf();
        adapter
            .weights
            .sort_by_key(|w| (w.layer, w.target as usize));
        if let Some(pair) = adapter
            .weights
            .windows(2)
            .find(|p| (p[0].layer, p[0].target) == (p[1].layer, p[1].target))
        {
            return Err(refusal(
                path,
                format!(
                    "two tensor pairs for layer {} {}",
                    pair[0].layer,
                    pair[0].target.hf_module()
                ),
            ));
        }
        if adapter.weights.is_empty() {
            return Err(refusal(
                path,
                "the adapter holds no LoRA tensor pair".into(),
            ));
        }
        Ok(adapter)
    }
}
