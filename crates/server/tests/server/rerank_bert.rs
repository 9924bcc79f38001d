//! Reranking with a BERT cross-encoder (`--reranking` over a `bert` GGUF): a tiny random
//! reranker written here (`mlxcel_model::encoder::write_tiny_bert`, no download) served on
//! `/rerank`. Each score is the head applied by hand to the `[CLS]` state of the pair
//! `[CLS] query [SEP] document [SEP]`, the results come best first, and generation on the
//! encoder is refused naming it.

use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use mlxcel_engine::{Engine, EngineOptions, Normalize, Pooling};
use mlxcel_model::encoder::{BertCheckpoint, TinyBert, write_tiny_bert};
use mlxcel_server::ServerConfig;
use serde_json::json;

use crate::support::*;

/// The tiny BERT reranker (with a `cls` pooler before its output), loaded once.
fn bert() -> &'static (tempfile::TempDir, Arc<Engine>, BertCheckpoint) {
    static ENGINE: OnceLock<(tempfile::TempDir, Arc<Engine>, BertCheckpoint)> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-bert-reranker.gguf");
        let spec = TinyBert {
            pooler: true,
            seed: 7,
            ..TinyBert::default()
        };
        write_tiny_bert(&path, &spec).unwrap();
        let engine = Engine::load(path.to_str(), EngineOptions::default()).unwrap();
        let checkpoint = BertCheckpoint::open(&path).unwrap();
        (dir, Arc::new(engine), checkpoint)
    })
}

const DOCUMENTS: [&str; 4] = [
    "the cat sat on the mat",
    "Paris is the capital of France.",
    "a dog running, 中文 café",
    "unknown words: zebra!",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bert_reranker_scores_pairs_with_its_head_best_first() {
    let engine = tokio::task::spawn_blocking(|| bert().1.clone())
        .await
        .unwrap();
    let checkpoint = &bert().2;
    let head = checkpoint.head.as_ref().expect("a reranker");
    let query = "what is the capital of France?";
    let expected: Vec<(f64, usize)> = DOCUMENTS
        .iter()
        .map(|d| {
            let tokens = checkpoint.vocab.rerank_pair(query, d);
            assert_eq!(tokens.first(), Some(&2), "[CLS] first");
            assert_eq!(tokens.last(), Some(&3), "[SEP] last");
            let n = tokens.len();
            let cls = engine
                .embed(tokens, Pooling::Cls, Normalize(-1))
                .unwrap()
                .remove(0);
            (head.score(&[cls]).unwrap(), n)
        })
        .collect();
    let config = ServerConfig {
        reranking: true,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, Some(engine.clone())).await;
    let reply = server
        .post_json("/rerank", json!({"query": query, "documents": DOCUMENTS}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), DOCUMENTS.len());
    let mut previous = f64::INFINITY;
    let mut scores = Vec::new();
    for result in results {
        let index = result["index"].as_u64().unwrap() as usize;
        let score = result["relevance_score"].as_f64().unwrap();
        let want = expected[index].0;
        assert!(
            (score - want).abs() <= 1e-5,
            "document {index}: {score} against {want} by hand"
        );
        assert!(score <= previous, "best first: {results:?}");
        previous = score;
        scores.push(score);
    }
    // Random weights still tell the documents apart.
    assert!(scores.first() > scores.last(), "{scores:?}");
    let tokens: usize = expected.iter().map(|e| e.1).sum();
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(tokens as u64));
    // top_n and return_text as for any reranker.
    let reply = server
        .post_json(
            "/v1/rerank",
            json!({"query": query, "documents": DOCUMENTS, "top_n": 1, "return_text": true}),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["results"].as_array().unwrap().len(), 1);
    assert!(body["results"][0]["document"]["text"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_on_a_bert_encoder_is_refused_naming_it() {
    let engine = tokio::task::spawn_blocking(|| bert().1.clone())
        .await
        .unwrap();
    let server = TestServer::start(ServerConfig::default(), Some(engine)).await;
    let reply = server
        .post_json("/completion", json!({"prompt": "the cat", "n_predict": 4}))
        .await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED, "{}", reply.body);
    assert!(reply.body.contains("encoder"), "{}", reply.body);
    // Its tokenizer is llama.cpp's WPM over the GGUF vocabulary.
    let reply = server
        .post_json("/tokenize", json!({"content": "The cat sat"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["tokens"], json!([5, 6, 7]));
    // Embeddings: [CLS] text [SEP] through the encoder, pooled by --pooling (mean here).
    let reply = server
        .post_json("/embedding", json!({"content": "the cat sat"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let vector = &reply.json()[0]["embedding"][0];
    assert_eq!(vector.as_array().map(Vec::len), Some(32), "{vector}");
}
