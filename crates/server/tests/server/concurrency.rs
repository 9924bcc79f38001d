//! Sixteen parallel streaming clients all complete, with the same greedy outputs as one at a time;
//! a bounded soak of 32 concurrent mixed requests loses none and every response is well-formed.

use std::time::Duration;

use hyper::StatusCode;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

fn request(i: usize, stream: bool) -> Value {
    json!({
        "prompt": format!("Item {i}: the number after {i} is"),
        "max_tokens": 6,
        "temperature": 0,
        "stream": stream,
    })
}

fn streamed_text(body: &str) -> String {
    let events = sse_events(body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_parallel_streams_equal_sequential_runs() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig {
        parallel: 8,
        ..ServerConfig::default()
    })
    .await;
    let mut alone = Vec::new();
    for i in 0..16 {
        let reply = server.post_json("/v1/completions", request(i, false)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        alone.push(
            reply.json()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let addr = server.addr;
    let clients: Vec<_> = (0..16)
        .map(|i| {
            tokio::spawn(async move {
                let reply = send(
                    addr,
                    "POST",
                    "/v1/completions",
                    &[],
                    Some(&request(i, true).to_string()),
                )
                .await;
                assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
                streamed_text(&reply.body)
            })
        })
        .collect();
    let mut parallel = Vec::new();
    for client in clients {
        parallel.push(
            tokio::time::timeout(Duration::from_secs(300), client)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert_eq!(parallel, alone);
}

/// 32 concurrent requests, alternating completions and chat, streamed and not: every one answers
/// 200 with a well-formed body (streams end in `[DONE]` after a usage chunk), none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_of_32_concurrent_mixed_requests_loses_none() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig {
        parallel: 8,
        ..ServerConfig::default()
    })
    .await;
    let addr = server.addr;
    let clients: Vec<_> = (0..32usize)
        .map(|i| {
            tokio::spawn(async move {
                let chat = i % 2 == 0;
                let stream = i % 4 < 2;
                let (path, body) = if chat {
                    (
                        "/v1/chat/completions",
                        json!({
                            "messages": [{"role": "user", "content": format!("Say the number {i}.")}],
                            "max_tokens": 4,
                            "temperature": 0,
                            "stream": stream,
                            "stream_options": {"include_usage": true},
                        }),
                    )
                } else {
                    (
                        "/v1/completions",
                        json!({
                            "prompt": format!("Count: {i},"),
                            "max_tokens": 4,
                            "temperature": 0,
                            "stream": stream,
                            "stream_options": {"include_usage": true},
                        }),
                    )
                };
                let reply = send(addr, "POST", path, &[], Some(&body.to_string())).await;
                assert_eq!(reply.status, StatusCode::OK, "request {i}: {}", reply.body);
                if stream {
                    let events = sse_events(&reply.body);
                    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{i}");
                    let chunks: Vec<Value> = events[..events.len() - 1]
                        .iter()
                        .map(|e| serde_json::from_str(e).expect("each chunk is JSON"))
                        .collect();
                    let usage = &chunks.last().expect("a usage chunk")["usage"];
                    assert!(usage["completion_tokens"].as_u64().unwrap() <= 4, "{i}: {usage}");
                } else {
                    let body = reply.json();
                    assert!(body["choices"][0]["finish_reason"].is_string(), "{i}: {body}");
                    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() <= 4, "{i}");
                }
                i
            })
        })
        .collect();
    let mut finished = Vec::new();
    for client in clients {
        finished.push(
            tokio::time::timeout(Duration::from_secs(600), client)
                .await
                .expect("every request ends in time")
                .expect("no client panicked"),
        );
    }
    finished.sort_unstable();
    assert_eq!(finished, (0..32).collect::<Vec<_>>());
}
