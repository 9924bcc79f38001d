//! llama-server's `GET /lora-adapters` (the loaded adapters, each with its id, path, global
//! scale, `task_name` and `prompt_prefix`) and `POST /lora-adapters` (sets the global scales:
//! the listed ids at their scale, every other adapter at 0, as llama-server does).

use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::Value;

use crate::body::{Body, json};
use crate::error::ApiError;
use crate::lora::{parse_lora_list, scales_of};
use crate::read::RequestBody;
use crate::state::AppState;

#[derive(Debug, Serialize)]
struct AdapterEntry {
    id: usize,
    path: String,
    scale: f32,
    task_name: String,
    prompt_prefix: String,
}

/// `GET /lora-adapters`.
pub fn get_lora_adapters(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let scales = state.lora_scales();
    let entries: Vec<AdapterEntry> = engine
        .lora_adapters()
        .iter()
        .enumerate()
        .map(|(id, adapter)| AdapterEntry {
            id,
            path: adapter.path.display().to_string(),
            scale: scales.get(id).copied().unwrap_or(0.0),
            task_name: adapter.task_name.clone(),
            prompt_prefix: adapter.prompt_prefix.clone(),
        })
        .collect();
    Ok(json(StatusCode::OK, &entries))
}

/// The body of `POST /lora-adapters`: a JSON array of `{id, scale}`.
pub fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    parse_body(bytes).map(|_| ())
}

fn parse_body(bytes: &[u8]) -> Result<crate::lora::LoraList, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    if !value.is_array() {
        return Err(ApiError::bad_request("Request body must be an array"));
    }
    parse_lora_list(&value, "lora-adapters")
}

#[derive(Debug, Serialize)]
struct Success {
    success: bool,
}

/// `POST /lora-adapters`.
pub async fn post_lora_adapters(
    state: &AppState,
    body: RequestBody,
) -> Result<Response<Body>, ApiError> {
    let bytes = crate::read::read_bytes(body, state.config().body_limit).await?;
    let list = parse_body(&bytes)?;
    let engine = state.engine()?;
    let scales = scales_of(&list, engine.lora_adapters().len(), "lora-adapters")?;
    state.set_lora_scales(scales);
    Ok(json(StatusCode::OK, &Success { success: true }))
}
