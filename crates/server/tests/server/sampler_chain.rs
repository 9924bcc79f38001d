//! llama.cpp's sampler chain through the server: DRY, XTC, top-n-sigma, dynamic temperature,
//! mirostat, `min_keep`, `post_sampling_probs` on every generating route, their range errors,
//! and the server-wide flags (`--dry-multiplier` ... `--logit-bias`, `--ignore-eos`).

use clap::Parser;
use hyper::StatusCode;
use mlxcel_engine::SamplerStage;
use mlxcel_server::{ServerArgs, ServerConfig, normalize_llama_args};
use serde_json::{Value, json};

use crate::support::*;

/// Every new field at a setting that changes the chain, as one request body's extra fields.
fn every_field() -> Value {
    json!({
        "top_n_sigma": 3.0, "xtc_probability": 0.5, "xtc_threshold": 0.2,
        "dynatemp_range": 0.3, "dynatemp_exponent": 1.5, "dry_multiplier": 0.8,
        "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
        "dry_sequence_breakers": ["\n", ":"], "min_keep": 2, "mirostat": 0,
        "mirostat_tau": 5.0, "mirostat_eta": 0.1, "seed": 3,
    })
}

fn with(mut body: Value, extra: &Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The top candidates of each generated token on `/completion` (`n_probs` entries), as
/// `(id, value)` where value is `prob` or `logprob`.
fn probabilities(reply: &Value, key: &str, top: &str) -> Vec<(Vec<(u64, f64)>, f64)> {
    reply["completion_probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .map(|t| {
            let alternatives = t[top]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| (a["id"].as_u64().unwrap(), a[key].as_f64().unwrap()))
                .collect();
            (alternatives, t[key].as_f64().unwrap_or(f64::NAN))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_xtc_top_n_sigma_mirostat_and_post_sampling_probs_on_every_route() {
    if skip_model_tests() {
        return;
    }
    let server = TestServer::with_model(ServerConfig::default()).await;
    // Every field is read on every generating route.
    for (path, body) in [
        (
            "/completion",
            json!({"prompt": "Once upon a time", "n_predict": 6}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "Once upon a time", "max_tokens": 6}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 6}),
        ),
    ] {
        let reply = server
            .post_json(path, with(body.clone(), &every_field()))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
        // Out of range: a 400 naming the field.
        for (field, value) in [
            ("xtc_probability", json!(1.5)),
            ("xtc_threshold", json!(-1)),
            ("dry_multiplier", json!(-1)),
            ("dry_penalty_last_n", json!(-5)),
            ("dry_sequence_breakers", json!([])),
            ("mirostat", json!(3)),
            ("mirostat_tau", json!(-1)),
            ("mirostat_eta", json!(-1)),
            ("dynatemp_range", json!(-1)),
            ("dynatemp_exponent", json!(-1)),
            ("top_n_sigma", json!("wide")),
            ("min_keep", json!(-1)),
            ("dry_allowed_length", json!(-1)),
            ("dry_base", json!("x")),
            ("post_sampling_probs", json!(3)),
        ] {
            let reply = server
                .post_json(path, with(body.clone(), &json!({ field: value })))
                .await;
            let error = reply.error(StatusCode::BAD_REQUEST);
            assert!(
                error["param"] == field || error["message"].as_str().unwrap().contains(field),
                "{path} {field}: {}",
                reply.body
            );
        }
    }

    let prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox";
    let completion = |extra: Value| {
        let server = &server;
        async move {
            let body = with(
                json!({"prompt": prompt, "n_predict": 4, "temperature": 0, "n_probs": 5}),
                &extra,
            );
            let reply = server.post_json("/completion", body).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
            reply.json()
        }
    };
    // The model's top 5 at each step, and the greedy text.
    let model = completion(json!({})).await;
    let model_top = probabilities(&model, "logprob", "top_logprobs");

    // Post-sampling at temperature 0: the chosen token alone, at probability 1.
    let post = completion(json!({"post_sampling_probs": true})).await;
    assert_eq!(post["content"], model["content"]);
    for (top, chosen) in probabilities(&post, "prob", "top_probs") {
        assert_eq!(top.len(), 1, "{post}");
        assert_eq!((top[0].1, chosen), (1.0, 1.0), "{post}");
    }

    // Sampling with top_k 5 at temperature 1: the survivors are the model's top 5, their
    // probabilities renormalised (summing to 1) in the model's order.
    let sampled = completion(
        json!({"post_sampling_probs": true, "temperature": 1.0, "top_k": 5,
                                    "top_p": 1.0, "min_p": 0.0, "seed": 9, "n_predict": 1}),
    )
    .await;
    let (top, chosen) = &probabilities(&sampled, "prob", "top_probs")[0];
    let ids: Vec<u64> = top.iter().map(|t| t.0).collect();
    let model_ids: Vec<u64> = model_top[0].0.iter().map(|t| t.0).collect();
    assert_eq!(ids, model_ids, "{sampled}");
    let total: f64 = top.iter().map(|t| t.1).sum();
    assert!((total - 1.0).abs() < 1e-4, "{sampled}");
    assert!(top.iter().any(|t| (t.1 - chosen).abs() < 1e-6), "{sampled}");
    // The model's probabilities renormalised over its top 5.
    let model_mass: f64 = model_top[0].0.iter().map(|t| t.1.exp()).sum();
    for ((_, p), (_, lp)) in top.iter().zip(&model_top[0].0) {
        assert!((p - lp.exp() / model_mass).abs() < 1e-3, "{p} vs {lp}");
    }

    // XTC at probability 1 with threshold 0 removes every top-k survivor but the least likely:
    // the first token is the model's 5th.
    let xtc = completion(
        json!({"top_k": 5, "xtc_probability": 1.0, "xtc_threshold": 0.0,
                                "post_sampling_probs": true, "n_predict": 1}),
    )
    .await;
    let (top, _) = &probabilities(&xtc, "prob", "top_probs")[0];
    assert_eq!(top.len(), 1, "{xtc}");
    assert_eq!(top[0].0, model_top[0].0[4].0, "{xtc}");
    // min_keep 3 forbids leaving one: the top 5 stay.
    let kept = completion(
        json!({"top_k": 5, "xtc_probability": 1.0, "xtc_threshold": 0.0,
                                 "min_keep": 3, "temperature": 1.0, "top_p": 1.0, "min_p": 0.0,
                                 "post_sampling_probs": true, "n_predict": 1}),
    )
    .await;
    assert_eq!(
        probabilities(&kept, "prob", "top_probs")[0].0.len(),
        5,
        "{kept}"
    );

    // Top-n-sigma with a tiny n keeps the largest logit alone.
    let sigma = completion(json!({"top_n_sigma": 0.001, "temperature": 1.0,
                                  "post_sampling_probs": true, "n_predict": 1}))
    .await;
    let (top, _) = &probabilities(&sigma, "prob", "top_probs")[0];
    assert_eq!(top.len(), 1, "{sigma}");
    assert_eq!(top[0].0, model_top[0].0[0].0, "{sigma}");

    // DRY on a repetition: the word that would extend the repeated pattern (" cherry") loses
    // `5 * 1.75^(length - 2)` from its logit, so its post-sampling probability collapses.
    let pattern = "apple banana cherry apple banana cherry apple banana cherry apple banana";
    let cherry = |extra: Value| {
        let body = with(
            json!({"prompt": pattern, "n_predict": 1, "temperature": 1.0, "top_k": 40,
                   "top_p": 1.0, "min_p": 0.0, "n_probs": 40, "post_sampling_probs": true}),
            &extra,
        );
        let server = &server;
        async move {
            let reply = server.post_json("/completion", body).await.json();
            reply["completion_probabilities"][0]["top_probs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["token"] == " cherry")
                .map_or(0.0, |t| t["prob"].as_f64().unwrap())
        }
    };
    let plain = cherry(json!({})).await;
    let dry = cherry(
        json!({"dry_multiplier": 5.0, "dry_base": 1.75, "dry_allowed_length": 2,
                            "dry_penalty_last_n": -1}),
    )
    .await;
    assert!(plain > 0.01 && dry < plain / 100.0, "{plain} -> {dry}");
    // A breaker on " banana" (the newest token) cuts the repetition to nothing: no penalty.
    let broken = cherry(json!({"dry_multiplier": 5.0, "dry_sequence_breakers": [" banana"]})).await;
    assert!((broken - plain).abs() < 1e-4, "{plain} vs {broken}");

    // Mirostat 2 with a target of 0 bits: the first token keeps the most likely alone.
    let mirostat = completion(
        json!({"mirostat": 2, "mirostat_tau": 0.0, "mirostat_eta": 0.1,
                                     "temperature": 1.0, "post_sampling_probs": true,
                                     "n_predict": 1}),
    )
    .await;
    let (top, _) = &probabilities(&mirostat, "prob", "top_probs")[0];
    assert_eq!(top.len(), 1, "{mirostat}");
    // Dynamic temperature: accepted and sampled with (its arithmetic: the engine's tests).
    let dynatemp = completion(json!({"temperature": 0.8, "dynatemp_range": 0.5,
                                     "dynatemp_exponent": 1.0, "n_predict": 2}))
    .await;
    assert!(dynatemp["content"].is_string());

    // The samplers field names every new stage, in either spelling.
    let chain = completion(
        json!({"samplers": ["penalties", "dry", "top_n_sigma", "top_k",
                                               "typ_p", "top_p", "min_p", "xtc", "temperature"]}),
    )
    .await;
    assert_eq!(chain["content"], model["content"]);
    let chain = completion(json!({"samplers": "edskypmxt"})).await;
    assert_eq!(chain["content"], model["content"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_wide_sampling_flags_reach_every_request() {
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerArgs,
    }
    let argv = [
        "mlxcel-server",
        "--samplers",
        "top_k;dry;temperature",
        "--ignore-eos",
        "--top-nsigma",
        "1.5",
        "--xtc-probability",
        "0.5",
        "--xtc-threshold",
        "0.2",
        "--typical",
        "0.9",
        "--dry-multiplier",
        "0.8",
        "--dry-base",
        "2",
        "--dry-allowed-length",
        "3",
        "--dry-penalty-last-n",
        "128",
        "--dry-sequence-breaker",
        "\n",
        "--dry-sequence-breaker",
        "###",
        "--dynatemp-range",
        "0.4",
        "--dynatemp-exp",
        "1.2",
        "--mirostat",
        "2",
        "--mirostat-lr",
        "0.2",
        "--mirostat-ent",
        "4",
        "-l",
        "15043+1",
        "--logit-bias",
        "2-inf",
    ];
    let config = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server
        .server_config()
        .unwrap();
    let d = &config.sampling_defaults;
    assert_eq!(
        (
            d.top_n_sigma,
            d.xtc_probability,
            d.xtc_threshold,
            d.typical_p
        ),
        (Some(1.5), Some(0.5), Some(0.2), Some(0.9))
    );
    assert_eq!(
        (
            d.dry_multiplier,
            d.dry_base,
            d.dry_allowed_length,
            d.dry_penalty_last_n
        ),
        (Some(0.8), Some(2.0), Some(3), Some(128))
    );
    assert_eq!(
        d.dry_sequence_breakers,
        Some(vec!["\n".to_owned(), "###".to_owned()])
    );
    assert_eq!(
        (
            d.dynatemp_range,
            d.dynatemp_exponent,
            d.mirostat,
            d.mirostat_eta,
            d.mirostat_tau
        ),
        (Some(0.4), Some(1.2), Some(2), Some(0.2), Some(4.0))
    );
    let chain = &config.sampling_chain;
    assert_eq!(
        chain.samplers,
        Some(vec![
            SamplerStage::TopK,
            SamplerStage::Dry,
            SamplerStage::Temperature
        ])
    );
    assert!(chain.ignore_eos);
    assert_eq!(chain.logit_bias, vec![(15043, 1.0), (2, f32::NEG_INFINITY)]);
    // The other spellings, and `none` for no breakers.
    let argv = [
        "mlxcel-server",
        "--sampler-seq",
        "kt",
        "--top-n-sigma",
        "-1",
        "--typical-p",
        "1",
        "--dry-sequence-breaker",
        "none",
    ];
    let config = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server
        .server_config()
        .unwrap();
    assert_eq!(
        config.sampling_chain.samplers,
        Some(vec![SamplerStage::TopK, SamplerStage::Temperature])
    );
    assert_eq!(config.sampling_defaults.dry_sequence_breakers, Some(vec![]));
    assert_eq!(config.sampling_defaults.top_n_sigma, Some(-1.0));
    let argv = ["mlxcel-server", "--sampling-seq", "kq"];
    let err = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server
        .server_config()
        .unwrap_err();
    assert!(err.to_string().contains("--sampler-seq"), "{err}");
    let argv = ["mlxcel-server", "-l", "hello"];
    let err = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server
        .server_config()
        .unwrap_err();
    assert!(err.to_string().contains("--logit-bias"), "{err}");

    // The constraint flags and `-sp`.
    let dir = std::env::temp_dir().join(format!("mlxcel-constraint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let grammar_file = dir.join("yes.gbnf");
    std::fs::write(&grammar_file, "root ::= \"yes\" | \"no\"").unwrap();
    let schema_file = dir.join("schema.json");
    std::fs::write(&schema_file, r#"{"type": "object"}"#).unwrap();
    let parse = |argv: Vec<&str>| {
        Cli::try_parse_from(normalize_llama_args(argv))
            .unwrap()
            .server
    };
    let grammar = parse(vec!["mlxcel-server", "--grammar", "root ::= \"yes\""]);
    assert!(matches!(
        grammar.server_config().unwrap().default_constraint,
        Some(mlxcel_engine::Constraint::Lark(_))
    ));
    let file = grammar_file.to_str().unwrap();
    let from_file = parse(vec!["mlxcel-server", "--grammar-file", file]);
    assert!(
        from_file
            .server_config()
            .unwrap()
            .default_constraint
            .is_some()
    );
    let schema = parse(vec!["mlxcel-server", "-j", r#"{"type": "object"}"#]);
    assert_eq!(
        schema.server_config().unwrap().default_constraint,
        Some(mlxcel_engine::Constraint::JsonSchema(
            json!({"type": "object"})
        ))
    );
    let schema_path = schema_file.to_str().unwrap();
    for flag in ["-jf", "--json-schema-file"] {
        let args = parse(vec!["mlxcel-server", flag, schema_path]);
        assert!(args.server_config().unwrap().default_constraint.is_some());
    }
    let bad = parse(vec!["mlxcel-server", "--json-schema", "{not json"]);
    assert!(
        bad.server_config()
            .unwrap_err()
            .to_string()
            .contains("--json-schema")
    );
    let bad = parse(vec!["mlxcel-server", "--grammar", "root ::= ("]);
    assert!(
        bad.server_config()
            .unwrap_err()
            .to_string()
            .contains("--grammar")
    );
    for flag in ["-sp", "--special"] {
        assert!(
            parse(vec!["mlxcel-server", flag])
                .engine_options()
                .unwrap()
                .special_tokens
        );
    }
    assert!(
        !parse(vec!["mlxcel-server"])
            .engine_options()
            .unwrap()
            .special_tokens
    );
    std::fs::remove_dir_all(&dir).ok();

    // On the default model: `--ignore-eos` makes a request run to its budget unless it sends
    // `ignore_eos: false`.
    if skip_model_tests() {
        return;
    }
    let mut config = ServerConfig::default();
    config.sampling_chain.ignore_eos = true;
    let server = TestServer::with_model(config).await;
    let chat = |extra: Value| {
        with(
            json!({"messages": [{"role": "user", "content": "Say hello."}],
                   "max_tokens": 40, "temperature": 0}),
            &extra,
        )
    };
    let ignored = server
        .post_json("/v1/chat/completions", chat(json!({})))
        .await
        .json();
    assert_eq!(ignored["usage"]["completion_tokens"], 40, "{ignored}");
    let honoured = server
        .post_json("/v1/chat/completions", chat(json!({"ignore_eos": false})))
        .await
        .json();
    assert_eq!(
        honoured["choices"][0]["finish_reason"], "stop",
        "{honoured}"
    );

    // `--grammar`: a request without a constraint of its own must match it.
    let config = ServerConfig {
        default_constraint: Some(mlxcel_engine::Constraint::Lark(
            mlxcel_engine::gbnf_to_lark("root ::= \"yes\" | \"no\"").unwrap(),
        )),
        ..ServerConfig::default()
    };
    let server = TestServer::with_model(config).await;
    let reply = server
        .post_json(
            "/completion",
            json!({"prompt": "Is the sky blue?", "n_predict": 4, "temperature": 0}),
        )
        .await
        .json();
    assert!(
        ["yes", "no"].contains(&reply["content"].as_str().unwrap()),
        "{reply}"
    );
}
