//! llama-server's flags that change the model as it loads, end to end on the default model:
//! the RoPE overrides (`--rope-*`, `--yarn-*`) reach the logits a completion reports, and
//! `--override-kv` reaches the GGUF importer (the window, the tokenizer); `/props` names the
//! weight format and the template's capabilities.

use hyper::StatusCode;
use mlxcel_engine::Engine;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

/// A server over an engine of its own, loaded under mlxcel-server's command line `args`.
async fn server_with(args: &[&str]) -> TestServer {
    let parsed = parse_server_args(args).unwrap();
    let options = parsed.engine_options().unwrap();
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap_or_else(|err| panic!("{args:?}: {err}"));
    TestServer::start(ServerConfig::default(), Some(std::sync::Arc::new(engine))).await
}

/// The five most likely first tokens of a fixed prompt with their log-probabilities.
async fn top_logprobs(server: &TestServer) -> Vec<(i64, f64)> {
    let prompt = "The history of the Roman Empire spans many centuries, from the founding of the \
                  city to the fall of Constantinople. Its first emperor was";
    let reply = server
        .post_json(
            "/completion",
            json!({"prompt": prompt, "n_predict": 1, "temperature": 0, "n_probs": 5}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["completion_probabilities"][0]["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_i64().unwrap(), e["logprob"].as_f64().unwrap()))
        .collect()
}

fn same(a: &[(i64, f64)], b: &[(i64, f64)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() < 1e-5)
}

async fn props(server: &TestServer) -> Value {
    let reply = server.get("/props").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread")]
async fn rope_flags_reach_the_logits() {
    if skip_model_tests() {
        return;
    }
    let plain = server_with(&[]).await;
    let base = top_logprobs(&plain).await;
    assert_eq!(props(&plain).await["n_ctx_train"], 8192);
    drop(plain);

    // The model's own values spelled out, and llama.cpp's "from the model" values: the same
    // logits.
    let neutral = server_with(&[
        "--rope-freq-base",
        "100000",
        "--rope-scaling",
        "linear",
        "--rope-freq-scale",
        "1",
        "--yarn-ext-factor",
        "-1",
        "--yarn-attn-factor",
        "-1",
        "--yarn-beta-fast",
        "-1",
        "--yarn-beta-slow",
        "-1",
        "--yarn-orig-ctx",
        "0",
    ])
    .await;
    assert!(same(&top_logprobs(&neutral).await, &base));
    drop(neutral);

    // YaRN four times over the model's window: other logits, and the window is stretched as
    // llama.cpp stretches its training context.
    let yarn = server_with(&[
        "--rope-scaling",
        "yarn",
        "--rope-scale",
        "4",
        "--yarn-orig-ctx",
        "4096",
        "--yarn-beta-fast",
        "16",
        "--yarn-beta-slow",
        "2",
    ])
    .await;
    let stretched = top_logprobs(&yarn).await;
    assert!(!same(&stretched, &base), "{stretched:?} against {base:?}");
    assert_eq!(props(&yarn).await["n_ctx_train"], 4 * 4096);
    drop(yarn);

    // Interpolation only, with an attention factor, at another base.
    let scaled = server_with(&[
        "--yarn-ext-factor",
        "0",
        "--yarn-attn-factor",
        "1.1",
        "--rope-freq-base",
        "50000",
    ])
    .await;
    let other = top_logprobs(&scaled).await;
    assert!(!same(&other, &base) && !same(&other, &stretched));
}

#[test]
fn nonsense_rope_values_are_refused_naming_the_flag() {
    for (args, flag) in [
        (&["--rope-scale", "0"][..], "--rope-scale 0"),
        (&["--rope-freq-base", "-5"][..], "--rope-freq-base -5"),
        (&["--yarn-ext-factor", "-3"][..], "--yarn-ext-factor -3"),
        (
            &["--rope-scale", "2", "--rope-freq-scale", "0.5"][..],
            "--rope-scale/--rope-freq-scale",
        ),
    ] {
        let err = parse_server_args(args)
            .unwrap()
            .engine_options()
            .unwrap_err()
            .to_string();
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    let err = parse_server_args(&["--rope-scaling", "ntk"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--rope-scaling") && err.contains("none, linear or yarn"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn override_kv_reaches_the_gguf_importer() {
    if skip_model_tests() {
        return;
    }
    async fn tokens(server: &TestServer) -> Vec<Value> {
        let reply = server
            .post_json(
                "/tokenize",
                json!({"content": "Hello", "add_special": true}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.json()["tokens"].as_array().unwrap().clone()
    }
    let plain = server_with(&[]).await;
    let plain_tokens = tokens(&plain).await;
    drop(plain);

    let server = server_with(&[
        "--override-kv",
        "llama.context_length=int:4096,tokenizer.ggml.add_bos_token=bool:true",
        "--override-kv",
        "general.unread_key=str:x",
    ])
    .await;
    // The window is the overridden context length, and the tokenizer now adds BOS (id 1).
    assert_eq!(props(&server).await["n_ctx_train"], 4096);
    let with_bos = tokens(&server).await;
    assert_eq!(with_bos.len(), plain_tokens.len() + 1, "{with_bos:?}");
    assert_eq!(with_bos[0], 1);
    // The key no reader asks for is recorded as unread.
    let dir = server.state.engine().unwrap().info().dir.clone();
    let weights = mlxcel_model::GgufWeights::read(&dir).unwrap().unwrap();
    assert_eq!(weights.kv_overrides_unread, ["general.unread_key"]);
    drop(server);

    // A type other than the file's is refused, naming the flag and the item.
    let options = parse_server_args(&["--override-kv", "llama.context_length=float:1.5"])
        .unwrap()
        .engine_options()
        .unwrap();
    let err = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--override-kv llama.context_length=float:1.5") && err.contains("int:"),
        "{err}"
    );
    // A checkpoint directory refuses the flag.
    let dir = mlxcel_model::resolve_model(None).unwrap();
    let options = parse_server_args(&["--override-kv", "a=int:1"])
        .unwrap()
        .engine_options()
        .unwrap();
    let err = Engine::load(dir.to_str(), options).unwrap_err().to_string();
    assert!(
        err.contains("--override-kv a=int:1") && err.contains("GGUF"),
        "{err}"
    );
    // Malformed items are refused before any load.
    let err = parse_server_args(&["--override-kv", "k=int:x"])
        .unwrap()
        .engine_options()
        .unwrap_err()
        .to_string();
    assert!(err.contains("--override-kv k=int:x"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn props_name_the_weight_format_and_the_template_caps() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let props = props(&server).await;
    assert_eq!(props["model_ftype"], "Q4_1");
    let caps = props["chat_template_caps"].as_object().unwrap();
    assert_eq!(caps.len(), 9, "{caps:?}");
    // SmolLM2's ChatML template prints plain-string content and the system message, and
    // renders no tools.
    assert_eq!(caps["supports_string_content"], true);
    assert_eq!(caps["supports_system_role"], true);
    assert_eq!(caps["supports_tools"], false);
    assert_eq!(caps["supports_tool_calls"], false);
    // No separate tool-use template: the field is absent, as llama-server leaves it out.
    assert!(props.get("chat_template_tool_use").is_none(), "{props}");
}
