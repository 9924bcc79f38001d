//! Chat templates: Hugging Face Jinja templates rendered with `minijinja`.
//!
//! HF renders with `trim_blocks` and `lstrip_blocks`, passes `messages`, `add_generation_prompt`,
//! the special tokens as strings, and provides `raise_exception`; we do the same, plus Python
//! string methods (`.strip()`, `.startswith()`) from `minijinja-contrib`.

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, context};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ModelError::ChatTemplate {
                reason: format!("does not compile: {e:#}"),
            })?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Loads the template of the checkpoint in `dir`: `chat_template.jinja`, else
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list whose `default` entry is used).
    /// `Ok(None)` when the checkpoint has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let config = TokenizerConfig::from_dir(dir)?;
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.is_file() {
            Some(std::fs::read_to_string(&jinja).map_err(|e| ModelError::io(&jinja, e))?)
        } else {
            config.chat_template
        };
        source
            .map(|s| {
                Self::new(
                    &s,
                    config.bos_token.as_deref().unwrap_or(""),
                    config.eos_token.as_deref().unwrap_or(""),
                )
            })
            .transpose()
    }

    /// Renders `messages`; with `add_generation_prompt`, ends with the assistant's turn header.
    /// Templates write their own special tokens (BOS included): tokenize the result with
    /// `add_special = false`, as Hugging Face does after `apply_chat_template`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template =
            self.env
                .get_template(TEMPLATE_NAME)
                .map_err(|e| ModelError::ChatTemplate {
                    reason: e.to_string(),
                })?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| ModelError::ChatTemplate {
                reason: format!("rendering failed: {e:#}"),
            })
    }
}

/// The parts of `tokenizer_config.json` we use.
#[derive(Debug, Default)]
pub(crate) struct TokenizerConfig {
    pub chat_template: Option<String>,
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
        let json: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
            path: path.clone(),
            source,
        })?;
        let chat_template = match json.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_owned),
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
            bos_token: special_token(json.get("bos_token")),
            eos_token: special_token(json.get("eos_token")),
        })
    }
}

/// A special token given as a string or as an AddedToken object (`{"content": ...}`).
fn special_token(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}
