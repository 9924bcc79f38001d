//! Shared fixtures: one engine on the default model per test binary, servers on port 0, and a
//! small HTTP/1.1 client.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use mlxcel_engine::{Engine, EngineOptions};
use mlxcel_server::{AppState, Server, ServerConfig};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub fn skip_model_tests() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The default model, loaded once for every test of the binary.
pub fn engine() -> Arc<Engine> {
    static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            Arc::new(
                Engine::load(None, EngineOptions::default())
                    .expect("load the default model (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)"),
            )
        })
        .clone()
}

/// A server running in-process on a free port.
pub struct TestServer {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<()>,
}

impl TestServer {
    /// Starts a server over `engine` (none: the model is "loading").
    pub async fn start(config: ServerConfig, engine: Option<Arc<Engine>>) -> Self {
        let config = ServerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..config
        };
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr();
        let state = server.state().clone();
        if let Some(engine) = engine {
            state.set_engine(engine);
        }
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .run(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            addr,
            state,
            shutdown: Some(tx),
            task,
        }
    }

    /// Starts a server over the shared default-model engine.
    pub async fn with_model(config: ServerConfig) -> Self {
        let engine = tokio::task::spawn_blocking(engine).await.unwrap();
        Self::start(config, Some(engine)).await
    }

    /// Begins a graceful shutdown.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        send(self.addr, "GET", path, &[], None).await
    }

    pub async fn post(&self, path: &str, body: &str) -> Reply {
        send(self.addr, "POST", path, &[], Some(body)).await
    }

    pub async fn post_json(&self, path: &str, body: Value) -> Reply {
        self.post(path, &body.to_string()).await
    }

    /// Opens a streaming POST and returns the response with its body unread.
    pub async fn open(&self, path: &str, body: Value) -> Response<Incoming> {
        open(self.addr, "POST", path, &[], Some(&body.to_string())).await
    }
}

/// A whole response.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of an SSE body, `[DONE]` included.
    pub fn events(&self) -> Vec<String> {
        sse_events(&self.body)
    }

    /// Asserts the OpenAI error shape and returns the error object.
    pub fn error(&self, status: StatusCode) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let body = self.json();
        let error = body["error"].clone();
        for key in ["message", "type", "param", "code"] {
            assert!(error.get(key).is_some(), "missing {key}: {}", self.body);
        }
        error
    }

    /// The `error` object of a llama-server status route's error (`/health`, `/slots`):
    /// `code` is the HTTP status as a number, and there is no `param`.
    pub fn llama_error(&self, status: StatusCode) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let error = self.json()["error"].clone();
        assert_eq!(error["code"], status.as_u16(), "{}", self.body);
        assert!(
            error["message"].is_string() && error["type"].is_string(),
            "{}",
            self.body
        );
        assert!(error.get("param").is_none(), "{}", self.body);
        error
    }
}

/// The events of an SSE body whose events are named (Anthropic's, the Responses API's): each
/// `event:` name with its `data:` JSON.
pub fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or_else(|err| panic!("{err}: {d}"));
                }
            }
            (name, data)
        })
        .collect()
}

pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

pub async fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if body.is_some() {
        request = request.header("content-type", "application/json");
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .unwrap();
    sender.send_request(request).await.unwrap()
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let response = tokio::time::timeout(
        Duration::from_secs(120),
        open(addr, method, path, headers, body),
    )
    .await
    .expect("response within 120 s");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// Reads frames until one carries data, and returns it.
pub async fn next_chunk(response: &mut Response<Incoming>) -> Option<String> {
    loop {
        let frame = response.body_mut().frame().await?.ok()?;
        if let Ok(data) = frame.into_data() {
            return Some(String::from_utf8_lossy(&data).into_owned());
        }
    }
}

/// Polls `done` every 50 ms for up to `limit`.
pub async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

/// `args` parsed as mlxcel-server's command line (llama-server's spellings normalized first).
pub fn parse_server_args(args: &[&str]) -> Result<mlxcel_server::ServerArgs, clap::Error> {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        server: mlxcel_server::ServerArgs,
    }
    let argv = std::iter::once("mlxcel-server").chain(args.iter().copied());
    Cli::try_parse_from(mlxcel_server::normalize_llama_args(argv)).map(|c| c.server)
}
