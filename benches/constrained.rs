//! Structured output's cost: decode tokens/s of the default model with and without a JSON-schema
//! constraint, at 1 and 8 concurrent streams, through the whole engine (scheduling, masking,
//! sampling, detokenization), interleaved rounds. Prints a table and the ratio; run with
//! `cargo bench --bench constrained` (docs/benchmarks.md).

use std::time::Instant;

use mlxcel_engine::{
    Constraint, Engine, EngineOptions, GenerationRequest, MaxNewTokens, SamplingParams,
};

const ROUNDS: usize = 3;
const TOKENS: usize = 96;

fn request(engine: &Engine, constrained: bool) -> GenerationRequest {
    let prompt = engine
        .tokenize("Count from 1 to 200, separated by commas: 1, 2, 3,")
        .expect("the prompt tokenizes");
    let mut request = GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(prompt, MaxNewTokens::Limited(TOKENS))
    };
    if constrained {
        // A list of 60 small integers: longer than the budget, so both runs make TOKENS tokens.
        request.constraint = Some(Constraint::JsonSchema(serde_json::json!({
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 999},
            "minItems": 60,
            "maxItems": 60
        })));
    }
    request
}

/// Tokens per second of `streams` requests decoded together.
fn run(engine: &Engine, streams: usize, constrained: bool) -> f64 {
    let requests: Vec<_> = (0..streams).map(|_| request(engine, constrained)).collect();
    let started = Instant::now();
    let handles: Vec<_> = requests
        .into_iter()
        .map(|r| engine.submit(r).expect("submits"))
        .collect();
    let tokens: usize = handles
        .into_iter()
        .map(|h| {
            h.collect_completion()
                .expect("completes")
                .usage
                .completion_tokens
        })
        .sum();
    tokens as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let engine = match Engine::load(None, EngineOptions::default()) {
        Ok(engine) => engine,
        Err(err) => {
            eprintln!("constrained: cannot load the default model: {err}");
            return;
        }
    };
    // Warm-up, including the vocabulary's token trie (built on the first constrained request).
    run(&engine, 1, true);
    run(&engine, 1, false);
    println!("| streams | free tok/s | json_schema tok/s | ratio |");
    println!("|---:|---:|---:|---:|");
    for streams in [1, 8] {
        let (mut free, mut constrained) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            free.push(run(&engine, streams, false));
            constrained.push(run(&engine, streams, true));
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (f, c) = (mean(&free), mean(&constrained));
        println!("| {streams} | {f:.1} | {c:.1} | {:.2} |", c / f);
    }
}
