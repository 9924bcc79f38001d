//! The whole server program, shared by `mlxcel serve` and `mlxcel-server`.

use std::sync::Arc;

use mlxcel_engine::{Engine, EngineOptions};

use crate::args::ServerArgs;
use crate::error::ServerError;
use crate::logging::{init_logging_to, open_log_file};
use crate::serve::{Server, shutdown_signal};

/// Sets up logging under the flags (`-v`, `--log-disable`, `--log-format`), then logs one warning line per
/// llama-server option that has no effect here.
pub fn init_server_logging(args: &ServerArgs) {
    let filter = match (args.log_disable, args.verbose) {
        (true, _) => "off",
        (false, true) => "debug",
        (false, false) => "info",
    };
    // A file that cannot be opened is reported by `run` (ServerArgs::server_config), which
    // stops the server naming it; until then the log goes to stderr alone.
    let file = args
        .log_file
        .as_deref()
        .and_then(|path| open_log_file(path).ok());
    // `--log-jsonl`, as llama-server: JSON lines on stdout.
    let jsonl = args.log_jsonl && !args.no_log_jsonl;
    let format = if jsonl {
        crate::logging::LogFormat::Json
    } else {
        args.log_format
    };
    init_logging_to(filter, format, jsonl, file);
    for warning in &args.ignored.warnings {
        tracing::warn!("{warning}");
    }
}

/// Returns once the loaded engine reports its backend down (a pipeline that lost a rank), with
/// the reason; checked four times a second.
async fn pipeline_down(state: &crate::state::AppState) -> String {
    loop {
        if let Ok(engine) = state.engine()
            && let Some(fault) = engine.metrics().backend_fault
        {
            return fault;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Binds, loads the model in the background (`/health` is 503 meanwhile), and serves until
/// SIGINT or SIGTERM.
pub fn run(args: &ServerArgs) -> Result<(), ServerError> {
    let args = args.with_downloads()?;
    run_with(&args, args.engine_options()?)
}

/// [`run`] with the engine loaded under `options` (the flags' own, with what the caller adds:
/// `mlxcel serve`'s pipeline).
pub fn run_with(args: &ServerArgs, options: EngineOptions) -> Result<(), ServerError> {
    if args.router.enabled() {
        return crate::router::start::run(args);
    }
    let config = args.server_config()?;
    let runtime = crate::serve::runtime()?;
    runtime.block_on(async {
        let server = Server::bind(config).await?;
        let state = server.state().clone();
        let urls: Vec<String> = server
            .local_addrs()
            .iter()
            .map(|addr| format!("http://{addr}"))
            .collect();
        tracing::info!(
            addr = %server.local_addr(),
            auth = state.config().api_keys.required(),
            metrics = state.config().metrics,
            "listening on {}; loading the model",
            urls.join(", ")
        );
        let exit_on_failure = options.pipeline.as_ref().is_some_and(|p| p.exit_on_failure);
        let model = args.model.clone();
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
        let loader_state = state.clone();
        tokio::task::spawn_blocking(move || match Engine::load(model.as_deref(), options) {
            // `--logit-bias` names token ids: one outside the vocabulary stops the server.
            Ok(engine)
                if let Some(&(token, _)) = loader_state
                    .config()
                    .sampling_chain
                    .logit_bias
                    .iter()
                    .find(|(t, _)| *t as usize >= engine.info().vocab_size) =>
            {
                let _ = failed_tx.send(mlxcel_engine::EngineError::InvalidSampling {
                    field: "--logit-bias",
                    value: token.to_string(),
                    expected: "a token id of the model's vocabulary",
                });
            }
            // `--reranking` needs a reranker: another model stops the server at start.
            Ok(engine)
                if loader_state.config().reranking
                    && let Err(err) = crate::protocols::rerank::can_rerank(&engine) =>
            {
                let _ = failed_tx.send(err);
            }
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
        let watched = state.clone();
        let shutdown = async {
            tokio::select! {
                () = shutdown_signal() => {}
                Ok(err) = failed_rx => load_error = Some(err),
                fault = pipeline_down(&watched), if exit_on_failure => {
                    tracing::error!(%fault, "the pipeline is down; exiting (--pipeline-exit-on-failure)");
                    load_error = Some(mlxcel_engine::EngineError::backend("mlx", fault));
                }
            }
        };
        server.run(shutdown).await?;
        match load_error {
            Some(err) => Err(ServerError::Engine(err)),
            None => Ok(()),
        }
    })
}
