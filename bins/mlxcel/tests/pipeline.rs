//! Pipelines of `mlxcel` processes on loopback (docs/distributed.md): 2 and 3 ranks print the
//! greedy text of one process on the default model; a rank killed mid-stream ends the request
//! with an error within seconds and `/health` says the pipeline is down, and so does a link cut
//! without a FIN (a rank in a network namespace of its own); a rank past the
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

/// Waits until `port` answers `/health` with 200 (the pipeline is up).
fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ok = TcpStream::connect(("127.0.0.1", port)).is_ok()
            && http(port, "GET", "/health", "").starts_with("HTTP/1.1 200");
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pipeline did not become ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A long streamed completion on `port`, read until its first token has come.
fn start_stream(port: u16) -> TcpStream {
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
    stream
}

/// Reads the rest of `stream` after a fault at `since`: it must end within `limit` with the
/// pipeline's error, and `/health` must then say the pipeline is down.
fn assert_ends_down(mut stream: TcpStream, port: u16, since: Instant, limit: Duration) {
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let ended = since.elapsed();
    let rest = String::from_utf8_lossy(&rest);
    assert!(ended < limit, "the stream took {ended:?} to end");
    assert!(rest.contains("connection to a peer was lost"), "{rest}");
    assert!(rest.contains("backend_down"), "{rest}");
    let health = http(port, "GET", "/health", "");
    assert!(health.starts_with("HTTP/1.1 503"), "{health}");
    assert!(health.contains("pipeline is down"), "{health}");
}

/// Rank 1, then rank 0, of a two-rank `serve` on loopback with HTTP on `port`, once it is up.
fn serve_pair(dir: &Path, port: u16, extra: &[&str]) -> (Child, Child) {
    let hosts = hostfile(dir, 2);
    let port = port.to_string();
    let serve = |rank: &str| {
        let mut args = vec![
            "serve",
            "--port",
            &port,
            "-t",
            "1",
            "--pipeline-hosts",
            &hosts,
            "--rank",
            rank,
        ];
        args.extend(extra);
        mlxcel(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let worker = serve("1");
    let front = serve("0");
    wait_ready(port.parse().unwrap());
    (worker, front)
}

#[test]
fn a_killed_rank_ends_the_stream_with_an_error_and_health_says_down() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1)[0];
    let (mut worker, mut front) = serve_pair(dir.path(), port, &[]);
    // A long stream; the worker dies once it has started.
    let stream = start_stream(port);
    worker.kill().unwrap();
    let killed = Instant::now();
    let _ = worker.wait();
    assert_ends_down(stream, port, killed, Duration::from_secs(5));
    front.kill().unwrap();
    let _ = front.wait();
}

#[test]
fn with_exit_on_failure_rank_0_exits_once_a_rank_is_lost() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1)[0];
    let (mut worker, mut front) = serve_pair(dir.path(), port, &["--pipeline-exit-on-failure"]);
    let mut stream = start_stream(port);
    worker.kill().unwrap();
    let killed = Instant::now();
    let _ = worker.wait();
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(
        String::from_utf8_lossy(&rest).contains("connection to a peer was lost"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
    let status = loop {
        if let Some(status) = front.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "rank 0 still runs 10 s after its worker was killed"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(1), "rank 0 exits with status 1");
}

/// `ip` with `args`, quietly; whether it succeeded.
fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A network namespace joined to this one by a veth pair (10.213.N.1 here, 10.213.N.2 there),
/// removed on drop: a link that can be cut without closing the sockets over it.
struct Netns {
    name: String,
    veth: String,
    here: String,
    there: String,
}

impl Netns {
    /// `None` where namespaces cannot be made (not root, no `ip`).
    fn new() -> Option<Netns> {
        let pid = std::process::id();
        let ns = Netns {
            name: format!("mlxcel-part-{pid}"),
            veth: format!("mxp{}", pid % 1_000_000),
            here: format!("10.213.{}.1", pid % 250 + 1),
            there: format!("10.213.{}.2", pid % 250 + 1),
        };
        if !ip(&["netns", "add", &ns.name]) {
            return None;
        }
        let peer = format!("{}b", ns.veth);
        let up = ip(&[
            "link", "add", &ns.veth, "type", "veth", "peer", "name", &peer,
        ]) && ip(&["link", "set", &peer, "netns", &ns.name])
            && ip(&["addr", "add", &format!("{}/24", ns.here), "dev", &ns.veth])
            && ip(&["link", "set", &ns.veth, "up"])
            && ip(&[
                "-n",
                &ns.name,
                "addr",
                "add",
                &format!("{}/24", ns.there),
                "dev",
                &peer,
            ])
            && ip(&["-n", &ns.name, "link", "set", &peer, "up"])
            && ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        up.then_some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        ip(&["link", "del", &self.veth]);
        ip(&["netns", "del", &self.name]);
    }
}

#[test]
fn a_silent_partition_ends_the_stream_within_the_link_timeout() {
    if skip() {
        return;
    }
    // Rank 1 runs in a namespace of its own; cutting the link between them sends no FIN and no
    // RST, as a pulled cable or a vanished host would not.
    let Some(ns) = Netns::new() else {
        eprintln!("skipped: network namespaces need root and iproute2's `ip`");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(3);
    let hosts = dir.path().join("hosts.json");
    std::fs::write(
        &hosts,
        format!(
            "[[\"{}:{}\"], [\"{}:{}\"]]",
            ns.here, ports[0], ns.there, ports[1]
        ),
    )
    .unwrap();
    let hosts = hosts.to_string_lossy().into_owned();
    let port = ports[2].to_string();
    let args = |rank: &'static str| {
        vec![
            "serve".to_string(),
            "--port".into(),
            port.clone(),
            "-t".into(),
            "1".into(),
            "--pipeline-hosts".into(),
            hosts.clone(),
            "--rank".into(),
            rank.into(),
            "--pipeline-link-timeout".into(),
            "2".into(),
        ]
    };
    let mut worker = Command::new("ip")
        .args(["netns", "exec", &ns.name, env!("CARGO_BIN_EXE_mlxcel")])
        .args(args("1"))
        .env_remove("MLX_HOSTFILE")
        .env_remove("MLX_RANK")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let front_args = args("0");
    let front_args: Vec<&str> = front_args.iter().map(String::as_str).collect();
    let mut front = mlxcel(&front_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let port: u16 = port.parse().unwrap();
    wait_ready(port);
    let stream = start_stream(port);
    assert!(ip(&["link", "set", &ns.veth, "down"]), "cutting the link");
    let cut = Instant::now();
    assert_ends_down(stream, port, cut, Duration::from_secs(10));
    front.kill().unwrap();
    let _ = front.wait();
    worker.kill().unwrap();
    let _ = worker.wait();
}
