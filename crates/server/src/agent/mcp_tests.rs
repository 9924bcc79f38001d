use super::*;

/// A stdio MCP server in Python (standard library only): tools `echo` (returns its `text`),
/// `fail` (an `isError` result), `crash` (exits), `slow` (sleeps 5 s); it writes its pid to
/// `pid.txt` in its working directory and a notification before every reply.
const SERVER: &str = r#"
import json, os, sys, time
open("pid.txt", "w").write(str(os.getpid()))
TOOLS = [
    {"name": "echo", "description": "Echo text", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "fail", "description": "Always fails"},
    {"name": "crash", "description": "Exits"},
    {"name": "slow", "description": "Sleeps"},
]
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, rid = msg.get("method"), msg["id"]
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info"}}) + "\n")
    if method == "initialize":
        assert msg["params"]["protocolVersion"] == "2024-11-05"
        result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        name, args = msg["params"]["name"], msg["params"].get("arguments", {})
        if name == "echo":
            result = {"content": [{"type": "text", "text": "echo: " + args.get("text", "")}, {"type": "image", "data": ""}, {"type": "text", "text": "env=" + os.environ.get("MCP_TEST_VAR", "")}]}
        elif name == "fail":
            result = {"content": [{"type": "text", "text": "it failed"}], "isError": True}
        elif name == "crash":
            sys.exit(3)
        elif name == "slow":
            time.sleep(5)
            result = {"content": []}
        else:
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no tool " + name}}) + "\n")
            sys.stdout.flush()
            continue
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// A configuration naming the server above as `t` (and `missing`, a command that does not exist),
/// in a temp dir that also holds the script.
fn config(dir: &std::path::Path, timeout_ms: u64) -> String {
    std::fs::write(dir.join("server.py"), SERVER).unwrap();
    json!({
        "mcpServers": {
            "t": {
                "command": "python3",
                "args": [dir.join("server.py")],
                "cwd": dir,
                "env": { "MCP_TEST_VAR": "set" },
                "timeout_ms": timeout_ms,
            },
            "missing": { "command": "/nonexistent/mcp-server" },
            "nocommand": { "args": ["x"] },
        }
    })
    .to_string()
}

fn running(pid: &str) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn tools_are_discovered_called_and_the_child_is_ended() {
    let dir = tempfile::tempdir().unwrap();
    let manager = Manager::start(None, Some(&config(dir.path(), 2_000)))
        .await
        .unwrap();
    let names: Vec<_> = manager.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["echo", "fail", "crash", "slow"]);
    assert_eq!(manager.tools()[0].server, "t");
    assert_eq!(manager.tools()[0].input_schema["required"], json!(["text"]));
    // Discovery stopped the server it started.
    let warm_pid = std::fs::read_to_string(dir.path().join("pid.txt")).unwrap();
    assert!(!running(&warm_pid));

    let out = manager
        .call_tool("t", "echo", &json!({ "text": "hi" }))
        .await;
    assert_eq!(out, json!({ "plain_text_response": "echo: hi\nenv=set" }));
    let out = manager.call_tool("t", "fail", &json!({})).await;
    assert_eq!(out, json!({ "error": "it failed" }));
    let out = manager.call_tool("t", "nope", &json!({})).await;
    assert_eq!(out, json!({ "error": "no tool nope" }));
    let out = manager.call_tool("missing", "x", &json!({})).await;
    assert_eq!(out, json!({ "error": "MCP server unavailable: missing" }));

    // A call past the timeout fails, and the server keeps answering afterwards.
    let out = manager.call_tool("t", "slow", &json!({})).await;
    assert_eq!(out, json!({ "error": "request timed out" }));

    let pid = std::fs::read_to_string(dir.path().join("pid.txt")).unwrap();
    assert!(running(&pid));
    manager.shutdown().await;
    assert!(!running(&pid), "the MCP child {pid} outlived shutdown");
    let out = manager
        .call_tool("t", "echo", &json!({ "text": "x" }))
        .await;
    assert_eq!(out, json!({ "error": "MCP server unavailable: t" }));
}

#[tokio::test]
async fn a_server_that_dies_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let manager = Manager::start(None, Some(&config(dir.path(), 5_000)))
        .await
        .unwrap();
    let out = manager.call_tool("t", "crash", &json!({})).await;
    assert_eq!(out, json!({ "error": "transport closed" }));
    // The reader sees the end of the child's stdout shortly after.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = manager
        .call_tool("t", "echo", &json!({ "text": "back" }))
        .await;
    assert_eq!(out["plain_text_response"], "echo: back\nenv=set");
    manager.shutdown().await;
}

#[tokio::test]
async fn bad_configurations_are_refused_by_name() {
    let err = Manager::start(None, Some("not json")).await.unwrap_err();
    assert!(err.starts_with("failed to parse MCP config JSON"), "{err}");
    let err = Manager::start(Some(Path::new("/nonexistent/mcp.json")), None)
        .await
        .unwrap_err();
    assert!(
        err.starts_with("failed to open MCP config file: /nonexistent/mcp.json"),
        "{err}"
    );
    let err = parse_configs(r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#).unwrap_err();
    assert_eq!(err, "mcpServers.a.args must hold strings");
    assert!(parse_configs("{}").unwrap().is_empty());
}
