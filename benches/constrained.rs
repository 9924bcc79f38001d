//! Structured output's cost: decode tokens/s of the default model with and without a JSON-schema
//! constraint, at 1 and 8 concurrent streams, through the whole engine (scheduling, masking,
//! sampling, detokenization), interleaved rounds. Prints a table and the ratio; run with
//! `cargo bench --bench constrained` (docs/benchmarks.md).

use std::time::{Duration, Instant};

use mlxcel_engine::{
    BackendKind, Constraint, Engine, EngineOptions, GenerationRequest, MaxNewTokens, SamplingParams,
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

/// Tokens per second of `streams` requests decoded together, and the engine's time computing
/// masks per step over the run.
fn run(engine: &Engine, streams: usize, constrained: bool) -> (f64, Duration) {
    let requests: Vec<_> = (0..streams).map(|_| request(engine, constrained)).collect();
    let before = engine.stats();
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
    let rate = tokens as f64 / started.elapsed().as_secs_f64();
    let after = engine.stats();
    let steps = (after.steps - before.steps).max(1) as u32;
    (
        rate,
        (after.constraint_mask_time - before.constraint_mask_time) / steps,
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `-- --backend xla` measures the OpenXLA backend (MLX by default); MLX's activations follow
    // MLXCEL_ACTIVATIONS.
    let args: Vec<String> = std::env::args().collect();
    let backend = match args.iter().position(|a| a == "--backend") {
        Some(i) => match args.get(i + 1).map(|name| name.parse::<BackendKind>()) {
            Some(Ok(kind)) => kind,
            Some(Err(err)) => {
                eprintln!("constrained: --backend: {err}");
                std::process::exit(2);
            }
            None => {
                eprintln!("constrained: --backend needs a value (mlx or xla)");
                std::process::exit(2);
            }
        },
        None => BackendKind::Mlx,
    };
    let options = EngineOptions {
        backend,
        ..EngineOptions::default()
    };
    let engine = match Engine::load(None, options) {
        Ok(engine) => engine,
        Err(err) => {
            eprintln!("constrained: cannot load the default model: {err}");
            return;
        }
    };
    // Warm-up, including the vocabulary's token trie (built on the first constrained request).
    run(&engine, 1, true);
    run(&engine, 1, false);
    println!("| streams | free tok/s | json_schema tok/s | ratio | masks per step (ms) |");
    println!("|---:|---:|---:|---:|---:|");
    for streams in [1, 8] {
        let (mut free, mut constrained, mut masks) = (Vec::new(), Vec::new(), Duration::ZERO);
        for _ in 0..ROUNDS {
            free.push(run(&engine, streams, false).0);
            let (rate, mask) = run(&engine, streams, true);
            constrained.push(rate);
            masks += mask;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (f, c) = (mean(&free), mean(&constrained));
        let mask_ms = masks.as_secs_f64() * 1e3 / ROUNDS as f64;
        println!(
            "| {streams} | {f:.1} | {c:.1} | {:.2} | {mask_ms:.2} |",
            c / f
        );
    }
}
