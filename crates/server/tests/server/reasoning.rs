//! Reasoning models: `reasoning_format` splits a chat reply into `reasoning_content` and
//! `content` (whole and streamed), the reasoning fields are checked, and the reasoning flags
//! reach the server's settings. The default model does not think, so a grammar makes it write a
//! `<think>` block (its tokenizer cuts the tags into several tokens, as a stream would).

use hyper::StatusCode;
use mlxcel_server::{ReasoningFormat, ServerConfig};
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
    // A count of thinking tokens is a budget the engine enforces (below); a negative one other
    // than -1 is refused, naming the field.
    let budget = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"reasoning_budget_tokens": 256, "reasoning_control": true})),
        )
        .await;
    assert_eq!(budget.status, StatusCode::OK, "{}", budget.body);
    let budget = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"thinking_budget_tokens": -5})),
        )
        .await;
    assert!(budget.status.is_client_error());
    assert!(
        budget.body.contains("thinking_budget_tokens"),
        "{}",
        budget.body
    );
    // A completion's answer is the raw text: the field is checked there and has no effect
    // (tests/server/parity_fields.rs), as in llama-server.
    let completion = server
        .post_json(
            "/v1/completions",
            json!({"prompt": "Hi", "max_tokens": 2, "reasoning_format": "r1"}),
        )
        .await;
    assert!(completion.status.is_client_error());
}

use crate::support::parse_server_args as parse;

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
    let config = parse(&[
        "--reasoning-budget",
        "100",
        "--reasoning-budget-message",
        "Time to answer.",
        "-rea",
        "on",
        "--reasoning-preserve",
        "--skip-chat-parsing",
    ])
    .unwrap()
    .server_config()
    .unwrap()
    .reasoning;
    assert!(config.thinking);
    assert_eq!(config.budget, Some(100));
    assert_eq!(config.budget_message, "Time to answer.");
    assert_eq!(config.template_kwargs["enable_thinking"], true);
    assert_eq!(config.template_kwargs["preserve_reasoning"], true);
    assert!(config.skip_parsing);
    let config = parse(&[
        "--reasoning",
        "off",
        "--no-reasoning-preserve",
        "--skip-chat-parsing",
        "--no-skip-chat-parsing",
    ])
    .unwrap()
    .server_config()
    .unwrap()
    .reasoning;
    assert_eq!(config.template_kwargs["enable_thinking"], false);
    assert_eq!(config.template_kwargs["preserve_reasoning"], false);
    assert!(!config.skip_parsing && config.budget.is_none());
    for bad in [
        &["--reasoning-format", "r1"][..],
        &["--chat-template-kwargs", "[1]"],
        &["--reasoning-budget", "-2"],
        &["--reasoning", "maybe"],
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
        "LLAMA_ARG_THINK_BUDGET_MESSAGE",
        "LLAMA_ARG_REASONING",
        "LLAMA_ARG_REASONING_PRESERVE",
        "LLAMA_ARG_SKIP_CHAT_PARSING",
    ] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
}

/// A prompt that leaves a `<think>` block open, so that the reply starts inside it.
const OPEN_PROMPT: &str = "What is 2 + 2?\n<think>";

fn budgeted(extra: Value) -> Value {
    let mut body = json!({
        "prompt": OPEN_PROMPT,
        "temperature": 0,
        "reasoning_budget_start_tag": "<think>",
        "reasoning_budget_end_tags": ["</think>"],
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

/// `/completion` with a budget of 3 tokens: the reply reasons for 3 tokens (the same 3 as
/// without a budget, greedy), then the engine writes the message and the end tag, then the model
/// answers on. Without the tags a budget is refused, naming the missing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_budget_ends_the_block_after_its_tokens() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let free = server
        .post_json("/completion", budgeted(json!({"n_predict": 3})))
        .await
        .json();
    let first = free["content"].as_str().unwrap().to_owned();
    assert!(!first.contains("</think>"), "{free}");
    let reply = server
        .post_json(
            "/completion",
            budgeted(json!({
                "n_predict": 16,
                "reasoning_budget_tokens": 3,
                "reasoning_budget_message": " Enough.",
            })),
        )
        .await
        .json();
    let content = reply["content"].as_str().unwrap();
    assert!(
        content.starts_with(&format!("{first} Enough.</think>")),
        "{first:?} then the forced end, in {content:?}"
    );
    assert!(
        content.len() > format!("{first} Enough.</think>").len(),
        "the model goes on after the end: {content:?}"
    );
    // One end tag may be given alone.
    let mut one_tag = budgeted(json!({
        "n_predict": 16,
        "reasoning_budget_tokens": 3,
        "reasoning_budget_message": " Enough.",
        "reasoning_budget_end_tag": "</think>",
    }));
    one_tag
        .as_object_mut()
        .unwrap()
        .remove("reasoning_budget_end_tags");
    let same = server.post_json("/completion", one_tag).await.json();
    assert_eq!(same["content"], reply["content"]);
    let missing = server
        .post_json(
            "/completion",
            json!({"prompt": OPEN_PROMPT, "n_predict": 4, "reasoning_budget_tokens": 3}),
        )
        .await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{}", missing.body);
    assert!(
        missing.body.contains("reasoning_budget_start_tag"),
        "{}",
        missing.body
    );
}

/// `POST /v1/chat/completions/control` ends a running reply's reasoning block: a streamed
/// completion armed with `reasoning_control` gets the end tag once the control arrives, and the
/// control answers as llama-server does for unknown ids and bad bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_route_ends_a_running_replys_reasoning() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let mut stream = server
        .open(
            "/v1/completions",
            budgeted(json!({
                "max_tokens": 400,
                "ignore_eos": true,
                "stream": true,
                "reasoning_control": true,
            })),
        )
        .await;
    assert_eq!(stream.status(), StatusCode::OK);
    let first = next_chunk(&mut stream).await.expect("a first chunk");
    let chunk: Value = serde_json::from_str(sse_events(&first)[0].as_str()).unwrap();
    let id = chunk["id"].as_str().unwrap().to_owned();
    let control = server
        .post_json(
            "/v1/chat/completions/control",
            json!({"id": id, "action": "reasoning_end"}),
        )
        .await;
    assert_eq!(control.json(), json!({"success": true}), "{}", control.body);
    let mut text = String::new();
    let mut body = first;
    loop {
        for event in sse_events(&body) {
            if event != "[DONE]" {
                let chunk: Value = serde_json::from_str(&event).unwrap();
                text.push_str(chunk["choices"][0]["text"].as_str().unwrap_or_default());
            }
        }
        match next_chunk(&mut stream).await {
            Some(next) => body = next,
            None => break,
        }
    }
    assert_eq!(text.matches("</think>").count(), 1, "{text:?}");
    let after = text.split("</think>").nth(1).unwrap();
    assert!(
        !after.is_empty(),
        "the reply goes on after the end: {text:?}"
    );

    // The reply has ended: its id is no longer running.
    let gone = server
        .post_json(
            "/v1/chat/completions/control",
            json!({"id": id, "action": "reasoning_end"}),
        )
        .await;
    assert_eq!(
        gone.json(),
        json!({"success": false, "message": "no active completion for this id"})
    );
    for (body, field) in [
        (json!({"action": "reasoning_end"}), "id"),
        (json!({"id": "cmpl-1", "action": "stop"}), "action"),
    ] {
        let bad = server.post_json("/v1/chat/completions/control", body).await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
        assert!(bad.body.contains(field), "{}", bad.body);
    }
}
