//! What a speculative verification pass costs against a decode step, on the model and machine at
//! hand: after a prefill of `--depth` tokens, the median time of a one-token step and of scored
//! passes over 1 + k tokens (every position's logits, then the k positions rolled back), for
//! k = 1, 2, 3, 4, 6, 8, 12, 16. The ratio is what one pass must buy back in accepted proposals.
//!
//! `cargo run --release -p mlxcel-engine --example spec-cost -- [--model DIR|FILE]
//! [--depth N] [--activations f32|int8] [--reps N]` (default: the default model, depth 512, int8,
//! 15 repetitions). The last column is the same pass with only its last position's logits
//! (a prefill chunk), which tells the scoring's own cost.

use std::process::ExitCode;
use std::time::Instant;

use mlxcel_engine::{
    Activations, EngineOptions, MaxNewTokens, RequestShape, SequenceStep, load_backend,
};
use mlxcel_model::{Checkpoint, resolve_model};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spec-cost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (mut model, mut depth, mut activations, mut reps) = (None, 512usize, Activations::Int8, 15);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--model" => model = Some(value()?),
            "--depth" => depth = value()?.parse()?,
            "--reps" => reps = value()?.parse()?,
            "--activations" => {
                activations = match value()?.as_str() {
                    "f32" => Activations::F32,
                    "int8" => Activations::Int8,
                    other => return Err(format!("--activations {other}: f32 or int8").into()),
                }
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let checkpoint = Checkpoint::open(&resolve_model(model.as_deref())?)?;
    let options = EngineOptions {
        activations: Some(activations),
        ..EngineOptions::default()
    };
    let mut backend = load_backend(&checkpoint, &options)?;
    let plan = backend.create_session_for_request(&RequestShape {
        prompt_len: depth,
        image_tokens: 0,
        max_new_tokens: MaxNewTokens::Limited(64),
    })?;
    let slot = backend.allocate_slot(&plan)?;
    let vocab = backend.vocab_size() as u32;
    let token = |i: usize| (i as u32 * 7919 + 13) % vocab;
    let prompt: Vec<u32> = (0..depth).map(token).collect();
    for (i, chunk) in prompt.chunks(512).enumerate() {
        backend.step(&[SequenceStep {
            slot,
            tokens: chunk,
            start_position: i * 512,
        }])?;
    }
    let mut time = |k: usize, scored: bool| -> Result<f64, Box<dyn std::error::Error>> {
        let input: Vec<u32> = (0..=k).map(|i| token(depth + i)).collect();
        let mut samples = Vec::with_capacity(reps);
        for _ in 0..reps + 1 {
            let started = Instant::now();
            let step = SequenceStep {
                slot,
                tokens: &input,
                start_position: depth,
            };
            if !scored {
                backend.step(&[step])?;
            } else {
                backend.step_scored(&[step], &[0])?;
            }
            samples.push(started.elapsed().as_secs_f64() * 1e3);
            backend.truncate(slot, depth)?;
        }
        samples.remove(0);
        samples.sort_by(f64::total_cmp);
        Ok(samples[samples.len() / 2])
    };
    let one = time(0, false)?;
    println!("depth {depth}, {activations:?} activations: decode step {one:.2} ms");
    println!(
        "| proposals k | pass ms | × decode step | break-even accepted | last-position-only ms |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for k in [1, 2, 3, 4, 6, 8, 12, 16] {
        let ms = time(k, true)?;
        let plain = time(k, false)?;
        let ratio = ms / one;
        println!(
            "| {k} | {ms:.2} | {ratio:.2} | {:.2} | {plain:.2} |",
            (ratio - 1.0).max(0.0)
        );
    }
    Ok(())
}
