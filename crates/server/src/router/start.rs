//! Starting a server in router mode: the catalog is read (a bad preset stops the server with
//! its line), the listener bound, and no model loaded until a request or `POST /models/load`
//! asks for one.

use std::ffi::OsString;
use std::sync::Arc;

use crate::args::ServerArgs;
use crate::error::ServerError;
use crate::router::catalog;
use crate::router::http::Router;
use crate::router::registry::{Loader, Registry, Rescan};
use crate::serve::{Server, shutdown_signal};
use crate::state::AppState;

/// The router over `args`' models, for a state already bound (`argv`: the server's own
/// arguments, which a model's preset options are read over).
pub fn router(args: &ServerArgs, argv: Vec<OsString>) -> Result<Arc<Router>, ServerError> {
    if args.model.is_some() {
        return Err(ServerError::Flag(
            "-m/--model names the one model of a single-model server; with --models-dir or \
             --models-preset, list the model there instead"
                .into(),
        ));
    }
    let dir = args.router.models_dir.clone();
    let preset = args.router.models_preset.clone();
    let specs = catalog::load(dir.as_deref(), preset.as_deref()).map_err(ServerError::Flag)?;
    tracing::info!(
        models = specs.len(),
        max = args.router.models_max,
        autoload = args.router.autoload(),
        "router mode: {}",
        specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let base = args.clone();
    let loader: Loader<AppState> = Arc::new(move |spec| {
        if crate::router::http::fake_timing() {
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
        crate::router::child::load(&base, &argv, spec)
    });
    let rescan: Rescan = Box::new(move || catalog::load(dir.as_deref(), preset.as_deref()));
    Ok(Registry::with_settings(
        specs,
        args.router.models_max,
        args.router.autoload(),
        Some(rescan),
        loader,
    ))
}

/// The server's own arguments on this process's command line (after `serve` for `mlxcel
/// serve`).
fn own_argv() -> Vec<OsString> {
    let mut argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    if argv.first().is_some_and(|a| a == "serve") {
        argv.remove(0);
    }
    argv
}

/// The router program: binds, serves every model of the catalog, until SIGINT or SIGTERM.
pub fn run(args: &ServerArgs) -> Result<(), ServerError> {
    let config = args.server_config()?;
    let runtime = crate::serve::runtime()?;
    runtime.block_on(async {
        let router = router(args, own_argv())?;
        let server = Server::bind(config).await?;
        server.state().set_router(router.clone());
        tracing::info!(addr = %server.local_addr(), "listening; router mode");
        server
            .run(async move {
                shutdown_signal().await;
                router.close();
            })
            .await
    })
}
