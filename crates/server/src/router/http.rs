//! The router's side of HTTP: the routes it answers itself (`/models`, `/models/load`,
//! `/models/unload`, `/models/sse`, `/health`, `/props` without `?model=`, `/metrics` over
//! every loaded model), and every other route forwarded to the model the request names (the
//! body's `model` field, or `?model=` on a `GET`), which is loaded first when autoload allows.
//! The model stays busy (never evicted) until the response's last byte is sent.

use std::future::Future;
use std::sync::Arc;

use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::body::{Body, event_stream, json as json_response};
use crate::error::ApiError;
use crate::read::{RequestBody, parse_json, read_bytes};
use crate::router::registry::{AcquireError, Lease, Registry, Status};
use crate::state::AppState;

/// The router over this server's per-model states.
pub type Router = Registry<AppState>;

/// Answers one request in router mode: `pattern` is the matched route's path pattern and
/// `handler` runs that route on a state (the router's own, or the named model's) with a query.
#[allow(clippy::too_many_arguments)]
pub async fn serve<F, Fut>(
    state: &Arc<AppState>,
    router: &Arc<Router>,
    method: &Method,
    pattern: &str,
    path: &str,
    query: &str,
    body: RequestBody,
    handler: F,
) -> Result<Response<Body>, ApiError>
where
    F: FnOnce(Arc<AppState>, RequestBody, String) -> Fut,
    Fut: Future<Output = Result<Response<Body>, ApiError>>,
{
    let get = *method == Method::GET;
    match pattern {
        "/models" | "/v1/models" if get => return list(router, query),
        "/models/{id}" | "/v1/models/{id}" if get => {
            let id = percent_decode(path.rsplit('/').next().unwrap_or_default());
            return one(router, &id);
        }
        "/health" | "/v1/health" if get => {
            return Ok(json_response(StatusCode::OK, &json!({ "status": "ok" })));
        }
        "/props" if get && query_param(query, "model").is_none() => return props(router),
        "/metrics" if get => return metrics(state, router),
        "/models/load" | "/models/unload" | "/models/sse" | "/live" | "/" | "/webui/{file}"
        | "/tools" | "/cors-proxy" => {
            return handler(state.clone(), body, query.to_owned()).await;
        }
        _ => {}
    }
    let bytes = read_bytes(body, state.config().body_limit).await?;
    let name = if get {
        query_param(query, "model")
    } else {
        serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("model").and_then(Value::as_str).map(str::to_owned))
    };
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Err(ApiError::bad_request(format!(
            "model name is missing from the request: this server routes by the `model` field \
             (`?model=` on GET routes) to one of: {}",
            known(router)
        )));
    };
    let autoload = query_param(query, "autoload")
        .map_or(router.autoload(), |v| matches!(v.as_str(), "1" | "true"));
    let lease = router
        .acquire(&name, autoload)
        .await
        .map_err(|err| refusal(&name, err))?;
    if fake_timing() {
        // llama-server's test hook: the model stays busy 2 s longer, so that its suite can
        // watch a queue form behind a busy model.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    // The model's own route sees the query without the router's parameters.
    let rest: Vec<&str> = query
        .split('&')
        .filter(|p| {
            let key = p.split('=').next().unwrap_or_default();
            !p.is_empty() && key != "model" && key != "autoload"
        })
        .collect();
    let response = handler(
        lease.state().clone(),
        RequestBody::Bytes(bytes),
        rest.join("&"),
    )
    .await?;
    Ok(hold(response, lease))
}

/// `LLAMA_SERVER_DEBUG_FAKE_TIMING` set (to anything): each routed request and each load takes
/// 2 s longer, as in llama-server (docs/environment.md).
pub fn fake_timing() -> bool {
    static SET: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        std::env::var_os("LLAMA_SERVER_DEBUG_FAKE_TIMING").is_some_and(|v| !v.is_empty())
    })
}

/// What the client is told when the model cannot be had.
fn refusal(name: &str, err: AcquireError) -> ApiError {
    match err {
        AcquireError::NotFound { .. } => ApiError::BadRequest {
            message: err.to_string(),
            param: Some("model".into()),
            code: "model_not_found",
        },
        AcquireError::NotLoaded => ApiError::BadRequest {
            message: format!(
                "model is not loaded: `{name}` is not loaded and autoload is off \
                 (--no-models-autoload); load it with POST /models/load"
            ),
            param: Some("model".into()),
            code: "model_not_loaded",
        },
        AcquireError::LoadFailed { .. } => ApiError::BackendDown(err.to_string()),
    }
}

/// The response, with `lease` held until its body has been sent (or the client has gone).
fn hold(response: Response<Body>, lease: Lease<AppState>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    match body {
        Body::Full(bytes) => Response::from_parts(parts, Body::Full(bytes)),
        Body::Channel(mut from) => {
            let (to, rx) = mpsc::channel(64);
            tokio::spawn(async move {
                let _lease = lease;
                loop {
                    tokio::select! {
                        chunk = from.recv() => match chunk {
                            Some(chunk) => if to.send(chunk).await.is_err() { break },
                            None => break,
                        },
                        () = to.closed() => break,
                    }
                }
            });
            Response::from_parts(parts, Body::Channel(rx))
        }
    }
}

/// `GET /models` (`?reload=1` reads the models directory and the preset again).
fn list(router: &Arc<Router>, query: &str) -> Result<Response<Body>, ApiError> {
    if query_param(query, "reload").is_some_and(|v| !v.is_empty()) {
        let specs = router.rescan().map_err(ApiError::bad_request)?;
        router.replace_specs(specs);
    }
    let created = created();
    let data: Vec<Value> = router
        .snapshot()
        .iter()
        .map(|m| describe(m, created))
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "object": "list", "data": data }),
    ))
}

/// `GET /models/{id}`.
fn one(router: &Arc<Router>, id: &str) -> Result<Response<Body>, ApiError> {
    let name = router.resolve(id).map_err(|_| ApiError::ModelNotFound {
        model: id.to_owned(),
        served: known(router),
    })?;
    let created = created();
    let model = router
        .snapshot()
        .iter()
        .find(|m| m.spec.name == name)
        .map(|m| describe(m, created))
        .unwrap_or(Value::Null);
    Ok(json_response(StatusCode::OK, &model))
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One model as `/models` lists it (llama-server's fields).
fn describe(m: &crate::router::registry::Snapshot<AppState>, created: u64) -> Value {
    let mut args = vec!["--model".to_owned(), m.spec.path.display().to_string()];
    args.extend(m.spec.args.iter().cloned());
    let mut status = json!({ "value": m.status.as_str(), "args": args });
    if let Some(preset) = &m.spec.preset {
        status["preset"] = preset.clone().into();
    }
    if let Some(error) = &m.error {
        status["failed"] = true.into();
        status["error"] = error.clone().into();
    }
    let mut model = json!({
        "id": m.spec.name,
        "aliases": m.spec.aliases,
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "status": status,
        "architecture": { "input_modalities": ["text"], "output_modalities": ["text"] },
        "source": m.spec.source.as_str(),
        "can_remove": false,
        "path": m.spec.path.display().to_string(),
        "in_use": m.busy,
    });
    if let (Status::Loaded, Some(state)) = (m.status, &m.loaded)
        && let Ok(engine) = state.engine()
    {
        let info = engine.info();
        model["meta"] = json!({
            "n_ctx_train": info.window,
            "n_vocab": info.vocab_size,
            "n_embd": info.hidden_size,
            "n_params": info.parameters,
            "size": info.weight_bytes,
            "n_ctx": state.context_limit(info),
        });
    }
    model
}

/// `GET /props` on the router itself (llama-server's router answer).
fn props(router: &Arc<Router>) -> Result<Response<Body>, ApiError> {
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "role": "router",
            "max_instances": router.max(),
            "models_autoload": router.autoload(),
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": { "params": {}, "n_ctx": 0 },
            "build_info": concat!("mlxcel-", env!("CARGO_PKG_VERSION")),
        }),
    ))
}

/// `GET /metrics`: every loaded model's families, each series labelled `model="name"`.
fn metrics(state: &AppState, router: &Arc<Router>) -> Result<Response<Body>, ApiError> {
    if !state.config().metrics {
        return Err(ApiError::NotImplemented(
            "the metrics endpoint is off; start the server with --metrics".into(),
        ));
    }
    let mut families: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for model in router.snapshot() {
        let Some(child) = model.loaded.as_ref() else {
            continue;
        };
        let label = format!(
            "model=\"{}\"",
            model.spec.name.replace(['\\', '"', '\n'], "_")
        );
        let text = child.render_metrics();
        let mut current: Option<usize> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# ") {
                let family = rest
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let index = match families.iter().position(|(f, _, _)| *f == family) {
                    Some(i) => i,
                    None => {
                        families.push((family, Vec::new(), Vec::new()));
                        families.len() - 1
                    }
                };
                if !families[index].1.iter().any(|h| h == line) {
                    families[index].1.push(line.to_owned());
                }
                current = Some(index);
            } else if let (Some(index), false) = (current, line.is_empty()) {
                families[index].2.push(labelled(line, &label));
            }
        }
    }
    let mut text = String::new();
    for (_, headers, samples) in families {
        for line in headers.iter().chain(&samples) {
            text.push_str(line);
            text.push('\n');
        }
    }
    Ok(crate::body::full(
        StatusCode::OK,
        "text/plain; version=0.0.4",
        text,
    ))
}

/// A sample line with `label` added to its labels.
fn labelled(line: &str, label: &str) -> String {
    match line.find('{') {
        Some(open) => format!("{}{{{label},{}", &line[..open], &line[open + 1..]),
        None => match line.split_once(' ') {
            Some((name, value)) => format!("{name}{{{label}}} {value}"),
            None => line.to_owned(),
        },
    }
}

/// `POST /models/load`: `{"model": name}`; the load runs in the background (`/models` and
/// `/models/sse` show it).
pub async fn load(state: &AppState, body: RequestBody) -> Result<Response<Body>, ApiError> {
    let router = state.router().ok_or_else(not_router("/models/load"))?;
    let name = model_field(state, body).await?;
    match router.load(&name) {
        Ok(true) => Ok(json_response(StatusCode::OK, &json!({ "success": true }))),
        Ok(false) => Err(ApiError::bad_request("model is already running")),
        Err(_) => Err(ApiError::ModelNotFound {
            model: name,
            served: known(router),
        }),
    }
}

/// `POST /models/unload`: `{"model": name}`; requests it serves finish first.
pub async fn unload(state: &AppState, body: RequestBody) -> Result<Response<Body>, ApiError> {
    let router = state.router().ok_or_else(not_router("/models/unload"))?;
    let name = model_field(state, body).await?;
    match router.unload(&name) {
        Ok(true) => Ok(json_response(StatusCode::OK, &json!({ "success": true }))),
        Ok(false) => Err(ApiError::bad_request("model is not running")),
        Err(_) => Err(ApiError::ModelNotFound {
            model: name,
            served: known(router),
        }),
    }
}

/// `GET /models/sse`: one `data: {"model", "event": "status_change", "data": {"status"}}`
/// event per status change, until the client leaves.
pub fn sse(state: &AppState) -> Result<Response<Body>, ApiError> {
    let router = state.router().ok_or_else(not_router("/models/sse"))?;
    let mut events = router.subscribe();
    let mut closing = router.closing();
    let (response, sender) = event_stream();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = async { closing.wait_for(|closed| *closed).await.is_ok() } => break,
                event = events.recv() => match event {
                    Ok(event) => if !sender.raw(format!("data: {event}\n\n")).await { break },
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                () = sender.closed() => break,
            }
        }
    });
    Ok(response)
}

fn not_router(path: &'static str) -> impl FnOnce() -> ApiError {
    move || ApiError::NotFound {
        method: if path == "/models/sse" { "GET" } else { "POST" }.into(),
        path: format!(
            "{path} (a route of router mode: start the server with --models-dir or --models-preset)"
        ),
    }
}

async fn model_field(state: &AppState, body: RequestBody) -> Result<String, ApiError> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: String,
    }
    let bytes = read_bytes(body, state.config().body_limit).await?;
    Ok(parse_json::<Named>(&bytes)?.model)
}

fn known(router: &Router) -> String {
    let names: Vec<String> = router.snapshot().into_iter().map(|m| m.spec.name).collect();
    names.join(", ")
}

/// The decoded value of `name` in a query string.
fn query_param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| percent_decode(v))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| Some((hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?)))
            .flatten();
        match escaped {
            Some((high, low)) => {
                out.push(high * 16 + low);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_labels() {
        assert_eq!(
            query_param("a=1&model=org%2Fm%3AQ8_0", "model").as_deref(),
            Some("org/m:Q8_0")
        );
        assert_eq!(query_param("reload", "reload").as_deref(), Some(""));
        assert_eq!(query_param("x=%zz", "x").as_deref(), Some("%zz"));
        assert_eq!(
            labelled("a_total 3", "model=\"m\""),
            "a_total{model=\"m\"} 3"
        );
        assert_eq!(
            labelled("v{model_name=\"m\"} 1", "model=\"m\""),
            "v{model=\"m\",model_name=\"m\"} 1"
        );
    }
}
