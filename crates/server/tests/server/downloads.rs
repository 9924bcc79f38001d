//! Models fetched at start (`-hf`, `-hff`, `-hft`, `-mu`, `-dr`, `-hfd`, `--offline`) through
//! the server's real outbound client, against a local stand-in for the Hugging Face Hub (its
//! `refs` and `tree` API, `resolve` URLs that redirect to a CDN on another origin) and for Docker
//! Hub (token, manifest, blob).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use mlxcel_server::{DockerHub, DownloadEnv, DownloadError, ServerArgs, ServerError};
use sha2::{Digest, Sha256};

use super::support::parse_server_args;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One request as the stand-in saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

/// What a stand-in answers: path (with query) → (status, headers, body).
type Routes = HashMap<String, (u16, Vec<(String, String)>, Bytes)>;

/// An HTTP server on its own thread and runtime, answering from `routes` (HEAD without the
/// body; `Range: bytes=N-` with 206 where the route has an ETag), recording every request.
struct StandIn {
    addr: SocketAddr,
    routes: Arc<Mutex<Routes>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl StandIn {
    fn start() -> Self {
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (r, s) = (routes.clone(), seen.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let (r, s) = (r.clone(), s.clone());
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<Incoming>| {
                            let (r, s) = (r.clone(), s.clone());
                            async move { Ok::<_, Infallible>(answer(&r, &s, &req)) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        });
        Self { addr, routes, seen }
    }

    fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    fn route(&self, path: &str, status: u16, headers: &[(&str, &str)], body: impl Into<Bytes>) {
        self.routes.lock().unwrap().insert(
            path.to_owned(),
            (
                status,
                headers
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                body.into(),
            ),
        );
    }

    /// A file served with an ETag and ranges.
    fn file(&self, path: &str, etag: &str, body: &[u8]) {
        self.route(
            path,
            200,
            &[("etag", etag), ("accept-ranges", "bytes")],
            body.to_vec(),
        );
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn gets(&self, path: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path == path)
            .count()
    }
}

fn answer(
    routes: &Mutex<Routes>,
    seen: &Mutex<Vec<Seen>>,
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/".to_owned(), |p| p.as_str().to_owned());
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    seen.lock().unwrap().push(Seen {
        method: req.method().to_string(),
        path: path.clone(),
        headers: headers.clone(),
    });
    let Some((status, extra, body)) = routes.lock().unwrap().get(&path).cloned() else {
        return Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(b"{\"error\":\"not found\"}")))
            .unwrap();
    };
    let mut builder = Response::builder();
    for (k, v) in &extra {
        builder = builder.header(k, v);
    }
    let ranged = extra.iter().any(|(k, _)| k == "accept-ranges");
    let from = headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse::<usize>().ok());
    let (status, body) = match from {
        Some(from) if ranged && status == 200 && from <= body.len() => (206, body.slice(from..)),
        _ => (status, body),
    };
    let body = if req.method() == hyper::Method::HEAD {
        builder = builder.header("content-length", body.len());
        Bytes::new()
    } else {
        body
    };
    builder.status(status).body(Full::new(body)).unwrap()
}

/// A Hub stand-in for `org/model` listing `files` (path, bytes): large files carry their
/// SHA-256 as LFS ids, and each `resolve` URL redirects to `cdn`.
fn hub(files: &[(&str, &[u8])], cdn: &StandIn) -> StandIn {
    let hub = StandIn::start();
    hub.route(
        "/api/models/org/model/refs",
        200,
        &[],
        format!(r#"{{"branches":[{{"name":"dev","targetCommit":"{}"}},{{"name":"main","targetCommit":"{COMMIT}"}}]}}"#, "f".repeat(40)),
    );
    let mut tree = Vec::new();
    for (path, bytes) in files {
        let oid = sha256(bytes);
        tree.push(serde_json::json!({"type": "file", "path": path, "oid": "a".repeat(40), "lfs": {"oid": oid, "size": bytes.len()}}));
        let blob = format!("/cdn/{oid}");
        cdn.file(&blob, &format!("\"{oid}\""), bytes);
        let location = format!("{}cdn/{oid}", cdn.url());
        hub.route(
            &format!("/org/model/resolve/{COMMIT}/{path}"),
            302,
            &[("location", location.as_str())],
            Bytes::new(),
        );
    }
    tree.push(serde_json::json!({"type": "directory", "path": "sub"}));
    hub.route(
        &format!("/api/models/org/model/tree/{COMMIT}?recursive=true"),
        200,
        &[],
        serde_json::to_vec(&tree).unwrap(),
    );
    hub
}

fn env(home: &Path, hub: Option<&StandIn>) -> DownloadEnv {
    let home = home.to_str().unwrap();
    match hub {
        Some(hub) => DownloadEnv::from_pairs(&[("HOME", home), ("MODEL_ENDPOINT", &hub.url())]),
        None => DownloadEnv::from_pairs(&[("HOME", home), ("HF_ENDPOINT", "http://127.0.0.1:9/")]),
    }
}

fn resolve(args: &[&str], env: &DownloadEnv) -> Result<ServerArgs, ServerError> {
    parse_server_args(args)
        .unwrap()
        .with_downloads_in(env, &DockerHub::default())
}

fn snapshot(home: &Path, file: &str) -> PathBuf {
    home.join(".cache/huggingface/hub/models--org--model/snapshots")
        .join(COMMIT)
        .join(file)
}

#[test]
fn hf_fetches_the_tagged_gguf_into_the_hub_cache_and_the_token_stays_on_the_hub() {
    let home = tempfile::tempdir().unwrap();
    let cdn = StandIn::start();
    let q8 = vec![7u8; 300_000];
    let q4 = vec![3u8; 200_000];
    let hub = hub(
        &[
            ("README.md", b"readme"),
            ("model-mmproj-Q4_K_M.gguf", b"projector"),
            ("model-Q8_0.gguf", &q8),
            ("model-Q4_K_M.gguf", &q4),
        ],
        &cdn,
    );
    let token = format!("hf_{}", "x".repeat(34));
    let args = resolve(
        &["-hf", "org/model", "-hft", &token],
        &env(home.path(), Some(&hub)),
    )
    .unwrap();
    // No tag: Q4_K_M (not the projector that also names it), in the snapshot, linked to its blob.
    let path = snapshot(home.path(), "model-Q4_K_M.gguf");
    assert_eq!(args.model.as_deref(), Some(path.to_str().unwrap()));
    assert_eq!(std::fs::read(&path).unwrap(), q4);
    let link = std::fs::read_link(&path).unwrap();
    assert_eq!(link, Path::new("../../blobs").join(sha256(&q4)));
    let refs = home
        .path()
        .join(".cache/huggingface/hub/models--org--model/refs/main");
    assert_eq!(std::fs::read_to_string(refs).unwrap(), COMMIT);
    assert!(args.download.hf_repo.is_none(), "the flags are consumed");
    // The token reached the Hub's API and resolve URLs, never the CDN's other origin.
    let bearer = format!("Bearer {token}");
    assert!(
        hub.seen()
            .iter()
            .all(|s| s.headers.get("authorization") == Some(&bearer))
    );
    assert!(!cdn.seen().is_empty());
    assert!(
        cdn.seen()
            .iter()
            .all(|s| !s.headers.contains_key("authorization"))
    );

    // A tag picks its file, case-insensitively; the Q4_K_M already there is not fetched again.
    let args = resolve(&["-hf", "org/model:q8_0"], &env(home.path(), Some(&hub))).unwrap();
    assert_eq!(
        std::fs::read(args.model.unwrap()).unwrap(),
        q8,
        "the Q8_0 file"
    );
    let before = cdn.gets(&format!("/cdn/{}", sha256(&q4)));
    resolve(&["-hf", "org/model"], &env(home.path(), Some(&hub))).unwrap();
    assert_eq!(cdn.gets(&format!("/cdn/{}", sha256(&q4))), before);

    // -hff names the file exactly.
    let args = resolve(
        &["-hf", "org/model", "-hff", "model-Q8_0.gguf"],
        &env(home.path(), Some(&hub)),
    )
    .unwrap();
    assert!(args.model.unwrap().ends_with("model-Q8_0.gguf"));

    // Offline, and with the Hub unreachable: the cached snapshot.
    let offline = resolve(
        &["-hf", "org/model", "--offline"],
        &env(home.path(), Some(&hub)),
    )
    .unwrap();
    assert_eq!(
        offline.model.as_deref(),
        Some(path.to_str().unwrap()),
        "offline"
    );
    let unreachable = resolve(&["-hf", "org/model"], &env(home.path(), None)).unwrap();
    assert_eq!(unreachable.model.as_deref(), Some(path.to_str().unwrap()));
}

#[test]
fn hf_refusals_name_what_to_change() {
    let home = tempfile::tempdir().unwrap();
    let cdn = StandIn::start();
    let hub = hub(
        &[
            ("big-Q4_0-00001-of-00002.gguf", b"one"),
            ("big-Q4_0-00002-of-00002.gguf", b"two"),
            ("m-Q8_0.gguf", b"q8"),
        ],
        &cdn,
    );
    let e = env(home.path(), Some(&hub));
    let message = |args: &[&str]| resolve(args, &e).unwrap_err().to_string();
    let m = message(&["-hf", "org/model:Q5_K"]);
    assert!(
        m.contains("no model GGUF tagged Q5_K") && m.contains("m-Q8_0.gguf"),
        "{m}"
    );
    let m = message(&["-hf", "org/model", "-hff", "nope.gguf"]);
    assert!(m.contains("no file `nope.gguf`"), "{m}");
    let m = message(&["-hf", "org/model:Q4_0"]);
    assert!(
        m.contains("split in 2 parts") && m.contains("llama-gguf-split --merge"),
        "{m}"
    );
    let m = message(&["-hf", "not-a-repo"]);
    assert!(m.contains("<user>/<model>[:quant]"), "{m}");
    let m = message(&["-hf", "org/model", "-m", "x.gguf"]);
    assert!(m.contains("-m and -hf"), "{m}");
    let m = message(&["-hff", "m-Q8_0.gguf"]);
    assert!(m.contains("give -hf too"), "{m}");
    let m = message(&["-hf", "org/model", "-mu", "http://h/x.gguf"]);
    assert!(m.contains("-hf and -mu"), "{m}");
    let m = message(&["-hf", "org/model", "--models-dir", "/tmp"]);
    assert!(m.contains("router mode"), "{m}");
    let m = message(&["-hf", "org/other", "--offline"]);
    assert!(m.contains("offline, and nothing of it is cached"), "{m}");
    assert!(
        home.path().read_dir().unwrap().next().is_none()
            || !snapshot(home.path(), "m-Q8_0.gguf").exists(),
        "nothing fetched by a refusal"
    );
}

#[test]
fn a_blob_that_does_not_match_its_sha256_is_refused_and_removed() {
    let home = tempfile::tempdir().unwrap();
    let cdn = StandIn::start();
    let hub = hub(&[("m-Q4_K_M.gguf", b"the real bytes")], &cdn);
    // The CDN serves other bytes under the blob's name.
    let oid = sha256(b"the real bytes");
    cdn.file(&format!("/cdn/{oid}"), "\"x\"", b"tampered bytes");
    let err = resolve(&["-hf", "org/model"], &env(home.path(), Some(&hub))).unwrap_err();
    assert!(
        matches!(err, ServerError::Download(DownloadError::Checksum { .. })),
        "{err}"
    );
    let blobs = home
        .path()
        .join(".cache/huggingface/hub/models--org--model/blobs");
    let left: Vec<_> = std::fs::read_dir(blobs)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_url_is_fetched_once_resumed_when_cut_and_fetched_again_when_its_etag_changes() {
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("llama-cache");
    let e = DownloadEnv::from_pairs(&[("LLAMA_CACHE", cache.to_str().unwrap())]);
    let server = StandIn::start();
    let body: Vec<u8> = (0..500_000u32).map(|i| (i % 251) as u8).collect();
    server.file("/files/model-Q4_0.gguf", "\"v1\"", &body);
    let url = format!("{}files/model-Q4_0.gguf?download=true", server.url());
    server.file("/files/model-Q4_0.gguf?download=true", "\"v1\"", &body);
    // An earlier run was cut after 100 000 bytes.
    std::fs::create_dir_all(&cache).unwrap();
    let path = cache.join("model-Q4_0.gguf");
    let partial = cache.join("model-Q4_0.gguf.downloadInProgress");
    std::fs::write(&partial, &body[..100_000]).unwrap();
    let args = resolve(&["-mu", &url], &e).unwrap();
    assert_eq!(args.model.as_deref(), Some(path.to_str().unwrap()));
    assert_eq!(std::fs::read(&path).unwrap(), body);
    assert!(!partial.exists());
    let ranges: Vec<_> = server
        .seen()
        .into_iter()
        .filter_map(|s| s.headers.get("range").cloned())
        .collect();
    assert_eq!(ranges, ["bytes=100000-"]);
    assert_eq!(
        std::fs::read_to_string(cache.join("model-Q4_0.gguf.etag")).unwrap(),
        "\"v1\""
    );

    // Same ETag: kept. A new one: fetched again.
    let path_q = "/files/model-Q4_0.gguf?download=true";
    resolve(&["-mu", &url], &e).unwrap();
    assert_eq!(server.gets(path_q), 1);
    let changed: Vec<u8> = body.iter().rev().copied().collect();
    server.file(path_q, "\"v2\"", &changed);
    resolve(&["-mu", &url], &e).unwrap();
    assert_eq!(server.gets(path_q), 2);
    assert_eq!(std::fs::read(&path).unwrap(), changed);

    // -m names where the file goes.
    let target = home.path().join("elsewhere.gguf");
    let args = resolve(&["-mu", &url, "-m", target.to_str().unwrap()], &e).unwrap();
    assert_eq!(args.model.as_deref(), Some(target.to_str().unwrap()));
    assert_eq!(std::fs::read(&target).unwrap(), changed);

    // A missing file is an error naming the URL and the status.
    let missing = format!("{}files/none.gguf", server.url());
    let m = resolve(&["-mu", &missing], &e).unwrap_err().to_string();
    assert!(m.contains("none.gguf") && m.contains("404"), "{m}");
    let m = resolve(&["-mu", "ftp://h/x.gguf"], &e)
        .unwrap_err()
        .to_string();
    assert!(m.contains("http:// or https://"), "{m}");
}

#[test]
fn docker_hub_models_come_through_a_pull_token_and_a_checked_blob() {
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("llama-cache");
    let e = DownloadEnv::from_pairs(&[("LLAMA_CACHE", cache.to_str().unwrap())]);
    let hub = StandIn::start();
    let body = vec![9u8; 70_000];
    let digest = sha256(&body);
    hub.route(
        "/token?service=registry.docker.io&scope=repository:ai/smollm2:pull",
        200,
        &[],
        r#"{"token":"T0K3N"}"#,
    );
    hub.route(
        "/v2/ai/smollm2/manifests/135M-Q4_0",
        200,
        &[],
        format!(r#"{{"layers":[{{"mediaType":"application/vnd.docker.ai.license","digest":"sha256:{}"}},{{"mediaType":"application/vnd.docker.ai.gguf.v3","digest":"sha256:{}"}}]}}"#, "0".repeat(64), digest.to_uppercase()),
    );
    hub.file(
        &format!("/v2/ai/smollm2/blobs/sha256:{digest}"),
        "\"b\"",
        &body,
    );
    let docker_hub = DockerHub {
        auth: format!("{}token", hub.url()),
        registry: format!("{}v2/", hub.url()),
    };
    let args = parse_server_args(&["-dr", "smollm2:135M-Q4_0"])
        .unwrap()
        .with_downloads_in(&e, &docker_hub)
        .unwrap();
    let path = cache.join("ai_smollm2_135M-Q4_0.gguf");
    assert_eq!(args.model.as_deref(), Some(path.to_str().unwrap()));
    assert_eq!(std::fs::read(&path).unwrap(), body);
    let manifest = hub
        .seen()
        .into_iter()
        .find(|s| s.path.contains("/manifests/"))
        .unwrap();
    assert_eq!(
        manifest.headers.get("authorization").map(String::as_str),
        Some("Bearer T0K3N")
    );
    // Offline: the cached file; a tag never fetched: refused naming the cache.
    let offline = parse_server_args(&["-dr", "smollm2:135M-Q4_0", "--offline"])
        .unwrap()
        .with_downloads_in(&e, &docker_hub)
        .unwrap();
    assert_eq!(offline.model, args.model);
    let m = parse_server_args(&["-dr", "smollm2:other", "--offline"])
        .unwrap()
        .with_downloads_in(&e, &docker_hub)
        .unwrap_err()
        .to_string();
    assert!(m.contains("ai/smollm2:other is not in the cache"), "{m}");
}

#[test]
fn the_draft_model_comes_from_its_own_repository() {
    let home = tempfile::tempdir().unwrap();
    let cdn = StandIn::start();
    let hub = hub(
        &[("d-Q8_0.gguf", b"draft q8"), ("d-F16.gguf", b"draft f16")],
        &cdn,
    );
    let args = resolve(
        &["-hfd", "org/model", "-md", "d-F16.gguf"],
        &env(home.path(), Some(&hub)),
    )
    .unwrap();
    let draft = args.spec_draft_model.unwrap();
    assert!(draft.ends_with("d-F16.gguf"), "{draft}");
    assert_eq!(std::fs::read(draft).unwrap(), b"draft f16");
    assert!(args.model.is_none());
    let args = resolve(
        &["--hf-repo-draft", "org/model"],
        &env(home.path(), Some(&hub)),
    )
    .unwrap();
    assert_eq!(
        std::fs::read(args.spec_draft_model.unwrap()).unwrap(),
        b"draft q8"
    );
}

#[test]
fn the_default_model_fetched_with_hf_loads_and_generates() {
    if super::support::skip_model_tests() {
        return;
    }
    let cache = mlxcel_model::cache_dir().unwrap();
    let source = mlxcel_model::DefaultModel::pinned()
        .ensure_gguf(&cache)
        .unwrap();
    let bytes = std::fs::read(&source).unwrap();
    let home = tempfile::tempdir().unwrap();
    let cdn = StandIn::start();
    let hub = hub(&[("SmolLM2-135M-Instruct-Q4_1.gguf", &bytes)], &cdn);
    let args = resolve(&["-hf", "org/model:Q4_1"], &env(home.path(), Some(&hub))).unwrap();
    let engine = mlxcel_engine::Engine::load(args.model.as_deref(), Default::default()).unwrap();
    let reference = super::support::engine();
    assert_eq!(engine.info().vocab_size, reference.info().vocab_size);
    let ids = reference.tokenize("The capital of France is").unwrap();
    let request = mlxcel_engine::GenerationRequest {
        sampling: mlxcel_engine::SamplingParams::greedy(),
        ..mlxcel_engine::GenerationRequest::new(ids, mlxcel_engine::MaxNewTokens::Limited(4))
    };
    let ours = engine.generate(request.clone()).unwrap();
    let theirs = reference.generate(request).unwrap();
    assert_eq!(ours.tokens, theirs.tokens);
    assert!(!ours.text.is_empty());
}

/// Every spelling of the download flags, and their environment twins, reaches its setting
/// (`LLAMA_ARG_HF_REPO`, `LLAMA_ARG_HF_FILE`, `HF_TOKEN`, `LLAMA_ARG_MODEL_URL`,
/// `LLAMA_ARG_DOCKER_REPO`, `LLAMA_ARG_SPEC_DRAFT_HF_REPO` and `LLAMA_ARG_OFFLINE` are read by
/// clap as the flags' `env`; bins/mlxcel-server/tests/cli.rs sets them on the real binary).
#[test]
fn every_download_spelling_reaches_its_setting() {
    for flag in ["-hf", "-hfr", "--hf-repo"] {
        let args = parse_server_args(&[flag, "a/b:Q8_0"]).unwrap();
        assert_eq!(args.download.hf_repo.as_deref(), Some("a/b:Q8_0"), "{flag}");
    }
    for flag in ["-hff", "--hf-file"] {
        let args = parse_server_args(&[flag, "x.gguf"]).unwrap();
        assert_eq!(args.download.hf_file.as_deref(), Some("x.gguf"), "{flag}");
    }
    for flag in ["-hft", "--hf-token"] {
        let args = parse_server_args(&[flag, "hf_t"]).unwrap();
        assert_eq!(args.download.hf_token.as_deref(), Some("hf_t"), "{flag}");
    }
    for flag in ["-mu", "--model-url"] {
        let args = parse_server_args(&[flag, "https://h/x.gguf"]).unwrap();
        assert_eq!(
            args.download.model_url.as_deref(),
            Some("https://h/x.gguf"),
            "{flag}"
        );
    }
    for flag in ["-dr", "--docker-repo"] {
        let args = parse_server_args(&[flag, "gemma3"]).unwrap();
        assert_eq!(
            args.download.docker_repo.as_deref(),
            Some("gemma3"),
            "{flag}"
        );
    }
    for flag in ["-hfd", "-hfrd", "--spec-draft-hf", "--hf-repo-draft"] {
        let args = parse_server_args(&[flag, "a/d"]).unwrap();
        assert_eq!(
            args.download.spec_draft_hf.as_deref(),
            Some("a/d"),
            "{flag}"
        );
    }
    assert!(parse_server_args(&["--offline"]).unwrap().download.offline);
    let accepted = mlxcel_server::accepted_spellings();
    for env in [
        "LLAMA_ARG_HF_REPO",
        "LLAMA_ARG_HF_FILE",
        "HF_TOKEN",
        "LLAMA_ARG_MODEL_URL",
        "LLAMA_ARG_DOCKER_REPO",
        "LLAMA_ARG_SPEC_DRAFT_HF_REPO",
        "LLAMA_ARG_OFFLINE",
    ] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
    // A bad value names the flag it came from.
    let home = tempfile::tempdir().unwrap();
    let e = env(home.path(), None);
    for (args, flag) in [
        (&["-hf", "nope"][..], "-hf/--hf-repo"),
        (&["-hfd", "nope"][..], "-hfd/--spec-draft-hf"),
        (&["-mu", "nope"][..], "-mu/--model-url"),
        (&["-dr", "a/b/c"][..], "-dr/--docker-repo"),
    ] {
        let m = resolve(args, &e).unwrap_err().to_string();
        assert!(m.contains(flag), "{m}");
    }
}
