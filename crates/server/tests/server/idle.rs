//! What a server does with what it is not using: the model unloaded after
//! `--sleep-idle-seconds` and loaded again on demand, idle slots' KV left to the prefix cache
//! (`--cache-idle-slots`, `id_slot`), and Google Vertex AI's prediction route
//! (`AIP_MODE=PREDICTION`), on the default model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use mlxcel_engine::{Engine, EngineOptions};
use mlxcel_server::{GcpConfig, ServerConfig};
use serde_json::{Value, json};

use crate::support::*;

/// An engine of its own (sleeping one must not unload the other tests' model), with the
/// prefix cache on.
async fn own_engine() -> Arc<Engine> {
    let options = EngineOptions {
        prefix_cache_bytes: 1 << 30,
        ..EngineOptions::default()
    };
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    Arc::new(engine)
}

async fn is_sleeping(server: &TestServer) -> bool {
    let reply = server.get("/props").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["is_sleeping"]
        .as_bool()
        .expect("/props has is_sleeping")
}

async fn wait_for_sleep(server: &TestServer) {
    let start = Instant::now();
    while !is_sleeping(server).await {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the server did not go to sleep"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metrics(server: &TestServer) -> String {
    let reply = server.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body
}

fn metric(text: &str, name: &str) -> f64 {
    let prefix = format!("llamacpp:{name} ");
    let values: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect();
    assert_eq!(values.len(), 1, "{name} in {text}");
    values[0].parse().unwrap()
}

async fn complete(server: &TestServer, body: Value) -> Value {
    let reply = server.post_json("/completion", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_sleeps_and_wakes_for_a_request() {
    if skip_model_tests() {
        return;
    }
    let engine = own_engine().await;
    let config = ServerConfig {
        sleep_idle: Some(Duration::from_secs(1)),
        metrics: true,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, Some(engine.clone())).await;
    let request = json!({"prompt": "The capital of France is", "n_predict": 6, "temperature": 0});
    let first = complete(&server, request.clone()).await;
    assert!(!is_sleeping(&server).await);
    // The first scrape ends the throughput window; the second is what sleeping must keep.
    metrics(&server).await;
    let awake = metrics(&server).await;
    assert!(metric(&awake, "tokens_predicted_total") >= 6.0);

    wait_for_sleep(&server).await;
    assert!(engine.is_sleeping());
    // Read-only routes answer from what was known before sleeping, without waking the model.
    assert_eq!(metrics(&server).await, awake);
    assert_eq!(server.get("/health").await.status, StatusCode::OK);
    let models = server.get("/v1/models").await;
    assert_eq!(models.status, StatusCode::OK, "{}", models.body);
    assert_eq!(models.json()["data"].as_array().map(Vec::len), Some(1));
    assert!(is_sleeping(&server).await);

    // A route that needs the model wakes it (the tokenizer alone counts too).
    let tokenized = server
        .post_json("/tokenize", json!({"content": "Hello"}))
        .await;
    assert_eq!(tokenized.status, StatusCode::OK, "{}", tokenized.body);
    assert!(!is_sleeping(&server).await);
    // Waking reports no throughput again, and the counters continue where they were.
    let woken = metrics(&server).await;
    assert_eq!(metric(&woken, "predicted_tokens_seconds"), 0.0);
    assert_eq!(
        metric(&woken, "tokens_predicted_total"),
        metric(&awake, "tokens_predicted_total")
    );

    // The reloaded model answers as the first one did (greedy), and counts on.
    wait_for_sleep(&server).await;
    let again = complete(&server, request).await;
    assert!(!is_sleeping(&server).await);
    assert_eq!(again["content"], first["content"]);
    let after = metrics(&server).await;
    assert_eq!(
        metric(&after, "tokens_predicted_total"),
        metric(&awake, "tokens_predicted_total") + again["tokens_predicted"].as_f64().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_counting_routes_wake_a_sleeping_server() {
    if skip_model_tests() {
        return;
    }
    let config = ServerConfig {
        sleep_idle: Some(Duration::from_secs(1)),
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, Some(own_engine().await)).await;
    let messages = json!([{"role": "user", "content": "Hello world"}]);
    for (path, body) in [
        (
            "/chat/completions/input_tokens",
            json!({"messages": messages}),
        ),
        (
            "/v1/responses/input_tokens",
            json!({"input": "Hello world"}),
        ),
        ("/v1/messages/count_tokens", json!({"messages": messages})),
    ] {
        wait_for_sleep(&server).await;
        let reply = server.post_json(path, body).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        assert!(reply.json()["input_tokens"].as_u64().unwrap() > 0, "{path}");
        assert!(!is_sleeping(&server).await, "{path} did not wake the model");
    }
}

const LONG_PROMPT: &str = "Once upon a time in a land far away, there lived a brave knight who \
    traveled across mountains and rivers to find the legendary golden sword hidden deep within \
    the enchanted forest of whispers. He met many creatures along the way.";

/// Saves slot `id` and returns how many tokens the file holds.
async fn saved_tokens(server: &TestServer, id: usize) -> u64 {
    let reply = server
        .post_json(
            &format!("/slots/{id}?action=save"),
            json!({"filename": format!("slot{id}.bin")}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["n_saved"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_slots_leave_their_kv_to_the_prefix_cache() {
    if skip_model_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = own_engine().await;
    for cache_idle_slots in [true, false] {
        // A prompt of each pass's own, which the shared engine has not cached yet.
        let prompt = format!("Pass {cache_idle_slots}. {LONG_PROMPT}");
        let config = ServerConfig {
            parallel: 2,
            cache_idle_slots,
            kv_unified: true,
            slot_save_path: Some(dir.path().to_owned()),
            ..ServerConfig::default()
        };
        let server = TestServer::start(config, Some(engine.clone())).await;
        let first = complete(
            &server,
            json!({"prompt": prompt, "id_slot": 0, "n_predict": 4, "temperature": 0}),
        )
        .await;
        assert_eq!(first["id_slot"], 0);
        assert!(saved_tokens(&server, 0).await > 0);
        // A request launched in slot 1: idle slot 0 leaves its KV to the cache and, with
        // --kv-unified, forgets it; without --cache-idle-slots it keeps it.
        let other = complete(
            &server,
            json!({"prompt": "The quick brown fox", "id_slot": 1, "n_predict": 4}),
        )
        .await;
        assert_eq!(other["id_slot"], 1);
        let kept = saved_tokens(&server, 0).await;
        assert_eq!(kept == 0, cache_idle_slots, "slot 0 saved {kept} tokens");
        // Either way the KV is in the prefix cache: the same prompt is not computed again.
        let again = complete(
            &server,
            json!({"prompt": prompt, "n_predict": 4, "temperature": 0}),
        )
        .await;
        assert!(again["timings"]["cache_n"].as_u64().unwrap() > 0, "{again}");
        assert!(
            again["timings"]["prompt_n"].as_u64() < first["timings"]["prompt_n"].as_u64(),
            "{again}"
        );
    }
    // A slot the server does not have is refused, naming the field.
    let server = TestServer::start(
        ServerConfig {
            parallel: 2,
            ..ServerConfig::default()
        },
        Some(engine),
    )
    .await;
    let reply = server
        .post_json("/completion", json!({"prompt": "Hi", "id_slot": 2}))
        .await;
    let error = reply.error(StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "id_slot", "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_ai_predictions_run_each_instance_through_its_route() {
    if skip_model_tests() {
        return;
    }
    let config = ServerConfig {
        parallel: 2,
        gcp: Some(GcpConfig {
            port: 0,
            predict_route: "/predict".into(),
            health_route: Some("/healthz".into()),
        }),
        ..ServerConfig::default()
    };
    let server = TestServer::with_model(config).await;
    let chat = |text: &str| {
        json!({
            "@requestFormat": "chatCompletions",
            "max_tokens": 4,
            "stream": true,
            "messages": [{"role": "user", "content": text}],
        })
    };
    let reply = server
        .post_json(
            "/predict",
            json!({"instances": [
                chat("Say hello"),
                {"@requestFormat": "/tokenize", "content": "Hello"},
                {"@requestFormat": "noSuchRoute"},
                chat("Say world"),
            ]}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let predictions = reply.json()["predictions"].as_array().unwrap().clone();
    assert_eq!(predictions.len(), 4);
    for index in [0, 3] {
        let message = &predictions[index]["choices"][0]["message"];
        assert_eq!(message["role"], "assistant", "{}", predictions[index]);
        assert!(!message["content"].as_str().unwrap().is_empty());
    }
    assert!(!predictions[1]["tokens"].as_array().unwrap().is_empty());
    assert!(
        predictions[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("noSuchRoute")
    );
    // A bad instance list is refused whole; the health alias answers as /health.
    let too_many = json!({"instances": vec![json!({}); 129]});
    server
        .post_json("/predict", too_many)
        .await
        .error(StatusCode::BAD_REQUEST);
    server
        .post_json("/predict", json!({"instances": {}}))
        .await
        .error(StatusCode::BAD_REQUEST);
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}
