//! The one request every generating route is read into. A protocol parses its JSON into a
//! [`Generation`] (the prompt as typed [`Turn`]s with tools, or as given; the sampling and
//! stopping [`Params`]; whether to stream) and formats the engine's events back; the one handler
//! ([`crate::handler`]) does everything between.

use std::time::Duration;

use mlxcel_engine::{Constraint, MaxNewTokens, SamplerStage, SamplingOverrides};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::reasoning::{BudgetFields, BudgetText, ReasoningFields};
use crate::tools::{Tool, ToolChoice};

/// What a generating route asks the handler to run.
#[derive(Debug, Clone)]
pub(crate) struct Generation {
    pub prompt: Prompt,
    pub params: Params,
    pub stream: bool,
}

/// The prompt of a request: a conversation for the chat template, or a prompt as given.
#[derive(Debug, Clone)]
pub(crate) enum Prompt {
    Chat(Chat),
    Input(PromptInput),
}

/// The prompt of a request, before tokenization.
#[derive(Debug, Clone)]
pub enum PromptInput {
    /// Plain text, tokenized with the tokenizer's special tokens (BOS).
    Text(String),
    /// Text already rendered by the chat template (which wrote its own special tokens).
    Templated(String),
    /// Token ids as given.
    Tokens(Vec<u32>),
    /// Texts and token ids in one sequence (llama-server's "mixed" prompt): the texts are
    /// tokenized in place, the first piece with the tokenizer's leading special tokens.
    Mixed(Vec<PromptPiece>),
}

/// One piece of a [`PromptInput::Mixed`] prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptPiece {
    Text(String),
    Token(u32),
}

/// A conversation with the tools the model may call.
#[derive(Debug, Clone)]
pub(crate) struct Chat {
    pub turns: Vec<Turn>,
    pub tools: ToolRequest,
    /// The reasoning options (`reasoning_format`, `chat_template_kwargs` ...); only
    /// `/v1/chat/completions` reads them, others leave them at their defaults.
    pub reasoning: Box<ReasoningFields>,
    /// How the prompt ends: with the generation prompt, or continuing a final assistant message
    /// (only `/v1/chat/completions` reads the fields; every route prefills).
    pub continuation: Continuation,
}

/// How a chat prompt ends, as llama-server decides it: with the generation prompt (the model
/// starts a new reply), or continuing the final assistant message (the model carries on the text
/// the client put in its mouth, an "assistant prefill"). A final assistant message is continued
/// unless `continue_final_message` says otherwise; `add_generation_prompt: false` renders the
/// conversation without the generation prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Continuation {
    /// `add_generation_prompt` (default true).
    pub generation_prompt: bool,
    /// `continue_final_message: true`: the final message must be continued.
    pub explicit: bool,
    /// Without `continue_final_message`, a final assistant message is continued (the server's
    /// `--prefill-assistant`, on by default); off, it is a finished turn.
    pub prefill: bool,
}

impl Default for Continuation {
    fn default() -> Self {
        Self {
            generation_prompt: true,
            explicit: false,
            prefill: true,
        }
    }
}

/// The fields that set a [`Continuation`], which the inert-field check leaves to the chat route.
pub(crate) const CONTINUATION_FIELDS: &[&str] =
    &["add_generation_prompt", "continue_final_message"];

impl Continuation {
    /// Reads `add_generation_prompt` and `continue_final_message` (`true` or `"content"`; `false`
    /// or `null` is off) as llama-server does: continuing needs `add_generation_prompt: false`.
    pub fn from_fields(
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<&Value>,
    ) -> Result<Self, ApiError> {
        let explicit = match continue_final_message {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(Value::String(part)) if part == "content" => true,
            Some(Value::String(part)) if part == "reasoning_content" => {
                return Err(ApiError::unsupported(
                    "continue_final_message",
                    "continue_final_message=\"reasoning_content\" (continuing the reasoning) is \
                     not supported; continue the content (true or \"content\")",
                ));
            }
            Some(other) => {
                return Err(ApiError::invalid_param(
                    "continue_final_message",
                    format!(
                        "continue_final_message: expected true, false or \"content\"; got {other}"
                    ),
                ));
            }
        };
        let generation_prompt = add_generation_prompt.unwrap_or(true);
        if explicit && generation_prompt {
            return Err(ApiError::invalid_param(
                "continue_final_message",
                "Cannot set both add_generation_prompt and continue_final_message to true: send \
                 add_generation_prompt: false to continue the final message",
            ));
        }
        Ok(Self {
            generation_prompt,
            explicit,
            prefill: true,
        })
    }

    /// The turns to render and, when the final assistant message is continued, its text (which
    /// follows the generation prompt of the turns before it).
    pub fn split<'a>(&self, turns: &'a [Turn]) -> Result<(&'a [Turn], Option<&'a str>), ApiError> {
        let Some((last, before)) = turns.split_last() else {
            return Ok((turns, None));
        };
        let last_is_assistant = last.role == "assistant";
        if !self.explicit && (!last_is_assistant || !self.prefill) {
            return Ok((turns, None));
        }
        let param = "messages";
        if !last_is_assistant {
            return Err(ApiError::invalid_param(
                param,
                format!(
                    "continue_final_message: the last message is the {}'s; only an assistant \
                     message can be continued",
                    last.role
                ),
            ));
        }
        if last
            .tool_calls
            .as_ref()
            .is_some_and(|calls| !calls.is_empty())
        {
            return Err(ApiError::invalid_param(
                param,
                "Cannot continue an assistant message that contains tool calls",
            ));
        }
        if !self.explicit && before.last().is_some_and(|t| t.role == "assistant") {
            return Err(ApiError::invalid_param(
                param,
                "Cannot have 2 or more assistant messages at the end of the list",
            ));
        }
        Ok((before, Some(last.content.as_str())))
    }
}

/// One turn of a conversation in the terms of Hugging Face's chat templates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Turn {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls (`Some` also when the client sent an empty list).
    pub tool_calls: Option<Vec<Call>>,
    /// A `tool` turn's answer to this call.
    pub tool_call_id: Option<String>,
    /// The function's name on a `tool` turn.
    pub name: Option<String>,
    /// An assistant turn's reasoning (OpenAI-style `reasoning_content`, Anthropic's `thinking`
    /// blocks), given to the template as the message's `reasoning_content`, which reasoning
    /// templates (Qwen3's, DeepSeek-R1's ...) render in their thinking block.
    pub reasoning_content: Option<String>,
}

impl Turn {
    /// A turn of text only.
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }

    /// Whether the turn makes or answers tool calls (then templates get the tools' context).
    pub fn is_tool_turn(&self) -> bool {
        self.tool_calls.is_some() || self.tool_call_id.is_some() || self.role == "tool"
    }

    /// Whether the turn carries more than a role and text (tool calls or results, reasoning):
    /// then the template gets the rich context, where the turn is given whole.
    pub fn needs_rich_context(&self) -> bool {
        self.is_tool_turn() || self.reasoning_content.is_some()
    }

    /// The turn as Hugging Face passes it to a chat template.
    pub fn template_value(&self) -> Value {
        let mut turn = json!({"role": self.role, "content": self.content});
        if let Some(calls) = &self.tool_calls {
            turn["tool_calls"] = calls.iter().map(Call::template_value).collect();
        }
        if let Some(id) = &self.tool_call_id {
            turn["tool_call_id"] = json!(id);
        }
        if let Some(name) = &self.name {
            turn["name"] = json!(name);
        }
        if let Some(reasoning) = &self.reasoning_content {
            turn["reasoning_content"] = json!(reasoning);
        }
        turn
    }
}

/// One earlier call of the model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub id: Option<String>,
    pub name: Option<String>,
    /// The arguments, parsed into an object when they were sent as JSON text (as templates
    /// expect); text that is not JSON stays text.
    pub arguments: Option<Value>,
}

impl Call {
    /// A call with its `arguments` read: JSON text parsed, anything else kept.
    pub fn new(id: Option<String>, name: Option<String>, arguments: Option<Value>) -> Self {
        let arguments = arguments.map(|arguments| match arguments {
            Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            other => other,
        });
        Self {
            id,
            name,
            arguments,
        }
    }

    /// The call in the template's shape: OpenAI's `{id, type, function: {name, arguments}}`,
    /// with `name` and `arguments` also on the call itself (some templates read them there).
    pub fn template_value(&self) -> Value {
        let mut function = Map::new();
        let mut call = Map::new();
        if let Some(id) = &self.id {
            call.insert("id".into(), json!(id));
        }
        call.insert("type".into(), json!("function"));
        if let Some(name) = &self.name {
            function.insert("name".into(), json!(name));
            call.insert("name".into(), json!(name));
        }
        if let Some(arguments) = &self.arguments {
            function.insert("arguments".into(), arguments.clone());
            call.insert("arguments".into(), arguments.clone());
        }
        call.insert("function".into(), Value::Object(function));
        Value::Object(call)
    }
}

/// The tools of a request: as the template shows them, and as the server constrains and parses
/// calls to them.
#[derive(Debug, Clone)]
pub(crate) struct ToolRequest {
    /// Function tools in OpenAI's chat shape (`{"type": "function", "function": {...}}`), as
    /// Hugging Face passes them to templates.
    pub listed: Vec<Value>,
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// How a refusal names the request's own output constraint when a required call meets one.
    pub other_constraint: &'static str,
}

impl Default for ToolRequest {
    fn default() -> Self {
        Self {
            listed: Vec::new(),
            tools: Vec::new(),
            choice: ToolChoice::Auto,
            parallel: true,
            other_constraint: "another output constraint",
        }
    }
}

/// A function tool in OpenAI's chat shape, which [`crate::tools::read_tools`] reads and
/// templates take.
pub(crate) fn function_tool(
    name: &str,
    description: Option<&str>,
    parameters: Option<&Value>,
) -> Value {
    let mut function = json!({"name": name});
    if let Some(description) = description {
        function["description"] = json!(description);
    }
    if let Some(parameters) = parameters {
        function["parameters"] = parameters.clone();
    }
    json!({"type": "function", "function": function})
}

/// The token a `logit_bias` entry names: an id, or text whose every token gets the bias.
#[derive(Debug, Clone, PartialEq)]
pub enum BiasTarget {
    Id(i64),
    Text(String),
}

/// Sampling and stopping fields common to every route; `None` takes the server default.
#[derive(Debug, Clone, Default)]
pub struct Params {
    pub max_new_tokens: Option<MaxNewTokens>,
    /// The sampling settings the request gives (the engine's one declaration of them).
    pub sampling: SamplingOverrides,
    pub stop: Vec<String>,
    /// Top alternatives per token; `Some(0)` is the chosen token's logprob alone.
    pub logprobs: Option<usize>,
    /// llama-server's `post_sampling_probs`: `logprobs` from the sampler's distribution, after
    /// its chain, rather than the model's.
    pub post_sampling_probs: bool,
    /// Structured output: what the text must match.
    pub constraint: Option<Constraint>,
    /// llama-server's `samplers`: the chain's order and subset.
    pub samplers: Option<Vec<SamplerStage>>,
    /// llama-server's `ignore_eos`: the end-of-sequence tokens' logits become -inf (`None`:
    /// the server's `--ignore-eos`).
    pub ignore_eos: Option<bool>,
    /// llama-server's `t_max_predict_ms`
    /// ([`mlxcel_engine::GenerationRequest::predict_time_limit`]).
    pub predict_time_limit: Option<Duration>,
    /// llama-server's lazy grammar fields, resolved at submission.
    pub lazy_grammar: Option<crate::lazy_grammar::LazyGrammar>,
    /// llama-server's `n_indent` ([`mlxcel_engine::GenerationRequest::min_indent`]).
    pub min_indent: usize,
    /// `logit_bias`, resolved to token ids at submission.
    pub logit_bias: Vec<(BiasTarget, f32)>,
    /// llama-server's `cache_prompt` (`None`: true): whether the prompt may reuse a cached
    /// prefix.
    pub cache_prompt: Option<bool>,
    /// llama-server's `lora`: the adapters' scales for this request, `(id, scale)` as listed
    /// (the others at 0); `None`: the server's global scales.
    pub lora: Option<crate::lora::LoraList>,
    /// llama-server's `timings_per_token`: each streamed token carries the request's timings.
    pub timings_per_token: bool,
    /// llama-server's `return_progress`: a stream reports the prompt's processing
    /// (`prompt_progress`) before the first token.
    pub return_progress: bool,
    /// llama-server's `id_slot`: the `/slots` id the request must run in (`None`: the lowest
    /// free one).
    pub id_slot: Option<usize>,
    /// llama-server's reasoning budget fields, as sent (read by the route's prompt preparation).
    pub budget_fields: BudgetFields,
    /// The reasoning budget the reply runs under, once the route has decided it.
    pub reasoning_budget: Option<BudgetText>,
    /// llama-server's `verbose`: the OpenAI routes' answer carries `__verbose`.
    pub verbose: bool,
    /// llama-server's `sse_ping_interval` (seconds; -1 or 0: no pings; `None`: the server's).
    pub sse_ping_interval: Option<i64>,
}

impl Params {
    /// Refuses `timings_per_token` and `return_progress` on a route whose stream does not
    /// report them (`route` names it).
    pub fn refuse_stream_reports(&self, route: &str) -> Result<(), ApiError> {
        for (name, on) in [
            ("timings_per_token", self.timings_per_token),
            ("return_progress", self.return_progress),
        ] {
            if on {
                return Err(ApiError::unsupported(
                    name,
                    format!(
                        "{name}=true is not supported on {route}; llama-server's /completion, \
                         the OpenAI routes and /v1/responses report it (docs/server.md)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Reads a signed token budget (`-1` unlimited) of field `param`.
pub fn budget(param: &str, value: Option<i64>) -> Result<Option<MaxNewTokens>, ApiError> {
    match value {
        None => Ok(None),
        Some(n) => MaxNewTokens::from_signed(n).map(Some).ok_or_else(|| {
            ApiError::invalid_param(
                param,
                format!("{param}={n}: expected -1 (unlimited) or a count"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_reaches_the_template_in_openai_shape_with_parsed_arguments() {
        let call = Call::new(
            Some("c1".into()),
            Some("get_weather".into()),
            Some(json!("{\"city\": \"Paris\"}")),
        );
        assert_eq!(
            call.template_value(),
            json!({
                "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                "name": "get_weather", "arguments": {"city": "Paris"},
            })
        );
        let text = Call::new(None, Some("f".into()), Some(json!("not json")));
        assert_eq!(text.template_value()["arguments"], "not json");
        let turn = Turn {
            tool_calls: Some(vec![call]),
            ..Turn::text("assistant", "")
        };
        assert!(turn.is_tool_turn() && !Turn::text("user", "hi").is_tool_turn());
        assert_eq!(
            Turn::text("user", "hi").template_value(),
            json!({"role": "user", "content": "hi"})
        );
    }
}
