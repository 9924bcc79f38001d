//! llama-server's status routes: `GET /health`, `/live`, `/props`, `POST /props`, `GET /metrics`.

use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::body::{Body, full, json};
use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Serialize)]
struct HealthResponse {
    status: &'static str,
}

/// `GET /health`, readiness: 503 while the model loads, and while the engine's queue is full
/// (`--max-queue-depth`; a load balancer sends the next request elsewhere), else 200. The error
/// bodies are llama-server's (the status as a number in `code`).
pub fn health(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    // A pipeline that lost a rank answers nothing any more: say so, and why.
    if let Some(fault) = engine.metrics().backend_fault {
        return Err(ApiError::BackendDown(fault));
    }
    let waiting = engine.metrics().waiting;
    let depth = engine.scheduler_config().max_waiting;
    if waiting >= depth {
        return Err(ApiError::QueueFull {
            message: format!(
                "the queue is full: {waiting} requests wait for a slot (--max-queue-depth {depth})"
            ),
            retry_after: state.metrics().retry_after(waiting),
        });
    }
    Ok(json(StatusCode::OK, &HealthResponse { status: "ok" }))
}

/// `GET /live`, liveness: 200 whenever the server answers HTTP, loading or not (a process
/// supervisor restarts a server that stops answering it, not one that is busy or loading).
pub fn live() -> Response<Body> {
    json(StatusCode::OK, &HealthResponse { status: "alive" })
}

#[derive(Debug, Serialize)]
struct Props {
    default_generation_settings: GenerationSettings,
    total_slots: usize,
    /// The `-m` value as given (a GGUF file, a directory, a Hugging Face id), as llama-server
    /// reports its `--model`; the checkpoint's directory when none was given.
    model_path: std::path::PathBuf,
    model_alias: String,
    /// The weight format, as llama.cpp names file types (`Q4_1`; an MLX checkpoint's bits and
    /// group size).
    model_ftype: String,
    n_ctx: usize,
    n_ctx_train: usize,
    /// The checkpoint's chat template, as written (empty when it has none).
    chat_template: String,
    /// What the template renders, by trial renders under llama.cpp's names (of the tool-use
    /// template where the checkpoint has one, as llama-server); absent without a template.
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_template_caps: Option<mlxcel_model::TemplateCaps>,
    /// The checkpoint's separate template for requests with tools; absent when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_template_tool_use: Option<String>,
    /// The texts of the beginning- and end-of-sequence tokens (empty when there is none).
    bos_token: String,
    eos_token: String,
    /// Text only: no image or audio input.
    modalities: Modalities,
    /// The model is never unloaded while idle.
    is_sleeping: bool,
    build_info: &'static str,
    endpoint_slots: bool,
    endpoint_props: bool,
    endpoint_metrics: bool,
    backend: &'static str,
    /// The threads of the MLX backend's CPU kernels ([`kernel_threads`]).
    threads: usize,
    /// The static-shape buckets; `null` on a dynamic backend.
    capacity_buckets: Option<Vec<usize>>,
    /// Whether `GET /` serves the chat page (`--no-webui` turns it off).
    ui: bool,
    /// The chat page's settings the server imposes: none (its settings are the browser's own).
    ui_settings: serde_json::Map<String, serde_json::Value>,
    /// The text that stands for an image or audio clip in a multimodal prompt, as llama.cpp
    /// names it; no media is accepted here (`modalities` are all false).
    media_marker: &'static str,
    /// The web UI's CORS proxy (`/cors-proxy`), which this server does not run.
    cors_proxy_enabled: bool,
}

/// llama.cpp's media marker (it draws a random one per process unless `LLAMA_MEDIA_MARKER` pins
/// it; with no media accepted here, the fixed text its templates document).
const MEDIA_MARKER: &str = "<__media__>";

#[derive(Debug, Serialize)]
struct Modalities {
    vision: bool,
    audio: bool,
}

#[derive(Debug, Serialize)]
struct GenerationSettings {
    n_ctx: usize,
    model: String,
    params: DefaultParams,
}

#[derive(Debug, Serialize)]
struct DefaultParams {
    /// -1: unlimited.
    n_predict: i64,
    temperature: f32,
    /// -1: a fresh seed per request.
    seed: i64,
}

/// The text of the model's beginning- (`bos`) or end-of-sequence token: the chat template's
/// (the tokenizer configuration's), else the tokenizer's own (the first token it prepends to a
/// prompt; the first end-of-sequence id).
fn special_token_text(engine: &mlxcel_engine::Engine, bos: bool) -> String {
    if let Some(template) = engine.chat_template() {
        let text = if bos {
            template.bos_token()
        } else {
            template.eos_token()
        };
        if !text.is_empty() {
            return text.to_owned();
        }
    }
    let tokenizer = engine.tokenizer();
    let id = if bos {
        tokenizer
            .leading_special_tokens()
            .ok()
            .and_then(|t| t.first().copied())
    } else {
        engine.info().eos_token_ids.first().copied()
    };
    id.and_then(|id| tokenizer.id_to_token(id))
        .unwrap_or_default()
}

/// The threads the MLX backend's CPU kernels use, as the backend chooses them: `--threads`, else
/// `MLXCEL_THREADS` (an integer in 1..=1024; another value stops the model from loading), else
/// every core the process may run on (its CPU affinity, as the kernels count them).
fn kernel_threads(flag: Option<usize>) -> usize {
    flag.or_else(|| {
        std::env::var("MLXCEL_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=1024).contains(n))
    })
    .or_else(affinity_cores)
    .or_else(|| std::thread::available_parallelism().ok().map(Into::into))
    .unwrap_or(1)
}

/// The cores in this process's CPU affinity (`Cpus_allowed_list` of `/proc/self/status`, e.g.
/// `0-3,8`), where Linux reports it.
fn affinity_cores() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
    cores_in_list(list.trim())
}

/// The number of cores a CPU list (`0-3,8`) names.
fn cores_in_list(list: &str) -> Option<usize> {
    let mut count = 0;
    for part in list.split(',') {
        count += match part.split_once('-') {
            Some((low, high)) => {
                let (low, high): (usize, usize) = (low.parse().ok()?, high.parse().ok()?);
                high.checked_sub(low)? + 1
            }
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (count > 0).then_some(count)
}

/// `GET /props`.
pub fn props(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let info = engine.info();
    let config = state.config();
    let buckets = state.capacity_buckets(engine);
    let n_ctx = state.context_limit(info);
    let props = Props {
        default_generation_settings: GenerationSettings {
            n_ctx,
            model: state.model_name(info),
            params: DefaultParams {
                n_predict: match config.default_max_new_tokens {
                    mlxcel_engine::MaxNewTokens::Unlimited => -1,
                    mlxcel_engine::MaxNewTokens::Limited(n) => n as i64,
                },
                temperature: config.default_temperature,
                seed: config.default_seed.map_or(-1, |s| s as i64),
            },
        },
        total_slots: config.parallel,
        model_path: config
            .model_arg
            .as_ref()
            .map_or_else(|| info.dir.clone(), std::path::PathBuf::from),
        model_alias: state.model_name(info),
        model_ftype: info.model_ftype.clone(),
        n_ctx,
        n_ctx_train: info.window,
        chat_template: engine.chat_template_source().unwrap_or_default(),
        chat_template_caps: engine
            .chat_template()
            .map(|t| t.tool_use().unwrap_or(t).capabilities()),
        chat_template_tool_use: engine
            .chat_template()
            .and_then(|t| t.tool_use())
            .map(|t| t.source()),
        bos_token: special_token_text(engine, true),
        eos_token: special_token_text(engine, false),
        modalities: Modalities {
            vision: false,
            audio: false,
        },
        is_sleeping: state.is_sleeping(),
        build_info: concat!("mlxcel-", env!("CARGO_PKG_VERSION")),
        endpoint_slots: config.slots,
        endpoint_props: config.props,
        endpoint_metrics: config.metrics,
        backend: info.backend.as_str(),
        threads: kernel_threads(config.threads),
        capacity_buckets: (!buckets.is_empty()).then_some(buckets),
        ui: config.webui,
        ui_settings: serde_json::Map::new(),
        media_marker: MEDIA_MARKER,
        cors_proxy_enabled: config.agent.proxy,
    };
    Ok(json(StatusCode::OK, &props))
}

#[derive(Debug, Serialize)]
struct SetPropsResponse {
    success: bool,
}

/// `POST /props` (with `--props`): llama-server changes no property through it yet, and
/// neither does mlxcel; without the flag, 501 as llama-server answers.
pub fn set_props(state: &AppState) -> Result<Response<Body>, ApiError> {
    if !state.config().props {
        return Err(ApiError::NotImplemented(
            "This server does not support changing global properties. Start it with `--props`"
                .into(),
        ));
    }
    Ok(json(StatusCode::OK, &SetPropsResponse { success: true }))
}

/// `GET /metrics` (with `--metrics`), with llama-server's `Process-Start-Time-Unix` header (the
/// server's start, in seconds since the Unix epoch, so that a scraper can tell a restart).
pub fn metrics(state: &AppState) -> Result<Response<Body>, ApiError> {
    if !state.config().metrics {
        return Err(ApiError::NotImplemented(
            "the metrics endpoint is off; start the server with --metrics".into(),
        ));
    }
    let text = state.render_metrics();
    let mut response = full(StatusCode::OK, "text/plain; version=0.0.4", text);
    response.headers_mut().insert(
        "process-start-time-unix",
        hyper::header::HeaderValue::from(state.started_unix()),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count_their_cores() {
        assert_eq!(cores_in_list("0-3,8"), Some(5));
        assert_eq!(cores_in_list("0"), Some(1));
        assert_eq!(cores_in_list("3-1"), None);
        assert_eq!(cores_in_list(""), None);
        assert_eq!(kernel_threads(Some(3)), 3);
        assert!(kernel_threads(None) >= 1);
    }
}
