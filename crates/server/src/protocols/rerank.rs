//! Reranking: llama-server's `POST /rerank` (also `/reranking`, `/v1/rerank`, `/v1/reranking`),
//! served when the server was started with `--reranking` over a reranker model (a classification
//! head, [`mlxcel_model::RankHead`]). Each document is put together with the query by the
//! model's rerank prompt (GGUF `tokenizer.chat_template.rerank`, tokenized without added special
//! tokens and with special tokens parsed, as llama-server does) or, for an encoder (a BERT
//! cross-encoder), as `[CLS] query [SEP] document [SEP]` from its vocabulary's flags
//! ([`mlxcel_engine::Engine::rank_pair`]); run through the model, and scored by the head
//! ([`mlxcel_engine::Engine::rank`]); the results come back best first.
//!
//! Two answer shapes, as llama-server's: Jina's (`documents`: `results` of `index` and
//! `relevance_score`, with `usage`) and, when the body has `texts`, Hugging Face TEI's (an array
//! of `index` and `score`). `top_n` keeps the best n; `return_text` adds each document's text
//! (TEI's `text`; Jina's `document: {"text"}`).

use std::sync::Arc;

use hyper::{Response, StatusCode};
use mlxcel_engine::{Engine, EngineError};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::body::Body;
use crate::error::ApiError;
use crate::read::{RequestBody, read_json};
use crate::state::AppState;

/// llama-server's answer when the server was not started for reranking.
pub const NOT_STARTED: &str = "This server does not support reranking. Start it with `--reranking`";

#[derive(Debug, Deserialize)]
struct RerankRequest {
    query: Option<Value>,
    documents: Option<Value>,
    /// TEI's spelling of `documents`; its presence picks TEI's answer shape.
    texts: Option<Value>,
    top_n: Option<Value>,
    return_text: Option<bool>,
    model: Option<String>,
}

/// A rerank body parsed as [`rerank`] parses it.
pub(crate) fn check_body(bytes: &[u8]) -> Result<(), ApiError> {
    crate::read::parse_json::<RerankRequest>(bytes).map(drop)
}

/// Whether `engine` can serve the reranking routes: a model with a classification head, on a
/// backend that returns hidden states. The server checks it when it loads the model with
/// `--reranking`, so a wrong model stops it at start, not at its first request.
pub fn can_rerank(engine: &Engine) -> Result<(), EngineError> {
    if engine.rank_head().is_none() {
        return Err(EngineError::NotAReranker);
    }
    if engine.info().backend == mlxcel_engine::BackendKind::Xla {
        return Err(EngineError::Unsupported {
            what: "reranking (--reranking)".into(),
            backend: engine.info().backend.as_str(),
            reason: "its programs return logits only, not the hidden states a classification \
                     head reads: use the mlx backend",
        });
    }
    Ok(())
}

/// The request's documents: a non-empty array of strings.
fn documents(value: Option<Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid_param(
            "documents",
            "\"documents\" must be a non-empty string array",
        )
    };
    match value {
        Some(Value::Array(items)) if !items.is_empty() => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s),
                _ => Err(bad()),
            })
            .collect(),
        _ => Err(bad()),
    }
}

/// `top_n`: how many of the best results to return (all without it).
fn top_n(value: Option<Value>, documents: usize) -> Result<usize, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(documents),
        Some(v) => v
            .as_u64()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX).min(documents))
            .ok_or_else(|| {
                ApiError::invalid_param(
                    "top_n",
                    format!("top_n must be a non-negative integer, not {v}"),
                )
            }),
    }
}

/// `POST /rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`.
pub async fn rerank(state: &Arc<AppState>, body: RequestBody) -> Result<Response<Body>, ApiError> {
    if !state.config().reranking {
        return Err(ApiError::NotImplemented(NOT_STARTED.into()));
    }
    let request: RerankRequest = read_json(body, state.config().body_limit).await?;
    let engine = state.awake_engine().await?;
    state.check_model(engine.info(), request.model.as_deref())?;
    can_rerank(&engine)?;
    let query = match request.query {
        Some(Value::String(q)) => q,
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_param(
                "query",
                "\"query\" must be provided",
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "query",
                "\"query\" must be a string",
            ));
        }
    };
    let tei = request.texts.is_some();
    let documents = documents(request.documents.or(request.texts))?;
    let top_n = top_n(request.top_n, documents.len())?;
    let head = engine.rank_head().ok_or(EngineError::NotAReranker)?;
    // A rerank prompt (a decoder's template) is tokenized with special tokens parsed; an
    // encoder without one puts the pair together from its vocabulary's special tokens.
    let lists = documents
        .iter()
        .map(|document| match head.prompt(&query, document) {
            Some(prompt) => engine
                .tokenizer()
                .encode(&prompt, false, true)
                .map_err(|e| ApiError::from(EngineError::from(e))),
            None => engine.rank_pair(&query, document).ok_or_else(|| {
                ApiError::NotImplemented(
                    "this reranker has no rerank prompt (GGUF `tokenizer.chat_template.rerank`); \
                     pairs put together from the vocabulary's separators are supported for \
                     encoder models (BERT) only"
                        .into(),
                )
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let prompt_tokens: usize = lists.iter().map(Vec::len).sum();
    let ranker = engine.clone();
    let scores = tokio::task::spawn_blocking(move || {
        lists
            .into_iter()
            .map(|tokens| ranker.rank(tokens))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::Internal(format!("rerank task failed: {e}")))?
    .map_err(|err| match err {
        EngineError::InputTooLong { .. } => ApiError::invalid_param("documents", err.to_string()),
        other => ApiError::from(other),
    })?;
    let mut order: Vec<usize> = (0..documents.len()).collect();
    // Best first; equal scores keep the documents' order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n);
    let return_text = request.return_text.unwrap_or(false);
    let results: Vec<Value> = order
        .into_iter()
        .map(|index| {
            let mut result = if tei {
                json!({"index": index, "score": scores[index]})
            } else {
                json!({"index": index, "relevance_score": scores[index]})
            };
            if return_text {
                let text = documents[index].clone();
                if tei {
                    result["text"] = Value::String(text);
                } else {
                    result["document"] = json!({ "text": text });
                }
            }
            result
        })
        .collect();
    let body = if tei {
        Value::Array(results)
    } else {
        let model = request
            .model
            .unwrap_or_else(|| state.model_name(engine.info()));
        json!({
            "model": model,
            "object": "list",
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            "results": results,
        })
    };
    Ok(crate::body::json(StatusCode::OK, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_must_be_a_non_empty_string_array() {
        assert_eq!(
            documents(Some(json!(["a", "b"]))).unwrap(),
            ["a".to_owned(), "b".to_owned()]
        );
        for bad in [
            None,
            Some(json!([])),
            Some(Value::Null),
            Some(json!(123)),
            Some(json!([1, 2, 3])),
            Some(json!(["a", 1])),
        ] {
            assert!(documents(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn top_n_is_clamped_to_the_documents_and_refuses_negatives() {
        assert_eq!(top_n(None, 4).unwrap(), 4);
        assert_eq!(top_n(Some(json!(2)), 4).unwrap(), 2);
        assert_eq!(top_n(Some(json!(99)), 4).unwrap(), 4);
        assert!(top_n(Some(json!(-1)), 4).is_err());
        assert!(top_n(Some(json!("2")), 4).is_err());
    }
}
