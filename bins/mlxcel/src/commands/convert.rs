//! `mlxcel convert`: turn a GGUF file into an MLX checkpoint directory.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use mlxcel_model::convert_gguf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GGUF file (F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and Q2_K..Q6_K tensors).
    input: PathBuf,

    /// The checkpoint directory to write (config.json, model.safetensors, tokenizer files).
    output: PathBuf,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let summary = convert_gguf(&args.input, &args.output)
        .with_context(|| format!("converting {}", args.input.display()))?;
    let config = &summary.config;
    println!(
        "wrote {} ({} tensors; {}, hidden {}, window {}, quantization {})",
        summary.out_dir.display(),
        summary.tensors,
        config.describe(),
        config.hidden_size,
        config.window(),
        config
            .quantization
            .as_ref()
            .map_or("none".to_owned(), |q| format!(
                "{} bits, group {}",
                q.default.bits, q.default.group_size
            )),
    );
    if let Some(note) = summary.group16_note() {
        eprintln!("note: {note}");
    }
    Ok(ExitCode::SUCCESS)
}
