//! OpenAI's routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models` (and `/{id}`).
//!
//! - `wire.rs`: the request bodies and their translation into the one request.
//! - `response.rs`: the response bodies (whole, chunks, logprobs, usage) and their [`Envelope`].
//! - `stream.rs`: the [`crate::handler::Reply`] of both routes, whole or streamed.
//! - `models.rs`: `GET /v1/models` and `GET /v1/models/{id}`.
//! - `control.rs`: `POST /v1/chat/completions/control` (ending a running reply's reasoning).

mod control;
mod models;
mod response;
mod stream;
mod verbose;
mod wire;

use std::sync::Arc;

use hyper::Response;
use mlxcel_engine::Engine;

pub use control::control;
pub use models::{model, models};
pub(crate) use wire::{MessageField, StopField, turns};

use crate::body::Body;
use crate::error::ApiError;
use crate::fanout::{Join, generate_all, parts};
use crate::generate::{rand_id, unix_now};
use crate::handler::count_tokens;
use crate::read::RequestBody;
use crate::read::{
    GenerationBody, SamplingRanges, parse_generation_handling, read_generation_handling,
};
use crate::reasoning::ReasoningFields;
use crate::request::CONTINUATION_FIELDS;
use crate::request::Prompt;
use crate::state::AppState;
use response::{Envelope, Kind};
use stream::OpenAiReply;
use wire::{Asked, ChatRequest, CompletionRequest};

/// `POST /v1/completions`'s body through the checks [`completions`] makes before it needs the
/// model (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_completions_body(bytes: &[u8]) -> Result<(), ApiError> {
    CompletionRequest::into_generations(parse_generation_handling(
        bytes,
        &SamplingRanges::OPENAI,
        crate::llama_fields::PARSER_FIELDS,
    )?)
    .map(drop)
}

/// `POST /v1/chat/completions`'s body through the checks [`chat_completions`] makes before it
/// renders the template (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_chat_body(bytes: &[u8]) -> Result<(), ApiError> {
    ChatRequest::into_generation(parse_generation_handling(
        bytes,
        &SamplingRanges::OPENAI,
        &chat_fields(),
    )?)
    .map(drop)
}

/// The llama-server fields the chat route acts on itself: the reasoning fields and how the prompt
/// ends, which the inert-field check leaves to it.
fn chat_fields() -> Vec<&'static str> {
    ReasoningFields::NAMES
        .iter()
        .chain(CONTINUATION_FIELDS)
        .copied()
        .collect()
}

/// `POST /v1/chat/completions/input_tokens` (also without `/v1`): the tokens of the templated
/// prompt `/v1/chat/completions` would generate from (its `usage.prompt_tokens`), as llama-server
/// answers it: `{"input_tokens"}`.
pub async fn chat_input_tokens(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let body: GenerationBody<ChatRequest> = read_generation_handling(
        body,
        state.config().body_limit,
        &SamplingRanges::OPENAI,
        &chat_fields(),
    )
    .await?;
    let model = body.request.model.clone();
    let (generation, _) = ChatRequest::into_generation(body)?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), model.as_deref())?;
    let Prompt::Chat(chat) = generation.prompt else {
        return Err(ApiError::Internal("a chat request without a chat".into()));
    };
    let input_tokens = count_tokens(state, engine, chat).await?;
    Ok(crate::body::json(
        hyper::StatusCode::OK,
        &serde_json::json!({ "input_tokens": input_tokens }),
    ))
}

/// `POST /v1/completions`.
pub async fn completions(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let body: GenerationBody<CompletionRequest> = read_generation_handling(
        body,
        state.config().body_limit,
        &SamplingRanges::OPENAI,
        crate::llama_fields::PARSER_FIELDS,
    )
    .await?;
    let model = body.request.model.clone();
    // The body is checked whole before the model is asked for, as OpenAI answers a bad request
    // 400 whatever the state of the model.
    let (generations, asked) = CompletionRequest::into_generations(body)?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), model.as_deref())?;
    let envelope = envelope(state, &engine, Kind::Completion, "cmpl", &asked);
    let (reply_engine, verbose) = (engine.clone(), asked.verbose);
    let parts = parts(generations, asked.n);
    generate_all(state, &engine, parts, Join::Choices, move |_, prepared| {
        OpenAiReply {
            envelope: envelope.clone(),
            engine: reply_engine.clone(),
            tools: None,
            reasoning: None,
            verbose: verbose.then_some(prepared.prompt),
        }
    })
    .await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let body: GenerationBody<ChatRequest> = read_generation_handling(
        body,
        state.config().body_limit,
        &SamplingRanges::OPENAI,
        &chat_fields(),
    )
    .await?;
    let model = body.request.model.clone();
    // The body is checked whole before the model is asked for, as OpenAI answers a bad request
    // 400 whatever the state of the model.
    let (generation, asked) = ChatRequest::into_generation(body)?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), model.as_deref())?;
    let envelope = envelope(state, &engine, Kind::Chat, "chatcmpl", &asked);
    let (reply_engine, verbose) = (engine.clone(), asked.verbose);
    // Calls in the output are looked for unless the request said `none`.
    let parts = parts(vec![generation], asked.n);
    generate_all(state, &engine, parts, Join::Choices, move |_, prepared| {
        OpenAiReply {
            envelope: envelope.clone(),
            engine: reply_engine.clone(),
            tools: prepared.tools,
            reasoning: prepared.reasoning,
            verbose: verbose.then_some(prepared.prompt),
        }
    })
    .await
}

fn envelope(
    state: &AppState,
    engine: &Engine,
    kind: Kind,
    prefix: &str,
    asked: &Asked,
) -> Envelope {
    Envelope {
        id: format!("{prefix}-{:x}", rand_id()),
        created: unix_now(),
        model: state.model_name(engine.info()),
        kind,
        logprobs: asked.logprobs,
        include_usage: asked.include_usage,
    }
}
