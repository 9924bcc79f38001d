//! llama-server's slot actions: `POST /slots/{id_slot}?action=save|restore|erase` with
//! `--slot-save-path`, on the default model.

use std::sync::Arc;

use hyper::StatusCode;
use mlxcel_engine::{BackendKind, Engine, EngineOptions, ShapeMode};
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::*;

/// The route under test, as the router spells it, and its query parameter.
const ROUTE: &str = "/slots/{id_slot}";
const ACTION: &str = "action";

fn slot(id: &str, action: &str) -> String {
    format!("{}?{ACTION}={action}", ROUTE.replace("{id_slot}", id))
}

/// An engine of its own with the prefix cache on (a restarted server has an empty one).
async fn cached_engine() -> Arc<Engine> {
    engine_with(EngineOptions::default()).await
}

/// [`cached_engine`] with other options.
async fn engine_with(options: EngineOptions) -> Arc<Engine> {
    let options = EngineOptions {
        prefix_cache_bytes: 1 << 30,
        ..options
    };
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    Arc::new(engine)
}

fn config(dir: &std::path::Path) -> ServerConfig {
    ServerConfig {
        slot_save_path: Some(dir.to_owned()),
        parallel: 4,
        ..ServerConfig::default()
    }
}

const PROMPT: &str = "The history of the printing press begins in the fifteenth century, when";

async fn complete(server: &TestServer) -> Value {
    let reply = server
        .post_json(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 6, "temperature": 0}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

/// A slot saved by one server restores into another on the same model (a restart): the next
/// request with the same prompt reuses every position but the last prompt token and answers as
/// the first server did; erasing drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_slot_restores_into_a_restarted_server_and_is_reused() {
    if skip_model_tests() {
        return;
    }
    save_restore_and_reuse(EngineOptions::default()).await;
}

/// The same on the OpenXLA backend (a server's bucket set), whose slots are rows of static
/// caches; a file saved by the MLX backend is refused there, naming both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_slot_restores_on_the_xla_backend() {
    if skip_model_tests() {
        return;
    }
    let xla = EngineOptions {
        backend: BackendKind::Xla,
        shapes: ShapeMode::ServerBuckets,
        ..EngineOptions::default()
    };
    let dir = save_restore_and_reuse(xla.clone()).await;
    let mlx = TestServer::start(config(dir.path()), Some(cached_engine().await)).await;
    complete(&mlx).await;
    let saved = mlx
        .post_json(&slot("0", "save"), json!({"filename": "from-mlx.bin"}))
        .await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let server = TestServer::start(config(dir.path()), Some(engine_with(xla).await)).await;
    let refused = server
        .post_json(&slot("0", "restore"), json!({"filename": "from-mlx.bin"}))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(
        refused
            .body
            .contains("saved by the mlx backend, and this server runs the xla backend"),
        "{}",
        refused.body
    );
}

/// Saves a slot on one server of `options`, restores it into another (a restart) and checks
/// that the next request with the same prompt reuses it; returns the directory of the files.
async fn save_restore_and_reuse(options: EngineOptions) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let first =
        TestServer::start(config(dir.path()), Some(engine_with(options.clone()).await)).await;
    let original = complete(&first).await;
    let prompt_n = original["timings"]["prompt_n"].as_u64().unwrap();
    // The answer names the slot to save.
    assert_eq!(original["id_slot"], 0, "{original}");
    assert_eq!(original["timings"]["cache_n"], 0, "{original}");
    // The request ran in slot 0 (the lowest free one); its cache is the prompt and the tokens
    // generated but the last.
    let saved = first
        .post_json(&slot("0", "save"), json!({"filename": "printing.bin"}))
        .await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let saved = saved.json();
    assert_eq!(saved["id_slot"], 0);
    assert_eq!(saved["filename"], "printing.bin");
    assert_eq!(saved["n_saved"].as_u64().unwrap(), prompt_n + 5, "{saved}");
    let file = dir.path().join("printing.bin");
    assert_eq!(
        saved["n_written"].as_u64().unwrap(),
        std::fs::metadata(&file).unwrap().len()
    );
    assert!(saved["timings"]["save_ms"].as_f64().unwrap() >= 0.0);
    // A slot that never ran saves nothing.
    let empty = first
        .post_json(&slot("3", "save"), json!({"filename": "empty.bin"}))
        .await
        .json();
    assert_eq!(empty["n_saved"], 0, "{empty}");

    let second = TestServer::start(config(dir.path()), Some(engine_with(options).await)).await;
    let restored = second
        .post_json(&slot("2", "restore"), json!({"filename": "printing.bin"}))
        .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.body);
    let restored = restored.json();
    assert_eq!(restored["id_slot"], 2);
    assert_eq!(restored["n_restored"], saved["n_saved"], "{restored}");
    assert_eq!(restored["n_read"], saved["n_written"], "{restored}");
    assert!(restored["timings"]["restore_ms"].as_f64().unwrap() >= 0.0);
    // While a request with that prompt runs, /slots shows what the cache held.
    let mut stream = second
        .open(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 100, "temperature": 0, "stream": true,
                   "ignore_eos": true}),
        )
        .await;
    let chunk = next_chunk(&mut stream).await.unwrap();
    let slots = second.get("/slots").await.json();
    let busy = slots
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["is_processing"] == true)
        .unwrap_or_else(|| panic!("no busy slot: {slots}"));
    assert_eq!(busy["n_prompt_tokens_cache"], prompt_n - 1, "{busy}");
    assert_eq!(busy["n_prompt_tokens_processed"], 1, "{busy}");
    // Each streamed piece names the slot too.
    assert!(
        chunk.contains(&format!("\"id_slot\":{}", busy["id"])),
        "{chunk}"
    );
    drop(stream);
    let again = complete(&second).await;
    assert_eq!(
        again["timings"]["cache_n"].as_u64().unwrap(),
        prompt_n - 1,
        "{again}"
    );
    assert_eq!(again["timings"]["prompt_n"], 1, "{again}");
    assert_eq!(again["content"], original["content"]);

    // Erasing slot 2 drops what was restored into it; a second erase finds nothing.
    let erased = second.post(&slot("2", "erase"), "").await.json();
    assert_eq!(
        erased,
        json!({"id_slot": 2, "n_erased": restored["n_restored"]})
    );
    let erased = second.post(&slot("2", "erase"), "").await.json();
    assert_eq!(erased["n_erased"], 0);
    // The empty file restores nothing.
    let nothing = second
        .post_json(&slot("1", "restore"), json!({"filename": "empty.bin"}))
        .await
        .json();
    assert_eq!(nothing["n_restored"], 0, "{nothing}");
    dir
}

/// Bad actions, slots and file names, missing, corrupt and foreign files are 400s that say what
/// to change; a server without `--slot-save-path` answers 501 as llama-server does; restoring
/// without the prefix cache is refused with the flag that turns it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_actions_refuse_bad_input_with_the_reason() {
    if skip_model_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(config(dir.path()), Some(cached_engine().await)).await;
    let refused = |reply: Reply, needle: &str| {
        let body = reply.llama_error(StatusCode::BAD_REQUEST);
        let message = body["message"].as_str().unwrap().to_owned();
        assert!(message.contains(needle), "{message}");
    };
    let save = |name: &str| json!({"filename": name});
    refused(
        server.post_json(&slot("0", "bogus"), save("a")).await,
        "invalid action `bogus`",
    );
    refused(
        server
            .post_json(ROUTE.replace("{id_slot}", "0").as_str(), save("a"))
            .await,
        "?action=save",
    );
    refused(
        server.post_json(&slot("9", "save"), save("a")).await,
        "slots 0 to 3",
    );
    refused(
        server.post_json(&slot("x", "save"), save("a")).await,
        "invalid slot id",
    );
    refused(server.post(&slot("0", "save"), "").await, "\"filename\"");
    refused(
        server
            .post_json(&slot("0", "save"), save("../outside.bin"))
            .await,
        "directory part",
    );
    refused(
        server
            .post_json(&slot("0", "save"), json!({"filename": 7}))
            .await,
        "filename",
    );
    refused(
        server
            .post_json(&slot("0", "restore"), save("missing.bin"))
            .await,
        "no such file in --slot-save-path",
    );
    assert!(!dir.path().join("../outside.bin").exists());

    // A good file, then corrupt and foreign copies of it.
    complete(&server).await;
    let saved = server.post_json(&slot("0", "save"), save("good.bin")).await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let good = std::fs::read(dir.path().join("good.bin")).unwrap();
    let mut flipped = good.clone();
    let at = good.len() - 100;
    flipped[at] ^= 0x40;
    std::fs::write(dir.path().join("flipped.bin"), &flipped).unwrap();
    refused(
        server
            .post_json(&slot("1", "restore"), save("flipped.bin"))
            .await,
        "checksum",
    );
    std::fs::write(dir.path().join("short.bin"), &good[..good.len() / 2]).unwrap();
    refused(
        server
            .post_json(&slot("1", "restore"), save("short.bin"))
            .await,
        "truncated or corrupt",
    );
    // The same file as another model would have written it: its fingerprint differs, its
    // checksum is right.
    let header_len = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&good[16..16 + header_len]).unwrap();
    header["model"] = json!("another-model");
    header["model_fingerprint"] = json!("00".repeat(32));
    let header = serde_json::to_vec(&header).unwrap();
    let mut foreign = good[..12].to_vec();
    foreign.extend_from_slice(&(header.len() as u32).to_le_bytes());
    foreign.extend_from_slice(&header);
    foreign.extend_from_slice(&good[16 + header_len..good.len() - 32]);
    let digest = Sha256::digest(&foreign);
    foreign.extend_from_slice(&digest);
    std::fs::write(dir.path().join("foreign.bin"), &foreign).unwrap();
    refused(
        server
            .post_json(&slot("1", "restore"), save("foreign.bin"))
            .await,
        "saved from model `another-model`",
    );
    // The server keeps serving, and the good file still restores.
    let restored = server
        .post_json(&slot("1", "restore"), save("good.bin"))
        .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.body);

    // The shared engine has no prefix cache (an embedder's default).
    let no_cache = TestServer::with_model(config(dir.path())).await;
    refused(
        no_cache
            .post_json(&slot("0", "restore"), save("good.bin"))
            .await,
        "--cache-ram",
    );
    let off = TestServer::with_model(ServerConfig::default()).await;
    let reply = off.post_json(&slot("0", "save"), save("a.bin")).await;
    let body = reply.llama_error(StatusCode::NOT_IMPLEMENTED);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--slot-save-path"),
        "{body}"
    );
}

/// An action on a slot a request holds waits for the request to end, as llama-server defers it:
/// a save sent while a stream runs in slot 0 writes that stream's whole cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_on_a_busy_slot_waits_for_its_request() {
    if skip_model_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(config(dir.path()), Some(cached_engine().await)).await;
    let mut stream = server
        .open(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 40, "temperature": 0, "stream": true,
                   "ignore_eos": true}),
        )
        .await;
    next_chunk(&mut stream).await;
    let addr = server.addr;
    let save = tokio::spawn(async move {
        send(
            addr,
            "POST",
            &slot("0", "save"),
            &[],
            Some(r#"{"filename": "busy.bin"}"#),
        )
        .await
    });
    // The stream runs on; the save has not answered.
    let mut pieces = 1;
    while let Some(chunk) = next_chunk(&mut stream).await {
        if chunk.contains("\"stop\":true") {
            break;
        }
        pieces += 1;
        if pieces == 5 {
            assert!(
                !save.is_finished(),
                "the save answered while the slot was busy"
            );
        }
    }
    let saved = save.await.unwrap();
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let saved = saved.json();
    let prompt_n = complete(&server).await["tokens_evaluated"]
        .as_u64()
        .unwrap();
    assert_eq!(saved["n_saved"].as_u64().unwrap(), prompt_n + 39, "{saved}");
}
