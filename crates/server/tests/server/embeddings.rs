//! The embedding routes: OpenAI's `/v1/embeddings` (strings, token ids, batches, base64) and
//! llama-server's `/embedding` and `/embeddings` (its own shape), with `--pooling` and
//! `--embd-normalize`, and their refusals.

use hyper::StatusCode;
use mlxcel_engine::Pooling;
use mlxcel_server::ServerConfig;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedding_routes_answer_in_each_shape() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let reply = server
        .post_json(
            "/v1/embeddings",
            json!({"input": ["hello world", "goodbye"]}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(
        (data[1]["index"].as_u64(), data[1]["object"].as_str()),
        (Some(1), Some("embedding"))
    );
    let vector: Vec<f64> = data[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(vector.len(), 576);
    let norm: f64 = vector.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() >= 3);

    // Token ids embed like the text they spell; base64 is the little-endian f32 bytes.
    let ids = server
        .post_json("/tokenize", json!({"content": "hello world"}))
        .await
        .json()["tokens"]
        .clone();
    let by_ids = server
        .post_json(
            "/v1/embeddings",
            json!({"input": ids, "encoding_format": "base64"}),
        )
        .await
        .json();
    let encoded = by_ids["data"][0]["embedding"].as_str().unwrap().to_owned();
    // 576 floats = 2304 bytes = 768 base64 groups of four characters, no padding.
    assert_eq!(encoded.len(), 2304 / 3 * 4, "{encoded}");

    // `embd_normalize` -1: the raw mean, not unit length.
    let raw = server
        .post_json(
            "/v1/embeddings",
            json!({"input": "hello world", "embd_normalize": -1}),
        )
        .await
        .json();
    let raw_norm: f64 = raw["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap().powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((raw_norm - 1.0).abs() > 0.01, "{raw_norm}");

    // llama-server's shape: `content`, a list of {index, embedding: [[...]]}.
    let reply = server
        .post_json("/embedding", json!({"content": "hi there"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body[0]["index"], 0);
    assert_eq!(body[0]["embedding"][0].as_array().unwrap().len(), 576);

    for (request, param) in [
        (json!({"input": "x", "dimensions": 8}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": []}), "input"),
        (json!({}), "input"),
    ] {
        let reply = server.post_json("/v1/embeddings", request).await;
        assert_eq!(
            reply.error(StatusCode::BAD_REQUEST)["param"],
            param,
            "{}",
            reply.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooling_none_gives_a_vector_per_token() {
    if skip_model_tests() {
        return;
    }
    let config = ServerConfig {
        pooling: Pooling::None,
        embd_normalize: -1,
        ..ServerConfig::default()
    };
    let server = TestServer::with_model(config).await;
    let tokens = server
        .post_json("/tokenize", json!({"content": "one two three"}))
        .await
        .json()["tokens"]
        .as_array()
        .unwrap()
        .len();
    let body = server
        .post_json("/embeddings", json!({"content": "one two three"}))
        .await
        .json();
    assert_eq!(body[0]["embedding"].as_array().unwrap().len(), tokens);
    // OpenAI's shape has no per-token form.
    let reply = server
        .post_json("/v1/embeddings", json!({"input": "x"}))
        .await;
    assert_eq!(reply.error(StatusCode::BAD_REQUEST)["param"], "input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_objects_of_text_parts_embed_as_their_joined_text() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let parts =
        json!({"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]});
    let reply = server
        .post_json("/v1/embeddings", json!({"input": ["hello world", parts]}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let data = reply.json()["data"].clone();
    assert_eq!(data[0]["embedding"], data[1]["embedding"]);
    let image = json!({"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]});
    let error = server
        .post_json("/v1/embeddings", json!({"input": [image]}))
        .await
        .error(StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "input", "{error}");
}
