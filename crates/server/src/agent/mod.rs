//! llama-server's agent features, off by default: the built-in tools (`--tools`, run where
//! `--tools-runtime` says), MCP servers' tools (`--mcp-servers-config`, `--mcp-servers-json`),
//! both behind `GET`/`POST /tools`, and the CORS proxy (`--ui-mcp-proxy`) at `/cors-proxy`;
//! `-ag/--agent` turns on every built-in tool and the proxy. A route whose feature is off answers
//! 403 `feature_disabled`, as llama-server. These let whoever can reach the server read, write
//! and run anything the server's user can: docs/server.md "Agent tools, MCP and the CORS proxy".

pub mod args;
mod builtin;
mod edit;
mod glob;
mod io;
pub mod mcp;
mod process;
pub mod proxy;
mod reply;
mod runtime;

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Method, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::body::{Body, full};

pub use reply::{disabled, llama_error};

use builtin::ToolError;
use runtime::{OwnedContainer, Spec};

/// The agent settings of the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentConfig {
    /// `--tools` (`all` or names); `-ag` makes it `["all"]`.
    pub tools: Vec<String>,
    /// `--tools-runtime`.
    pub runtime: Option<String>,
    /// `--mcp-servers-config`.
    pub mcp_config: Option<PathBuf>,
    /// `--mcp-servers-json`.
    pub mcp_json: Option<String>,
    /// `--ui-mcp-proxy` (or `-ag`): `/cors-proxy` answers.
    pub proxy: bool,
}

impl AgentConfig {
    /// Built-in tools or MCP servers are on: CORS narrows to local origins unless
    /// `--cors-origins` says otherwise.
    pub fn tools_or_mcp(&self) -> bool {
        !self.tools.is_empty() || self.mcp_config.is_some() || self.mcp_json.is_some()
    }
}

/// Where every call runs unless its `X-Tool-Runtime` names another place.
#[derive(Debug)]
enum ServerRuntime {
    Owned(OwnedContainer),
    Static(String),
}

/// One tool of `/tools`.
#[derive(Debug, Clone)]
enum Tool {
    Builtin(&'static str),
    Mcp(mcp::ToolDef),
}

impl Tool {
    fn name(&self) -> String {
        match self {
            Tool::Builtin(name) => (*name).to_owned(),
            Tool::Mcp(def) => format!("{}_{}", def.server, def.name),
        }
    }

    /// Its entry in `GET /tools`.
    fn to_json(&self) -> Value {
        match self {
            Tool::Builtin(name) => {
                let meta = builtin::meta(name);
                json!({
                    "display_name": meta.display_name,
                    "tool": name,
                    "type": "server",
                    "permissions": { "write": meta.write },
                    "uses_cwd": true,
                    "definition": builtin::definition(name),
                })
            }
            Tool::Mcp(def) => {
                let name = self.name();
                let schema = if def.input_schema.is_object() {
                    def.input_schema.clone()
                } else {
                    json!({})
                };
                json!({
                    "display_name": name,
                    "tool": name,
                    "type": "mcp",
                    "permissions": { "write": false },
                    "uses_cwd": false,
                    "definition": {
                        "type": "function",
                        "function": { "name": name, "description": def.description, "parameters": schema },
                    },
                })
            }
        }
    }
}

/// The running agent features.
#[derive(Debug, Default)]
pub struct Agent {
    /// `/tools` answers (built-in tools or MCP servers configured).
    tools_on: bool,
    proxy: bool,
    tools: Vec<Tool>,
    runtime: Option<ServerRuntime>,
    mcp: Option<mcp::Manager>,
}

impl Agent {
    /// Starts what `config` asks for: checks the tool names, starts or checks the runtime,
    /// discovers the MCP servers' tools. Every refusal names the flag.
    pub async fn start(config: &AgentConfig) -> Result<Agent, String> {
        let mut agent = Agent {
            proxy: config.proxy,
            ..Agent::default()
        };
        let mcp = if config.mcp_config.is_some() || config.mcp_json.is_some() {
            let manager =
                mcp::Manager::start(config.mcp_config.as_deref(), config.mcp_json.as_deref())
                    .await
                    .map_err(|e| format!("MCP starting failed: {e}"))?;
            (!manager.is_empty()).then_some(manager)
        } else {
            None
        };
        agent.tools_on = !config.tools.is_empty() || mcp.is_some();
        if !agent.tools_on {
            if config.runtime.is_some() {
                tracing::warn!(
                    "--tools-runtime has no effect without --tools (or -ag) or MCP servers"
                );
            }
            return Ok(agent);
        }
        if let Some(spec) = &config.runtime {
            agent.runtime = Some(
                match runtime::parse(spec).map_err(|e| format!("--tools-runtime: {e}"))? {
                    Spec::Spawn { engine, image } => {
                        let owned = tokio::task::spawn_blocking(move || {
                            OwnedContainer::start(&engine, &image)
                        })
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("--tools-runtime: {e}"))?;
                        ServerRuntime::Owned(owned)
                    }
                    Spec::Attach(_) => ServerRuntime::Static(spec.clone()),
                },
            );
        }
        for name in &config.tools {
            if name != "all" && !builtin::NAMES.contains(&name.as_str()) {
                return Err(format!(
                    "--tools: unknown tool \"{name}\". available tools: {}",
                    builtin::NAMES.join(", ")
                ));
            }
        }
        let all = config.tools.iter().any(|t| t == "all");
        for name in builtin::NAMES {
            if all || config.tools.iter().any(|t| t == name) {
                agent.tools.push(Tool::Builtin(name));
            }
        }
        if let Some(manager) = &mcp {
            let mut added = 0;
            for def in manager.tools() {
                let tool = Tool::Mcp(def.clone());
                let name = tool.name();
                if agent.tools.iter().any(|t| t.name() == name) {
                    tracing::warn!(
                        "MCP tool \"{name}\" from server \"{}\" collides with an existing tool, skipping",
                        def.server
                    );
                    continue;
                }
                agent.tools.push(tool);
                added += 1;
            }
            if added > 0 {
                tracing::info!("Added {added} MCP tools");
            }
        }
        agent.mcp = mcp;
        Ok(agent)
    }

    /// The security warning llama-server prints for what is on, if anything is.
    pub fn warning(&self, config: &AgentConfig) -> Option<String> {
        let mut names = Vec::new();
        if self.proxy {
            names.push("MCP proxy (experimental)");
        }
        if self.tools_on {
            if !config.tools.is_empty() {
                names.push("server tools (experimental)");
            }
            if config.runtime.is_some() {
                names.push("tools runtime (experimental)");
            }
            if self.mcp.is_some() {
                names.push("MCP servers (experimental)");
            }
        }
        (!names.is_empty()).then(|| {
            format!(
                "security: {} enabled - do not expose to untrusted environments",
                names.join(", ")
            )
        })
    }

    /// Cancels the MCP calls in flight, so that the requests waiting on them end (the server's
    /// graceful shutdown waits on its open requests); [`Agent::shutdown`] ends the servers.
    pub fn cancel(&self) {
        if let Some(mcp) = &self.mcp {
            mcp.cancel();
        }
    }

    /// Ends the MCP servers and the runtime container this server started.
    pub async fn shutdown(&self) {
        if let Some(mcp) = &self.mcp {
            mcp.shutdown().await;
        }
        if let Some(ServerRuntime::Owned(owned)) = &self.runtime {
            owned.stop();
        }
    }

    fn runtime_spec(&self) -> Result<Option<String>, String> {
        match &self.runtime {
            None => Ok(None),
            Some(ServerRuntime::Static(spec)) => Ok(Some(spec.clone())),
            Some(ServerRuntime::Owned(owned)) => owned.spec().map(Some),
        }
    }
}

fn ok_json(value: &Value) -> Response<Body> {
    full(
        StatusCode::OK,
        "application/json; charset=utf-8",
        value.to_string(),
    )
}

/// `GET /tools`.
pub fn get_tools(agent: Option<&Arc<Agent>>) -> Response<Body> {
    match agent.filter(|a| a.tools_on) {
        Some(agent) => ok_json(&Value::Array(
            agent.tools.iter().map(Tool::to_json).collect(),
        )),
        None => disabled(),
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// `POST /tools`: `{"tool", "params", "stream"}`; `X-Tool-Cwd`, `X-Tool-Runtime` and
/// `X-Resp-Type` set the call's `cwd`, `runtime` and `resp_type` (the body cannot).
pub async fn post_tools(
    agent: Option<&Arc<Agent>>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<Body> {
    let Some(agent) = agent.filter(|a| a.tools_on).cloned() else {
        return disabled();
    };
    let bad = |m: String| llama_error(StatusCode::BAD_REQUEST, "invalid_request_error", &m, false);
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad(e.to_string()),
    };
    let tool_name = match request.get("tool") {
        Some(Value::String(s)) => s.clone(),
        _ => return bad("\"tool\" must be a string naming the tool".into()),
    };
    let mut params = match request.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(p)) => Value::Object(p.clone()),
        Some(_) => return bad("\"params\" must be an object".into()),
    };
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let object = params.as_object_mut().expect("an object");
    for key in ["cwd", "runtime", "resp_type"] {
        object.remove(key);
    }
    let cwd = header(headers, "x-tool-cwd");
    if !cwd.is_empty() {
        object.insert("cwd".into(), cwd.into());
    }
    let resp_type = header(headers, "x-resp-type");
    if !resp_type.is_empty() {
        object.insert("resp_type".into(), resp_type.into());
    }
    let Some(tool) = agent.tools.iter().find(|t| t.name() == tool_name).cloned() else {
        return llama_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("unknown tool \"{tool_name}\""),
            false,
        );
    };
    let streams = matches!(tool, Tool::Builtin(name) if builtin::meta(name).stream);
    if stream && !streams {
        return llama_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("tool \"{tool_name}\" does not support stream = true"),
            false,
        );
    }
    let runtime_header = header(headers, "x-tool-runtime");
    let server_error =
        |m: &str| llama_error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m, false);
    let name = match tool {
        Tool::Mcp(def) => {
            let Some(mcp) = &agent.mcp else {
                return server_error("MCP servers are not running");
            };
            if !runtime_header.is_empty() {
                params["runtime"] = runtime_header.into();
            }
            return ok_json(&mcp.call_tool(&def.server, &def.name, &params).await);
        }
        Tool::Builtin(name) => name,
    };
    if stream {
        return stream_call(agent, name, params, runtime_header);
    }
    let answer = tokio::task::spawn_blocking(move || {
        set_runtime(&agent, &mut params, &runtime_header)?;
        builtin::invoke(name, &params, None)
    })
    .await;
    match answer {
        Ok(Ok(result)) => ok_json(&result),
        Ok(Err(ToolError::Param(m))) => bad(m),
        Ok(Err(ToolError::Runtime(m))) => server_error(&m),
        Err(e) => server_error(&e.to_string()),
    }
}

/// `params.runtime` from the header, else the server's runtime (started again if it died).
fn set_runtime(agent: &Agent, params: &mut Value, header: &str) -> Result<(), ToolError> {
    let spec = if header.is_empty() {
        agent.runtime_spec().map_err(ToolError::Runtime)?
    } else {
        Some(header.to_owned())
    };
    if let Some(spec) = spec {
        params["runtime"] = spec.into();
    }
    Ok(())
}

/// A streamed call: `data: {"chunk": ...}` events as the output comes, then `{"done": true}`
/// (with `"error"` when the call failed).
fn stream_call(
    agent: Arc<Agent>,
    name: &'static str,
    mut params: Value,
    runtime_header: String,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut response = Response::new(Body::Channel(rx));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let event = |v: Value| Bytes::from(format!("data: {v}\n\n"));
    tokio::task::spawn_blocking(move || {
        let mut push = |chunk: &str| {
            chunk.is_empty() || tx.blocking_send(event(json!({ "chunk": chunk }))).is_ok()
        };
        let result = set_runtime(&agent, &mut params, &runtime_header)
            .and_then(|()| builtin::invoke(name, &params, Some(&mut push)));
        let done = match result {
            Ok(value) => {
                if let Some(tail) = value.get("stream_tail").and_then(Value::as_str) {
                    if tx.is_closed() {
                        return;
                    }
                    push(tail);
                }
                json!({ "done": true })
            }
            Err(ToolError::Param(m) | ToolError::Runtime(m)) => json!({ "done": true, "error": m }),
        };
        let _ = tx.blocking_send(event(done));
    });
    response
}

/// `GET`/`POST /cors-proxy`.
pub async fn cors_proxy(
    agent: Option<&Arc<Agent>>,
    method: Method,
    query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response<Body> {
    if !agent.is_some_and(|a| a.proxy) {
        return disabled();
    }
    match proxy::proxy(method, query, headers, body).await {
        Ok(response) => response,
        Err(message) => proxy::refused(&message),
    }
}

#[cfg(test)]
mod tests;
