//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is translated into the terms every chat route shares ([`crate::chat`]): `system` and
//! the text blocks become the template's turns, assistant `tool_use` blocks its tool calls and
//! user `tool_result` blocks its `tool` turns, custom tools its function tools and `tool_choice`
//! the server's choices. The reply comes back as `text` and `tool_use` content blocks with
//! Anthropic's `stop_reason`, whole or as Anthropic's named stream events; errors on these routes
//! have Anthropic's shape (routes.rs).

use std::collections::HashMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use mlxcel_engine::{ChatMessage, Engine, FinishReason, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::body::{Body, event_stream};
use crate::chat::{self, ToolPlan, Turns};
use crate::error::ApiError;
use crate::generate::{
    Params, PromptInput, StreamFormat, TokenRecord, Tracked, budget, collect, submit, tokenize,
};
use crate::openai::rand_id;
use crate::read::{read_generation_json, read_json};
use crate::state::AppState;
use crate::tools::{ToolCall, ToolFormat, read_tools};

/// Characters of a call's JSON input per `input_json_delta`.
const INPUT_PIECE: usize = 16;

#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    /// Required on `/v1/messages`, as Anthropic; not read by `count_tokens`.
    max_tokens: Option<i64>,
    messages: Vec<InputMessage>,
    system: Option<Content>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<InputTool>>,
    tool_choice: Option<InputToolChoice>,
    thinking: Option<Thinking>,
}

#[derive(Debug, Deserialize)]
struct InputMessage {
    role: String,
    content: Content,
}

/// A message's (or `system`'s, or a `tool_result`'s) content: a string or content blocks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block; which fields it has depends on `type` (read in [`turns`], so that an
/// unsupported type is refused by name).
#[derive(Debug, Deserialize)]
struct Block {
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
}

/// A custom tool; Anthropic's server tools carry another `type`.
#[derive(Debug, Deserialize)]
struct InputTool {
    #[serde(rename = "type")]
    kind: Option<String>,
    name: Option<String>,
    description: Option<String>,
    input_schema: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct InputToolChoice {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
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

/// The conversation as the template takes it: plain text turns, or (with tool turns) turns in
/// Hugging Face's shape with `tool_calls` and `tool` messages.
fn turns(system: Option<Content>, messages: Vec<InputMessage>) -> Result<Turns, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages is empty; send at least one",
        ));
    }
    let mut out: Vec<Value> = Vec::new();
    if let Some(system) = system {
        out.push(json!({"role": "system", "content": text_of(system, "system")?}));
    }
    // The tool each call went to, for the `name` of its result's turn.
    let mut called: HashMap<String, String> = HashMap::new();
    let mut rich = false;
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
                out.push(json!({"role": role, "content": text}));
                continue;
            }
            Content::Blocks(blocks) => blocks,
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for (j, block) in blocks.into_iter().enumerate() {
            let at = format!("{at}[{j}]");
            match (block.kind.as_str(), role) {
                ("text", _) => text.push_str(&block.text.unwrap_or_default()),
                ("tool_use", "assistant") => {
                    let (Some(id), Some(name)) = (block.id, block.name) else {
                        return Err(ApiError::invalid_param(
                            at.clone(),
                            format!("{at}: a tool_use block needs `id` and `name`"),
                        ));
                    };
                    let input = block.input.unwrap_or_else(|| json!({}));
                    called.insert(id.clone(), name.clone());
                    calls.push(chat::template_call(json!({
                        "id": id, "type": "function",
                        "function": {"name": name, "arguments": input},
                    })));
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
                    let mut turn = json!({"role": "tool", "tool_call_id": id, "content": content});
                    if let Some(name) = called.get(&id) {
                        turn["name"] = json!(name);
                    }
                    results.push(turn);
                }
                (kind, _) => return Err(unsupported_block(&at, kind)),
            }
        }
        rich |= !calls.is_empty() || !results.is_empty();
        // A user turn's results come first (Anthropic puts them before any text), each a `tool`
        // turn; its text follows as a user turn.
        let had_results = !results.is_empty();
        out.extend(results);
        if role == "assistant" {
            let mut turn = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                turn["tool_calls"] = Value::Array(calls);
            }
            out.push(turn);
        } else if !had_results || !text.is_empty() {
            out.push(json!({"role": "user", "content": text}));
        }
    }
    if rich {
        return Ok(Turns::Rich(out));
    }
    Ok(Turns::Plain(
        out.into_iter()
            .map(|m| {
                let text = |key: &str| m[key].as_str().unwrap_or_default().to_owned();
                ChatMessage::new(text("role"), text("content"))
            })
            .collect(),
    ))
}

/// The tools in the chat shape templates take, and the server's tools, choice and parallelism.
fn read_anthropic_tools(
    tools: Option<Vec<InputTool>>,
    choice: Option<InputToolChoice>,
) -> Result<
    (
        Vec<Value>,
        Vec<crate::tools::Tool>,
        crate::tools::ToolChoice,
        bool,
    ),
    ApiError,
> {
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
        list.push(chat::function_tool(
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
    Ok((list, tools, choice, parallel))
}

/// The templated prompt of a request and what its tools do to the generation.
fn prepare(engine: &Engine, request: &mut MessagesRequest) -> Result<(String, ToolPlan), ApiError> {
    if let Some(thinking) = request.thinking.take().filter(|t| t.kind != "disabled") {
        return Err(ApiError::unsupported(
            "thinking",
            format!("thinking of type `{}` is not supported", thinking.kind),
        ));
    }
    let (list, tools, choice, parallel) =
        read_anthropic_tools(request.tools.take(), request.tool_choice.take())?;
    let turns = turns(request.system.take(), std::mem::take(&mut request.messages))?;
    let prompt = chat::render(engine, turns, list)?;
    Ok((prompt, ToolPlan::new(engine, tools, choice, parallel)))
}

/// `POST /v1/messages`'s body through the checks [`messages`] makes before it renders the
/// template (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    crate::inert::refuse_inert_fields(bytes)?;
    let mut request: MessagesRequest = crate::read::parse_json(bytes)?;
    if request
        .thinking
        .as_ref()
        .is_some_and(|t| t.kind != "disabled")
    {
        return Ok(());
    }
    read_anthropic_tools(request.tools.take(), request.tool_choice.take())?;
    turns(request.system.take(), std::mem::take(&mut request.messages))?;
    Ok(())
}

/// `POST /v1/messages`.
pub async fn messages(state: &Arc<AppState>, body: Incoming) -> Result<Response<Body>, ApiError> {
    let (mut request, llama): (MessagesRequest, _) =
        read_generation_json(body, state.config().body_limit).await?;
    let engine = state.engine()?.clone();
    state.check_model(engine.info(), request.model.as_deref())?;
    let max_tokens = match request.max_tokens {
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
    let (prompt, plan) = prepare(&engine, &mut request)?;
    let stops = request.stop_sequences.take().unwrap_or_default();
    let mut params = Params {
        max_new_tokens: budget("max_tokens", Some(max_tokens))?,
        temperature: request.temperature,
        top_k: request.top_k,
        top_p: request.top_p,
        stop: stops.clone(),
        ..Params::default()
    };
    // `n_probs` and `return_tokens` have no place in this shape (nor in llama-server's).
    llama.apply(&mut params)?;
    plan.constrain(&mut params, "tool_choice", "another output constraint")?;
    let reply = ReplyMeta {
        id: format!("msg_{:x}", rand_id()),
        model: state.model_name(engine.info()),
        tools: plan.parsing(),
        stops,
    };
    let mut tracked = submit(state, PromptInput::Templated(prompt), params).await?;
    if request.stream {
        let (response, sender) = event_stream();
        let format = MessagesStream {
            input_tokens: tracked.prompt_tokens(),
            reply,
            engine,
            tokens: Vec::new(),
            text: String::new(),
        };
        tokio::spawn(crate::generate::stream(tracked, sender, format));
        return Ok(response);
    }
    let outcome = collect(&mut tracked).await?;
    let tokens: Vec<u32> = outcome.tokens.iter().map(|t| t.token).collect();
    let ending = reply.ending(&engine, &outcome.text, outcome.reason, &tokens);
    let mut content = Vec::new();
    if !ending.text.is_empty() || ending.calls.is_empty() {
        content.push(ContentBlock::Text { text: ending.text });
    }
    content.extend(ending.calls.iter().map(|call| ContentBlock::ToolUse {
        id: call.id.clone(),
        name: call.function.name.clone(),
        input: chat::arguments_value(call),
    }));
    let body = reply.message(
        content,
        Some(ending.stop_reason),
        ending.stop_sequence,
        outcome.usage.into(),
    );
    Ok(crate::body::json(StatusCode::OK, &body))
}

#[derive(Debug, Serialize)]
struct TokenCount {
    input_tokens: usize,
}

/// `POST /v1/messages/count_tokens`: the tokens of the templated prompt `/v1/messages` would
/// generate from (its `usage.input_tokens`).
pub async fn count_tokens(
    state: &Arc<AppState>,
    body: Incoming,
) -> Result<Response<Body>, ApiError> {
    let mut request: MessagesRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.engine()?.clone();
    state.check_model(engine.info(), request.model.as_deref())?;
    let (prompt, _) = prepare(&engine, &mut request)?;
    let input_tokens = tokio::task::spawn_blocking(move || {
        tokenize(&engine, PromptInput::Templated(prompt)).map(|t| t.len())
    })
    .await
    .map_err(|err| ApiError::Internal(format!("tokenizing task failed: {err}")))??;
    Ok(crate::body::json(
        StatusCode::OK,
        &TokenCount { input_tokens },
    ))
}

/// A message, whole or (empty, in `message_start`) streamed.
#[derive(Debug, Serialize)]
struct MessageBody {
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: String,
    content: Vec<ContentBlock>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: UsageBody,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Copy, Serialize)]
struct UsageBody {
    /// Prompt tokens computed; with `cache_read_input_tokens`, the whole prompt (Anthropic's
    /// split: the tokens read from a cache are not input tokens).
    input_tokens: usize,
    cache_read_input_tokens: usize,
    output_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens - usage.cached_tokens,
            cache_read_input_tokens: usage.cached_tokens,
            output_tokens: usage.completion_tokens,
        }
    }
}

/// How a reply ended, in Anthropic's terms.
struct Ending {
    /// The text (around the calls, when there are calls).
    text: String,
    calls: Vec<ToolCall>,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

/// What every body of one reply shares.
struct ReplyMeta {
    id: String,
    model: String,
    /// The format calls are looked for in; `None` without tools.
    tools: Option<ToolFormat>,
    stops: Vec<String>,
}

impl ReplyMeta {
    /// The reply's calls and stop reason: `tool_use` when it made calls, `max_tokens` when the
    /// budget ran out, `stop_sequence` (with the one that matched) or `end_turn`.
    fn ending(&self, engine: &Engine, text: &str, reason: FinishReason, tokens: &[u32]) -> Ending {
        if let Some((text, calls)) = chat::calls_in(text, reason, self.tools, &self.id) {
            return Ending {
                text,
                calls,
                stop_reason: "tool_use",
                stop_sequence: None,
            };
        }
        let stop_sequence = (reason == FinishReason::Stop)
            .then(|| chat::matched_stop(engine, tokens, text, &self.stops))
            .flatten();
        let stop_reason = match reason {
            FinishReason::Length => "max_tokens",
            _ if stop_sequence.is_some() => "stop_sequence",
            _ => "end_turn",
        };
        Ending {
            text: text.to_owned(),
            calls: Vec::new(),
            stop_reason,
            stop_sequence,
        }
    }

    fn message(
        &self,
        content: Vec<ContentBlock>,
        stop_reason: Option<&'static str>,
        stop_sequence: Option<String>,
        usage: UsageBody,
    ) -> MessageBody {
        MessageBody {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content,
            stop_reason,
            stop_sequence,
            usage,
        }
    }
}

/// One event of Anthropic's stream; its `type` is also the SSE event's name.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: MessageBody,
    },
    ContentBlockStart {
        index: usize,
        content_block: ContentBlock,
    },
    Ping,
    ContentBlockDelta {
        index: usize,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: usize,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: UsageBody,
    },
    MessageStop,
}

impl StreamEvent {
    fn name(&self) -> &'static str {
        match self {
            Self::MessageStart { .. } => "message_start",
            Self::ContentBlockStart { .. } => "content_block_start",
            Self::Ping => "ping",
            Self::ContentBlockDelta { .. } => "content_block_delta",
            Self::ContentBlockStop { .. } => "content_block_stop",
            Self::MessageDelta { .. } => "message_delta",
            Self::MessageStop => "message_stop",
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta { text: String },
    InputJsonDelta { partial_json: String },
}

#[derive(Debug, Serialize)]
struct MessageDelta {
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

/// Anthropic's stream: `message_start`, then per content block `content_block_start`, its
/// deltas and `content_block_stop`, then `message_delta` (stop reason, usage) and `message_stop`.
/// Without tools the text block opens at once and its deltas follow the tokens; with tools the
/// text is held back until the end, then sent as a text block and a `tool_use` block per call.
struct MessagesStream {
    reply: ReplyMeta,
    engine: Arc<Engine>,
    input_tokens: usize,
    /// Every generated token (to tell which stop sequence ended the reply).
    tokens: Vec<u32>,
    /// The reply's text so far.
    text: String,
}

impl StreamFormat for MessagesStream {
    type Chunk = StreamEvent;
    const DONE_LINE: bool = false;

    fn opening(&mut self) -> Vec<StreamEvent> {
        // What the prefix cache held is known at the end: `message_delta` carries the split.
        let usage = UsageBody {
            input_tokens: self.input_tokens,
            cache_read_input_tokens: 0,
            output_tokens: 0,
        };
        let mut events = vec![StreamEvent::MessageStart {
            message: self.reply.message(Vec::new(), None, None, usage),
        }];
        if self.reply.tools.is_none() {
            events.push(StreamEvent::ContentBlockStart {
                index: 0,
                content_block: ContentBlock::Text {
                    text: String::new(),
                },
            });
        }
        events.push(StreamEvent::Ping);
        events
    }

    fn event_name(chunk: &StreamEvent) -> Option<&'static str> {
        Some(chunk.name())
    }

    fn error_event(&mut self, err: &ApiError) -> (Option<&'static str>, Value) {
        (Some("error"), err.anthropic_body())
    }

    fn token(&mut self, record: TokenRecord) -> Option<StreamEvent> {
        self.tokens.push(record.token);
        self.text.push_str(&record.text);
        (self.reply.tools.is_none() && !record.text.is_empty()).then(|| {
            StreamEvent::ContentBlockDelta {
                index: 0,
                delta: BlockDelta::TextDelta { text: record.text },
            }
        })
    }

    fn finish(
        &mut self,
        _: &Tracked,
        reason: FinishReason,
        tail: String,
        usage: Usage,
    ) -> Vec<StreamEvent> {
        self.text.push_str(&tail);
        let ending = self
            .reply
            .ending(&self.engine, &self.text, reason, &self.tokens);
        let mut events = Vec::new();
        let text_delta = |index, text| StreamEvent::ContentBlockDelta {
            index,
            delta: BlockDelta::TextDelta { text },
        };
        if self.reply.tools.is_none() {
            if !tail.is_empty() {
                events.push(text_delta(0, tail));
            }
            events.push(StreamEvent::ContentBlockStop { index: 0 });
        } else {
            let mut index = 0;
            if !ending.text.is_empty() || ending.calls.is_empty() {
                events.push(StreamEvent::ContentBlockStart {
                    index,
                    content_block: ContentBlock::Text {
                        text: String::new(),
                    },
                });
                if !ending.text.is_empty() {
                    events.push(text_delta(index, ending.text.clone()));
                }
                events.push(StreamEvent::ContentBlockStop { index });
                index += 1;
            }
            for call in &ending.calls {
                events.push(StreamEvent::ContentBlockStart {
                    index,
                    content_block: ContentBlock::ToolUse {
                        id: call.id.clone(),
                        name: call.function.name.clone(),
                        input: json!({}),
                    },
                });
                let input = chat::arguments_value(call).to_string();
                let chars: Vec<char> = input.chars().collect();
                for piece in chars.chunks(INPUT_PIECE) {
                    events.push(StreamEvent::ContentBlockDelta {
                        index,
                        delta: BlockDelta::InputJsonDelta {
                            partial_json: piece.iter().collect(),
                        },
                    });
                }
                events.push(StreamEvent::ContentBlockStop { index });
                index += 1;
            }
        }
        events.push(StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason: ending.stop_reason,
                stop_sequence: ending.stop_sequence,
            },
            usage: usage.into(),
        });
        events.push(StreamEvent::MessageStop);
        events
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
        let Turns::Rich(turns) = turns(Some(Content::Text("Be brief.".into())), messages).unwrap()
        else {
            panic!("tool turns need the rich context");
        };
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
        let Turns::Plain(plain) = turns(None, messages).unwrap() else {
            panic!("text only is plain");
        };
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
}
