//! Pipelines of `mlxcel` processes on loopback (docs/distributed.md): 2 and 3 ranks print the
//! greedy text of one process on the default model; a rank killed mid-stream ends the request
//! with an error within seconds and `/health` says the pipeline is down; a rank past the
//! hostfile and a malformed hostfile are refused by name. Model tests are skipped with
//! `MLXCEL_SKIP_MODEL_TESTS=1`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn skip() -> bool {
    std::env::var_os("MLXCEL_SKIP_MODEL_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn mlxcel(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel"));
    command
        .args(args)
        .env_remove("MLX_HOSTFILE")
        .env_remove("MLX_RANK")
        .env_remove("MLXCEL_XLA_CONTEXT_CAPACITY")
        .env_remove("MLXCEL_XLA_CONTEXT_BUCKETS");
    command
}

/// `n` ports free now on loopback.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// A hostfile of `ranks` loopback ranks in `dir`.
fn hostfile(dir: &Path, ranks: usize) -> String {
    let entries: Vec<String> = free_ports(ranks)
        .iter()
        .map(|p| format!("[\"127.0.0.1:{p}\"]"))
        .collect();
    let path = dir.join(format!("hosts{ranks}.json"));
    std::fs::write(&path, format!("[{}]", entries.join(", "))).unwrap();
    path.to_string_lossy().into_owned()
}

const GENERATE: &[&str] = &[
    "generate",
    "-p",
    "The capital of France is",
    "-n",
    "24",
    "-t",
    "1",
];

/// Every rank of a `generate` pipeline, rank 0's output last.
fn run_pipeline(hosts: &str, ranks: usize, extra: &[&str]) -> Output {
    let workers: Vec<Child> = (1..ranks)
        .map(|rank| {
            let rank = rank.to_string();
            let mut args = GENERATE.to_vec();
            args.extend(["--pipeline-hosts", hosts, "--rank", &rank]);
            args.extend(extra);
            mlxcel(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut args = GENERATE.to_vec();
    args.extend(["--pipeline-hosts", hosts, "--rank", "0"]);
    args.extend(extra);
    let rank0 = mlxcel(&args).output().unwrap();
    for (i, worker) in workers.into_iter().enumerate() {
        let out = worker.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "rank {} failed: {}",
            i + 1,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout.is_empty(),
            "a worker prints no text: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    rank0
}

#[test]
fn two_and_three_ranks_print_the_text_of_one_process() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let one = mlxcel(GENERATE).output().unwrap();
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let text = String::from_utf8_lossy(&one.stdout).into_owned();
    assert!(!text.trim().is_empty());
    for (ranks, extra) in [
        (2, &[][..]),
        (3, &[][..]),
        (2, &["--pipeline-layers", "4,26"][..]),
    ] {
        let hosts = hostfile(dir.path(), ranks);
        let out = run_pipeline(&hosts, ranks, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{ranks} ranks {extra:?}: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            text,
            "{ranks} ranks {extra:?} print another text: {stderr}"
        );
        assert!(
            stderr.contains("pipeline ready: rank 0: layers 0.."),
            "{stderr}"
        );
        if extra.is_empty() {
            continue;
        }
        assert!(
            stderr.contains("rank 0: layers 0..4, rank 1: layers 4..30"),
            "{stderr}"
        );
    }
}

#[test]
fn bad_hostfiles_and_ranks_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = hostfile(dir.path(), 2);
    let out = mlxcel(&[
        "generate",
        "-p",
        "hi",
        "--pipeline-hosts",
        &hosts,
        "--rank",
        "2",
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("rank 2 is out of range"), "{stderr}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "[[\"127.0.0.1:5000\"]").unwrap();
    let out = mlxcel(&[
        "generate",
        "-p",
        "hi",
        "--pipeline-hosts",
        &bad.to_string_lossy(),
        "--rank",
        "0",
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("not JSON"), "{stderr}");
    let out = mlxcel(&["generate", "-p", "hi", "--rank", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "--rank needs --pipeline-hosts");
    let out = mlxcel(&["generate", "-p", "hi", "--pipeline"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("MLX_HOSTFILE"), "{stderr}");
}

#[test]
fn a_rank_alone_fails_at_start_naming_its_peers() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = hostfile(dir.path(), 2);
    let started = Instant::now();
    let out = mlxcel(&[
        "generate",
        "-p",
        "hi",
        "--pipeline-hosts",
        &hosts,
        "--rank",
        "0",
        "--pipeline-timeout",
        "2",
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("could not reach its peers within 2 s"),
        "{stderr}"
    );
    assert!(stderr.contains("rank 1 at 127.0.0.1:"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// One HTTP/1.1 request on a new connection; the whole response as text (the connection closes).
fn http(port: u16, method: &str, path: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

#[test]
fn a_killed_rank_ends_the_stream_with_an_error_and_health_says_down() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let hosts = hostfile(dir.path(), 2);
    let port = free_ports(1)[0].to_string();
    let serve = |rank: &str| {
        mlxcel(&[
            "serve",
            "--port",
            &port,
            "-t",
            "1",
            "--pipeline-hosts",
            &hosts,
            "--rank",
            rank,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let mut worker = serve("1");
    let mut front = serve("0");
    let port: u16 = port.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = TcpStream::connect(("127.0.0.1", port)).is_ok()
            && http(port, "GET", "/health", "").starts_with("HTTP/1.1 200");
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pipeline did not become ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A long stream; the worker dies once it has started.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body =
        r#"{"prompt": "Once upon a time", "n_predict": 4000, "stream": true, "ignore_eos": true}"#;
    write!(
        stream,
        "POST /completion HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first token");
        seen.extend_from_slice(&buf[..n]);
    }
    worker.kill().unwrap();
    let killed = Instant::now();
    let _ = worker.wait();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let ended = killed.elapsed();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        ended < Duration::from_secs(5),
        "the stream took {ended:?} to end"
    );
    assert!(rest.contains("connection to a peer was lost"), "{rest}");
    assert!(rest.contains("backend_down"), "{rest}");
    let health = http(port, "GET", "/health", "");
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.contains("pipeline is down"), "{health}");
    front.kill().unwrap();
    let _ = front.wait();
}
