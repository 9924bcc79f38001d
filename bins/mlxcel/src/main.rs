//! The `mlxcel` command line. Each subcommand lives in `commands/`; `main` only maps the outcome to
//! an exit code.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod commands;
mod progress;
mod spellings;

/// mlxcel: an LLM inference engine with MLX and OpenXLA backends.
#[derive(Debug, Parser)]
#[command(name = "mlxcel", version, about, after_help = VERBS_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How `mlxcel --help` places the habits of other tools, after mlxcel's own subcommands.
const VERBS_HELP: &str = "\
The last four subcommands are ollama's verbs (run, list, rm, show). generate and run also take
llama-cli's, llama-completion's and mlx_lm's spellings of their flags (-sys, -cnv, -no-cnv, -i,
-f, -c, -t, -r, -e, --color, --max-tokens, --system-prompt, --prompt - ...): see
`mlxcel generate --help` and docs/cli.md.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure prompt and generation throughput (llama-bench's table).
    Bench(commands::bench::Args),
    /// Show which static context capacity a request gets on the OpenXLA backend.
    Capacity(commands::capacity::Args),
    /// Convert a GGUF file (F32/F16/BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, Q2_K..Q6_K) into an MLX checkpoint.
    Convert(commands::convert::Args),
    /// Generate text from a prompt, or chat interactively without one.
    // Boxed: it carries every sampler flag of llama.cpp's.
    Generate(Box<commands::generate::Args>),
    /// Measure a text's perplexity under the model (llama-perplexity's method and output).
    Perplexity(commands::perplexity::Args),
    /// Install the default model (or prepare a GGUF) into the cache and print its directory.
    Pull(commands::pull::Args),
    /// Serve the model over HTTP (OpenAI and llama-server routes).
    // Boxed: llama-server's flags (CORS included) make it far larger than the other commands.
    Serve(Box<commands::serve::Args>),
    /// Print the token ids of a text.
    Tokenize(commands::tokenize::Args),
    /// (ollama) Answer PROMPT with MODEL, or chat with it without one.
    #[command(display_order = 100)]
    // Boxed: it carries every flag of `generate`.
    Run(Box<commands::run::Args>),
    /// (ollama) The models in the cache: name, id, size, path.
    #[command(display_order = 101)]
    List(commands::list::Args),
    /// (ollama) Remove a model from the cache (never a file outside it).
    #[command(display_order = 102)]
    Rm(commands::rm::Args),
    /// (ollama) A model's family, parameters, quantization, context length and chat template.
    #[command(display_order = 103)]
    Show(commands::show::Args),
}

/// Parses the command line after [`spellings::normalize`]; an option of llama.cpp's tools that
/// mlxcel lacks is refused naming it and what to use instead.
fn parse() -> Cli {
    match Cli::try_parse_from(spellings::normalize(std::env::args_os())) {
        Ok(cli) => cli,
        Err(err) => match spellings::explain(&err) {
            Some(text) => {
                eprintln!("error: {text}");
                std::process::exit(2);
            }
            None => err.exit(),
        },
    }
}

/// What the subcommands other than `serve` log when `RUST_LOG` is unset.
const CLI_LOG_FILTER: &str = "warn,mlxcel_xla=info";

fn main() -> ExitCode {
    let cli = parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // Warnings, plus the first-run progress the OpenXLA backend reports (each capacity it
        // compiles, with its time); `serve` sets up its own logging from its --verbose flag.
        mlxcel_server::init_logging_with(CLI_LOG_FILTER, false);
    }
    let outcome = match cli.command {
        Command::Bench(args) => commands::bench::run(&args),
        Command::Capacity(args) => commands::capacity::run(&args),
        Command::Convert(args) => commands::convert::run(&args),
        Command::Generate(args) => commands::generate::run(&args),
        Command::Perplexity(args) => commands::perplexity::run(&args),
        Command::Pull(args) => commands::pull::run(&args),
        Command::Serve(args) => commands::serve::run(&args),
        Command::Tokenize(args) => commands::tokenize::run(&args),
        Command::Run(args) => commands::run::run(&args),
        Command::List(args) => commands::list::run(&args),
        Command::Rm(args) => commands::rm::run(&args),
        Command::Show(args) => commands::show::run(&args),
    };
    match outcome {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: ` apart, leaving out a cause whose text its parent already ends
/// with (an engine error shows its backend's error and also keeps it as its source).
fn describe(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    let mut parent = text.clone();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !parent.ends_with(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        parent = cause;
    }
    text
}

#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod habits_tests;
