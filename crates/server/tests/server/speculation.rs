//! llama.cpp's hashed n-gram speculative types from llama-server's own flags, end to end on the
//! default model: each flag set reaches the engine's proposer, requests report its proposals,
//! and greedy text is the text without speculation.

use serde_json::json;

use crate::support::*;

const PROMPT: &str = "one two three four five six seven eight nine ten\n\
                      one two three four five six seven eight nine ten\n\
                      one two three four five six seven eight nine ten\n\
                      one two three four five six seven eight nine ten\n\
                      one two three four five six seven eight nine ten\none two";

/// Serves the default model with `flags` and returns `/completion`'s greedy answer to the
/// repetitive prompt: (content, draft_n, draft_n_accepted). Int8 activations: their logits do
/// not depend on how many positions a pass verifies, so greedy text is the same bit for bit
/// (with f32 activations, the server's default for this small model, a near tie can break the
/// other way in a pass of 16 positions than in a one-token step).
async fn complete_with(flags: &[&str]) -> (String, u64, u64) {
    let mut argv = vec!["--activations", "int8"];
    argv.extend_from_slice(flags);
    let args = parse_server_args(&argv).unwrap();
    let options = args.engine_options().unwrap();
    let config = args.server_config().unwrap();
    let engine = tokio::task::spawn_blocking(move || mlxcel_engine::Engine::load(None, options))
        .await
        .unwrap()
        .unwrap();
    let server = TestServer::start(config, Some(std::sync::Arc::new(engine))).await;
    let answer = server
        .post_json(
            "/completion",
            json!({"prompt": PROMPT, "n_predict": 24, "temperature": 0}),
        )
        .await
        .json();
    let timings = &answer["timings"];
    (
        answer["content"].as_str().unwrap().to_owned(),
        timings["draft_n"].as_u64().unwrap_or(0),
        timings["draft_n_accepted"].as_u64().unwrap_or(0),
    )
}

/// Each hashed type and its size flags (and `--spec-default`, ngram-mod at llama.cpp's sizes;
/// and all types chained): proposals are drafted and accepted on text that repeats, and the
/// greedy text is the one without speculation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_speculative_types_from_llama_flags() {
    if skip_model_tests() {
        return;
    }
    let (plain, drafted, _) = complete_with(&[]).await;
    assert_eq!(drafted, 0);
    for flags in [
        &[
            "--spec-type",
            "ngram-mod",
            "--spec-ngram-mod-n-match",
            "4",
            "--spec-ngram-mod-n-min",
            "2",
            "--spec-ngram-mod-n-max",
            "16",
        ][..],
        &[
            "--spec-type",
            "ngram-map-k",
            "--spec-ngram-map-k-size-n",
            "3",
            "--spec-ngram-map-k-size-m",
            "12",
            "--spec-ngram-map-k-min-hits",
            "1",
        ],
        &[
            "--spec-type",
            "ngram-map-k4v",
            "--spec-ngram-map-k4v-size-n",
            "3",
            "--spec-ngram-map-k4v-size-m",
            "12",
            "--spec-ngram-map-k4v-min-hits",
            "1",
        ],
        &["--spec-default"],
        &[
            "--spec-type",
            "ngram-mod,ngram-map-k4v,ngram-map-k",
            "--spec-ngram-map-k-size-n",
            "4",
        ],
    ] {
        let (text, drafted, accepted) = complete_with(flags).await;
        assert_eq!(text, plain, "{flags:?}");
        assert!(
            drafted > 0 && accepted > 0 && accepted <= drafted,
            "{flags:?}: {accepted}/{drafted}"
        );
    }
}
