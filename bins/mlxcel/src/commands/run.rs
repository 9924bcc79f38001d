//! `mlxcel run MODEL [PROMPT]` (as `ollama run`): one answer to the prompt, or a chat without
//! one. MODEL is a checkpoint directory, a .gguf file, a name or id from `mlxcel list`, or
//! `default`; every flag of `generate` applies.

use std::process::ExitCode;

use anyhow::Result;

#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(after_help = super::options::ALIASES_HELP)]
pub struct Args {
    /// The model: a checkpoint directory, a .gguf file, a name or id from `mlxcel list`, or
    /// `default`.
    pub model: String,

    /// The prompt (`-` reads standard input); without it, an interactive chat starts.
    pub prompt: Option<String>,

    #[command(flatten)]
    pub options: super::options::Options,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let model = super::cache::model_arg(Some(&args.model))?;
    let prompt = match args.prompt.as_deref() {
        Some("-") => Some(args.options.text(&super::generate::read_stdin()?)),
        Some(prompt) => Some(args.options.text(prompt)),
        None => None,
    };
    let mode = args.options.mode(prompt)?;
    super::session::run(model.as_deref(), &args.options, mode)?;
    Ok(ExitCode::SUCCESS)
}
