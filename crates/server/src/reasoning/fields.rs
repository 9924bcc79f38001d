//! The request fields and server flags of reasoning models, and the variables they give the
//! chat template: `chat_template_kwargs` (`--chat-template-kwargs`), `reasoning_effort`
//! (`--reasoning-effort`, which gpt-oss's template reads), and the reasoning budget
//! (`--reasoning-budget`, `reasoning_budget_tokens`, `thinking_budget_tokens`): `-1` leaves
//! thinking alone, `0` switches it off (the template's `enable_thinking` is false, and a prompt
//! the template left inside `<think>` has the block closed), and N > 0 lets the reply reason
//! for N tokens before the engine ends the block itself (`budget.rs`).

use serde::Deserialize;
use serde_json::{Map, Value};

use super::format::ReasoningFormat;
use crate::error::ApiError;

/// The server's reasoning settings, from its flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasoningDefaults {
    /// `--reasoning-format` (default `auto`).
    pub format: ReasoningFormat,
    /// `--chat-template-kwargs`: variables every chat render gets, under the request's own.
    pub template_kwargs: Map<String, Value>,
    /// `--reasoning-budget`: `false` once it is 0 (thinking off).
    pub thinking: bool,
    /// `--reasoning-effort` (none: the template's default).
    pub effort: Option<String>,
    /// `--reasoning-budget` N > 0: the tokens a reply may reason for.
    pub budget: Option<usize>,
    /// `--reasoning-budget-message`: written before the end of a block the budget ends.
    pub budget_message: String,
    /// `--skip-chat-parsing`: chat replies stay whole in `content` (no reasoning split, no tool
    /// calls parsed).
    pub skip_parsing: bool,
}

impl ReasoningDefaults {
    /// llama-server's defaults: `auto`, no variables, thinking on, the template's effort.
    pub fn new() -> Self {
        Self {
            thinking: true,
            ..Self::default()
        }
    }
}

/// A reasoning budget as llama-server reads it: `-1` unlimited, `0` no thinking, N > 0 that
/// many tokens of thinking; `field` names the field or flag in the refusal. Returns whether
/// thinking stays on.
pub fn thinking_of_budget(field: &str, budget: i64) -> Result<bool, ApiError> {
    match budget {
        -1 => Ok(true),
        0 => Ok(false),
        n if n > 0 => Ok(true),
        n => Err(ApiError::invalid_param(
            field,
            format!("{field}={n}: expected -1 (unlimited), 0 (no thinking) or a count"),
        )),
    }
}

/// The reasoning fields of a chat request (`/v1/chat/completions`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReasoningFields {
    pub reasoning_format: Option<String>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub reasoning_effort: Option<String>,
    pub reasoning_budget_tokens: Option<i64>,
    pub thinking_budget_tokens: Option<i64>,
}

/// What a chat's render and reply take from the reasoning fields over the server's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateOptions {
    /// How the reply is split.
    pub format: ReasoningFormat,
    /// Extra variables of the render (`enable_thinking`, `reasoning_effort`, ...).
    pub variables: Map<String, Value>,
    /// Thinking switched off by a budget of 0: a prompt left inside `<think>` is closed.
    pub close_thinking: bool,
    /// The tokens the reply may reason for (a budget above 0), from the request or the server.
    pub budget_tokens: Option<usize>,
}

impl ReasoningFields {
    /// The fields this server acts on, which the inert-field check leaves to the chat route.
    pub const NAMES: &[&str] = &[
        "reasoning_format",
        "chat_template_kwargs",
        "reasoning_effort",
        "reasoning_budget_tokens",
        "thinking_budget_tokens",
    ];

    /// Checks the fields that need no server state, so that a bad value is refused with the
    /// other 400s, before the model is asked for.
    pub fn check(&self) -> Result<(), ApiError> {
        if let Some(name) = &self.reasoning_format {
            ReasoningFormat::parse("reasoning_format", name)?;
        }
        for (field, budget) in [
            ("reasoning_budget_tokens", self.reasoning_budget_tokens),
            ("thinking_budget_tokens", self.thinking_budget_tokens),
        ] {
            if let Some(budget) = budget {
                thinking_of_budget(field, budget)?;
            }
        }
        Ok(())
    }

    /// The options of this request over `defaults`: the request's variables over the server's,
    /// `reasoning_effort` and `enable_thinking: false` (a budget of 0) where no variable of
    /// that name was given.
    pub fn resolve(&self, defaults: &ReasoningDefaults) -> Result<TemplateOptions, ApiError> {
        self.check()?;
        let format = match &self.reasoning_format {
            Some(name) => ReasoningFormat::parse("reasoning_format", name)?,
            None => defaults.format,
        };
        let mut variables = defaults.template_kwargs.clone();
        if let Some(kwargs) = &self.chat_template_kwargs {
            variables.extend(kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        if let Some(effort) = self.reasoning_effort.as_ref().or(defaults.effort.as_ref()) {
            variables
                .entry("reasoning_effort")
                .or_insert_with(|| Value::String(effort.clone()));
        }
        let mut thinking = defaults.thinking;
        let mut budget_tokens = defaults.budget;
        for budget in [self.reasoning_budget_tokens, self.thinking_budget_tokens]
            .into_iter()
            .flatten()
        {
            thinking = budget != 0;
            budget_tokens = usize::try_from(budget).ok().filter(|&n| n > 0);
        }
        if !thinking {
            variables
                .entry("enable_thinking")
                .or_insert(Value::Bool(false));
        }
        let close_thinking = variables.get("enable_thinking") == Some(&Value::Bool(false));
        Ok(TemplateOptions {
            format,
            variables,
            close_thinking,
            budget_tokens,
        })
    }
}
