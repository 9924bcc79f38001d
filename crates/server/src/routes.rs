//! The router: authentication, then one match from method and path to a handler.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request, Response};

use crate::body::Body;
use crate::error::ApiError;
use crate::state::AppState;
use crate::{llama, openai};

/// Answers one request. Every failure becomes a response here, so the connection keeps serving.
pub async fn handle(state: Arc<AppState>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = match route(&state, request).await {
        Ok(response) => response,
        Err(err) => err.response(),
    };
    tracing::info!(%method, %path, status = response.status().as_u16(), "request");
    response
}

/// Whether the request carries an accepted key (`Authorization: Bearer`, or `X-Api-Key`).
fn authorized(state: &AppState, request: &Request<Incoming>) -> bool {
    let keys = &state.config().api_keys;
    if !keys.required() {
        return true;
    }
    let headers = request.headers();
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let header = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer
        .or(header)
        .is_some_and(|key| keys.accepts(key.trim()))
}

async fn route(
    state: &Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if !matches!(path.as_str(), "/health" | "/v1/health") && !authorized(state, &request) {
        return Err(ApiError::Unauthorized);
    }
    let body = request.into_body();
    let wrong_method = || ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: path.clone(),
    };
    let post = method == Method::POST;
    let get = method == Method::GET;
    match path.as_str() {
        "/v1/completions" | "/completions" if post => openai::completions(state, body).await,
        "/v1/chat/completions" | "/chat/completions" if post => {
            openai::chat_completions(state, body).await
        }
        "/v1/models" | "/models" if get => openai::models(state),
        "/completion" if post => llama::completion(state, body).await,
        "/tokenize" if post => llama::tokenize(state, body).await,
        "/detokenize" if post => llama::detokenize(state, body).await,
        "/apply-template" if post => llama::apply_template(state, body).await,
        "/health" | "/v1/health" if get => Ok(llama::health(state)),
        "/props" if get => llama::props(state),
        "/slots" if get => llama::slots(state),
        "/metrics" if get => llama::metrics(state),
        "/v1/completions"
        | "/completions"
        | "/v1/chat/completions"
        | "/chat/completions"
        | "/completion"
        | "/tokenize"
        | "/detokenize"
        | "/apply-template"
        | "/v1/models"
        | "/models"
        | "/health"
        | "/v1/health"
        | "/props"
        | "/slots"
        | "/metrics" => Err(wrong_method()),
        _ => Err(ApiError::NotFound {
            method: method.to_string(),
            path,
        }),
    }
}
