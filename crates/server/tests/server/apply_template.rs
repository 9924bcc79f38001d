//! `/apply-template` renders the prompt `/v1/chat/completions` would generate from, as
//! llama-server's does: `add_generation_prompt`, tools, the `--reasoning` setting as the
//! template's `enable_thinking` (true unless off, for templates that read it), and today's date
//! as `date_string` and `datetime`. The default model runs under a template of this file's own
//! that writes out each of these.

use std::sync::Arc;

use hyper::StatusCode;
use mlxcel_engine::Engine;
use serde_json::{Value, json};

use crate::support::*;

/// Writes the turns, the number of tools, both dates and, after the generation prompt, a
/// thinking block that stays open unless `enable_thinking` is false or undefined (as
/// DeepSeek-R1's and QwQ's templates do).
const TEMPLATE: &str = "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor -%}\
{%- if tools %}[tools: {{ tools | length }}]{% endif -%}\
[date_string: {{ date_string }}][datetime: {{ datetime }}]\
{%- if add_generation_prompt %}<|assistant|><think>\n\
{% if not enable_thinking %}</think>{% endif %}{% endif %}";

/// A server over the default model with [`TEMPLATE`] under the server flags `flags`.
async fn server(flags: &[&str]) -> TestServer {
    let dir = std::env::temp_dir().join(format!("mlxcel-apply-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("template.jinja");
    std::fs::write(&path, TEMPLATE).unwrap();
    let path = path.to_str().unwrap().to_owned();
    let mut args = vec!["--chat-template-file", path.as_str()];
    args.extend_from_slice(flags);
    let parsed = parse_server_args(&args).unwrap();
    let options = parsed.engine_options().unwrap();
    let config = parsed.server_config().unwrap();
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    TestServer::start(config, Some(Arc::new(engine))).await
}

async fn prompt(server: &TestServer, extra: Value) -> String {
    let mut body = json!({"messages": [{"role": "user", "content": "What is today?"}]});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    let reply = server.post_json("/apply-template", body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.json()["prompt"].as_str().unwrap().to_owned()
}

/// Today in local time as the C library's `date` writes it in `format` (checked on both sides
/// of the request, in case it ran over midnight).
fn today(format: &str) -> String {
    let out = std::process::Command::new("date")
        .arg(format!("+{format}"))
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_template_renders_as_the_chat_route() {
    if skip_model_tests() {
        return;
    }
    let auto = server(&[]).await;

    // `--reasoning auto`: `enable_thinking` is true, the thinking block stays open.
    let before = (today("%d %b %Y"), today("%b %d %Y"));
    let text = prompt(&auto, json!({})).await;
    let after = (today("%d %b %Y"), today("%b %d %Y"));
    assert!(
        text.starts_with("<|user|>What is today?") && text.ends_with("<|assistant|><think>\n"),
        "{text}"
    );
    // Today's date, not the template's fallback.
    assert!(
        [&before, &after].iter().any(|(date, datetime)| text
            .contains(&format!("[date_string: {date}][datetime: {datetime}]"))),
        "{text} ({before:?}, {after:?})"
    );
    // The request's `chat_template_kwargs` win over the server's variables.
    let text = prompt(
        &auto,
        json!({"chat_template_kwargs": {"date_string": "26 Jul 2024", "enable_thinking": false}}),
    )
    .await;
    assert!(text.contains("[date_string: 26 Jul 2024]"), "{text}");
    assert!(text.ends_with("<think>\n</think>"), "{text}");

    // `add_generation_prompt: false`: no generation prompt.
    let text = prompt(&auto, json!({"add_generation_prompt": false})).await;
    assert!(!text.contains("<|assistant|>"), "{text}");
    assert!(text.ends_with(']'), "{text}");

    // Tools reach the template; an empty list is none.
    let tool = json!({"type": "function", "function": {"name": "today", "parameters": {}}});
    assert!(
        prompt(&auto, json!({"tools": [tool]}))
            .await
            .contains("[tools: 1]")
    );
    assert!(
        !prompt(&auto, json!({"tools": []}))
            .await
            .contains("[tools:")
    );
    drop(auto);

    // `--reasoning off` (and a budget of 0): `enable_thinking` is false, the block is closed.
    for flags in [&["--reasoning", "off"], &["--reasoning-budget", "0"]] {
        let off = server(flags).await;
        let text = prompt(&off, json!({})).await;
        assert!(
            text.ends_with("<|assistant|><think>\n</think>"),
            "{flags:?}: {text}"
        );
    }
    // `--reasoning on`: open.
    let on = server(&["--reasoning", "on"]).await;
    let text = prompt(&on, json!({})).await;
    assert!(text.ends_with("<|assistant|><think>\n"), "{text}");
}
