//! Google Vertex AI's custom-container protocol (`AIP_MODE=PREDICTION`): the port comes from
//! `AIP_HTTP_PORT`, `AIP_HEALTH_ROUTE` answers as `/health` does, and `AIP_PREDICT_ROUTE` takes
//! `{"instances": [...]}`, runs each instance as a request to the route its `@requestFormat`
//! names (a camelCase alias such as `chatCompletions` for `/v1/chat/completions`, or the path
//! itself), and answers `{"predictions": [...]}` in the same order, each the route's JSON reply
//! (an error reply included: one failed instance does not fail the others). The routes
//! themselves are dispatched by the caller ([`crate::routes`]), which this file does not know.

use std::future::Future;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{Response, StatusCode};
use serde_json::{Map, Value, json};

use crate::body::{Body, full};
use crate::error::ApiError;

/// Instances one prediction request may carry (llama-server's limit).
pub const MAX_INSTANCES: usize = 128;

/// Where Vertex AI expects the server, from its `AIP_*` environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcpConfig {
    /// `AIP_HTTP_PORT` (default 8080): replaces `--port`.
    pub port: u16,
    /// `AIP_PREDICT_ROUTE` (default `/predict`).
    pub predict_route: String,
    /// `AIP_HEALTH_ROUTE`: a second path for `/health` (`None`: `/health` alone).
    pub health_route: Option<String>,
}

impl GcpConfig {
    /// Reads the variables through `var` (the process environment in the server): `None`
    /// unless `AIP_MODE` is `PREDICTION`. A route without a leading `/` gets one; an empty
    /// variable counts as unset; a port that is not one is refused with the variable named.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        if get("AIP_MODE").as_deref() != Some("PREDICTION") {
            return Ok(None);
        }
        let route = |value: String| {
            if value.starts_with('/') {
                value
            } else {
                format!("/{value}")
            }
        };
        let port = match get("AIP_HTTP_PORT") {
            None => 8080,
            Some(text) => text.trim().parse().map_err(|_| {
                format!("AIP_HTTP_PORT={text}: expected a port number (0 to 65535)")
            })?,
        };
        Ok(Some(Self {
            port,
            predict_route: route(get("AIP_PREDICT_ROUTE").unwrap_or_else(|| "/predict".into())),
            health_route: get("AIP_HEALTH_ROUTE").map(route),
        }))
    }
}

/// The `@requestFormat` alias of a route's path, as llama-server derives it: without `/v1`,
/// each `/`, `-` or `_` dropped and the letter after it capitalized, up to the first path
/// parameter (`/v1/chat/completions` → `chatCompletions`, `/apply-template` → `applyTemplate`).
pub fn request_format(path: &str) -> String {
    let path = path.strip_prefix("/v1").unwrap_or(path);
    let path = path.strip_prefix('/').unwrap_or(path);
    let mut alias = String::new();
    let mut capital = false;
    for c in path.chars() {
        match c {
            '{' => break,
            '/' | '-' | '_' => capital = true,
            c if capital => {
                alias.extend(c.to_uppercase());
                capital = false;
            }
            c => alias.push(c),
        }
    }
    alias
}

/// The route an instance's `@requestFormat` names among `paths` (the server's POST routes, in
/// its order: the first with an alias wins), by alias or by path.
pub fn resolve<'a>(format: &str, paths: &[&'a str]) -> Option<&'a str> {
    paths
        .iter()
        .find(|p| request_format(p) == format)
        .or_else(|| paths.iter().find(|p| **p == format))
        .copied()
}

/// An instance's answer when it cannot be dispatched: llama-server's error object.
fn instance_error(message: String) -> Value {
    json!({"error": {"code": 400, "message": message, "type": "invalid_request_error"}})
}

/// Answers a prediction request: checks the body, runs every instance through `dispatch`
/// (given the route's path and the instance without `@requestFormat`, with `stream` forced
/// off) at once, and gathers the replies in order.
pub async fn predict<F, Fut>(
    body: &[u8],
    paths: &[&'static str],
    dispatch: F,
) -> Result<Response<Body>, ApiError>
where
    F: Fn(&'static str, Bytes) -> Fut,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let request: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("malformed JSON: {err}")))?;
    let Some(object) = request.as_object() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let Some(instances) = object.get("instances").and_then(Value::as_array) else {
        return Err(ApiError::invalid_param(
            "instances",
            "the request body must include an array field named instances",
        ));
    };
    if instances.len() > MAX_INSTANCES {
        return Err(ApiError::invalid_param(
            "instances",
            format!(
                "instances has {} entries; at most {MAX_INSTANCES} are accepted",
                instances.len()
            ),
        ));
    }
    // Every instance starts before any is awaited, so that they run together.
    let running: Vec<Result<tokio::task::JoinHandle<Response<Body>>, Value>> = instances
        .iter()
        .map(|instance| start(instance, paths, &dispatch).map(tokio::spawn))
        .collect();
    let mut predictions = Vec::with_capacity(running.len());
    for task in running {
        predictions.push(match task {
            Ok(task) => match task.await {
                Ok(response) => reply_json(response).await,
                Err(err) => json!({"error": {
                    "code": 500,
                    "message": format!("the instance's request failed: {err}"),
                    "type": "server_error",
                }}),
            },
            Err(error) => error,
        });
    }
    let body = serde_json::to_vec(&json!({ "predictions": predictions })).unwrap_or_default();
    Ok(full(StatusCode::OK, "application/json", body))
}

/// Checks one instance and starts its request; `Err` is the instance's error reply.
fn start<F, Fut>(instance: &Value, paths: &[&'static str], dispatch: &F) -> Result<Fut, Value>
where
    F: Fn(&'static str, Bytes) -> Fut,
{
    let Some(fields) = instance.as_object() else {
        return Err(instance_error("each instance must be a JSON object".into()));
    };
    let Some(format) = fields.get("@requestFormat").and_then(Value::as_str) else {
        return Err(instance_error(
            "each instance must include a string @requestFormat".into(),
        ));
    };
    let Some(path) = resolve(format, paths) else {
        return Err(instance_error(format!(
            "no route for @requestFormat {format}: name a POST route by its camelCase alias \
             (chatCompletions for /v1/chat/completions) or its path"
        )));
    };
    let mut payload: Map<String, Value> = fields.clone();
    payload.remove("@requestFormat");
    if payload.contains_key("stream") {
        // A prediction's reply is one JSON document; the route answers whole.
        payload.insert("stream".into(), Value::Bool(false));
    }
    let bytes = serde_json::to_vec(&Value::Object(payload)).unwrap_or_default();
    Ok(dispatch(path, Bytes::from(bytes)))
}

/// A route's reply as JSON (its text as a string when it is not JSON; `null` when empty).
async fn reply_json(response: Response<Body>) -> Value {
    let bytes = match response.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_llama_servers_camel_case() {
        assert_eq!(request_format("/v1/chat/completions"), "chatCompletions");
        assert_eq!(request_format("/apply-template"), "applyTemplate");
        assert_eq!(request_format("/completion"), "completion");
        assert_eq!(request_format("/slots/{id_slot}"), "slots");
        assert_eq!(
            request_format("/v1/chat/completions/input_tokens"),
            "chatCompletionsInputTokens"
        );
        let paths = ["/v1/chat/completions", "/chat/completions", "/tokenize"];
        assert_eq!(
            resolve("chatCompletions", &paths),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            resolve("/chat/completions", &paths),
            Some("/chat/completions")
        );
        assert_eq!(resolve("tokenize", &paths), Some("/tokenize"));
        assert_eq!(resolve("nothing", &paths), None);
    }

    #[test]
    fn the_variables_set_port_and_routes() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(GcpConfig::from_vars(vars(&[])), Ok(None));
        assert_eq!(
            GcpConfig::from_vars(vars(&[("AIP_MODE", "TRAINING")])),
            Ok(None)
        );
        assert_eq!(
            GcpConfig::from_vars(vars(&[("AIP_MODE", "PREDICTION")])),
            Ok(Some(GcpConfig {
                port: 8080,
                predict_route: "/predict".into(),
                health_route: None,
            }))
        );
        assert_eq!(
            GcpConfig::from_vars(vars(&[
                ("AIP_MODE", "PREDICTION"),
                ("AIP_HTTP_PORT", "9000"),
                ("AIP_PREDICT_ROUTE", "v1/endpoints/x:predict"),
                ("AIP_HEALTH_ROUTE", "/healthz"),
            ])),
            Ok(Some(GcpConfig {
                port: 9000,
                predict_route: "/v1/endpoints/x:predict".into(),
                health_route: Some("/healthz".into()),
            }))
        );
        let bad = GcpConfig::from_vars(vars(&[("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", "x")]));
        assert!(bad.unwrap_err().contains("AIP_HTTP_PORT=x"));
    }
}
