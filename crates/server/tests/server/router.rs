//! Router mode (`--models-dir`, `--models-preset`, `--models-max`, `--models-autoload`): one
//! server, several models loaded on demand, each with its own engine, slots and metrics. The
//! models are the default model's GGUF linked into a temporary models directory under three
//! names.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use hyper::StatusCode;
use mlxcel_model::{DefaultModel, cache_dir};
use mlxcel_server::{ServerArgs, build_router, normalize_llama_args};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{TestServer, eventually, next_chunk, open, skip_model_tests};

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
}

/// The default model's GGUF, through the project's checksummed provisioning.
fn gguf() -> PathBuf {
    let cache = cache_dir().expect("the cache directory");
    DefaultModel::pinned()
        .ensure_gguf(&cache)
        .expect("the default model's GGUF (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)")
}

/// A models directory holding the default GGUF as `alpha`, `beta` and `gamma`, beside files
/// that are not models (a projector, a text file, a folder without a checkpoint).
fn models_dir() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    let gguf = gguf();
    for name in ["alpha", "beta"] {
        std::os::unix::fs::symlink(&gguf, dir.path().join(format!("{name}.gguf"))).unwrap();
    }
    // A folder holding a GGUF is a model named after the folder.
    std::fs::create_dir(dir.path().join("gamma")).unwrap();
    std::os::unix::fs::symlink(&gguf, dir.path().join("gamma").join("model.gguf")).unwrap();
    std::fs::write(dir.path().join("alpha-mmproj.gguf"), b"not a model").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not a model").unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    dir
}

fn parse(args: &[String]) -> ServerArgs {
    let argv = std::iter::once("mlxcel-server".to_owned()).chain(args.iter().cloned());
    Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server
}

/// A router server over `dir` with `flags`.
async fn router(dir: &Path, flags: &[&str]) -> TestServer {
    let mut args = vec!["--models-dir".to_owned(), dir.display().to_string()];
    args.extend(flags.iter().map(|f| f.to_string()));
    let parsed = parse(&args);
    let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
    let router = build_router(&parsed, argv).unwrap();
    let server = TestServer::start(parsed.server_config().unwrap(), None).await;
    server.state.set_router(router);
    server
}

async fn statuses(server: &TestServer) -> Vec<(String, String)> {
    let reply = server.get("/models").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_owned(),
                m["status"]["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn status_of(server: &TestServer, model: &str) -> String {
    statuses(server)
        .await
        .into_iter()
        .find(|(id, _)| id == model)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{model} is not listed"))
}

async fn wait_for(server: &TestServer, model: &str, want: &str) {
    for _ in 0..1200 {
        if status_of(server, model).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{model} never became {want}");
}

async fn load(server: &TestServer, model: &str) {
    let reply = server
        .post_json("/models/load", json!({ "model": model }))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["success"], true);
    wait_for(server, model, "loaded").await;
}

async fn tokenize(server: &TestServer, model: &str) -> crate::support::Reply {
    server
        .post_json(
            "/tokenize",
            json!({ "model": model, "content": "hello world" }),
        )
        .await
}

fn chat(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [{ "role": "user", "content": "hello" }],
        "max_tokens": 4,
        "temperature": 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_dir_lists_every_checkpoint_and_the_model_field_picks_one() {
    if skip_model_tests() {
        return;
    }
    let dir = models_dir();
    let server = router(dir.path(), &["--models-autoload"]).await;
    let listed = statuses(&server).await;
    assert_eq!(
        listed,
        vec![
            ("alpha".to_owned(), "unloaded".to_owned()),
            ("beta".to_owned(), "unloaded".to_owned()),
            ("gamma".to_owned(), "unloaded".to_owned()),
        ]
    );
    let v1 = server.get("/v1/models").await.json();
    assert_eq!(v1["object"], "list");
    assert_eq!(v1["data"][2]["source"], "models_dir");

    let props = server.get("/props").await.json();
    assert_eq!(props["role"], "router");
    assert_eq!(props["max_instances"], 4);
    assert_eq!(props["models_autoload"], true);
    assert_eq!(server.get("/health").await.status, StatusCode::OK);

    // A request naming a model loads it (autoload) and is answered by it.
    let reply = server
        .post_json("/v1/chat/completions", chat("alpha"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["model"], "alpha");
    assert_eq!(status_of(&server, "alpha").await, "loaded");
    assert_eq!(status_of(&server, "beta").await, "unloaded");
    let reply = server
        .post_json(
            "/completion",
            json!({ "model": "gamma", "prompt": "Hi", "n_predict": 2 }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = tokenize(&server, "beta").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(!reply.json()["tokens"].as_array().unwrap().is_empty());
    let embedded = server
        .post_json(
            "/v1/embeddings",
            json!({ "model": "beta", "input": "hello" }),
        )
        .await;
    assert_eq!(embedded.status, StatusCode::OK, "{}", embedded.body);

    // GET routes name the model in the query; each model has its own slots and props.
    let child = server.get("/props?model=alpha").await;
    assert_eq!(child.status, StatusCode::OK, "{}", child.body);
    assert_eq!(
        child.json()["default_generation_settings"]["model"],
        "alpha"
    );
    let slots = server.get("/slots?model=gamma").await;
    assert_eq!(slots.status, StatusCode::OK, "{}", slots.body);

    // An unknown model is refused with its name and the known ones; so is a missing one.
    let err = server
        .post_json("/v1/chat/completions", chat("delta"))
        .await
        .error(StatusCode::BAD_REQUEST);
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("'delta'") && message.contains("alpha, beta, gamma"),
        "{message}"
    );
    let err = server
        .post_json("/tokenize", json!({ "content": "x" }))
        .await
        .error(StatusCode::BAD_REQUEST);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("model name is missing")
    );
    let missing = server
        .post_json("/models/load", json!({ "model": "delta" }))
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_max_unloads_the_least_recently_used_idle_model_with_status_events() {
    if skip_model_tests() {
        return;
    }
    let dir = models_dir();
    let server = router(dir.path(), &["--models-max", "2"]).await;
    let mut sse = open(server.addr, "GET", "/models/sse", &[], None).await;
    assert_eq!(sse.status(), StatusCode::OK);
    let events = Arc::new(Mutex::new(Vec::<Value>::new()));
    let collected = events.clone();
    let reader = tokio::spawn(async move {
        while let Some(chunk) = next_chunk(&mut sse).await {
            for data in chunk
                .split("\n\n")
                .filter_map(|e| e.trim().strip_prefix("data: "))
            {
                collected
                    .lock()
                    .unwrap()
                    .push(serde_json::from_str(data).unwrap());
            }
        }
    });

    load(&server, "alpha").await;
    load(&server, "beta").await;
    // alpha is used after beta: beta is now the least recently used.
    assert_eq!(tokenize(&server, "alpha").await.status, StatusCode::OK);
    load(&server, "gamma").await;
    assert_eq!(status_of(&server, "beta").await, "unloaded");
    assert_eq!(status_of(&server, "alpha").await, "loaded");
    let again = server
        .post_json("/models/load", json!({ "model": "gamma" }))
        .await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "{}", again.body);

    let seen = |model: &str, status: &str| {
        events.lock().unwrap().iter().any(|e| {
            e["model"] == model && e["event"] == "status_change" && e["data"]["status"] == status
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || seen("beta", "loading")
            && seen("beta", "loaded")
            && seen("beta", "unloaded")
            && seen("gamma", "loaded"))
        .await,
        "{:?}",
        events.lock().unwrap()
    );
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_model_is_not_evicted_and_the_waiting_request_is_served_after_it() {
    if skip_model_tests() {
        return;
    }
    let dir = models_dir();
    let server = router(dir.path(), &["--models-max", "1"]).await;
    load(&server, "alpha").await;
    // A stream that keeps generating holds alpha busy until its client goes.
    let mut stream = server
        .open(
            "/completion",
            json!({ "model": "alpha", "prompt": "Once upon a time", "n_predict": 4000,
                    "stream": true, "ignore_eos": true }),
        )
        .await;
    assert_eq!(stream.status(), StatusCode::OK);
    assert!(next_chunk(&mut stream).await.is_some());
    let addr = server.addr;
    let waiting = tokio::spawn(async move {
        crate::support::send(
            addr,
            "POST",
            "/tokenize",
            &[],
            Some(&json!({ "model": "beta", "content": "hi" }).to_string()),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        status_of(&server, "alpha").await,
        "loaded",
        "busy: not evicted"
    );
    assert_eq!(status_of(&server, "beta").await, "unloaded", "queued");
    assert!(!waiting.is_finished());
    assert!(
        next_chunk(&mut stream).await.is_some(),
        "alpha still streams"
    );
    drop(stream);
    let reply = waiting.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(status_of(&server, "alpha").await, "unloaded");
    assert_eq!(status_of(&server, "beta").await, "loaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_autoload_a_model_serves_only_once_loaded_and_unload_frees_it() {
    if skip_model_tests() {
        return;
    }
    let dir = models_dir();
    let server = router(dir.path(), &["--no-models-autoload", "--metrics"]).await;
    assert_eq!(server.get("/props").await.json()["models_autoload"], false);
    let err = server
        .post_json("/v1/chat/completions", chat("alpha"))
        .await
        .error(StatusCode::BAD_REQUEST);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .starts_with("model is not loaded"),
        "{err}"
    );
    assert_eq!(status_of(&server, "alpha").await, "unloaded");
    // `?autoload=1` asks for a load anyway, as llama-server's query parameter does.
    let reply = server
        .post(
            "/tokenize?autoload=1",
            &json!({ "model": "beta", "content": "hi" }).to_string(),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

    load(&server, "alpha").await;
    let reply = server
        .post_json("/v1/chat/completions", chat("alpha"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

    // Each loaded model's series carry its name; each family is described once.
    let metrics = server.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics
            .body
            .contains("llamacpp:prompt_tokens_total{model=\"alpha\"}"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("{model=\"beta\"}"),
        "{}",
        metrics.body
    );
    assert_eq!(
        metrics
            .body
            .matches("# HELP llamacpp:prompt_tokens_total ")
            .count(),
        1,
        "{}",
        metrics.body
    );

    let reply = server
        .post_json("/models/unload", json!({ "model": "alpha" }))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(status_of(&server, "alpha").await, "unloaded");
    let again = server
        .post_json("/models/unload", json!({ "model": "alpha" }))
        .await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST, "{}", again.body);
    let metrics = server.get("/metrics").await;
    assert!(
        !metrics.body.contains("model=\"alpha\""),
        "{}",
        metrics.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_preset_names_models_with_their_own_options() {
    if skip_model_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let preset = dir.path().join("models.ini");
    std::fs::write(
        &preset,
        format!(
            "; two names for one checkpoint\n[*]\nn-predict = 3\n\n[small]\nmodel = {}\nctx-size = 256\n\
             alias = tiny\n\n[large-ctx]\nmodel = {}\nc = 1024\n",
            gguf().display(),
            gguf().display()
        ),
    )
    .unwrap();
    let args = vec!["--models-preset".to_owned(), preset.display().to_string()];
    let parsed = parse(&args);
    let argv: Vec<OsString> = args.iter().map(OsString::from).collect();
    let router = build_router(&parsed, argv).unwrap();
    let server = TestServer::start(parsed.server_config().unwrap(), None).await;
    server.state.set_router(router);
    let listed = server.get("/v1/models").await.json();
    assert_eq!(listed["data"][1]["id"], "small");
    assert_eq!(listed["data"][1]["source"], "preset");
    assert_eq!(listed["data"][1]["aliases"], json!(["tiny"]));
    assert!(
        listed["data"][1]["status"]["preset"]
            .as_str()
            .unwrap()
            .contains("ctx-size = 256")
    );
    // The alias reaches the model; the model's options are its own.
    let reply = server
        .post_json("/completion", json!({ "model": "tiny", "prompt": "Hello" }))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["tokens_predicted"], 3, "n-predict from [*]");
    let small = server.get("/props?model=small").await.json();
    assert_eq!(small["default_generation_settings"]["n_ctx"], 256);
    let large = server.get("/props?model=large-ctx").await.json();
    assert_eq!(large["default_generation_settings"]["n_ctx"], 1024);

    // `?reload=1` reads the preset again: a removed model goes (unloaded), a new one comes, a
    // kept one keeps its state; a model that cannot load says why.
    std::fs::write(
        &preset,
        format!(
            "[small]\nmodel = {}\nctx-size = 256\n\n[broken]\nmodel = /no/such/model.gguf\n",
            gguf().display()
        ),
    )
    .unwrap();
    let reloaded = server.get("/models?reload=1").await.json();
    let ids: Vec<&str> = reloaded["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["broken", "small"]);
    assert_eq!(reloaded["data"][1]["status"]["value"], "loaded");
    let failed = server
        .post_json("/tokenize", json!({ "model": "broken", "content": "x" }))
        .await;
    assert_eq!(
        failed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        failed.body
    );
    assert!(
        failed.body.contains("/no/such/model.gguf"),
        "{}",
        failed.body
    );
    let listed = server.get("/models").await.json();
    assert_eq!(listed["data"][0]["status"]["failed"], true);
    assert_eq!(listed["data"][0]["status"]["value"], "unloaded");
}

#[tokio::test]
async fn a_bad_preset_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let preset = dir.path().join("bad.ini");
    std::fs::write(&preset, "[a]\nmodel = /m/a.gguf\nnot-an-option = 1\n").unwrap();
    let args = vec!["--models-preset".to_owned(), preset.display().to_string()];
    let err = build_router(&parse(&args), Vec::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 3") && err.contains("not-an-option"),
        "{err}"
    );
    std::fs::write(&preset, "[a]\nmodel = /m/a.gguf\n[b\n").unwrap();
    let err = build_router(&parse(&args), Vec::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 3"), "{err}");
    let err = build_router(
        &parse(&["--models-dir".into(), "/no/such/dir".into()]),
        Vec::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/no/such/dir"), "{err}");
    let err = build_router(
        &parse(&[
            "--models-dir".into(),
            "/tmp".into(),
            "-m".into(),
            "x.gguf".into(),
        ]),
        Vec::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--models-dir"), "{err}");
}

#[tokio::test]
async fn router_routes_answer_404_on_a_single_model_server() {
    let server = TestServer::start(mlxcel_server::ServerConfig::default(), None).await;
    for (method, path) in [
        ("POST", "/models/load"),
        ("POST", "/models/unload"),
        ("GET", "/models/sse"),
    ] {
        let reply = crate::support::send(server.addr, method, path, &[], Some("{}")).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: {}",
            reply.body
        );
    }
}
