//! The public `Engine` on the real default model (provisioned through the project's cached,
//! checksummed script; skipped with `MLXCEL_SKIP_MODEL_TESTS=1`).

use std::sync::OnceLock;

use super::*;

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::load(None, EngineOptions::default())
            .expect("load the default model (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)")
    })
}

/// The default model on the OpenXLA backend, loaded once for the tests that compare backends.
#[cfg(feature = "xla")]
fn xla_engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::load(
            None,
            EngineOptions {
                backend: BackendKind::Xla,
                ..EngineOptions::default()
            },
        )
        .expect("the xla backend loads the default model")
    })
}

/// The default model with int8 activations.
fn int8_engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let options = EngineOptions {
            activations: Some(Activations::Int8),
            ..EngineOptions::default()
        };
        Engine::load(None, options).expect("the int8 engine loads")
    })
}

/// Eight prompts of different lengths for the concurrency tests.
const EIGHT_PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Hi",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "Rust is a systems programming language that",
    "Translate to French: good morning",
    "def fibonacci(n):",
    "A list of fruits: apple, banana,",
];

fn greedy(prompt: &str, n: usize) -> GenerationRequest {
    let ids = engine().tokenize(prompt).unwrap();
    GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(ids, MaxNewTokens::Limited(n))
    }
}

#[test]
fn greedy_generation_matches_the_reference() {
    if skip() {
        return;
    }
    let completion = engine()
        .generate(greedy("The capital of France is", 8))
        .unwrap();
    assert_eq!(completion.text, " Paris.\n\nThe answer is:");
    assert_eq!(completion.finish_reason, Some(FinishReason::Length));
    // Other tests share the engine and its prefix cache: some of the prompt may come from it.
    let Usage {
        prompt_tokens,
        completion_tokens,
        cached_tokens,
        ..
    } = completion.usage;
    assert_eq!((prompt_tokens, completion_tokens), (5, 8));
    assert!(cached_tokens < prompt_tokens, "{:?}", completion.usage);
}

#[test]
fn stop_strings_and_info() {
    if skip() {
        return;
    }
    let mut request = greedy("The capital of France is", 20);
    request.stop = vec!["answer".to_owned()];
    let completion = engine().generate(request).unwrap();
    assert_eq!(completion.text, " Paris.\n\nThe ");
    assert_eq!(completion.finish_reason, Some(FinishReason::Stop));
    let info = engine().info();
    assert_eq!((info.window, info.vocab_size), (8192, 49152));
    assert!(!info.eos_token_ids.is_empty());
    assert!(info.parameters > 100_000_000, "{}", info.parameters);
}

/// `requests` submitted at once, their completions in order.
fn submit_all(engine: &Engine, requests: &[GenerationRequest]) -> Vec<Completion> {
    let streams: Vec<_> = requests
        .iter()
        .map(|r| engine.submit(r.clone()).unwrap())
        .collect();
    streams
        .into_iter()
        .map(|s| s.collect_completion().unwrap())
        .collect()
}

/// `requests` run one at a time, then all at once: (alone, together), each in order.
fn alone_and_together(
    engine: &Engine,
    requests: &[GenerationRequest],
) -> (Vec<Completion>, Vec<Completion>) {
    let alone = requests
        .iter()
        .map(|r| engine.generate(r.clone()).unwrap())
        .collect();
    (alone, submit_all(engine, requests))
}

/// A seeded sampled request alone, and beside another seed and a greedy request.
fn seeded_alone_and_beside_others(engine: &Engine) -> (Completion, Completion) {
    let sampled = |seed| {
        let mut request = greedy("Once upon a time", 12);
        request.sampling = SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        };
        request
    };
    let alone = engine.generate(sampled(5)).unwrap();
    let mut together = submit_all(engine, &[sampled(1), sampled(5), greedy("Hello", 6)]);
    (alone, together.swap_remove(1))
}

fn tokens(completions: &[Completion]) -> Vec<&[u32]> {
    completions.iter().map(|c| c.tokens.as_slice()).collect()
}

#[test]
fn concurrent_seeded_requests_match_running_alone() {
    if skip() {
        return;
    }
    let (alone, together) = seeded_alone_and_beside_others(engine());
    assert_eq!(together.tokens, alone.tokens);
    assert_eq!(together.text, alone.text);
}

#[test]
fn dropping_a_stream_cancels_it_and_chat_templates_render() {
    if skip() {
        return;
    }
    let mut stream = engine()
        .submit(greedy("Count to one hundred:", 500))
        .unwrap();
    assert!(matches!(stream.next(), Some(Event::Token { .. })));
    drop(stream);
    // The engine keeps serving.
    let text = engine()
        .apply_chat_template(&[ChatMessage::new("user", "Hi")])
        .unwrap();
    assert!(text.contains("<|im_start|>user\nHi<|im_end|>"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    let completion = engine()
        .generate(greedy("The capital of France is", 2))
        .unwrap();
    assert_eq!(completion.text, " Paris.");
}

#[test]
fn refusals_are_errors_and_the_engine_keeps_serving() {
    if skip() {
        return;
    }
    let too_long = GenerationRequest::new(vec![1; 8000], MaxNewTokens::Limited(500));
    let err = engine().submit(too_long).unwrap_err();
    assert_eq!(
        err.to_string(),
        "effective_prompt_len=8000 + max_new_tokens=500 > checkpoint window=8192; \
         shorten the prompt or lower the token budget (-n)"
    );
    let vocab_size = engine().info().vocab_size;
    let outside = GenerationRequest::new(vec![1, vocab_size as u32], MaxNewTokens::Limited(1));
    let err = engine().submit(outside).unwrap_err();
    assert!(
        matches!(err, EngineError::TokenOutOfVocabulary { token, .. } if token as usize == vocab_size),
        "{err:?}"
    );
    assert_eq!("xla".parse::<BackendKind>().unwrap(), BackendKind::Xla);
    let err = "nope".parse::<BackendKind>().unwrap_err().to_string();
    assert!(err.contains("choose one of: mlx"), "{err}");
    engine().generate(greedy("Hi", 1)).unwrap();
}

#[test]
fn metrics_count_tokens_latencies_and_finishes() {
    if skip() {
        return;
    }
    let before = engine().metrics();
    engine()
        .generate(greedy("The capital of France is", 3))
        .unwrap();
    let after = engine().metrics();
    // Other tests share the engine: counters only grow, by at least this request's share.
    assert!(after.generated_tokens >= before.generated_tokens + 3);
    assert!(after.prompt_tokens >= before.prompt_tokens + 5);
    assert!(after.requests_submitted > before.requests_submitted);
    assert!(after.finished.length > before.finished.length);
    assert!(after.time_to_first_token.count > before.time_to_first_token.count);
    assert!(after.inter_token_latency.count >= before.inter_token_latency.count + 2);
    // The request's phases: queued, prefilled, decoded, ended; each observed once.
    for (name, b, a) in [
        ("queue", &before.queue_time, &after.queue_time),
        ("prefill", &before.prefill_time, &after.prefill_time),
        ("decode", &before.decode_time, &after.decode_time),
        (
            "e2e",
            &before.e2e_request_latency,
            &after.e2e_request_latency,
        ),
    ] {
        assert!(a.count > b.count, "{name}: {} -> {}", b.count, a.count);
    }
    // An end-to-end latency is at least its prefill and decode (sums over the same requests
    // when no other test ran meanwhile; otherwise still bounded by the totals).
    assert!(after.e2e_request_latency.sum + 1e-9 >= after.decode_time.sum);
    assert!(after.steps > 0 && after.busy_slot_steps >= after.steps);
    assert!(after.max_request_tokens >= 5 + 3);
    let (reserved, budget) = after.kv_usage.expect("MLX budgets its KV memory");
    assert!(reserved <= budget, "{reserved} of {budget}");
    assert!(after.buckets.is_empty(), "MLX has no static buckets");
    assert_eq!(after.compilations, 0);
}

#[test]
fn eight_concurrent_greedy_requests_match_running_alone() {
    if skip() {
        return;
    }
    let requests: Vec<_> = (0..8).map(|i| greedy(EIGHT_PROMPTS[i], 4 + i)).collect();
    let (alone, together) = alone_and_together(engine(), &requests);
    assert_eq!(tokens(&together), tokens(&alone));
}

/// With int8 activations (the fast batched path) the same holds: eight greedy requests of
/// different lengths decoding together each get their tokens alone, and a seeded sampled
/// request gets the same tokens beside others as alone.
#[test]
fn int8_eight_concurrent_greedy_and_seeded_requests_match_running_alone() {
    if skip() {
        return;
    }
    let engine = int8_engine();
    let requests: Vec<_> = (0..8)
        .map(|i| greedy(EIGHT_PROMPTS[i], 4 + 2 * i))
        .collect();
    let (alone, together) = alone_and_together(engine, &requests);
    assert_eq!(tokens(&together), tokens(&alone));
    let (alone, together) = seeded_alone_and_beside_others(engine);
    assert_eq!(together.tokens, alone.tokens);
}

/// The same on the OpenXLA backend: eight greedy requests of different lengths, decoding together
/// in one capacity's eight cache rows, give each the tokens it gets alone, and a second round
/// compiles nothing new.
#[cfg(feature = "xla")]
#[test]
fn xla_eight_concurrent_greedy_requests_match_running_alone() {
    if skip() {
        return;
    }
    let xla = xla_engine();
    let prompts = EIGHT_PROMPTS;
    let request = |i: usize| {
        let ids = xla.tokenize(prompts[i]).unwrap();
        GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(ids, MaxNewTokens::Limited(3 + i))
        }
    };
    let alone: Vec<Vec<u32>> = (0..prompts.len())
        .map(|i| xla.generate(request(i)).unwrap().tokens)
        .collect();
    let compiled = xla.metrics().compilations;
    let streams: Vec<_> = (0..prompts.len())
        .map(|i| xla.submit(request(i)).unwrap())
        .collect();
    let together: Vec<Vec<u32>> = streams
        .into_iter()
        .map(|s| s.collect_completion().unwrap().tokens)
        .collect();
    assert_eq!(together, alone);
    assert_eq!(
        xla.metrics().compilations,
        compiled,
        "no compile after warm-up"
    );
}

/// Greedy tokens of the OpenXLA backend equal the MLX backend's for 32 steps.
#[cfg(feature = "xla")]
#[test]
fn xla_greedy_tokens_equal_mlx_for_32_steps() {
    if skip() {
        return;
    }
    let xla = xla_engine();
    for prompt in ["The capital of France is", "Write a haiku about rain"] {
        let on_mlx = engine().generate(greedy(prompt, 32)).unwrap();
        let on_xla = xla
            .generate(GenerationRequest {
                sampling: SamplingParams::greedy(),
                ..GenerationRequest::new(xla.tokenize(prompt).unwrap(), MaxNewTokens::Limited(32))
            })
            .unwrap();
        assert_eq!(
            on_xla.tokens, on_mlx.tokens,
            "{prompt:?}: {:?} vs {:?}",
            on_xla.text, on_mlx.text
        );
    }
}

/// A build without the `xla` feature still parses `xla` and answers it with an error that names
/// the feature to enable, not an unknown-backend error.
#[cfg(not(feature = "xla"))]
#[test]
fn a_compiled_out_backend_names_its_feature() {
    if skip() {
        return;
    }
    let options = EngineOptions {
        backend: "xla".parse().unwrap(),
        ..EngineOptions::default()
    };
    let err = Engine::load(None, options).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::BackendNotCompiled {
                backend: "xla",
                feature: "xla"
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("cargo feature `xla`"), "{err}");
}

/// The async submission gives what the blocking one gives, and refuses the same requests.
#[test]
fn async_submission_matches_the_blocking_one() {
    if skip() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let blocking = engine()
        .generate(greedy("The capital of France is", 8))
        .unwrap();
    let awaited = runtime.block_on(async {
        let mut stream = engine()
            .submit_async(greedy("The capital of France is", 8))
            .await
            .unwrap();
        let mut tokens = Vec::new();
        while let Some(event) = stream.next_event().await {
            if let Event::Token { token, .. } = event {
                tokens.push(token);
            }
        }
        tokens
    });
    assert_eq!(awaited, blocking.tokens);
    let too_long = GenerationRequest::new(vec![1; 8000], MaxNewTokens::Limited(500));
    let err = runtime
        .block_on(engine().submit_async(too_long))
        .unwrap_err();
    assert!(matches!(err, EngineError::Capacity(_)), "{err:?}");
}

/// `perplexity` as llama-perplexity computes it, checked against an independent path: the same
/// chunks fed one token at a time through `Backend::step` (decode steps, last-position logits)
/// and scored here. With int8 activations the kernels are invariant to how a sequence is chunked,
/// so the two agree to the last bit of every logit and the perplexities are equal; with f32
/// activations they agree to rounding.
#[test]
fn perplexity_matches_token_by_token_scoring() {
    if skip() {
        return;
    }
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(12)
        + "Rust is a systems programming language. It is fast and memory safe. "
        + &"One, two, three, four, five, six, seven, eight, nine, ten. ".repeat(6);
    let settings = PerplexityOptions {
        context: 32,
        chunks: Some(3),
        batch: 12,
    };
    for activations in [Activations::Int8, Activations::F32] {
        let options = EngineOptions {
            activations: Some(activations),
            ..EngineOptions::default()
        };
        let mut seen = Vec::new();
        let report = perplexity(None, &options, &text, &settings, |chunk, ppl| {
            seen.push((chunk, ppl))
        })
        .unwrap();
        assert_eq!((report.chunks, report.scored), (3, 3 * 15));
        assert_eq!(seen.len(), 3);
        assert_eq!(seen.last().unwrap().1, report.ppl);
        assert!(report.ppl > 1.0 && report.ppl.is_finite() && report.error > 0.0);

        // The independent path.
        let loaded =
            mlxcel_model::LoadedModel::open(&mlxcel_model::resolve_model(None).unwrap()).unwrap();
        let tokens = loaded.tokenizer.encode(&text, true, false).unwrap();
        let mut backend = load_backend(&loaded.checkpoint, &options).unwrap();
        let (mut nll, mut count) = (0.0f64, 0usize);
        for chunk in 0..3 {
            let input = &tokens[chunk * 32..(chunk + 1) * 32];
            let plan = backend
                .create_session_for_request(&RequestShape {
                    prompt_len: 32,
                    image_tokens: 0,
                    max_new_tokens: MaxNewTokens::Limited(1),
                })
                .unwrap();
            let slot = backend.allocate_slot(&plan).unwrap();
            for (position, window) in input.windows(2).enumerate() {
                let logits = backend
                    .step(&[SequenceStep {
                        slot,
                        tokens: &window[..1],
                        start_position: position,
                    }])
                    .unwrap()
                    .remove(0);
                if position >= 16 {
                    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
                    nll -= f64::from(logits[window[1] as usize] - max) - sum.ln();
                    count += 1;
                }
            }
            backend.release_slot(slot);
        }
        let expected = (nll / count as f64).exp();
        match activations {
            Activations::Int8 => assert_eq!(report.ppl, expected, "int8: chunking-invariant"),
            Activations::F32 | Activations::Mixed => assert!(
                (report.ppl / expected - 1.0).abs() < 1e-4,
                "f32: {} vs {expected}",
                report.ppl
            ),
        }
    }
}

/// Structured output: a JSON schema, a regex and a Lark grammar constrain what the default model
/// writes, greedy and sampled, alone and batched with free requests; a schema llguidance refuses
/// is refused at submit, naming the problem.
#[test]
fn constraints_shape_the_output() {
    if skip() {
        return;
    }
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
            "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]}, "maxItems": 2}
        },
        "required": ["city", "population", "tags"],
        "additionalProperties": false
    });
    let constrained = |prompt: &str, constraint: Constraint, temperature: f32| {
        let mut request = greedy(prompt, 80);
        request.constraint = Some(constraint);
        if temperature > 0.0 {
            request.sampling = SamplingParams {
                temperature,
                seed: Some(11),
                ..SamplingParams::default()
            };
        }
        request
    };
    let requests = vec![
        constrained(
            "Describe Paris as JSON:",
            Constraint::JsonSchema(schema.clone()),
            0.0,
        ),
        greedy("The capital of France is", 8),
        constrained(
            "Describe Rome as JSON:",
            Constraint::JsonSchema(schema.clone()),
            0.9,
        ),
        constrained(
            "The year the war ended:",
            Constraint::Regex(" [12][0-9]{3}\\.".into()),
            0.0,
        ),
        constrained(
            "Is the sky blue? Answer:",
            Constraint::Lark("start: \" \" (\"yes\" | \"no\") \".\"".into()),
            0.0,
        ),
    ];
    let completions = submit_all(engine(), &requests);
    for completion in [&completions[0], &completions[2]] {
        assert_eq!(
            completion.finish_reason,
            Some(FinishReason::Stop),
            "{completion:?}"
        );
        let value: serde_json::Value = serde_json::from_str(&completion.text).unwrap();
        let object = value.as_object().unwrap();
        assert_eq!(object.len(), 3, "{value}");
        assert!(object["city"].as_str().unwrap().chars().count() <= 12);
        assert!(object["population"].as_u64().is_some());
        let tags = object["tags"].as_array().unwrap();
        assert!(tags.len() <= 2);
        assert!(
            tags.iter()
                .all(|t| ["big", "old", "coastal"].contains(&t.as_str().unwrap()))
        );
    }
    // The free request in the same batch is untouched.
    assert_eq!(completions[1].text, " Paris.\n\nThe answer is:");
    let year = &completions[3].text;
    assert!(
        year.len() == 6 && year.starts_with(' ') && year.ends_with('.'),
        "{year:?}"
    );
    assert!(
        [" yes.", " no."].contains(&completions[4].text.as_str()),
        "{:?}",
        completions[4]
    );

    let mut bad = greedy("x", 4);
    bad.constraint = Some(Constraint::JsonSchema(
        serde_json::json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
    ));
    let err = engine().submit(bad).unwrap_err().to_string();
    assert!(
        err.contains("invalid JSON schema") && err.contains("nowhere"),
        "{err}"
    );
}

/// The OpenXLA backend cannot verify proposals (its programs return the last position's
/// logits): an engine asked to speculate there is refused at load, naming why and what to use.
#[test]
fn speculation_on_the_xla_backend_is_refused_at_load() {
    if skip() {
        return;
    }
    let Err(err) = Engine::load(
        None,
        EngineOptions {
            backend: BackendKind::Xla,
            speculative: Some(SpeculativeConfig::default()),
            ..EngineOptions::default()
        },
    ) else {
        panic!("an engine speculating on the xla backend was started");
    };
    let err = err.to_string();
    assert!(
        err.contains("scores every position") && err.contains("--backend mlx"),
        "{err}"
    );
}

/// Prompt-lookup speculative decoding: greedy output is the same token for token as without it
/// (int8 activations: logits invariant to how a sequence is chunked), alone and batched, and
/// repeated text gets proposals accepted.
#[test]
fn speculative_decoding_keeps_greedy_output() {
    if skip() {
        return;
    }
    let prompts = [
        "Copy this list twice: apple, banana, cherry, date, elderberry, fig, grape. \
         apple, banana, cherry,",
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
        "The capital of France is",
    ];
    for activations in [Activations::Int8, Activations::F32] {
        let plain = Engine::load(
            None,
            EngineOptions {
                activations: Some(activations),
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let speculative = Engine::load(
            None,
            EngineOptions {
                activations: Some(activations),
                speculative: Some(SpeculativeConfig::default()),
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .map(|p| GenerationRequest {
                sampling: SamplingParams::greedy(),
                ..GenerationRequest::new(plain.tokenize(p).unwrap(), MaxNewTokens::Limited(48))
            })
            .collect();
        let expected: Vec<Completion> = requests
            .iter()
            .map(|r| plain.generate(r.clone()).unwrap())
            .collect();
        let alone: Vec<Completion> = requests
            .iter()
            .map(|r| speculative.generate(r.clone()).unwrap())
            .collect();
        let together = submit_all(&speculative, &requests);
        for (i, want) in expected.iter().enumerate() {
            assert_eq!(
                alone[i].tokens, want.tokens,
                "{activations:?} prompt {i} alone"
            );
            assert_eq!(
                together[i].tokens, want.tokens,
                "{activations:?} prompt {i} batched"
            );
        }
        let stats = speculative.stats();
        assert!(
            stats.drafted_tokens > 0 && stats.accepted_tokens > 0,
            "{stats:?}"
        );
        assert!(stats.accepted_tokens <= stats.drafted_tokens);
        // Per draft position: a pass that accepted n counts one at each of 0..n, so the counts
        // sum to the accepted tokens and never grow with the position.
        let per_position = &stats.accepted_per_position;
        assert_eq!(
            per_position.iter().sum::<u64>(),
            stats.accepted_tokens,
            "{stats:?}"
        );
        assert!(per_position.windows(2).all(|w| w[0] >= w[1]), "{stats:?}");
    }
}

/// Speculation under structured output: each verified position is masked by the constraint's
/// state after the tokens accepted before it, so constrained greedy output is the same with and
/// without speculation (int8: bit for bit), and proposals are verified (and accepted where the
/// grammar and the model agree with the repeated text).
#[test]
fn speculation_keeps_constrained_output() {
    if skip() {
        return;
    }
    let options = |speculative| EngineOptions {
        activations: Some(Activations::Int8),
        speculative,
        ..EngineOptions::default()
    };
    let plain = Engine::load(None, options(None)).unwrap();
    let speculative = Engine::load(None, options(Some(SpeculativeConfig::default()))).unwrap();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                 "minItems": 6, "maxItems": 6}},
        "required": ["items"],
        "additionalProperties": false
    });
    let requests: Vec<GenerationRequest> = [
        (
            "Repeat: one two three four five six one two three four five six one two",
            Constraint::Regex("( one two three four five six){3}".into()),
        ),
        (
            "List colours as JSON, like {\"items\": [\"red\", \"green\", \"blue\", \"red\", \
             \"green\", \"blue\"]}:",
            Constraint::JsonSchema(schema),
        ),
    ]
    .into_iter()
    .map(|(prompt, constraint)| GenerationRequest {
        sampling: SamplingParams::greedy(),
        constraint: Some(constraint),
        ..GenerationRequest::new(plain.tokenize(prompt).unwrap(), MaxNewTokens::Limited(48))
    })
    .collect();
    // How many proposals a pass verifies follows the pass costs the scheduler measures, so on a
    // loaded machine (tests running in parallel) a round may verify only its periodic one-token
    // probes, and those may all miss: up to three rounds, each checking the output.
    for _round in 0..3 {
        for request in &requests {
            let want = plain.generate(request.clone()).unwrap();
            let got = speculative.generate(request.clone()).unwrap();
            assert_eq!(got.tokens, want.tokens, "{:?}", got.text);
            assert_eq!(got.text, want.text);
            assert_eq!(
                got.finish_reason,
                Some(FinishReason::Stop),
                "{:?}",
                got.text
            );
        }
        if speculative.stats().accepted_tokens > 0 {
            break;
        }
    }
    let stats = speculative.stats();
    assert!(
        stats.drafted_tokens > 0 && stats.accepted_tokens > 0,
        "{stats:?}"
    );
}

/// The prefix cache: a request whose prompt starts with what an earlier (finished) or a running
/// request computed copies those positions instead of recomputing them, and its output is the same
/// as without the cache (int8: bit for bit; f32: the same greedy tokens here).
#[test]
fn prefix_cache_reuses_computed_prompts_exactly() {
    if skip() {
        return;
    }
    let system = "You are a careful assistant. Answer briefly and precisely, in one sentence. \
                  Never make up facts; say when you do not know. ";
    let prompts = [
        format!("{system}Question: what is the capital of France? Answer:"),
        format!("{system}Question: what is the capital of Italy? Answer:"),
        format!("{system}Question: what is the capital of Spain? Answer:"),
    ];
    for activations in [Activations::Int8, Activations::F32] {
        let options = |cache| EngineOptions {
            activations: Some(activations),
            prefix_cache_bytes: cache,
            ..EngineOptions::default()
        };
        let plain = Engine::load(None, options(0)).unwrap();
        let cached = Engine::load(None, options(64 << 20)).unwrap();
        let requests: Vec<GenerationRequest> = prompts
            .iter()
            .map(|p| GenerationRequest {
                sampling: SamplingParams::greedy(),
                ..GenerationRequest::new(plain.tokenize(p).unwrap(), MaxNewTokens::Limited(12))
            })
            .collect();
        // One at a time (the later ones reuse the finished first one's prefix), then all at
        // once (reusing the kept ones, or a running sharer's).
        let expected: Vec<Completion> = requests
            .iter()
            .map(|r| plain.generate(r.clone()).unwrap())
            .collect();
        let system_tokens = plain.tokenize(system).unwrap().len() as u64;
        let mut reported = 0;
        for (i, request) in requests.iter().enumerate() {
            let got = cached.generate(request.clone()).unwrap();
            assert_eq!(got.tokens, expected[i].tokens, "{activations:?} prompt {i}");
            // Each request reports the prompt tokens it took from the cache: none for the
            // first, most of the shared system prompt for the later ones.
            assert_eq!(expected[i].usage.cached_tokens, 0);
            if i == 0 {
                assert_eq!(got.usage.cached_tokens, 0, "{:?}", got.usage);
            } else {
                assert!(
                    got.usage.cached_tokens as u64 >= system_tokens - 2
                        && got.usage.cached_tokens < got.usage.prompt_tokens,
                    "{:?} of a {system_tokens}-token system prompt",
                    got.usage
                );
            }
            reported += got.usage.cached_tokens as u64;
        }
        // The first conversation's next turn (its history, then a message long enough that the
        // slot grows past what it had allocated) takes the kept slot over instead of copying it.
        let first = plain.generate(requests[0].clone()).unwrap();
        let mut follow_up = requests[0].clone();
        follow_up.prompt.extend(&first.tokens);
        let numbers: Vec<String> = (1..=120).map(|n| n.to_string()).collect();
        let message = format!(" Now repeat these numbers: {}. Answer:", numbers.join(", "));
        follow_up.prompt.extend(plain.tokenize(&message).unwrap());
        assert!(follow_up.prompt.len() > 300, "{}", follow_up.prompt.len());
        let takeovers = cached.stats().prefix.takeovers;
        let want = plain.generate(follow_up.clone()).unwrap();
        let got = cached.generate(follow_up).unwrap();
        assert_eq!(got.tokens, want.tokens, "{activations:?} follow-up");
        assert_eq!(
            got.usage.cached_tokens,
            requests[0].prompt.len() + first.tokens.len() - 1,
            "{activations:?}: the whole kept history"
        );
        assert_eq!(cached.stats().prefix.takeovers, takeovers + 1);
        reported += got.usage.cached_tokens as u64;
        let together = submit_all(&cached, &requests);
        for (i, want) in expected.iter().enumerate() {
            assert_eq!(
                together[i].tokens, want.tokens,
                "{activations:?} prompt {i} together"
            );
            reported += together[i].usage.cached_tokens as u64;
        }
        let reused = cached.stats().reused_tokens;
        assert_eq!(
            reported, reused,
            "per-request counts add up to the engine's"
        );
        assert!(
            reused >= 4 * system_tokens,
            "reused {reused} of {system_tokens}-token prefixes"
        );
    }
}

/// The prefix cache on the OpenXLA backend (a server's bucket set): kept rows of the static
/// caches are copied on the device into the row a later request gets, in its own capacity or a
/// larger one, a chat's next turn takes its kept row over, and the greedy output is the one
/// computed without reuse.
#[cfg(feature = "xla")]
#[test]
fn prefix_cache_reuses_computed_prompts_on_the_xla_backend() {
    if skip() {
        return;
    }
    let engine = Engine::load(
        None,
        EngineOptions {
            backend: BackendKind::Xla,
            shapes: ShapeMode::ServerBuckets,
            prefix_cache_bytes: 1 << 30,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let system = "You are a careful assistant. Answer briefly and precisely, in one sentence. \
                  Never make up facts; say when you do not know. ";
    let request = |text: &str, budget: MaxNewTokens, reuse: bool| GenerationRequest {
        sampling: SamplingParams::greedy(),
        reuse_cached_prefix: reuse,
        ..GenerationRequest::new(engine.tokenize(text).unwrap(), budget)
    };
    let system_tokens = engine.tokenize(system).unwrap().len();
    let questions = ["France", "Italy", "Spain"]
        .map(|c| format!("{system}Question: what is the capital of {c}? Answer:"));
    // Each question runs with the cache, then without it. The first finds nothing; the second
    // reuses the system prompt from the first's kept rows (256 bucket); the third, whose budget
    // routes it to the 4096 bucket, copies it across capacities.
    let budgets = [
        MaxNewTokens::Limited(12),
        MaxNewTokens::Limited(12),
        MaxNewTokens::Limited(300),
    ];
    let mut kept = None;
    for (i, (question, budget)) in questions.iter().zip(budgets).enumerate() {
        let mut reused = request(question, budget, true);
        reused.stop = vec!["\n".into()];
        let mut plain = reused.clone();
        plain.reuse_cached_prefix = false;
        let got = engine.generate(reused).unwrap();
        let want = engine.generate(plain).unwrap();
        assert_eq!(got.tokens, want.tokens, "question {i}: {:?}", got.text);
        assert_eq!(want.usage.cached_tokens, 0);
        if i == 0 {
            assert_eq!(got.usage.cached_tokens, 0);
            kept = Some(got);
        } else {
            assert!(
                got.usage.cached_tokens >= system_tokens - 2
                    && got.usage.cached_tokens < got.usage.prompt_tokens,
                "question {i}: {:?} of a {system_tokens}-token system prompt",
                got.usage
            );
        }
    }
    // The next turn of the first conversation takes its kept row over: no copy.
    let first = kept.unwrap();
    let mut follow_up = request(&questions[0], MaxNewTokens::Limited(12), true);
    follow_up.prompt.extend(&first.tokens);
    follow_up
        .prompt
        .extend(engine.tokenize(" And of Germany? Answer:").unwrap());
    let takeovers = engine.stats().prefix.takeovers;
    let mut plain = follow_up.clone();
    plain.reuse_cached_prefix = false;
    let got = engine.generate(follow_up).unwrap();
    let want = engine.generate(plain).unwrap();
    assert_eq!(got.tokens, want.tokens, "{:?}", got.text);
    assert_eq!(
        got.usage.cached_tokens,
        first.usage.prompt_tokens + first.tokens.len() - 1,
        "the whole kept history"
    );
    assert_eq!(engine.stats().prefix.takeovers, takeovers + 1);
    let stats = engine.stats();
    // Four requests looked up (the others ran without the cache), three found a prefix.
    assert_eq!(
        (stats.prefix.lookups, stats.prefix.hits),
        (4, 3),
        "{:?}",
        stats.prefix
    );
    assert!(stats.prefix.entries > 0);
}

/// Structured output on the OpenXLA backend: the mask is applied above the seam, so a schema
/// constrains its output as it does the MLX backend's.
#[cfg(feature = "xla")]
#[test]
fn constraints_work_on_the_xla_backend() {
    if skip() {
        return;
    }
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["answer", "confidence"],
        "additionalProperties": false
    });
    let engine = xla_engine();
    let mut request = GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(
            engine
                .tokenize("Is Paris in France? Reply in JSON:")
                .unwrap(),
            MaxNewTokens::Limited(40),
        )
    };
    request.constraint = Some(Constraint::JsonSchema(schema));
    let completion = engine.generate(request).unwrap();
    assert_eq!(
        completion.finish_reason,
        Some(FinishReason::Stop),
        "{completion:?}"
    );
    let value: serde_json::Value = serde_json::from_str(&completion.text).unwrap();
    assert!(
        ["yes", "no"].contains(&value["answer"].as_str().unwrap()),
        "{value}"
    );
    assert!(value["confidence"].as_u64().unwrap() <= 100);
}

/// Embeddings from the generative model: mean-pooled final hidden states, unit length, the same
/// for the same text, nearer for paraphrases than for unrelated text; per-token states with
/// pooling none; too long a text refused with the numbers.
#[test]
fn embeddings_pool_the_final_hidden_states() {
    if skip() {
        return;
    }
    let engine = engine();
    let embed = |text: &str| {
        engine
            .embed(
                engine.tokenize(text).unwrap(),
                Pooling::Mean,
                Normalize::default(),
            )
            .unwrap()
            .remove(0)
    };
    let a = embed("The cat sat on the mat.");
    assert_eq!(a.len(), 576);
    let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    assert_eq!(a, embed("The cat sat on the mat."));
    let cos = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
    let b = embed("A cat was sitting on the mat.");
    let c = embed("Quarterly revenue rose by seven percent in Asia.");
    assert!(
        cos(&a, &b) > cos(&a, &c),
        "{} vs {}",
        cos(&a, &b),
        cos(&a, &c)
    );
    let tokens = engine.tokenize("one two three").unwrap();
    let per_token = engine
        .embed(tokens.clone(), Pooling::None, Normalize(-1))
        .unwrap();
    assert_eq!(per_token.len(), tokens.len());
    let too_long = vec![1u32; engine.info().window + 1];
    let err = engine
        .embed(too_long, Pooling::Mean, Normalize::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("8193 tokens") && err.contains("8192"), "{err}");
}

/// A tiny random llama checkpoint with the default model's vocabulary and tokenizer files, to
/// serve as a (poor) draft model: most of its proposals are rejected.
fn write_random_draft(dir: &std::path::Path, default_dir: &std::path::Path) {
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;
    let target = mlxcel_model::ModelConfig::from_dir(default_dir).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "vocab_size": target.vocab_size,
        "max_position_embeddings": 2048, "tie_word_embeddings": false,
        "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        let from = default_dir.join(file);
        if from.exists() {
            std::fs::copy(&from, dir.join(file)).unwrap();
        }
    }
    let parsed = mlxcel_model::ModelConfig::from_dir(dir).unwrap();
    let mut seed = 0x5eed_u64;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for module in mlxcel_model::expected_modules(&parsed) {
        let (shape, scale, center) = match module.kind {
            mlxcel_model::ModuleKind::Embedding { vocab, hidden } => {
                (vec![vocab, hidden], 1.0, 0.0)
            }
            mlxcel_model::ModuleKind::Linear { out, inp, .. } => {
                (vec![out, inp], 1.0 / (inp as f32).sqrt(), 0.0)
            }
            mlxcel_model::ModuleKind::Norm { dim } => (vec![dim], 0.2, 1.0),
        };
        let n: usize = shape.iter().product();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let x = center + scale * ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5);
                x.to_le_bytes()
            })
            .collect();
        tensors.push((format!("{}.weight", module.name), shape, bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            (
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// Draft-model speculative decoding: greedy output is the same token for token as without it,
/// alone and batched, whether the draft is the model itself (int8: every proposal accepted, its
/// logits being the model's to the bit) or a random model (most proposals rejected, the draft's
/// cache rolled back each time); a draft with another vocabulary is refused at load, naming the
/// token that differs; a request for the draft without one is refused.
#[test]
fn draft_model_speculation_keeps_greedy_output() {
    if skip() {
        return;
    }
    let default_dir = mlxcel_model::resolve_model(None).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let random_dir = tmp.path().join("random-draft");
    std::fs::create_dir(&random_dir).unwrap();
    write_random_draft(&random_dir, &default_dir);
    let draft_config = SpeculativeConfig {
        proposer: Proposer::DraftModel,
        draft_max: 6,
        ..SpeculativeConfig::default()
    };
    // Prompts whose answers mostly run to the budget: a sequence that ends on an end token leaves
    // the proposals after it unverified, which the self-draft check below allows for (where the
    // greedy text ends depends on the machine's kernels: "List three colors:" ends after 17
    // tokens on an AVX2 machine, runs to the budget on an AVX-512 one).
    let prompts = [
        "Count from one to one hundred in words: one, two, three,",
        "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n",
        "List three colors:",
    ];
    let load = |draft: Option<&std::path::Path>| {
        Engine::load(
            None,
            EngineOptions {
                activations: Some(Activations::Int8),
                speculative: draft.map(|_| draft_config),
                draft_model: draft.map(|d| d.to_string_lossy().into_owned()),
                ..EngineOptions::default()
            },
        )
        .unwrap()
    };
    let plain = int8_engine();
    let requests: Vec<GenerationRequest> = prompts
        .iter()
        .map(|p| GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(plain.tokenize(p).unwrap(), MaxNewTokens::Limited(40))
        })
        .collect();
    let expected: Vec<Completion> = requests
        .iter()
        .map(|r| plain.generate(r.clone()).unwrap())
        .collect();
    for (name, draft) in [("itself", default_dir.as_path()), ("random", &random_dir)] {
        let engine = load(Some(draft));
        let alone: Vec<Completion> = requests
            .iter()
            .map(|r| engine.generate(r.clone()).unwrap())
            .collect();
        let together = submit_all(&engine, &requests);
        for (i, want) in expected.iter().enumerate() {
            assert_eq!(
                alone[i].tokens, want.tokens,
                "draft {name}, prompt {i} alone"
            );
            assert_eq!(
                together[i].tokens, want.tokens,
                "draft {name}, prompt {i} batched"
            );
        }
        let stats = engine.stats();
        assert!(stats.drafted_tokens > 0, "draft {name}: {stats:?}");
        assert_eq!(stats.draft_fallbacks, 0, "draft {name}: {stats:?}");
        if name == "itself" {
            // The draft agrees with the target at every position it proposes for, save those
            // after a request's end token, which are never verified: at most `draft_max` for
            // each request (alone and batched) that ended before its budget.
            let ended_early = expected
                .iter()
                .filter(|c| c.finish_reason != Some(FinishReason::Length))
                .count() as u64
                * 2;
            let unverified = stats.drafted_tokens - stats.accepted_tokens;
            assert!(
                unverified <= ended_early * draft_config.draft_max as u64,
                "{ended_early} requests ended early: {stats:?}"
            );
            if ended_early == 0 {
                assert_eq!(stats.accepted_tokens, stats.drafted_tokens, "{stats:?}");
            }
        } else {
            assert!(
                stats.accepted_tokens * 2 < stats.drafted_tokens,
                "a random draft is mostly wrong: {stats:?}"
            );
        }
    }

    // A draft whose tokenizer differs in one token is refused, naming it.
    let other_dir = tmp.path().join("other-tokenizer");
    std::fs::create_dir(&other_dir).unwrap();
    for entry in std::fs::read_dir(&random_dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), other_dir.join(entry.file_name())).unwrap();
    }
    let path = other_dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // Two ordinary tokens trade ids: both stay in the vocabulary (its merges still parse).
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let mut by_id: Vec<(u64, String)> = vocab
        .iter()
        .map(|(w, id)| (id.as_u64().unwrap(), w.clone()))
        .collect();
    by_id.sort();
    let (id, first) = by_id[1000].clone();
    let (other_id, second) = by_id[1001].clone();
    vocab.insert(first, other_id.into());
    vocab.insert(second, id.into());
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let err = Engine::load(
        None,
        EngineOptions {
            speculative: Some(draft_config),
            draft_model: Some(other_dir.to_string_lossy().into_owned()),
            ..EngineOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("tokenizer") && err.contains(&format!("token {id}")),
        "{err}"
    );

    // Without a draft model: refused at load, and per request.
    let err = Engine::load(
        None,
        EngineOptions {
            speculative: Some(draft_config),
            ..EngineOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("draft model"), "{err}");
    let request = GenerationRequest {
        speculative: Some(draft_config),
        ..greedy("Hi", 4)
    };
    let err = engine().submit(request).unwrap_err().to_string();
    assert!(err.contains("none is loaded"), "{err}");
}

/// `--cache-type-k/-v f16` on the MLX backend: the greedy reference text is unchanged (keys and
/// values move by at most 2^-11 of themselves); the OpenXLA backend refuses the option at load,
/// naming it, instead of running with f32 caches.
#[test]
fn f16_kv_caches_keep_the_reference_text_and_are_refused_on_xla() {
    if skip() {
        return;
    }
    let options = EngineOptions {
        kv_types: (KvType::F16, KvType::F16),
        ..EngineOptions::default()
    };
    let f16 = Engine::load(None, options.clone()).expect("f16 caches load");
    let completion = f16.generate(greedy("The capital of France is", 8)).unwrap();
    assert_eq!(completion.text, " Paris.\n\nThe answer is:");
    let loaded = Engine::load(
        None,
        EngineOptions {
            backend: BackendKind::Xla,
            ..options
        },
    );
    let Err(err) = loaded else {
        panic!("the xla backend accepted f16 caches");
    };
    let err = err.to_string();
    #[cfg(feature = "xla")]
    assert!(
        err.contains("--cache-type-k") && err.contains("xla") && err.contains("f16"),
        "{err}"
    );
    #[cfg(not(feature = "xla"))]
    assert!(err.contains("xla"), "{err}");
}

/// KV blocks on the MLX backend: requests with a common prompt longer than two blocks hold its
/// full blocks once (shared between their slots and the kept ones), and their output is bit for
/// bit what they compute without the cache (int8 activations).
#[test]
fn a_common_prefix_is_held_once_in_shared_blocks() {
    if skip() {
        return;
    }
    let options = |cache| EngineOptions {
        activations: Some(Activations::Int8),
        prefix_cache_bytes: cache,
        ..EngineOptions::default()
    };
    let plain = Engine::load(None, options(0)).unwrap();
    let cached = Engine::load(None, options(1 << 30)).unwrap();
    let system =
        "You are a careful assistant who answers in one sentence and never guesses. ".repeat(40);
    let requests: Vec<GenerationRequest> = ["France", "Italy", "Spain", "Peru"]
        .iter()
        .map(|c| {
            let text = format!("{system}Question: what is the capital of {c}? Answer:");
            GenerationRequest {
                sampling: SamplingParams::greedy(),
                ..GenerationRequest::new(plain.tokenize(&text).unwrap(), MaxNewTokens::Limited(6))
            }
        })
        .collect();
    let system_tokens = plain.tokenize(&system).unwrap().len();
    assert!(system_tokens > 2 * 256 + 16, "{system_tokens}");
    let want: Vec<Completion> = requests
        .iter()
        .map(|r| plain.generate(r.clone()).unwrap())
        .collect();
    // The first alone (kept when it ends), then the other three together.
    let first = cached.generate(requests[0].clone()).unwrap();
    let rest = submit_all(&cached, &requests[1..]);
    for (i, got) in std::iter::once(&first).chain(&rest).enumerate() {
        assert_eq!(got.tokens, want[i].tokens, "request {i}");
    }
    for got in &rest {
        assert!(
            got.usage.cached_tokens >= system_tokens - 2,
            "{:?}",
            got.usage
        );
    }
    // Four kept slots of three blocks each; the system prompt's first two blocks are shared.
    let blocks = cached
        .metrics()
        .kv_blocks
        .expect("MLX keeps its caches in blocks");
    assert_eq!(blocks.block_positions, 256);
    assert!(blocks.shared >= 2, "{blocks:?}");
    assert!(blocks.held <= 4 * 3 - 3 * 2, "{blocks:?}");
    let (reserved, budget) = cached.metrics().kv_usage.unwrap();
    assert!(
        reserved <= budget && blocks.free > 0,
        "{reserved} of {budget}: {blocks:?}"
    );
}

/// The default model with a prefix cache of `bytes`.
fn with_prefix_cache(bytes: usize, activations: Option<Activations>) -> Engine {
    let options = EngineOptions {
        prefix_cache_bytes: bytes,
        activations,
        ..EngineOptions::default()
    };
    Engine::load(None, options).unwrap()
}

/// The prefix cache's budget bounds the KV memory its kept slots hold on the MLX backend, where a
/// slot holds whole blocks of 256 positions: a budget of two blocks keeps at most two short
/// requests (counted by their positions, ~20 each, it kept all six, three times the budget).
#[test]
fn kept_slots_hold_no_more_blocks_than_the_prefix_budget() {
    if skip() {
        return;
    }
    let load = |cache| with_prefix_cache(cache, None);
    let requests: Vec<GenerationRequest> = EIGHT_PROMPTS
        .iter()
        .filter(|p| engine().tokenize(p).unwrap().len() >= 5)
        .take(6)
        .map(|p| greedy(&format!("{p} {p}"), 3))
        .collect();
    assert_eq!(requests.len(), 6);
    // One kept request alone: what a block reserves.
    let probe = load(1 << 30);
    probe.generate(requests[0].clone()).unwrap();
    let (block, _) = probe.metrics().kv_usage.unwrap();
    let blocks = probe.metrics().kv_blocks.unwrap();
    assert_eq!(
        (blocks.held, blocks.block_positions),
        (1, 256),
        "{blocks:?}"
    );
    drop(probe);

    let cached = load(2 * block);
    for request in &requests {
        cached.generate(request.clone()).unwrap();
    }
    let (reserved, _) = cached.metrics().kv_usage.unwrap();
    let held = cached.metrics().kv_blocks.unwrap().held;
    assert!(
        reserved <= 2 * block && (1..=2).contains(&held),
        "kept {held} blocks, {reserved} bytes against a budget of {}",
        2 * block
    );
    // The last request is among the kept ones: asking it again reuses its prompt.
    let again = cached.generate(requests[5].clone()).unwrap();
    assert!(again.usage.cached_tokens > 0, "{:?}", again.usage);
}

/// A request that stops early in a slot planned for many more positions is kept for the blocks
/// it holds: its reservation shrinks to them when the prefix cache keeps it (a finished request
/// does not grow; the next turn that takes the slot over reserves for its own plan), so a chat
/// turn with a large `max_tokens` is kept under a budget of one block and its next turn reuses it.
#[test]
fn a_kept_slot_reserves_only_the_blocks_it_holds() {
    if skip() {
        return;
    }
    let load = |cache| with_prefix_cache(cache, Some(Activations::Int8));
    let prompt = int8_engine()
        .tokenize("A list of fruits: apple, banana, cherry, and")
        .unwrap();
    // The greedy continuation's third token ends the request: 3 tokens in a plan of 600.
    let ahead = int8_engine()
        .generate(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(prompt.clone(), MaxNewTokens::Limited(3))
        })
        .unwrap();
    let early = GenerationRequest {
        sampling: SamplingParams::greedy(),
        stop_token_ids: vec![ahead.tokens[2]],
        ..GenerationRequest::new(prompt.clone(), MaxNewTokens::Limited(600))
    };
    // What one block reserves: a kept request whose whole plan fits in one.
    let probe = load(1 << 30);
    probe
        .generate(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(prompt.clone(), MaxNewTokens::Limited(3))
        })
        .unwrap();
    let (block, _) = probe.metrics().kv_usage.unwrap();
    assert_eq!(probe.metrics().kv_blocks.unwrap().held, 1);
    drop(probe);

    let cached = load(block);
    let first = cached.generate(early).unwrap();
    assert_eq!(first.tokens, ahead.tokens, "{first:?}");
    let (reserved, _) = cached.metrics().kv_usage.unwrap();
    assert_eq!(
        reserved, block,
        "kept, for its one block (a plan of 600 reserved three)"
    );
    let mut next_turn = prompt.clone();
    next_turn.extend(&first.tokens);
    next_turn.extend(int8_engine().tokenize(" and a pear.").unwrap());
    let second = cached
        .generate(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(next_turn.clone(), MaxNewTokens::Limited(4))
        })
        .unwrap();
    assert!(
        second.usage.cached_tokens >= prompt.len(),
        "{:?}",
        second.usage
    );
    let plain = int8_engine()
        .generate(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(next_turn, MaxNewTokens::Limited(4))
        })
        .unwrap();
    // Int8 activations: the reused prefix gives the same bits as computing it again.
    assert_eq!(second.tokens, plain.tokens);
}

/// A request without a token limit is planned for a share of the KV budget (a `max_batch`-th of
/// its positions, prompt included), not for the whole window: where the window's worth of keys
/// and values is more than the budget (a 128K-position model at its default budget, here the
/// default model under a budget of eight blocks) it runs instead of being refused. A limited
/// request is honoured up to the whole budget, and refused past it naming `--kv-budget`.
#[test]
fn an_unlimited_request_is_planned_for_its_share_of_the_kv_budget() {
    if skip() {
        return;
    }
    // One block of the default model's f32 keys and values: 256 positions × 30 layers × 3 KV
    // heads × 64 × 2 × 4 bytes.
    let block = 256 * 30 * 3 * 64 * 2 * 4;
    let engine = Engine::load(
        None,
        EngineOptions {
            kv_budget_bytes: 8 * block,
            scheduler: SchedulerConfig {
                max_batch: 4,
                ..SchedulerConfig::default()
            },
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let prompt = engine.tokenize("Once upon a time").unwrap();
    let unlimited = engine
        .submit(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(prompt.clone(), MaxNewTokens::Unlimited)
        })
        .unwrap();
    let plan = engine
        .plan(unlimited.id())
        .unwrap()
        .expect("queued or running");
    // A share is two blocks: 512 positions, the prompt's among them.
    assert_eq!(plan.max_positions, 512, "{plan:?}");
    assert_eq!(plan.admitted_max_new_tokens, 512 - prompt.len());
    unlimited.cancel();

    let limited = |n| {
        engine.submit(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(prompt.clone(), MaxNewTokens::Limited(n))
        })
    };
    // More than a share, within the budget: honoured.
    let long = limited(1500).unwrap();
    let plan = engine.plan(long.id()).unwrap().expect("queued or running");
    assert_eq!(plan.admitted_max_new_tokens, 1500);
    long.cancel();
    let err = limited(2100).expect_err("past the budget").to_string();
    assert!(err.contains("--kv-budget"), "{err}");
}

#[test]
fn a_sleeping_engine_frees_the_model_and_reloads_it_on_demand() {
    if skip() {
        return;
    }
    let options = EngineOptions {
        prefix_cache_bytes: 1 << 28,
        ..EngineOptions::default()
    };
    let engine = Engine::load(None, options).unwrap();
    let first = engine
        .submit(greedy("The capital of France is", 8))
        .unwrap();
    let first_id = first.id();
    let first = first.collect_completion().unwrap();
    assert_eq!(first.text, " Paris.\n\nThe answer is:");
    let before = engine.metrics();
    assert!(before.prefix.entries > 0, "{:?}", before.prefix);

    engine.sleep().unwrap();
    assert!(engine.is_sleeping());
    // Asleep, the metrics are the snapshot taken before, and the prefix cache is gone with the
    // backend: nothing can be exported from it, and asking does not wake the engine.
    assert_eq!(engine.metrics(), before);
    assert_eq!(engine.cached_prefix(first_id).unwrap(), None);
    assert!(engine.is_sleeping());

    // A request wakes it: the model is loaded again and answers as before, the ids and the
    // counters go on from where they were.
    let again = engine
        .submit(greedy("The capital of France is", 8))
        .unwrap();
    assert!(again.id() > first_id);
    let again = again.collect_completion().unwrap();
    assert!(!engine.is_sleeping());
    assert_eq!(again.text, first.text);
    assert_eq!(again.usage.cached_tokens, 0, "the prefix cache was dropped");
    let after = engine.metrics();
    assert_eq!(after.generated_tokens, before.generated_tokens + 8);
    assert_eq!(after.prefix.lookups, before.prefix.lookups + 1);

    // An idle time puts it to sleep by itself; `wake` loads it without a request.
    engine
        .sleep_when_idle(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let start = std::time::Instant::now();
    while !engine.is_sleeping() {
        assert!(start.elapsed() < std::time::Duration::from_secs(30));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    engine.wake().unwrap();
    assert!(!engine.is_sleeping());
    let embedded = engine
        .embed(
            engine.tokenize("Hello").unwrap(),
            Pooling::Mean,
            Normalize::default(),
        )
        .unwrap();
    assert_eq!(embedded[0].len(), engine.info().hidden_size);
}
