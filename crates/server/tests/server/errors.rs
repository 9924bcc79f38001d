//! Each error class is a clear response in OpenAI's shape, and the server keeps serving.

use std::sync::Arc;

use hyper::StatusCode;
use mlxcel_engine::{Engine, EngineOptions, SchedulerConfig};
use mlxcel_server::ServerConfig;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_and_methods_that_do_not_exist() {
    // No model needed: the router answers before any handler.
    let server = TestServer::start(ServerConfig::default(), None).await;
    let error = server.get("/v2/nothing").await.error(StatusCode::NOT_FOUND);
    assert_eq!(error["type"], "not_found_error");
    let error = server
        .get("/metrics")
        .await
        .error(StatusCode::NOT_IMPLEMENTED);
    assert!(
        error["message"].as_str().unwrap().contains("--metrics"),
        "{error}"
    );
    let reply = server.get("/v1/completions").await;
    let error = reply.error(StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        error["message"].as_str().unwrap().contains("GET"),
        "{error}"
    );
    // The 405 says what the path takes, and OPTIONS asks the same without an error.
    assert_eq!(reply.headers["allow"], "POST, OPTIONS");
    let options = send(server.addr, "OPTIONS", "/v1/models", &[], None).await;
    // 200 with an empty body, as llama-server answers (its test suite checks the status).
    assert_eq!(options.status, StatusCode::OK);
    assert_eq!(options.headers["allow"], "GET, OPTIONS");
    // As llama-server, OPTIONS is answered on any path (CORS preflights), without `Allow` where
    // no route is.
    let unknown = send(server.addr, "OPTIONS", "/v2/nothing", &[], None).await;
    assert_eq!(unknown.status, StatusCode::OK);
    assert!(unknown.headers.get("allow").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_wrong_types_and_refused_features() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig {
        body_limit: 4096,
        ..ServerConfig::default()
    })
    .await;
    let cases: &[(&str, &str, StatusCode, &str, Option<&str>)] = &[
        (
            "/v1/completions",
            "{\"prompt\": ",
            StatusCode::BAD_REQUEST,
            "malformed JSON",
            None,
        ),
        (
            "/v1/completions",
            "",
            StatusCode::BAD_REQUEST,
            "empty",
            None,
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "temperature": "hot"}"#,
            StatusCode::BAD_REQUEST,
            "temperature",
            Some("temperature"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 0}"#,
            StatusCode::BAD_REQUEST,
            "max_tokens=0",
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "n": 200}"#,
            StatusCode::BAD_REQUEST,
            "n=200",
            Some("n"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": []}"#,
            StatusCode::BAD_REQUEST,
            "must not be empty",
            Some("prompt"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "top_p": 1.5}"#,
            StatusCode::BAD_REQUEST,
            "top_p",
            Some("top_p"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": ""}"#,
            StatusCode::BAD_REQUEST,
            "empty",
            Some("prompt"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "x"}], "n": 129}"#,
            StatusCode::BAD_REQUEST,
            "n=129",
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#,
            StatusCode::BAD_REQUEST,
            "needs `json_schema.schema`",
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": []}"#,
            StatusCode::BAD_REQUEST,
            "messages",
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": "hi"}"#,
            StatusCode::BAD_REQUEST,
            "messages",
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}"#,
            StatusCode::BAD_REQUEST,
            "`xml` is unknown",
            Some("response_format"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "json_schema": {"type": "string"}, "guided_regex": "a+"}"#,
            StatusCode::BAD_REQUEST,
            "both constrain the output",
            Some("guided_regex"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
            StatusCode::BAD_REQUEST,
            "tools",
            Some("tools"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#,
            StatusCode::BAD_REQUEST,
            "image_url",
            Some("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}"#,
            StatusCode::BAD_REQUEST,
            "logprobs=true",
            Some("top_logprobs"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "max_tokens": 1, "logit_bias": {"50": "high"}}"#,
            StatusCode::BAD_REQUEST,
            "logit_bias",
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "echo": true}"#,
            StatusCode::BAD_REQUEST,
            "echo",
            Some("echo"),
        ),
        (
            "/v1/completions",
            r#"{"prompt": "x", "best_of": 3}"#,
            StatusCode::BAD_REQUEST,
            "best_of=3",
            Some("best_of"),
        ),
        (
            "/completion",
            r#"{"prompt": "x", "n_predict": -5}"#,
            StatusCode::BAD_REQUEST,
            "n_predict=-5",
            Some("n_predict"),
        ),
        (
            "/detokenize",
            r#"{"tokens": [99999999]}"#,
            StatusCode::BAD_REQUEST,
            "vocabulary",
            Some("tokens"),
        ),
    ];
    for (path, body, status, needle, param) in cases {
        let reply = server.post(path, body).await;
        let error = reply.error(*status);
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(needle), "{path} {body}: {message}");
        if let Some(param) = param {
            assert_eq!(error["param"], *param, "{path} {body}: {error}");
        }
    }
    let big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(5000));
    let error = server
        .post("/v1/completions", &big)
        .await
        .error(StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        error["message"].as_str().unwrap().contains("4096"),
        "{error}"
    );
    // Still serving.
    let reply = server
        .post_json("/tokenize", json!({"content": "ok"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_too_long_for_the_context_name_the_numbers() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig {
        ctx_size: Some(64),
        ..ServerConfig::default()
    })
    .await;
    let tokens: Vec<u32> = vec![504; 60];
    let error = server
        .post_json(
            "/v1/completions",
            json!({"prompt": tokens, "max_tokens": 10}),
        )
        .await
        .error(StatusCode::BAD_REQUEST);
    assert_eq!(
        error["message"],
        "effective_prompt_len=60 + max_new_tokens=10 > context_capacity=64"
    );
    assert_eq!(error["code"], "context_length_exceeded");
    // llama-server's type and numbers.
    assert_eq!(error["type"], "exceed_context_size_error");
    assert_eq!(
        (error["n_prompt_tokens"].clone(), error["n_ctx"].clone()),
        (json!(60), json!(64))
    );
    // An unlimited budget is clamped to what the context leaves.
    let body = server
        .post_json(
            "/completion",
            json!({"prompt": vec![504; 60], "n_predict": -1, "temperature": 0}),
        )
        .await
        .json();
    assert!(body["tokens_predicted"].as_u64().unwrap() <= 4, "{body}");

    let window = TestServer::with_model(ServerConfig::default()).await;
    let error = window
        .post_json(
            "/v1/completions",
            json!({"prompt": vec![504; 8190], "max_tokens": 10}),
        )
        .await
        .error(StatusCode::BAD_REQUEST);
    assert!(
        error["message"].as_str().unwrap().contains("8190"),
        "{error}"
    );
    assert!(
        error["message"].as_str().unwrap().contains("8192"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_503_with_retry_after() {
    if skip_model_tests() {
        return;
    }
    let options = EngineOptions {
        scheduler: SchedulerConfig {
            max_batch: 1,
            token_budget: 512,
            max_waiting: 1,
            ..SchedulerConfig::default()
        },
        ..EngineOptions::default()
    };
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options).unwrap())
        .await
        .unwrap();
    let server = TestServer::start(ServerConfig::default(), Some(Arc::new(engine))).await;
    let long = long_request();
    // A runs (its first chunk has arrived), B waits in the one queue place, C is refused.
    let mut running = server.open("/v1/completions", long.clone()).await;
    assert_eq!(running.status(), StatusCode::OK);
    assert!(next_chunk(&mut running).await.is_some());
    let waiting = server.open("/v1/completions", long).await;
    assert_eq!(waiting.status(), StatusCode::OK);
    let reply = server
        .post_json("/v1/completions", json!({"prompt": "Hi", "max_tokens": 2}))
        .await;
    let error = reply.error(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error["code"], "queue_full");
    assert!(
        error["message"].as_str().unwrap().contains("queue is full"),
        "{error}"
    );
    // Nothing has ended yet, so no drain rate is measured: retry in a second.
    assert_eq!(reply.headers["retry-after"], "1");
    // Readiness: /health answers 503 (llama-server's body, the status as a number) while the
    // queue is full; liveness (/live) stays 200.
    // (The engine publishes its queue after each step: poll briefly for the state it reports.)
    let mut health = server.get("/health").await;
    for _ in 0..50 {
        if health.status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        health = server.get("/health").await;
    }
    let error = health.llama_error(StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error["code"], 503, "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("--max-queue-depth 1"),
        "{error}"
    );
    assert!(
        health.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(server.get("/live").await.status, StatusCode::OK);
    drop((running, waiting));
    // Still serving once the queue drains.
    assert!(
        eventually(std::time::Duration::from_secs(30), || server
            .state
            .active_requests()
            .is_empty())
        .await
    );
    let reply = server
        .post_json("/v1/completions", json!({"prompt": "Hi", "max_tokens": 2}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(server.get("/health").await.status, StatusCode::OK);

    // Now that requests have ended, Retry-After is the measured drain time of the queue: fill
    // it again with streams that have a long way to go.
    let mut running = server.open("/v1/completions", long_request()).await;
    assert!(next_chunk(&mut running).await.is_some());
    let waiting = server.open("/v1/completions", long_request()).await;
    let reply = server
        .post_json("/v1/completions", json!({"prompt": "Hi", "max_tokens": 2}))
        .await;
    reply.error(StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = reply.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=300).contains(&retry), "{retry}");
    let metrics = server.state.render_metrics();
    assert!(
        metrics.contains("mlxcel_requests_rejected_queue_full_total 2"),
        "{metrics}"
    );
    drop((running, waiting));
}

/// A stream with a long way to go (dropped, it is cancelled), so that it still runs while the
/// test looks at the queue however loaded the machine is.
fn long_request() -> serde_json::Value {
    json!({"prompt": "Once upon a time", "max_tokens": 400, "stream": true})
}
