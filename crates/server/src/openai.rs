//! OpenAI's routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

use crate::chat::{self, ToolPlan, Turns};
use crate::structured::{ConstraintFields, ResponseFormat};
use crate::tools::{ToolFormat, read_tools};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use mlxcel_engine::{ChatMessage, Engine, FinishReason, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::{Body, event_stream};
use crate::error::ApiError;
use crate::generate::{
    Params, PromptInput, StreamFormat, TokenRecord, Tracked, budget, collect, submit, unix_now,
};
use crate::openai_response::{CompletionBody, Envelope, Kind};
use crate::read::read_generation_json;
use crate::state::AppState;

/// Most alternatives per token a request may ask for.
const MAX_TOP_LOGPROBS: u32 = 20;

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// A prompt: text, token ids, or a batch of either (only batches of one are served).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

impl PromptField {
    pub fn into_input(self) -> Result<PromptInput, ApiError> {
        let one = |len: usize| {
            if len == 1 {
                Ok(())
            } else {
                Err(ApiError::unsupported(
                    "prompt",
                    format!("a batch of {len} prompts was sent; send one prompt per request"),
                ))
            }
        };
        Ok(match self {
            Self::Text(text) => PromptInput::Text(text),
            Self::Tokens(tokens) => PromptInput::Tokens(tokens),
            Self::Texts(mut texts) => {
                one(texts.len())?;
                PromptInput::Text(texts.remove(0))
            }
            Self::TokenLists(mut lists) => {
                one(lists.len())?;
                PromptInput::Tokens(lists.remove(0))
            }
        })
    }
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both OpenAI generation routes share.
#[derive(Debug)]
struct Common {
    model: Option<String>,
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    n: Option<u32>,
    stop: Option<StopField>,
    seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    constraint: ConstraintFields,
}

/// Declares a request struct with the [`Common`] fields inline (not `#[serde(flatten)]`, which
/// would lose the field name from type errors) and a method that gathers them.
macro_rules! openai_request {
    ($name:ident { $($(#[$attr:meta])* $field:ident: $ty:ty,)* }) => {
        #[derive(Debug, Deserialize)]
        struct $name {
            $($(#[$attr])* $field: $ty,)*
            model: Option<String>,
            #[serde(default)]
            stream: bool,
            stream_options: Option<StreamOptions>,
            max_tokens: Option<i64>,
            temperature: Option<f32>,
            top_p: Option<f32>,
            n: Option<u32>,
            stop: Option<StopField>,
            seed: Option<i64>,
            presence_penalty: Option<f32>,
            frequency_penalty: Option<f32>,
            // `logit_bias` is read with llama-server's fields (llama_fields.rs), in its forms.
            // llama-server's extensions, accepted on the OpenAI routes as it does.
            top_k: Option<usize>,
            min_p: Option<f32>,
            repeat_penalty: Option<f32>,
            // Structured output (structured.rs).
            response_format: Option<ResponseFormat>,
            json_schema: Option<Value>,
            grammar: Option<String>,
            guided_json: Option<Value>,
            guided_regex: Option<String>,
            guided_grammar: Option<String>,
        }

        impl $name {
            fn common(&mut self) -> Common {
                Common {
                    constraint: ConstraintFields {
                        response_format: self.response_format.take(),
                        json_schema: self.json_schema.take(),
                        grammar: self.grammar.take(),
                        guided_json: self.guided_json.take(),
                        guided_regex: self.guided_regex.take(),
                        guided_grammar: self.guided_grammar.take(),
                    },
                    model: self.model.take(),
                    stream: self.stream,
                    stream_options: self.stream_options.take(),
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    n: self.n,
                    stop: self.stop.take(),
                    seed: self.seed,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    repeat_penalty: self.repeat_penalty,
                }
            }
        }
    };
}

impl Common {
    fn params(self, max_tokens: Option<i64>, logprobs: Option<usize>) -> Result<Params, ApiError> {
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::unsupported(
                "n",
                format!("n={n} is not supported: this server returns one choice per request (n=1)"),
            ));
        }
        let param = if max_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let max_tokens = max_tokens.or(self.max_tokens);
        if max_tokens == Some(0) {
            return Err(ApiError::invalid_param(
                param,
                format!("{param}=0: expected at least 1"),
            ));
        }
        Ok(Params {
            max_new_tokens: budget(param, max_tokens)?,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self.stop.map(StopField::into_vec).unwrap_or_default(),
            logprobs,
            constraint: self.constraint.constraint()?,
            ..Params::default()
        })
    }
}

openai_request!(CompletionRequest {
    prompt: PromptField,
    logprobs: Option<u32>,
    echo: Option<bool>,
    best_of: Option<u32>,
    suffix: Option<String>,
});

openai_request!(ChatRequest {
    messages: Vec<MessageField>,
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    functions: Option<Vec<Value>>,
    function_call: Option<Value>,
});

#[derive(Debug, Deserialize)]
pub(crate) struct MessageField {
    role: String,
    content: Option<ContentField>,
    /// An assistant turn's calls (`id`, `type`, `function: {name, arguments}`).
    tool_calls: Option<Vec<Value>>,
    /// A `tool` turn's answer to this call.
    tool_call_id: Option<String>,
    /// The function's name on a `tool`/`function` turn.
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

/// Whether any message carries tool calls or answers a call (then the rich template context).
fn has_tool_turns(messages: &[MessageField]) -> bool {
    messages
        .iter()
        .any(|m| m.tool_calls.is_some() || m.tool_call_id.is_some() || m.role == "tool")
}

/// A message's tool fields: `tool_calls`, `tool_call_id`, `name`.
type ToolFields = (Option<Vec<Value>>, Option<String>, Option<String>);

/// The messages as Hugging Face passes them to a chat template, with tool calls (their
/// `arguments` parsed into objects, as templates expect) and tool results.
fn rich_messages(messages: Vec<MessageField>) -> Result<Vec<Value>, ApiError> {
    let extras: Vec<ToolFields> = messages
        .iter()
        .map(|m| (m.tool_calls.clone(), m.tool_call_id.clone(), m.name.clone()))
        .collect();
    let plain = chat_messages(messages)?;
    Ok(plain
        .into_iter()
        .zip(extras)
        .map(|(m, (tool_calls, tool_call_id, name))| {
            let mut v = serde_json::json!({"role": m.role, "content": m.content});
            if let Some(calls) = tool_calls {
                v["tool_calls"] = calls.into_iter().map(chat::template_call).collect();
            }
            if let Some(id) = tool_call_id {
                v["tool_call_id"] = Value::String(id);
            }
            if let Some(name) = name {
                v["name"] = Value::String(name);
            }
            v
        })
        .collect())
}

/// Chat messages as the template takes them; only text content is served.
pub(crate) fn chat_messages(messages: Vec<MessageField>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid_param(
            "messages",
            "messages is empty; send at least one",
        ));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => String::new(),
                Some(ContentField::Text(text)) => text,
                Some(ContentField::Parts(parts)) => {
                    let mut text = String::new();
                    for part in parts {
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::unsupported(
                                    &format!("messages[{i}].content"),
                                    format!("content parts of type `{kind}` are not supported; send text"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            Ok(ChatMessage::new(m.role, content))
        })
        .collect()
}

/// `POST /v1/completions`'s body through the checks [`completions`] makes before it needs the
/// model (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_completions_body(bytes: &[u8]) -> Result<(), ApiError> {
    crate::inert::refuse_inert_fields(bytes)?;
    let mut request: CompletionRequest = crate::read::parse_json(bytes)?;
    let common = request.common();
    if request.echo == Some(true) || request.best_of.is_some_and(|b| b != 1) {
        return Ok(());
    }
    let logprobs = match request.logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => return Ok(()),
        other => other.map(|n| n as usize),
    };
    request.prompt.into_input()?;
    common.params(None, logprobs)?;
    Ok(())
}

/// `POST /v1/chat/completions`'s body through the checks [`chat_completions`] makes before it
/// renders the template (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_chat_body(bytes: &[u8]) -> Result<(), ApiError> {
    crate::inert::refuse_inert_fields(bytes)?;
    let mut request: ChatRequest = crate::read::parse_json(bytes)?;
    let common = request.common();
    let (tools, _choice) = read_tools(
        request.tools.take().filter(|t| !t.is_empty()),
        request.tool_choice.take(),
        request.functions.take(),
        request.function_call.take(),
    )?;
    if tools.is_empty() && !has_tool_turns(&request.messages) {
        chat_messages(request.messages)?;
    } else {
        rich_messages(request.messages)?;
    }
    common.params(request.max_completion_tokens, None)?;
    Ok(())
}

/// `POST /v1/completions`.
pub async fn completions(
    state: &Arc<AppState>,
    body: Incoming,
) -> Result<Response<Body>, ApiError> {
    let (mut request, llama): (CompletionRequest, _) =
        read_generation_json(body, state.config().body_limit).await?;
    let common = request.common();
    let engine = state.engine()?.clone();
    state.check_model(engine.info(), common.model.as_deref())?;
    if request.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo=true is not supported"));
    }
    if let Some(best_of) = request.best_of.filter(|&b| b != 1) {
        return Err(ApiError::unsupported(
            "best_of",
            format!("best_of={best_of} is not supported (1 only)"),
        ));
    }
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "suffix (insertion) is not supported",
        ));
    }
    let logprobs = match request.logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("logprobs={n}: at most {MAX_TOP_LOGPROBS}"),
            ));
        }
        other => other.map(|n| n as usize),
    };
    // llama-server's `n_probs` wins over `logprobs` (its alias there) when given.
    let logprobs = match llama.n_probs {
        Some(n) => (n > 0).then_some(n),
        None => logprobs,
    };
    let prompt = request.prompt.into_input()?;
    let envelope = envelope(
        state,
        &engine,
        Kind::Completion,
        "cmpl",
        logprobs.is_some(),
        &common,
    );
    let stream = common.stream;
    let mut params = common.params(None, logprobs)?;
    llama.apply(&mut params)?;
    run(state, engine, envelope, prompt, params, stream).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    state: &Arc<AppState>,
    body: Incoming,
) -> Result<Response<Body>, ApiError> {
    let (mut request, llama): (ChatRequest, _) =
        read_generation_json(body, state.config().body_limit).await?;
    let common = request.common();
    let engine = state.engine()?.clone();
    state.check_model(engine.info(), common.model.as_deref())?;
    let logprobs = match (request.logprobs, request.top_logprobs) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs={n}: at most {MAX_TOP_LOGPROBS}"),
            ));
        }
        (false, Some(n)) if n > 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs requires logprobs=true",
            ));
        }
        (true, n) => Some(n.unwrap_or(0) as usize),
        // As llama-server: without `logprobs`, its `n_probs` asks for them.
        (false, _) => llama.n_probs.filter(|&n| n > 0),
    };
    let raw_tools = request.tools.take().filter(|t| !t.is_empty());
    let (tools, choice) = read_tools(
        raw_tools.clone(),
        request.tool_choice.take(),
        request.functions.take(),
        request.function_call.take(),
    )?;
    let parallel = request.parallel_tool_calls.unwrap_or(true);
    let templated = if tools.is_empty() && !has_tool_turns(&request.messages) {
        chat::render(
            &engine,
            Turns::Plain(chat_messages(request.messages)?),
            Vec::new(),
        )?
    } else {
        // Tools as the request gave them (legacy functions in the tools shape).
        let tool_list: Vec<Value> = raw_tools.unwrap_or_else(|| {
            tools
                .iter()
                .map(|t| chat::function_tool(&t.name, None, Some(&t.parameters)))
                .collect()
        });
        chat::render(
            &engine,
            Turns::Rich(rich_messages(request.messages)?),
            tool_list,
        )?
    };
    let plan = ToolPlan::new(&engine, tools, choice, parallel);
    let envelope = envelope(
        state,
        &engine,
        Kind::Chat,
        "chatcmpl",
        logprobs.is_some(),
        &common,
    );
    let stream = common.stream;
    let mut params = common.params(request.max_completion_tokens, logprobs)?;
    llama.apply(&mut params)?;
    plan.constrain(
        &mut params,
        "tool_choice",
        "response_format (or another output constraint)",
    )?;
    // Calls in the output are looked for unless the request said `none`.
    let tool_parsing = plan.parsing();
    run_chat(
        state,
        engine,
        envelope,
        PromptInput::Templated(templated),
        params,
        stream,
        tool_parsing,
    )
    .await
}

fn envelope(
    state: &AppState,
    engine: &Engine,
    kind: Kind,
    prefix: &str,
    logprobs: bool,
    common: &Common,
) -> Envelope {
    Envelope {
        id: format!("{prefix}-{:x}", rand_id()),
        created: unix_now(),
        model: state.model_name(engine.info()),
        kind,
        logprobs,
        include_usage: common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    }
}

/// A process-unique id with some entropy from the clock.
pub(crate) fn rand_id() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos << 16) ^ u128::from(COUNTER.fetch_add(1, Ordering::Relaxed))
}

async fn run(
    state: &Arc<AppState>,
    engine: Arc<Engine>,
    envelope: Envelope,
    prompt: PromptInput,
    params: Params,
    stream: bool,
) -> Result<Response<Body>, ApiError> {
    let mut tracked = submit(state, prompt, params).await?;
    if stream {
        let (response, sender) = event_stream();
        let format = OpenAiStream {
            envelope,
            engine,
            offset: 0,
            tools: None,
        };
        tokio::spawn(crate::generate::stream(tracked, sender, format));
        return Ok(response);
    }
    let outcome = collect(&mut tracked).await?;
    let timings = tracked.timings_object(outcome.usage.completion_tokens);
    let body = envelope
        .whole(
            &engine,
            outcome.text,
            &outcome.tokens,
            outcome.reason,
            outcome.usage,
        )
        .with_timings(timings);
    Ok(crate::body::json(StatusCode::OK, &body))
}

/// [`run`] for a chat that may call tools (`tools`: the format calls are written in, `None` when
/// the request has no tools): the text is searched for calls when the request ends, and a reply
/// that made some returns them as `tool_calls` (streamed: the text is held back until the end,
/// then sent as tool-call deltas or as content).
#[allow(clippy::too_many_arguments)]
async fn run_chat(
    state: &Arc<AppState>,
    engine: Arc<Engine>,
    envelope: Envelope,
    prompt: PromptInput,
    params: Params,
    stream: bool,
    tools: Option<ToolFormat>,
) -> Result<Response<Body>, ApiError> {
    let Some(format) = tools else {
        return run(state, engine, envelope, prompt, params, stream).await;
    };
    let mut tracked = submit(state, prompt, params).await?;
    if stream {
        let (response, sender) = event_stream();
        let stream_format = OpenAiStream {
            envelope,
            engine,
            offset: 0,
            tools: Some((format, String::new())),
        };
        tokio::spawn(crate::generate::stream(tracked, sender, stream_format));
        return Ok(response);
    }
    let outcome = collect(&mut tracked).await?;
    let timings = tracked.timings_object(outcome.usage.completion_tokens);
    let body = match chat::calls_in(&outcome.text, outcome.reason, Some(format), &envelope.id) {
        Some((content, calls)) => {
            envelope.whole_tool_calls(&engine, content, calls, &outcome.tokens, outcome.usage)
        }
        None => envelope.whole(
            &engine,
            outcome.text,
            &outcome.tokens,
            outcome.reason,
            outcome.usage,
        ),
    }
    .with_timings(timings);
    Ok(crate::body::json(StatusCode::OK, &body))
}

/// OpenAI's stream: a role delta first (chat), a chunk per token, the final chunk with the finish
/// reason, the usage chunk when asked for, then `[DONE]`.
struct OpenAiStream {
    envelope: Envelope,
    engine: Arc<Engine>,
    /// Bytes of text sent so far (legacy completion logprobs' `text_offset`).
    offset: usize,
    /// With tools: their format and the text held back until the end.
    tools: Option<(ToolFormat, String)>,
}

impl StreamFormat for OpenAiStream {
    type Chunk = CompletionBody;
    const DONE_LINE: bool = true;

    fn opening(&mut self) -> Vec<CompletionBody> {
        (self.envelope.kind == Kind::Chat)
            .then(|| self.envelope.role_chunk())
            .into_iter()
            .collect()
    }

    fn token(&mut self, record: TokenRecord) -> Option<CompletionBody> {
        if let Some((_, held)) = &mut self.tools {
            held.push_str(&record.text);
            return None;
        }
        if record.text.is_empty() && !self.envelope.logprobs {
            return None;
        }
        let chunk = self.envelope.chunk(
            &self.engine,
            &record.text,
            std::slice::from_ref(&record),
            self.offset,
            None,
        );
        self.offset += record.text.len();
        Some(chunk)
    }

    fn finish(
        &mut self,
        tracked: &Tracked,
        reason: FinishReason,
        text: String,
        usage: Usage,
    ) -> Vec<CompletionBody> {
        let timings = tracked.timings_object(usage.completion_tokens);
        let mut chunks = self.closing(reason, text, usage);
        // As llama-server: the timings ride on the stream's last chunk.
        if let Some(last) = chunks.pop() {
            chunks.push(last.with_timings(timings));
        }
        chunks
    }
}

impl OpenAiStream {
    /// The chunks that end a stream: the held-back text or calls, the finish reason, the usage.
    fn closing(&mut self, reason: FinishReason, text: String, usage: Usage) -> Vec<CompletionBody> {
        let mut chunks = Vec::new();
        let mut text = text;
        if let Some((format, mut held)) = self.tools.take() {
            held.push_str(&text);
            if let Some((content, calls)) =
                chat::calls_in(&held, reason, Some(format), &self.envelope.id)
            {
                if !content.is_empty() {
                    chunks.push(self.envelope.chunk(&self.engine, &content, &[], 0, None));
                }
                chunks.extend(self.envelope.tool_call_chunks(&calls));
                if self.envelope.include_usage {
                    chunks.push(self.envelope.usage_chunk(usage));
                }
                return chunks;
            }
            // No call: the held text is the content.
            if !held.is_empty() {
                chunks.push(self.envelope.chunk(&self.engine, &held, &[], 0, None));
            }
            text = String::new();
        }
        let last = self
            .envelope
            .chunk(&self.engine, &text, &[], self.offset, Some(reason));
        chunks.push(last);
        if self.envelope.include_usage {
            chunks.push(self.envelope.usage_chunk(usage));
        }
        chunks
    }
}

#[derive(Serialize)]
struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

#[derive(Serialize)]
struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    /// llama-server's extension: what the model is.
    meta: ModelMeta,
}

#[derive(Serialize)]
struct ModelMeta {
    n_ctx_train: usize,
    n_vocab: usize,
    n_params: u64,
    size: u64,
    backend: &'static str,
}

/// `GET /v1/models`.
pub fn models(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let info = engine.info();
    let list = ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name(info),
            object: "model",
            created: unix_now(),
            owned_by: "mlxcel",
            meta: ModelMeta {
                n_ctx_train: info.window,
                n_vocab: info.vocab_size,
                n_params: info.parameters,
                size: info.weight_bytes,
                backend: info.backend.as_str(),
            },
        }],
    };
    Ok(crate::body::json(StatusCode::OK, &list))
}
