//! The names of the settings: llama-server's reasoning formats, and the forms in which models
//! write their reasoning.

use crate::error::ApiError;

/// llama-server's `reasoning_format` (`--reasoning-format`, and the per-request field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// The reply is left whole in `content`.
    None,
    /// The reasoning goes to `reasoning_content`, the answer to `content`.
    Deepseek,
    /// As `deepseek`, and `content` also keeps the reply whole, tags included.
    DeepseekLegacy,
    /// llama-server's default: as `deepseek`.
    #[default]
    Auto,
}

impl ReasoningFormat {
    /// The names llama-server takes.
    pub const NAMES: &[&str] = &["none", "deepseek", "deepseek-legacy", "auto"];

    /// The format named `name`; `field` names the field or flag in the refusal.
    pub fn parse(field: &str, name: &str) -> Result<Self, ApiError> {
        match name {
            "none" => Ok(Self::None),
            "deepseek" => Ok(Self::Deepseek),
            "deepseek-legacy" => Ok(Self::DeepseekLegacy),
            "auto" => Ok(Self::Auto),
            other => Err(ApiError::invalid_param(
                field,
                format!(
                    "{field}: `{other}` is not a reasoning format; use one of {}",
                    Self::NAMES.join(", ")
                ),
            )),
        }
    }
}

/// How a model writes its reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `<think>…</think>`; `open` when the prompt ended inside the block (the template opened
    /// it), so the reply starts as reasoning.
    Think { open: bool },
    /// gpt-oss's harmony channels.
    Harmony,
}

impl Form {
    /// The form of `template` (its source), for a reply to `prompt` (the rendered prompt).
    pub fn of(template: &str, prompt: &str) -> Self {
        if template.contains("<|channel|>") {
            Self::Harmony
        } else {
            Self::Think {
                open: prompt.trim_end().ends_with("<think>"),
            }
        }
    }
}
