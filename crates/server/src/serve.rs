//! The transport: a TCP listener (with TLS when configured), HTTP/1.1 connections with
//! keep-alive, and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::routes::handle;
use crate::state::AppState;
use crate::tls::TlsFiles;

/// A bound server, not yet accepting. Built apart from `main` so tests can run it on port 0.
pub struct Server {
    /// One listener per address (`config.addr`, then `config.extra_addrs`).
    listeners: Vec<TcpListener>,
    /// With `config.tls`: the TLS handshake each connection starts with.
    tls: Option<TlsAcceptor>,
    state: Arc<AppState>,
}

/// Connections a listener queues before accepting them (tokio's own default).
const BACKLOG: u32 = 1024;

/// A listener on `addr`, with SO_REUSEADDR as tokio sets it and, with `reuse_port`
/// (`--reuse-port`), SO_REUSEPORT: other sockets may bind the same port and the system spreads
/// connections among them (Unix only).
fn listen(addr: SocketAddr, reuse_port: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    {
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(reuse_port)?;
    }
    #[cfg(not(unix))]
    if reuse_port {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "--reuse-port needs SO_REUSEPORT, which this system lacks",
        ));
    }
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listeners", &self.listeners)
            .field("tls", &self.tls.is_some())
            .field("state", &self.state)
            .finish()
    }
}

impl Server {
    /// Binds `config.addr` and each of `config.extra_addrs` (port 0 picks a free port). The
    /// model is set later with [`AppState::set_engine`]; until then `/health` answers 503.
    pub async fn bind(config: ServerConfig) -> Result<Self, ServerError> {
        // The certificate and key are read before anything listens: a bad file stops the start.
        let tls = config.tls.as_ref().map(TlsFiles::acceptor).transpose()?;
        let mut listeners = Vec::with_capacity(1 + config.extra_addrs.len());
        for addr in std::iter::once(config.addr).chain(config.extra_addrs.iter().copied()) {
            let listener = listen(addr, config.reuse_port).map_err(|source| ServerError::Io {
                context: format!("cannot listen on {addr}"),
                source,
            })?;
            listeners.push(listener);
        }
        let agent = crate::agent::Agent::start(&config.agent)
            .await
            .map_err(ServerError::Flag)?;
        if let Some(warning) = agent.warning(&config.agent) {
            tracing::warn!("{warning}");
        }
        let state = Arc::new(AppState::new(config));
        state.set_agent(Arc::new(agent));
        Ok(Self {
            listeners,
            tls,
            state,
        })
    }

    /// The first address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addrs()[0]
    }

    /// Every address actually bound, `config.addr`'s first.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        // A bound listener always has a local address.
        self.listeners
            .iter()
            .map(|l| {
                l.local_addr()
                    .expect("a bound TCP listener has a local address")
            })
            .collect()
    }

    /// The state handlers share (to set the engine, read metrics).
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Serves until `shutdown` resolves; then stops accepting, lets in-flight requests finish for
    /// up to `config.shutdown_timeout`, and cancels what remains (dropping a connection drops its
    /// response bodies, and each generation task cancels its engine request when its body goes).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        let Self {
            listeners,
            tls,
            state,
        } = self;
        let graceful = GracefulShutdown::new();
        let mut connections = JoinSet::new();
        let mut builder = http1::Builder::new();
        // Header names go out in title case (`Access-Control-Allow-Origin`), as llama-server
        // writes them: HTTP says names are case-insensitive, but clients that copy headers into
        // a plain map (llama.cpp's own server tests among them) look them up by that spelling.
        builder
            .keep_alive(true)
            .title_case_headers(true)
            .timer(TokioTimer::new())
            .header_read_timeout(state.config().header_timeout);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = accept_any(&listeners) => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(err) => {
                            // Per-connection failures (e.g. too many open files) must not end
                            // the server; back off briefly.
                            tracing::warn!(error = %err, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let limit = state.config().header_timeout;
                    let state = state.clone();
                    let service = service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(state, request).await) }
                    });
                    let Some(tls) = tls.clone() else {
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        let watched = graceful.watch(connection);
                        connections.spawn(async move {
                            if let Err(err) = watched.await {
                                tracing::debug!(%peer, error = %err, "connection ended with an error");
                            }
                        });
                        continue;
                    };
                    // The handshake runs in the connection's task, bounded as a client's headers
                    // are, so that a slow or silent client holds up no one else.
                    let (builder, watcher) = (builder.clone(), graceful.watcher());
                    connections.spawn(async move {
                        let stream = match tokio::time::timeout(limit, tls.accept(stream)).await {
                            Ok(Ok(stream)) => stream,
                            Ok(Err(err)) => {
                                tracing::debug!(%peer, error = %err, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        if let Err(err) = watcher.watch(connection).await {
                            tracing::debug!(%peer, error = %err, "connection ended with an error");
                        }
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                () = &mut shutdown => break,
            }
        }
        drop(listeners);
        // A `/tools` call waiting on a slow MCP tool would hold its connection open until the
        // deadline: the calls in flight are cancelled first, so that their requests end now.
        if let Some(agent) = state.agent() {
            agent.cancel();
        }
        let deadline = state.config().shutdown_timeout;
        tracing::info!(
            in_flight = state.active_requests().len(),
            deadline_s = deadline.as_secs_f64(),
            "shutting down: no new connections; waiting for in-flight requests"
        );
        tokio::select! {
            () = graceful.shutdown() => tracing::info!("all connections finished"),
            () = tokio::time::sleep(deadline) => {
                tracing::warn!(
                    in_flight = state.active_requests().len(),
                    "shutdown deadline reached; cancelling the remaining requests"
                );
            }
        }
        connections.shutdown().await;
        // MCP servers and a tools container this server started end with it.
        if let Some(agent) = state.agent() {
            agent.shutdown().await;
        }
        // Generation tasks notice their closed bodies and cancel; give them a moment to do so.
        for _ in 0..100 {
            if state.active_requests().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// The next connection on any of `listeners`.
async fn accept_any(
    listeners: &[TcpListener],
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    std::future::poll_fn(|cx| {
        for listener in listeners {
            if let std::task::Poll::Ready(accepted) = listener.poll_accept(cx) {
                return std::task::Poll::Ready(accepted);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

/// The server's async runtime (one per process: the single-model server's or the router's).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, ServerError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| ServerError::Io {
            context: "cannot start the async runtime".into(),
            source,
        })
}
