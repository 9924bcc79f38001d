//! [`Transport`] over the server's outbound client ([`crate::outbound`]), on a runtime of its own:
//! the downloads run before the server's runtime starts, one blocking call each.

use hyper::Method;
use hyper::header::LOCATION;

use super::error::DownloadError;
use super::transport::{Head, Sink, Transport};
use crate::outbound::{Client, MAX_REDIRECTS, OutboundError, Response, Timeouts, join_url};

pub struct OutboundTransport {
    client: Client,
    runtime: tokio::runtime::Runtime,
}

impl OutboundTransport {
    pub fn new() -> Result<Self, DownloadError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DownloadError::Network {
                url: String::new(),
                detail: format!("cannot start the download runtime: {e}"),
            })?;
        // The client's pool needs the runtime it runs on.
        let client = runtime.block_on(async { Client::new(Timeouts::default()) });
        Ok(Self { client, runtime })
    }
}

fn network(err: OutboundError) -> DownloadError {
    DownloadError::Network {
        url: err.url.clone(),
        detail: err.what,
    }
}

fn head_of(response: &Response) -> Head {
    Head {
        status: response.status.as_u16(),
        headers: response
            .headers
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
    }
}

/// The host part of a URL (`scheme://host[:port]`).
fn origin(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    &url[..url.len() - rest.len() + end]
}

impl OutboundTransport {
    /// Sends `method url`, following redirects; `authorization` is dropped when a redirect
    /// leaves the first origin (a CDN's signed URL needs none, and must not see the token).
    async fn follow(
        &self,
        method: Method,
        url: &str,
        headers: &[(String, String)],
    ) -> Result<Response, DownloadError> {
        let first = origin(url).to_owned();
        let mut current = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let same_origin = origin(&current) == first;
            let sent: Vec<(&str, &str)> = headers
                .iter()
                .filter(|(n, _)| same_origin || !n.eq_ignore_ascii_case("authorization"))
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            let response = self
                .client
                .send(method.clone(), &current, &sent, bytes::Bytes::new())
                .await
                .map_err(network)?;
            if !response.status.is_redirection() {
                return Ok(response);
            }
            let Some(location) = response.headers.get(LOCATION).and_then(|v| v.to_str().ok())
            else {
                return Ok(response);
            };
            current = join_url(&current, location);
        }
        Err(DownloadError::Network {
            url: url.to_owned(),
            detail: format!("more than {MAX_REDIRECTS} redirects"),
        })
    }
}

impl Transport for OutboundTransport {
    fn head(&self, url: &str, headers: &[(String, String)]) -> Result<Head, DownloadError> {
        self.runtime.block_on(async {
            let response = self.follow(Method::HEAD, url, headers).await?;
            Ok(head_of(&response))
        })
    }

    fn get(
        &self,
        url: &str,
        headers: &[(String, String)],
        sink: &mut dyn Sink,
    ) -> Result<Head, DownloadError> {
        self.runtime.block_on(async {
            let mut response = self.follow(Method::GET, url, headers).await?;
            let head = head_of(&response);
            if !sink.start(&head) {
                return Ok(head);
            }
            while let Some(chunk) = response.chunk().await.map_err(network)? {
                sink.chunk(&chunk).map_err(|e| DownloadError::Network {
                    url: url.to_owned(),
                    detail: format!("cannot keep the body: {e}"),
                })?;
            }
            Ok(head)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::origin;

    #[test]
    fn origins() {
        assert_eq!(origin("https://h.co/a/b?x"), "https://h.co");
        assert_eq!(origin("http://127.0.0.1:8/x"), "http://127.0.0.1:8");
        assert_eq!(origin("https://h.co"), "https://h.co");
    }
}
