//! Speculative types side by side on one prompt: greedy decode of the same prompt with each
//! `--spec-type` value given (llama.cpp's spellings, at llama.cpp's default sizes; `none` for no
//! speculation), one engine per type loaded up front, the runs interleaved round by round. Per
//! type: the decode rate (generated tokens over the time from the first token to the last, the
//! median over rounds), proposals accepted / drafted, verification passes, and whether the text
//! equals `none`'s (it must: greedy output is unchanged).
//!
//! `cargo run --release -p mlxcel-engine --example spec-types -- PROMPT_FILE [--rounds N]
//! [--n-predict N] [--types none,ngram-simple,...]` (types separated by `;`, since a type list
//! has commas). The prompt is raw text, tokenized with the model's special tokens.

use std::process::ExitCode;
use std::time::Instant;

use mlxcel_engine::{
    Engine, EngineOptions, GenerationRequest, MaxNewTokens, SamplingParams, SpeculativeConfig,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spec-types: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("give a prompt file")?;
    let (mut rounds, mut n_predict) = (3usize, 256usize);
    let mut types = "none;ngram-simple;ngram-mod;ngram-map-k;ngram-map-k4v".to_owned();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--rounds" => rounds = value.parse()?,
            "--n-predict" => n_predict = value.parse()?,
            "--types" => types = value,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let text = std::fs::read_to_string(&path)?;
    let types: Vec<&str> = types.split(';').collect();
    let mut engines = Vec::new();
    for spec_type in &types {
        let speculative = SpeculativeConfig::from_flags(Some(spec_type), false, false, 16, 1, 0.0)?;
        let engine = Engine::load(
            None,
            EngineOptions {
                speculative,
                ..EngineOptions::default()
            },
        )?;
        engines.push(engine);
    }
    let prompt = engines[0].tokenize(&text)?;
    let request = GenerationRequest {
        sampling: SamplingParams::greedy(),
        ..GenerationRequest::new(prompt.clone(), MaxNewTokens::Limited(n_predict))
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); types.len()];
    let mut texts: Vec<String> = vec![String::new(); types.len()];
    let mut tokens = vec![0usize; types.len()];
    for round in 0..rounds {
        for (i, engine) in engines.iter().enumerate() {
            let started = Instant::now();
            let stream = engine.submit(request.clone())?;
            let mut first = None;
            let mut count = 0usize;
            let mut out = String::new();
            for event in stream {
                if let mlxcel_engine::Event::Token { text, .. } = &event {
                    first.get_or_insert_with(Instant::now);
                    count += 1;
                    out.push_str(text);
                }
                if let mlxcel_engine::Event::Finished { text, .. } = &event {
                    out.push_str(text);
                    break;
                }
            }
            let first = first.unwrap_or(started);
            let rate = (count.saturating_sub(1)) as f64 / first.elapsed().as_secs_f64();
            rates[i].push(rate);
            texts[i] = out;
            tokens[i] = count;
            eprintln!("round {} {}: {rate:.1} tok/s", round + 1, types[i]);
        }
    }
    println!(
        "prompt: {path} ({} tokens); {n_predict} new tokens, greedy; {rounds} rounds",
        prompt.len()
    );
    println!(
        "| type | tokens | decode tok/s (median) | vs none | accepted / drafted | passes | same text |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&mut rates[0].clone());
    for (i, engine) in engines.iter().enumerate() {
        let rate = median(&mut rates[i]);
        let stats = engine.stats();
        println!(
            "| {} | {} | {rate:.1} | {:.2}× | {}/{} | {} | {} |",
            types[i],
            tokens[i],
            rate / base,
            stats.accepted_tokens,
            stats.drafted_tokens,
            stats.drafts,
            if texts[i] == texts[0] {
                "yes"
            } else {
                "**no**"
            }
        );
    }
    Ok(())
}
