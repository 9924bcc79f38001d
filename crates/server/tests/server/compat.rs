//! The spellings the parser accepts are the list the compatibility gate reads
//! (`compat/llama-server/accepted-flags.txt`, checked by `cargo xtask check-compat`).

use std::path::Path;

#[test]
fn accepted_flags_file_lists_what_the_parser_accepts() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../compat/llama-server/accepted-flags.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let listed: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let accepted = mlxcel_server::accepted_spellings();
    let expected = format!(
        "# Every spelling mlxcel-server accepts: flags, multi-letter shorts, environment twins.\n\
         # Kept equal to the parser by the mlxcel-server tests (tests/server/compat.rs); read by\n\
         # `cargo xtask check-compat`.\n{}\n",
        accepted.join("\n")
    );
    assert!(
        listed == accepted.iter().map(String::as_str).collect::<Vec<_>>(),
        "{} differs from the parser; write it as:\n{expected}",
        path.display()
    );
}

mod http {
    //! llama-server's answers that the compatibility manifest marks supported, through the
    //! HTTP server on the default model.

    use hyper::StatusCode;
    use mlxcel_server::ServerConfig;
    use serde_json::json;

    use crate::support::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn llama_server_routes_fields_and_answers() {
        if skip_model_tests() {
            return;
        }
        let config = ServerConfig {
            metrics: true,
            props: true,
            aliases: vec!["smol".into()],
            ..ServerConfig::default()
        };
        let server = TestServer::with_model(config).await;
        assert_eq!(server.get("/v1/health").await.status, StatusCode::OK);
        assert_eq!(server.get("/models").await.json()["data"][0]["id"], "smol");

        // `/completions` is llama-server's native completion: n_predict, and its answer's shape.
        let native = server
            .post_json(
                "/completions",
                json!({"prompt": "Hello", "n_predict": 2, "temperature": 0, "repeat_last_n": 8}),
            )
            .await
            .json();
        assert_eq!(native["tokens_predicted"], 2, "{native}");
        assert!(native["content"].is_string() && native["choices"].is_null());
        // `/completion` reads max_tokens and max_completion_tokens as n_predict.
        for field in ["max_tokens", "max_completion_tokens"] {
            let body = server
                .post_json(
                    "/completion",
                    json!({"prompt": "Hello", field: 1, "temperature": 0}),
                )
                .await
                .json();
            assert_eq!(body["tokens_predicted"], 1, "{field}: {body}");
        }
        let refused = server
            .post_json("/completion", json!({"prompt": "Hello", "n": 0}))
            .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
        assert!(refused.body.contains("\"n\"") || refused.body.contains("n=0"));

        // Fields this server does not act on pass at llama-server's neutral value and are
        // refused, by name, at any other; never silently dropped.
        let neutral = server
            .post_json(
                "/completion",
                json!({"prompt": "Hi", "n_predict": 1, "typical_p": 1.0, "n_keep": -1, "ignore_eos": false}),
            )
            .await;
        assert_eq!(neutral.status, StatusCode::OK, "{}", neutral.body);
        for (path, field, value) in [
            ("/completion", "n_discard", json!(5)),
            ("/v1/completions", "n_cache_reuse", json!(4)),
            // The chat route acts on `chat_template_kwargs` (tests/server/reasoning.rs); the
            // others refuse it.
            (
                "/v1/completions",
                "chat_template_kwargs",
                json!({"enable_thinking": false}),
            ),
            // (`reasoning_control` is acted on now: tests/server/reasoning.rs.)
            (
                "/v1/chat/completions",
                "lora",
                json!([{"id": 0, "scale": 1.0}]),
            ),
        ] {
            let mut body = json!({"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
            body[field] = value;
            let reply = server.post_json(path, body).await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{path} {field}: {}",
                reply.body
            );
            assert_eq!(reply.json()["error"]["param"], field, "{}", reply.body);
        }
        let grammar = server
            .post_json(
                "/completion",
                json!({"prompt": "Yes or no?", "grammar": "root ::= \"yes\" | \"no\"", "n_predict": 4, "temperature": 0}),
            )
            .await
            .json();
        assert!(
            ["yes", "no"].contains(&grammar["content"].as_str().unwrap()),
            "{grammar}"
        );
        let chat = server
            .post_json(
                "/chat/completions",
                json!({
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 4,
                    "grammar": "root ::= \"hello\"",
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                    "tool_choice": "none",
                    "parallel_tool_calls": false,
                }),
            )
            .await;
        assert_eq!(chat.status, StatusCode::OK, "{}", chat.body);
        assert_eq!(chat.json()["choices"][0]["message"]["content"], "hello");

        let tokens = server
            .post_json("/tokenize", json!({"content": "Hi", "add_special": false}))
            .await
            .json();
        assert!(tokens["tokens"].as_array().is_some_and(|t| !t.is_empty()));

        let props = server.get("/props").await.json();
        assert_eq!(props["model_alias"], "smol");
        assert!(props["model_path"].is_string());
        assert!(props["build_info"].as_str().unwrap().starts_with("mlxcel-"));
        assert!(
            props["chat_template"]
                .as_str()
                .unwrap()
                .contains("im_start"),
            "the template itself, not a placeholder: {props}"
        );
        assert_eq!(
            (
                &props["endpoint_slots"],
                &props["endpoint_props"],
                &props["endpoint_metrics"]
            ),
            (&json!(true), &json!(true), &json!(true))
        );
        let set = server.post_json("/props", json!({})).await;
        assert_eq!(
            (set.status, set.json()),
            (StatusCode::OK, json!({"success": true}))
        );

        let mut stream = server
            .open(
                "/completion",
                json!({"prompt": "Count:", "n_predict": 64, "stream": true, "temperature": 0}),
            )
            .await;
        next_chunk(&mut stream).await;
        let slots = server.get("/slots").await.json();
        let busy = &slots[0];
        assert_eq!(busy["is_processing"], true, "{slots}");
        assert!(busy["id_task"].is_u64() && busy["n_prompt_tokens"].is_u64());
        assert!(busy["next_token"]["n_decoded"].is_u64(), "{busy}");
        drop(stream);

        let reply = server.get("/metrics").await;
        // The server's start as llama-server sends it: Unix seconds, not in the future.
        let start: u64 = reply.headers["process-start-time-unix"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(start > 1_700_000_000 && start <= now, "{start}");
        let metrics = reply.body;
        for family in [
            "llamacpp:prompt_seconds_total",
            "llamacpp:tokens_predicted_seconds_total",
            "llamacpp:n_decode_total",
            "llamacpp:prompt_tokens_seconds",
            "llamacpp:predicted_tokens_seconds",
        ] {
            assert!(
                metrics.contains(family),
                "{family} missing from:\n{metrics}"
            );
        }
    }

    /// `--no-slots` and no `--props`: llama-server's 501 answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_and_props_endpoints_follow_their_flags() {
        if skip_model_tests() {
            return;
        }
        let config = ServerConfig {
            slots: false,
            ..ServerConfig::default()
        };
        let server = TestServer::with_model(config).await;
        assert_eq!(
            server.get("/slots").await.status,
            StatusCode::NOT_IMPLEMENTED
        );
        let set = server.post_json("/props", json!({})).await;
        assert_eq!(set.status, StatusCode::NOT_IMPLEMENTED);
        let props = server.get("/props").await.json();
        assert_eq!(props["endpoint_slots"], false);
    }

    /// `/slots`: stable ids held from submission to the end, each slot's `params`, prompt and
    /// progress, and `?fail_on_no_slot` (llama-server's 503 while no slot is idle).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slots_keep_their_ids_and_show_params() {
        if skip_model_tests() {
            return;
        }
        let config = ServerConfig {
            parallel: 2,
            ..ServerConfig::default()
        };
        let server = TestServer::with_model(config).await;
        let flag = "fail_on_no_slot";
        let fail_on_no_slot = format!("/slots?{flag}=1");
        let idle = server.get(&fail_on_no_slot).await;
        assert_eq!(idle.status, StatusCode::OK, "{}", idle.body);
        let long = |prompt: &str| {
            json!({"prompt": prompt, "n_predict": 200, "stream": true, "temperature": 0.5,
                   "top_k": 7, "seed": 11, "stop": ["THE END"], "ignore_eos": true})
        };
        let mut first = server.open("/completion", long("Count: 1, 2,")).await;
        next_chunk(&mut first).await;
        let mut second = server.open("/completion", long("Spell: a, b,")).await;
        next_chunk(&mut second).await;
        let slots = server.get("/slots").await.json();
        let (a, b) = (&slots[0], &slots[1]);
        assert_eq!((&a["id"], &b["id"]), (&json!(0), &json!(1)), "{slots}");
        assert_eq!(a["is_processing"], true, "{slots}");
        assert_eq!(b["is_processing"], true, "{slots}");
        assert!(
            a["prompt"].as_str().unwrap().contains("Count: 1, 2,"),
            "{a}"
        );
        assert!(
            b["prompt"].as_str().unwrap().contains("Spell: a, b,"),
            "{b}"
        );
        let params = &a["params"];
        assert_eq!(params["top_k"], 7, "{params}");
        assert_eq!(params["seed"], 11, "{params}");
        assert_eq!(params["n_predict"], 200, "{params}");
        assert_eq!(params["stop"], json!(["THE END"]), "{params}");
        assert_eq!(params["ignore_eos"], true, "{params}");
        assert!((params["temperature"].as_f64().unwrap() - 0.5).abs() < 1e-6);
        assert!(params["samplers"].as_array().is_some_and(|s| !s.is_empty()));
        assert!(params["logit_bias"].as_array().is_some(), "{params}");
        let next = &a["next_token"];
        assert_eq!(next["has_next_token"], true, "{a}");
        assert!(next["has_new_line"].is_boolean(), "{a}");
        let decoded = next["n_decoded"].as_i64().unwrap();
        assert!(decoded >= 1, "{a}");
        assert!(next["n_remain"].as_i64().unwrap() <= 200 - decoded, "{a}");
        assert!(
            a["generated"].is_string() && a["speculative"] == false,
            "{a}"
        );
        assert!(a["n_ctx"].as_u64().unwrap() > 0, "{a}");
        // Its prompt is computed (it has streamed a token), none of it from a cache.
        assert_eq!(a["n_prompt_tokens_processed"], a["n_prompt_tokens"], "{a}");
        assert_eq!(a["n_prompt_tokens_cache"], 0, "{a}");
        let task_b = b["id_task"].clone();

        // Every slot busy: fail_on_no_slot answers llama-server's 503.
        let busy = server.get(&fail_on_no_slot).await;
        let error = busy.llama_error(StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error["message"], "no slot available", "{error}");

        // The first request ends: its slot is idle, the second keeps id 1.
        drop(first);
        assert!(
            eventually(std::time::Duration::from_secs(30), || server
                .state
                .active_requests()
                .len()
                == 1)
            .await
        );
        let slots = server.get("/slots").await.json();
        assert_eq!(slots[0]["is_processing"], false, "{slots}");
        assert_eq!(slots[0]["id_task"], -1, "{slots}");
        assert_eq!(slots[1]["id_task"], task_b, "{slots}");
        assert_eq!(slots[1]["is_processing"], true, "{slots}");
        let one_idle = server.get(&fail_on_no_slot).await;
        assert_eq!(one_idle.status, StatusCode::OK, "{}", one_idle.body);
        next_chunk(&mut second).await;
        drop(second);

        // A query parameter this server does not read is refused, naming it.
        let unknown = server.get("/slots?id_slot=0").await;
        let error = unknown.llama_error(StatusCode::BAD_REQUEST);
        assert!(
            error["message"].as_str().unwrap().contains("id_slot"),
            "{error}"
        );
    }

    /// `/props` names the special tokens and the modalities.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn props_name_special_tokens_and_modalities() {
        if skip_model_tests() {
            return;
        }
        let server = TestServer::with_model(ServerConfig::default()).await;
        let props = server.get("/props").await.json();
        assert_eq!(
            props["modalities"],
            json!({"vision": false, "audio": false})
        );
        assert_eq!(props["is_sleeping"], false);
        // The end-of-sequence text is one special token of the vocabulary, which the chat
        // template writes at the end of each turn.
        let eos = props["eos_token"].as_str().unwrap();
        assert!(!eos.is_empty(), "{props}");
        let ids = server
            .post_json("/tokenize", json!({"content": eos}))
            .await
            .json();
        assert_eq!(ids["tokens"].as_array().unwrap().len(), 1, "{eos}: {ids}");
        assert!(
            props["chat_template"].as_str().unwrap().contains(eos),
            "{props}"
        );
        assert!(props["bos_token"].is_string(), "{props}");
        // With parse_special false the same text is plain text: several tokens, none of them
        // the special one.
        let plain = server
            .post_json("/tokenize", json!({"content": eos, "parse_special": false}))
            .await
            .json();
        let plain = plain["tokens"].as_array().unwrap();
        assert!(
            plain.len() > 1 && !plain.contains(&ids["tokens"][0]),
            "{plain:?}"
        );
        // The web UI's fields, as llama-server reports them.
        assert_eq!(props["ui"], true, "{props}");
        assert_eq!(props["ui_settings"], json!({}));
        assert_eq!(props["media_marker"], "<__media__>");
        assert_eq!(props["cors_proxy_enabled"], false);
        let no_ui = TestServer::with_model(ServerConfig {
            webui: false,
            ..ServerConfig::default()
        })
        .await;
        assert_eq!(no_ui.get("/props").await.json()["ui"], false);
    }
}
