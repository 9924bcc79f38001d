//! HTTPS (`--ssl-cert-file`, `--ssl-key-file`): a server started with a certificate and its key
//! answers over TLS (a client that trusts the certificate gets llama-server's answers), refuses
//! plain HTTP, and refuses to start on a missing, malformed or mismatched file, naming it.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use mlxcel_server::{Server, ServerConfig, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

use crate::support::*;

/// A self-signed certificate for `localhost` and its key, written to `dir`.
fn certificate(dir: &std::path::Path, name: &str) -> (TlsFiles, CertificateDer<'static>) {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let files = TlsFiles {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key_pair.serialize_pem()).unwrap();
    (files, cert.der().clone())
}

fn connector(trusted: CertificateDer<'static>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(trusted).unwrap();
    #[allow(deprecated)] // the server's provider (src/tls.rs says why)
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_over_tls_and_refuses_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let (files, der) = certificate(dir.path(), "server");
    let server = TestServer::start(
        ServerConfig {
            tls: Some(files),
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let tls = connector(der)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("the handshake with a trusted certificate");
    let (mut sender, connection) = http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(connection);
    let request = Request::get("/health")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    // No model yet: llama-server's "loading" answer, over TLS.
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("loading"),
        "{body:?}"
    );

    // Plain HTTP on the same port gets no HTTP answer.
    let mut plain = TcpStream::connect(server.addr).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        plain.read_to_end(&mut answer),
    )
    .await;
    assert!(
        !String::from_utf8_lossy(&answer).starts_with("HTTP/1.1"),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_certificate_files_stop_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (good, _) = certificate(dir.path(), "one");
    let (other, _) = certificate(dir.path(), "two");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let cases = [
        (
            TlsFiles {
                cert: dir.path().join("missing.pem"),
                key: good.key.clone(),
            },
            "--ssl-cert-file",
        ),
        (
            TlsFiles {
                cert: garbage.clone(),
                key: good.key.clone(),
            },
            "no PEM certificate",
        ),
        (
            TlsFiles {
                cert: good.cert.clone(),
                key: garbage,
            },
            "--ssl-key-file",
        ),
        (
            TlsFiles {
                cert: good.cert.clone(),
                key: other.key.clone(),
            },
            "does not go with",
        ),
    ];
    for (files, expected) in cases {
        let config = ServerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            tls: Some(files),
            ..ServerConfig::default()
        };
        let err = Server::bind(config).await.unwrap_err().to_string();
        assert!(err.contains(expected), "{expected}: {err}");
    }
}

/// The flags: both files give the server its TLS settings; one alone stops the start, naming
/// the other; the environment twins are accepted.
#[test]
fn the_ssl_flags_come_together() {
    let parse = |args: &[&str]| parse_server_args(args).unwrap().server_config();
    let config = parse(&["--ssl-cert-file", "c.pem", "--ssl-key-file", "k.pem"]).unwrap();
    assert_eq!(
        config.tls,
        Some(TlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into()
        })
    );
    assert_eq!(parse(&[]).unwrap().tls, None);
    let err = parse(&["--ssl-cert-file", "c.pem"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("--ssl-key-file"), "{err}");
    let err = parse(&["--ssl-key-file", "k.pem"]).unwrap_err().to_string();
    assert!(err.contains("--ssl-cert-file"), "{err}");
    let accepted = mlxcel_server::accepted_spellings();
    for env in ["LLAMA_ARG_SSL_CERT_FILE", "LLAMA_ARG_SSL_KEY_FILE"] {
        assert!(accepted.iter().any(|a| a == env), "{env}");
    }
}
