//! llama-server's text routes: `POST /tokenize`, `/detokenize`, `/apply-template`.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::{Body, json};
use crate::error::ApiError;
use crate::generate::token_piece;
use crate::handler::render_chat;
use crate::protocols::openai::{MessageField, turns};
use crate::read::RequestBody;
use crate::read::{parse_json, read_json};
use crate::reasoning::ReasoningFields;
use crate::request::Continuation;
use crate::state::AppState;

/// The bodies of these routes through their parse (for the fuzz targets; see `crate::fuzzing`).
pub(super) fn check_body(endpoint: &str, bytes: &[u8]) -> Result<(), ApiError> {
    match endpoint {
        "tokenize" => parse_json::<TokenizeRequest>(bytes).map(drop),
        "detokenize" => parse_json::<DetokenizeRequest>(bytes).map(drop),
        _ => {
            let request: ApplyTemplateRequest = parse_json(bytes)?;
            request.reasoning.check()?;
            turns(request.messages).map(drop)
        }
    }
}

#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    content: String,
    #[serde(default)]
    add_special: bool,
    #[serde(default)]
    with_pieces: bool,
    /// Whether special-token texts (`<|im_start|>`) become their special tokens (default true,
    /// as llama-server); `false` tokenizes them as plain text.
    parse_special: Option<bool>,
}

/// `POST /tokenize`.
pub async fn tokenize(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let request: TokenizeRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.awake_engine().await?;
    let tokens = engine
        .tokenizer()
        .encode(
            &request.content,
            request.add_special,
            request.parse_special.unwrap_or(true),
        )
        .map_err(mlxcel_engine::EngineError::from)?;
    let tokens = if request.with_pieces {
        TokenList::WithPieces(
            tokens
                .iter()
                .map(|&id| TokenPiece {
                    id,
                    piece: token_piece(&engine, id),
                })
                .collect(),
        )
    } else {
        TokenList::Ids(tokens)
    };
    Ok(json(StatusCode::OK, &TokenizeResponse { tokens }))
}

#[derive(Debug, Serialize)]
struct TokenizeResponse {
    tokens: TokenList,
}

/// Ids alone, or (`with_pieces`) each id with its text.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum TokenList {
    Ids(Vec<u32>),
    WithPieces(Vec<TokenPiece>),
}

#[derive(Debug, Serialize)]
struct TokenPiece {
    id: u32,
    piece: String,
}

#[derive(Debug, Serialize)]
struct ContentResponse {
    content: String,
}

#[derive(Debug, Serialize)]
struct PromptResponse {
    prompt: String,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `POST /detokenize`.
pub async fn detokenize(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let request: DetokenizeRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.awake_engine().await?;
    engine
        .check_tokens(&request.tokens)
        .map_err(|err| ApiError::invalid_param("tokens", err.to_string()))?;
    let content = engine
        .tokenizer()
        .decode(&request.tokens, false)
        .map_err(mlxcel_engine::EngineError::from)?;
    Ok(json(StatusCode::OK, &ContentResponse { content }))
}

/// `/apply-template`'s body: the chat request's fields that make its prompt (llama-server
/// renders it as `/v1/chat/completions` does, without generating).
#[derive(Debug, Deserialize)]
struct ApplyTemplateRequest {
    messages: Vec<MessageField>,
    /// Function tools in OpenAI's shape, given to the template as they are.
    tools: Option<Vec<Value>>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<Value>,
    #[serde(flatten)]
    reasoning: ReasoningFields,
}

/// `POST /apply-template`: the prompt `/v1/chat/completions` would generate from for the same
/// body (turns, tools, `add_generation_prompt`, `continue_final_message`, reasoning options and
/// `chat_template_kwargs` over the server's flags).
pub async fn apply_template(
    state: &Arc<AppState>,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let request: ApplyTemplateRequest = read_json(body, state.config().body_limit).await?;
    request.reasoning.check()?;
    let mut continuation = Continuation::from_fields(
        request.add_generation_prompt,
        request.continue_final_message.as_ref(),
    )?;
    continuation.prefill = state.config().prefill_assistant;
    let turns = turns(request.messages)?;
    let engine = state.awake_engine().await?;
    let (prompt, _, _) = render_chat(
        &engine,
        &state.config().reasoning,
        &turns,
        continuation,
        request.tools.unwrap_or_default(),
        &request.reasoning,
    )?;
    Ok(json(StatusCode::OK, &PromptResponse { prompt }))
}
