//! OpenAI's Responses API (`/v1/responses`, `/v1/responses/input_tokens`) on the default model:
//! whole and streamed responses with their numbered events, `text.format`, a function call round
//! trip, and the fields that need stored responses refused by name.

use hyper::StatusCode;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

fn create(extra: Value) -> Value {
    let mut body = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "instructions": "Be brief.",
        "input": "What is the capital of France?",
        "max_output_tokens": 12,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The text of a response's message items.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap())
        .filter(|part| part["type"] == "output_text")
        .map(|part| part["text"].as_str().unwrap())
        .collect()
}

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "name": "get_weather",
        "description": "A city's weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": false,
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_plain_and_streamed_with_numbered_events() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let reply = server.post_json("/v1/responses", create(json!({}))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "response");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert!(body["created_at"].as_u64().unwrap() > 0);
    assert_eq!(body["model"], "SmolLM2-135M-Instruct.Q4_1");
    let item = &body["output"][0];
    assert_eq!(item["type"], "message");
    assert_eq!(item["role"], "assistant");
    assert_eq!(item["content"][0]["type"], "output_text");
    let text = output_text(&body);
    assert!(!text.is_empty());
    let usage = &body["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
    match body["status"].as_str().unwrap() {
        "incomplete" => {
            assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
            assert_eq!(usage["output_tokens"], 12);
        }
        status => assert_eq!(status, "completed"),
    }

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
    assert_eq!(usage["input_tokens"], chat["usage"]["prompt_tokens"]);

    // Message items with content parts are the same conversation.
    let items = create(json!({"instructions": null, "input": [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "What is the capital of France?"}]},
    ]}));
    let same = server
        .post_json("/v1/responses", items.clone())
        .await
        .json();
    assert_eq!(output_text(&same), text);
    let count = server
        .post_json("/v1/responses/input_tokens", items)
        .await
        .json();
    assert_eq!(
        count,
        json!({"object": "response.input_tokens", "input_tokens": usage["input_tokens"]})
    );

    let reply = server
        .post_json("/v1/responses", create(json!({"stream": true})))
        .await;
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let events = named_events(&reply.body);
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "the event name is its type");
        assert_eq!(data["sequence_number"], i, "numbered from 0");
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    let last = if body["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        last,
    ]);
    assert_eq!(names, expected);
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let streamed: String = events
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(streamed, text);
    let done = &events[events.len() - 4].1;
    assert_eq!(done["text"], text.as_str());
    let finished = &events[events.len() - 1].1["response"];
    assert_eq!(finished["status"], body["status"]);
    assert_eq!(output_text(finished), text);
    assert_eq!(finished["usage"], body["usage"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_format_json_schema_constrains_the_output() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig {
        metrics: true,
        ..ServerConfig::default()
    })
    .await;
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": false,
    });
    let reply = server
        .post_json(
            "/v1/responses",
            create(json!({"max_output_tokens": 60, "input": "Describe Paris as JSON.",
                "text": {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": true}}})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["status"], "completed", "{body}");
    let value: Value = serde_json::from_str(&output_text(&body)).unwrap();
    assert!(
        value["city"].is_string() && value["population"].is_i64(),
        "{value}"
    );
    assert_eq!(body["text"]["format"]["type"], "json_schema");
    // At least one mask per output token, and their time, in the metrics (the engine is shared
    // with other tests, which may add theirs).
    let metrics = server.get("/metrics").await.body;
    let value_of = |family: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{family} missing from:\n{metrics}"))
    };
    let output_tokens = body["usage"]["output_tokens"].as_f64().unwrap();
    let masks = value_of("mlxcel_constraint_masks_total");
    assert!(
        masks >= output_tokens,
        "{masks} masks for {output_tokens} tokens"
    );
    assert!(value_of("mlxcel_constraint_mask_seconds_total") > 0.0);

    let reply = server
        .post_json(
            "/v1/responses",
            create(json!({"max_output_tokens": 40, "text": {"format": {"type": "json_object"}}})),
        )
        .await
        .json();
    if reply["status"] == "completed" {
        assert!(
            serde_json::from_str::<Value>(&output_text(&reply))
                .unwrap()
                .is_object()
        );
    }
    let reply = server
        .post_json(
            "/v1/responses",
            create(json!({"text": {"format": {"type": "json_schema", "name": "x"}}})),
        )
        .await;
    assert_eq!(
        reply.error(StatusCode::BAD_REQUEST)["param"],
        "text.format.schema"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_function_call_round_trip() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let request = create(json!({
        "max_output_tokens": 60, "instructions": null,
        "input": "What is the weather in Paris?",
        "tools": [weather_tool()],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }));
    let reply = server.post_json("/v1/responses", request.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["status"], "completed", "{body}");
    let call = body["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "function_call")
        .unwrap()
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string());
    assert_eq!(body["tools"][0]["name"], "get_weather");

    // Streamed: the call's item, its arguments in pieces, the whole arguments, the item done.
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = named_events(&server.post_json("/v1/responses", streamed).await.body);
    let added = events
        .iter()
        .find(|(n, d)| n == "response.output_item.added" && d["item"]["type"] == "function_call")
        .unwrap();
    assert_eq!(added.1["item"]["arguments"], "");
    let pieces: String = events
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(pieces, call["arguments"].as_str().unwrap());
    let done = events
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done.1["arguments"], call["arguments"]);
    assert_eq!(events.last().unwrap().0, "response.completed");
    for (i, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i);
    }

    // The call and its output go back through the template.
    let mut followup = request;
    followup["tool_choice"] = json!("auto");
    followup["input"] = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call["call_id"], "name": "get_weather",
         "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "18 degrees, sunny"},
    ]);
    let reply = server.post_json("/v1/responses", followup).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(
        reply.json()["usage"]["input_tokens"].as_u64().unwrap()
            > body["usage"]["input_tokens"].as_u64().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_state_and_built_in_tools_are_refused_by_name() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    for (extra, param) in [
        (
            json!({"previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"store": true}), "store"),
        (json!({"background": true}), "background"),
        (json!({"conversation": "conv_1"}), "conversation"),
        (
            json!({"include": ["message.output_text.logprobs"]}),
            "include",
        ),
        (json!({"tools": [{"type": "web_search"}]}), "tools"),
        (
            json!({"tools": [weather_tool()], "tool_choice": {"type": "file_search"}}),
            "tool_choice",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
        ),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (
            json!({"text": {"format": {"type": "yaml"}}}),
            "text.format.type",
        ),
    ] {
        let reply = server.post_json("/v1/responses", create(extra)).await;
        let error = reply.error(StatusCode::BAD_REQUEST);
        assert_eq!(error["param"], param, "{}", reply.body);
    }
    // Not storing is fine.
    let reply = server
        .post_json(
            "/responses",
            create(json!({"store": false, "max_output_tokens": 2})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let count = server
        .post_json("/responses/input_tokens", create(json!({})))
        .await;
    assert_eq!(count.status, StatusCode::OK, "{}", count.body);
    assert_eq!(
        count.json()["input_tokens"],
        reply.json()["usage"]["input_tokens"]
    );
}
