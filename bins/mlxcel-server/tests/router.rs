//! Router mode through the binary: its flags' environment twins, and that unloading a model
//! gives its memory back to the system (the process's resident set, read from /proc).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn server(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel-server"));
    command.args(args).env_remove("LLAMA_API_KEY");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run mlxcel-server")
}

#[test]
fn router_flags_are_read_from_their_environment_twins() {
    let dir = tempfile::tempdir().unwrap();
    let preset = dir.path().join("bad.ini");
    std::fs::write(&preset, "[a]\nmodel = /m/a.gguf\n\nno-such-option = 2\n").unwrap();
    let preset = preset.display().to_string();
    for (env, needle) in [
        (
            ("LLAMA_ARG_MODELS_DIR", "/no/such/models"),
            "/no/such/models",
        ),
        (("LLAMA_ARG_MODELS_PRESET", preset.as_str()), "line 4"),
        (("LLAMA_ARG_MODELS_MAX", "several"), "several"),
        (("LLAMA_ARG_MODELS_AUTOLOAD", "maybe"), "maybe"),
    ] {
        let output = server(&["--port", "0"], &[env]);
        assert!(!output.status.success(), "{env:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(needle), "{env:?}: {stderr}");
    }
    let output = server(&["--port", "0", "--models-preset", &preset], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("line 4") && stderr.contains("no-such-option"),
        "{stderr}"
    );
}

/// Kills the server when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request; the status and the body.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let status = reply.split_whitespace().nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn unloading_a_model_gives_its_memory_back() {
    if std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    let cache = mlxcel_model::cache_dir().unwrap();
    let gguf = mlxcel_model::DefaultModel::pinned()
        .ensure_gguf(&cache)
        .expect("the default model's GGUF (set MLXCEL_SKIP_MODEL_TESTS=1 to skip)");
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&gguf, dir.path().join("alpha.gguf")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_mlxcel-server"))
        .args(["--port", &port.to_string(), "--models-dir"])
        .arg(dir.path())
        .env_remove("LLAMA_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mlxcel-server");
    let server = Running(child);
    let pid = server.0.id();
    assert!(
        wait_until(Duration::from_secs(60), || http(port, "GET", "/health", "")
            .is_some_and(|(s, _)| s == 200)),
        "the router never answered /health"
    );
    let status = || {
        http(port, "GET", "/models", "")
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    let before = resident_kib(pid);
    let (code, body) = http(port, "POST", "/models/load", r#"{"model":"alpha"}"#).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(wait_until(Duration::from_secs(120), || status()
        .contains(r#""value":"loaded""#)));
    let request = r#"{"model":"alpha","prompt":"Once upon a time","n_predict":16}"#;
    let (code, body) = http(port, "POST", "/completion", request).unwrap();
    assert_eq!(code, 200, "{body}");
    let loaded = resident_kib(pid);
    let (code, body) = http(port, "POST", "/models/unload", r#"{"model":"alpha"}"#).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(wait_until(Duration::from_secs(30), || status()
        .contains(r#""value":"unloaded""#)));
    // The model's growth must go: at most a quarter of it may stay (allocator slack).
    let limit = before + (loaded.saturating_sub(before)) / 4;
    let mut after = loaded;
    let freed = wait_until(Duration::from_secs(20), || {
        after = resident_kib(pid);
        after <= limit
    });
    eprintln!("resident set: {before} KiB before, {loaded} KiB loaded, {after} KiB unloaded");
    assert!(
        loaded > before + 20_000,
        "loading grew the process: {before} -> {loaded} KiB"
    );
    assert!(
        freed,
        "unloading left {after} KiB (before {before}, loaded {loaded}, limit {limit})"
    );
}
