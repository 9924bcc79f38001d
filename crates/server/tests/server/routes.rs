//! Every route, streaming and not, on the default model.

use hyper::StatusCode;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

const PARIS: &str = " Paris.\n\nThe answer is:";

fn greedy_completion(extra: Value) -> Value {
    let mut body =
        json!({ "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0 });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_completions_plain_and_streamed() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let reply = server
        .post_json("/v1/completions", greedy_completion(json!({})))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], PARIS);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(body["model"], "SmolLM2-135M-Instruct.Q4_1");

    let reply = server
        .post_json(
            "/v1/completions",
            greedy_completion(json!({"stream": true, "stream_options": {"include_usage": true}})),
        )
        .await;
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let events = reply.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, PARIS);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["usage"].is_null())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_seed_penalties_and_logprobs() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let reply = server
        .post_json(
            "/v1/completions",
            greedy_completion(json!({"stop": ["answer"], "max_tokens": 20})),
        )
        .await;
    let body = reply.json();
    assert_eq!(body["choices"][0]["text"], " Paris.\n\nThe ");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    let sampled = json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0,
        "top_p": 0.9, "seed": 7, "presence_penalty": 0.5, "frequency_penalty": 0.5});
    let a = server
        .post_json("/v1/completions", sampled.clone())
        .await
        .json();
    let b = server.post_json("/v1/completions", sampled).await.json();
    assert_eq!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "same seed, same text"
    );

    let reply = server
        .post_json(
            "/v1/completions",
            greedy_completion(json!({"logprobs": 2, "max_tokens": 3})),
        )
        .await;
    let logprobs = &reply.json()["choices"][0]["logprobs"];
    assert_eq!(
        logprobs["tokens"].as_array().unwrap().len(),
        3,
        "{logprobs}"
    );
    assert_eq!(logprobs["tokens"][0], " Paris");
    assert!(logprobs["token_logprobs"][0].as_f64().unwrap() <= 0.0);
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_plain_and_streamed_with_logprobs() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let request = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_completion_tokens": 5, "temperature": 0, "logprobs": true, "top_logprobs": 2,
    });
    let reply = server
        .post_json("/v1/chat/completions", request.clone())
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let body = reply.json();
    assert_eq!(body["object"], "chat.completion");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    let text = message["content"].as_str().unwrap().to_owned();
    assert!(!text.is_empty());
    let content = body["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 5);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(body["usage"]["completion_tokens"], 5);

    let mut streamed = request;
    streamed["stream"] = json!(true);
    let events = server
        .post_json("/v1/chat/completions", streamed)
        .await
        .events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(joined, text, "streamed text equals the whole response");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_completion_plain_and_streamed() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let request = json!({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
        "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": 1, "cache_prompt": true});
    let body = server
        .post_json("/completion", request.clone())
        .await
        .json();
    assert_eq!(body["content"], PARIS);
    assert_eq!(body["stop"], true);
    assert_eq!(body["stopped_limit"], true);
    assert_eq!(body["tokens_predicted"], 8);
    assert_eq!(body["tokens_evaluated"], 5);
    assert!(body["timings"]["predicted_ms"].is_number());

    let mut streamed = request;
    streamed["stream"] = json!(true);
    let events = server.post_json("/completion", streamed).await.events();
    let chunks: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["content"].as_str())
        .collect();
    assert_eq!(text, PARIS);
    assert_eq!(chunks.last().unwrap()["stop"], true);
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c["stop"] == false)
    );

    let body = server
        .post_json("/completion", json!({"prompt": "The capital of France is", "n_predict": 20, "temperature": 0, "stop": ["answer"]}))
        .await
        .json();
    assert_eq!(
        (body["stopped_word"].clone(), body["stopping_word"].clone()),
        (json!(true), json!("answer"))
    );

    let body = server
        .post_json(
            "/completion",
            json!({"prompt": "The capital of France is", "n_predict": 2, "temperature": 0, "n_probs": 3}),
        )
        .await
        .json();
    let probs = body["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 2, "{body}");
    assert_eq!(probs[0]["token"], " Paris");
    assert_eq!(probs[0]["top_logprobs"].as_array().unwrap().len(), 3);
    // Each entry and each candidate carry their text's bytes, as llama-server's do.
    assert_eq!(probs[0]["bytes"], json!(" Paris".as_bytes()));
    let top = &probs[0]["top_logprobs"][0];
    assert_eq!(
        top["bytes"],
        json!(top["token"].as_str().unwrap().as_bytes())
    );
    // The request's settings ride on the answer as llama-server's `generation_settings`.
    let settings = &body["generation_settings"];
    assert_eq!(settings["n_predict"], 2, "{body}");
    assert_eq!(settings["temperature"], 0.0, "{body}");
    assert_eq!(settings["n_probs"], 3, "{body}");
    assert_eq!(settings["adaptive_target"], -1.0, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_and_apply_template() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    let body = server
        .post_json("/tokenize", json!({"content": "The capital of France is"}))
        .await
        .json();
    assert_eq!(body["tokens"], json!([504, 3575, 282, 4649, 314]));
    let body = server
        .post_json(
            "/tokenize",
            json!({"content": "The capital", "with_pieces": true}),
        )
        .await
        .json();
    assert_eq!(body["tokens"][0], json!({"id": 504, "piece": "The"}));
    let body = server
        .post_json(
            "/detokenize",
            json!({"tokens": [504, 3575, 282, 4649, 314]}),
        )
        .await
        .json();
    assert_eq!(body["content"], "The capital of France is");
    let body = server
        .post_json(
            "/apply-template",
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await
        .json();
    let prompt = body["prompt"].as_str().unwrap();
    assert!(
        prompt.contains("<|im_start|>user\nHi<|im_end|>")
            && prompt.ends_with("<|im_start|>assistant\n"),
        "{prompt}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_props_slots_health_and_metrics() {
    if skip_model_tests() {
        return;
    }
    let config = ServerConfig {
        metrics: true,
        parallel: 3,
        ctx_size: Some(2048),
        aliases: vec!["smol".into()],
        ..ServerConfig::default()
    };
    let server = TestServer::with_model(config).await;
    let models = server.get("/v1/models").await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "smol");
    let health = server.get("/health").await;
    assert_eq!(
        (health.status, health.json()),
        (StatusCode::OK, json!({"status": "ok"}))
    );
    let props = server.get("/props").await.json();
    assert_eq!(props["default_generation_settings"]["n_ctx"], 2048);
    assert_eq!(props["n_ctx_train"], 8192);
    assert_eq!(props["total_slots"], 3);
    assert_eq!(props["backend"], "mlx");
    assert!(
        props["capacity_buckets"].is_null(),
        "MLX has no static buckets"
    );
    let slots = server.get("/slots").await.json();
    assert_eq!(slots.as_array().unwrap().len(), 3);
    assert_eq!(slots[0]["is_processing"], false);

    let completion = server
        .post_json(
            "/v1/completions",
            json!({"model": "smol", "prompt": "Hello", "max_tokens": 3, "temperature": 0}),
        )
        .await;
    assert_eq!(completion.status, StatusCode::OK, "{}", completion.body);
    let metrics = server.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    // The engine (and its counters) is shared with the binary's other tests, which may run
    // concurrently: the engine-wide totals are at least this request's.
    let value = |family: &str| -> f64 {
        metrics
            .body
            .lines()
            .find_map(|l| l.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{family} missing from:\n{}", metrics.body))
    };
    assert!(value("llamacpp:prompt_tokens_total") >= 1.0);
    assert!(value("llamacpp:tokens_predicted_total") >= 3.0);
    for family in [
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "mlxcel_queue_depth",
        "mlxcel_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
        "mlxcel_inter_token_latency_seconds_sum",
        "mlxcel_bucket_occupancy{bucket=\"dynamic\"}",
        "mlxcel_compilations_total 0",
        "mlxcel_constraint_masks_total",
        "mlxcel_constraint_mask_seconds_total",
        "mlxcel_http_requests_finished_total{reason=\"length\"} 1",
        "llamacpp:prompt_tokens_cached_total",
        "llamacpp:spec_decode_num_drafts_total",
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        // vLLM's families, each series labelled with the served model's name.
        "vllm:num_requests_running{model_name=\"smol\"}",
        "vllm:num_requests_waiting{model_name=\"smol\"}",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"smol\",le=\"+Inf\"}",
        "vllm:inter_token_latency_seconds_sum{model_name=\"smol\"}",
        "vllm:e2e_request_latency_seconds_count{model_name=\"smol\"}",
        "vllm:request_decode_time_seconds_count{model_name=\"smol\"}",
        "vllm:request_success_total{model_name=\"smol\",finished_reason=\"length\"}",
        "vllm:request_queue_time_seconds_count{model_name=\"smol\"}",
        "vllm:request_prefill_time_seconds_count{model_name=\"smol\"}",
        "vllm:kv_cache_usage_perc{model_name=\"smol\"}",
    ] {
        assert!(
            metrics.body.contains(family),
            "{family} missing from:\n{}",
            metrics.body
        );
    }
    // Averages over the engine's steps and requests: at least one sequence per step, and the
    // largest request at least this one's 1 + 3 positions.
    assert!(value("llamacpp:n_busy_slots_per_decode") >= 1.0);
    assert!(value("llamacpp:n_tokens_max") >= 4.0);
    let e2e = metrics
        .body
        .lines()
        .find_map(|l| {
            l.strip_prefix("vllm:e2e_request_latency_seconds_count{model_name=\"smol\"} ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap();
    assert!(e2e >= 1.0);
    let kv = metrics
        .body
        .lines()
        .find_map(|l| {
            l.strip_prefix("vllm:kv_cache_usage_perc{model_name=\"smol\"} ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap();
    assert!((0.0..=1.0).contains(&kv), "{kv}");
}

/// With the prefix cache on (`--cache-ram`), a prompt that starts like an earlier one reports the
/// tokens the cache held, in each API's own place: OpenAI's `prompt_tokens_details.cached_tokens`,
/// llama-server's `timings.cache_n` (and `prompt_n` the rest), the Responses API's
/// `input_tokens_details.cached_tokens`, Anthropic's `cache_read_input_tokens`, and the
/// `llamacpp:prompt_tokens_cached_total` metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_prompt_tokens_are_reported_per_request() {
    if skip_model_tests() {
        return;
    }
    // Room for every request's slot: each holds a whole block of 256 positions (11.25 MiB).
    let options = mlxcel_engine::EngineOptions {
        prefix_cache_bytes: 256 << 20,
        ..mlxcel_engine::EngineOptions::default()
    };
    let engine = tokio::task::spawn_blocking(move || mlxcel_engine::Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    let config = ServerConfig {
        metrics: true,
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, Some(std::sync::Arc::new(engine))).await;
    let system = "You are a careful assistant. Answer briefly and precisely, in one sentence. \
                  Never make up facts; say when you do not know. ";
    let chat = |question: &str| {
        json!({"messages": [{"role": "system", "content": system},
                            {"role": "user", "content": question}],
               "max_tokens": 4, "temperature": 0})
    };
    let first = server
        .post_json(
            "/v1/chat/completions",
            chat("What is the capital of France?"),
        )
        .await
        .json();
    assert_eq!(
        first["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{first}"
    );
    assert_eq!(first["timings"]["cache_n"], 0, "{first}");
    let second = server
        .post_json(
            "/v1/chat/completions",
            chat("What is the capital of Italy?"),
        )
        .await
        .json();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached >= 20 && cached < prompt, "{second}");
    assert_eq!(second["timings"]["cache_n"], cached, "{second}");
    assert_eq!(second["timings"]["prompt_n"], prompt - cached, "{second}");

    // llama-server's route: the same split in `timings`.
    let prompt_text = server
        .post_json(
            "/apply-template",
            json!({"messages": [{"role": "system", "content": system},
                                {"role": "user", "content": "What is the capital of Spain?"}]}),
        )
        .await
        .json()["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    let native = server
        .post_json(
            "/completion",
            json!({"prompt": prompt_text, "n_predict": 4, "temperature": 0}),
        )
        .await
        .json();
    let cache_n = native["timings"]["cache_n"].as_u64().unwrap();
    assert!(cache_n >= 20, "{native}");
    assert_eq!(
        native["timings"]["prompt_n"].as_u64().unwrap() + cache_n,
        native["tokens_evaluated"].as_u64().unwrap(),
        "{native}"
    );
    // `tokens_cached`: the positions the request's cache holds (prompt and answer but its last
    // token).
    assert_eq!(
        native["tokens_cached"].as_u64().unwrap(),
        native["tokens_evaluated"].as_u64().unwrap() + 3,
        "{native}"
    );
    // `"cache_prompt": false` computes the whole prompt, on every route.
    let uncached = server
        .post_json(
            "/completion",
            json!({"prompt": prompt_text, "n_predict": 4, "temperature": 0,
                   "cache_prompt": false}),
        )
        .await
        .json();
    assert_eq!(uncached["timings"]["cache_n"], 0, "{uncached}");
    assert_eq!(uncached["content"], native["content"], "{uncached}");
    let mut body = chat("What is the capital of Italy?");
    body["cache_prompt"] = json!(false);
    let uncached = server.post_json("/v1/chat/completions", body).await.json();
    assert_eq!(
        uncached["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{uncached}"
    );

    // The Responses API and Anthropic's Messages API, each in its own terms.
    let response = server
        .post_json(
            "/v1/responses",
            json!({"instructions": system, "input": "What is the capital of Portugal?",
                   "max_output_tokens": 4, "temperature": 0}),
        )
        .await
        .json();
    assert!(
        response["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 20,
        "{response}"
    );
    let message = server
        .post_json(
            "/v1/messages",
            json!({"system": system, "max_tokens": 4, "temperature": 0,
                   "messages": [{"role": "user", "content": "What is the capital of Greece?"}]}),
        )
        .await
        .json();
    let read = message["usage"]["cache_read_input_tokens"]
        .as_u64()
        .unwrap();
    assert!(read >= 20, "{message}");
    let counted = server
        .post_json(
            "/v1/messages/count_tokens",
            json!({"system": system,
                   "messages": [{"role": "user", "content": "What is the capital of Greece?"}]}),
        )
        .await
        .json();
    assert_eq!(
        message["usage"]["input_tokens"].as_u64().unwrap() + read,
        counted["input_tokens"].as_u64().unwrap(),
        "Anthropic's split: cached tokens are not input tokens ({message})"
    );

    let metrics = server.get("/metrics").await.body;
    let total: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("llamacpp:prompt_tokens_cached_total ")?
                .parse()
                .ok()
        })
        .unwrap();
    assert!(total >= cached + cache_n + read, "{total}");
    // The cache's own families: lookups, hits, what it holds, the token hit rate's parts.
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| {
                // After the name, the labels if any (vLLM's `{model_name="..."}`), then the value.
                let rest = l.strip_prefix(name)?;
                let rest = rest
                    .strip_prefix('{')
                    .map_or(Some(rest), |r| r.split_once('}').map(|(_, v)| v))?;
                rest.strip_prefix(' ')?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let (lookups, hits) = (
        value("mlxcel_prefix_cache_lookups_total"),
        value("mlxcel_prefix_cache_hits_total"),
    );
    // Two of the requests asked not to use the cache (`cache_prompt: false`), the first found
    // nothing.
    assert!(
        lookups >= 5 && hits >= 4 && hits < lookups,
        "{lookups} {hits}"
    );
    // Take-overs are hits (none here: no prompt starts with a whole earlier conversation).
    assert!(value("mlxcel_prefix_cache_takeovers_total") <= hits);
    assert!(value("vllm:prefix_cache_queries_total") > value("vllm:prefix_cache_hits_total"));
    assert!(value("mlxcel_prefix_cache_entries") >= 1);
    let bytes = value("mlxcel_prefix_cache_bytes");
    assert!(bytes > 0 && bytes <= value("mlxcel_prefix_cache_budget_bytes"));
    assert_eq!(value("mlxcel_prefix_cache_budget_bytes"), 256 << 20);
    assert_eq!(value("mlxcel_prefix_cache_evictions_total"), 0);
    // The MLX backend's KV blocks: the kept entries hold some, within the budget.
    assert_eq!(value("mlxcel_kv_block_positions"), 256);
    assert!(value("mlxcel_kv_blocks_held") >= 1);
    assert!(value("mlxcel_kv_blocks_shared") <= value("mlxcel_kv_blocks_held"));
    assert!(value("mlxcel_kv_blocks_free") > 0);
}

/// With prompt-lookup speculation on, a request that repeats its prompt reports its proposals in
/// llama-server's `timings.draft_n` and `draft_n_accepted` (on `/completion` and the OpenAI
/// routes); without speculation the fields are absent, as llama-server leaves them out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_proposals_are_reported_in_timings() {
    if skip_model_tests() {
        return;
    }
    let options = mlxcel_engine::EngineOptions {
        speculative: Some(mlxcel_engine::SpeculativeConfig::default()),
        ..mlxcel_engine::EngineOptions::default()
    };
    let engine = tokio::task::spawn_blocking(move || mlxcel_engine::Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    let server =
        TestServer::start(ServerConfig::default(), Some(std::sync::Arc::new(engine))).await;
    let prompt = "one two three four five six seven eight nine ten\n\
                  one two three four five six seven eight nine ten\n\
                  one two three four five six seven eight nine ten\none two";
    for (route, body) in [
        (
            "/completion",
            json!({"prompt": prompt, "n_predict": 24, "temperature": 0}),
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
        ),
    ] {
        let answer = server.post_json(route, body).await.json();
        let timings = &answer["timings"];
        let drafted = timings["draft_n"].as_u64().unwrap_or(0);
        let accepted = timings["draft_n_accepted"].as_u64().unwrap_or(u64::MAX);
        assert!(
            drafted > 0 && accepted <= drafted && accepted > 0,
            "{route}: {answer}"
        );
    }
    // Without speculation the fields are absent.
    let engine = tokio::task::spawn_blocking(|| {
        mlxcel_engine::Engine::load(None, mlxcel_engine::EngineOptions::default())
    })
    .await
    .unwrap()
    .unwrap();
    let server =
        TestServer::start(ServerConfig::default(), Some(std::sync::Arc::new(engine))).await;
    let plain = server
        .post_json(
            "/completion",
            json!({"prompt": prompt, "n_predict": 8, "temperature": 0}),
        )
        .await
        .json();
    assert!(
        plain["timings"].get("draft_n").is_none() && plain["timings"]["predicted_n"] == 8,
        "{plain}"
    );
}

/// OpenAI's speech-to-text routes answer as llama-server does for a model without audio input:
/// 501 `not_supported_error`, whatever the body (an upload is never read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_to_text_is_answered_as_llama_server_answers_a_text_model() {
    let server = TestServer::start(ServerConfig::default(), None).await;
    for path in ["/v1/audio/transcriptions", "/audio/transcriptions"] {
        for body in [
            "",
            "--x\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nRIFF\r\n--x--",
        ] {
            let reply = server.post(path, body).await;
            let error = reply.error(StatusCode::NOT_IMPLEMENTED);
            assert_eq!(error["type"], "not_supported_error", "{}", reply.body);
            assert!(
                error["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("The current model does not support audio input."),
                "{}",
                reply.body
            );
        }
    }
    let get = server.get("/v1/audio/transcriptions").await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED, "{}", get.body);
}
