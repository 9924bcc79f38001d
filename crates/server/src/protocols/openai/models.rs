//! `GET /v1/models`: the one model this server runs, with llama-server's `meta` extension.

use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::body::Body;
use crate::error::ApiError;
use crate::generate::unix_now;
use crate::state::AppState;

#[derive(Serialize)]
struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

#[derive(Serialize)]
struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    /// llama-server's extension: what the model is.
    meta: ModelMeta,
}

#[derive(Serialize)]
struct ModelMeta {
    n_ctx_train: usize,
    n_vocab: usize,
    n_params: u64,
    size: u64,
    backend: &'static str,
}

/// `GET /v1/models`.
pub fn models(state: &AppState) -> Result<Response<Body>, ApiError> {
    let engine = state.engine()?;
    let info = engine.info();
    let list = ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name(info),
            object: "model",
            created: unix_now(),
            owned_by: "mlxcel",
            meta: ModelMeta {
                n_ctx_train: info.window,
                n_vocab: info.vocab_size,
                n_params: info.parameters,
                size: info.weight_bytes,
                backend: info.backend.as_str(),
            },
        }],
    };
    Ok(crate::body::json(StatusCode::OK, &list))
}
