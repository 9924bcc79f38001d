//! Sixteen parallel streaming clients all complete, with the same greedy outputs as one at a time.

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
