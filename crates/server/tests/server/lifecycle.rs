//! Loading, client disconnects, and graceful shutdown.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use mlxcel_engine::FinishReason;
use mlxcel_server::ServerConfig;
use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_loading_and_200_when_ready() {
    let server = TestServer::start(ServerConfig::default(), None).await;
    let reply = server.get("/health").await;
    let error = reply.llama_error(StatusCode::SERVICE_UNAVAILABLE);
    // llama-server's body: the status as a number in `code`.
    assert_eq!(error["code"], 503, "{error}");
    assert_eq!(error["type"], "unavailable_error", "{error}");
    assert_eq!(reply.headers["retry-after"], "1");
    // Liveness answers while the model loads.
    let live = server.get("/live").await;
    assert_eq!(
        (live.status, live.json()),
        (StatusCode::OK, json!({"status": "alive"}))
    );
    let reply = server
        .post_json("/v1/completions", json!({"prompt": "x"}))
        .await;
    reply.error(StatusCode::SERVICE_UNAVAILABLE);
    if skip_model_tests() {
        return;
    }
    server
        .state
        .set_engine(tokio::task::spawn_blocking(engine).await.unwrap());
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_mid_stream_cancels_the_request_in_the_engine() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let text = json!({"prompt": "Once upon a time", "max_tokens": 2000, "n_predict": 2000, "stream": true});
    // The chat page's request (its stop button aborts the fetch, which closes the connection).
    let chat = json!({
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 2000,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    for (path, body) in [
        ("/v1/completions", &text),
        ("/completion", &text),
        ("/v1/chat/completions", &chat),
    ] {
        let before = server.state.metrics().finished(FinishReason::Cancelled);
        let engine_before = engine().metrics().finished.cancelled;
        let mut response = server.open(path, body.clone()).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(next_chunk(&mut response).await.is_some());
        assert_eq!(server.state.active_requests().len(), 1);
        drop(response);
        let cancelled = eventually(Duration::from_secs(30), || {
            server.state.metrics().finished(FinishReason::Cancelled) == before + 1
                && server.state.active_requests().is_empty()
        })
        .await;
        assert!(cancelled, "{path}: the engine reported no cancellation");
        // The engine's own count (shared with other tests, so only its growth is certain),
        // published after the step that ended the request.
        let counted = eventually(Duration::from_secs(10), || {
            engine().metrics().finished.cancelled > engine_before
        })
        .await;
        assert!(counted, "{path}: the engine did not count the cancellation");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_before_a_plain_response_cancels_the_request() {
    use tokio::io::AsyncWriteExt;
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let engine_before = engine().metrics().finished.cancelled;
    let body = json!({"prompt": "Once upon a time", "max_tokens": 2000}).to_string();
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let generating = eventually(Duration::from_secs(30), || {
        server
            .state
            .active_requests()
            .first()
            .is_some_and(|r| r.generated > 0)
    })
    .await;
    assert!(generating);
    drop(stream);
    let cancelled = eventually(Duration::from_secs(30), || {
        server.state.metrics().finished(FinishReason::Cancelled) == 1
            && server.state.active_requests().is_empty()
    })
    .await;
    assert!(cancelled, "the request outlived its connection");
    assert!(
        eventually(Duration::from_secs(10), || engine()
            .metrics()
            .finished
            .cancelled
            > engine_before)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_streams_finish_and_refuses_new_connections() {
    if skip_model_tests() {
        return;
    }
    let mut server = TestServer::with_model(ServerConfig::default()).await;
    let mut response = server
        .open("/v1/completions", json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "stream": true}))
        .await;
    let mut body = next_chunk(&mut response).await.unwrap();
    server.shutdown();
    while let Some(chunk) = next_chunk(&mut response).await {
        body.push_str(&chunk);
    }
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]", "{body}");
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    tokio::time::timeout(Duration::from_secs(10), &mut server.task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "still accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_what_outlives_the_deadline() {
    if skip_model_tests() {
        return;
    }
    let config = ServerConfig {
        shutdown_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let mut server = TestServer::with_model(config).await;
    let mut response = server
        .open(
            "/v1/completions",
            json!({"prompt": "Once upon a time", "max_tokens": 4000, "stream": true}),
        )
        .await;
    assert!(next_chunk(&mut response).await.is_some());
    let before = server.state.metrics().finished(FinishReason::Cancelled);
    let start = Instant::now();
    server.shutdown();
    tokio::time::timeout(Duration::from_secs(20), &mut server.task)
        .await
        .unwrap()
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    // The engine confirms at its next step, which a loaded machine may delay past `run`'s return.
    let cancelled = eventually(Duration::from_secs(30), || {
        server.state.metrics().finished(FinishReason::Cancelled) == before + 1
            && server.state.active_requests().is_empty()
    })
    .await;
    assert!(cancelled, "the request outlived the shutdown deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keep_alive_connection_serves_several_requests() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::Request;
    use hyper_util::rt::TokioIo;

    let server = TestServer::start(ServerConfig::default(), None).await;
    let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    for (path, status) in [
        ("/health", StatusCode::SERVICE_UNAVAILABLE),
        ("/nowhere", StatusCode::NOT_FOUND),
        ("/health", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let request = Request::get(path)
            .header("host", "x")
            .body(Full::new(Bytes::new()))
            .unwrap();
        // `ready` fails if the server closed the connection after the previous response.
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), status, "{path}");
        response.into_body().collect().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_listens_on_every_address_of_its_host_list() {
    // `--host 127.0.0.1,::1`: one listener per address, one server behind them.
    let v6 = match std::net::TcpListener::bind("[::1]:0") {
        Ok(probe) => probe.local_addr().is_ok(),
        Err(_) => false,
    };
    let mut extra_addrs = vec!["127.0.0.1:0".parse().unwrap()];
    if v6 {
        extra_addrs.push("[::1]:0".parse().unwrap());
    }
    let server = mlxcel_server::Server::bind(ServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        extra_addrs,
        ..ServerConfig::default()
    })
    .await
    .unwrap();
    let addrs = server.local_addrs();
    assert_eq!(addrs.len(), if v6 { 3 } else { 2 });
    assert_eq!(addrs[0], server.local_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    for addr in &addrs {
        // Loading: every listener answers, with the same server's 503 and its liveness.
        assert_eq!(
            send(*addr, "GET", "/health", &[], None).await.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{addr}"
        );
        assert_eq!(
            send(*addr, "GET", "/live", &[], None).await.status,
            StatusCode::OK
        );
    }
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_names_go_out_in_title_case() {
    // Clients that copy headers into a case-sensitive map (llama.cpp's server tests) look up
    // `Access-Control-Allow-Origin`, as llama-server writes it.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(ServerConfig::default(), None).await;
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(
            b"OPTIONS /completion HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:8080\r\n\
              Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let names: Vec<&str> = raw
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':').map(|(name, _)| name))
        .collect();
    for name in [
        "Access-Control-Allow-Origin",
        "Access-Control-Allow-Methods",
        "Access-Control-Allow-Headers",
        "Access-Control-Allow-Credentials",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
}
