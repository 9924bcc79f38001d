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
            alias: Some("smol".into()),
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
            .post_json("/completion", json!({"prompt": "Hello", "n": 2}))
            .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
        assert!(refused.body.contains("\"n\"") || refused.body.contains("n=2"));

        // Fields this server does not act on pass at llama-server's neutral value and are
        // refused, by name, at any other; never silently dropped.
        let neutral = server
            .post_json(
                "/completion",
                json!({"prompt": "Hi", "n_predict": 1, "typical_p": 1.0, "mirostat": 0, "ignore_eos": false}),
            )
            .await;
        assert_eq!(neutral.status, StatusCode::OK, "{}", neutral.body);
        for (path, field, value) in [
            ("/completion", "mirostat", json!(2)),
            ("/v1/completions", "dry_multiplier", json!(0.8)),
            (
                "/v1/chat/completions",
                "chat_template_kwargs",
                json!({"enable_thinking": false}),
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

        let metrics = server.get("/metrics").await.body;
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
}
