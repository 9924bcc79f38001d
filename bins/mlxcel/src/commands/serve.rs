//! `mlxcel serve`: the HTTP server (OpenAI and llama-server routes), with llama-server's flags.

use std::process::ExitCode;

use anyhow::Result;
use mlxcel_server::{ServerArgs, init_logging};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    server: ServerArgs,

    /// Log every request and refusal (debug level).
    #[arg(short = 'v', long)]
    verbose: bool,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    init_logging(args.verbose);
    mlxcel_server::run(&args.server)?;
    Ok(ExitCode::SUCCESS)
}
