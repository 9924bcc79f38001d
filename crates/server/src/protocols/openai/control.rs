//! `POST /v1/chat/completions/control`: acting on a chat completion while it runs, as
//! llama-server does. The one action is `reasoning_end`: the reply's reasoning block ends now
//! (the engine writes its end tag next) and the model goes on to its answer. The completion must
//! have asked for it with `reasoning_control: true` (which gives it a reasoning budget without a
//! count) or run under a reasoning budget.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use mlxcel_engine::ReasoningEnd;
use serde::Deserialize;

use crate::body::{Body, json};
use crate::error::ApiError;
use crate::read::{RequestBody, read_json};
use crate::state::AppState;

#[derive(Debug, Deserialize)]
struct ControlRequest {
    /// The completion's id (`chatcmpl-…`, its replies' `id`).
    #[serde(default)]
    id: String,
    #[serde(default)]
    action: String,
}

/// The route's handler: `{"success": true}`, or `{"success": false, "message"}` when the
/// completion is not running or cannot take the action (llama-server's answers, status 200);
/// a body without an id or with another action is a 400.
pub async fn control(state: &Arc<AppState>, body: RequestBody) -> Result<Response<Body>, ApiError> {
    let request: ControlRequest = read_json(body, state.config().body_limit).await?;
    if request.id.is_empty() {
        return Err(ApiError::invalid_param(
            "id",
            "missing completion id: send the `id` of a running chat completion",
        ));
    }
    if request.action != "reasoning_end" {
        return Err(ApiError::invalid_param(
            "action",
            format!(
                "unknown control action {:?}: the one action is \"reasoning_end\"",
                request.action
            ),
        ));
    }
    let outcome = match state.request_named(&request.id) {
        None => ReasoningEnd::UnknownRequest,
        Some(request_id) => state.awake_engine().await?.end_reasoning(request_id)?,
    };
    let failure = match outcome {
        ReasoningEnd::Ended => None,
        ReasoningEnd::UnknownRequest => Some("no active completion for this id"),
        ReasoningEnd::NoBudget => Some("reasoning control not enabled for this completion"),
        ReasoningEnd::NotReasoning => Some("the completion is not inside a reasoning block"),
    };
    let mut answer = serde_json::json!({ "success": failure.is_none() });
    if let Some(message) = failure {
        answer["message"] = message.into();
    }
    Ok(json(StatusCode::OK, &answer))
}
