//! What every chat-shaped route shares (`/v1/chat/completions`, `/v1/responses`, `/v1/messages`):
//! the typed conversation through the chat template, with tools and tool turns in Hugging Face's
//! shape, and the [`ToolPlan`] that constrains a required call and finds calls in the reply. The
//! one handler ([`crate::handler`]) runs them; each route only translates its wire format into
//! these terms and its answer back out of them.

use mlxcel_engine::{ChatMessage, Engine, FinishReason};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::request::{Continuation, Params, Turn};

use crate::tools::{self, Tool, ToolCall, ToolChoice, ToolFormat};

/// [`render`], ending as `continuation` says: a continued final message follows the generation
/// prompt of the turns before it; without the generation prompt, the template is told so.
pub(crate) fn render_ending(
    engine: &Engine,
    turns: &[Turn],
    continuation: Continuation,
    tools: Vec<Value>,
    variables: &Map<String, Value>,
) -> Result<String, ApiError> {
    let (turns, continued) = continuation.split(turns)?;
    let mut text = if !continuation.generation_prompt && continued.is_none() {
        let mut variables = variables.clone();
        variables.insert("add_generation_prompt".into(), false.into());
        render(engine, turns, tools, &variables)?
    } else {
        render(engine, turns, tools, variables)?
    };
    if let Some(continued) = continued {
        text.push_str(continued);
    }
    Ok(text)
}

/// Renders `turns` with the generation prompt; `tools` are the function tools in OpenAI's shape
/// (`{"type": "function", "function": {"name", "description", "parameters"}}`), as Hugging Face
/// passes them to templates. A conversation of text turns without tools is rendered as
/// `apply_chat_template(messages)`; tools, tool turns, turns with reasoning or extra `variables`
/// (a request's `chat_template_kwargs`, `enable_thinking` ...) give the template the rich
/// context.
pub(crate) fn render(
    engine: &Engine,
    turns: &[Turn],
    tools: Vec<Value>,
    variables: &Map<String, Value>,
) -> Result<String, ApiError> {
    if tools.is_empty() && variables.is_empty() && !turns.iter().any(Turn::needs_rich_context) {
        let messages: Vec<ChatMessage> = turns
            .iter()
            .map(|t| ChatMessage::new(t.role.clone(), t.content.clone()))
            .collect();
        return Ok(engine.apply_chat_template(&messages)?);
    }
    Ok(engine.apply_chat_template_with(&template_context(turns, tools, variables))?)
}

/// Hugging Face's `apply_chat_template(messages, tools=..., add_generation_prompt=True,
/// **variables)` as one context; the variables come last, as keyword arguments do, so a
/// variable named like a fixed one (`add_generation_prompt`) is the request's choice.
pub(crate) fn template_context(
    turns: &[Turn],
    tools: Vec<Value>,
    variables: &Map<String, Value>,
) -> Value {
    let mut context = Map::new();
    context.insert(
        "messages".into(),
        turns.iter().map(Turn::template_value).collect(),
    );
    let tools = if tools.is_empty() {
        Value::Null
    } else {
        Value::Array(tools)
    };
    context.insert("tools".into(), tools);
    context.insert("add_generation_prompt".into(), Value::Bool(true));
    context.extend(variables.iter().map(|(k, v)| (k.clone(), v.clone())));
    Value::Object(context)
}

/// What a request's tools do to its generation: the constraint of a required call, and the format
/// calls are looked for in the reply.
#[derive(Debug)]
pub(crate) struct ToolPlan {
    tools: Vec<Tool>,
    choice: ToolChoice,
    format: ToolFormat,
    parallel: bool,
}

impl ToolPlan {
    /// The plan for `tools` and `choice` on `engine`'s model, whose chat template tells the
    /// format of its calls.
    pub(crate) fn new(
        engine: &Engine,
        tools: Vec<Tool>,
        choice: ToolChoice,
        parallel: bool,
    ) -> Self {
        let format = ToolFormat::of_template(&engine.chat_template_source().unwrap_or_default());
        Self {
            tools,
            choice,
            format,
            parallel,
        }
    }

    /// Constrains `params` to a valid call when the choice requires one; `other` names the
    /// request's own output constraint in the refusal when it has one too.
    pub(crate) fn constrain(
        &self,
        params: &mut Params,
        choice_param: &str,
        other: &str,
    ) -> Result<(), ApiError> {
        if let Some(required) =
            tools::constraint(&self.tools, &self.choice, self.format, self.parallel)
        {
            if params.constraint.is_some() {
                return Err(ApiError::invalid_param(
                    choice_param,
                    format!("a required tool call and {other} both constrain the output: give one"),
                ));
            }
            params.constraint = Some(required);
        }
        Ok(())
    }

    /// The format calls are looked for in: `None` without tools or with the choice `none`.
    pub(crate) fn parsing(&self) -> Option<ToolFormat> {
        (!self.tools.is_empty() && self.choice != ToolChoice::None).then_some(self.format)
    }
}

/// The calls in a finished reply, with the text around them: only a reply that stopped (not cut
/// by the budget) and holds calls in `format` has them.
pub(crate) fn calls_in(
    text: &str,
    reason: FinishReason,
    format: Option<ToolFormat>,
    id_prefix: &str,
) -> Option<(String, Vec<ToolCall>)> {
    let format = format.filter(|_| reason == FinishReason::Stop)?;
    tools::parse_calls(text, format, id_prefix)
}

/// A call's arguments as a JSON value (Anthropic's `input`); arguments that are not JSON stay a
/// string.
pub(crate) fn arguments_value(call: &ToolCall) -> Value {
    serde_json::from_str(&call.function.arguments)
        .unwrap_or_else(|_| Value::String(call.function.arguments.clone()))
}

/// Which of `stops` ended a reply that stopped: the generated tokens decode to the reply's text
/// followed by the stop string the engine cut; `None` when it ended otherwise (end-of-sequence, a
/// complete grammar).
pub(crate) fn matched_stop(
    engine: &Engine,
    tokens: &[u32],
    text: &str,
    stops: &[String],
) -> Option<String> {
    if stops.is_empty() {
        return None;
    }
    let raw = engine.tokenizer().decode(tokens, false).ok()?;
    let rest = raw.strip_prefix(text).unwrap_or(&raw);
    stops
        .iter()
        .filter(|s| !s.is_empty() && rest.contains(s.as_str()))
        .min_by_key(|s| rest.find(s.as_str()))
        .cloned()
}
