//! What a download needs from HTTP: a HEAD and a streamed GET with headers. The downloads are
//! written against this trait; the server's outbound client implements it, and the tests run the
//! same code against a local server.

use super::error::DownloadError;

/// A response's status and headers (names lower-cased).
#[derive(Debug, Clone, Default)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `Content-Length`, when it is a number.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }

    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Where a body goes: called once with the response's head (return `false` to stop before the
/// body), then with each chunk.
pub trait Sink {
    fn start(&mut self, head: &Head) -> bool;
    fn chunk(&mut self, bytes: &[u8]) -> std::io::Result<()>;
}

/// HTTP as the downloads use it. Redirects are followed (the Hub answers a file with a redirect to
/// its CDN); `headers` are sent on the first request and, for a redirect to the same host, on the
/// next.
pub trait Transport: Send + Sync {
    fn head(&self, url: &str, headers: &[(String, String)]) -> Result<Head, DownloadError>;
    fn get(
        &self,
        url: &str,
        headers: &[(String, String)],
        sink: &mut dyn Sink,
    ) -> Result<Head, DownloadError>;
}

/// A GET into memory, at most `limit` bytes (API answers, tokens, manifests).
pub fn get_bytes(
    transport: &dyn Transport,
    url: &str,
    headers: &[(String, String)],
    limit: usize,
) -> Result<(Head, Vec<u8>), DownloadError> {
    struct Buffer {
        bytes: Vec<u8>,
        limit: usize,
    }
    impl Sink for Buffer {
        fn start(&mut self, _: &Head) -> bool {
            true
        }
        fn chunk(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            if self.bytes.len() + bytes.len() > self.limit {
                return Err(std::io::Error::other(format!(
                    "the answer is larger than {} bytes",
                    self.limit
                )));
            }
            self.bytes.extend_from_slice(bytes);
            Ok(())
        }
    }
    let mut buffer = Buffer {
        bytes: Vec::new(),
        limit,
    };
    let head = transport.get(url, headers, &mut buffer)?;
    Ok((head, buffer.bytes))
}

/// A GET of JSON: a non-2xx answer is an error carrying the status and the body's `error` text.
pub fn get_json(
    transport: &dyn Transport,
    url: &str,
    headers: &[(String, String)],
) -> Result<serde_json::Value, DownloadError> {
    let (head, body) = get_bytes(transport, url, headers, 64 << 20)?;
    let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
    if !head.ok() {
        let detail = json
            .as_ref()
            .and_then(|j| j.get("error"))
            .and_then(|e| e.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
        return Err(DownloadError::Status {
            url: url.to_owned(),
            status: head.status,
            detail,
        });
    }
    json.ok_or_else(|| DownloadError::Protocol {
        url: url.to_owned(),
        detail: "the answer is not JSON".into(),
    })
}
