//! MCP servers (`--mcp-servers-config FILE`, `--mcp-servers-json JSON`, Cursor's format:
//! `{"mcpServers": {"<name>": {"command", "args", "env", "cwd", "timeout_ms"}}}`), as
//! llama-server runs them: stdio servers only, each a child process speaking newline-delimited
//! JSON-RPC 2.0 (protocol 2024-11-05). At start each server is spawned once, its tools listed
//! (10 s at most per server) and stopped; a call spawns it again on demand and keeps it; a server
//! that dies is started again on the next call, one that fails to start is left alone for 5 s.
//! Its tools appear in `/tools` as `<server>_<tool>`. Shutdown first cancels the calls in flight
//! (each answers `cancelled` within 100 ms, so that their requests end and the server's graceful
//! shutdown does not wait on a slow tool), then ends every child.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Mutex, mpsc};

const PROTOCOL_VERSION: &str = "2024-11-05";
const COOLDOWN: Duration = Duration::from_secs(5);
/// How long a server has to exit once its stdin is closed before its process group is killed.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// The same at the server's shutdown, which must not wait on a server busy in a call (a stdio
/// server reads its closed stdin only between calls).
const SHUTDOWN_GRACE: Duration = Duration::from_millis(200);
const WARMUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Replies and notifications buffered between calls.
const QUEUE: usize = 65536;
/// The tail of a child's stderr kept for messages.
const ERR_TAIL: usize = 4096;

/// One configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Set over the server's inherited environment.
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    /// Per-call timeout.
    pub timeout_ms: u64,
}

/// A tool one server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub server: String,
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// The servers of one JSON document; a missing `mcpServers` is none, an entry without a
/// `command` is skipped with a warning, a mistyped field is an error naming it.
pub fn parse_configs(text: &str) -> Result<Vec<ServerConfig>, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let Some(servers) = doc.get("mcpServers").and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (name, cfg) in servers {
        let text_field = |key: &str| -> Result<String, String> {
            match cfg.get(key) {
                None => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(format!("mcpServers.{name}.{key} must be a string")),
            }
        };
        let mut server = ServerConfig {
            name: name.clone(),
            command: text_field("command")?,
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: text_field("cwd")?,
            timeout_ms: 30_000,
        };
        if let Some(t) = cfg.get("timeout_ms") {
            server.timeout_ms = t.as_u64().ok_or_else(|| {
                format!("mcpServers.{name}.timeout_ms must be a positive integer")
            })?;
        }
        if let Some(args) = cfg.get("args").and_then(Value::as_array) {
            for a in args {
                let a = a
                    .as_str()
                    .ok_or_else(|| format!("mcpServers.{name}.args must hold strings"))?;
                server.args.push(a.to_owned());
            }
        }
        if let Some(env) = cfg.get("env").and_then(Value::as_object) {
            for (k, v) in env {
                let v = v
                    .as_str()
                    .ok_or_else(|| format!("mcpServers.{name}.env.{k} must be a string"))?;
                server.env.insert(k.clone(), v.to_owned());
            }
        }
        if server.command.is_empty() {
            tracing::warn!("MCP server '{name}' has no command, skipping");
            continue;
        }
        out.push(server);
    }
    Ok(out)
}

/// The JSON-RPC session with one running server.
#[derive(Debug)]
struct Session {
    stdin: ChildStdin,
    replies: mpsc::Receiver<String>,
    next_id: u64,
    initialized: bool,
    tools: Vec<ToolDef>,
}

/// One running server.
#[derive(Debug)]
struct Transport {
    config: ServerConfig,
    child: std::sync::Mutex<Option<Child>>,
    session: Mutex<Session>,
    alive: Arc<AtomicBool>,
    err_tail: Arc<std::sync::Mutex<String>>,
}

/// An error reply of ours, as llama-server makes them.
fn rpc_error(message: &str) -> Value {
    json!({ "error": { "code": -32603, "message": message } })
}

fn rpc_error_message(reply: &Value) -> String {
    match reply.get("error") {
        Some(Value::Object(e)) => e
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("unknown error")
            .to_owned(),
        Some(Value::String(s)) => s.clone(),
        _ => "unknown error".into(),
    }
}

/// A `tools/call` result as `/tools` answers it: the text parts joined by newlines, or the
/// error an `isError` result carries.
pub fn call_result(result: &Value) -> Value {
    let text = result
        .get("content")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .map(|p| p.get("text").and_then(Value::as_str).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default();
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let message = if text.is_empty() {
            "MCP tool returned an error".to_owned()
        } else {
            text
        };
        return json!({ "error": message });
    }
    json!({ "plain_text_response": text })
}

impl Transport {
    /// Spawns the server (in its own process group, so that shutdown reaches what it starts).
    fn start(config: &ServerConfig) -> Result<Arc<Transport>, String> {
        let mut command = Command::new(&config.command);
        command
            .args(&config.args)
            .envs(&config.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if !config.cwd.is_empty() {
            command.current_dir(&config.cwd);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("failed to spawn '{}': {e}", config.command))?;
        let (stdin, stdout, stderr) =
            match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
                (Some(a), Some(b), Some(c)) => (a, b, c),
                _ => return Err("no pipes to the child".into()),
            };
        let alive = Arc::new(AtomicBool::new(true));
        let err_tail = Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, replies) = mpsc::channel(QUEUE);
        {
            let alive = alive.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.trim().is_empty() {
                        continue;
                    }
                    // A full queue drops the frame (a flood of notifications).
                    let _ = tx.try_send(line);
                }
                alive.store(false, Ordering::SeqCst);
            });
        }
        {
            let (name, tail) = (config.name.clone(), err_tail.clone());
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!("MCP '{name}' stderr: {line}");
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.push_str(&line);
                    t.push('\n');
                    if t.len() > ERR_TAIL {
                        let cut = t.len() - ERR_TAIL;
                        let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(0);
                        t.drain(..cut);
                    }
                }
            });
        }
        Ok(Arc::new(Transport {
            config: config.clone(),
            child: std::sync::Mutex::new(Some(child)),
            session: Mutex::new(Session {
                stdin,
                replies,
                next_id: 1,
                initialized: false,
                tools: Vec::new(),
            }),
            alive,
            err_tail,
        }))
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn diagnostics(&self) -> String {
        self.err_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .trim()
            .to_owned()
    }

    /// Sends `request` and waits for the reply with its id (none for a notification) until the
    /// per-call timeout, `deadline`, or `stop`.
    async fn send_rpc(
        &self,
        session: &mut Session,
        request: Value,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> Value {
        let mut line = request.to_string();
        line.push('\n');
        if session.stdin.write_all(line.as_bytes()).await.is_err()
            || session.stdin.flush().await.is_err()
        {
            return rpc_error("transport closed");
        }
        let Some(id) = request.get("id").cloned() else {
            return json!({});
        };
        let deadline = deadline.min(Instant::now() + Duration::from_millis(self.config.timeout_ms));
        loop {
            if stop.load(Ordering::SeqCst) {
                return rpc_error("cancelled");
            }
            let now = Instant::now();
            if now >= deadline {
                return rpc_error("request timed out");
            }
            let wait = (deadline - now).min(Duration::from_millis(100));
            match tokio::time::timeout(wait, session.replies.recv()).await {
                Err(_) => continue,
                Ok(None) => return rpc_error("transport closed"),
                Ok(Some(frame)) => {
                    let Ok(reply) = serde_json::from_str::<Value>(&frame) else {
                        continue;
                    };
                    if reply.get("id") == Some(&id) {
                        return reply;
                    }
                }
            }
        }
    }

    async fn ensure_init(
        &self,
        session: &mut Session,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> Result<(), String> {
        if session.initialized {
            return Ok(());
        }
        let id = session.next_id;
        session.next_id += 1;
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "mlxcel", "version": env!("CARGO_PKG_VERSION") },
            },
        });
        let reply = self.send_rpc(session, request, deadline, stop).await;
        if reply.get("result").is_none() {
            return Err(format!("initialize failed: {}", rpc_error_message(&reply)));
        }
        let note = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        self.send_rpc(session, note, deadline, stop).await;
        session.initialized = true;
        Ok(())
    }

    async fn list_tools(
        &self,
        deadline: Instant,
        stop: &AtomicBool,
    ) -> Result<Vec<ToolDef>, String> {
        let mut session = self.session.lock().await;
        self.ensure_init(&mut session, deadline, stop).await?;
        if !session.tools.is_empty() {
            return Ok(session.tools.clone());
        }
        let id = session.next_id;
        session.next_id += 1;
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/list" });
        let reply = self.send_rpc(&mut session, request, deadline, stop).await;
        let Some(result) = reply.get("result") else {
            return Err(format!("tools/list failed: {}", rpc_error_message(&reply)));
        };
        let tools: Vec<ToolDef> = result
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|t| ToolDef {
                server: self.config.name.clone(),
                name: t
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                description: t
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                input_schema: t.get("inputSchema").cloned().unwrap_or(Value::Null),
            })
            .collect();
        session.tools = tools.clone();
        Ok(tools)
    }

    async fn call_tool(&self, tool: &str, arguments: &Value, stop: &AtomicBool) -> Value {
        let deadline = Instant::now() + Duration::from_millis(self.config.timeout_ms);
        let mut session = self.session.lock().await;
        if let Err(e) = self.ensure_init(&mut session, deadline, stop).await {
            return json!({ "error": e });
        }
        let id = session.next_id;
        session.next_id += 1;
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "name": tool, "arguments": arguments },
        });
        let reply = self.send_rpc(&mut session, request, deadline, stop).await;
        if reply.get("error").is_some() {
            return json!({ "error": rpc_error_message(&reply) });
        }
        match reply.get("result") {
            Some(result) => call_result(result),
            None => json!({ "error": "invalid response from MCP server" }),
        }
    }

    /// Ends the server: stdin closed, `grace` to exit, then its process group killed.
    async fn close(&self, grace: Duration) {
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut child) = child else {
            return;
        };
        // Closing stdin asks a stdio server to exit; a session mid-call holds it, so only try.
        if let Ok(mut session) = self.session.try_lock() {
            let _ = session.stdin.shutdown().await;
        }
        let pid = child.id();
        if tokio::time::timeout(grace, child.wait()).await.is_err() {
            let _ = child.start_kill();
        }
        if let Some(pid) = pid {
            // What the server started (it led its own process group) ends with it.
            super::process::kill_group(pid);
        }
        let _ = child.wait().await;
        self.alive.store(false, Ordering::SeqCst);
    }
}

/// Every configured server and their tools.
#[derive(Debug, Default)]
pub struct Manager {
    configs: Vec<ServerConfig>,
    registry: Vec<ToolDef>,
    transports: std::sync::Mutex<HashMap<String, Arc<Transport>>>,
    dead: std::sync::Mutex<HashMap<String, Instant>>,
    stopping: AtomicBool,
}

impl Manager {
    /// Reads the configuration (the file, then the inline JSON; a name seen twice keeps its
    /// first definition) and discovers each server's tools. A configuration that cannot be read
    /// or parsed is an error; a server that does not start is logged and offers no tools.
    pub async fn start(file: Option<&Path>, inline: Option<&str>) -> Result<Self, String> {
        let mut manager = Manager::default();
        let mut sources = Vec::new();
        if let Some(file) = file {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("failed to open MCP config file: {}: {e}", file.display()))?;
            sources.push(text);
        }
        if let Some(inline) = inline {
            sources.push(inline.to_owned());
        }
        for text in sources {
            let parsed = parse_configs(&text)
                .map_err(|e| format!("failed to parse MCP config JSON: {e}"))?;
            if parsed.is_empty() {
                tracing::warn!("MCP config: no servers found in JSON");
            }
            for p in parsed {
                if manager.configs.iter().any(|c| c.name == p.name) {
                    tracing::warn!("MCP config: duplicate server name '{}', skipping", p.name);
                    continue;
                }
                manager.configs.push(p);
            }
        }
        for cfg in &manager.configs {
            let transport = match Transport::start(cfg) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!("MCP warmup: failed to spawn '{}': {e}", cfg.name);
                    continue;
                }
            };
            let deadline = Instant::now() + WARMUP_TIMEOUT;
            match transport.list_tools(deadline, &manager.stopping).await {
                Ok(tools) => {
                    tracing::info!(
                        "MCP warmup: '{}' discovered {} tools",
                        cfg.name,
                        tools.len()
                    );
                    manager.registry.extend(tools);
                }
                Err(e) => tracing::warn!(
                    "MCP warmup: '{}' discovered 0 tools: {e} {}",
                    cfg.name,
                    transport.diagnostics()
                ),
            }
            transport.close(CLOSE_GRACE).await;
        }
        Ok(manager)
    }

    /// Whether any server is configured.
    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// The tools discovered at start.
    pub fn tools(&self) -> &[ToolDef] {
        &self.registry
    }

    /// Calls `tool` of `server`, starting the server when it is not running.
    pub async fn call_tool(&self, server: &str, tool: &str, arguments: &Value) -> Value {
        let Some(transport) = self.get_or_create(server).await else {
            return json!({ "error": format!("MCP server unavailable: {server}") });
        };
        transport.call_tool(tool, arguments, &self.stopping).await
    }

    async fn get_or_create(&self, name: &str) -> Option<Arc<Transport>> {
        if self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let now = Instant::now();
        {
            let mut dead = self.dead.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(&until) = dead.get(name) {
                if now < until {
                    return None;
                }
                dead.remove(name);
            }
        }
        let stale = {
            let mut transports = self.transports.lock().unwrap_or_else(|e| e.into_inner());
            match transports.get(name) {
                Some(t) if t.is_alive() => return Some(t.clone()),
                Some(_) => transports.remove(name),
                None => None,
            }
        };
        if let Some(stale) = stale {
            tracing::warn!("MCP '{name}' is no longer alive: {}", stale.diagnostics());
            stale.close(CLOSE_GRACE).await;
        }
        let cfg = self.configs.iter().find(|c| c.name == name)?;
        match Transport::start(cfg) {
            Ok(fresh) => {
                // A concurrent call may have started one first: use it, close ours.
                let existing = {
                    let mut transports = self.transports.lock().unwrap_or_else(|e| e.into_inner());
                    match transports.get(name) {
                        Some(t) if t.is_alive() => Some(t.clone()),
                        _ => {
                            transports.insert(name.to_owned(), fresh.clone());
                            None
                        }
                    }
                };
                if let Some(t) = existing {
                    fresh.close(CLOSE_GRACE).await;
                    return Some(t);
                }
                Some(fresh)
            }
            Err(e) => {
                tracing::warn!("MCP '{name}': failed to start: {e}");
                self.dead
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.to_owned(), now + COOLDOWN);
                None
            }
        }
    }

    /// Cancels the calls in flight (each returns `cancelled` within 100 ms) and refuses new
    /// ones; the servers keep running until [`Manager::shutdown`].
    pub fn cancel(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Cancels calls in flight and ends every running server, all at once.
    pub async fn shutdown(&self) {
        self.cancel();
        let all: Vec<_> = self
            .transports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, t)| t)
            .collect();
        let mut closing = tokio::task::JoinSet::new();
        for t in all {
            closing.spawn(async move { t.close(SHUTDOWN_GRACE).await });
        }
        while closing.join_next().await.is_some() {}
    }
}

#[cfg(test)]
#[path = "mcp_tests.rs"]
mod tests;
