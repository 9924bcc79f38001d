//! Anthropic's Messages request and its translation into the one request: `system` and the text
//! blocks become typed turns, assistant `tool_use` blocks their calls, assistant `thinking`
//! blocks their reasoning and user `tool_result` blocks `tool` turns, custom tools function tools,
//! `tool_choice` the server's choices and `thinking` the reasoning options.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::read::GenerationBody;
use crate::reasoning::ReasoningFields;
use crate::request::{
    Call, Chat, Generation, Params, Prompt, ToolRequest, Turn, budget, function_tool,
};
use crate::tools::read_tools;

#[derive(Debug, Deserialize)]
pub(super) struct MessagesRequest {
    pub model: Option<String>,
    /// Required on `/v1/messages`, as Anthropic; not read by `count_tokens`.
    max_tokens: Option<i64>,
    messages: Vec<InputMessage>,
    system: Option<Content>,
    // The sampling fields (`temperature`, `top_p`, `top_k` ...) are read beside llama-server's
    // fields (llama_fields.rs).
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<InputTool>>,
    tool_choice: Option<InputToolChoice>,
    thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
pub(super) struct InputMessage {
    role: String,
    content: Content,
}

/// A message's (or `system`'s, or a `tool_result`'s) content: a string or content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block; which fields it has depends on `type` (read in [`turns`], so that an
/// unsupported type is refused by name).
#[derive(Debug, Deserialize)]
pub(super) struct Block {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    /// `tool_use`: the call's id, the tool's name and its input.
    id: Option<String>,
    name: Option<String>,
    input: Option<Value>,
    /// `tool_result`: the call it answers and what the tool returned.
    tool_use_id: Option<String>,
    content: Option<Content>,
    /// `thinking`: the reasoning of an earlier assistant turn (its `signature` is Anthropic's
    /// check of the text, which a local model has no use for).
    thinking: Option<String>,
}

/// A custom tool; Anthropic's server tools carry another `type`.
#[derive(Debug, Deserialize)]
pub(super) struct InputTool {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: Option<String>,
    description: Option<String>,
    input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(super) struct InputToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    disable_parallel_tool_use: Option<bool>,
}

/// Extended thinking: `{"type": "enabled", "budget_tokens": N}`, `{"type": "adaptive"}` or
/// `{"type": "disabled"}`.
#[derive(Debug, Deserialize)]
pub(super) struct Thinking {
    #[serde(rename = "type")]
    kind: String,
    budget_tokens: Option<i64>,
    /// How Anthropic returns the reasoning: `summarized` (the whole reasoning here: a local
    /// model has no summary of it) or `omitted` (not supported).
    display: Option<String>,
}

impl Thinking {
    /// The reasoning options `thinking` asks for: `enabled` turns the template's thinking on
    /// (`enable_thinking: true`) with `budget_tokens` as the reasoning budget (the tokens the
    /// reply may reason for before the server ends the block), `adaptive` turns it on without a
    /// budget (the model decides how long it thinks), `disabled` turns it off (as a reasoning
    /// budget of 0 does).
    fn reasoning(&self) -> Result<ReasoningFields, ApiError> {
        if let Some(display) = self.display.as_deref().filter(|d| *d != "summarized") {
            return Err(ApiError::unsupported(
                "thinking.display",
                format!(
                    "thinking.display `{display}` is not supported; the reasoning is returned \
                     whole (as `summarized`)"
                ),
            ));
        }
        let on = |budget_tokens: Option<i64>| {
            let mut kwargs = serde_json::Map::new();
            kwargs.insert("enable_thinking".into(), Value::Bool(true));
            ReasoningFields {
                chat_template_kwargs: Some(kwargs),
                thinking_budget_tokens: budget_tokens,
                ..ReasoningFields::default()
            }
        };
        let unbudgeted = |kind: &str| {
            ApiError::invalid_param(
                "thinking.budget_tokens",
                format!("thinking.budget_tokens is for thinking of type `enabled`, not `{kind}`"),
            )
        };
        match self.kind.as_str() {
            "enabled" => {
                if let Some(n) = self.budget_tokens.filter(|&n| n < 1) {
                    return Err(ApiError::invalid_param(
                        "thinking.budget_tokens",
                        format!(
                            "thinking.budget_tokens={n}: expected at least 1 (send \
                             {{\"type\": \"disabled\"}} to turn thinking off)"
                        ),
                    ));
                }
                Ok(on(self.budget_tokens))
            }
            kind @ ("adaptive" | "disabled") if self.budget_tokens.is_some() => {
                Err(unbudgeted(kind))
            }
            "adaptive" => Ok(on(None)),
            "disabled" => Ok(ReasoningFields {
                thinking_budget_tokens: Some(0),
                ..ReasoningFields::default()
            }),
            other => Err(ApiError::invalid_param(
                "thinking.type",
                format!(
                    "thinking.type `{other}` is unknown: expected enabled, adaptive or disabled"
                ),
            )),
        }
    }
}

/// The text of `content`: a string, or text blocks concatenated; `at` names it in refusals.
fn text_of(content: Content, at: &str) -> Result<String, ApiError> {
    match content {
        Content::Text(text) => Ok(text),
        Content::Blocks(blocks) => {
            let mut text = String::new();
            for (j, block) in blocks.into_iter().enumerate() {
                match (block.kind.as_str(), block.text) {
                    ("text", Some(t)) => text.push_str(&t),
                    (kind, _) => return Err(unsupported_block(&format!("{at}[{j}]"), kind)),
                }
            }
            Ok(text)
        }
    }
}

fn unsupported_block(at: &str, kind: &str) -> ApiError {
    ApiError::unsupported(
        at,
        format!("{at}: content blocks of type `{kind}` are not supported here; send text"),
    )
}

/// The conversation as typed turns: `system` first, text blocks as text, assistant `tool_use`
/// blocks as the turn's calls, assistant `thinking` blocks as its reasoning (`redacted_thinking`
/// blocks, whose reasoning is encrypted for Anthropic's models, are left out) and user
/// `tool_result` blocks as `tool` turns. No messages at all is the template's render of
/// `system` alone (or of nothing), as llama-server takes it.
pub(super) fn turns(
    system: Option<Content>,
    messages: Vec<InputMessage>,
) -> Result<Vec<Turn>, ApiError> {
    let mut out: Vec<Turn> = Vec::new();
    if let Some(system) = system {
        out.push(Turn::text("system", text_of(system, "system")?));
    }
    // The tool each call went to, for the `name` of its result's turn.
    let mut called: HashMap<String, String> = HashMap::new();
    for (i, message) in messages.into_iter().enumerate() {
        let at = format!("messages[{i}].content");
        let role = message.role.as_str();
        if role != "user" && role != "assistant" {
            return Err(ApiError::invalid_param(
                format!("messages[{i}].role"),
                format!(
                    "messages[{i}].role: `{role}` is not user or assistant (give `system` apart)"
                ),
            ));
        }
        let blocks = match message.content {
            Content::Text(text) => {
                out.push(Turn::text(role, text));
                continue;
            }
            Content::Blocks(blocks) => blocks,
        };
        let mut text = String::new();
        let mut reasoning: Option<String> = None;
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for (j, block) in blocks.into_iter().enumerate() {
            let at = format!("{at}[{j}]");
            match (block.kind.as_str(), role) {
                ("text", _) => text.push_str(&block.text.unwrap_or_default()),
                ("thinking", "assistant") => {
                    let Some(thinking) = block.thinking else {
                        return Err(ApiError::invalid_param(
                            at.clone(),
                            format!("{at}: a thinking block needs `thinking`"),
                        ));
                    };
                    reasoning
                        .get_or_insert_with(String::new)
                        .push_str(&thinking);
                }
                // Reasoning only Anthropic can read: nothing of it can reach the template.
                ("redacted_thinking", "assistant") => {}
                ("tool_use", "assistant") => {
                    let (Some(id), Some(name)) = (block.id, block.name) else {
                        return Err(ApiError::invalid_param(
                            at.clone(),
                            format!("{at}: a tool_use block needs `id` and `name`"),
                        ));
                    };
                    let input = block.input.unwrap_or_else(|| json!({}));
                    called.insert(id.clone(), name.clone());
                    calls.push(Call::new(Some(id), Some(name), Some(input)));
                }
                ("tool_result", "user") => {
                    let Some(id) = block.tool_use_id else {
                        return Err(ApiError::invalid_param(
                            at.clone(),
                            format!("{at}: a tool_result block needs `tool_use_id`"),
                        ));
                    };
                    let content = match block.content {
                        Some(content) => text_of(content, &format!("{at}.content"))?,
                        None => String::new(),
                    };
                    results.push(Turn {
                        name: called.get(&id).cloned(),
                        tool_call_id: Some(id),
                        ..Turn::text("tool", content)
                    });
                }
                (kind, _) => return Err(unsupported_block(&at, kind)),
            }
        }
        // A user turn's results come first (Anthropic puts them before any text), each a `tool`
        // turn; its text follows as a user turn.
        let had_results = !results.is_empty();
        out.extend(results);
        if role == "assistant" {
            out.push(Turn {
                tool_calls: (!calls.is_empty()).then_some(calls),
                reasoning_content: reasoning,
                ..Turn::text("assistant", text)
            });
        } else if !had_results || !text.is_empty() {
            out.push(Turn::text("user", text));
        }
    }
    Ok(out)
}

/// The custom tools in the chat shape templates take, and the server's tools, choice and
/// parallelism.
fn read_anthropic_tools(
    tools: Option<Vec<InputTool>>,
    choice: Option<InputToolChoice>,
) -> Result<ToolRequest, ApiError> {
    let mut list = Vec::new();
    for (i, tool) in tools.unwrap_or_default().into_iter().enumerate() {
        let bad = |why: String| ApiError::invalid_param("tools", format!("tools[{i}]: {why}"));
        if let Some(kind) = tool.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::unsupported(
                "tools",
                format!(
                    "tools[{i}]: tools of type `{kind}` (Anthropic's server tools) are not \
                     supported; give custom tools: name, description, input_schema"
                ),
            ));
        }
        let name = tool
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("missing `name`".into()))?;
        let schema = tool
            .input_schema
            .ok_or_else(|| bad("missing `input_schema`".into()))?;
        if !schema.is_object() {
            return Err(bad("`input_schema` must be a JSON schema object".into()));
        }
        list.push(function_tool(
            &name,
            tool.description.as_deref(),
            Some(&schema),
        ));
    }
    let mut parallel = true;
    let choice = match choice {
        None => None,
        Some(choice) => {
            parallel = !choice.disable_parallel_tool_use.unwrap_or(false);
            Some(match choice.kind.as_str() {
                "auto" => json!("auto"),
                "any" => json!("required"),
                "none" => json!("none"),
                "tool" => {
                    let name = choice.name.ok_or_else(|| {
                        ApiError::invalid_param(
                            "tool_choice",
                            "tool_choice of type `tool` needs `name`",
                        )
                    })?;
                    json!({"type": "function", "function": {"name": name}})
                }
                other => {
                    return Err(ApiError::invalid_param(
                        "tool_choice",
                        format!(
                            "tool_choice type `{other}` is unknown: expected auto, any, tool or none"
                        ),
                    ));
                }
            })
        }
    };
    let given = (!list.is_empty()).then(|| list.clone());
    let (tools, choice) = read_tools(given, choice, None, None)?;
    Ok(ToolRequest {
        listed: list,
        tools,
        choice,
        parallel,
        ..ToolRequest::default()
    })
}

impl MessagesRequest {
    /// The conversation and its tools (what `/v1/messages` renders and `count_tokens` counts).
    pub(super) fn chat(&mut self) -> Result<Chat, ApiError> {
        let reasoning = match self.thinking.take() {
            Some(thinking) => thinking.reasoning()?,
            None => ReasoningFields::default(),
        };
        let tools = read_anthropic_tools(self.tools.take(), self.tool_choice.take())?;
        let turns = turns(self.system.take(), std::mem::take(&mut self.messages))?;
        Ok(Chat {
            turns,
            tools,
            reasoning: Box::new(reasoning),
            continuation: Default::default(),
        })
    }

    /// The one request, with the body's sampling fields and llama-server's fields applied;
    /// `n_probs` and `return_tokens` have no place in this shape (nor in llama-server's).
    pub(super) fn into_generation(body: GenerationBody<Self>) -> Result<Generation, ApiError> {
        let GenerationBody {
            request: mut this,
            sampling,
            llama,
        } = body;
        let max_tokens = match this.max_tokens {
            None => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    "max_tokens: field required",
                ));
            }
            Some(n) if n < 1 => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    format!("max_tokens={n}: expected at least 1"),
                ));
            }
            Some(n) => n,
        };
        let chat = this.chat()?;
        let mut params = Params {
            max_new_tokens: budget("max_tokens", Some(max_tokens))?,
            stop: this.stop_sequences.take().unwrap_or_default(),
            sampling,
            ..Params::default()
        };
        llama.apply(&mut params)?;
        params.refuse_stream_reports("/v1/messages")?;
        Ok(Generation {
            prompt: Prompt::Chat(chat),
            params,
            stream: this.stream,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(messages: Value) -> Vec<InputMessage> {
        serde_json::from_value(messages).unwrap()
    }

    #[test]
    fn tool_use_and_tool_result_blocks_become_template_turns() {
        let messages = parse(json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "18 C"}]},
                {"type": "text", "text": "Thanks."},
            ]},
        ]));
        let turns = turns(Some(Content::Text("Be brief.".into())), messages).unwrap();
        assert!(
            turns.iter().any(Turn::is_tool_turn),
            "tool turns need the rich context"
        );
        let turns: Vec<Value> = turns.iter().map(Turn::template_value).collect();
        let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(turns[2]["content"], "Checking.");
        let call = &turns[2]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(call["name"], "get_weather");
        assert_eq!(
            turns[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "18 C", "name": "get_weather"})
        );
    }

    #[test]
    fn text_only_conversations_stay_plain_and_other_blocks_are_named() {
        let messages = parse(json!([{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]));
        let plain = turns(None, messages).unwrap();
        assert!(!plain.iter().any(Turn::is_tool_turn), "text only is plain");
        assert_eq!(
            (plain[0].role.as_str(), plain[0].content.as_str()),
            ("user", "ab")
        );
        for (messages, named) in [
            (
                json!([{"role": "user", "content": [{"type": "image"}]}]),
                "messages[0].content[0]",
            ),
            (
                json!([{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f"}]}]),
                "messages[0].content[0]",
            ),
            (
                json!([{"role": "system", "content": "x"}]),
                "messages[0].role",
            ),
        ] {
            let err = turns(None, parse(messages)).unwrap_err();
            assert!(format!("{err:?}").contains(named), "{err:?}");
        }
    }

    #[test]
    fn thinking_blocks_are_the_assistant_turns_reasoning() {
        let messages = parse(json!([
            {"role": "user", "content": "Fix it"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look first. ", "signature": "s"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "thinking", "thinking": "Then fix."},
                {"type": "text", "text": "Done."},
            ]},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "More."},
            ]},
        ]));
        let turns = turns(None, messages).unwrap();
        assert_eq!(
            turns[1].template_value(),
            json!({"role": "assistant", "content": "Done.", "reasoning_content": "Look first. Then fix."})
        );
        assert!(turns[1].needs_rich_context());
        assert_eq!(turns[2], Turn::text("assistant", "More."));
        let missing = parse(json!([{"role": "assistant", "content": [{"type": "thinking"}]}]));
        let err = super::turns(None, missing).unwrap_err();
        assert!(
            format!("{err:?}").contains("messages[0].content[0]"),
            "{err:?}"
        );
    }

    #[test]
    fn no_messages_are_the_system_alone() {
        let system = Some(Content::Text("Be brief.".into()));
        assert_eq!(
            turns(system, Vec::new()).unwrap(),
            [Turn::text("system", "Be brief.")]
        );
        assert!(turns(None, Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn thinking_turns_the_templates_thinking_on_with_its_budget_or_off() {
        let thinking = |value: Value| serde_json::from_value::<Thinking>(value).unwrap();
        let on = thinking(json!({"type": "enabled", "budget_tokens": 50}))
            .reasoning()
            .unwrap();
        assert_eq!(
            on.chat_template_kwargs,
            Some(
                json!({"enable_thinking": true})
                    .as_object()
                    .unwrap()
                    .clone()
            )
        );
        assert_eq!(on.thinking_budget_tokens, Some(50));
        for unbudgeted in [
            json!({"type": "enabled"}),
            json!({"type": "adaptive", "display": "summarized"}),
        ] {
            let fields = thinking(unbudgeted).reasoning().unwrap();
            assert_eq!(fields.thinking_budget_tokens, None);
            assert_eq!(fields.chat_template_kwargs, on.chat_template_kwargs);
        }
        let off = thinking(json!({"type": "disabled"})).reasoning().unwrap();
        assert_eq!(
            (off.chat_template_kwargs, off.thinking_budget_tokens),
            (None, Some(0))
        );
        for (value, named) in [
            (
                json!({"type": "enabled", "budget_tokens": 0}),
                "thinking.budget_tokens",
            ),
            (
                json!({"type": "disabled", "budget_tokens": 10}),
                "thinking.budget_tokens",
            ),
            (
                json!({"type": "adaptive", "budget_tokens": 10}),
                "thinking.budget_tokens",
            ),
            (json!({"type": "sometimes"}), "thinking.type"),
            (
                json!({"type": "enabled", "display": "omitted"}),
                "thinking.display",
            ),
        ] {
            let err = thinking(value).reasoning().unwrap_err();
            assert!(format!("{err:?}").contains(named), "{err:?}");
        }
    }
}
