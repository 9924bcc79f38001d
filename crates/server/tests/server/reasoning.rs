//! Reasoning models: `reasoning_format` splits a chat reply into `reasoning_content` and
//! `content` (whole and streamed), the reasoning fields are checked, and the reasoning flags
//! reach the server's settings. The default model does not think, so a grammar makes it write a
//! `<think>` block (its tokenizer cuts the tags into several tokens, as a stream would).

use clap::Parser;
use hyper::StatusCode;
use mlxcel_server::{ReasoningFormat, ServerArgs, ServerConfig, normalize_llama_args};
use serde_json::{Value, json};

use crate::support::*;

const GRAMMAR: &str = r#"root ::= "<think>\nTwo and two make four.\n</think>\n\nFour.""#;

fn request(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "grammar": GRAMMAR,
        "temperature": 0,
        "max_tokens": 64,
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_replies_split_reasoning_from_the_answer() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;

    // The default format (`auto`) splits.
    let whole = server
        .post_json("/v1/chat/completions", request(json!({})))
        .await
        .json();
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        message["reasoning_content"], "Two and two make four.",
        "{whole}"
    );
    assert_eq!(message["content"], "Four.", "{whole}");

    // `deepseek-legacy` keeps the whole reply in `content` as well.
    let legacy = server
        .post_json(
            "/v1/chat/completions",
            request(json!({"reasoning_format": "deepseek-legacy"})),
        )
        .await
        .json();
    let message = &legacy["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Two and two make four.");
    assert_eq!(
        message["content"],
        "<think>\nTwo and two make four.\n</think>\n\nFour."
    );

    // `none` leaves the reply whole, with no `reasoning_content`.
    let none = server
        .post_json(
            "/v1/chat/completions",
            request(json!({"reasoning_format": "none"})),
        )
        .await
        .json();
    let message = &none["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{none}");
    assert_eq!(
        message["content"],
        "<think>\nTwo and two make four.\n</think>\n\nFour."
    );

    // Streamed: reasoning deltas, then content deltas, adding up to the same split.
    let streamed = server
        .post_json(
            "/v1/chat/completions",
            request(json!({"stream": true, "reasoning_format": "deepseek"})),
        )
        .await;
    let (mut reasoning, mut content, mut content_started) = (String::new(), String::new(), false);
    for event in streamed.events() {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        if let Some(piece) = delta["reasoning_content"].as_str() {
            assert!(!content_started, "reasoning after content: {event}");
            reasoning.push_str(piece);
        }
        if let Some(piece) = delta["content"].as_str() {
            content_started |= !piece.is_empty();
            content.push_str(piece);
        }
    }
    assert_eq!(reasoning, "Two and two make four.");
    assert_eq!(content, "Four.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_fields_are_checked_and_template_kwargs_reach_the_render() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let chat = |extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
            "temperature": 0,
        });
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    };
    // Variables reach the template; the default model's template ignores these.
    let ok = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({
                "chat_template_kwargs": {"enable_thinking": false},
                "reasoning_effort": "low",
                "reasoning_budget_tokens": 0,
                "thinking_budget_tokens": -1,
            })),
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    let bad = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"reasoning_format": "r1"})),
        )
        .await;
    let error = bad.error(StatusCode::BAD_REQUEST);
    assert!(error.to_string().contains("reasoning_format"), "{error}");
    let budget = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"reasoning_budget_tokens": 256})),
        )
        .await;
    assert!(budget.status.is_client_error());
    assert!(
        budget.body.contains("reasoning_budget_tokens"),
        "{}",
        budget.body
    );
    // A completion has no chat parser: the field stays refused there.
    let completion = server
        .post_json(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2, "reasoning_format": "deepseek"}),
        )
        .await;
    assert!(completion.status.is_client_error());
}

fn parse(args: &[&str]) -> Result<ServerArgs, clap::Error> {
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerArgs,
    }
    let argv = std::iter::once("mlxcel-server").chain(args.iter().copied());
    Cli::try_parse_from(normalize_llama_args(argv)).map(|c| c.server)
}

#[test]
fn reasoning_flags_reach_the_settings() {
    let defaults = parse(&[]).unwrap().server_config().unwrap().reasoning;
    assert_eq!(defaults.format, ReasoningFormat::Auto);
    assert!(defaults.thinking && defaults.template_kwargs.is_empty());
    let config = parse(&[
        "--reasoning-format",
        "deepseek",
        "--chat-template-kwargs",
        r#"{"enable_thinking": false}"#,
        "--reasoning-budget",
        "0",
        "--reasoning-effort",
        "high",
    ])
    .unwrap()
    .server_config()
    .unwrap()
    .reasoning;
    assert_eq!(config.format, ReasoningFormat::Deepseek);
    assert_eq!(config.template_kwargs["enable_thinking"], false);
    assert!(!config.thinking);
    assert_eq!(config.effort.as_deref(), Some("high"));
    for bad in [
        &["--reasoning-format", "r1"][..],
        &["--chat-template-kwargs", "[1]"],
        &["--reasoning-budget", "100"],
    ] {
        let err = parse(bad).unwrap().server_config().unwrap_err();
        assert!(err.to_string().contains(bad[0]), "{err}");
    }
    // Each flag's environment twin is accepted.
    let accepted = mlxcel_server::accepted_spellings();
    for env in [
        "LLAMA_ARG_THINK",
        "LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
        "LLAMA_ARG_THINK_BUDGET",
        "LLAMA_ARG_REASONING_EFFORT",
    ] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
}
