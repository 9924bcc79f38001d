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
    print!("{}", render(&tokenizer, args)?);
    Ok(ExitCode::SUCCESS)
}

/// The command's output: `[id, id, ...]`, or one `id -> "piece"` line per token with `--pieces`.
fn render(tokenizer: &Tokenizer, args: &Args) -> Result<String> {
    let ids = tokenizer.encode(&args.text, !args.no_add_special, !args.no_special)?;
    if args.pieces {
        let mut out = String::new();
        for &id in &ids {
            let piece = tokenizer.decode(&[id], false)?;
            out.push_str(&format!("{id:>6} -> {piece:?}"));
            // A token holding part of a character decodes to U+FFFD; show its vocabulary entry too.
            if piece.contains('\u{FFFD}')
                && let Some(token) = tokenizer.id_to_token(id)
            {
                out.push_str(&format!(" (token {token:?})"));
            }
            out.push('\n');
        }
        Ok(out)
    } else {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        Ok(format!("[{}]\n", list.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// The acceptance line, on the default model (skipped with `MLXCEL_SKIP_MODEL_TESTS`).
    #[test]
    fn default_model_prints_the_reference_ids() {
        if std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0") {
            return;
        }
        let tokenizer = Tokenizer::from_dir(&resolve_model(None).unwrap()).unwrap();
        let parse = |argv: &[&str]| {
            Cli::try_parse_from([&["tokenize"], argv].concat())
                .unwrap()
                .args
        };
        let ids = render(&tokenizer, &parse(&["The capital of France is"])).unwrap();
        assert_eq!(ids, "[504, 3575, 282, 4649, 314]\n");
        let pieces = render(&tokenizer, &parse(&["--pieces", "<|im_start|>Paris"])).unwrap();
        assert_eq!(pieces.lines().next(), Some("     1 -> \"<|im_start|>\""));
        let plain = render(&tokenizer, &parse(&["--no-special", "<|im_start|>"])).unwrap();
        assert_ne!(plain, "[1]\n");
        let special = render(
            &tokenizer,
            &parse(&["--no-special", "--special", "<|im_start|>"]),
        )
        .unwrap();
        assert_eq!(special, "[1]\n");
    }
}
