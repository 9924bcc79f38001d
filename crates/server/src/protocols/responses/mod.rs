//! OpenAI's Responses API: `POST /v1/responses` (and `/responses`), and
//! `POST /v1/responses/input_tokens`.
//!
//! A request is translated into the one request (`wire.rs`) and run by the one handler
//! ([`crate::handler`]); the reply comes back as a response object (`reply.rs`), whole or as the
//! Responses API's numbered stream events (`stream.rs`). Nothing is stored: what needs a stored
//! response (`previous_response_id`, `store: true`, `background`, `conversation`) is refused.

mod reply;
mod stream;
mod wire;

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::json;

use crate::body::Body;
use crate::error::ApiError;
use crate::generate::{Outcome, Tracked, rand_id, unix_now};
use crate::handler::{Reply, count_tokens, generate};
use crate::read::RequestBody;
use crate::read::{GenerationBody, SamplingRanges, parse_generation, read_generation, read_json};
use crate::state::AppState;
use reply::{ReplyMeta, ResponseObject};
use stream::ResponsesStream;
use wire::{ResponsesRequest, TextConfig, TextFormat};

/// The answer of `/v1/responses`: the finished response object, or its stream.
impl Reply for ReplyMeta {
    type Stream = ResponsesStream;

    fn stream(self, _: &Tracked) -> ResponsesStream {
        ResponsesStream::new(self)
    }

    fn whole(self, _: &Tracked, outcome: Outcome) -> Response<Body> {
        let body = self.finished(&outcome.text, outcome.reason, outcome.usage);
        crate::body::json(StatusCode::OK, &body)
    }
}

/// `POST /v1/responses`'s body through the checks [`create`] makes before it renders the
/// template (for the fuzz targets; see `crate::fuzzing`).
pub(crate) fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    let body: GenerationBody<ResponsesRequest> = parse_generation(bytes, &SamplingRanges::OPENAI)?;
    let mut request = body.request;
    request.generation(body.sampling, &body.llama).map(drop)
}

/// `POST /v1/responses`.
pub async fn create(state: &Arc<AppState>, body: RequestBody) -> Result<Response<Body>, ApiError> {
    let GenerationBody {
        mut request,
        sampling,
        llama,
    } = read_generation::<ResponsesRequest>(
        body,
        state.config().body_limit,
        &SamplingRanges::OPENAI,
    )
    .await?;
    // Checked whole before the model is asked for (a bad request is a 400 while it loads too).
    let generation = request.generation(sampling, &llama)?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), request.model.as_deref())?;
    let sampling = &generation.params.sampling;
    let text = request.text.take().unwrap_or_default();
    let id = format!("resp_{:x}", rand_id());
    let skeleton = ResponseObject {
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
        temperature: sampling.temperature,
        top_p: sampling.top_p,
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
    };
    generate(state, &engine, generation, |prepared| ReplyMeta {
        message_id: format!("msg_{}", &skeleton.id["resp_".len()..]),
        skeleton,
        tools: prepared.tools,
    })
    .await
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
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let mut request: ResponsesRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), request.model.as_deref())?;
    let input_tokens = count_tokens(state, engine, request.chat()?).await?;
    Ok(crate::body::json(
        StatusCode::OK,
        &InputTokens {
            object: "response.input_tokens",
            input_tokens,
        },
    ))
}
