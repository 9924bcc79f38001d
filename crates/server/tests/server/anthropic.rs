//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on the default model:
//! whole and streamed replies with their event order, stop reasons, a tool_use round trip,
//! `x-api-key`, and errors in Anthropic's shape; no messages at all; extended `thinking` (on,
//! off, its budget, the reply's `thinking` blocks) and `thinking` blocks of earlier turns, under a
//! reasoning template of this file's own.

use std::sync::Arc;

use hyper::StatusCode;
use mlxcel_engine::Engine;
use mlxcel_server::{ApiKeys, ServerConfig};
use serde_json::{Value, json};

use crate::support::*;

fn ask(extra: Value) -> Value {
    let mut body = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "max_tokens": 12,
        "temperature": 0,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Asserts Anthropic's error shape and returns the error's `type`.
fn anthropic_error(reply: &Reply, status: StatusCode) -> String {
    assert_eq!(reply.status, status, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["type"], "error", "{}", reply.body);
    assert!(body["error"]["message"].is_string(), "{}", reply.body);
    body["error"]["type"].as_str().unwrap().to_owned()
}

fn weather_tool() -> Value {
    json!({
        "name": "get_weather",
        "description": "A city's weather",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": false,
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_plain_and_streamed_with_the_event_sequence() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let reply = server.post_json("/v1/messages", ask(json!({}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(body["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(body["content"][0]["type"], "text");
    let text = body["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    let stop_reason = body["stop_reason"].as_str().unwrap().to_owned();
    assert!(["end_turn", "max_tokens"].contains(&stop_reason.as_str()));
    assert_eq!(body["stop_sequence"], Value::Null);
    let output_tokens = body["usage"]["output_tokens"].as_u64().unwrap();
    assert!(output_tokens <= 12);

    // The same conversation through the chat completions route gives the same text.
    let chat = server
        .post_json(
            "/v1/chat/completions",
            json!({"messages": [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "What is the capital of France?"}],
                   "max_tokens": 12, "temperature": 0}),
        )
        .await
        .json();
    assert_eq!(chat["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(
        body["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );

    // count_tokens counts the same templated prompt.
    let count = server
        .post_json("/v1/messages/count_tokens", ask(json!({})))
        .await;
    assert_eq!(count.status, StatusCode::OK, "{}", count.body);
    assert_eq!(
        count.json(),
        json!({"input_tokens": body["usage"]["input_tokens"]})
    );

    let reply = server
        .post_json("/v1/messages", ask(json!({"stream": true})))
        .await;
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let events = named_events(&reply.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "the event name is its type");
    }
    let deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(
        start["usage"]["input_tokens"],
        body["usage"]["input_tokens"]
    );
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let streamed: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(streamed, text);
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], stop_reason.as_str());
    assert_eq!(delta["usage"]["output_tokens"], output_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sequences_report_the_one_that_matched() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let free = server
        .post_json("/v1/messages", ask(json!({"max_tokens": 30})))
        .await
        .json();
    let text = free["content"][0]["text"].as_str().unwrap().to_owned();
    // A word from the middle of the free reply stops the same reply there.
    let word = text
        .split_whitespace()
        .nth(2)
        .expect("a reply of three words");
    let stops = json!(["zzz-never", word]);
    let reply = server
        .post_json(
            "/v1/messages",
            ask(json!({"max_tokens": 30, "stop_sequences": stops})),
        )
        .await
        .json();
    assert_eq!(reply["stop_reason"], "stop_sequence", "{reply}");
    assert_eq!(reply["stop_sequence"], word);
    let cut = reply["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(cut) && !cut.contains(word),
        "{cut:?} of {text:?}"
    );

    let events = named_events(
        &server
            .post_json(
                "/v1/messages",
                ask(json!({"max_tokens": 30, "stop_sequences": stops, "stream": true})),
            )
            .await
            .body,
    );
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["type"], "message_delta");
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence");
    assert_eq!(delta["delta"]["stop_sequence"], word);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_use_round_trip() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let request = json!({
        "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [weather_tool()],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    });
    let reply = server.post_json("/v1/messages", request.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["stop_reason"], "tool_use", "{body}");
    let content = body["content"].as_array().unwrap();
    let tool_use = content.iter().find(|b| b["type"] == "tool_use").unwrap();
    assert_eq!(tool_use["name"], "get_weather");
    let input = tool_use["input"].as_object().unwrap();
    assert!(input["city"].is_string() && ["c", "f"].contains(&input["unit"].as_str().unwrap()));
    let id = tool_use["id"].as_str().unwrap();

    // Streamed: a tool_use block opens with empty input, whose JSON arrives in pieces.
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = named_events(&server.post_json("/v1/messages", streamed).await.body);
    let start = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let index = &start.1["index"];
    let partial: String = events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && &d["index"] == index)
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "input_json_delta");
            d["delta"]["partial_json"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        tool_use["input"]
    );
    assert_eq!(events[events.len() - 1].0, "message_stop");
    assert_eq!(
        events[events.len() - 2].1["delta"]["stop_reason"],
        "tool_use"
    );

    // The call and its result go back through the template as a tool call and a tool turn.
    let mut followup = request;
    followup["tool_choice"] = json!({"type": "auto"});
    followup["messages"] = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": body["content"]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": "18 degrees, sunny"},
            {"type": "text", "text": "Thanks. Summarize."},
        ]},
    ]);
    let count = server
        .post_json("/v1/messages/count_tokens", followup.clone())
        .await
        .json()["input_tokens"]
        .as_u64()
        .unwrap();
    let reply = server.post_json("/v1/messages", followup).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let reply = reply.json();
    assert_eq!(reply["usage"]["input_tokens"], count);
    assert!(count > body["usage"]["input_tokens"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_anthropic_shape() {
    if skip_model_tests() {
        return;
    }
    // Strict names, so that an unknown model is a 404 (by default any name is served).
    let server = TestServer::with_model(ServerConfig {
        strict_model_names: true,
        ..ServerConfig::default()
    })
    .await;
    let mut no_budget = ask(json!({}));
    no_budget.as_object_mut().unwrap().remove("max_tokens");
    let reply = server.post_json("/v1/messages", no_budget).await;
    assert_eq!(
        anthropic_error(&reply, StatusCode::BAD_REQUEST),
        "invalid_request_error"
    );
    assert!(reply.body.contains("max_tokens"), "{}", reply.body);
    for (extra, named) in [
        (json!({"model": "claude-none"}), "claude-none"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "image",
        ),
        (
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "web_search_20250305",
        ),
        (json!({"thinking": {"type": "sometimes"}}), "thinking.type"),
        (
            json!({"thinking": {"type": "enabled", "budget_tokens": 0}}),
            "thinking.budget_tokens",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]}),
            "messages[0].content[0]",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": {"type": "tool", "name": "nope"}}),
            "nope",
        ),
        (json!({"max_tokens": "many"}), "max_tokens"),
    ] {
        let reply = server.post_json("/v1/messages", ask(extra)).await;
        let kind = anthropic_error(
            &reply,
            if named == "claude-none" {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::BAD_REQUEST
            },
        );
        assert!(
            ["invalid_request_error", "not_found_error"].contains(&kind.as_str()),
            "{kind}"
        );
        assert!(reply.body.contains(named), "{named}: {}", reply.body);
    }
    let reply = server.get("/v1/messages").await;
    assert_eq!(
        anthropic_error(&reply, StatusCode::METHOD_NOT_ALLOWED),
        "invalid_request_error"
    );
    let reply = server.post("/v1/messages", "{not json").await;
    anthropic_error(&reply, StatusCode::BAD_REQUEST);
    // The other routes keep OpenAI's shape.
    server
        .post("/v1/chat/completions", "{not json")
        .await
        .error(StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_api_key_and_anthropic_version_are_accepted() {
    let config = ServerConfig {
        api_keys: ApiKeys::new(vec!["test-key-123".into()]),
        ..ServerConfig::default()
    };
    // Loading: the key is checked first, and every answer has Anthropic's shape.
    let loading = TestServer::start(config.clone(), None).await;
    let body = ask(json!({"max_tokens": 4})).to_string();
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        for headers in [&[][..], &[("x-api-key", "wrong")][..]] {
            let reply = send(loading.addr, "POST", path, headers, Some(&body)).await;
            assert_eq!(
                anthropic_error(&reply, StatusCode::UNAUTHORIZED),
                "authentication_error"
            );
            assert!(!reply.body.contains("test-key-123"));
        }
        let reply = send(
            loading.addr,
            "POST",
            path,
            &[
                ("x-api-key", "test-key-123"),
                ("anthropic-version", "2023-06-01"),
            ],
            Some(&body),
        )
        .await;
        assert_eq!(
            anthropic_error(&reply, StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error"
        );
    }
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(config).await;
    for headers in [
        &[
            ("x-api-key", "test-key-123"),
            ("anthropic-version", "2023-06-01"),
        ][..],
        &[("authorization", "Bearer test-key-123")][..],
    ] {
        let reply = send(server.addr, "POST", "/v1/messages", headers, Some(&body)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.json()["type"], "message");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_messages_render_the_system_alone() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let bare = json!({"max_tokens": 4, "temperature": 0, "messages": []});
    let reply = server.post_json("/v1/messages", bare.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["type"], "message");
    assert_eq!(body["content"][0]["type"], "text");
    let mut with_system = bare.clone();
    with_system["system"] = json!("You are a helpful assistant who answers briefly.");
    let reply = server.post_json("/v1/messages", with_system.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let count = |body: Value| {
        let server = &server;
        async move {
            let reply = server.post_json("/v1/messages/count_tokens", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()["input_tokens"].as_u64().unwrap()
        }
    };
    let (bare_count, system_count) = (count(bare).await, count(with_system).await);
    assert!(
        bare_count > 0 && system_count > bare_count,
        "{bare_count} {system_count}"
    );
    assert_eq!(reply.json()["usage"]["input_tokens"], system_count);
}

/// Writes each turn with its reasoning in a `<think>` block, and after the generation prompt a
/// thinking block that stays open unless `enable_thinking` is false (as Qwen3's template does
/// with `enable_thinking`). The open tag starts a line, so that the prompt's tokens hold it as
/// the reasoning budget looks for it (after `|>` it would tokenize across the boundary).
const THINKING_TEMPLATE: &str = "{%- for m in messages %}<|{{ m.role }}|>\
{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}\
{{ m.content }}{% endfor -%}\
{%- if add_generation_prompt %}<|assistant|>\n<think>\n\
{% if enable_thinking is defined and not enable_thinking %}</think>\n{% endif %}{% endif %}";

/// A server over the default model with [`THINKING_TEMPLATE`].
async fn thinking_server() -> TestServer {
    let dir = std::env::temp_dir().join(format!("mlxcel-anthropic-think-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("template.jinja");
    std::fs::write(&path, THINKING_TEMPLATE).unwrap();
    let parsed = parse_server_args(&["--chat-template-file", path.to_str().unwrap()]).unwrap();
    let options = parsed.engine_options().unwrap();
    let config = parsed.server_config().unwrap();
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    TestServer::start(config, Some(Arc::new(engine))).await
}

fn think(thinking: Value, max_tokens: u64, stream: bool) -> Value {
    json!({
        "max_tokens": max_tokens, "temperature": 0, "stream": stream, "thinking": thinking,
        "messages": [{"role": "user", "content": "What is 2+2?"}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_turns_reasoning_on_and_off_and_comes_back_as_thinking_blocks() {
    if skip_model_tests() {
        return;
    }
    let server = thinking_server().await;
    let prompt = |body: Value| {
        let server = &server;
        async move {
            let reply = server.post_json("/apply-template", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()["prompt"].as_str().unwrap().to_owned()
        }
    };
    let messages = json!([{"role": "user", "content": "What is 2+2?"}]);
    assert!(
        prompt(json!({"messages": messages}))
            .await
            .ends_with("<think>\n"),
        "the template leaves the block open"
    );

    // Enabled: the whole reply (the block is open) is reasoning, a thinking block first.
    let on = think(json!({"type": "enabled", "budget_tokens": 1000}), 12, false);
    let reply = server.post_json("/v1/messages", on.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    let content = body["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking", "{body}");
    let reasoning = content[0]["thinking"].as_str().unwrap().to_owned();
    assert!(!reasoning.is_empty(), "{body}");
    assert_eq!(content[0]["signature"], "");
    assert_eq!(content.last().unwrap()["type"], "text", "{body}");

    // Streamed: the thinking block at index 0 (thinking deltas, an empty signature, then its
    // stop), the text block after it, the same reasoning.
    let mut streamed = on.clone();
    streamed["stream"] = json!(true);
    let events = named_events(&server.post_json("/v1/messages", streamed).await.body);
    let starts: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, d)| (&d["index"], &d["content_block"]["type"]))
        .collect();
    assert_eq!(
        starts,
        [(&json!(0), &json!("thinking")), (&json!(1), &json!("text"))],
        "{events:?}"
    );
    let at_zero: Vec<&Value> = events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == 0)
        .map(|(_, d)| &d["delta"])
        .collect();
    let thought: String = at_zero
        .iter()
        .filter(|d| d["type"] == "thinking_delta")
        .map(|d| d["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thought, reasoning);
    assert_eq!(
        at_zero.last().unwrap(),
        &&json!({"type": "signature_delta", "signature": ""})
    );
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "content_block_start", "ping"]);
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);

    // budget_tokens is the reasoning budget: the block ends after that many tokens, and the
    // reply goes on as the answer.
    let budgeted = think(json!({"type": "enabled", "budget_tokens": 3}), 24, false);
    let body = server.post_json("/v1/messages", budgeted).await.json();
    let content = body["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking", "{body}");
    let short = content[0]["thinking"].as_str().unwrap();
    assert!(
        short.len() < reasoning.len() && reasoning.starts_with(short.trim_end()),
        "{short:?} of {reasoning:?}"
    );
    assert_eq!(content[1]["type"], "text", "{body}");

    // Disabled: the template closes the block, and the reply is all text.
    let off = think(json!({"type": "disabled"}), 12, false);
    let body = server.post_json("/v1/messages", off).await.json();
    let content = body["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{body}");
    assert_eq!(content[0]["type"], "text", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_blocks_of_earlier_turns_reach_the_template_and_the_count() {
    if skip_model_tests() {
        return;
    }
    let server = thinking_server().await;
    let tool = json!({"name": "list_files", "description": "List files",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}});
    let conversation = |assistant: Value| {
        json!({"tools": [tool], "messages": [
            {"role": "user", "content": "Fix the bug"},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "main.py"}]},
        ]})
    };
    let call =
        json!({"type": "tool_use", "id": "call_1", "name": "list_files", "input": {"path": "."}});
    let thought = "I should look at the project first.";
    let count = |body: Value| {
        let server = &server;
        async move {
            let reply = server.post_json("/v1/messages/count_tokens", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()["input_tokens"].as_u64().unwrap()
        }
    };
    let without = count(conversation(json!([call]))).await;
    let with = count(conversation(json!([
        {"type": "thinking", "thinking": thought, "signature": "sig"},
        call,
    ])))
    .await;
    // The reasoning (8 words) and its tags are counted.
    assert!(
        with >= without + 8,
        "{with} tokens with the thinking block, {without} without"
    );
    // A redacted block has no text for the template: the count is the plain one.
    let redacted = count(conversation(json!([
        {"type": "redacted_thinking", "data": "opaque"},
        call,
    ])))
    .await;
    assert_eq!(redacted, without);

    // The chat route's `reasoning_content` is the same turn's reasoning (`/apply-template`).
    let prompt = server
        .post_json(
            "/apply-template",
            json!({"messages": [
                {"role": "user", "content": "Fix the bug"},
                {"role": "assistant", "content": "", "reasoning_content": thought,
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "list_files", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "main.py"},
            ]}),
        )
        .await;
    assert_eq!(prompt.status, StatusCode::OK, "{}", prompt.body);
    let prompt = prompt.json()["prompt"].as_str().unwrap().to_owned();
    assert!(
        prompt.contains(&format!("<|assistant|><think>{thought}</think>")),
        "{prompt}"
    );
}
