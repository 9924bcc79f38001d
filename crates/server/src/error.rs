//! The server's errors: [`ApiError`] for one request, mapped to a response in one place
//! ([`ApiError::response`]); [`ServerError`] for starting and running the server.

use hyper::header::{ALLOW, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use hyper::{Response, StatusCode};
use mlxcel_capacity::CapacityError;
use mlxcel_engine::EngineError;
use serde::Serialize;

use crate::body::{Body, json};

/// Why a request failed, as the client is told. Internal details of 5xx errors go to the log,
/// never into the body.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed or asks for something the server refuses.
    #[error("{message}")]
    BadRequest {
        message: String,
        param: Option<String>,
        code: &'static str,
    },
    /// The prompt and its budget do not fit the request's context (`--ctx-size`, the window):
    /// llama-server's `exceed_context_size_error`, with its numbers (`n_prompt_tokens`, `n_ctx`).
    #[error("{message}")]
    ContextExceeded {
        message: String,
        n_prompt_tokens: usize,
        n_ctx: usize,
    },
    /// No or wrong API key.
    #[error("invalid API key")]
    Unauthorized,
    /// No such route.
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    /// The route exists under another method; `allow` lists the ones it takes (the `Allow`
    /// header of the response).
    #[error("{path} does not accept {method}; it accepts {allow}")]
    MethodNotAllowed {
        method: String,
        path: String,
        allow: String,
    },
    /// A model name the server does not serve.
    #[error("the model `{model}` does not exist; this server serves `{served}`")]
    ModelNotFound { model: String, served: String },
    /// The body is over the limit.
    #[error("the request body exceeds {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// The model is still loading.
    #[error("the model is loading; retry shortly")]
    Loading,
    /// The engine's queue is full.
    #[error("{message}")]
    QueueFull {
        message: String,
        /// Seconds a client should wait before trying again (the `Retry-After` header).
        retry_after: u64,
    },
    /// `GET /slots?fail_on_no_slot=1` while every slot is busy.
    #[error("no slot available")]
    NoSlotAvailable,
    /// The server is shutting down or the engine has stopped.
    #[error("the server is shutting down")]
    Unavailable,
    /// The backend can no longer run steps (a pipeline that lost a rank); the message says why.
    #[error("{0}")]
    BackendDown(String),
    /// A route turned off by configuration, or one the model cannot serve (`/infill` without
    /// fill-in-the-middle tokens).
    #[error("{0}")]
    NotImplemented(std::borrow::Cow<'static, str>),
    /// Anything else; the detail is logged, the client sees a generic message.
    #[error("internal server error")]
    Internal(String),
}

/// The shape an error body takes: OpenAI's on most routes; Anthropic's on Anthropic's, whose
/// clients read `{"type": "error", "error": {"type", "message"}}`; llama-server's on its status
/// routes (`/health`, `/slots`), whose probes read the HTTP status as a number in
/// `{"error": {"code": 503, "message", "type"}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    OpenAi,
    Anthropic,
    LlamaServer,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

/// OpenAI's error object.
#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

/// Anthropic's error object.
#[derive(Serialize)]
struct AnthropicErrorBody {
    #[serde(rename = "type")]
    kind: &'static str,
    error: AnthropicErrorDetail,
}

#[derive(Serialize)]
struct AnthropicErrorDetail {
    #[serde(rename = "type")]
    kind: &'static str,
    message: String,
}

impl ApiError {
    /// A 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: None,
            code: "invalid_request_error",
        }
    }

    /// A 400 about one field.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: Some(param.into()),
            code: "invalid_value",
        }
    }

    /// A 400 for a feature the server refuses rather than ignores.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: Some(param.to_owned()),
            code: "unsupported_parameter",
        }
    }

    /// A generation the engine ended with `message`: a pipeline that lost a rank is
    /// [`ApiError::BackendDown`] with the engine's reason (which rank, what MLX said), so that the
    /// client learns the service is down rather than an internal error; anything else is
    /// internal, its detail logged.
    pub fn generation_failed(message: String) -> ApiError {
        if message.contains(mlxcel_engine::PIPELINE_FAILURE) {
            ApiError::BackendDown(message)
        } else {
            ApiError::Internal(message)
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest { .. } | Self::ContextExceeded { .. } => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound { .. } | Self::ModelNotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Loading
            | Self::QueueFull { .. }
            | Self::Unavailable
            | Self::NoSlotAvailable
            | Self::BackendDown(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `error` object of the OpenAI shape, for bodies and mid-stream error events.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code, param) = match self {
            Self::BadRequest { code, param, .. } => {
                ("invalid_request_error", Some(*code), param.as_deref())
            }
            Self::ContextExceeded { .. } => (
                "exceed_context_size_error",
                Some("context_length_exceeded"),
                Some("max_tokens"),
            ),
            Self::Unauthorized => ("authentication_error", Some("invalid_api_key"), None),
            Self::NotFound { .. } => ("not_found_error", Some("not_found"), None),
            Self::MethodNotAllowed { .. } => {
                ("invalid_request_error", Some("method_not_allowed"), None)
            }
            Self::ModelNotFound { .. } => (
                "invalid_request_error",
                Some("model_not_found"),
                Some("model"),
            ),
            Self::PayloadTooLarge { .. } => {
                ("invalid_request_error", Some("payload_too_large"), None)
            }
            Self::Loading => ("unavailable_error", Some("model_loading"), None),
            Self::QueueFull { .. } => ("unavailable_error", Some("queue_full"), None),
            Self::NoSlotAvailable => ("unavailable_error", Some("no_slot_available"), None),
            Self::Unavailable => ("unavailable_error", Some("shutting_down"), None),
            Self::BackendDown(_) => ("unavailable_error", Some("backend_down"), None),
            Self::NotImplemented(_) => ("not_supported_error", Some("not_implemented"), None),
            Self::Internal(_) => ("server_error", Some("internal_error"), None),
        };
        let mut body = serde_json::to_value(ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind,
                param,
                code,
            },
        })
        .unwrap_or_default();
        if let (
            Self::ContextExceeded {
                n_prompt_tokens,
                n_ctx,
                ..
            },
            Some(error),
        ) = (self, body.get_mut("error").and_then(|e| e.as_object_mut()))
        {
            error.insert("n_prompt_tokens".into(), (*n_prompt_tokens).into());
            error.insert("n_ctx".into(), (*n_ctx).into());
        }
        body
    }

    /// The body of the Anthropic shape, for bodies and mid-stream `error` events; the `type`s are
    /// Anthropic's for the same statuses.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self {
            Self::BadRequest { .. }
            | Self::ContextExceeded { .. }
            | Self::MethodNotAllowed { .. } => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::NotFound { .. } | Self::ModelNotFound { .. } => "not_found_error",
            Self::PayloadTooLarge { .. } => "request_too_large",
            Self::Loading
            | Self::QueueFull { .. }
            | Self::Unavailable
            | Self::NoSlotAvailable
            | Self::BackendDown(_) => "overloaded_error",
            Self::NotImplemented(_) | Self::Internal(_) => "api_error",
        };
        serde_json::to_value(AnthropicErrorBody {
            kind: "error",
            error: AnthropicErrorDetail {
                kind,
                message: self.to_string(),
            },
        })
        .unwrap_or_default()
    }

    /// llama-server's error body: OpenAI's `type` and message, the HTTP status as `code`.
    pub fn llama_server_body(&self) -> serde_json::Value {
        let mut body = self.body();
        if let Some(error) = body.get_mut("error").and_then(|e| e.as_object_mut()) {
            error.remove("param");
            error.insert("code".into(), self.status().as_u16().into());
        }
        body
    }

    /// The one mapping from an error to a response, in OpenAI's shape.
    pub fn response(&self) -> Response<Body> {
        self.response_as(ErrorShape::OpenAi)
    }

    /// The one mapping from an error to a response, in `shape`.
    pub fn response_as(&self, shape: ErrorShape) -> Response<Body> {
        let status = self.status();
        // Only a failure of the server itself is an ERROR; a refused request, a route turned off
        // (501), a loading model or a full queue (503) are not (the request's own line,
        // request_log.rs, says what was answered).
        if matches!(self, Self::Internal(_)) {
            tracing::error!(error = ?self, "request failed");
        } else {
            tracing::debug!(%status, error = %self, "request refused");
        }
        let body = match shape {
            ErrorShape::OpenAi => self.body(),
            ErrorShape::Anthropic => self.anthropic_body(),
            ErrorShape::LlamaServer => self.llama_server_body(),
        };
        let mut response = json(status, &body);
        let headers = response.headers_mut();
        match self {
            Self::Loading => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::QueueFull { retry_after, .. } => {
                headers.insert(RETRY_AFTER, HeaderValue::from(*retry_after));
            }
            Self::Unauthorized => {
                headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            Self::MethodNotAllowed { allow, .. } => {
                if let Ok(value) = HeaderValue::from_str(allow) {
                    headers.insert(ALLOW, value);
                }
            }
            _ => {}
        }
        response
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::InvalidSampling { field, .. } => {
                Self::invalid_param(field, err.to_string())
            }
            EngineError::Capacity(
                CapacityError::ExceedsCapacity {
                    effective_prompt_len,
                    context_capacity: n_ctx,
                    ..
                }
                | CapacityError::ExceedsWindow {
                    effective_prompt_len,
                    window: n_ctx,
                    ..
                },
            ) => Self::ContextExceeded {
                message: err.to_string(),
                n_prompt_tokens: effective_prompt_len,
                n_ctx,
            },
            EngineError::Capacity(_) | EngineError::KvBudget { .. } => Self::BadRequest {
                message: err.to_string(),
                param: Some("max_tokens".into()),
                code: "context_length_exceeded",
            },
            EngineError::EmptyPrompt | EngineError::TokenOutOfVocabulary { .. } => {
                Self::invalid_param("prompt", err.to_string())
            }
            EngineError::NoChatTemplate => Self::invalid_param("messages", err.to_string()),
            EngineError::InvalidConstraint { .. }
            | EngineError::InvalidSpeculation(_)
            | EngineError::InvalidReasoningBudget(_) => Self::bad_request(err.to_string()),
            EngineError::InvalidLora(_) => Self::invalid_param("lora", err.to_string()),
            EngineError::Model(_) => Self::bad_request(err.to_string()),
            EngineError::QueueFull { .. } | EngineError::NoFreeSlot => Self::QueueFull {
                message: err.to_string(),
                retry_after: 1,
            },
            EngineError::Stopped => Self::Unavailable,
            EngineError::NotAReranker | EngineError::EncoderCannotGenerate => {
                Self::NotImplemented(err.to_string().into())
            }
            _ => Self::Internal(err.to_string()),
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A flag value that cannot work.
    #[error("{0}")]
    Flag(String),
    /// The backend cannot be used.
    #[error("{0}")]
    Backend(String),
    /// The engine failed to load.
    #[error("cannot load the model: {0}")]
    Engine(#[from] EngineError),
    /// A model the flags fetch (`-hf`, `-mu`, `-dr`) could not be fetched.
    #[error("cannot fetch the model: {0}")]
    Download(#[from] crate::download::DownloadError),
    /// Binding or serving failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_past_the_context_is_llama_servers_exceed_context_size_error() {
        let err = ApiError::from(EngineError::Capacity(CapacityError::ExceedsCapacity {
            effective_prompt_len: 300,
            max_new_tokens: 1,
            context_capacity: 256,
        }));
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        let body = err.body();
        assert_eq!(body["error"]["type"], "exceed_context_size_error");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert_eq!(body["error"]["n_prompt_tokens"], 300);
        assert_eq!(body["error"]["n_ctx"], 256);
        assert_eq!(
            err.anthropic_body()["error"]["type"],
            "invalid_request_error"
        );
    }

    /// body.rs answers an unserializable response with this body without knowing `ApiError`.
    #[test]
    fn the_leaf_body_module_writes_the_internal_error_body() {
        let body = ApiError::Internal("detail".into()).body();
        let leaf: serde_json::Value =
            serde_json::from_str(crate::body::INTERNAL_ERROR_BODY).unwrap();
        assert_eq!(leaf, body);
    }
}
