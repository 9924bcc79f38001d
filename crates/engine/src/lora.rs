//! The LoRA adapters an engine loads beside its model: what it reports about each, and the
//! check of a request's scales against them. The backend applies them
//! ([`crate::backend::Backend::set_slot_adapters`]).

use std::path::PathBuf;

use mlxcel_model::{LoraAdapter, ModelConfig};

use crate::error::EngineError;

/// A LoRA adapter the engine loaded ([`crate::Engine::lora_adapters`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraInfo {
    /// The path it was given as.
    pub path: PathBuf,
    /// GGUF `adapter.lora.task_name` (empty when absent).
    pub task_name: String,
    /// GGUF `adapter.lora.prompt_prefix` (empty when absent).
    pub prompt_prefix: String,
}

/// Opens every adapter against the model's config (refusing one that does not fit it, named)
/// and describes each.
pub(crate) fn open_adapters(
    paths: &[PathBuf],
    config: &ModelConfig,
) -> Result<Vec<LoraInfo>, EngineError> {
    paths
        .iter()
        .map(|path| {
            let adapter = LoraAdapter::open(path, config)?;
            Ok(LoraInfo {
                path: path.clone(),
                task_name: adapter.task_name,
                prompt_prefix: adapter.prompt_prefix,
            })
        })
        .collect()
}

/// Checks a request's scales (one per adapter id; missing ids are 0) against `loaded` adapters.
pub(crate) fn check_scales(scales: &[f32], loaded: usize) -> Result<(), EngineError> {
    if let Some(bad) = scales.iter().find(|s| !s.is_finite()) {
        return Err(EngineError::InvalidLora(format!(
            "scale {bad} is not a finite number"
        )));
    }
    let given = scales.iter().rposition(|&s| s != 0.0).map_or(0, |i| i + 1);
    if given > loaded {
        let ids = match loaded {
            0 => "none is loaded (load adapters with --lora)".to_owned(),
            n => format!("{n} loaded: ids 0 to {}", n - 1),
        };
        return Err(EngineError::InvalidLora(format!(
            "adapter id {} is not loaded ({ids})",
            given - 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_past_the_loaded_adapters_or_not_finite_are_refused() {
        assert!(check_scales(&[], 0).is_ok());
        // Zero scales for ids that are not loaded change nothing.
        assert!(check_scales(&[0.5, 0.0, 0.0], 1).is_ok());
        let e = check_scales(&[0.0, 1.0], 1).unwrap_err().to_string();
        assert!(
            e.contains("adapter id 1 is not loaded") && e.contains("ids 0 to 0"),
            "{e}"
        );
        let e = check_scales(&[1.0], 0).unwrap_err().to_string();
        assert!(e.contains("--lora"), "{e}");
        let e = check_scales(&[f32::NAN], 1).unwrap_err().to_string();
        assert!(e.contains("not a finite"), "{e}");
    }
}
