//! llama.cpp's hashed n-gram proposers (`ngram-map-k`, `ngram-map-k4v`, `ngram-mod`) on the
//! default model: greedy output is the same token for token as without speculation, alone and
//! batched, each type alone and all chained in llama.cpp's order, and repeated text gets their
//! proposals accepted.

use std::collections::HashMap;

use super::*;

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The types from llama.cpp's flags, at sizes small enough for short prompts to repeat.
fn config(types: &str) -> SpeculativeConfig {
    let mut config = SpeculativeConfig::from_flags(Some(types), false, false, 16, 1, 0.0)
        .unwrap()
        .unwrap();
    let map = NgramMapConfig {
        size_n: 3,
        size_m: 12,
        min_hits: 1,
    };
    config.ngram_map_k = config.ngram_map_k.map(|_| map);
    config.ngram_map_k4v = config.ngram_map_k4v.map(|_| map);
    config.ngram_mod = config.ngram_mod.map(|_| NgramModConfig {
        n_match: 4,
        n_min: 2,
        n_max: 16,
    });
    config
}

#[test]
fn hashed_proposers_keep_greedy_output() {
    if skip() {
        return;
    }
    let prompts = [
        "Copy this list twice: apple, banana, cherry, date, elderberry, fig, grape. \
         apple, banana, cherry, date, elderberry, fig, grape. apple, banana,",
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n\
         def add(a, b):\n",
        "The capital of France is",
    ];
    let plain = Engine::load(None, EngineOptions::default()).unwrap();
    let requests: Vec<GenerationRequest> = prompts
        .iter()
        .map(|p| GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(plain.tokenize(p).unwrap(), MaxNewTokens::Limited(48))
        })
        .collect();
    let expected: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| plain.generate(r.clone()).unwrap().tokens)
        .collect();
    let mut accepted = HashMap::new();
    for types in [
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-mod,ngram-map-k4v,ngram-map-k,ngram-simple",
    ] {
        let engine = Engine::load(
            None,
            EngineOptions {
                speculative: Some(config(types)),
                ..EngineOptions::default()
            },
        )
        .unwrap();
        for (i, request) in requests.iter().enumerate() {
            let alone = engine.generate(request.clone()).unwrap();
            assert_eq!(alone.tokens, expected[i], "{types}: prompt {i} alone");
        }
        let streams: Vec<_> = requests
            .iter()
            .map(|r| engine.submit(r.clone()).unwrap())
            .collect();
        for (i, stream) in streams.into_iter().enumerate() {
            let together = stream.collect_completion().unwrap();
            assert_eq!(together.tokens, expected[i], "{types}: prompt {i} batched");
        }
        let stats = engine.stats();
        assert!(
            stats.accepted_tokens <= stats.drafted_tokens,
            "{types}: {stats:?}"
        );
        accepted.insert(types, stats.accepted_tokens);
    }
    for (types, accepted) in &accepted {
        assert!(*accepted > 0, "{types}: nothing accepted ({accepted:?})");
    }
}
