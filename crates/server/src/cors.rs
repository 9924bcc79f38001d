//! CORS, as llama-server answers it (`--cors-origins`, `--cors-methods`, `--cors-headers`,
//! `--cors-credentials`): every response carries `Access-Control-Allow-Origin`; a preflight
//! `OPTIONS` on any path is answered before authentication (browsers send no key with it), with
//! the allowed methods, headers and credentials.

use hyper::HeaderMap;
use hyper::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue, ORIGIN, VARY,
};

/// The CORS settings; the defaults are llama-server's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsConfig {
    /// `*` (any origin), `localhost` (reflect only an origin whose host is `localhost`,
    /// `127.0.0.1` or `::1`), or a comma-separated list of origins.
    pub origins: String,
    /// `Access-Control-Allow-Methods` of preflight answers.
    pub methods: String,
    /// `Access-Control-Allow-Headers` of preflight answers.
    pub headers: String,
    /// Whether credentials are allowed; with origins `*` the request's `Origin` is echoed.
    pub credentials: bool,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            origins: "*".into(),
            methods: "GET, POST, DELETE, OPTIONS".into(),
            headers: "*".into(),
            credentials: true,
        }
    }
}

fn is_localhost(origin: &str) -> bool {
    let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or("");
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, _)| h)
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

impl CorsConfig {
    /// The `Access-Control-Allow-Origin` for a request from `origin`, if any.
    fn allow_origin(&self, origin: Option<&str>) -> Option<String> {
        let origins = self.origins.trim();
        match (origins, origin) {
            // As llama-server: with credentials, any origin is echoed back (a wildcard does not
            // allow credentials in browsers); without an Origin header, `*`.
            ("*", Some(origin)) if self.credentials => Some(origin.to_owned()),
            ("*", _) => Some("*".into()),
            ("localhost", Some(origin)) if is_localhost(origin) => Some(origin.to_owned()),
            ("localhost", _) => None,
            (list, origin) if list.contains(',') => {
                // A list: the request's origin when listed (browsers take one origin only).
                let origin = origin?;
                list.split(',')
                    .any(|o| o.trim() == origin)
                    .then(|| origin.to_owned())
            }
            (one, _) => Some(one.to_owned()),
        }
    }

    /// Adds `Access-Control-Allow-Origin` (and `Vary: Origin` when it depends on the request)
    /// to a response's headers.
    pub fn decorate(&self, origin: Option<&str>, headers: &mut HeaderMap) {
        if let Some(value) = self
            .allow_origin(origin)
            .and_then(|v| HeaderValue::from_str(&v).ok())
        {
            let echoed = origin.is_some_and(|o| value.as_bytes() == o.as_bytes());
            headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, value);
            if echoed {
                headers.append(VARY, HeaderValue::from_static("Origin"));
            }
        }
    }

    /// Adds the preflight headers.
    pub fn preflight(&self, headers: &mut HeaderMap) {
        let credentials = if self.credentials { "true" } else { "false" };
        headers.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static(credentials),
        );
        for (name, value) in [
            (ACCESS_CONTROL_ALLOW_METHODS, &self.methods),
            (ACCESS_CONTROL_ALLOW_HEADERS, &self.headers),
        ] {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        }
    }
}

/// The request's `Origin`, if it has a readable one.
pub fn origin(headers: &HeaderMap) -> Option<String> {
    headers
        .get(ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_answered_as_llama_server_answers_them() {
        let default = CorsConfig::default();
        assert_eq!(
            default.allow_origin(Some("https://a.example")).as_deref(),
            Some("https://a.example")
        );
        assert_eq!(default.allow_origin(None).as_deref(), Some("*"));
        let no_credentials = CorsConfig {
            credentials: false,
            ..CorsConfig::default()
        };
        assert_eq!(
            no_credentials
                .allow_origin(Some("https://a.example"))
                .as_deref(),
            Some("*")
        );
        let local = CorsConfig {
            origins: "localhost".into(),
            ..CorsConfig::default()
        };
        assert!(local.allow_origin(Some("http://localhost:5173")).is_some());
        assert!(local.allow_origin(Some("http://[::1]:80")).is_some());
        assert!(local.allow_origin(Some("http://127.0.0.1")).is_some());
        assert!(local.allow_origin(Some("https://evil.example")).is_none());
        let list = CorsConfig {
            origins: "https://a.example, https://b.example".into(),
            ..CorsConfig::default()
        };
        assert_eq!(
            list.allow_origin(Some("https://b.example")).as_deref(),
            Some("https://b.example")
        );
        assert!(list.allow_origin(Some("https://c.example")).is_none());
        let one = CorsConfig {
            origins: "https://a.example".into(),
            ..CorsConfig::default()
        };
        assert_eq!(
            one.allow_origin(Some("https://c.example")).as_deref(),
            Some("https://a.example")
        );
    }
}
