//! CORS: preflights on any path before authentication and loading, `Access-Control-Allow-Origin`
//! on every response to an allowed origin, local origins only by default (a page on the web may
//! not drive the server), credentials never with `*`, and the `--cors-*` flags.

use clap::Parser;
use hyper::StatusCode;
use mlxcel_server::{ApiKeys, CorsConfig, ServerArgs, ServerConfig, normalize_llama_args};

use crate::support::*;

/// A page served from this machine, which the default allows.
const ORIGIN: &str = "http://localhost:5173";

/// A page on the web, which the default does not allow.
const FOREIGN: &str = "https://app.example";

fn preflight_headers() -> [(&'static str, &'static str); 3] {
    preflight_from(ORIGIN)
}

fn preflight_from(origin: &'static str) -> [(&'static str, &'static str); 3] {
    [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        (
            "access-control-request-headers",
            "authorization, content-type",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_needs_no_key_and_every_response_allows_a_local_origin_only() {
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
        // 200 with an empty body, as llama-server answers a preflight.
        assert!(reply.body.is_empty(), "{path}: {}", reply.body);
        assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.body);
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
    assert_eq!(loading.headers["access-control-allow-credentials"], "true");
    // Without an Origin header (not a browser's cross-origin call): no CORS header.
    let plain = server.get("/health").await;
    assert!(plain.headers.get("access-control-allow-origin").is_none());
    // A page on the web gets nothing it could use: no origin, no credentials, no methods.
    for (method, path) in [("OPTIONS", "/v1/chat/completions"), ("GET", "/health")] {
        let reply = send(server.addr, method, path, &preflight_from(FOREIGN), None).await;
        for header in [
            "access-control-allow-origin",
            "access-control-allow-credentials",
            "access-control-allow-methods",
        ] {
            assert!(
                reply.headers.get(header).is_none(),
                "{method} {path}: {header}"
            );
        }
    }
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
            any_origin: false,
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
    assert!(
        reply
            .headers
            .get("access-control-allow-credentials")
            .is_none()
    );
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
            any_origin: false,
        }
    );
    let argv = ["mlxcel-server", "--cors-credentials"];
    let args = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server;
    assert_eq!(args.server_config().unwrap().cors, CorsConfig::default());
    // `*`: any origin, as `*` and never with credentials (a browser refuses them with a
    // wildcard; echoing any origin with them would hand every page the user's session).
    let any = TestServer::start(
        ServerConfig {
            cors: CorsConfig {
                origins: "*".into(),
                ..CorsConfig::default()
            },
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    for headers in [&[("origin", FOREIGN)][..], &[]] {
        let reply = send(any.addr, "GET", "/health", headers, None).await;
        assert_eq!(reply.headers["access-control-allow-origin"], "*");
        assert!(
            reply
                .headers
                .get("access-control-allow-credentials")
                .is_none()
        );
    }
    let argv = ["mlxcel-server", "--cors-origins", "*"];
    let args = Cli::try_parse_from(normalize_llama_args(argv))
        .unwrap()
        .server;
    assert_eq!(args.server_config().unwrap().cors.origins, "*");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_a_key_echoes_any_origin_unless_origins_are_given() {
    // llama-server's default (any origin) where a page gains nothing without the key; an
    // explicit `--cors-origins` still decides.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerArgs,
    }
    let config = |argv: &[&str]| {
        let argv = std::iter::once("mlxcel-server").chain(argv.iter().copied());
        Cli::try_parse_from(normalize_llama_args(argv))
            .unwrap()
            .server
            .server_config()
            .unwrap()
    };
    let keyed = TestServer::start(config(&["--api-key", "k"]), None).await;
    let reply = send(
        keyed.addr,
        "OPTIONS",
        "/completions",
        &preflight_from("web.mydomain.fr"),
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "web.mydomain.fr"
    );
    assert_eq!(reply.headers["access-control-allow-credentials"], "true");
    assert_eq!(
        reply.headers["access-control-allow-methods"],
        "GET, POST, DELETE, OPTIONS"
    );
    // The key is still required for the request itself.
    let reply = send(
        keyed.addr,
        "GET",
        "/v1/models",
        &[("origin", FOREIGN)],
        None,
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.headers["access-control-allow-origin"], FOREIGN);

    let listed = TestServer::start(
        config(&["--api-key", "k", "--cors-origins", "localhost"]),
        None,
    )
    .await;
    let reply = send(
        listed.addr,
        "OPTIONS",
        "/completions",
        &preflight_from(FOREIGN),
        None,
    )
    .await;
    assert!(reply.headers.get("access-control-allow-origin").is_none());
    let open = TestServer::start(config(&[]), None).await;
    let reply = send(
        open.addr,
        "OPTIONS",
        "/completions",
        &preflight_from(FOREIGN),
        None,
    )
    .await;
    assert!(reply.headers.get("access-control-allow-origin").is_none());
}
