//! The error bodies of the agent routes, as llama-server writes them (a leaf: no other agent
//! module is imported here).

use hyper::{Response, StatusCode};
use serde_json::json;

use crate::body::{Body, full};

/// An error body in llama-server's shape: `{"code", "message", "type"}`, inside `{"error"}`
/// when `wrapped`. The `code` is the one llama-server gives the type (400 for
/// `invalid_request_error`, 500 for `server_error`), even where the status differs (its 404 for
/// an unknown tool carries `"code": 400`).
pub fn llama_error(status: StatusCode, kind: &str, message: &str, wrapped: bool) -> Response<Body> {
    let code = if kind == "invalid_request_error" {
        400
    } else {
        500
    };
    let inner = json!({ "code": code, "message": message, "type": kind });
    let body = if wrapped {
        json!({ "error": inner })
    } else {
        inner
    };
    full(status, "application/json; charset=utf-8", body.to_string())
}

/// The 403 of a feature that is off.
pub fn disabled() -> Response<Body> {
    let body =
        json!({ "error": { "message": "this feature is disabled", "type": "feature_disabled" } });
    full(
        StatusCode::FORBIDDEN,
        "application/json; charset=utf-8",
        body.to_string(),
    )
}
