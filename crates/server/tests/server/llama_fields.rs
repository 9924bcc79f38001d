//! llama-server's generation fields every generating route reads (`ignore_eos`,
//! `t_max_predict_ms`, `samplers`, `typical_p`, `return_tokens`, `n_probs`, `logit_bias`), through the HTTP
//! server on the default model.

use hyper::StatusCode;
use mlxcel_server::ServerConfig;
use serde_json::{Value, json};

use crate::support::*;

async fn server() -> Option<TestServer> {
    if skip_model_tests() {
        return None;
    }
    Some(TestServer::with_model(ServerConfig::default()).await)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 48,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_generates_past_the_end_of_sequence() {
    let Some(server) = server().await else {
        return;
    };
    // Greedy, the reply ends with the end-of-sequence token well within the budget ...
    let plain = server
        .post_json("/v1/chat/completions", chat(json!({})))
        .await
        .json();
    assert_eq!(plain["choices"][0]["finish_reason"], "stop", "{plain}");
    assert!(plain["usage"]["completion_tokens"].as_u64().unwrap() < 48);
    // ... and with ignore_eos it runs to the budget (the EOS logits are -inf).
    let ignored = server
        .post_json("/v1/chat/completions", chat(json!({"ignore_eos": true})))
        .await
        .json();
    assert_eq!(
        ignored["choices"][0]["finish_reason"], "length",
        "{ignored}"
    );
    assert_eq!(ignored["usage"]["completion_tokens"], 48, "{ignored}");
    // The same on llama-server's route: no stopped_eos, stopped by the limit.
    let native = server
        .post_json(
            "/completion",
            json!({"prompt": "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n",
                   "n_predict": 48, "temperature": 0, "ignore_eos": true}),
        )
        .await
        .json();
    assert_eq!(native["stopped_eos"], false, "{native}");
    assert_eq!(native["stop_type"], "limit", "{native}");
    assert_eq!(native["tokens_predicted"], 48, "{native}");
    // Its settings list the end-of-sequence tokens' biases in llama-server's shape (-inf: null).
    let biases = native["generation_settings"]["logit_bias"]
        .as_array()
        .unwrap();
    assert!(!biases.is_empty(), "{native}");
    for entry in biases {
        assert!(
            entry["bias"].is_null() && entry["token"].is_u64(),
            "{entry}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t_max_predict_ms_stops_at_a_newline_past_the_limit() {
    let Some(server) = server().await else {
        return;
    };
    // Past 1 ms, the first token with a newline ends the output, reported as llama-server
    // reports its time limit: stopped_limit, stop_type "limit" (OpenAI: finish_reason length).
    let body = json!({
        "prompt": "Fruits:\n1. apples\n2. pears\n3.",
        "n_predict": 200, "temperature": 0, "ignore_eos": true,
        "t_max_predict_ms": 1, "return_tokens": true,
    });
    let native = server.post_json("/completion", body).await.json();
    assert_eq!(native["stopped_limit"], true, "{native}");
    assert_eq!(native["stop_type"], "limit", "{native}");
    let predicted = native["tokens_predicted"].as_u64().unwrap();
    assert!(predicted < 200, "{native}");
    assert!(
        native["content"].as_str().unwrap().contains('\n'),
        "{native}"
    );
    // The last token is the one with the newline.
    let last = native["tokens"].as_array().unwrap().last().unwrap().clone();
    let piece = server
        .post_json("/detokenize", json!({"tokens": [last]}))
        .await
        .json();
    assert!(piece["content"].as_str().unwrap().contains('\n'), "{piece}");

    let openai = server
        .post_json(
            "/v1/completions",
            json!({"prompt": "Fruits:\n1. apples\n2. pears\n3.", "max_tokens": 200,
                   "temperature": 0, "ignore_eos": true, "t_max_predict_ms": 1}),
        )
        .await
        .json();
    assert_eq!(openai["choices"][0]["finish_reason"], "length", "{openai}");
    assert_eq!(
        openai["usage"]["completion_tokens"].as_u64(),
        Some(predicted)
    );
    let refused = server
        .post_json(
            "/completion",
            json!({"prompt": "x", "t_max_predict_ms": -5}),
        )
        .await;
    assert_eq!(
        refused.error(StatusCode::BAD_REQUEST)["param"],
        "t_max_predict_ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samplers_order_and_subset_are_honoured_and_unknown_names_refused() {
    let Some(server) = server().await else {
        return;
    };
    let run = |extra: Value| {
        let mut body = json!({"prompt": "The capital of France is", "n_predict": 8, "seed": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let server = &server;
        async move {
            let reply = server.post_json("/completion", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()["content"].as_str().unwrap().to_owned()
        }
    };
    let greedy = run(json!({"temperature": 0})).await;
    // Top-k 1 alone: the argmax, whatever the temperature (which is not in the chain).
    let top_k_only = run(json!({"temperature": 5.0, "top_k": 1, "samplers": ["top_k"]})).await;
    assert_eq!(top_k_only, greedy);
    // The compact spelling: `k` then `t`.
    let chars = run(json!({"temperature": 5.0, "top_k": 1, "samplers": "kt"})).await;
    assert_eq!(chars, greedy);
    // Without top-k in the chain, temperature 5 over the whole vocabulary is not greedy.
    let hot = run(
        json!({"temperature": 5.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
                         "samplers": ["temperature"]}),
    )
    .await;
    assert_ne!(hot, greedy);
    // llama.cpp's other spellings, and its neutral samplers (no-ops at the accepted settings).
    let spelled =
        run(json!({"temperature": 5.0, "top_k": 1, "samplers": ["Top-K", "dry", "xtc", "temp"]}))
            .await;
    assert_eq!(spelled, greedy);

    // Unknown names are a 400 naming them; samplers this server does not have are refused.
    let refused = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"samplers": ["top_k", "bogus", "nope"]})),
        )
        .await;
    let error = refused.error(StatusCode::BAD_REQUEST);
    assert_eq!(error["param"], "samplers");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("bogus") && message.contains("nope"),
        "{message}"
    );
    let missing = server
        .post_json(
            "/completion",
            json!({"prompt": "x", "samplers": ["infill"]}),
        )
        .await;
    assert!(
        missing.error(StatusCode::BAD_REQUEST)["message"]
            .as_str()
            .unwrap()
            .contains("infill")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typical_p_and_return_tokens_on_completion() {
    let Some(server) = server().await else {
        return;
    };
    // A tiny typical_p keeps the single most typical token at every step: the draw no longer
    // depends on the seed, even at temperature 1 over the whole vocabulary.
    let typical = |seed: u64| {
        let server = &server;
        async move {
            server
                .post_json(
                    "/completion",
                    json!({"prompt": "Once upon a time", "n_predict": 8, "temperature": 1.0,
                           "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1e-6,
                           "seed": seed, "return_tokens": true}),
                )
                .await
                .json()
        }
    };
    let (a, b) = (typical(1).await, typical(2).await);
    assert_eq!(a["content"], b["content"], "{a}\n{b}");
    assert_eq!(a["tokens"], b["tokens"]);
    // return_tokens: the generated ids, which detokenize to the content.
    let tokens = a["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len() as u64,
        a["tokens_predicted"].as_u64().unwrap(),
        "{a}"
    );
    let text = server
        .post_json("/detokenize", json!({"tokens": tokens}))
        .await
        .json();
    assert_eq!(text["content"], a["content"]);
    let refused = server
        .post_json("/completion", json!({"prompt": "x", "typical_p": -1}))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(refused.body.contains("typical_p"), "{}", refused.body);

    // Without return_tokens, `tokens` is empty; streamed, each piece carries its token.
    let plain = server
        .post_json(
            "/completion",
            json!({"prompt": "Hello", "n_predict": 3, "temperature": 0}),
        )
        .await
        .json();
    assert_eq!(plain["tokens"], json!([]), "{plain}");
    let streamed = server
        .post_json(
            "/completion",
            json!({"prompt": "Hello", "n_predict": 3, "temperature": 0, "stream": true}),
        )
        .await;
    let events: Vec<Value> = streamed
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (last, pieces) = events.split_last().unwrap();
    assert!(
        pieces
            .iter()
            .all(|p| p["tokens"].as_array().unwrap().len() == 1)
    );
    assert_eq!(last["tokens"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_probs_on_the_openai_routes() {
    let Some(server) = server().await else {
        return;
    };
    // As llama-server: on chat, n_probs asks for logprobs when `logprobs` does not.
    let body = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"n_probs": 3, "max_tokens": 2})),
        )
        .await
        .json();
    let content = &body["choices"][0]["logprobs"]["content"];
    assert_eq!(content.as_array().unwrap().len(), 2, "{body}");
    assert_eq!(
        content[0]["top_logprobs"].as_array().unwrap().len(),
        3,
        "{body}"
    );
    // On completions, n_probs wins over logprobs (its alias in llama-server).
    let body = server
        .post_json(
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0, "logprobs": 1,
                   "n_probs": 2}),
        )
        .await
        .json();
    let top = &body["choices"][0]["logprobs"]["top_logprobs"];
    assert_eq!(top[0].as_object().unwrap().len(), 2, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_in_llama_server_and_openai_forms() {
    let Some(server) = server().await else {
        return;
    };
    let greedy = |extra: Value| {
        let server = &server;
        async move {
            let mut body = json!({"prompt": "Once upon a time", "n_predict": 4, "temperature": 0,
                                  "return_tokens": true});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            server.post_json("/completion", body).await.json()
        }
    };
    let plain = greedy(json!({})).await;
    let first = plain["tokens"][0].as_u64().unwrap();
    // `false` forbids the greedy first token, in each of llama-server's forms.
    for bias in [
        json!([[first, false]]),
        json!({ first.to_string(): false }),
        json!([[first, -1000.0]]),
    ] {
        let biased = greedy(json!({ "logit_bias": bias })).await;
        assert_ne!(biased["tokens"][0], plain["tokens"][0], "{bias}: {biased}");
    }
    // A large positive bias forces a token at every step; a text names its tokens.
    let forced = greedy(json!({"logit_bias": [[42, 1000.0]]})).await;
    assert_eq!(forced["tokens"], json!([42, 42, 42, 42]), "{forced}");
    let by_text = server
        .post_json(
            "/tokenize",
            json!({"content": " dragon", "add_special": false}),
        )
        .await
        .json();
    let dragon = by_text["tokens"].clone();
    assert_eq!(dragon.as_array().unwrap().len(), 1, "{by_text}");
    let texted = greedy(json!({"logit_bias": [[" dragon", 1000.0]]})).await;
    assert_eq!(texted["tokens"][0], dragon[0], "{texted}");

    // OpenAI's form on its routes: an object from token-id strings to biases.
    let chat = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"max_tokens": 3, "logit_bias": {"42": 100}, "logprobs": true})),
        )
        .await
        .json();
    let ids: Vec<&str> = chat["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    let token_42 = server
        .post_json("/detokenize", json!({"tokens": [42]}))
        .await
        .json();
    assert_eq!(
        ids,
        vec![token_42["content"].as_str().unwrap(); 3],
        "{chat}"
    );

    // What cannot be read is refused with a 400 naming the field, never skipped.
    for bad in [
        json!({"-1": 1.0}),
        json!([[1_000_000, 1.0]]),
        json!({"42": "high"}),
        json!([[42]]),
        json!("42"),
        json!({"42": true}),
    ] {
        let refused = server
            .post_json(
                "/v1/completions",
                json!({"prompt": "x", "max_tokens": 1, "logit_bias": bad}),
            )
            .await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            refused.body
        );
        let error: Value = serde_json::from_str(&refused.body).unwrap();
        assert_eq!(error["error"]["param"], "logit_bias", "{bad}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_report_prompt_progress_and_per_token_timings() {
    let Some(server) = server().await else {
        return;
    };
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(8);
    let request = json!({
        "prompt": prompt,
        "n_predict": 4,
        "temperature": 0,
        "stream": true,
        "timings_per_token": true,
        "return_progress": true,
    });
    let events = server.post_json("/completion", request).await.events();
    let chunks: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let progress: Vec<&Value> = chunks
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(progress.len() >= 2, "{chunks:?}");
    // The start: only the cache processed, no time spent.
    let first = &progress[0]["prompt_progress"];
    assert_eq!(first["processed"], first["cache"]);
    assert_eq!(first["time_ms"], 0.0);
    assert_eq!(progress[0]["timings"]["prompt_n"], 0);
    assert_eq!(progress[0]["content"], "");
    // Each report advances, and the last has the whole prompt, before any text.
    for pair in progress.windows(2) {
        let (a, b) = (&pair[0]["prompt_progress"], &pair[1]["prompt_progress"]);
        assert!(b["processed"].as_u64() > a["processed"].as_u64(), "{a} {b}");
        assert!(b["time_ms"].as_f64() >= a["time_ms"].as_f64());
    }
    let last = &progress[progress.len() - 1]["prompt_progress"];
    assert_eq!(last["processed"], last["total"]);
    assert!(last["time_ms"].as_f64().unwrap() > 0.0);
    let first_text = chunks
        .iter()
        .position(|c| c["content"].as_str().is_some_and(|t| !t.is_empty()))
        .unwrap();
    let last_report = chunks
        .iter()
        .rposition(|c| c.get("prompt_progress").is_some())
        .unwrap();
    assert!(last_report < first_text);
    // Every token's chunk carries the timings so far.
    for chunk in chunks
        .iter()
        .filter(|c| c["stop"] == false && c.get("prompt_progress").is_none())
    {
        assert!(
            chunk["timings"]["predicted_n"].as_u64().unwrap() >= 1,
            "{chunk}"
        );
    }

    // Without them: neither.
    let plain = json!({"prompt": "Hello", "n_predict": 3, "temperature": 0, "stream": true});
    for event in server.post_json("/completion", plain).await.events() {
        let chunk: Value = serde_json::from_str(&event).unwrap();
        assert!(chunk.get("prompt_progress").is_none());
        assert!(
            chunk["stop"] == true || chunk.get("timings").is_none(),
            "{chunk}"
        );
    }

    // `n_probs` in a stream: each piece carries its token's probabilities.
    let probs =
        json!({"prompt": "Hello", "n_predict": 3, "temperature": 0, "stream": true, "n_probs": 2});
    let pieces: Vec<Value> = server
        .post_json("/completion", probs)
        .await
        .events()
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter(|c| c["stop"] == false)
        .collect();
    assert!(!pieces.is_empty() && pieces.len() <= 3, "{pieces:?}");
    for piece in &pieces {
        let entries = piece["completion_probabilities"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{piece}");
        assert_eq!(entries[0]["id"], piece["tokens"][0]);
        assert!(entries[0]["bytes"].is_array());
        assert_eq!(entries[0]["top_logprobs"].as_array().unwrap().len(), 2);
    }

    // The chat stream: the role delta's content is null (llama-server's), the reports come as
    // chunks without choices.
    let events = server
        .post_json(
            "/v1/chat/completions",
            chat(json!({"stream": true, "max_tokens": 3, "return_progress": true, "timings_per_token": true})),
        )
        .await
        .events();
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks[0]["choices"][0]["delta"]["content"].is_null());
    assert!(chunks[0].get("timings").is_none());
    let reports: Vec<&Value> = chunks
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(reports.len() >= 2, "{chunks:?}");
    assert!(
        reports
            .iter()
            .all(|c| c["choices"].as_array().unwrap().is_empty())
    );

    // The Responses stream: reports as `response.in_progress` events, timings on the deltas and
    // on the last event.
    let events = named_events(
        &server
            .post_json(
                "/v1/responses",
                json!({"input": "Say hello.", "max_output_tokens": 3, "stream": true,
                       "return_progress": true, "timings_per_token": true}),
            )
            .await
            .body,
    );
    let reports: Vec<&Value> = events
        .iter()
        .filter(|(_, data)| data.get("prompt_progress").is_some())
        .map(|(_, data)| data)
        .collect();
    assert!(reports.len() >= 2, "{events:?}");
    assert!(reports.iter().all(|d| d["type"] == "response.in_progress"));
    assert!(
        events
            .iter()
            .filter(|(name, _)| name == "response.output_text.delta")
            .all(|(_, d)| d["timings"]["predicted_per_second"].is_number())
    );
    assert!(events.last().unwrap().1["timings"].is_object());

    // The route whose stream does not report them refuses them.
    let error = server
        .post_json(
            "/v1/messages",
            json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "return_progress": true}),
        )
        .await;
    assert_eq!(error.status, StatusCode::BAD_REQUEST, "{}", error.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_assistant_message_is_continued() {
    let Some(server) = server().await else {
        return;
    };
    let user = json!({"role": "user", "content": "What is the best book?"});
    let prefill = json!({"role": "assistant", "content": "Whill"});
    // The prompt of the user's turn with the generation prompt, then the prefill.
    let templated = server
        .post_json("/apply-template", json!({"messages": [user]}))
        .await
        .json()["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    let count = |text: String| {
        let server = &server;
        async move {
            server
                .post_json("/tokenize", json!({"content": text}))
                .await
                .json()["tokens"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    let continued = count(format!("{templated}Whill")).await;
    let prompt_tokens = |body: Value| {
        let server = &server;
        async move {
            let reply = server.post_json("/v1/chat/completions", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()["usage"]["prompt_tokens"].as_u64().unwrap() as usize
        }
    };
    // llama-server's prefill: a final assistant message is continued by default ...
    let base = json!({"messages": [user, prefill], "max_tokens": 1, "temperature": 0});
    assert_eq!(prompt_tokens(base.clone()).await, continued);
    // llama-server's token count of a chat request agrees, under both paths.
    for path in [
        "/v1/chat/completions/input_tokens",
        "/chat/completions/input_tokens",
    ] {
        let reply = server.post_json(path, base.clone()).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        assert_eq!(reply.json()["input_tokens"], continued, "{path}");
    }
    // ... and on request (vLLM's and transformers' spelling), which needs no generation prompt.
    let mut explicit = base.clone();
    explicit["add_generation_prompt"] = json!(false);
    explicit["continue_final_message"] = json!(true);
    assert_eq!(prompt_tokens(explicit).await, continued);
    // Without the generation prompt, a conversation ending with the user is rendered as is.
    let with_prompt = prompt_tokens(json!({"messages": [user], "max_tokens": 1})).await;
    let bare =
        prompt_tokens(json!({"messages": [user], "max_tokens": 1, "add_generation_prompt": false}))
            .await;
    assert!(bare < with_prompt, "{bare} {with_prompt}");
    assert_eq!(with_prompt, count(templated).await);
    // Refused: both at once, continuing a user message, two assistant messages at the end.
    for (body, param) in [
        (
            json!({"messages": [user, prefill], "add_generation_prompt": true, "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": [user, prefill], "continue_final_message": true}),
            "continue_final_message",
        ),
        (
            json!({"messages": [user], "add_generation_prompt": false, "continue_final_message": true}),
            "messages",
        ),
        (json!({"messages": [user, prefill, prefill]}), "messages"),
    ] {
        let error = server
            .post_json("/v1/chat/completions", body.clone())
            .await
            .error(StatusCode::BAD_REQUEST);
        assert_eq!(error["param"], param, "{body}: {error}");
    }
}
