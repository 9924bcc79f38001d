//! llama-server request fields and metrics once deferred (issue #57): the adaptive-p
//! sampler (`adaptive_target`, `adaptive_decay`, `--adaptive-target`, `--adaptive-decay`), the
//! accepted tokens per draft position in `/metrics`, `n_indent`, and `reasoning_format` /
//! `continue_final_message` on the routes that answer raw text.

use std::sync::Arc;

use hyper::StatusCode;
use mlxcel_engine::{Engine, EngineOptions, SamplerStage, SpeculativeConfig};
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

/// The generated tokens' ids of a `/completion` reply with `n_probs`.
fn token_ids(reply: &Value) -> Vec<u64> {
    reply["completion_probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect()
}

/// Adaptive-p on `/completion`: named in `samplers` with a target, it reshapes the draw (the
/// post-sampling probabilities are its reshaped ones, and a low target makes the top token
/// unlikely); the fields are echoed in `generation_settings`; with the target alone (not named)
/// the chain is unchanged, as in llama.cpp; out of range, a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_p_reshapes_the_draw_when_the_chain_names_it() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let base = json!({
        "prompt": "The capital of France is", "n_predict": 8, "seed": 11, "n_probs": 3,
        "post_sampling_probs": true, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
        "temperature": 1.0,
    });
    let with = |extra: Value| {
        let mut body = base.clone();
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let plain = server
        .post_json("/completion", with(json!({"samplers": ["temperature"]})))
        .await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.body);
    let unnamed = server
        .post_json(
            "/completion",
            with(json!({"samplers": ["temperature"], "adaptive_target": 0.05})),
        )
        .await;
    assert_eq!(
        token_ids(&plain.json()),
        token_ids(&unnamed.json()),
        "the target alone leaves the chain as it is"
    );
    let adaptive = server
        .post_json(
            "/completion",
            with(json!({
                "samplers": ["temperature", "adaptive_p"],
                "adaptive_target": 0.05, "adaptive_decay": 0.5,
            })),
        )
        .await;
    assert_eq!(adaptive.status, StatusCode::OK, "{}", adaptive.body);
    let reply = adaptive.json();
    let settings = &reply["generation_settings"];
    assert_eq!(settings["adaptive_target"], json!(0.05f32));
    assert_eq!(settings["adaptive_decay"], json!(0.5));
    assert_eq!(settings["samplers"], json!(["temperature", "adaptive_p"]));
    // Reshaped toward p = 0.05 (or below, as the average adapts): the token drawn is not the
    // model's favourite at every step, and the reported distribution is the reshaped one.
    assert_ne!(token_ids(&reply), token_ids(&plain.json()));
    for field in [
        json!({"adaptive_target": 1.5}),
        json!({"adaptive_decay": 1.0}),
        json!({"adaptive_decay": -0.5}),
    ] {
        let name = field.as_object().unwrap().keys().next().unwrap().clone();
        let bad = server.post_json("/completion", with(field)).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
        assert!(bad.body.contains(&name), "{}", bad.body);
    }
    // The letter `a` is adaptive-p too.
    let letters = server
        .post_json("/completion", with(json!({"samplers": "ta"})))
        .await;
    assert_eq!(
        letters.json()["generation_settings"]["samplers"],
        json!(["temperature", "adaptive_p"])
    );
}

/// `--adaptive-target` and `--adaptive-decay` are the defaults of requests that send none.
#[test]
fn adaptive_flags_are_request_defaults() {
    let args = parse_server_args(&[
        "--adaptive-target",
        "0.4",
        "--adaptive-decay",
        "0.8",
        "--samplers",
        "min_p;adaptive_p",
    ])
    .unwrap();
    let config = args.server_config().unwrap();
    assert_eq!(config.sampling_defaults.adaptive_target, Some(0.4));
    assert_eq!(config.sampling_defaults.adaptive_decay, Some(0.8));
    assert_eq!(
        config.sampling_chain.samplers,
        Some(vec![SamplerStage::MinP, SamplerStage::AdaptiveP])
    );
    let negative = parse_server_args(&["--adaptive-target", "-1"]).unwrap();
    assert_eq!(
        negative
            .server_config()
            .unwrap()
            .sampling_defaults
            .adaptive_target,
        Some(-1.0)
    );
}

/// With prompt-lookup speculation, `/metrics` has llama-server's labelled counter of accepted
/// tokens per draft position: a series per position up to the draft length, summing to the
/// accepted tokens and never growing with the position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_accepted_tokens_per_draft_position() {
    if skip_model_tests() {
        return;
    }
    let engine = tokio::task::spawn_blocking(|| {
        let speculative = SpeculativeConfig {
            draft_max: 6,
            ..SpeculativeConfig::default()
        };
        Engine::load(
            None,
            EngineOptions {
                speculative: Some(speculative),
                ..EngineOptions::default()
            },
        )
        .unwrap()
    })
    .await
    .unwrap();
    let config = ServerConfig {
        metrics: true,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, Some(Arc::new(engine))).await;
    let name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total";
    let before = server.get("/metrics").await;
    assert!(!before.body.contains(name), "{}", before.body);
    let reply = server
        .post_json(
            "/completion",
            json!({
                "prompt": "Copy this list twice: apple, banana, cherry, date, elderberry, fig, \
                           grape. apple, banana, cherry,",
                "n_predict": 40, "temperature": 0,
            }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let metrics = server.get("/metrics").await.body;
    assert!(
        metrics.contains(&format!(
            "# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter\n"
        )),
        "{metrics}"
    );
    let per_position: Vec<u64> = (0..6)
        .map(|i| {
            let series = format!("{name}{{position=\"{i}\"}} ");
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&series)?.parse().ok())
                .unwrap_or_else(|| panic!("{series} missing from:\n{metrics}"))
        })
        .collect();
    assert!(!metrics.contains(&format!("{name}{{position=\"6\"}}")));
    let accepted: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("llamacpp:spec_decode_num_accepted_tokens_total ")?
                .parse()
                .ok()
        })
        .unwrap();
    assert!(accepted > 0, "{metrics}");
    assert_eq!(per_position.iter().sum::<u64>(), accepted);
    assert!(
        per_position.windows(2).all(|w| w[0] >= w[1]),
        "{per_position:?}"
    );
}

/// The text llama-server keeps under `n_indent = min`: cut at the first character of the first
/// line after the output's first newline that is indented by fewer than `min` spaces or tabs
/// (an empty line included), or `None` when no line is.
fn indent_cut(text: &str, min: usize) -> Option<String> {
    let first = text.find('\n')? + 1;
    let mut start = first;
    loop {
        let line = &text[start..];
        let indent = line.chars().take_while(|c| *c == ' ' || *c == '\t').count();
        if indent == line.len() {
            return None;
        }
        if indent < min {
            return Some(text[..start + indent].to_owned());
        }
        start += line.find('\n')? + 1;
    }
}

/// `n_indent` on `/completion` and `/infill`'s shared path, plain and streamed: the greedy
/// output ends at the first new line indented too little, cut where its indentation ends, as a
/// length stop; a negative value is a 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_indent_ends_the_output_at_a_line_indented_too_little() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let body = json!({
        "prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "n_predict": 64,
        "temperature": 0,
    });
    let free = server.post_json("/completion", body.clone()).await.json();
    let text = free["content"].as_str().unwrap().to_owned();
    let expected = indent_cut(&text, 4)
        .unwrap_or_else(|| panic!("no line indented under 4 in {text:?}: pick another prompt"));
    let mut with_indent = body.clone();
    with_indent["n_indent"] = json!(4);
    let cut = server
        .post_json("/completion", with_indent.clone())
        .await
        .json();
    assert_eq!(cut["content"], json!(expected), "free output: {text:?}");
    assert_eq!(cut["stop_type"], "limit", "{cut}");
    assert_eq!(cut["stopped_limit"], true, "{cut}");
    with_indent["stream"] = json!(true);
    let streamed = server.post_json("/completion", with_indent).await;
    let content: String = sse_events(&streamed.body)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|e| e["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(content, expected);
    let mut bad = body;
    bad["n_indent"] = json!(-2);
    let reply = server.post_json("/completion", bad).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
    assert!(reply.body.contains("n_indent"), "{}", reply.body);
}

/// `reasoning_format` and `continue_final_message` on the routes that answer raw text: as in
/// llama-server, they feed a chat parser whose result those answers never show, so a valid
/// value changes nothing (the greedy text is the same) and an invalid one is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parser_fields_are_checked_and_change_nothing_on_raw_text_routes() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    for (path, body, text) in [
        (
            "/completion",
            json!({"prompt": "<think>The capital of France is", "n_predict": 8, "temperature": 0}),
            "/content",
        ),
        (
            "/v1/completions",
            json!({"prompt": "<think>The capital of France is", "max_tokens": 8, "temperature": 0}),
            "/choices/0/text",
        ),
    ] {
        let plain = server.post_json(path, body.clone()).await.json();
        for extra in [
            json!({"reasoning_format": "deepseek", "continue_final_message": true}),
            json!({"reasoning_format": "none", "continue_final_message": "reasoning_content"}),
            json!({"reasoning_format": "deepseek-legacy", "continue_final_message": false}),
        ] {
            let mut with = body.clone();
            for (k, v) in extra.as_object().unwrap() {
                with[k] = v.clone();
            }
            let reply = server.post_json(path, with).await;
            assert_eq!(
                reply.status,
                StatusCode::OK,
                "{path} {extra}: {}",
                reply.body
            );
            assert_eq!(
                reply.json().pointer(text),
                plain.pointer(text),
                "{path} {extra}"
            );
        }
        for (field, value) in [
            ("reasoning_format", json!("bogus")),
            ("continue_final_message", json!(3)),
        ] {
            let mut with = body.clone();
            with[field] = value;
            let reply = server.post_json(path, with).await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{path}: {}",
                reply.body
            );
            assert!(reply.body.contains(field), "{path}: {}", reply.body);
        }
    }
}

/// Lazy grammars on `/completion`: the output is free until a trigger appears, then the grammar
/// applies from the trigger's start (here it forces `!!!` after the trigger's text and ends the
/// output); without `grammar_lazy` the same grammar applies from the first token. A lazy grammar
/// without triggers, a bad trigger, and a one-token word not among `preserved_tokens` are 400s
/// naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_grammar_applies_from_its_trigger_on() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let base = json!({"prompt": "The capital of France is", "n_predict": 16, "temperature": 0});
    let mut probed = base.clone();
    probed["n_probs"] = json!(1);
    let free = server.post_json("/completion", probed).await.json();
    let pieces: Vec<String> = free["completion_probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap().to_owned())
        .collect();
    let text: String = pieces.concat();
    // The first later token that is a plain word and whose text appears first where it is.
    let (j, word) = pieces
        .iter()
        .enumerate()
        .skip(1)
        .find(|(j, p)| {
            let w = p.trim_start();
            w.len() >= 3
                && w.chars().all(|c| c.is_ascii_alphabetic())
                && text.find(p.as_str()) == Some(pieces[..*j].concat().len())
        })
        .map(|(j, p)| (j, p.clone()))
        .unwrap_or_else(|| panic!("no plain word among {pieces:?}: pick another prompt"));
    let grammar = format!("root ::= \"{word}\" \"!!!\"");
    let trigger = json!([{"type": 2, "value": format!("({})", regex_escape(&word))}]);
    let mut lazy = base.clone();
    lazy["grammar"] = json!(grammar);
    lazy["grammar_lazy"] = json!(true);
    lazy["grammar_triggers"] = trigger.clone();
    let reply = server.post_json("/completion", lazy.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(
        reply.json()["content"],
        json!(format!("{}{word}!!!", pieces[..j].concat())),
        "free output: {pieces:?}"
    );
    // Not lazy: the grammar applies from the start.
    let mut eager = lazy.clone();
    eager["grammar_lazy"] = json!(false);
    let reply = server.post_json("/completion", eager).await;
    assert_eq!(reply.json()["content"], json!(format!("{word}!!!")));
    // The checks.
    let mut no_triggers = lazy.clone();
    no_triggers["grammar_triggers"] = json!([]);
    let tokenized = server
        .post_json("/tokenize", json!({"content": "Hello"}))
        .await
        .json();
    assert_eq!(
        tokenized["tokens"].as_array().unwrap().len(),
        1,
        "{tokenized}"
    );
    let mut unpreserved = lazy.clone();
    unpreserved["grammar_triggers"] = json!([{"type": 1, "value": "Hello"}]);
    let mut bad_type = lazy.clone();
    bad_type["grammar_triggers"] = json!([{"type": 9, "value": "x"}]);
    let mut bad_pattern = lazy.clone();
    bad_pattern["grammar_triggers"] = json!([{"type": 2, "value": "(?=x)"}]);
    for (body, field) in [
        (no_triggers, "grammar_lazy"),
        (unpreserved.clone(), "grammar_triggers"),
        (bad_type, "grammar_triggers"),
        (bad_pattern, "trigger"),
    ] {
        let reply = server.post_json("/completion", body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.body);
        assert!(reply.body.contains(field), "{}", reply.body);
    }
    unpreserved["preserved_tokens"] = json!(["Hello"]);
    let reply = server.post_json("/completion", unpreserved).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// `text` with the regex metacharacters escaped.
fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}
