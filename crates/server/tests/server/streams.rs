//! Resumable streams (`X-Conversation-Id`, `GET /v1/stream`, `POST /v1/streams/lookup`), as
//! llama-server's: a named streamed generation is kept and can be read again from any offset,
//! runs to its end after its client went away, and is listed only to a caller who asks by id.

use std::time::Duration;

use hyper::StatusCode;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

async fn lookup(server: &TestServer, ids: Value) -> Value {
    let reply = server
        .post_json("/v1/streams/lookup", json!({"conversation_ids": ids}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_stream_is_kept_replayed_from_any_offset_and_outlives_its_client() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let body =
        json!({"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "stream": true});
    let first = send(
        server.addr,
        "POST",
        "/completion",
        &[("X-Conversation-Id", "conv-a")],
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert!(first.body.contains("\"stop\":true"), "{}", first.body);
    // Listed when asked about (with its per-model variants), ended, with every byte counted.
    let found = lookup(&server, json!(["conv-a", "nobody"])).await;
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["conversation_id"], "conv-a");
    assert_eq!(found[0]["is_done"], true);
    assert_eq!(found[0]["total_bytes"], first.body.len());
    assert!(found[0]["completed_at"].as_u64().unwrap() >= found[0]["started_at"].as_u64().unwrap());
    assert_eq!(lookup(&server, json!([])).await, json!([]));
    // Replayed whole, and from an offset.
    let replay = server.get("/v1/stream?conv_id=conv-a").await;
    assert_eq!(replay.status, StatusCode::OK);
    assert_eq!(
        replay.headers["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    assert_eq!(replay.body, first.body);
    let tail = server.get("/v1/stream?conv_id=conv-a&from=10").await;
    assert_eq!(tail.body, first.body[10..]);
    // The errors, in llama-server's shape.
    server
        .get("/v1/stream")
        .await
        .llama_error(StatusCode::BAD_REQUEST);
    server
        .get("/v1/stream?conv_id=conv-a&from=ten")
        .await
        .llama_error(StatusCode::BAD_REQUEST);
    let missing = server.get("/v1/stream?conv_id=nobody").await;
    assert_eq!(
        missing.llama_error(StatusCode::NOT_FOUND)["message"],
        "Stream not found or expired"
    );
    let bad = server.post("/v1/streams/lookup", "{not json").await;
    bad.llama_error(StatusCode::BAD_REQUEST);

    // A client that goes away after its first chunk: the generation runs to its end, and its
    // whole stream can be read back.
    let mut gone = open(
        server.addr,
        "POST",
        "/completion",
        &[("x-conversation-id", "conv-b")],
        Some(
            &json!({"prompt": "The river", "n_predict": 24, "temperature": 0, "stream": true})
                .to_string(),
        ),
    )
    .await;
    assert!(next_chunk(&mut gone).await.is_some());
    drop(gone);
    let server_ref = &server;
    let mut done = false;
    for _ in 0..600 {
        let found = lookup(server_ref, json!(["conv-b"])).await;
        if found[0]["is_done"] == true {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "the stream did not end");
    let whole = server.get("/v1/stream?conv_id=conv-b").await;
    assert!(whole.body.contains("\"stop\":true"), "{}", whole.body);
    let last: Value = serde_json::from_str(sse_events(&whole.body).last().unwrap()).unwrap();
    assert_eq!(last["tokens_predicted"], 24, "{}", whole.body);

    // A request under the same id replaces the stream; one that does not stream leaves none.
    let plain = send(
        server.addr,
        "POST",
        "/completion",
        &[("X-Conversation-Id", "conv-a")],
        Some(&json!({"prompt": "Hi", "n_predict": 2}).to_string()),
    )
    .await;
    assert_eq!(plain.status, StatusCode::OK);
    assert_eq!(lookup(&server, json!(["conv-a"])).await, json!([]));
}

/// `DELETE /v1/stream` ends a running stream and forgets it: 204, also for an unknown id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_stream_ends_it() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let mut running = open(
        server.addr,
        "POST",
        "/completion",
        &[("X-Conversation-Id", "conv-d")],
        Some(
            &json!({"prompt": "Tell me a long story.", "n_predict": 400, "stream": true})
                .to_string(),
        ),
    )
    .await;
    assert!(next_chunk(&mut running).await.is_some());
    let deleted = send(
        server.addr,
        "DELETE",
        "/v1/stream?conv_id=conv-d",
        &[],
        None,
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(lookup(&server, json!(["conv-d"])).await, json!([]));
    // The client's stream ends without the generation's last chunk.
    let rest = tokio::time::timeout(Duration::from_secs(60), async {
        let mut rest = String::new();
        while let Some(chunk) = next_chunk(&mut running).await {
            rest.push_str(&chunk);
        }
        rest
    })
    .await
    .expect("the deleted stream did not end");
    assert!(!rest.contains("\"stop\":true"), "{rest}");
    let again = send(
        server.addr,
        "DELETE",
        "/v1/stream?conv_id=conv-d",
        &[],
        None,
    )
    .await;
    assert_eq!(again.status, StatusCode::NO_CONTENT);
    let bad = send(server.addr, "DELETE", "/v1/stream", &[], None).await;
    bad.llama_error(StatusCode::BAD_REQUEST);
}
