//! LoRA adapters through the server: `"--lora"`, `"--lora-scaled"` and
//! `"--lora-init-without-apply"`, `GET`/`POST` `"/lora-adapters"`, and a request's `"lora"`
//! field, on the default model with two random GGUF adapters written here.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use mlxcel_engine::Engine;
use mlxcel_model::gguf::{GgmlType, GgufValue, GgufWriter};
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

/// SmolLM2-135M's shapes: 30 layers, hidden 576, MLP 1536.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const INTERMEDIATE: usize = 1536;

fn noise(n: usize, seed: u64, amplitude: f32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .flat_map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amplitude;
            x.to_le_bytes()
        })
        .collect()
}

/// A random adapter of rank 8 on every layer's o and down projections.
fn write_adapter(path: &Path, seed: u64, task: &str) {
    let rank = 8u64;
    let mut w = GgufWriter::new();
    w.metadata("general.type", GgufValue::String("adapter".into()))
        .metadata("general.architecture", GgufValue::String("llama".into()))
        .metadata("adapter.type", GgufValue::String("lora".into()))
        .metadata("adapter.lora.alpha", GgufValue::F32(16.0))
        .metadata("adapter.lora.task_name", GgufValue::String(task.into()));
    for layer in 0..LAYERS {
        for (name, out, inp) in [
            ("attn_output", HIDDEN, HIDDEN),
            ("ffn_down", HIDDEN, INTERMEDIATE),
        ] {
            let s = seed * 100 + layer as u64;
            let base = format!("blk.{layer}.{name}.weight");
            w.tensor(
                &format!("{base}.lora_a"),
                &[inp as u64, rank],
                GgmlType::F32,
                noise(inp * 8, s, 0.5),
            );
            w.tensor(
                &format!("{base}.lora_b"),
                &[rank, out as u64],
                GgmlType::F32,
                noise(out * 8, s + 50, 0.5),
            );
        }
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// The two adapters' files, written once per test binary.
fn adapters() -> &'static (PathBuf, PathBuf) {
    static FILES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("mlxcel-lora-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
        write_adapter(&a, 1, "alpha-task");
        write_adapter(&b, 2, "");
        (a, b)
    })
}

/// The server's flags for the two adapters (`b` first, at 0.5; then `a`) and what they make:
/// an engine with both, and a config with their scales.
async fn server(extra: &[&str]) -> (TestServer, PathBuf, PathBuf) {
    let (a, b) = adapters().clone();
    let scaled = format!("{}:0.5", b.display());
    let mut argv = vec!["--lora-scaled", &scaled, "--lora", a.to_str().unwrap()];
    argv.extend_from_slice(extra);
    let args = parse_server_args(&argv).unwrap();
    let options = args.engine_options().unwrap();
    assert_eq!(options.lora_adapters, [b.clone(), a.clone()]);
    let config = ServerConfig {
        lora_scales: args.server_config().unwrap().lora_scales,
        ..ServerConfig::default()
    };
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    (
        TestServer::start(config, Some(Arc::new(engine))).await,
        a,
        b,
    )
}

async fn complete(server: &TestServer, extra: Value) -> String {
    let mut body = json!({"prompt": "The capital of France is", "n_predict": 12, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let reply = server.post_json("/completion", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["content"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn adapters_load_in_flag_order_and_routes_set_their_scales() {
    if skip_model_tests() {
        return;
    }
    let (server, a, b) = server(&[]).await;
    let listed = server.get("/lora-adapters").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(
        listed.json(),
        json!([
            {"id": 0, "path": b.display().to_string(), "scale": 0.5, "task_name": "", "prompt_prefix": ""},
            {"id": 1, "path": a.display().to_string(), "scale": 1.0, "task_name": "alpha-task", "prompt_prefix": ""},
        ])
    );
    // Ids left out go to 0, as llama-server.
    let set = server
        .post_json("/lora-adapters", json!([{"id": 1, "scale": 0.25}]))
        .await;
    assert_eq!(
        (set.status, set.json()),
        (StatusCode::OK, json!({"success": true}))
    );
    let scales: Vec<f64> = server
        .get("/lora-adapters")
        .await
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["scale"].as_f64().unwrap())
        .collect();
    assert_eq!(scales, [0.0, 0.25]);
    // An id that is not loaded, and a body that is not a list, are refused; nothing changes.
    let bad = server
        .post_json("/lora-adapters", json!([{"id": 2, "scale": 1}]))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(
        bad.body.contains("adapter id 2 is not loaded"),
        "{}",
        bad.body
    );
    let bad = server
        .post_json("/lora-adapters", json!({"id": 0, "scale": 1}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    let scales: Vec<f64> = server
        .get("/lora-adapters")
        .await
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["scale"].as_f64().unwrap())
        .collect();
    assert_eq!(scales, [0.0, 0.25]);
}

#[tokio::test(flavor = "multi_thread")]
async fn init_without_apply_starts_at_zero_and_post_applies() {
    if skip_model_tests() {
        return;
    }
    let base = {
        let server = TestServer::with_model(ServerConfig::default()).await;
        complete(&server, json!({})).await
    };
    let (server, _, _) = server(&["--lora-init-without-apply"]).await;
    let scales: Vec<f64> = server
        .get("/lora-adapters")
        .await
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["scale"].as_f64().unwrap())
        .collect();
    assert_eq!(scales, [0.0, 0.0]);
    assert_eq!(
        complete(&server, json!({})).await,
        base,
        "adapters at 0 are the model alone"
    );
    let set = server
        .post_json("/lora-adapters", json!([{"id": 1, "scale": 1.0}]))
        .await;
    assert_eq!(set.status, StatusCode::OK);
    let adapted = complete(&server, json!({})).await;
    assert_ne!(adapted, base, "the applied adapter changed nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_requests_lora_overrides_the_global_scales_for_it_alone() {
    if skip_model_tests() {
        return;
    }
    let (server, _, _) = server(&["--lora-init-without-apply"]).await;
    let base = complete(&server, json!({})).await;
    let one = json!({"lora": [{"id": 1, "scale": 1.0}]});
    let two = json!({"lora": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]});
    let alone_one = complete(&server, one.clone()).await;
    let alone_two = complete(&server, two.clone()).await;
    assert_ne!(alone_one, base);
    assert_ne!(alone_two, alone_one);
    // The global scales are untouched.
    assert_eq!(complete(&server, json!({})).await, base);
    // Three requests with different adapters in the same batch get what each gets alone.
    let (x, y, z) = tokio::join!(
        complete(&server, one.clone()),
        complete(&server, json!({})),
        complete(&server, two.clone())
    );
    assert_eq!((x, y, z), (alone_one.clone(), base.clone(), alone_two));
    // The OpenAI route reads the field too; an id that is not loaded is a 400 naming it.
    let reply = server
        .post_json(
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "lora": [{"id": 1, "scale": 1.0}]}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["choices"][0]["text"], alone_one.as_str());
    let bad = server
        .post_json(
            "/completion",
            json!({"prompt": "x", "n_predict": 1, "lora": [{"id": 7, "scale": 1}]}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
    assert!(
        bad.body.contains("lora") && bad.body.contains("adapter id 7"),
        "{}",
        bad.body
    );
}
