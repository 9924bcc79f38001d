//! The `mlxcel` command line. Each subcommand lives in `commands/`; `main` only maps the outcome to
//! an exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod commands;

/// mlxcel: an LLM inference engine with MLX and OpenXLA backends.
#[derive(Debug, Parser)]
#[command(name = "mlxcel", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show which static context capacity a request gets on the OpenXLA backend.
    Capacity(commands::capacity::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Capacity(args) => commands::capacity::run(&args),
    };
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
