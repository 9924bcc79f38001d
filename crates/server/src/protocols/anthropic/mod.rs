//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is translated into the one request (`wire.rs`) and run by the one handler
//! ([`crate::handler`]); the reply comes back as `text` and `tool_use` content blocks with
//! Anthropic's `stop_reason`, whole or as Anthropic's named stream events (`reply.rs`). Errors on
//! these routes have Anthropic's shape (routes.rs).

mod reply;
mod wire;

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::body::Body;
use crate::error::ApiError;
use crate::generate::rand_id;
use crate::handler::{count_tokens as count_prompt_tokens, generate};
use crate::read::RequestBody;
use crate::read::{GenerationBody, SamplingRanges, parse_generation, read_generation, read_json};
use crate::state::AppState;
use reply::{MessagesReply, ReplyMeta};
use wire::MessagesRequest;

/// `POST /v1/messages`'s body through the checks [`messages`] makes before it renders the
/// template (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    let body: GenerationBody<MessagesRequest> =
        parse_generation(bytes, &SamplingRanges::ANTHROPIC)?;
    MessagesRequest::into_generation(body).map(drop)
}

/// `POST /v1/messages/count_tokens`'s body through the checks [`count_tokens`] makes before it
/// renders the template (no `max_tokens` needed).
pub(crate) fn check_count_body(bytes: &[u8]) -> Result<(), ApiError> {
    let mut body: GenerationBody<MessagesRequest> =
        parse_generation(bytes, &SamplingRanges::ANTHROPIC)?;
    body.request.chat().map(drop)
}

/// `POST /v1/messages`.
pub async fn messages(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let body: GenerationBody<MessagesRequest> =
        read_generation(body, state.config().body_limit, &SamplingRanges::ANTHROPIC).await?;
    let model = body.request.model.clone();
    // Checked whole before the model is asked for (a bad request is a 400 while it loads too).
    let generation = MessagesRequest::into_generation(body)?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), model.as_deref())?;
    let stops = generation.params.stop.clone();
    let model = state.model_name(engine.info());
    generate(state, &engine, generation, |prepared| MessagesReply {
        meta: ReplyMeta {
            id: format!("msg_{:x}", rand_id()),
            model,
            tools: prepared.tools,
            stops,
        },
        engine: engine.clone(),
        reasoning: prepared.reasoning,
    })
    .await
}

#[derive(Debug, Serialize)]
struct TokenCount {
    input_tokens: usize,
}

/// `POST /v1/messages/count_tokens`: the tokens of the templated prompt `/v1/messages` would
/// generate from (its `usage.input_tokens`).
pub async fn count_tokens(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let mut request: MessagesRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), request.model.as_deref())?;
    let input_tokens = count_prompt_tokens(state, engine, request.chat()?).await?;
    Ok(crate::body::json(
        StatusCode::OK,
        &TokenCount { input_tokens },
    ))
}
