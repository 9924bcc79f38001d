//! The API's edges (issue #60): the bad-input table (every row a 4xx naming the parameter in its
//! route's protocol shape), model names (any name by default, `--strict-model-names`, aliases,
//! `GET /v1/models/{id}`), and the per-request log lines.

use std::sync::{Arc, Mutex};

use hyper::StatusCode;
use mlxcel_server::{LogFormat, ServerConfig, log_subscriber};
use serde_json::{Value, json};

use crate::support::*;

/// How a refusal names the parameter: OpenAI's `param`, or (Anthropic's shape has no `param`)
/// the message.
#[derive(Debug, Clone, Copy)]
enum Names {
    Param(&'static str),
    Anthropic(&'static str),
}

/// One malformed request: route, body, expected status and how the parameter is named.
type Row = (&'static str, &'static str, StatusCode, Names);

/// The bad-input table of docs/server.md ("What each route refuses"). Every row is refused
/// before the model is needed, so the table runs without it (the server is still loading).
const BAD_INPUT: &[Row] = &[
    // OpenAI chat completions.
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "temperature": -1}"#,
        BAD,
        Names::Param("temperature"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "temperature": 5}"#,
        BAD,
        Names::Param("temperature"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#,
        BAD,
        Names::Param("temperature"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}"#,
        BAD,
        Names::Param("top_p"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "top_p": -0.1}"#,
        BAD,
        Names::Param("top_p"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5}"#,
        BAD,
        Names::Param("presence_penalty"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "frequency_penalty": -3}"#,
        BAD,
        Names::Param("frequency_penalty"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "n": 0}"#,
        BAD,
        Names::Param("n"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "n": 500}"#,
        BAD,
        Names::Param("n"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#,
        BAD,
        Names::Param("max_tokens"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}"#,
        BAD,
        Names::Param("max_tokens"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}"#,
        BAD,
        Names::Param("max_completion_tokens"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}"#,
        BAD,
        Names::Param("top_logprobs"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
        BAD,
        Names::Param("top_logprobs"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": "x"}], "seed": "one"}"#,
        BAD,
        Names::Param("seed"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
        BAD,
        Names::Param("messages[0].role"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": null}]}"#,
        BAD,
        Names::Param("messages[1].content"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user"}]}"#,
        BAD,
        Names::Param("messages[0].content"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#,
        BAD,
        Names::Param("messages[0].content"),
    ),
    (
        CHAT,
        r#"{"messages": [{"role": "user", "content": 7}]}"#,
        BAD,
        Names::Param("messages[0].content"),
    ),
    (CHAT, r#"{"messages": []}"#, BAD, Names::Param("messages")),
    // OpenAI completions.
    (
        COMPLETIONS,
        r#"{"prompt": "x", "temperature": 2.5}"#,
        BAD,
        Names::Param("temperature"),
    ),
    (
        COMPLETIONS,
        r#"{"prompt": "x", "top_p": 2}"#,
        BAD,
        Names::Param("top_p"),
    ),
    (
        COMPLETIONS,
        r#"{"prompt": "x", "logprobs": 21}"#,
        BAD,
        Names::Param("logprobs"),
    ),
    (
        COMPLETIONS,
        r#"{"prompt": "x", "n": 0}"#,
        BAD,
        Names::Param("n"),
    ),
    (
        COMPLETIONS,
        r#"{"prompt": "x", "max_tokens": 0}"#,
        BAD,
        Names::Param("max_tokens"),
    ),
    // OpenAI Responses.
    (
        RESPONSES,
        r#"{"input": "x", "temperature": 3}"#,
        BAD,
        Names::Param("temperature"),
    ),
    (
        RESPONSES,
        r#"{"input": "x", "top_p": 1.01}"#,
        BAD,
        Names::Param("top_p"),
    ),
    (
        RESPONSES,
        r#"{"input": "x", "max_output_tokens": 0}"#,
        BAD,
        Names::Param("max_output_tokens"),
    ),
    (
        RESPONSES,
        r#"{"input": [{"role": "wizard", "content": "x"}]}"#,
        BAD,
        Names::Param("input[0].role"),
    ),
    // Anthropic Messages.
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}"#,
        BAD,
        Names::Anthropic("temperature"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "temperature": -0.5}"#,
        BAD,
        Names::Anthropic("temperature"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "top_p": 1.5}"#,
        BAD,
        Names::Anthropic("top_p"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "top_k": -1}"#,
        BAD,
        Names::Anthropic("top_k"),
    ),
    (
        MESSAGES,
        r#"{"messages": [{"role": "user", "content": "x"}]}"#,
        BAD,
        Names::Anthropic("max_tokens"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}"#,
        BAD,
        Names::Anthropic("max_tokens"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "wizard", "content": "x"}]}"#,
        BAD,
        Names::Anthropic("messages[0].role"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "user", "content": null}]}"#,
        BAD,
        Names::Anthropic("messages[0].content"),
    ),
    (
        MESSAGES,
        r#"{"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#,
        BAD,
        Names::Anthropic("image"),
    ),
    (
        "/v1/messages/nope",
        "{}",
        StatusCode::NOT_FOUND,
        Names::Anthropic("/v1/messages/nope"),
    ),
];

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const RESPONSES: &str = "/v1/responses";
const MESSAGES: &str = "/v1/messages";
const BAD: StatusCode = StatusCode::BAD_REQUEST;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_refused_naming_the_parameter_in_its_protocols_shape() {
    // No model: each row is refused before the model is needed (a loading server answers 503).
    let server = TestServer::start(ServerConfig::default(), None).await;
    for &(path, body, status, names) in BAD_INPUT {
        let reply = server.post(path, body).await;
        match names {
            Names::Param(param) => {
                let error = reply.error(status);
                assert_eq!(error["param"], param, "{path} {body}: {error}");
                let message = error["message"].as_str().unwrap();
                assert!(message.contains(param), "{path} {body}: {message}");
            }
            Names::Anthropic(named) => {
                assert_eq!(reply.status, status, "{path} {body}: {}", reply.body);
                let body_json = reply.json();
                assert_eq!(body_json["type"], "error", "{}", reply.body);
                assert!(body_json["error"]["type"].is_string(), "{}", reply.body);
                let message = body_json["error"]["message"].as_str().unwrap();
                assert!(message.contains(named), "{path} {body}: {message}");
            }
        }
    }
    // llama-server's native routes keep llama-server's looser rules: what it accepts passes the
    // checks (and waits for the model here).
    for body in [
        json!({"prompt": "x", "temperature": -1}),
        json!({"prompt": "x", "temperature": 5}),
        json!({"prompt": "x", "n_predict": -1}),
    ] {
        let reply = server.post_json("/completion", body.clone()).await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{body}: {}",
            reply.body
        );
    }
    // So do the fuzz targets' body checks, which make the same checks.
    for &(path, body, status, _) in BAD_INPUT {
        if status == BAD {
            assert!(
                mlxcel_server::fuzzing::check_request_body(path, body.as_bytes()).is_err(),
                "{path} {body}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_model_name_is_served_unless_names_are_strict() {
    if skip_model_tests() {
        return;
    }
    let chat = |model: &str| {
        json!({"model": model, "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 2, "temperature": 0})
    };
    let lenient = TestServer::with_model(ServerConfig::default()).await;
    let served = lenient.get("/v1/models").await.json()["data"][0]["id"].clone();
    for model in ["gpt-4o", "whatever/model"] {
        let reply = lenient.post_json(CHAT, chat(model)).await;
        assert_eq!(reply.status, StatusCode::OK, "{model}: {}", reply.body);
        // Replies carry the served name.
        assert_eq!(reply.json()["model"], served);
    }
    let reply = lenient
        .post_json(
            MESSAGES,
            json!({"model": "claude-3-5-sonnet-latest", "max_tokens": 2,
                   "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    // `client.models.retrieve(...)`: OpenAI's retrieve shape, under the name asked for.
    let card = lenient.get("/v1/models/gpt-4o").await;
    assert_eq!(card.status, StatusCode::OK, "{}", card.body);
    let card = card.json();
    assert_eq!(card["id"], "gpt-4o");
    assert_eq!(card["object"], "model");
    assert!(
        card["created"].is_u64() && card["owned_by"].is_string(),
        "{card}"
    );
    assert_eq!(
        lenient.get("/v1/models/org%2Fname").await.json()["id"],
        "org/name"
    );

    let strict = TestServer::with_model(ServerConfig {
        strict_model_names: true,
        aliases: vec!["smol".into(), "tiny".into()],
        ..ServerConfig::default()
    })
    .await;
    // One card, as llama-server lists one model: the first name is its id, all are its aliases.
    let data = strict.get("/v1/models").await.json()["data"].clone();
    assert_eq!(data.as_array().unwrap().len(), 1, "{data}");
    assert_eq!(data[0]["id"], "smol");
    assert_eq!(data[0]["aliases"], json!(["smol", "tiny"]));
    for alias in ["smol", "tiny"] {
        let reply = strict.post_json(CHAT, chat(alias)).await;
        assert_eq!(reply.status, StatusCode::OK, "{alias}: {}", reply.body);
        assert_eq!(reply.json()["model"], "smol");
        assert_eq!(
            strict.get(&format!("/v1/models/{alias}")).await.json()["id"],
            alias
        );
    }
    let error = strict
        .post_json(CHAT, chat("gpt-4o"))
        .await
        .error(StatusCode::NOT_FOUND);
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["param"], "model");
    let error = strict
        .get("/v1/models/gpt-4o")
        .await
        .error(StatusCode::NOT_FOUND);
    assert_eq!(error["code"], "model_not_found");
    assert!(
        error["message"].as_str().unwrap().contains("smol"),
        "{error}"
    );
}

/// A log destination the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The JSON lines written so far whose message is `request`.
    fn request_lines(&self) -> Vec<Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|l| l["message"] == "request")
            .collect()
    }

    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

// One thread: the log subscriber is this thread's, and the server's tasks run on it.
#[tokio::test(flavor = "current_thread")]
async fn each_request_has_one_info_line_with_its_tokens_and_timings() {
    if skip_model_tests() {
        return;
    }
    let captured = Captured::default();
    let writer = captured.clone();
    // tracing caches whether a log call is wanted when it is first reached; while only one
    // dispatcher exists it asks the default of the thread that got there first, which may be
    // another test's (none). A second dispatcher makes it ask them all.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let _guard = tracing::subscriber::set_default(log_subscriber(
        "mlxcel_server=info",
        LogFormat::Json,
        true,
        move || writer.clone(),
    ));
    let server = TestServer::with_model(ServerConfig::default()).await;
    let whole = server
        .post_json(
            CHAT,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}),
        )
        .await;
    assert_eq!(whole.status, StatusCode::OK, "{}", whole.body);
    let streamed = server
        .post_json(
            COMPLETIONS,
            json!({"prompt": "Once upon a time", "max_tokens": 3, "stream": true}),
        )
        .await;
    assert_eq!(streamed.status, StatusCode::OK);
    let refused = server
        .post_json(
            CHAT,
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": 9}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let off = server.get("/metrics").await;
    assert_eq!(off.status, StatusCode::NOT_IMPLEMENTED);
    let models = server.get("/v1/models").await;
    assert_eq!(models.status, StatusCode::OK);
    // A stream's line is written when it ends, which may follow its last byte by a moment.
    let ended = eventually(std::time::Duration::from_secs(10), || {
        captured.request_lines().len() >= 5
    })
    .await;
    assert!(ended, "{}", captured.text());

    let lines = captured.request_lines();
    assert_eq!(lines.len(), 5, "one line per request: {}", captured.text());
    let ids: std::collections::BTreeSet<u64> = lines
        .iter()
        .map(|l| l["request_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 5, "{lines:?}");
    let line = |route: &str, status: u16| {
        lines
            .iter()
            .find(|l| l["route"] == route && l["status"] == status)
            .unwrap_or_else(|| panic!("no {route} {status} line in {lines:?}"))
            .clone()
    };
    for (generation, route, tokens) in [
        (line(CHAT, 200), CHAT, 4),
        (line(COMPLETIONS, 200), COMPLETIONS, 3),
    ] {
        assert_eq!(generation["level"], "INFO", "{generation}");
        assert_eq!(generation["method"], "POST");
        assert_eq!(generation["route"], route);
        assert!(
            generation["prompt_tokens"].as_u64().unwrap() > 0,
            "{generation}"
        );
        assert!(generation["cached_tokens"].is_u64(), "{generation}");
        let generated = generation["generated_tokens"].as_u64().unwrap();
        assert!((1..=tokens).contains(&generated), "{generation}");
        assert!(
            generation["ttft_ms"].as_f64().unwrap() > 0.0,
            "{generation}"
        );
        assert!(generation["tok_s"].as_f64().unwrap() >= 0.0, "{generation}");
        assert!(
            ["stop", "length"].contains(&generation["finish_reason"].as_str().unwrap()),
            "{generation}"
        );
        assert!(
            generation["elapsed_ms"].as_f64().unwrap() > 0.0,
            "{generation}"
        );
    }
    // Refusals and a route turned off are INFO, never ERROR (nor WARN).
    for (route, status) in [(CHAT, 400), ("/metrics", 501), ("/v1/models", 200)] {
        let l = line(route, status);
        assert_eq!(l["level"], "INFO", "{l}");
        assert!(l.get("generated_tokens").is_none(), "{l}");
    }
    assert!(
        !captured.text().contains("\"level\":\"ERROR\""),
        "{}",
        captured.text()
    );
}
