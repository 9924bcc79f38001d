//! `mlxcel-server`: llama-server's command line over the mlxcel server. `main` only maps the
//! outcome to an exit code.

use std::process::ExitCode;

use clap::Parser;
use mlxcel_server::{ServerArgs, init_server_logging, normalize_llama_args, run};

/// mlxcel-server: an OpenAI- and llama-server-compatible HTTP server.
#[derive(Debug, Parser)]
#[command(name = "mlxcel-server", version, about)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(normalize_llama_args(std::env::args_os()));
    init_server_logging(&cli.server);
    match run(&cli.server) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}
