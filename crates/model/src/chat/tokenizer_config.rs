//! The parts of `tokenizer_config.json` a chat template needs.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{ModelError, Result};

/// The parts of `tokenizer_config.json` we use.
#[derive(Debug, Default)]
pub(crate) struct TokenizerConfig {
    pub chat_template: Option<String>,
    /// The `tool_use` entry of a named list of templates (what llama.cpp renders requests with
    /// tools with, and shows in `/props` as `chat_template_tool_use`).
    pub chat_template_tool_use: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl TokenizerConfig {
    pub(crate) fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer_config.json");
        if !path.is_file() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let json: Json = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        let named = |named: &[Json], name: &str| {
            named
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some(name))
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str)
                .map(str::to_owned)
        };
        let chat_template_tool_use = match json.get("chat_template") {
            Some(Json::Array(list)) => named(list, "tool_use"),
            _ => None,
        };
        let chat_template = match json.get("chat_template") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(list)) => named(list, "default"),
            Some(_) => {
                return Err(ModelError::invalid(
                    &path,
                    "chat_template",
                    "expected a string or a list of {name, template}",
                ));
            }
        };
        Ok(Self {
            chat_template,
            chat_template_tool_use,
            bos_token: special_token(json.get("bos_token")),
            eos_token: special_token(json.get("eos_token")),
        })
    }
}

/// A special token given as a string or as an AddedToken object (`{"content": ...}`).
fn special_token(value: Option<&Json>) -> Option<String> {
    match value? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}
