//! `GET /v1/models`: the one model this server runs, under its first name with every name in
//! `aliases` and its `tags`, as llama-server lists it, with llama-server's `meta` extension;
//! `GET /v1/models/{id}`: it under that name, in OpenAI's retrieve shape.

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
    /// llama-server's extension: every name the model answers to (`--alias`).
    aliases: Vec<String>,
    /// llama-server's extension: `--tags`.
    tags: Vec<String>,
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

/// The card of the loaded model under the name `id`.
fn card(state: &AppState, id: String) -> Result<ModelCard, ApiError> {
    let info = state.engine()?.info();
    Ok(ModelCard {
        id,
        object: "model",
        created: unix_now(),
        owned_by: "mlxcel",
        aliases: state.config().aliases.clone(),
        tags: state.config().tags.clone(),
        meta: ModelMeta {
            n_ctx_train: info.window,
            n_vocab: info.vocab_size,
            n_params: info.parameters,
            size: info.weight_bytes,
            backend: info.backend.as_str(),
        },
    })
}

/// `GET /v1/models`: one card, under the name replies carry (the first `--alias`, else the
/// model's own name).
pub fn models(state: &AppState) -> Result<Response<Body>, ApiError> {
    let name = state.model_name(state.engine()?.info());
    let list = ModelList {
        object: "list",
        data: vec![card(state, name)?],
    };
    Ok(crate::body::json(StatusCode::OK, &list))
}

/// `GET /v1/models/{id}` (`id` percent-encoded, as clients send a name with `/`): the model
/// under that name when the server serves it (any name unless `--strict-model-names`), else 404
/// `model_not_found`.
pub fn model(state: &AppState, id: &str) -> Result<Response<Body>, ApiError> {
    let id = percent_decoded(id);
    state.check_model(state.engine()?.info(), Some(&id))?;
    Ok(crate::body::json(StatusCode::OK, &card(state, id)?))
}

/// `text` with its `%XX` escapes decoded (an escape that is not one stays as written).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_percent_decoded() {
        assert_eq!(super::percent_decoded("org%2Fmodel"), "org/model");
        assert_eq!(super::percent_decoded("gpt-4o"), "gpt-4o");
        assert_eq!(super::percent_decoded("a%zz%2"), "a%zz%2");
    }
}
