//! Outbound HTTP(S): the server as a client (the CORS proxy, downloads). HTTP/1.1 over hyper-util's
//! pooled client; `https` through rustls (ring provider, TLS 1.2 and 1.3) trusting the system's
//! root certificates (rustls-native-certs: the OS store, or `SSL_CERT_FILE`/`SSL_CERT_DIR`).
//!
//! Every error names the method and the URL (with any `user:password@` removed) and says what
//! failed: the URL itself, connecting, TLS, a timeout, or the peer's reply.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio_rustls::rustls;

/// Redirects a caller that follows them (the model downloads, the CORS proxy) follows before it
/// gives up.
pub const MAX_REDIRECTS: usize = 10;

/// What went wrong with one outbound request.
#[derive(Debug)]
pub struct OutboundError {
    /// `GET`, `POST`...
    pub method: String,
    /// The URL, without credentials.
    pub url: String,
    /// What failed.
    pub what: String,
}

impl fmt::Display for OutboundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.method, self.url, self.what)
    }
}

impl std::error::Error for OutboundError {}

/// `url` with any `user[:password]@` taken out of its authority, for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{host}{tail}"),
        None => url.to_owned(),
    }
}

/// Timeouts of a [`Client`].
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Connecting (TCP, then TLS).
    pub connect: Duration,
    /// From the request sent to the response's status and headers.
    pub response: Duration,
    /// The longest wait for the next chunk of a response body.
    pub read: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(30),
            response: Duration::from_secs(600),
            read: Duration::from_secs(600),
        }
    }
}

/// An HTTP(S) client; cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeouts: Timeouts,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// The system's root certificates, read once; an empty store only fails `https` requests.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for err in &found.errors {
                tracing::warn!("system root certificates: {err}");
            }
            let (added, ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    "no system root certificates found ({ignored} unusable): https requests will fail; install the ca-certificates package or set SSL_CERT_FILE"
                );
            }
            // ring, as the server's TLS (tls.rs): no post-quantum key exchange, which is what
            // rustls' deprecation note is about.
            #[allow(deprecated)]
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports TLS 1.2 and 1.3")
                .with_root_certificates(roots)
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

impl Client {
    /// A client with `timeouts`.
    pub fn new(timeouts: Timeouts) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeouts.connect));
        http.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls_config()).clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let inner = HyperClient::builder(TokioExecutor::new()).build(https);
        Self { inner, timeouts }
    }

    /// `GET url` with `headers`.
    pub async fn get(
        &self,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response, OutboundError> {
        self.send(Method::GET, url, headers, Bytes::new()).await
    }

    /// `POST url` with `headers` and `body`.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response, OutboundError> {
        self.send(Method::POST, url, headers, body).await
    }

    /// Sends one request (no redirect is followed) and waits for the response's head; the body
    /// is read from the [`Response`].
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Response, OutboundError> {
        let fail = |what: String| OutboundError {
            method: method.to_string(),
            url: redact(url),
            what,
        };
        let uri: Uri = url.parse().map_err(|e| fail(format!("invalid URL: {e}")))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            Some(other) => {
                return Err(fail(format!(
                    "unsupported scheme {other:?} (http or https)"
                )));
            }
            None => return Err(fail("no scheme (http:// or https://)".into())),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(fail("no host".into()));
        }
        let mut request = hyper::Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| fail(e.to_string()))?;
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| fail(format!("invalid header name {name:?}")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| fail(format!("invalid value of header {name}")))?;
            request.headers_mut().append(name, value);
        }
        let response = tokio::time::timeout(self.timeouts.response, self.inner.request(request))
            .await
            .map_err(|_| {
                fail(format!(
                    "no response within {}s",
                    self.timeouts.response.as_secs()
                ))
            })?
            .map_err(|e| fail(describe(&e)))?;
        let (head, body) = response.into_parts();
        Ok(Response {
            status: head.status,
            headers: head.headers,
            body,
            read_timeout: self.timeouts.read,
            method: method.to_string(),
            url: redact(url),
        })
    }
}

impl Default for Client {
    fn default() -> Self {
        Self::new(Timeouts::default())
    }
}

/// `location` (absolute, or relative to `base`) as an absolute URL.
pub fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_owned();
    }
    let Ok(uri) = base.parse::<Uri>() else {
        return location.to_owned();
    };
    let scheme = uri.scheme_str().unwrap_or("http");
    let authority = uri.authority().map_or("", |a| a.as_str());
    if let Some(rest) = location.strip_prefix("//") {
        return format!("{scheme}://{rest}");
    }
    if location.starts_with('/') {
        return format!("{scheme}://{authority}{location}");
    }
    let path = uri.path();
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    format!("{scheme}://{authority}{dir}{location}")
}

/// hyper-util's error with its causes (the useful part, e.g. "connection refused", is a cause).
fn describe(err: &hyper_util::client::legacy::Error) -> String {
    let mut text = if err.is_connect() {
        "cannot connect".to_owned()
    } else {
        err.to_string()
    };
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A response whose head has arrived; its body is read in chunks or whole.
#[derive(Debug)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    body: Incoming,
    read_timeout: Duration,
    method: String,
    url: String,
}

impl Response {
    fn error(&self, what: String) -> OutboundError {
        OutboundError {
            method: self.method.clone(),
            url: self.url.clone(),
            what,
        }
    }

    /// The next chunk of the body; `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, OutboundError> {
        loop {
            let frame = tokio::time::timeout(self.read_timeout, self.body.frame())
                .await
                .map_err(|_| {
                    self.error(format!(
                        "no data for {}s while reading the body",
                        self.read_timeout.as_secs()
                    ))
                })?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(self.error(format!("reading the body: {e}"))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The whole body, refused when longer than `limit` bytes.
    pub async fn bytes(&mut self, limit: usize) -> Result<Bytes, OutboundError> {
        let mut out = Vec::new();
        while let Some(chunk) = self.chunk().await? {
            if out.len() + chunk.len() > limit {
                return Err(self.error(format!("body longer than {limit} bytes")));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A one-request-per-connection HTTP server on 127.0.0.1: `/echo` answers with the request's
    /// method, headers and body; any other path is a 404.
    async fn serve() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        let n = stream.read(&mut chunk).await.unwrap();
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse().ok())?
                        })
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        let n = stream.read(&mut chunk).await.unwrap();
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let body = &buf[head_end..head_end + length];
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let (status, extra, payload): (&str, String, Vec<u8>) = match path.as_str() {
                        "/echo" => {
                            let mut text = head.clone();
                            text.push_str(&String::from_utf8_lossy(body));
                            ("200 OK", String::new(), text.into_bytes())
                        }
                        _ => ("404 Not Found", String::new(), b"no such thing".to_vec()),
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
                        payload.len()
                    );
                    stream.write_all(reply.as_bytes()).await.unwrap();
                    stream.write_all(&payload).await.unwrap();
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn post_sends_headers_and_body_and_reads_the_reply() {
        let base = serve().await;
        let client = Client::default();
        let mut response = client
            .post(
                &format!("{base}/echo"),
                &[("x-test", "yes"), ("content-type", "text/plain")],
                Bytes::from_static(b"hello body"),
            )
            .await
            .unwrap();
        assert_eq!(response.status, StatusCode::OK);
        let text = String::from_utf8(response.bytes(1 << 20).await.unwrap().to_vec()).unwrap();
        assert!(text.starts_with("POST /echo HTTP/1.1\r\n"), "{text}");
        assert!(text.to_ascii_lowercase().contains("x-test: yes"), "{text}");
        assert!(text.ends_with("hello body"), "{text}");
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_url_without_credentials() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let err = Client::default()
            .get(&format!("http://user:secret@127.0.0.1:{port}/x"), &[])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("GET http://127.0.0.1:{port}/x: cannot connect")),
            "{err}"
        );
        assert!(!err.contains("secret"), "{err}");
    }

    #[tokio::test]
    async fn other_schemes_are_refused() {
        let err = Client::default()
            .get("ftp://example.com/x", &[])
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("unsupported scheme \"ftp\""),
            "{err}"
        );
    }

    #[test]
    fn redirects_join_against_the_current_url() {
        assert_eq!(join_url("http://a:1/x/y", "/z"), "http://a:1/z");
        assert_eq!(join_url("http://a:1/x/y", "z"), "http://a:1/x/z");
        assert_eq!(join_url("https://a/x", "//b/c"), "https://b/c");
        assert_eq!(join_url("http://a/x", "https://c/d"), "https://c/d");
        assert_eq!(redact("https://u:p@h:1/a@b"), "https://h:1/a@b");
    }
}
