//! `mlxcel serve`: the HTTP server (OpenAI and llama-server routes), with llama-server's flags.

use std::process::ExitCode;

use anyhow::Result;
use mlxcel_server::{ServerArgs, init_server_logging};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    server: ServerArgs,

    #[command(flatten)]
    pipeline: super::pipeline::PipelineArgs,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let mut server = args.server.clone();
    // Like the other subcommands, `serve` takes its model from MLXCEL_MODEL when neither -m nor
    // LLAMA_ARG_MODEL names one.
    if server.model.is_none() && !server.download.any() {
        server.model = std::env::var("MLXCEL_MODEL").ok().filter(|m| !m.is_empty());
    }
    init_server_logging(&server);
    // `-hf`, `-mu`, `-dr`, `-hfd`: fetched now, then loaded as `-m` and `--spec-draft-model`.
    let server = server.with_downloads()?;
    let mut options = server.engine_options()?;
    // A stage worker (pipeline rank > 0) serves no HTTP: it runs until rank 0 stops.
    if args.pipeline.join(server.model.as_deref(), &mut options)? {
        return Ok(ExitCode::SUCCESS);
    }
    mlxcel_server::run_with(&server, options)?;
    Ok(ExitCode::SUCCESS)
}
