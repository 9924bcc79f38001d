//! `mlxcel perplexity`: a text's perplexity under a model, as llama.cpp's `llama-perplexity`
//! computes and prints it, so that the two numbers compare directly.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use mlxcel_engine::{BackendKind, EngineOptions, PerplexityOptions, perplexity};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a checkpoint directory or a .gguf file (default: the default model).
    #[arg(short = 'm', long, env = "MLXCEL_MODEL")]
    model: Option<String>,

    /// The text file to measure (llama-perplexity's `-f`).
    #[arg(short = 'f', long = "file")]
    file: std::path::PathBuf,

    /// Tokens per chunk (llama-perplexity's `-c`); the second half of each chunk is scored.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,

    /// At most this many chunks (llama-perplexity's `--chunks`); default: the whole text.
    #[arg(long)]
    chunks: Option<usize>,

    /// Most tokens per forward pass (llama-perplexity's `-b`).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,

    /// Backend to run the model on (perplexity needs every position's logits: the mlx backend).
    #[arg(long, env = "MLXCEL_BACKEND", default_value = "mlx")]
    backend: String,

    /// Threads of the CPU kernels; defaults to `MLXCEL_THREADS`, else all cores.
    #[arg(short = 't', long)]
    threads: Option<usize>,

    /// What the MLX backend's quantized matmuls multiply the weights with: `f32` or `int8`.
    /// Defaults to `MLXCEL_ACTIVATIONS`, else int8 on the MLX backend where the CPU has AVX2 or
    /// AVX-512 VNNI, else `f32`.
    #[arg(long)]
    activations: Option<String>,

    #[command(flatten)]
    kv: super::KvTypeArgs,
    #[command(flatten)]
    ignored: super::ignored::Ignored,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    args.ignored.warn();
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let backend: BackendKind = args.backend.parse()?;
    let options = EngineOptions {
        backend,
        threads: args.threads,
        activations: Some(super::parse_activations(
            args.activations.as_deref(),
            backend,
        )?),
        kv_types: args.kv.kv_types(),
        kv_budget_bytes: args.kv.kv_budget_bytes(),
        ..EngineOptions::default()
    };
    let settings = PerplexityOptions {
        context: args.ctx_size,
        chunks: args.chunks,
        batch: args.batch_size,
    };
    eprintln!(
        "perplexity: {} over chunks of {} tokens (batch {}), scoring each chunk's second half",
        args.file.display(),
        settings.context,
        settings.batch
    );
    let mut stdout = std::io::stdout();
    let report = perplexity(
        args.model.as_deref(),
        &options,
        &text,
        &settings,
        |chunk, ppl| {
            // llama-perplexity's running output: `[1]12.3456,[2]…`.
            let _ = write!(stdout, "[{chunk}]{ppl:.4},");
            let _ = stdout.flush();
        },
    )?;
    println!();
    eprintln!(
        "perplexity: {} tokens, {} chunks, {} tokens scored, {:.2} s per chunk",
        report.tokens, report.chunks, report.scored, report.seconds_per_chunk
    );
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        report.ppl, report.error
    );
    Ok(ExitCode::SUCCESS)
}
