//! `mlxcel tokenize`: print the token ids of a text, like llama.cpp's `llama-tokenize`.

use std::process::ExitCode;

use anyhow::Result;
use mlxcel_model::{Tokenizer, resolve_model};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model: a checkpoint directory or a .gguf file (default: the default model, see `mlxcel pull`).
    #[arg(short = 'm', long, env = "MLXCEL_MODEL")]
    model: Option<String>,

    /// The text to tokenize.
    text: String,

    /// Print each token's id and text, one per line, instead of the id list.
    #[arg(long)]
    pieces: bool,

    /// Recognise special tokens written in the text, e.g. `<|im_start|>` (the default).
    #[arg(long, overrides_with = "no_special")]
    special: bool,

    /// Tokenize special-token strings as plain text.
    #[arg(long, overrides_with = "special")]
    no_special: bool,

    /// Do not apply the tokenizer's post-processor (no BOS even where the model adds one).
    #[arg(long)]
    no_add_special: bool,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let dir = resolve_model(args.model.as_deref())?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let ids = tokenizer.encode(&args.text, !args.no_add_special, !args.no_special)?;
    if args.pieces {
        for &id in &ids {
            let piece = tokenizer.decode(&[id], false)?;
            println!("{id:>6} -> {piece:?}");
        }
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("[{}]", list.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}
