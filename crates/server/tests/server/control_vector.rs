//! Control vectors through the server: `"--control-vector"`, `"--control-vector-scaled"` and
//! `"--control-vector-layer-range"` reach the logits a completion reports, on the default model
//! with random vectors written here; a malformed file is refused at start, named.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hyper::StatusCode;
use mlxcel_engine::Engine;
use mlxcel_model::gguf::{GgmlType, GgufValue, GgufWriter};
use mlxcel_server::ServerConfig;
use serde_json::json;

use crate::support::*;

/// SmolLM2-135M's shapes: 30 layers, hidden 576.
const LAYERS: usize = 30;
const HIDDEN: usize = 576;

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

/// A control vector as llama.cpp's cvector-generator writes one: `direction.N` for `layers`,
/// each `width` F32 values.
fn write_vector(path: &Path, layers: std::ops::Range<usize>, width: usize) {
    let mut w = GgufWriter::new();
    w.metadata(
        "general.architecture",
        GgufValue::String("controlvector".into()),
    );
    for layer in layers {
        w.tensor(
            &format!("direction.{layer}"),
            &[width as u64],
            GgmlType::F32,
            noise(width, layer as u64 + 7, 0.5),
        );
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A good vector (every layer but 0) and one whose `direction.3` is 100 wide, written once.
fn vectors() -> &'static (PathBuf, PathBuf) {
    static FILES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("mlxcel-cvec-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (good, bad) = (dir.join("steer.gguf"), dir.join("narrow.gguf"));
        write_vector(&good, 1..LAYERS, HIDDEN);
        write_vector(&bad, 3..4, 100);
        (good, bad)
    })
}

/// An engine loaded under mlxcel-server's command line `args`, or its error.
async fn engine_with(args: &[&str]) -> Result<Engine, String> {
    let parsed = parse_server_args(args).map_err(|e| e.to_string())?;
    let options = parsed.engine_options().map_err(|e| e.to_string())?;
    tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .map_err(|e| e.to_string())
}

/// The greedy text and the five most likely first tokens of a fixed prompt, on a server loaded
/// with `args`.
async fn completion(args: &[&str]) -> (String, Vec<(i64, f64)>) {
    let engine = engine_with(args)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let server =
        TestServer::start(ServerConfig::default(), Some(std::sync::Arc::new(engine))).await;
    let reply = server
        .post_json(
            "/completion",
            json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
                   "n_probs": 5}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    let top = body["completion_probabilities"][0]["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_i64().unwrap(), e["logprob"].as_f64().unwrap()))
        .collect();
    (body["content"].as_str().unwrap().to_owned(), top)
}

fn same(a: &[(i64, f64)], b: &[(i64, f64)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-5)
}

#[tokio::test(flavor = "multi_thread")]
async fn control_vectors_change_the_output_and_their_flags_reach_the_model() {
    if skip_model_tests() {
        return;
    }
    let (good, _) = vectors();
    let good = good.to_str().unwrap();
    let (base_text, base) = completion(&[]).await;
    let (steered_text, steered) = completion(&["--control-vector", good]).await;
    assert!(
        !same(&base, &steered),
        "the vector moved nothing: {base:?} {steered:?}"
    );
    assert_ne!(base_text, steered_text);
    // At scale 0 the vector adds nothing: the model alone, to the last digit.
    let zero = format!("{good}:0");
    let (_, zeroed) = completion(&["--control-vector-scaled", &zero]).await;
    assert!(same(&base, &zeroed), "{base:?} {zeroed:?}");
    // Scale 1 twice (the file given twice, summed) is scale 2 once.
    let two = format!("{good}:2");
    let (_, doubled) = completion(&["--control-vector", &format!("{good},{good}")]).await;
    let (_, scaled) = completion(&["--control-vector-scaled", &two]).await;
    assert!(same(&doubled, &scaled), "{doubled:?} {scaled:?}");
    assert!(!same(&doubled, &steered));
    // A range of the last layer only moves less than every layer: neither the model alone nor
    // the whole vector.
    let (_, last) = completion(&[
        "--control-vector",
        good,
        "--control-vector-layer-range",
        "29",
        "29",
    ])
    .await;
    assert!(!same(&last, &base) && !same(&last, &steered), "{last:?}");
    // A range from 1 to past the last layer is the default range.
    let (_, all) = completion(&[
        "--control-vector",
        good,
        "--control-vector-layer-range",
        "0",
        "99",
    ])
    .await;
    assert!(same(&all, &steered), "{all:?} {steered:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_control_vector_is_refused_at_start_naming_the_file() {
    if skip_model_tests() {
        return;
    }
    let (good, bad) = vectors();
    let err = engine_with(&[
        "--control-vector",
        good.to_str().unwrap(),
        "--control-vector",
        bad.to_str().unwrap(),
    ])
    .await
    .err()
    .unwrap_or_else(|| panic!("a 100-wide direction on a 576-wide model loads"));
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(
        err.contains("`direction.3`") && err.contains("100 values") && err.contains("576"),
        "{err}"
    );
    let err = engine_with(&["--control-vector-layer-range", "1", "4"])
        .await
        .err()
        .unwrap_or_else(|| panic!("a range without a vector loads"));
    assert!(err.contains("--control-vector-layer-range"), "{err}");
    // The OpenXLA backend's compiled programs add nothing between layers: refused by name.
    let err = engine_with(&[
        "--backend",
        "xla",
        "--control-vector",
        good.to_str().unwrap(),
    ])
    .await
    .err()
    .unwrap_or_else(|| panic!("a control vector on the xla backend loads"));
    assert!(
        err.contains("control vectors") && err.contains("xla"),
        "{err}"
    );
    let missing = good.with_file_name("missing.gguf");
    let err = engine_with(&["--control-vector", missing.to_str().unwrap()])
        .await
        .err()
        .unwrap_or_else(|| panic!("a missing file loads"));
    assert!(err.contains("missing.gguf"), "{err}");
}

/// Keys and values computed under a control vector hold only under the same vector: a slot
/// file saved by a server without one is refused by a server with one (the vector's digest is
/// part of the model's fingerprint), while that server restores its own file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_saved_under_another_control_vector_is_refused() {
    if skip_model_tests() {
        return;
    }
    let (good, _) = vectors();
    let dir = tempfile::tempdir().unwrap();
    let config = || ServerConfig {
        slot_save_path: Some(dir.path().to_owned()),
        ..ServerConfig::default()
    };
    let route = |action: &str| format!("/slots/0?action={action}");
    let body = json!({"prompt": "The capital of France is", "n_predict": 4, "temperature": 0});
    async fn load(args: &[&str]) -> std::sync::Arc<Engine> {
        let mut options = parse_server_args(args).unwrap().engine_options().unwrap();
        options.prefix_cache_bytes = 1 << 30;
        let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
            .await
            .unwrap()
            .unwrap();
        std::sync::Arc::new(engine)
    }
    let plain = TestServer::start(config(), Some(load(&[]).await)).await;
    let reply = plain.post_json("/completion", body.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let saved = plain
        .post_json(&route("save"), json!({"filename": "plain.bin"}))
        .await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);

    let steered = TestServer::start(
        config(),
        Some(load(&["--control-vector", good.to_str().unwrap()]).await),
    )
    .await;
    let refused = steered
        .post_json(&route("restore"), json!({"filename": "plain.bin"}))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(refused.body.contains("fingerprint"), "{}", refused.body);
    // Its own file, saved under the same vector, restores.
    let reply = steered.post_json("/completion", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let saved = steered
        .post_json(&route("save"), json!({"filename": "steered.bin"}))
        .await;
    assert_eq!(saved.status, StatusCode::OK, "{}", saved.body);
    let restored = steered
        .post_json(&route("restore"), json!({"filename": "steered.bin"}))
        .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.body);
}
