//! `mlxcel serve`: the HTTP server (OpenAI and llama-server routes), with llama-server's flags.

use std::process::ExitCode;

use anyhow::Result;
use mlxcel_server::{ServerArgs, init_server_logging};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    server: ServerArgs,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let mut server = args.server.clone();
    // Like the other subcommands, `serve` takes its model from MLXCEL_MODEL when neither -m nor
    // LLAMA_ARG_MODEL names one.
    if server.model.is_none() {
        server.model = std::env::var("MLXCEL_MODEL").ok().filter(|m| !m.is_empty());
    }
    init_server_logging(&server);
    mlxcel_server::run(&server)?;
    Ok(ExitCode::SUCCESS)
}
