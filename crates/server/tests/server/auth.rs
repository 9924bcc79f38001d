//! With an API key, every route but `/health` requires it; the key never reaches the log.

use hyper::StatusCode;
use mlxcel_server::{ApiKeys, ServerConfig};

use crate::support::*;

fn config() -> ServerConfig {
    ServerConfig {
        api_keys: ApiKeys::new(vec!["test-key-123".into()]),
        metrics: true,
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_but_health_requires_the_key() {
    // The key is checked before the model is needed, so a loading server shows it too.
    let server = TestServer::start(config(), None).await;
    for (method, path) in [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("POST", "/completion"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/apply-template"),
        ("GET", "/props"),
        ("GET", "/slots"),
        ("GET", "/metrics"),
    ] {
        for headers in [
            &[][..],
            &[("authorization", "Bearer wrong")][..],
            &[("authorization", "test-key-123")][..],
        ] {
            let reply = send(server.addr, method, path, headers, Some("{}")).await;
            // llama-server's status routes answer in its shape (the status as `code`).
            if path == "/slots" {
                reply.llama_error(StatusCode::UNAUTHORIZED);
            } else {
                let error = reply.error(StatusCode::UNAUTHORIZED);
                assert_eq!(error["code"], "invalid_api_key", "{method} {path}");
            }
            assert!(!reply.body.contains("test-key-123"));
        }
        let reply = send(
            server.addr,
            method,
            path,
            &[("authorization", "Bearer test-key-123")],
            Some("{}"),
        )
        .await;
        assert_ne!(reply.status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    let health = server.get("/health").await;
    assert_eq!(
        health.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "loading, but not unauthorized"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_key_serves_requests() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(config()).await;
    let headers = [("authorization", "Bearer test-key-123")];
    let reply = send(
        server.addr,
        "POST",
        "/tokenize",
        &headers,
        Some(r#"{"content": "Hi"}"#),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = send(
        server.addr,
        "GET",
        "/v1/models",
        &[("x-api-key", "test-key-123")],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
}
