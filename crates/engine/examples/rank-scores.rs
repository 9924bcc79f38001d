//! mlxcel's side of `scripts/check-rerank` and `scripts/check-rerank-bert`: loads a reranker (a
//! checkpoint directory or a GGUF file), puts the query and each document together with its
//! rerank prompt ([`mlxcel_model::RankHead::prompt`]), tokenizes the pair as llama-server does
//! (no added special tokens, special tokens parsed) or, for an encoder without a prompt (BERT),
//! puts the pair together from its vocabulary ([`mlxcel_engine::Engine::rank_pair`]), and prints one JSON line per document: its token ids
//! and its score ([`mlxcel_engine::Engine::rank`]), the same lines `scripts/rerank/llama_rank.cpp`
//! prints for llama.cpp.
//!
//! ```sh
//! cargo run -p mlxcel-engine --example rank-scores -- \
//!     --model MODEL.gguf [--backend mlx] [--activations f32|int8|mixed] QUERY DOCUMENT...
//! ```

use std::process::ExitCode;

use mlxcel_engine::{Activations, BackendKind, Engine, EngineOptions};
use serde_json::json;

type Error = Box<dyn std::error::Error>;

const USAGE: &str = "usage: rank-scores --model PATH [--backend mlx|xla] \
                     [--activations f32|int8|mixed] QUERY DOCUMENT...";

fn run() -> Result<(), Error> {
    let mut argv = std::env::args().skip(1);
    let (mut model, mut backend, mut activations) = (None, BackendKind::Mlx, None);
    let mut rest = Vec::new();
    while let Some(arg) = argv.next() {
        let mut value = || {
            argv.next()
                .ok_or_else(|| format!("{arg} needs a value; {USAGE}"))
        };
        match arg.as_str() {
            "--model" => model = Some(value()?),
            "--backend" => backend = value()?.parse()?,
            "--activations" => activations = Some(value()?.parse::<Activations>()?),
            _ if arg.starts_with("--") => {
                return Err(format!("unknown argument {arg:?}; {USAGE}").into());
            }
            _ => rest.push(arg),
        }
    }
    let model = model.ok_or(format!("--model is required; {USAGE}"))?;
    if rest.len() < 2 {
        return Err(format!("a query and at least one document are required; {USAGE}").into());
    }
    let query = rest.remove(0);
    let options = EngineOptions {
        backend,
        activations,
        ..EngineOptions::default()
    };
    let engine = Engine::load(Some(&model), options)?;
    let head = engine
        .rank_head()
        .ok_or("the model is not a reranker (no classification head)")?;
    for document in rest {
        let tokens = match head.prompt(&query, &document) {
            Some(prompt) => engine.tokenizer().encode(&prompt, false, true)?,
            None => engine
                .rank_pair(&query, &document)
                .ok_or("the reranker has no rerank prompt")?,
        };
        let score = engine.rank(tokens.clone())?;
        println!(
            "{}",
            json!({"document": document, "tokens": tokens, "score": score})
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("rank-scores: {err}");
            ExitCode::FAILURE
        }
    }
}
