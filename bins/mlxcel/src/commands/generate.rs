//! `mlxcel generate`: stream text from a prompt, or chat interactively without one.

use std::io::Read;
use std::process::ExitCode;

use anyhow::{Context, Result};

#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(after_help = super::options::ALIASES_HELP)]
pub struct Args {
    /// Model: a checkpoint directory or a .gguf file (default: the default model, see `mlxcel pull`).
    #[arg(short = 'm', long, env = "MLXCEL_MODEL")]
    pub model: Option<String>,

    /// The prompt; `-` reads it from standard input. Without a prompt, mlxcel starts an
    /// interactive chat.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,

    /// Read the prompt from a file.
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    pub file: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub options: super::options::Options,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(prompt), _) if prompt == "-" => Some(args.options.text(&read_stdin()?)),
        (Some(prompt), _) => Some(args.options.text(prompt)),
        (None, Some(path)) => Some(
            args.options.text(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("reading the prompt file {}", path.display()))?,
            ),
        ),
        (None, None) => None,
    };
    let mode = args.options.mode(prompt)?;
    super::session::run(args.model.as_deref(), &args.options, mode)?;
    Ok(ExitCode::SUCCESS)
}

/// The whole of standard input (`-p -`, as mlx_lm reads `--prompt -`).
pub fn read_stdin() -> Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading the prompt from standard input (-p -)")?;
    Ok(text)
}
