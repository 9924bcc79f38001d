//! What llama.cpp's own server suite asks of a llama-server (`scripts/check-server-suite`),
//! checked here end to end on the default model: a `prompt` as token ids, mixed, as a JSON prompt
//! object or a list of prompts (answered as a list); `n` > 1 choices; the `verbose` field's
//! `__verbose`; `--chat-template` overriding the checkpoint's; `--backend_sampling` and the
//! `backend_sampling` field.

use std::sync::Arc;

use hyper::StatusCode;
use mlxcel_engine::Engine;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

async fn server() -> Option<TestServer> {
    if skip_model_tests() {
        return None;
    }
    Some(TestServer::with_model(ServerConfig::default()).await)
}

const PROMPT: &str = "I believe the meaning of life is";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_as_tokens_mixed_objects_and_lists() {
    let Some(server) = server().await else {
        return;
    };
    let tokens = server
        .post_json("/tokenize", json!({"content": PROMPT, "add_special": true}))
        .await
        .json()["tokens"]
        .clone();
    let complete = |prompt: Value| json!({"prompt": prompt, "n_predict": 8, "temperature": 0});
    let single = server
        .post_json("/completion", complete(tokens.clone()))
        .await;
    assert_eq!(single.status, StatusCode::OK, "{}", single.body);
    let text = single.json()["content"].as_str().unwrap().to_owned();
    // A list of prompts is answered as a list, in order, each with its index; the same prompt in
    // any form gives the same greedy text.
    for other in [
        tokens.clone(),
        json!(PROMPT),
        json!({"prompt_string": PROMPT}),
    ] {
        let list = server
            .post_json("/completion", complete(json!([tokens.clone(), other])))
            .await;
        assert_eq!(list.status, StatusCode::OK, "{}", list.body);
        let list = list.json();
        let list = list.as_array().unwrap_or_else(|| panic!("{list}"));
        assert_eq!(list.len(), 2);
        for (i, answer) in list.iter().enumerate() {
            assert_eq!(answer["index"], i, "{answer}");
            assert_eq!(answer["content"], text.as_str(), "{answer}");
        }
    }
    // Ids and texts mixed in one sequence are one prompt.
    let mixed = server
        .post_json("/completion", complete(json!([1, 2, PROMPT, 3, PROMPT])))
        .await;
    assert_eq!(mixed.status, StatusCode::OK, "{}", mixed.body);
    assert!(mixed.json()["content"].is_string());
    // The JSON prompt object alone, and multimodal data refused by name.
    let object = server
        .post_json("/completion", complete(json!({"prompt_string": PROMPT})))
        .await;
    assert_eq!(object.json()["content"], text.as_str());
    let media = server
        .post_json(
            "/completion",
            complete(json!({"prompt_string": PROMPT, "multimodal_data": ["AAAA"]})),
        )
        .await;
    assert!(media.status.is_client_error(), "{}", media.body);
    assert!(media.body.contains("multimodal_data"), "{}", media.body);
    // OpenAI's completions join a list of prompts as choices, usage counting each prompt.
    let batch = server
        .post_json(
            "/v1/completions",
            json!({"prompt": [PROMPT, tokens], "max_tokens": 8, "temperature": 0}),
        )
        .await
        .json();
    let choices = batch["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{batch}");
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[1]["index"], 1);
    assert_eq!(choices[0]["text"], choices[1]["text"]);
    let usage = &batch["usage"];
    assert_eq!(
        usage["prompt_tokens"],
        2 * tokens.as_array().unwrap().len(),
        "{batch}"
    );
    assert_eq!(usage["completion_tokens"], 16, "{batch}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_whole_and_streamed() {
    let Some(server) = server().await else {
        return;
    };
    let body = |stream: bool| {
        json!({"messages": [{"role": "system", "content": "Book"},
                            {"role": "user", "content": "What is the best book"}],
               "max_tokens": 8, "n": 2, "id_slot": 0, "seed": 7, "stream": stream})
    };
    for _ in 0..2 {
        let whole = server.post_json("/v1/chat/completions", body(false)).await;
        assert_eq!(whole.status, StatusCode::OK, "{}", whole.body);
        let whole = whole.json();
        let choices = whole["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2, "{whole}");
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i);
            assert_eq!(choice["message"]["role"], "assistant");
            assert_eq!(choice["finish_reason"], "length");
        }
        assert_eq!(whole["usage"]["completion_tokens"], 16, "{whole}");
    }
    let streamed = server.post_json("/v1/chat/completions", body(true)).await;
    let events = streamed.events();
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].clone();
    let mut finished = [false, false];
    for chunk in &chunks {
        assert_eq!(chunk["id"], id, "one id for the whole stream: {chunk}");
        for choice in chunk["choices"].as_array().unwrap() {
            let i = choice["index"].as_u64().unwrap() as usize;
            if choice["finish_reason"] == "length" {
                finished[i] = true;
            }
        }
    }
    assert_eq!(finished, [true, true]);
    // `n` on /completion (`n_cmpl`) answers a list; 0 is refused by name.
    let list = server
        .post_json(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 4, "n_cmpl": 3}),
        )
        .await
        .json();
    assert_eq!(list.as_array().map(Vec::len), Some(3), "{list}");
    let zero = server
        .post_json(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 0}),
        )
        .await;
    assert_eq!(zero.error(StatusCode::BAD_REQUEST)["param"], "n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_echoes_the_prompt_the_model_ran() {
    let Some(server) = server().await else {
        return;
    };
    for verbose in [true, false] {
        let body = json!({"messages": [{"role": "system", "content": "Book"},
                                       {"role": "user", "content": "What is the best book"}],
                          "max_tokens": 2, "verbose": verbose});
        let answer = server.post_json("/v1/chat/completions", body).await.json();
        if verbose {
            let echo = &answer["__verbose"];
            let prompt = echo["prompt"]
                .as_str()
                .unwrap_or_else(|| panic!("{answer}"));
            assert!(
                prompt.contains("Book") && prompt.contains("<|im_start|>"),
                "{prompt}"
            );
            assert_eq!(echo["tokens_predicted"], 2);
            assert_eq!(echo["stop_type"], "limit");
            assert_eq!(echo["content"], answer["choices"][0]["message"]["content"]);
        } else {
            assert!(answer.get("__verbose").is_none(), "{answer}");
        }
    }
    // Streamed, the last chunk carries it.
    let streamed = server
        .post_json(
            "/v1/completions",
            json!({"prompt": PROMPT, "max_tokens": 2, "verbose": true, "stream": true}),
        )
        .await;
    let last: Value = streamed
        .events()
        .iter()
        .rev()
        .find(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .unwrap();
    assert_eq!(last["__verbose"]["prompt"], PROMPT, "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_sampling_gives_the_same_tokens_and_probabilities() {
    let Some(server) = server().await else {
        return;
    };
    let run = |backend_sampling: bool| {
        json!({"prompt": "The countries of Europe, in random order, are:", "n_probs": 10,
               "n_predict": 8, "post_sampling_probs": true, "seed": 4242,
               "backend_sampling": backend_sampling})
    };
    let on = server.post_json("/completion", run(true)).await;
    assert_eq!(on.status, StatusCode::OK, "{}", on.body);
    let off = server.post_json("/completion", run(false)).await.json();
    assert_eq!(
        on.json()["completion_probabilities"],
        off["completion_probabilities"]
    );
    assert!(off["completion_probabilities"].as_array().unwrap().len() == 8);
}

use crate::support::parse_server_args as parse;

#[test]
fn backend_sampling_is_accepted_in_llama_cpps_spellings() {
    for flag in ["--backend_sampling", "--backend-sampling", "-bs"] {
        assert!(parse(&[flag]).is_ok(), "{flag}");
    }
    // An unknown name is still refused after the underscores become dashes.
    assert!(parse(&["--no_such_flag"]).is_err());
}

#[test]
fn an_unknown_chat_template_name_is_a_startup_error_naming_it() {
    let err = parse(&["--chat-template", "no-such-name"])
        .unwrap()
        .engine_options()
        .unwrap_err();
    assert!(err.to_string().contains("no-such-name"), "{err}");
    // Each flag's environment twin is accepted.
    let accepted = mlxcel_server::accepted_spellings();
    for env in [
        "LLAMA_ARG_CHAT_TEMPLATE",
        "LLAMA_ARG_CHAT_TEMPLATE_FILE",
        "LLAMA_ARG_BACKEND_SAMPLING",
    ] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_flags_replace_the_checkpoints_template() {
    if skip_model_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}",
    )
    .unwrap();
    let cases = [
        (
            vec!["--chat-template", "command-r"],
            "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>\
             <|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        (
            vec!["--chat-template-file", file.to_str().unwrap()],
            "[system] You are a test.\n[user] Hi there\n",
        ),
    ];
    for (flags, expected) in cases {
        let options = parse(&flags).unwrap().engine_options().unwrap();
        let engine = Arc::new(Engine::load(None, options).unwrap());
        let server = TestServer::start(ServerConfig::default(), Some(engine)).await;
        let applied = server
            .post_json(
                "/apply-template",
                json!({"messages": [{"role": "system", "content": "You are a test."},
                                    {"role": "user", "content": "Hi there"}]}),
            )
            .await
            .json();
        assert_eq!(applied["prompt"], expected, "{flags:?}");
        // As llama-server: continuing a message and a generation prompt together is a 400.
        let both = server
            .post_json(
                "/v1/chat/completions",
                json!({"max_tokens": 2, "add_generation_prompt": true,
                       "continue_final_message": true,
                       "messages": [{"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "Hello"}]}),
            )
            .await;
        assert_eq!(both.status, StatusCode::BAD_REQUEST, "{}", both.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_assistant_decides_how_a_final_assistant_message_ends() {
    if skip_model_tests() {
        return;
    }
    let on = parse(&["--prefill-assistant"])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(on.prefill_assistant && ServerConfig::default().prefill_assistant);
    let off = parse(&["--no-prefill-assistant"])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(!off.prefill_assistant);
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_PREFILL_ASSISTANT"));
    let body = |extra: Value| {
        let mut body = json!({"max_tokens": 1, "verbose": true,
            "messages": [{"role": "user", "content": "What is the best book"},
                         {"role": "assistant", "content": "Whill"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let prompt = |answer: Value| answer["__verbose"]["prompt"].as_str().unwrap().to_owned();
    let prefilled = TestServer::with_model(on).await;
    let answer = prefilled
        .post_json("/v1/chat/completions", body(json!({})))
        .await;
    assert!(prompt(answer.json()).ends_with("Whill"), "{}", answer.body);
    let finished = TestServer::with_model(off).await;
    let answer = finished
        .post_json("/v1/chat/completions", body(json!({})))
        .await;
    let text = prompt(answer.json());
    assert!(
        text.contains("Whill<|im_end|>") && text.ends_with("assistant\n"),
        "{text}"
    );
    // An explicit continue_final_message continues it still.
    let explicit = json!({"continue_final_message": true, "add_generation_prompt": false});
    let answer = finished
        .post_json("/v1/chat/completions", body(explicit))
        .await;
    assert!(prompt(answer.json()).ends_with("Whill"), "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_sends_sse_comment_pings() {
    if skip_model_tests() {
        return;
    }
    let config = parse(&["--sse-ping-interval", "7"])
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(config.sse_ping_interval, 7);
    assert_eq!(ServerConfig::default().sse_ping_interval, 30);
    assert!(
        parse(&["--sse-ping-interval", "-5"])
            .unwrap()
            .server_config()
            .is_err()
    );
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_SSE_PING_INTERVAL"));
    // One sequence at a time: a second stream waits, silent, while the first runs.
    let mut options = mlxcel_engine::EngineOptions::default();
    options.scheduler.max_batch = 1;
    let engine = tokio::task::spawn_blocking(move || Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    let server = TestServer::start(ServerConfig::default(), Some(Arc::new(engine))).await;
    let mut blocker = server
        .open(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 4000, "ignore_eos": true, "stream": true}),
        )
        .await;
    assert!(
        next_chunk(&mut blocker).await.is_some(),
        "the first stream runs"
    );
    let mut waiting = server
        .open(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                   "stream": true, "sse_ping_interval": 1}),
        )
        .await;
    let mut seen = String::new();
    let found = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(chunk) = next_chunk(&mut waiting).await {
            seen.push_str(&chunk);
            if seen.contains("\n:\n\n") || seen.starts_with(":\n\n") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no ping in {seen:?}");
    drop(blocker);
    // A request's own value below -1 is refused by name.
    let bad = server
        .post_json(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}], "sse_ping_interval": -3}),
        )
        .await;
    assert_eq!(
        bad.error(StatusCode::BAD_REQUEST)["param"],
        "sse_ping_interval"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_fields_select_paths_of_the_completion_answer() {
    let Some(server) = server().await else {
        return;
    };
    let fields = json!(["content", "generation_settings/n_predict", "no/such/field"]);
    let answer = server
        .post_json(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 2, "response_fields": fields}),
        )
        .await
        .json();
    let keys: Vec<&String> = answer.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["content", "generation_settings/n_predict"],
        "{answer}"
    );
    assert_eq!(answer["generation_settings/n_predict"], 2);
    assert!(answer["content"].is_string());
    // Streamed, the last object is selected; the pieces before it are whole.
    let streamed = server
        .post_json(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 2, "stream": true,
                   "response_fields": ["stop_type"]}),
        )
        .await;
    let last: Value = serde_json::from_str(streamed.events().last().unwrap()).unwrap();
    assert_eq!(last, json!({"stop_type": "limit"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reuse_port_lets_two_servers_listen_on_one_port() {
    let reusing = parse(&["--reuse-port"]).unwrap().server_config().unwrap();
    assert!(reusing.reuse_port && !ServerConfig::default().reuse_port);
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_REUSE_PORT"));
    let config = |reuse_port: bool, port: u16| ServerConfig {
        addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        reuse_port,
        ..ServerConfig::default()
    };
    let first = mlxcel_server::Server::bind(config(true, 0)).await.unwrap();
    let port = first.local_addr().port();
    let second = mlxcel_server::Server::bind(config(true, port)).await;
    assert_eq!(second.unwrap().local_addr().port(), port);
    // Without it on both, the port is taken.
    let plain = mlxcel_server::Server::bind(config(false, 0)).await.unwrap();
    let taken = mlxcel_server::Server::bind(config(false, plain.local_addr().port())).await;
    let Err(err) = taken else {
        panic!("the port is in use: binding it again must fail");
    };
    assert!(err.to_string().contains("cannot listen"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_prompts_dir_keeps_each_prompt_and_log_jsonl_selects_json_lines() {
    let jsonl = parse(&["--log-jsonl"]).unwrap();
    assert!(jsonl.log_jsonl && !jsonl.no_log_jsonl);
    assert!(
        parse(&["--log-jsonl", "--no-log-jsonl"])
            .unwrap()
            .no_log_jsonl
    );
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_LOG_JSONL"));
    if skip_model_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts");
    let config = parse(&["--log-prompts-dir", prompts.to_str().unwrap()])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(prompts.is_dir(), "created at start");
    let server = TestServer::with_model(config).await;
    let chat =
        json!({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 1});
    assert_eq!(
        server.post_json("/v1/chat/completions", chat).await.status,
        StatusCode::OK
    );
    let ids = json!({"prompt": [1, 2, 3], "n_predict": 1});
    assert_eq!(
        server.post_json("/completion", ids).await.status,
        StatusCode::OK
    );
    let mut texts: Vec<String> = std::fs::read_dir(&prompts)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    texts.sort();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("<|im_start|>user\nName a colour.")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "[1,2,3]"), "{texts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_prefix_serves_every_route_under_it_and_nothing_outside() {
    let config = parse(&["--api-prefix", "/api"])
        .unwrap()
        .server_config()
        .unwrap();
    assert_eq!(config.api_prefix.as_deref(), Some("/api"));
    assert!(
        parse(&["--api-prefix", "api/"])
            .unwrap()
            .server_config()
            .is_err()
    );
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_API_PREFIX"));
    // No model: /health is 503 (loading) under the prefix, and not found outside it.
    let server = TestServer::start(config, None).await;
    assert_eq!(
        server.get("/api/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(server.get("/health").await.status, StatusCode::NOT_FOUND);
    assert_eq!(server.get("/apihealth").await.status, StatusCode::NOT_FOUND);
    // The chat page and its files, whose links are relative to the page.
    let page = server.get("/api/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("src=\"webui/app.js\""), "{}", page.body);
    assert_eq!(server.get("/api/webui/app.js").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_serves_a_directorys_files_and_nothing_outside_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("site");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("index.html"), "<p>my own page</p>").unwrap();
    std::fs::write(dir.join("style.css"), "p {}").unwrap();
    std::fs::write(dir.join("health"), "a file named like a route").unwrap();
    std::fs::write(root.path().join("secret.txt"), "outside").unwrap();
    let config = parse(&["--path", dir.to_str().unwrap()])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(
        parse(&["--path", "/no/such/dir"])
            .unwrap()
            .server_config()
            .is_err()
    );
    let accepted = mlxcel_server::accepted_spellings();
    assert!(accepted.iter().any(|a| a == "LLAMA_ARG_STATIC_PATH"));
    let server = TestServer::start(config, None).await;
    let page = server.get("/").await;
    assert_eq!(page.body, "<p>my own page</p>");
    let style = server.get("/style.css").await;
    assert_eq!(style.headers["content-type"], "text/css; charset=utf-8");
    // A route wins over a file of its name; nothing outside the directory is read.
    assert_eq!(
        server.get("/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    for outside in [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "//secret.txt",
        "/./style.css",
    ] {
        let reply = server.get(outside).await;
        assert!(!reply.body.contains("outside"), "{outside}: {}", reply.body);
        assert_ne!(reply.status, StatusCode::OK, "{outside}");
    }
}
