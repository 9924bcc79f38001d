//! CORS as llama-server answers it: preflights on any path before authentication and loading,
//! `Access-Control-Allow-Origin` on every response, and the `--cors-*` flags.

use clap::Parser;
use hyper::StatusCode;
use mlxcel_server::{ApiKeys, CorsConfig, ServerArgs, ServerConfig, normalize_llama_args};

use crate::support::*;

const ORIGIN: &str = "https://app.example";

fn preflight_headers() -> [(&'static str, &'static str); 3] {
    [
        ("origin", ORIGIN),
        ("access-control-request-method", "POST"),
        (
            "access-control-request-headers",
            "authorization, content-type",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_needs_no_key_and_every_response_allows_the_origin() {
    // A key is required and the model is still loading: the preflight is answered anyway.
    let config = ServerConfig {
        api_keys: ApiKeys::new(vec!["k".into()]),
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, None).await;
    for path in [
        "/v1/chat/completions",
        "/completion",
        "/v1/models",
        "/unknown/path",
    ] {
        let reply = send(server.addr, "OPTIONS", path, &preflight_headers(), None).await;
        assert_eq!(
            reply.status,
            StatusCode::NO_CONTENT,
            "{path}: {}",
            reply.body
        );
        let h = &reply.headers;
        assert_eq!(h["access-control-allow-origin"], ORIGIN, "{path}");
        assert_eq!(
            h["access-control-allow-methods"],
            "GET, POST, DELETE, OPTIONS"
        );
        assert_eq!(h["access-control-allow-headers"], "*");
        assert_eq!(h["access-control-allow-credentials"], "true");
        assert!(reply.body.is_empty());
    }
    let known = send(
        server.addr,
        "OPTIONS",
        "/v1/models",
        &preflight_headers(),
        None,
    )
    .await;
    assert_eq!(known.headers["allow"], "GET, OPTIONS");
    // Normal answers (errors included) carry the origin too.
    let origin = [("origin", ORIGIN)];
    let unauthorized = send(server.addr, "GET", "/v1/models", &origin, None).await;
    assert_eq!(unauthorized.status, StatusCode::UNAUTHORIZED);
    assert_eq!(unauthorized.headers["access-control-allow-origin"], ORIGIN);
    let loading = send(server.addr, "GET", "/health", &origin, None).await;
    assert_eq!(loading.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(loading.headers["access-control-allow-origin"], ORIGIN);
    // Without an Origin header: `*`.
    let plain = server.get("/health").await;
    assert_eq!(plain.headers["access-control-allow-origin"], "*");
    // A 405 says what the path takes.
    let wrong = send(
        server.addr,
        "GET",
        "/v1/chat/completions",
        &[("authorization", "Bearer k")],
        None,
    )
    .await;
    assert_eq!(wrong.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(wrong.headers["allow"], "POST, OPTIONS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_origins_methods_headers_and_credentials() {
    let config = ServerConfig {
        cors: CorsConfig {
            origins: "localhost".into(),
            methods: "GET, POST".into(),
            headers: "content-type".into(),
            credentials: false,
        },
        ..ServerConfig::default()
    };
    let server = TestServer::start(config, None).await;
    let local = [("origin", "http://localhost:5173")];
    let reply = send(server.addr, "OPTIONS", "/completion", &local, None).await;
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "http://localhost:5173"
    );
    assert_eq!(reply.headers["access-control-allow-methods"], "GET, POST");
    assert_eq!(
        reply.headers["access-control-allow-headers"],
        "content-type"
    );
    assert_eq!(reply.headers["access-control-allow-credentials"], "false");
    // `localhost` reflects only localhost origins.
    let remote = [("origin", "https://evil.example")];
    let reply = send(server.addr, "GET", "/health", &remote, None).await;
    assert!(reply.headers.get("access-control-allow-origin").is_none());

    // The flags reach the settings.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerArgs,
    }
    let argv = [
        "mlxcel-server",
        "--cors-origins",
        "https://a.example,https://b.example",
        "--cors-methods",
        "GET",
        "--cors-headers",
        "x-custom",
        "--no-cors-credentials",
    ];
    let args = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server;
    let cors = args.server_config().unwrap().cors;
    assert_eq!(
        cors,
        CorsConfig {
            origins: "https://a.example,https://b.example".into(),
            methods: "GET".into(),
            headers: "x-custom".into(),
            credentials: false,
        }
    );
    let argv = ["mlxcel-server", "--cors-credentials"];
    let args = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server;
    assert_eq!(args.server_config().unwrap().cors, CorsConfig::default());
    // Each flag's environment twin is accepted.
    let accepted = mlxcel_server::accepted_spellings();
    for env in [
        "LLAMA_ARG_CORS_ORIGINS",
        "LLAMA_ARG_CORS_METHODS",
        "LLAMA_ARG_CORS_HEADERS",
        "LLAMA_ARG_CORS_CREDENTIALS",
    ] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
}
