//! Reranking (`--reranking`): llama-server's `/rerank`, `/reranking`, `/v1/rerank` and
//! `/v1/reranking` on a reranker made here from the default model's GGUF (its weights and
//! vocabulary, plus what llama.cpp's converter writes for a reranker: `cls.output.weight`, rank
//! pooling, the output labels and a rerank prompt). Each score is checked against the head
//! applied by hand to the model's final hidden state of the pair's prompt; the shapes (Jina's and
//! TEI's), `top_n`, `return_text`, usage and the refusals against llama-server's.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use mlxcel_engine::{Engine, EngineOptions, Normalize, Pooling};
use mlxcel_model::gguf::{GgmlType, GgufFile, GgufValue, GgufWriter};
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

const PROMPT: &str = "<|im_start|>system\nJudge the document.<|im_end|>\n<|im_start|>user\n\
                      <Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n";

/// The head's two rows over the default model's 576 hidden values: fixed, varied values.
fn head_rows(hidden: usize) -> Vec<f32> {
    (0..2 * hidden)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 400.0)
        .collect()
}

/// Writes the reranker GGUF into `dir`: the default model's metadata and tensors, unchanged, plus
/// the head and the keys llama.cpp's converter writes for a reranker.
fn write_reranker(dir: &Path) -> PathBuf {
    let model_dir = mlxcel_model::resolve_model(None).unwrap();
    let weights = mlxcel_model::GgufWeights::read(&model_dir)
        .unwrap()
        .expect("the default model is read from its GGUF");
    let source = GgufFile::open(&weights.gguf).unwrap();
    let arch = source
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap()
        .to_owned();
    let hidden = source
        .get(&format!("{arch}.embedding_length"))
        .and_then(GgufValue::as_u64)
        .unwrap() as usize;
    let mut w = GgufWriter::new();
    for (key, value) in &source.metadata {
        w.metadata(key, value.clone());
    }
    w.metadata(&format!("{arch}.pooling_type"), GgufValue::U32(4))
        .metadata(
            &format!("{arch}.classifier.output_labels"),
            GgufValue::Array(vec![
                GgufValue::String("yes".into()),
                GgufValue::String("no".into()),
            ]),
        )
        .metadata(
            "tokenizer.chat_template.rerank",
            GgufValue::String(PROMPT.into()),
        );
    for info in &source.tensors {
        let data = source.tensor_data(info).unwrap().to_vec();
        w.tensor(&info.name, &info.dims, info.ggml_type, data);
    }
    let rows: Vec<u8> = head_rows(hidden)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    w.tensor(
        "cls.output.weight",
        &[hidden as u64, 2],
        GgmlType::F32,
        rows,
    );
    let path = dir.join("tiny-reranker.gguf");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    w.write(&mut file).unwrap();
    path
}

/// The reranker, loaded once for every test of the binary.
fn reranker() -> Arc<Engine> {
    // The directory lives as long as the engine, which reads the GGUF's tensors as it loads.
    static ENGINE: OnceLock<(tempfile::TempDir, Arc<Engine>)> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = write_reranker(dir.path());
            let engine = Engine::load(path.to_str(), EngineOptions::default()).unwrap();
            (dir, Arc::new(engine))
        })
        .1
        .clone()
}

async fn server(reranking: bool) -> TestServer {
    let engine = tokio::task::spawn_blocking(reranker).await.unwrap();
    let config = ServerConfig {
        reranking,
        ..ServerConfig::default()
    };
    TestServer::start(config, Some(engine)).await
}

/// The score the head gives `document`, computed here from the model's last hidden state.
fn expected_score(engine: &Engine, query: &str, document: &str) -> (f64, usize) {
    let prompt = PROMPT
        .replace("{query}", query)
        .replace("{document}", document);
    let tokens = engine.tokenizer().encode(&prompt, false, true).unwrap();
    let n = tokens.len();
    let state = engine
        .embed(tokens, Pooling::Last, Normalize(-1))
        .unwrap()
        .remove(0);
    let rows = head_rows(state.len());
    let score = state
        .iter()
        .zip(&rows[..state.len()])
        .map(|(&h, &w)| f64::from(h) * f64::from(w))
        .sum();
    (score, n)
}

const DOCUMENTS: [&str; 4] = [
    "A machine is a physical system that uses power to apply forces.",
    "Learning is the process of acquiring new understanding.",
    "Machine learning is a field of study in artificial intelligence.",
    "Paris, capitale de la France, est une grande ville européenne.",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_scores_each_document_with_the_head_best_first() {
    if skip_model_tests() {
        return;
    }
    let server = server(true).await;
    let engine = reranker();
    let query = "Machine learning is";
    let expected: Vec<(f64, usize)> = DOCUMENTS
        .iter()
        .map(|d| expected_score(&engine, query, d))
        .collect();
    for route in ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"] {
        let reply = server
            .post_json(route, json!({"query": query, "documents": DOCUMENTS}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{route}: {}", reply.body);
        let body = reply.json();
        assert_eq!(body["object"], "list");
        let results = body["results"].as_array().unwrap();
        assert_eq!(results.len(), 4);
        let mut previous = f64::INFINITY;
        let mut seen = Vec::new();
        for result in results {
            let index = result["index"].as_u64().unwrap() as usize;
            let score = result["relevance_score"].as_f64().unwrap();
            let want = expected[index].0;
            assert!(
                (score - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{route}: document {index}: {score} against {want} by hand"
            );
            assert!(score <= previous, "best first: {results:?}");
            previous = score;
            seen.push(index);
        }
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3]);
        let tokens: usize = expected.iter().map(|e| e.1).sum();
        assert_eq!(
            (
                body["usage"]["prompt_tokens"].as_u64(),
                body["usage"]["total_tokens"].as_u64()
            ),
            (Some(tokens as u64), Some(tokens as u64))
        );
        assert!(body["model"].is_string());
        assert!(results[0].get("document").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_tei_shape_top_n_and_return_text() {
    if skip_model_tests() {
        return;
    }
    let server = server(true).await;
    let query = "Machine learning is";
    // TEI's `texts`: a bare array of `index` and `score`, the text with `return_text`.
    let tei = server
        .post_json(
            "/rerank",
            json!({"query": query, "texts": DOCUMENTS, "top_n": 2, "return_text": true}),
        )
        .await;
    assert_eq!(tei.status, StatusCode::OK, "{}", tei.body);
    let tei = tei.json();
    let items = tei.as_array().unwrap();
    assert_eq!(items.len(), 2);
    for item in items {
        let index = item["index"].as_u64().unwrap() as usize;
        assert!(item["score"].is_f64());
        assert_eq!(item["text"], DOCUMENTS[index]);
    }
    // Jina's shape keeps the best `top_n`, the same order as without it; `return_text` gives
    // `document.text`.
    let all = server
        .post_json(
            "/v1/rerank",
            json!({"query": query, "documents": DOCUMENTS}),
        )
        .await
        .json();
    for (top_n, expected) in [
        (Value::Null, 4),
        (json!(0), 0),
        (json!(3), 3),
        (json!(99), 4),
    ] {
        let reply = server
            .post_json(
                "/v1/rerank",
                json!({"query": query, "documents": DOCUMENTS, "top_n": top_n,
                       "return_text": true}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        let results = reply.json()["results"].as_array().unwrap().clone();
        assert_eq!(results.len(), expected, "top_n {top_n}");
        for (got, best) in results.iter().zip(all["results"].as_array().unwrap()) {
            assert_eq!(got["index"], best["index"]);
            let index = got["index"].as_u64().unwrap() as usize;
            assert_eq!(got["document"]["text"], DOCUMENTS[index]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_refusals_match_llama_server() {
    if skip_model_tests() {
        return;
    }
    let server = server(true).await;
    for documents in [json!([]), Value::Null, json!(123), json!([1, 2, 3])] {
        let reply = server
            .post_json(
                "/rerank",
                json!({"query": "Machine learning is", "documents": documents}),
            )
            .await;
        let error = reply.error(StatusCode::BAD_REQUEST);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("non-empty string array"),
            "{error}"
        );
    }
    let no_query = server
        .post_json("/rerank", json!({"documents": ["a"]}))
        .await;
    assert!(
        no_query.error(StatusCode::BAD_REQUEST)["message"]
            .as_str()
            .unwrap()
            .contains("\"query\" must be provided")
    );
    let bad_query = server
        .post_json("/rerank", json!({"query": 1, "documents": ["a"]}))
        .await;
    assert!(
        bad_query.error(StatusCode::BAD_REQUEST)["message"]
            .as_str()
            .unwrap()
            .contains("\"query\" must be a string")
    );
    let bad_top_n = server
        .post_json(
            "/rerank",
            json!({"query": "q", "documents": ["a"], "top_n": -1}),
        )
        .await;
    bad_top_n.error(StatusCode::BAD_REQUEST);

    // Without --reranking the routes answer llama-server's 501.
    let off = server_off().await;
    let reply = off
        .post_json("/rerank", json!({"query": "q", "documents": ["a"]}))
        .await;
    assert!(
        reply.error(StatusCode::NOT_IMPLEMENTED)["message"]
            .as_str()
            .unwrap()
            .contains("Start it with `--reranking`"),
        "{}",
        reply.body
    );
}

async fn server_off() -> TestServer {
    server(false).await
}

/// A model without a head is refused by name, whether a request asks or `--reranking` loads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_head_is_not_a_reranker() {
    if skip_model_tests() {
        return;
    }
    let plain = tokio::task::spawn_blocking(engine).await.unwrap();
    let err = mlxcel_server::can_rerank(&plain).unwrap_err();
    assert!(err.to_string().contains("not a reranker"), "{err}");
    let config = ServerConfig {
        reranking: true,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, Some(plain)).await;
    let reply = server
        .post_json("/rerank", json!({"query": "q", "documents": ["a"]}))
        .await;
    assert!(
        reply.error(StatusCode::NOT_IMPLEMENTED)["message"]
            .as_str()
            .unwrap()
            .contains("not a reranker"),
        "{}",
        reply.body
    );
}
