//! llama-server's reasoning flags (`--reasoning-format`, `--chat-template-kwargs`,
//! `--reasoning-budget` and its message, `-rea/--reasoning`, `--reasoning-preserve`,
//! `--skip-chat-parsing`, `--reasoning-effort`), flattened into [`crate::ServerArgs`], and the
//! server settings they make ([`crate::reasoning::ReasoningDefaults`]).

use clap::Args;

use crate::error::ServerError;
use crate::llama_flags::llama_bool;

#[derive(Debug, Clone, Args)]
pub struct ReasoningArgs {
    /// How chat replies split their reasoning from their answer: `none` (all in `content`),
    /// `deepseek` (reasoning in `reasoning_content`), `deepseek-legacy` (both, `content` whole)
    /// or `auto` (as `deepseek`; the default).
    #[arg(
        long = "reasoning-format",
        env = "LLAMA_ARG_THINK",
        default_value = "auto"
    )]
    pub reasoning_format: String,

    /// Extra variables of every chat template render, as a JSON object
    /// (`{"enable_thinking": false}`); a request's `chat_template_kwargs` go over them.
    #[arg(long = "chat-template-kwargs", env = "LLAMA_ARG_CHAT_TEMPLATE_KWARGS")]
    pub chat_template_kwargs: Option<String>,

    /// Thinking budget: -1 unlimited (the default), 0 no thinking (the template's
    /// `enable_thinking` is false, a thinking block the prompt opened is closed), N > 0 tokens
    /// of thinking, after which the engine ends the block itself.
    #[arg(long = "reasoning-budget", env = "LLAMA_ARG_THINK_BUDGET", default_value_t = -1, allow_negative_numbers = true)]
    pub reasoning_budget: i64,

    /// Written before the end of a reasoning block that the budget ends (e.g. "Time to answer.").
    #[arg(
        long = "reasoning-budget-message",
        env = "LLAMA_ARG_THINK_BUDGET_MESSAGE",
        default_value = ""
    )]
    pub reasoning_budget_message: String,

    /// Thinking in chat replies: `on` or `off` (the template's `enable_thinking` variable), or
    /// `auto` (the template's default).
    #[arg(
        long = "reasoning",
        env = "LLAMA_ARG_REASONING",
        default_value = "auto"
    )]
    pub reasoning: String,

    /// The chat template's `preserve_reasoning` variable: keep earlier turns' reasoning in the
    /// prompt (templates that read it); unset, the template's default.
    #[arg(
        long = "reasoning-preserve",
        env = "LLAMA_ARG_REASONING_PRESERVE",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_missing_value = "true",
        overrides_with = "no_reasoning_preserve"
    )]
    pub reasoning_preserve: Option<bool>,

    /// `preserve_reasoning: false` for the chat template.
    #[arg(long = "no-reasoning-preserve", overrides_with = "reasoning_preserve")]
    pub no_reasoning_preserve: bool,

    /// Chat replies are not parsed: the reasoning and any tool call stay in `content`.
    #[arg(
        long = "skip-chat-parsing",
        env = "LLAMA_ARG_SKIP_CHAT_PARSING",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "false",
        default_missing_value = "true",
        overrides_with = "no_skip_chat_parsing"
    )]
    pub skip_chat_parsing: bool,

    /// Chat replies are parsed into reasoning, content and tool calls (the default).
    #[arg(long = "no-skip-chat-parsing", overrides_with = "skip_chat_parsing")]
    pub no_skip_chat_parsing: bool,

    /// The reasoning effort given to the chat template as `reasoning_effort` (gpt-oss reads
    /// it: `low`, `medium`, `high`); `default` keeps the template's.
    #[arg(long = "reasoning-effort", env = "LLAMA_ARG_REASONING_EFFORT")]
    pub reasoning_effort: Option<String>,
}

impl ReasoningArgs {
    /// The server's reasoning settings under these flags, checked.
    pub(crate) fn defaults(&self) -> Result<crate::reasoning::ReasoningDefaults, ServerError> {
        use crate::reasoning::{ReasoningFormat, thinking_of_budget};
        let flag = |err: crate::error::ApiError| ServerError::Flag(err.to_string());
        let mut template_kwargs = match &self.chat_template_kwargs {
            None => serde_json::Map::new(),
            Some(text) => match serde_json::from_str(text) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => {
                    return Err(ServerError::Flag(format!(
                        "--chat-template-kwargs {text}: expected a JSON object, such as \
                         '{{\"enable_thinking\": false}}'"
                    )));
                }
            },
        };
        // llama-server writes these under `--chat-template-kwargs`' own variables.
        let thinking = match self.reasoning.as_str() {
            "on" | "true" | "1" | "enabled" => Some(true),
            "off" | "false" | "0" | "disabled" => Some(false),
            "auto" => None,
            other => {
                return Err(ServerError::Flag(format!(
                    "--reasoning {other}: expected on, off or auto"
                )));
            }
        };
        if let Some(on) = thinking {
            template_kwargs.insert("enable_thinking".into(), on.into());
        }
        let preserve = match (self.reasoning_preserve, self.no_reasoning_preserve) {
            (_, true) => Some(false),
            (preserve, false) => preserve,
        };
        if let Some(preserve) = preserve {
            template_kwargs.insert("preserve_reasoning".into(), preserve.into());
        }
        Ok(crate::reasoning::ReasoningDefaults {
            format: ReasoningFormat::parse("--reasoning-format", &self.reasoning_format)
                .map_err(flag)?,
            template_kwargs,
            thinking: thinking_of_budget("--reasoning-budget", self.reasoning_budget)
                .map_err(flag)?,
            effort: self
                .reasoning_effort
                .clone()
                .filter(|effort| effort != "default"),
            budget: usize::try_from(self.reasoning_budget)
                .ok()
                .filter(|&n| n > 0),
            budget_message: self.reasoning_budget_message.clone(),
            skip_parsing: self.skip_chat_parsing && !self.no_skip_chat_parsing,
        })
    }
}
