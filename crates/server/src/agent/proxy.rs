//! `GET`/`POST /cors-proxy?url=<URL>` (`--ui-mcp-proxy`, `-ag`): a browser page reaches an MCP
//! server that sends no CORS headers through this server, as llama-server's web UI does. Only
//! `http` and `https` URLs with a host and without credentials; of the request's headers only
//! `X-Llama-Server-Proxy-Header-<Name>` ones are sent, as `<Name>` (never `Accept-Encoding`,
//! `Transfer-Encoding`, `Content-Length` or `Host`); redirects are followed; the reply's status,
//! headers (less `Server`, `Transfer-Encoding`, `Content-Length`, `Keep-Alive` and
//! `Access-Control-*`, which this server sets itself) and body are passed on as they arrive.

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, LOCATION};
use hyper::{HeaderMap, Method, Response, StatusCode};
use tokio::sync::mpsc;

use crate::body::Body;
use crate::outbound::{Client, MAX_REDIRECTS, Timeouts};

use super::reply::llama_error;

const PREFIX: &str = "x-llama-server-proxy-header-";

/// The target of `?url=`, checked; errors are llama-server's messages.
pub fn target(query: &str) -> Result<String, String> {
    let url = query
        .split('&')
        .filter_map(|p| p.split_once('=').or(Some((p, ""))))
        .find(|(k, _)| *k == "url")
        .map(|(_, v)| percent_decode(v))
        .unwrap_or_default();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "invalid URL: no scheme".to_owned())?;
    if scheme != "http" && scheme != "https" {
        return Err(format!("unsupported URL scheme: {scheme}"));
    }
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    if authority.contains('@') {
        return Err("authentication in target URL is not supported".into());
    }
    if authority.is_empty() || authority.starts_with(':') {
        return Err("invalid target URL: missing host".into());
    }
    Ok(url)
}

/// `%XX` and `+` decoded (a query string's encoding).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The headers sent on: the prefixed ones, without their prefix, less those the client sets.
pub fn forwarded_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.as_str().strip_prefix(PREFIX)?;
            if name.is_empty()
                || matches!(
                    name,
                    "accept-encoding" | "transfer-encoding" | "content-length" | "host"
                )
            {
                return None;
            }
            Some((name.to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

/// Whether a reply header stays behind.
fn stripped(name: &str) -> bool {
    matches!(
        name,
        "server" | "transfer-encoding" | "content-length" | "keep-alive" | "connection"
    ) || name.starts_with("access-control-")
}

/// Proxies one request.
pub async fn proxy(
    method: Method,
    query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response<Body>, String> {
    let url = target(query)?;
    let sent = forwarded_headers(headers);
    let pairs: Vec<(&str, &str)> = sent.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let client = Client::new(Timeouts::default());
    let (mut method, mut current, mut body) = (method, url, body);
    tracing::info!(
        "proxying {method} request to {}",
        crate::outbound::redact(&current)
    );
    let mut response = client
        .send(method.clone(), &current, &pairs, body.clone())
        .await;
    let mut hops = 0;
    while let Ok(r) = &response
        && r.status.is_redirection()
        && hops < MAX_REDIRECTS
        && let Some(location) = r.headers.get(LOCATION).and_then(|v| v.to_str().ok())
    {
        hops += 1;
        current = crate::outbound::join_url(&current, location);
        if r.status == StatusCode::SEE_OTHER {
            method = Method::GET;
            body = Bytes::new();
        }
        response = client
            .send(method.clone(), &current, &pairs, body.clone())
            .await;
    }
    let mut upstream = match response {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("proxy error: {e}");
            return Ok(crate::body::full(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("proxy error: {}", e.what).into_bytes(),
            ));
        }
    };
    let (tx, rx) = mpsc::channel(16);
    let mut out = Response::new(Body::Channel(rx));
    *out.status_mut() = upstream.status;
    for (name, value) in &upstream.headers {
        if !stripped(name.as_str()) {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    if !out.headers().contains_key(hyper::header::CONTENT_TYPE) {
        out.headers_mut().insert(
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    tokio::spawn(async move {
        loop {
            match upstream.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(chunk).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("proxy: {e}");
                    return;
                }
            }
        }
    });
    Ok(out)
}

/// A refused target as llama-server answers it (500, its message).
pub fn refused(message: &str) -> Response<Body> {
    llama_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        message,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_urls_with_a_host_and_no_credentials_pass() {
        assert_eq!(
            target("url=http%3A%2F%2Fa.b%3A8%2Fx%3Fy%3D1").unwrap(),
            "http://a.b:8/x?y=1"
        );
        assert_eq!(target("url=https://a.b").unwrap(), "https://a.b");
        assert_eq!(
            target("url=ftp://a.b").unwrap_err(),
            "unsupported URL scheme: ftp"
        );
        assert_eq!(target("").unwrap_err(), "invalid URL: no scheme");
        assert_eq!(
            target("url=http:///x").unwrap_err(),
            "invalid target URL: missing host"
        );
        assert_eq!(
            target("url=http://u:p@a.b/").unwrap_err(),
            "authentication in target URL is not supported"
        );
        assert_eq!(
            target("url=http://u@a.b/").unwrap_err(),
            "authentication in target URL is not supported"
        );
    }

    #[test]
    fn only_prefixed_headers_are_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer server-key"),
        );
        h.insert("cookie", HeaderValue::from_static("c=1"));
        h.insert(
            "x-llama-server-proxy-header-authorization",
            HeaderValue::from_static("Bearer mcp"),
        );
        h.insert(
            "x-llama-server-proxy-header-mcp-session-id",
            HeaderValue::from_static("s1"),
        );
        h.insert(
            "x-llama-server-proxy-header-host",
            HeaderValue::from_static("evil"),
        );
        h.insert(
            "x-llama-server-proxy-header-content-length",
            HeaderValue::from_static("9"),
        );
        let mut got = forwarded_headers(&h);
        got.sort();
        assert_eq!(
            got,
            [
                ("authorization".to_owned(), "Bearer mcp".to_owned()),
                ("mcp-session-id".to_owned(), "s1".to_owned()),
            ]
        );
    }
}
