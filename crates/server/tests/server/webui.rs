//! The chat page at `GET /` (and its script and style), public like `/health`, off with
//! `--no-webui`; and llama-server's `timings` on the chat stream it reads tok/s from.

use hyper::StatusCode;
use mlxcel_server::{ApiKeys, ServerConfig};
use serde_json::{Value, json};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_without_a_key_and_its_api_calls_need_one() {
    let config = ServerConfig {
        api_keys: ApiKeys::new(vec!["secret".into()]),
        ..ServerConfig::default()
    };
    // No model needed: the page is static.
    let server = TestServer::start(config, None).await;
    let page = server.get("/").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    for id in [
        "id=\"model\"",
        "id=\"status\"",
        "id=\"system\"",
        "id=\"temperature\"",
        "id=\"api-key\"",
        "id=\"messages\"",
        "id=\"input\"",
        "id=\"send\"",
        "id=\"stop\"",
        "id=\"max-tokens\"",
        "id=\"top-k\"",
        "id=\"top-p\"",
        "id=\"min-p\"",
        "id=\"typical-p\"",
        "id=\"repeat-penalty\"",
        "id=\"repeat-last-n\"",
        "id=\"presence-penalty\"",
        "id=\"frequency-penalty\"",
        "id=\"seed\"",
        "id=\"stop-strings\"",
        "id=\"theme\"",
        "id=\"conversation-list\"",
        "id=\"export\"",
        "id=\"import-file\"",
        "id=\"attach\"",
        "type=\"module\" src=\"webui/app.js\"",
        "href=\"webui/app.css\"",
    ] {
        assert!(page.body.contains(id), "the page lacks {id}");
    }
    // The script is ES modules, each its own file; together they put text in as text.
    let mut scripts = String::new();
    for (name, _, _) in mlxcel_server::WEBUI_FILES
        .iter()
        .filter(|(n, _, _)| n.ends_with(".js"))
    {
        let script = server.get(&format!("/webui/{name}")).await;
        assert_eq!(script.status, StatusCode::OK, "{name}");
        assert_eq!(
            script.headers["content-type"], "text/javascript; charset=utf-8",
            "{name}"
        );
        scripts.push_str(&script.body);
    }
    // Text from the server reaches the page as text, never as HTML.
    assert!(scripts.contains("textContent"));
    assert!(!scripts.contains("innerHTML"));
    assert!(scripts.contains("fetch(\"v1/chat/completions\""));
    assert_eq!(
        server.get("/webui/nothing.js").await.status,
        StatusCode::NOT_FOUND
    );
    let style = server.get("/webui/app.css").await;
    assert_eq!(style.status, StatusCode::OK);
    assert_eq!(style.headers["content-type"], "text/css; charset=utf-8");
    // The API itself still needs the key.
    assert_eq!(
        server.get("/v1/models").await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_webui_turns_the_page_off() {
    let config = ServerConfig {
        webui: false,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, None).await;
    for path in ["/", "/webui/app.js", "/webui/app.css", "/webui/markdown.js"] {
        let error = server.get(path).await.error(StatusCode::NOT_FOUND);
        assert_eq!(error["code"], "not_found", "{path}");
    }
}

/// The page's request: a streamed chat with usage; the last chunk (the usage chunk) carries
/// llama-server's `timings`, as does a whole completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_streams_end_with_llama_server_timings() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let request = json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 5,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let reply = server
        .post_json("/v1/chat/completions", request.clone())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let events = reply.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (last, rest) = chunks.split_last().unwrap();
    assert!(rest.iter().all(|c| c.get("timings").is_none()));
    assert_eq!(last["choices"], json!([]));
    let timings = &last["timings"];
    assert_eq!(timings["predicted_n"], 5, "{last}");
    assert_eq!(timings["prompt_n"], last["usage"]["prompt_tokens"]);
    for key in [
        "cache_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ] {
        assert!(timings[key].is_number(), "{key}: {timings}");
    }
    assert!(timings["predicted_per_second"].as_f64().unwrap() > 0.0);
    // Without usage the finish chunk is the last one, and carries them.
    let mut plain = request.clone();
    plain.as_object_mut().unwrap().remove("stream_options");
    let events = server
        .post_json("/v1/chat/completions", plain)
        .await
        .events();
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["timings"]["predicted_n"], 5);
    // A whole completion carries them too.
    let mut whole = request;
    whole["stream"] = json!(false);
    let body = server.post_json("/v1/chat/completions", whole).await.json();
    assert_eq!(body["timings"]["predicted_n"], 5);
}
