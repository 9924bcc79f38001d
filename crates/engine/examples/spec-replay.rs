//! How far prompt lookup can go on given prompts: each prompt's greedy continuation is decoded
//! once without speculation, then [`SpeculativeConfig::replay`] replays the scheduler's rules
//! over it (what `--spec-type ngram-simple` verifies and accepts, in decode steps' worth of
//! cost) beside the oracle (the best schedule of the same proposals, knowing how many each pass
//! would accept) and the oracle that also picks, for each pass, the best earlier occurrence to
//! propose from ("any match": a bound on choosing matches better or verifying a tree of them),
//! for passes over 1 + k positions costing `1 + c·k` decode steps at each row cost
//! c given. The `spec-cost` example measures c on this machine (~0.2 at depth 512 on the default
//! model); `scripts/bench-spec --replay` runs this over its prompts.
//!
//! `cargo run --release -p mlxcel-engine --example spec-replay -- PROMPTS.json [--model DIR|FILE]
//! [--n-predict N] [--activations f32|int8] [--row-costs 0.1,0.2,0.3] [--draft-max N]
//! [--ngram-min N]`, where PROMPTS.json is a list of `{"name": ..., "text": ...}` (raw text,
//! tokenized with the model's special tokens, as `mlxcel generate --no-chat-template` does).
//! Defaults: the default model, 256 tokens, int8 activations, row costs 0.1, 0.2 and 0.3,
//! llama.cpp's 16 proposals at most, n-grams of 2 to 4 tokens (`--ngram-min 1` lets a single
//! matching token propose, and the any-match oracle take every occurrence of the last token).

use std::process::ExitCode;

use mlxcel_engine::{
    Activations, Engine, EngineOptions, GenerationRequest, MaxNewTokens, SamplingParams,
    SpeculativeConfig,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spec-replay: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(serde::Deserialize)]
struct Prompt {
    name: String,
    text: String,
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut file, mut model, mut n_predict, mut activations) =
        (None, None, 256, Activations::Int8);
    let mut row_costs = vec![0.1f32, 0.2, 0.3];
    let mut config = SpeculativeConfig::default();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => model = Some(value()?),
            "--n-predict" => n_predict = value()?.parse()?,
            "--draft-max" => config.draft_max = value()?.parse()?,
            "--ngram-min" => config.ngram_min = value()?.parse()?,
            "--activations" => {
                activations = match value()?.as_str() {
                    "f32" => Activations::F32,
                    "int8" => Activations::Int8,
                    other => return Err(format!("--activations {other}: f32 or int8").into()),
                }
            }
            "--row-costs" => {
                row_costs = value()?
                    .split(',')
                    .map(|c| c.trim().parse::<f32>())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--row-costs: {e}: give numbers separated by commas"))?;
            }
            other if other.starts_with('-') => {
                return Err(format!("unknown argument {other}").into());
            }
            path => file = Some(path.to_owned()),
        }
    }
    config.validate()?;
    let file = file.ok_or("give a JSON file of prompts ([{\"name\": ..., \"text\": ...}])")?;
    let prompts: Vec<Prompt> = serde_json::from_str(&std::fs::read_to_string(&file)?)
        .map_err(|e| format!("{file}: {e}"))?;
    let options = EngineOptions {
        activations: Some(activations),
        ..EngineOptions::default()
    };
    let engine = Engine::load(model.as_deref(), options)?;

    print!(
        "| prompt | tokens | accepted / proposed (c = {}) |",
        row_costs[0]
    );
    for c in &row_costs {
        print!(" c = {c}: rules | c = {c}: oracle | c = {c}: any match |");
    }
    println!();
    println!(
        "|---|---:|---:|{}",
        "---:|---:|---:|".repeat(row_costs.len())
    );
    for prompt in &prompts {
        let context = engine.tokenize(&prompt.text)?;
        let completion = engine.generate(GenerationRequest {
            sampling: SamplingParams::greedy(),
            ..GenerationRequest::new(context.clone(), MaxNewTokens::Limited(n_predict))
        })?;
        let replays = row_costs
            .iter()
            .map(|&c| config.replay(&context, &completion.tokens, c))
            .collect::<Result<Vec<_>, _>>()?;
        print!(
            "| {} | {} | {}/{} |",
            prompt.name, replays[0].tokens, replays[0].accepted, replays[0].proposed
        );
        for r in &replays {
            print!(
                " {:.2}× | {:.2}× | {:.2}× |",
                r.speed_up(),
                r.oracle_speed_up(),
                r.any_match_speed_up()
            );
        }
        println!();
    }
    Ok(())
}
