//! llama-server's `/infill`: the prompt assembled around the fill-in-the-middle tokens as
//! llama-server assembles it, plain and streamed, `input_extra`, `--spm-infill`, truncation, and
//! the refusal of a model without FIM tokens.
//!
//! The default model (SmolLM2) has no prefix/suffix/middle tokens (its vocabulary has
//! `<reponame>`, a repository token llama.cpp recognises, and no others), so the FIM tests run
//! on a fixture: the default checkpoint with four unused special tokens of its vocabulary renamed
//! to `<fim_prefix>` (7), `<fim_suffix>` (8), `<fim_middle>` (9) and `<|file_sep|>` (5). The
//! model was not trained on them, so only the prompt is checked, never the text it writes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hyper::StatusCode;
use mlxcel_engine::{Engine, EngineOptions};
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

const PRE: u32 = 7;
const SUF: u32 = 8;
const MID: u32 = 9;
const REP: u32 = 4;
const SEP: u32 = 5;

/// The fixture checkpoint: the default model's files linked, its `tokenizer.json` with the FIM
/// tokens renamed (in the added tokens and the vocabulary).
fn fim_checkpoint(default: &Path) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("infill-fim-checkpoint");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(default).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if name != "tokenizer.json" {
            std::os::unix::fs::symlink(&path, dir.join(name)).unwrap();
        }
    }
    let text = std::fs::read_to_string(default.join("tokenizer.json")).unwrap();
    let mut tokenizer: Value = serde_json::from_str(&text).unwrap();
    let renames = [
        (PRE, "<fim_prefix>"),
        (SUF, "<fim_suffix>"),
        (MID, "<fim_middle>"),
        (SEP, "<|file_sep|>"),
    ];
    for (id, content) in renames {
        let added = tokenizer["added_tokens"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|t| t["id"] == id)
            .unwrap();
        let old = added["content"].as_str().unwrap().to_owned();
        added["content"] = json!(content);
        let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
        assert_eq!(vocab.remove(&old), Some(json!(id)), "{old}");
        vocab.insert(content.to_owned(), json!(id));
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    dir
}

/// An engine on the fixture, loaded once for the binary.
fn fim_engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let dir = fim_checkpoint(&engine().info().dir);
            Arc::new(Engine::load(dir.to_str(), EngineOptions::default()).unwrap())
        })
        .clone()
}

async fn fim_server(config: ServerConfig) -> TestServer {
    let engine = tokio::task::spawn_blocking(fim_engine).await.unwrap();
    TestServer::start(config, Some(engine)).await
}

async fn tokens(server: &TestServer, text: &str) -> Vec<u32> {
    let reply = server
        .post_json("/tokenize", json!({"content": text}))
        .await;
    serde_json::from_value(reply.json()["tokens"].clone()).unwrap()
}

const PREFIX: &str = "def add(a, b):\n    return ";
const SUFFIX: &str = "\n\nprint(add(1, 2))\n";

fn request(extra: Value) -> Value {
    let mut body = json!({
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "prompt": "a",
        "input_extra": [{"filename": "util.py", "text": "x = 1\n"}],
        "n_predict": 6,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The vocabulary's FIM tokens reach the engine: by their text, and the repository token
/// SmolLM2 already has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fim_tokens_are_found_by_their_text() {
    if skip_model_tests() {
        return;
    }
    let fim = tokio::task::spawn_blocking(fim_engine)
        .await
        .unwrap()
        .info()
        .fim_tokens;
    assert_eq!(fim.infill(), Ok((PRE, SUF, MID)));
    assert_eq!((fim.rep, fim.sep, fim.pad), (Some(REP), Some(SEP), None));
    let default = tokio::task::spawn_blocking(engine)
        .await
        .unwrap()
        .info()
        .fim_tokens;
    assert_eq!(default.infill(), Err(vec!["prefix", "suffix", "middle"]));
    assert_eq!(default.rep, Some(REP));
}

/// Worked by hand from llama-server's `format_prompt_infill` (PSM, no BOS for this vocabulary,
/// nothing truncated):
/// `<REP>myproject\n <SEP>util.py\n x = 1\n <SEP>filename\n <PRE>prefix prompt <SUF>suffix <MID>`,
/// each text tokenized on its own without special tokens; the answer reports the prompt it ran
/// (detokenized with its special tokens) and its token count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infill_assembles_the_prompt_as_llama_server_plain_and_streamed() {
    if skip_model_tests() {
        return;
    }
    let server = fim_server(ServerConfig::default()).await;
    let reply = server.post_json("/infill", request(json!({}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(
        body["prompt"],
        "<reponame>myproject\n<|file_sep|>util.py\nx = 1\n<|file_sep|>filename\n\
         <fim_prefix>def add(a, b):\n    return a<fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
    );
    let mut expected = vec![REP];
    expected.extend(tokens(&server, "myproject\n").await);
    expected.push(SEP);
    expected.extend(tokens(&server, "util.py\n").await);
    expected.extend(tokens(&server, "x = 1\n").await);
    expected.push(SEP);
    expected.extend(tokens(&server, "filename\n").await);
    expected.push(PRE);
    expected.extend(tokens(&server, PREFIX).await);
    expected.extend(tokens(&server, "a").await);
    expected.push(SUF);
    expected.extend(tokens(&server, SUFFIX).await);
    expected.push(MID);
    // The tokens, detokenized as the server reports them: the same sequence.
    let detokenized = server
        .post_json("/detokenize", json!({"tokens": expected}))
        .await
        .json();
    assert_eq!(detokenized["content"], body["prompt"]);
    assert_eq!(body["tokens_evaluated"], expected.len());
    assert_eq!(body["stop"], true);
    assert_eq!(body["tokens_predicted"], 6);
    assert_eq!(body["stopped_limit"], true);
    assert_eq!(body["timings"]["prompt_n"], expected.len());
    assert_eq!(body["timings"]["predicted_n"], 6);
    let content = body["content"].as_str().unwrap();

    // Streamed: `/completion`'s events, the same greedy text, the summary last.
    let events = server
        .post_json("/infill", request(json!({"stream": true})))
        .await
        .events();
    let chunks: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (last, pieces) = chunks.split_last().unwrap();
    assert!(pieces.iter().all(|c| c["stop"] == false));
    let streamed: String = pieces
        .iter()
        .map(|c| c["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        format!("{streamed}{}", last["content"].as_str().unwrap()),
        content
    );
    assert_eq!(last["stop"], true);
    assert_eq!(last["tokens_evaluated"], expected.len());
    assert_eq!(last["prompt"], body["prompt"]);
}

/// `--spm-infill` puts the suffix first; without `input_extra` the repository and current-file
/// lines remain (the vocabulary has both tokens); token ids in `input_prefix` pass as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spm_order_mixed_prefixes_and_no_extra_context() {
    if skip_model_tests() {
        return;
    }
    let server = fim_server(ServerConfig {
        spm_infill: true,
        ..ServerConfig::default()
    })
    .await;
    let reply = server
        .post_json(
            "/infill",
            json!({"input_prefix": ["def f(", 2, "):"], "input_suffix": "\n", "n_predict": 1}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        reply.json()["prompt"],
        "<reponame>myproject\n<|file_sep|>filename\n<fim_suffix>\n<fim_prefix>def f(<|im_end|>):<fim_middle>"
    );
}

/// llama-server keeps the last 3 * (2048 / 4) = 1536 tokens of a long prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prefix_keeps_its_last_1536_tokens() {
    if skip_model_tests() {
        return;
    }
    let server = fim_server(ServerConfig::default()).await;
    let prefix = "x = 1\n".repeat(1000);
    let prefix_tokens = tokens(&server, &prefix).await;
    assert!(prefix_tokens.len() > 1536, "{}", prefix_tokens.len());
    let reply = server
        .post_json(
            "/infill",
            json!({"input_prefix": prefix, "input_suffix": SUFFIX, "n_predict": 1}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let header = 1
        + tokens(&server, "myproject\n").await.len()
        + 1
        + tokens(&server, "filename\n").await.len();
    let expected = header + 1 + 1536 + 1 + tokens(&server, SUFFIX).await.len() + 1;
    assert_eq!(reply.json()["tokens_evaluated"], expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infill_refuses_missing_and_malformed_fields() {
    if skip_model_tests() {
        return;
    }
    let server = fim_server(ServerConfig::default()).await;
    for (body, param) in [
        (json!({"input_suffix": "x"}), "input_prefix"),
        (json!({"input_prefix": "x"}), "input_suffix"),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "prompt": [1, 2]}),
            "prompt",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "input_extra": {"text": "z"}}),
            "input_extra",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a.py"}]}),
            "input_extra[0]",
        ),
        (
            json!({"input_prefix": ["x", 999999], "input_suffix": "y"}),
            "input_prefix",
        ),
    ] {
        let error = server
            .post_json("/infill", body.clone())
            .await
            .error(StatusCode::BAD_REQUEST);
        assert_eq!(error["param"], param, "{body}: {error}");
    }
    // The infill fields are not /completion's.
    let error = server
        .post_json("/completion", json!({"prompt": "x", "input_suffix": "y"}))
        .await
        .error(StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "input_suffix");
}

/// The default model has no prefix/suffix/middle tokens: 501 as llama-server answers, naming
/// what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_fim_tokens_is_refused() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let reply = server
        .post_json("/infill", json!({"input_prefix": "a", "input_suffix": "b"}))
        .await;
    let error = reply.error(StatusCode::NOT_IMPLEMENTED);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("no fill-in-the-middle prefix, suffix, middle tokens"),
        "{message}"
    );
}
