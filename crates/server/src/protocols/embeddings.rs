//! Embeddings: OpenAI's `POST /v1/embeddings` and llama-server's `POST /embedding` and
//! `POST /embeddings`. Each input is tokenized (with the tokenizer's special tokens, as
//! llama-server does), run through the loaded model, and its final hidden states pooled
//! (`--pooling`, default mean) and normalized (`--embd-normalize`, default euclidean; the request's
//! `embd_normalize` wins).

use std::sync::Arc;

use hyper::{Response, StatusCode};
use mlxcel_engine::{Normalize, Pooling};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::body::Body;
use crate::error::ApiError;
use crate::read::RequestBody;
use crate::read::read_json;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    input: Option<Value>,
    /// llama-server's spelling (its answer is then llama-server's shape).
    content: Option<Value>,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
    embd_normalize: Option<i32>,
    model: Option<String>,
    /// OpenAI's end-user id: accepted, not used (no per-user policy here).
    #[allow(dead_code)]
    user: Option<String>,
}

/// Which answer shape the route gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Llama,
}

#[derive(Serialize)]
struct OpenAiList {
    object: &'static str,
    data: Vec<OpenAiEmbedding>,
    model: String,
    usage: Usage,
}

#[derive(Serialize)]
struct OpenAiEmbedding {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct LlamaEmbedding {
    index: usize,
    /// One vector per token with pooling `none`, else one vector.
    embedding: Vec<Vec<f32>>,
}

/// The inputs as token lists: a string, a list of strings, token ids, or lists of token ids.
fn inputs(
    value: Value,
    engine: &mlxcel_engine::Engine,
    field: &str,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            field,
            format!(
                "{field} must be a string, a list of strings, token ids, lists of token ids, or \
                 {{\"content\": [text parts]}} objects"
            ),
        )
    };
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let text = |s: &str| -> Result<Vec<u32>, ApiError> {
        engine
            .tokenizer()
            .encode(s, true, true)
            .map_err(|e| ApiError::from(mlxcel_engine::EngineError::from(e)))
    };
    let list = match value {
        Value::String(s) => vec![text(&s)?],
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![ids(&items).ok_or_else(bad)?]
        }
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => text(&s),
                Value::Array(inner) => ids(&inner).ok_or_else(bad),
                // llama-server's prompt object: `{"content": [{"type": "text", "text"}, ...]}`,
                // the texts joined (another part type, an image, is refused).
                Value::Object(object) => match object.get("content") {
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .map(|part| match (part["type"].as_str(), part["text"].as_str()) {
                            (Some("text"), Some(t)) => Some(t),
                            _ => None,
                        })
                        .collect::<Option<String>>()
                        .ok_or_else(|| {
                            ApiError::invalid_param(
                                field,
                                format!("{field}: content parts must be of type `text` (this model takes text only)"),
                            )
                        })
                        .and_then(|joined| text(&joined)),
                    _ => Err(bad()),
                },
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    if list.is_empty() {
        return Err(ApiError::invalid_param(
            field,
            format!("{field} must not be empty"),
        ));
    }
    if let Some(i) = list.iter().position(Vec::is_empty) {
        return Err(ApiError::invalid_param(
            field,
            format!("{field}[{i}] is empty"),
        ));
    }
    Ok(list)
}

/// An embeddings body parsed as [`embeddings`] parses it (its inputs need the tokenizer).
pub(crate) fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    crate::read::parse_json::<EmbeddingRequest>(bytes).map(drop)
}

/// `POST /v1/embeddings`, `POST /embedding`, `POST /embeddings`.
pub async fn embeddings(
    state: &Arc<AppState>,
    body: RequestBody,
    shape: Shape,
) -> Result<Response<Body>, ApiError> {
    let request: EmbeddingRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), request.model.as_deref())?;
    // llama-server answers `content` in its own shape whatever the route.
    let (value, field, shape) = match (request.input, request.content) {
        (Some(input), _) => (input, "input", shape),
        (None, Some(content)) => (content, "content", Shape::Llama),
        (None, None) => {
            return Err(ApiError::invalid_param(
                "input",
                "\"input\" or \"content\" must be provided",
            ));
        }
    };
    let as_base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("encoding_format `{other}`: expected float or base64"),
            ));
        }
    };
    let hidden = engine.info().hidden_size;
    if let Some(d) = request.dimensions.filter(|&d| d != hidden) {
        return Err(ApiError::invalid_param(
            "dimensions",
            format!("dimensions={d}: this model's embeddings have {hidden} (no shortening)"),
        ));
    }
    let config = state.config();
    let pooling = config.pooling;
    if shape == Shape::OpenAi && pooling == Pooling::None {
        return Err(ApiError::invalid_param(
            "input",
            "pooling `none` (one vector per token) has no OpenAI shape: use /embeddings, or start \
             the server with another --pooling",
        ));
    }
    let normalize = Normalize(request.embd_normalize.unwrap_or(config.embd_normalize));
    let lists = inputs(value, &engine, field)?;
    let prompt_tokens: usize = lists.iter().map(Vec::len).sum();
    let vectors = tokio::task::spawn_blocking(move || {
        lists
            .into_iter()
            .map(|tokens| engine.embed(tokens, pooling, normalize))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::Internal(format!("embedding task failed: {e}")))??;
    let model = state.model_name(state.engine()?.info());
    let body = match shape {
        Shape::OpenAi => serde_json::to_value(OpenAiList {
            object: "list",
            data: vectors
                .into_iter()
                .enumerate()
                .map(|(index, mut v)| {
                    let vector = v.swap_remove(0);
                    OpenAiEmbedding {
                        object: "embedding",
                        index,
                        embedding: if as_base64 {
                            let bytes: Vec<u8> =
                                vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                            Vector::Base64(base64(&bytes))
                        } else {
                            Vector::Floats(vector)
                        },
                    }
                })
                .collect(),
            model,
            usage: Usage {
                prompt_tokens,
                total_tokens: prompt_tokens,
            },
        }),
        Shape::Llama => serde_json::to_value(
            vectors
                .into_iter()
                .enumerate()
                .map(|(index, embedding)| LlamaEmbedding { index, embedding })
                .collect::<Vec<_>>(),
        ),
    }
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(crate::body::json(StatusCode::OK, &body))
}

/// Standard base64 with padding (OpenAI's `encoding_format: base64`: the little-endian f32 bytes).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
