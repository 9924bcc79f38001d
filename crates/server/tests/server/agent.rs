//! The agent features over HTTP, with no model: `/tools` (built-in tools run for real in a temp
//! dir, an MCP server written in Python), `/cors-proxy` against a local server, the 403 of each
//! while off, and CORS narrowed to local origins when tools are on.

use std::net::SocketAddr;

use hyper::StatusCode;
use mlxcel_server::ServerConfig;
use mlxcel_server::agent::AgentConfig;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{TestServer, parse_server_args, send};

fn with_agent(agent: AgentConfig) -> ServerConfig {
    ServerConfig {
        agent,
        ..ServerConfig::default()
    }
}

async fn post(
    server: &TestServer,
    path: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> crate::support::Reply {
    send(server.addr, "POST", path, headers, Some(&body.to_string())).await
}

#[tokio::test]
async fn agent_routes_answer_403_while_off() {
    let server = TestServer::start(ServerConfig::default(), None).await;
    let disabled =
        json!({ "error": { "message": "this feature is disabled", "type": "feature_disabled" } });
    for (method, path) in [
        ("GET", "/tools"),
        ("POST", "/tools"),
        ("GET", "/cors-proxy?url=http://127.0.0.1:1/"),
        ("POST", "/cors-proxy"),
    ] {
        let reply = send(server.addr, method, path, &[], Some("{}")).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path}");
        assert_eq!(reply.json(), disabled);
    }
}

#[tokio::test]
async fn builtin_tools_list_and_run_through_the_routes() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_string_lossy().into_owned();
    let server = TestServer::start(
        with_agent(AgentConfig {
            tools: vec!["all".into()],
            ..Default::default()
        }),
        None,
    )
    .await;

    let list = server.get("/tools").await.json();
    let names: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "read_file",
            "file_glob_search",
            "grep_search",
            "exec_shell_command",
            "write_file",
            "edit_file",
            "get_info"
        ]
    );
    assert_eq!(list[3]["display_name"], "Execute shell command");
    assert_eq!(list[3]["permissions"], json!({ "write": true }));
    assert_eq!(list[3]["type"], "server");
    assert_eq!(list[3]["uses_cwd"], true);
    assert_eq!(
        list[3]["definition"]["function"]["name"],
        "exec_shell_command"
    );

    let h = [("x-tool-cwd", cwd.as_str())];
    // The header's cwd wins over one in the params.
    let reply = post(&server, "/tools", &h, json!({ "tool": "write_file", "params": { "path": "sub/out.txt", "content": "line1\nline2\n", "cwd": "/nonexistent" } })).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json()["result"], "file written successfully");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("sub/out.txt")).unwrap(),
        "line1\nline2\n"
    );
    let reply = post(&server, "/tools", &h, json!({ "tool": "edit_file", "params": { "path": "sub/out.txt", "edits": [{ "old_text": "line2", "new_text": "two" }] } })).await;
    assert_eq!(reply.json()["edits_applied"], 1);
    let reply = post(
        &server,
        "/tools",
        &h,
        json!({ "tool": "read_file", "params": { "path": "sub/out.txt" } }),
    )
    .await;
    assert_eq!(
        reply.json(),
        json!({ "plain_text_response": "line1\ntwo\n" })
    );
    let reply = post(
        &server,
        "/tools",
        &[("x-tool-cwd", &cwd), ("x-resp-type", "base64")],
        json!({ "tool": "read_file", "params": { "path": "sub/out.txt" } }),
    )
    .await;
    assert_eq!(
        reply.json(),
        json!({ "base64": "bGluZTEKdHdvCg==", "size_bytes": 10 })
    );
    let reply = post(&server, "/tools", &h, json!({ "tool": "edit_file", "params": { "path": "sub/out.txt", "edits": [{ "old_text": "nope", "new_text": "x" }] } })).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("could not find edits[0].old_text")
    );

    // Streamed shell output, then the exit code, then done.
    let reply = post(&server, "/tools", &h, json!({ "tool": "exec_shell_command", "params": { "command": "echo hello; pwd" }, "stream": true })).await;
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let events: Vec<Value> = reply
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(events.last().unwrap(), &json!({ "done": true }));
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| e["chunk"].as_str().unwrap())
        .collect();
    assert!(
        text.starts_with("hello\n") && text.ends_with("\n[exit code: 0]"),
        "{text}"
    );

    // Errors: unknown tool 404, no streaming 404, bad body 400, unusable runtime 500.
    let reply = post(&server, "/tools", &[], json!({ "tool": "web_search" })).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(
        reply.json(),
        json!({ "code": 400, "message": "unknown tool \"web_search\"", "type": "invalid_request_error" })
    );
    let reply = post(
        &server,
        "/tools",
        &[],
        json!({ "tool": "read_file", "params": { "path": "x" }, "stream": true }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(reply.body.contains("does not support stream = true"));
    let reply = send(server.addr, "POST", "/tools", &[], Some("not json")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let reply = post(
        &server,
        "/tools",
        &[],
        json!({ "tool": "read_file", "params": {} }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply.body.contains("missing parameter \\\"path\\\""),
        "{}",
        reply.body
    );
    let reply = post(
        &server,
        "/tools",
        &[("x-tool-runtime", "ssh:-oProxyCommand=touch /tmp/pwned")],
        json!({ "tool": "exec_shell_command", "params": { "command": "echo hi" } }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        reply.json()["message"],
        "invalid ssh target: -oProxyCommand=touch /tmp/pwned"
    );
    let reply = post(
        &server,
        "/tools",
        &[("x-tool-runtime", "fake:does-not-exist")],
        json!({ "tool": "get_info" }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(reply.body.contains("unknown tool runtime"));
}

/// A stdio MCP server (Python, standard library only) with one tool, `add`; it writes its pid to
/// `pid.txt` in its working directory.
const MCP_SERVER: &str = r#"
import json, os, sys
open("pid.txt", "w").write(str(os.getpid()))
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    m = msg["method"]
    if m == "initialize":
        r = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "calc", "version": "1"}}
    elif m == "tools/list":
        r = {"tools": [{"name": "add", "description": "Add two numbers", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}]}
    elif m == "tools/call":
        a = msg["params"]["arguments"]
        r = {"content": [{"type": "text", "text": str(a["a"] + a["b"])}]}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": r}), flush=True)
"#;

#[tokio::test]
async fn mcp_tools_are_listed_called_and_their_server_ended_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("calc.py"), MCP_SERVER).unwrap();
    let config = json!({ "mcpServers": { "calc": { "command": "python3", "args": [dir.path().join("calc.py")], "cwd": dir.path() } } });
    let file = dir.path().join("mcp.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let mut server = TestServer::start(
        with_agent(AgentConfig {
            mcp_config: Some(file),
            ..Default::default()
        }),
        None,
    )
    .await;

    let list = server.get("/tools").await.json();
    assert_eq!(
        list,
        json!([{
            "display_name": "calc_add", "tool": "calc_add", "type": "mcp",
            "permissions": { "write": false }, "uses_cwd": false,
            "definition": { "type": "function", "function": {
                "name": "calc_add", "description": "Add two numbers",
                "parameters": { "type": "object", "properties": { "a": { "type": "number" }, "b": { "type": "number" } }, "required": ["a", "b"] },
            } },
        }])
    );
    let reply = post(
        &server,
        "/tools",
        &[],
        json!({ "tool": "calc_add", "params": { "a": 2, "b": 40 } }),
    )
    .await;
    assert_eq!(reply.json(), json!({ "plain_text_response": "42" }));
    // Only MCP tools: the built-in ones are not offered.
    let reply = post(
        &server,
        "/tools",
        &[],
        json!({ "tool": "read_file", "params": { "path": "/etc/hostname" } }),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);

    let pid = std::fs::read_to_string(dir.path().join("pid.txt")).unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    server.shutdown();
    (&mut server.task).await.unwrap();
    let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ");
    assert!(gone, "MCP server {pid} outlived the server");
}

/// A stdio MCP server whose one tool, `nap`, sleeps 10 s before it answers (writing
/// `napping` to its working directory as it starts) and which reads nothing while it sleeps.
const SLOW_MCP_SERVER: &str = r#"
import json, sys, time
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    m = msg["method"]
    if m == "initialize":
        r = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "slow", "version": "1"}}
    elif m == "tools/list":
        r = {"tools": [{"name": "nap", "description": "Sleeps 10 s", "inputSchema": {"type": "object", "properties": {}}}]}
    elif m == "tools/call":
        open("napping", "w").close()
        time.sleep(10)
        r = {"content": [{"type": "text", "text": "rested"}]}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": r}), flush=True)
"#;

/// A shutdown while a `/tools` call waits on a slow MCP tool (10 s, under a 30 s call timeout and
/// the default 30 s shutdown deadline) cancels the call and ends the server within 3 s, as
/// llama.cpp's suite (`test_mcp_slow_tool_call_slot_release`) wants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_a_slow_mcp_call_and_ends_promptly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("slow.py"), SLOW_MCP_SERVER).unwrap();
    let config = json!({ "mcpServers": { "slow": { "command": "python3", "args": [dir.path().join("slow.py")], "cwd": dir.path(), "timeout_ms": 30000 } } });
    let mut server = TestServer::start(
        with_agent(AgentConfig {
            mcp_json: Some(config.to_string()),
            ..Default::default()
        }),
        None,
    )
    .await;
    let addr = server.addr;
    let call = tokio::spawn(async move {
        send(
            addr,
            "POST",
            "/tools",
            &[],
            Some(&json!({ "tool": "slow_nap", "params": {} }).to_string()),
        )
        .await
    });
    let napping = dir.path().join("napping");
    assert!(
        crate::support::eventually(std::time::Duration::from_secs(20), || napping.exists()).await,
        "the slow tool never started"
    );
    let start = std::time::Instant::now();
    server.shutdown();
    tokio::time::timeout(std::time::Duration::from_secs(8), &mut server.task)
        .await
        .expect("the server ended within 8 s")
        .unwrap();
    let took = start.elapsed();
    assert!(took.as_secs_f64() < 3.0, "shutdown took {took:?}");
    let reply = call.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert_eq!(reply.json(), json!({ "error": "cancelled" }));
}

/// A local HTTP server that answers every request with what it received (`/nocontent`: 204).
async fn target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut n = 0;
                loop {
                    let got = stream.read(&mut buf[n..]).await.unwrap();
                    n += got;
                    let text = String::from_utf8_lossy(&buf[..n]).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length: usize = text[..end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if n >= end + 4 + length || got == 0 {
                            break;
                        }
                    }
                    if got == 0 {
                        break;
                    }
                }
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                let reply = if request.starts_with("POST /nocontent") {
                    "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n".to_owned()
                } else {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nAccess-Control-Allow-Origin: *\r\nX-Upstream: yes\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{request}",
                        request.len()
                    )
                };
                stream.write_all(reply.as_bytes()).await.unwrap();
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_cors_proxy_forwards_only_its_own_headers() {
    let upstream = target().await;
    let server = TestServer::start(
        with_agent(AgentConfig {
            proxy: true,
            ..Default::default()
        }),
        None,
    )
    .await;
    let url = format!("http://{upstream}/mcp?x=1");
    let path = format!(
        "/cors-proxy?url={}",
        url.replace(':', "%3A")
            .replace('/', "%2F")
            .replace('?', "%3F")
            .replace('=', "%3D")
    );
    let reply = send(
        server.addr,
        "POST",
        &path,
        &[
            ("authorization", "Bearer server-key"),
            (
                "x-llama-server-proxy-header-authorization",
                "Bearer mcp-key",
            ),
            ("x-llama-server-proxy-header-mcp-session-id", "s1"),
        ],
        Some("{\"jsonrpc\":\"2.0\"}"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let seen = reply.body.to_ascii_lowercase();
    assert!(seen.starts_with("post /mcp?x=1 http/1.1\r\n"), "{seen}");
    assert!(
        seen.contains("authorization: bearer mcp-key") && !seen.contains("server-key"),
        "{seen}"
    );
    assert!(
        seen.contains("mcp-session-id: s1") && !seen.contains("x-llama-server-proxy-header"),
        "{seen}"
    );
    assert!(seen.ends_with("{\"jsonrpc\":\"2.0\"}"));
    assert_eq!(reply.headers["x-upstream"], "yes");
    assert_eq!(reply.headers["content-type"], "text/plain");
    // The upstream's CORS header does not pass; this server's own CORS applies.
    assert!(reply.headers.get("access-control-allow-origin").is_none());

    let reply = send(
        server.addr,
        "GET",
        &format!("/cors-proxy?url=http://{upstream}/models"),
        &[],
        None,
    )
    .await;
    assert!(
        reply.body.starts_with("GET /models HTTP/1.1"),
        "{}",
        reply.body
    );
    let reply = send(
        server.addr,
        "POST",
        &format!("/cors-proxy?url=http://{upstream}/nocontent"),
        &[],
        Some("{}"),
    )
    .await;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (StatusCode::NO_CONTENT, "")
    );

    for (url, message) in [
        ("ftp://127.0.0.1/", "unsupported URL scheme: ftp"),
        (
            "http://user:pw@127.0.0.1/",
            "authentication in target URL is not supported",
        ),
        ("127.0.0.1/", "invalid URL: no scheme"),
    ] {
        let reply = send(
            server.addr,
            "GET",
            &format!("/cors-proxy?url={url}"),
            &[],
            None,
        )
        .await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR, "{url}");
        assert_eq!(reply.json()["error"]["message"], message);
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let reply = send(
        server.addr,
        "GET",
        &format!("/cors-proxy?url=http://{closed}/"),
        &[],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        reply.body.starts_with("proxy error: cannot connect"),
        "{}",
        reply.body
    );
}

#[test]
fn tools_narrow_cors_to_local_origins_and_agent_turns_everything_on() {
    let config = parse_server_args(&["--api-key", "k"])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(config.cors.any_origin);
    let config = parse_server_args(&["--api-key", "k", "--tools", "read_file"])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(!config.cors.any_origin);
    assert_eq!(config.cors.origins, "localhost");
    let config = parse_server_args(&[
        "--api-key",
        "k",
        "-ag",
        "--cors-origins",
        "https://app.example",
    ])
    .unwrap()
    .server_config()
    .unwrap();
    assert_eq!(config.cors.origins, "https://app.example");
    assert_eq!(config.agent.tools, ["all"]);
    assert!(config.agent.proxy);
    let config = parse_server_args(&["--api-key", "k", "--ui-mcp-proxy"])
        .unwrap()
        .server_config()
        .unwrap();
    assert!(config.agent.proxy && config.cors.any_origin);
}

#[tokio::test]
async fn a_bad_agent_setting_stops_the_server_naming_it() {
    let err = mlxcel_server::Server::bind(ServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..with_agent(AgentConfig {
            mcp_json: Some("not json".into()),
            ..Default::default()
        })
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("MCP starting failed: failed to parse MCP config JSON"),
        "{err}"
    );
}

/// Every spelling of the agent flags parses to its setting; each environment twin is accepted.
#[test]
fn agent_flags_and_their_twins_are_read() {
    let config = |args: &[&str]| {
        parse_server_args(args)
            .unwrap()
            .server_config()
            .unwrap()
            .agent
    };
    assert_eq!(
        config(&["--tools", "read_file,get_info"]).tools,
        ["read_file", "get_info"]
    );
    assert_eq!(
        config(&["--tools-runtime", "docker:busybox"])
            .runtime
            .as_deref(),
        Some("docker:busybox")
    );
    assert_eq!(
        config(&["--mcp-servers-config", "/x/mcp.json"]).mcp_config,
        Some("/x/mcp.json".into())
    );
    assert_eq!(
        config(&["--mcp-servers-json", "{}"]).mcp_json.as_deref(),
        Some("{}")
    );
    for on in ["-ag", "--agent"] {
        let c = config(&[on]);
        assert_eq!((c.tools, c.proxy), (vec!["all".to_owned()], true), "{on}");
    }
    for off in ["-no-ag", "--no-agent"] {
        let c = config(&["--tools", "all", "--ui-mcp-proxy", off]);
        assert!(c.tools.is_empty() && !c.proxy, "{off}");
    }
    for on in ["--ui-mcp-proxy", "--webui-mcp-proxy"] {
        assert!(config(&[on]).proxy, "{on}");
    }
    for off in ["--no-ui-mcp-proxy", "--no-webui-mcp-proxy"] {
        assert!(!config(&["--ui-mcp-proxy", off]).proxy, "{off}");
    }
    let accepted = mlxcel_server::accepted_spellings();
    for env in [
        "LLAMA_ARG_TOOLS",
        "LLAMA_ARG_TOOLS_RUNTIME",
        "LLAMA_ARG_MCP_SERVERS_CONFIG",
        "LLAMA_ARG_MCP_SERVERS_JSON",
        "LLAMA_ARG_AGENT",
        "LLAMA_ARG_UI_MCP_PROXY",
    ] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
}
