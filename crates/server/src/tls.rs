//! TLS on the listeners (`--ssl-cert-file`, `--ssl-key-file`), as llama-server serves HTTPS: a
//! PEM certificate chain and a PEM private key (PKCS#8, PKCS#1 or SEC1), read once at start.
//! Every listener then speaks only TLS (TLS 1.2 and 1.3, rustls on the ring provider; HTTP/1.1
//! inside, as without TLS).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig as RustlsConfig};

use crate::error::ServerError;

/// The files TLS is served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// `--ssl-cert-file`: the certificate chain, leaf first.
    pub cert: PathBuf,
    /// `--ssl-key-file`: the leaf's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The pair from the two flags: both or neither (one alone is refused, naming the other).
    pub fn from_flags(
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Option<TlsFiles>, ServerError> {
        match (cert, key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert: cert.to_owned(),
                key: key.to_owned(),
            })),
            (Some(_), None) => Err(ServerError::Flag(
                "--ssl-cert-file needs --ssl-key-file (the certificate's private key)".into(),
            )),
            (None, Some(_)) => Err(ServerError::Flag(
                "--ssl-key-file needs --ssl-cert-file (the key's certificate)".into(),
            )),
        }
    }

    /// Reads the files into an acceptor; errors name the file and what is wrong with it.
    pub fn acceptor(&self) -> Result<TlsAcceptor, ServerError> {
        let bad = |flag: &str, path: &Path, what: String| {
            ServerError::Flag(format!("{flag} {}: {what}", path.display()))
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|err| bad("--ssl-cert-file", &self.cert, err.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|err| bad("--ssl-cert-file", &self.cert, err.to_string()))?;
        if certs.is_empty() {
            return Err(bad(
                "--ssl-cert-file",
                &self.cert,
                "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(|err| {
            bad(
                "--ssl-key-file",
                &self.key,
                format!("{err} (expected a PEM private key: PKCS#8, PKCS#1 or SEC1)"),
            )
        })?;
        // ring rather than aws-lc-rs, whose build needs CMake and NASM on a fresh machine; ring
        // has no post-quantum key exchange, which is what rustls' deprecation note is about.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = RustlsConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| ServerError::Flag(format!("TLS: {err}")))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|err| {
                ServerError::Flag(format!(
                    "--ssl-key-file {} does not go with --ssl-cert-file {}: {err}",
                    self.key.display(),
                    self.cert.display()
                ))
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}
