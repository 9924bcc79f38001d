//! OpenAI's Responses API: `POST /v1/responses` (and `/responses`), and
//! `POST /v1/responses/input_tokens`.
//!
//! A request is translated into the terms every chat route shares ([`crate::chat`]):
//! `instructions` and the message items become the template's turns, `function_call` items its
//! tool calls and `function_call_output` items its `tool` turns, function tools its tools, and
//! `text.format` a structured-output constraint. The reply comes back as a response object whose
//! `output` holds a message item and `function_call` items, whole or as the Responses API's
//! numbered stream events. Nothing is stored: what needs a stored response
//! (`previous_response_id`, `store: true`, `background`, `conversation`) is refused.

use std::collections::HashMap;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use mlxcel_engine::{ChatMessage, Constraint, Engine, FinishReason, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::body::{Body, event_stream};
use crate::chat::{self, ToolPlan, Turns};
use crate::error::ApiError;
use crate::generate::{
    Params, PromptInput, StreamFormat, TokenRecord, Tracked, budget, collect, submit, tokenize,
    unix_now,
};
use crate::openai::rand_id;
use crate::read::{read_generation_json, read_json};
use crate::state::AppState;
use crate::tools::{ToolCall, ToolFormat, read_tools};

/// Characters of a call's arguments per `response.function_call_arguments.delta`.
const ARGUMENTS_PIECE: usize = 16;

#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    model: Option<String>,
    input: Input,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[serde(default)]
    stream: bool,
    text: Option<TextConfig>,
    tools: Option<Vec<FunctionTool>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    // Refused: they need responses stored on the server.
    previous_response_id: Option<String>,
    store: Option<bool>,
    background: Option<bool>,
    conversation: Option<Value>,
    prompt: Option<Value>,
    include: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item; which fields it has depends on `type` (a message when absent).
#[derive(Debug, Deserialize)]
struct InputItem {
    #[serde(rename = "type")]
    kind: Option<String>,
    role: Option<String>,
    content: Option<ItemContent>,
    /// `function_call` and `function_call_output`: the call.
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
    output: Option<ItemContent>,
}

/// A message's content (or a call's output): a string or content parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ItemContent {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
struct FunctionTool {
    #[serde(rename = "type")]
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
struct TextConfig {
    format: Option<TextFormat>,
}

/// `text.format`: `text`, `json_object`, or `json_schema` with the schema inline.
#[derive(Debug, Clone, Deserialize, Serialize)]
struct TextFormat {
    #[serde(rename = "type")]
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<Value>,
    /// The output always follows the schema here, strict or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

impl TextFormat {
    /// The structured-output constraint it asks for (structured.rs's, for `response_format`).
    fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        match self.kind.as_str() {
            "text" => Ok(None),
            "json_object" => Ok(Some(Constraint::JsonObject)),
            "json_schema" => match &self.schema {
                Some(schema) => Ok(Some(Constraint::JsonSchema(schema.clone()))),
                None => Err(ApiError::invalid_param(
                    "text.format.schema",
                    "text.format of type `json_schema` needs `schema`",
                )),
            },
            other => Err(ApiError::invalid_param(
                "text.format.type",
                format!(
                    "text.format type `{other}` is unknown: expected text, json_object or \
                     json_schema"
                ),
            )),
        }
    }
}

/// Refuses what needs stored responses or is not served.
fn refuse_unserved(request: &ResponsesRequest) -> Result<(), ApiError> {
    let stored = |field: &str| {
        Err(ApiError::unsupported(
            field,
            format!(
                "{field} is not supported: this server stores no responses; send the whole \
                 conversation in `input`"
            ),
        ))
    };
    if request.previous_response_id.is_some() {
        return stored("previous_response_id");
    }
    if request.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return stored("conversation");
    }
    if request.store == Some(true) {
        return stored("store");
    }
    if request.background == Some(true) {
        return stored("background");
    }
    if request.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::unsupported(
            "prompt",
            "prompt (a stored prompt template) is not supported; send `instructions` and `input`",
        ));
    }
    if let Some(first) = request.include.as_ref().and_then(|i| i.first()) {
        return Err(ApiError::unsupported(
            "include",
            format!("include `{first}` is not supported: the output has no extra data to include"),
        ));
    }
    Ok(())
}

/// The text of `content`: a string, or its text parts concatenated; `at` names it in refusals.
fn text_of(content: ItemContent, at: &str) -> Result<String, ApiError> {
    match content {
        ItemContent::Text(text) => Ok(text),
        ItemContent::Parts(parts) => {
            let mut text = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("input_text" | "output_text" | "text", Some(t)) => text.push_str(&t),
                    (kind, _) => {
                        let at = format!("{at}[{j}]");
                        return Err(ApiError::unsupported(
                            &at,
                            format!(
                                "{at}: content parts of type `{kind}` are not supported; send text"
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
    }
}

/// The conversation as the template takes it: plain text turns, or (with function calls)
/// turns in Hugging Face's shape with `tool_calls` and `tool` messages.
fn turns(instructions: Option<String>, input: Input) -> Result<Turns, ApiError> {
    let mut out: Vec<Value> = Vec::new();
    if let Some(instructions) = instructions {
        out.push(json!({"role": "system", "content": instructions}));
    }
    let items = match input {
        Input::Text(text) => vec![InputItem {
            kind: None,
            role: Some("user".into()),
            content: Some(ItemContent::Text(text)),
            call_id: None,
            name: None,
            arguments: None,
            output: None,
        }],
        Input::Items(items) if items.is_empty() => {
            return Err(ApiError::invalid_param(
                "input",
                "input is empty; send at least one item",
            ));
        }
        Input::Items(items) => items,
    };
    // The function each call went to, for the `name` of its output's turn.
    let mut called: HashMap<String, String> = HashMap::new();
    let mut rich = false;
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("input[{i}]");
        let missing = |field: &str| {
            ApiError::invalid_param(
                format!("{at}.{field}"),
                format!(
                    "{at}: a {} item needs `{field}`",
                    item.kind.as_deref().unwrap_or("message")
                ),
            )
        };
        match item.kind.as_deref() {
            None | Some("message") => {
                let role = match item.role.as_deref() {
                    Some(role @ ("user" | "assistant" | "system")) => role,
                    // Chat templates know `system`; the developer's instructions are that.
                    Some("developer") => "system",
                    Some(other) => {
                        return Err(ApiError::invalid_param(
                            format!("{at}.role"),
                            format!(
                                "{at}.role: `{other}` is not user, assistant, system or developer"
                            ),
                        ));
                    }
                    None => return Err(missing("role")),
                };
                let content = match item.content {
                    Some(content) => text_of(content, &format!("{at}.content"))?,
                    None => return Err(missing("content")),
                };
                out.push(json!({"role": role, "content": content}));
            }
            Some("function_call") => {
                let (Some(call_id), Some(name)) = (item.call_id.clone(), item.name.clone()) else {
                    return Err(missing(if item.call_id.is_none() {
                        "call_id"
                    } else {
                        "name"
                    }));
                };
                let arguments = item.arguments.unwrap_or_else(|| "{}".into());
                called.insert(call_id.clone(), name.clone());
                let call = chat::template_call(json!({
                    "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }));
                rich = true;
                // Calls after an assistant message (or after other calls) belong to its turn.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last["tool_calls"].as_array_mut() {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                    }
                }
            }
            Some("function_call_output") => {
                let Some(call_id) = item.call_id.clone() else {
                    return Err(missing("call_id"));
                };
                let output = match item.output {
                    Some(output) => text_of(output, &format!("{at}.output"))?,
                    None => return Err(missing("output")),
                };
                let mut turn = json!({"role": "tool", "tool_call_id": call_id, "content": output});
                if let Some(name) = called.get(&call_id) {
                    turn["name"] = json!(name);
                }
                rich = true;
                out.push(turn);
            }
            Some(other) => {
                return Err(ApiError::unsupported(
                    &at,
                    format!(
                        "{at}: items of type `{other}` are not supported; send messages, \
                         function_call and function_call_output items"
                    ),
                ));
            }
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

/// The request's function tools in the chat shape templates take, and the server's tools and
/// choice.
fn read_function_tools(
    tools: &[FunctionTool],
    choice: Option<Value>,
) -> Result<
    (
        Vec<Value>,
        Vec<crate::tools::Tool>,
        crate::tools::ToolChoice,
    ),
    ApiError,
> {
    let mut list = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::unsupported(
                "tools",
                format!(
                    "tools[{i}]: built-in tools (`{}`) are not supported; give function tools",
                    tool.kind
                ),
            ));
        }
        let name = tool
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid_param("tools", format!("tools[{i}]: missing `name`"))
            })?;
        list.push(chat::function_tool(
            name,
            tool.description.as_deref(),
            tool.parameters.as_ref().filter(|p| !p.is_null()),
        ));
    }
    let choice = match choice {
        // The Responses shape names the function on the choice itself.
        Some(Value::Object(m)) => match m.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = m.get("name").cloned().unwrap_or(Value::Null);
                Some(json!({"type": "function", "function": {"name": name}}))
            }
            other => {
                return Err(ApiError::unsupported(
                    "tool_choice",
                    format!(
                        "tool_choice of type `{}` is not supported: give none, auto, required \
                         or {{\"type\": \"function\", \"name\": …}}",
                        other.unwrap_or("")
                    ),
                ));
            }
        },
        other => other,
    };
    let given = (!list.is_empty()).then(|| list.clone());
    let (tools, choice) = read_tools(given, choice, None, None)?;
    Ok((list, tools, choice))
}

/// The templated prompt of a request and what its tools do to the generation.
fn prepare(
    engine: &Engine,
    request: &mut ResponsesRequest,
) -> Result<(String, ToolPlan), ApiError> {
    refuse_unserved(request)?;
    let raw_tools = request.tools.clone().unwrap_or_default();
    let (list, tools, choice) = read_function_tools(&raw_tools, request.tool_choice.clone())?;
    let input = std::mem::replace(&mut request.input, Input::Items(Vec::new()));
    let prompt = chat::render(engine, turns(request.instructions.clone(), input)?, list)?;
    let parallel = request.parallel_tool_calls.unwrap_or(true);
    Ok((prompt, ToolPlan::new(engine, tools, choice, parallel)))
}

/// `POST /v1/responses`'s body through the checks [`create`] makes before it renders the
/// template (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    crate::inert::refuse_inert_fields(bytes)?;
    let mut request: ResponsesRequest = crate::read::parse_json(bytes)?;
    refuse_unserved(&request)?;
    let raw_tools = request.tools.clone().unwrap_or_default();
    read_function_tools(&raw_tools, request.tool_choice.clone())?;
    let input = std::mem::replace(&mut request.input, Input::Items(Vec::new()));
    turns(request.instructions.clone(), input)?;
    budget("max_output_tokens", request.max_output_tokens)?;
    if let Some(format) = request.text.as_ref().and_then(|t| t.format.as_ref()) {
        format.constraint()?;
    }
    Ok(())
}

/// `POST /v1/responses`.
pub async fn create(state: &Arc<AppState>, body: Incoming) -> Result<Response<Body>, ApiError> {
    let (mut request, llama): (ResponsesRequest, _) =
        read_generation_json(body, state.config().body_limit).await?;
    let engine = state.engine()?.clone();
    state.check_model(engine.info(), request.model.as_deref())?;
    if request.max_output_tokens.is_some_and(|n| n < 1) {
        return Err(ApiError::invalid_param(
            "max_output_tokens",
            "max_output_tokens: expected at least 1",
        ));
    }
    let (prompt, plan) = prepare(&engine, &mut request)?;
    let text = request.text.clone().unwrap_or_default();
    let mut params = Params {
        max_new_tokens: budget("max_output_tokens", request.max_output_tokens)?,
        temperature: request.temperature,
        top_p: request.top_p,
        constraint: match &text.format {
            Some(format) => format.constraint()?,
            None => None,
        },
        ..Params::default()
    };
    // `n_probs` and `return_tokens` have no place in this shape (nor in llama-server's).
    llama.apply(&mut params)?;
    plan.constrain(&mut params, "tool_choice", "text.format")?;
    let id = format!("resp_{:x}", rand_id());
    let reply = ReplyMeta {
        message_id: format!("msg_{}", &id["resp_".len()..]),
        skeleton: ResponseObject {
            id,
            object: "response",
            created_at: unix_now(),
            status: "in_progress",
            error: None,
            incomplete_details: None,
            instructions: request.instructions.take(),
            max_output_tokens: request.max_output_tokens,
            model: state.model_name(engine.info()),
            output: Vec::new(),
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            previous_response_id: None,
            temperature: request.temperature,
            top_p: request.top_p,
            tool_choice: request.tool_choice.take().unwrap_or_else(|| json!("auto")),
            tools: request.tools.take().unwrap_or_default(),
            text: TextConfig {
                format: Some(text.format.unwrap_or(TextFormat {
                    kind: "text".into(),
                    name: None,
                    schema: None,
                    strict: None,
                })),
            },
            store: false,
            background: false,
            truncation: "disabled",
            metadata: serde_json::Map::new(),
            usage: None,
        },
        tools: plan.parsing(),
    };
    let mut tracked = submit(state, PromptInput::Templated(prompt), params).await?;
    if request.stream {
        let (response, sender) = event_stream();
        let format = ResponsesStream {
            reply,
            sequence: 0,
            text: String::new(),
        };
        tokio::spawn(crate::generate::stream(tracked, sender, format));
        return Ok(response);
    }
    let outcome = collect(&mut tracked).await?;
    let body = reply.finished(&outcome.text, outcome.reason, outcome.usage);
    Ok(crate::body::json(StatusCode::OK, &body))
}

#[derive(Debug, Serialize)]
struct InputTokens {
    object: &'static str,
    input_tokens: usize,
}

/// `POST /v1/responses/input_tokens`: the tokens of the templated prompt `/v1/responses` would
/// generate from (its `usage.input_tokens`).
pub async fn input_tokens(
    state: &Arc<AppState>,
    body: Incoming,
) -> Result<Response<Body>, ApiError> {
    let mut request: ResponsesRequest = read_json(body, state.config().body_limit).await?;
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
        &InputTokens {
            object: "response.input_tokens",
            input_tokens,
        },
    ))
}

/// The response object, whole or (in progress, without output) in the stream's first events.
#[derive(Debug, Clone, Serialize)]
struct ResponseObject {
    id: String,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    error: Option<()>,
    incomplete_details: Option<IncompleteDetails>,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    model: String,
    output: Vec<OutputItem>,
    parallel_tool_calls: bool,
    previous_response_id: Option<()>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// The request's, as given (`auto` when absent).
    tool_choice: Value,
    tools: Vec<FunctionTool>,
    text: TextConfig,
    store: bool,
    background: bool,
    truncation: &'static str,
    metadata: serde_json::Map<String, Value>,
    usage: Option<UsageBody>,
}

#[derive(Debug, Clone, Serialize)]
struct IncompleteDetails {
    reason: &'static str,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutputItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

/// An `output_text` content part.
#[derive(Debug, Clone, Serialize)]
struct OutputText {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
    annotations: Vec<Value>,
    logprobs: Vec<Value>,
}

impl OutputText {
    fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
struct UsageBody {
    input_tokens: usize,
    input_tokens_details: InputTokensDetails,
    output_tokens: usize,
    output_tokens_details: OutputTokensDetails,
    total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct InputTokensDetails {
    cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct OutputTokensDetails {
    reasoning_tokens: usize,
}

impl From<Usage> for UsageBody {
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.cached_tokens,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: 0,
            },
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
        }
    }
}

/// What every body of one response shares, and the builder of its output.
struct ReplyMeta {
    skeleton: ResponseObject,
    message_id: String,
    /// The format calls are looked for in; `None` without tools.
    tools: Option<ToolFormat>,
}

impl ReplyMeta {
    fn message(&self, text: String, status: &'static str) -> OutputItem {
        OutputItem::Message {
            id: self.message_id.clone(),
            status,
            role: "assistant",
            content: vec![OutputText::new(text)],
        }
    }

    fn function_call(&self, index: usize, call: &ToolCall) -> OutputItem {
        OutputItem::FunctionCall {
            id: format!("fc_{}_{index}", &self.skeleton.id["resp_".len()..]),
            call_id: call.id.clone(),
            name: call.function.name.clone(),
            arguments: call.function.arguments.clone(),
            status: "completed",
        }
    }

    /// The finished response: `completed` (its output a message, or the calls with the text
    /// around them in a message first), or `incomplete` when the budget ran out.
    fn finished(&self, text: &str, reason: FinishReason, usage: Usage) -> ResponseObject {
        let mut response = self.skeleton.clone();
        response.usage = Some(usage.into());
        if let Some((text, calls)) = chat::calls_in(text, reason, self.tools, &self.skeleton.id) {
            if !text.is_empty() {
                response.output.push(self.message(text, "completed"));
            }
            for (i, call) in calls.iter().enumerate() {
                response.output.push(self.function_call(i, call));
            }
            response.status = "completed";
            return response;
        }
        let incomplete = reason == FinishReason::Length;
        response.status = if incomplete {
            "incomplete"
        } else {
            "completed"
        };
        response.incomplete_details = incomplete.then_some(IncompleteDetails {
            reason: "max_output_tokens",
        });
        response
            .output
            .push(self.message(text.to_owned(), response.status));
        response
    }
}

/// One event of the stream, numbered.
#[derive(Debug, Serialize)]
struct StreamEvent {
    #[serde(flatten)]
    event: Event,
    sequence_number: u64,
}

/// The events of the Responses API's stream; `type` is also the SSE event's name.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
enum Event {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: OutputText,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: OutputItem,
    },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseObject },
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Self::Created { .. } => "response.created",
            Self::InProgress { .. } => "response.in_progress",
            Self::OutputItemAdded { .. } => "response.output_item.added",
            Self::ContentPartAdded { .. } => "response.content_part.added",
            Self::OutputTextDelta { .. } => "response.output_text.delta",
            Self::OutputTextDone { .. } => "response.output_text.done",
            Self::ContentPartDone { .. } => "response.content_part.done",
            Self::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Self::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Self::OutputItemDone { .. } => "response.output_item.done",
            Self::Completed { .. } => "response.completed",
            Self::Incomplete { .. } => "response.incomplete",
        }
    }
}

/// The Responses API's stream: `response.created`, `response.in_progress`, then per output item
/// `response.output_item.added`, its parts and deltas and `response.output_item.done`, then
/// `response.completed` (or `response.incomplete`) with the whole response. Without tools the
/// message item opens at once and its text deltas follow the tokens; with tools the text is held
/// back until the end, then sent as the items of the finished response.
struct ResponsesStream {
    reply: ReplyMeta,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// The reply's text so far.
    text: String,
}

impl ResponsesStream {
    fn numbered(&mut self, event: Event) -> StreamEvent {
        let sequence_number = self.sequence;
        self.sequence += 1;
        StreamEvent {
            event,
            sequence_number,
        }
    }

    fn text_part_events(&self, index: usize, opening: bool, text: &str) -> Vec<Event> {
        let item_id = self.reply.message_id.clone();
        if opening {
            return vec![
                Event::OutputItemAdded {
                    output_index: index,
                    item: OutputItem::Message {
                        id: item_id.clone(),
                        status: "in_progress",
                        role: "assistant",
                        content: Vec::new(),
                    },
                },
                Event::ContentPartAdded {
                    item_id,
                    output_index: index,
                    content_index: 0,
                    part: OutputText::new(String::new()),
                },
            ];
        }
        vec![
            Event::OutputTextDone {
                item_id: item_id.clone(),
                output_index: index,
                content_index: 0,
                text: text.to_owned(),
                logprobs: Vec::new(),
            },
            Event::ContentPartDone {
                item_id,
                output_index: index,
                content_index: 0,
                part: OutputText::new(text.to_owned()),
            },
        ]
    }

    fn delta(&self, index: usize, delta: String) -> Event {
        Event::OutputTextDelta {
            item_id: self.reply.message_id.clone(),
            output_index: index,
            content_index: 0,
            delta,
            logprobs: Vec::new(),
        }
    }
}

impl StreamFormat for ResponsesStream {
    type Chunk = StreamEvent;
    const DONE_LINE: bool = false;

    fn opening(&mut self) -> Vec<StreamEvent> {
        let mut events = vec![
            Event::Created {
                response: self.reply.skeleton.clone(),
            },
            Event::InProgress {
                response: self.reply.skeleton.clone(),
            },
        ];
        if self.reply.tools.is_none() {
            events.extend(self.text_part_events(0, true, ""));
        }
        events.into_iter().map(|e| self.numbered(e)).collect()
    }

    fn event_name(chunk: &StreamEvent) -> Option<&'static str> {
        Some(chunk.event.name())
    }

    fn error_event(&mut self, err: &ApiError) -> (Option<&'static str>, Value) {
        let body = err.body();
        let error = &body["error"];
        let sequence_number = self.sequence;
        self.sequence += 1;
        let data = json!({
            "type": "error", "code": error["code"], "message": error["message"],
            "param": error["param"], "sequence_number": sequence_number,
        });
        (Some("error"), data)
    }

    fn token(&mut self, record: TokenRecord) -> Option<StreamEvent> {
        self.text.push_str(&record.text);
        if self.reply.tools.is_some() || record.text.is_empty() {
            return None;
        }
        let event = self.delta(0, record.text);
        Some(self.numbered(event))
    }

    fn finish(
        &mut self,
        _: &Tracked,
        reason: FinishReason,
        tail: String,
        usage: Usage,
    ) -> Vec<StreamEvent> {
        self.text.push_str(&tail);
        let response = self.reply.finished(&self.text, reason, usage);
        let mut events = Vec::new();
        let streamed = self.reply.tools.is_none();
        if streamed && !tail.is_empty() {
            events.push(self.delta(0, tail));
        }
        for (index, item) in response.output.iter().enumerate() {
            match item {
                OutputItem::Message { content, .. } => {
                    let text = content.first().map_or("", |part| part.text.as_str());
                    if !streamed {
                        events.extend(self.text_part_events(index, true, text));
                        if !text.is_empty() {
                            events.push(self.delta(index, text.to_owned()));
                        }
                    }
                    events.extend(self.text_part_events(index, false, text));
                }
                OutputItem::FunctionCall {
                    id,
                    name,
                    arguments,
                    ..
                } => {
                    let mut added = item.clone();
                    if let OutputItem::FunctionCall {
                        arguments, status, ..
                    } = &mut added
                    {
                        arguments.clear();
                        *status = "in_progress";
                    }
                    events.push(Event::OutputItemAdded {
                        output_index: index,
                        item: added,
                    });
                    let chars: Vec<char> = arguments.chars().collect();
                    for piece in chars.chunks(ARGUMENTS_PIECE) {
                        events.push(Event::FunctionCallArgumentsDelta {
                            item_id: id.clone(),
                            output_index: index,
                            delta: piece.iter().collect(),
                        });
                    }
                    events.push(Event::FunctionCallArgumentsDone {
                        item_id: id.clone(),
                        output_index: index,
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                }
            }
            events.push(Event::OutputItemDone {
                output_index: index,
                item: item.clone(),
            });
        }
        events.push(if response.status == "incomplete" {
            Event::Incomplete { response }
        } else {
            Event::Completed { response }
        });
        events.into_iter().map(|e| self.numbered(e)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_items_join_the_assistant_turn_and_answer_as_tool_turns() {
        let input: Input = serde_json::from_value(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ]))
        .unwrap();
        let Turns::Rich(turns) = turns(None, input).unwrap() else {
            panic!("function items need the rich context");
        };
        let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        let calls = turns[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["arguments"], json!({"city": "Paris"}));
        assert_eq!(turns[3]["name"], "get_weather");
    }

    #[test]
    fn a_string_input_is_one_user_turn_after_the_instructions() {
        let Turns::Plain(turns) =
            turns(Some("Be brief.".into()), Input::Text("Hi".into())).unwrap()
        else {
            panic!("text only is plain");
        };
        let pairs: Vec<(&str, &str)> = turns
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(pairs, [("system", "Be brief."), ("user", "Hi")]);
    }
}
