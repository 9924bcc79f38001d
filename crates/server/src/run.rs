//! The whole server program, shared by `mlxcel serve` and `mlxcel-server`.

use std::sync::Arc;

use mlxcel_engine::Engine;

use crate::args::ServerArgs;
use crate::error::ServerError;
use crate::serve::{Server, shutdown_signal};

/// Logs to stderr: `info` by default, `debug` when `verbose`; `RUST_LOG` (tracing's filter syntax,
/// e.g. `RUST_LOG=mlxcel_engine=debug`) replaces either.
pub fn init_logging(verbose: bool) {
    init_logging_with(if verbose { "debug" } else { "info" }, true);
}

/// Logs to stderr under `RUST_LOG` when it is set, else under `default` (a filter such as
/// `warn,mlxcel_xla=info`); `timestamps` off gives short lines for a terminal session (level and
/// message only). The command-line tools call this once, first thing, so that `RUST_LOG` works in
/// every subcommand. A second call does nothing.
pub fn init_logging_with(default: &str, timestamps: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if timestamps {
        builder.try_init()
    } else {
        builder.without_time().with_target(false).try_init()
    };
}

/// Sets up logging under the flags (`-v`, `--log-disable`), then logs one warning line per
/// llama-server option that has no effect here.
pub fn init_server_logging(args: &ServerArgs) {
    if args.log_disable {
        init_logging_with("off", true);
    } else {
        init_logging(args.verbose);
    }
    for warning in &args.ignored.warnings {
        tracing::warn!("{warning}");
    }
}

/// Binds, loads the model in the background (`/health` is 503 meanwhile), and serves until
/// SIGINT or SIGTERM.
pub fn run(args: &ServerArgs) -> Result<(), ServerError> {
    let config = args.server_config()?;
    let options = args.engine_options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            context: "cannot start the async runtime".into(),
            source,
        })?;
    runtime.block_on(async {
        let server = Server::bind(config).await?;
        let state = server.state().clone();
        tracing::info!(
            addr = %server.local_addr(),
            auth = state.config().api_keys.required(),
            metrics = state.config().metrics,
            "listening on http://{}; loading the model",
            server.local_addr()
        );
        let model = args.model.clone();
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
        let loader_state = state.clone();
        tokio::task::spawn_blocking(move || match Engine::load(model.as_deref(), options) {
            Ok(engine) => {
                let info = engine.info();
                let buckets = loader_state.capacity_buckets(&engine);
                let capacities = if buckets.is_empty() {
                    "dynamic".to_owned()
                } else {
                    format!("{buckets:?}")
                };
                tracing::info!(
                    model = %loader_state.model_name(info),
                    features = %info.features,
                    path = %info.dir.display(),
                    backend = info.backend.as_str(),
                    window = info.window,
                    n_ctx = loader_state.context_limit(info),
                    parallel = loader_state.config().parallel,
                    capacities = %capacities,
                    "model loaded; ready"
                );
                loader_state.set_engine(Arc::new(engine));
            }
            Err(err) => {
                let _ = failed_tx.send(err);
            }
        });
        let mut load_error = None;
        let shutdown = async {
            tokio::select! {
                () = shutdown_signal() => {}
                Ok(err) = failed_rx => load_error = Some(err),
            }
        };
        server.run(shutdown).await?;
        match load_error {
            Some(err) => Err(ServerError::Engine(err)),
            None => Ok(()),
        }
    })
}
