//! One loaded model of a router: its own engine and its own server state (slots, metrics,
//! settings), built from the server's options with the model's preset options over them. Every
//! engine takes the server's `--threads` budget; they run in this process.

use std::ffi::OsString;
use std::sync::Arc;

use clap::Parser;
use mlxcel_engine::Engine;

use crate::args::ServerArgs;
use crate::llama_flags::normalize_llama_args;
use crate::router::catalog::ModelSpec;
use crate::state::AppState;

/// The server's command line again, so that a model's preset options can be read over it (the
/// later spelling of an option wins).
#[derive(Debug, Parser)]
#[command(name = "mlxcel-server", args_override_self = true)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
}

/// The options `spec` runs under: the server's (`base`, parsed from `argv`, the server's own
/// arguments without the program name), then the preset's.
pub fn model_args(
    base: &ServerArgs,
    argv: &[OsString],
    spec: &ModelSpec,
) -> Result<ServerArgs, String> {
    let mut args = if spec.args.is_empty() {
        base.clone()
    } else {
        let mut line: Vec<OsString> = vec!["mlxcel-server".into()];
        line.extend(argv.iter().cloned());
        line.extend(spec.args.iter().map(OsString::from));
        Cli::try_parse_from(normalize_llama_args(line))
            .map_err(|err| format!("the options of `{}`: {}", spec.name, err.render()))?
            .server
    };
    args.model = Some(spec.path.to_string_lossy().into_owned());
    args.alias = vec![spec.name.clone()];
    args.router = Default::default();
    Ok(args)
}

/// Loads `spec`'s engine and builds its state (on a blocking thread: it reads the weights).
pub fn load(base: &ServerArgs, argv: &[OsString], spec: &ModelSpec) -> Result<AppState, String> {
    let args = model_args(base, argv, spec)?;
    let options = args.engine_options().map_err(|e| e.to_string())?;
    let config = args.server_config().map_err(|e| e.to_string())?;
    let engine = Engine::load(args.model.as_deref(), options).map_err(|e| e.to_string())?;
    let state = AppState::new(config);
    state.set_engine(Arc::new(engine));
    Ok(state)
}
