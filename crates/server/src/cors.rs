//! CORS (`--cors-origins`, `--cors-methods`, `--cors-headers`, `--cors-credentials`, llama-server's
//! flags), with a safe default: only web pages served from this machine (`http(s)://localhost`,
//! `127.0.0.1`, `[::1]`, any port) may call the API from a browser, as ollama allows, so that a
//! page on the web cannot drive a server started without a key. A server that requires a key
//! (and has no `--cors-origins`) echoes any origin, as llama-server does: a page gets nothing
//! without the key, which it has only if its user gave it (keys travel in headers, never in
//! cookies, so a browser's credentials add nothing). `--cors-origins` lists other origins, or `*`
//! for any. Credentials are allowed only for an origin that is local, listed or echoed, never
//! with `*`. A browser's preflight `OPTIONS` on any path is answered before authentication
//! (browsers send no key with it).

use hyper::HeaderMap;
use hyper::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue, ORIGIN, VARY,
};

/// The CORS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsConfig {
    /// `localhost` (local origins only, the default), `*` (any origin), or a comma-separated list
    /// of origins, which may include `localhost`.
    pub origins: String,
    /// `Access-Control-Allow-Methods` of preflight answers.
    pub methods: String,
    /// `Access-Control-Allow-Headers` of preflight answers.
    pub headers: String,
    /// Whether credentials are allowed (for a local, listed or echoed origin only).
    pub credentials: bool,
    /// Every origin is echoed, whatever `origins` says: the server requires a key and no
    /// `--cors-origins` was given.
    pub any_origin: bool,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self {
            origins: "localhost".into(),
            methods: "GET, POST, DELETE, OPTIONS".into(),
            headers: "*".into(),
            credentials: true,
            any_origin: false,
        }
    }
}

/// Whether `origin` is a web page on this machine: scheme `http` or `https`, host `localhost`,
/// `127.0.0.1` or `[::1]`, any port.
fn is_local(origin: &str) -> bool {
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((host, rest)) = v6.split_once(']') else {
            return false;
        };
        match rest.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if rest.is_empty() => (host, None),
            None => return false,
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    port_ok
        && matches!(
            host.to_ascii_lowercase().as_str(),
            "localhost" | "127.0.0.1" | "::1"
        )
}

/// What a request from an origin is allowed.
#[derive(Debug, PartialEq, Eq)]
enum Allowed {
    /// `Access-Control-Allow-Origin: *`, without credentials.
    Any,
    /// The origin echoed back (local or listed), with credentials when they are on.
    Origin(String),
}

impl CorsConfig {
    /// What a request from `origin` is allowed; `None`: no CORS header (the browser refuses).
    fn allowed(&self, origin: Option<&str>) -> Option<Allowed> {
        let origins = self.origins.trim();
        if origins == "*" {
            return Some(Allowed::Any);
        }
        let origin = origin?;
        if self.any_origin {
            return Some(Allowed::Origin(origin.to_owned()));
        }
        origins
            .split(',')
            .map(str::trim)
            .any(|o| o == origin || (o == "localhost" && is_local(origin)))
            .then(|| Allowed::Origin(origin.to_owned()))
    }

    /// Adds `Access-Control-Allow-Origin` (with `Vary: Origin` and, when on, credentials for an
    /// echoed origin) to a response's headers.
    pub fn decorate(&self, origin: Option<&str>, headers: &mut HeaderMap) {
        match self.allowed(origin) {
            Some(Allowed::Any) => {
                headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            }
            Some(Allowed::Origin(origin)) => {
                let Ok(value) = HeaderValue::from_str(&origin) else {
                    return;
                };
                headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, value);
                if self.credentials {
                    headers.insert(
                        ACCESS_CONTROL_ALLOW_CREDENTIALS,
                        HeaderValue::from_static("true"),
                    );
                }
            }
            None => {}
        }
        if self.origins.trim() != "*" {
            headers.append(VARY, HeaderValue::from_static("Origin"));
        }
    }

    /// Adds the preflight headers (methods and headers) for a preflight from `origin`, when it is
    /// allowed.
    pub fn preflight(&self, origin: Option<&str>, headers: &mut HeaderMap) {
        if self.allowed(origin).is_none() {
            return;
        }
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

    fn echoed(origin: &str) -> Option<Allowed> {
        Some(Allowed::Origin(origin.to_owned()))
    }

    #[test]
    fn only_local_origins_by_default() {
        let default = CorsConfig::default();
        for local in [
            "http://localhost",
            "http://localhost:5173",
            "https://127.0.0.1:8443",
            "http://[::1]:80",
            "http://[::1]",
            "http://LocalHost:3000",
        ] {
            assert_eq!(default.allowed(Some(local)), echoed(local), "{local}");
        }
        for foreign in [
            "https://evil.example",
            "http://localhost.evil.example",
            "http://evil.example:80#localhost",
            "http://127.0.0.1.evil.example",
            "file://localhost",
            "null",
            "http://localhost:80/path",
            "http://localhost:",
            "http://[::1]x",
        ] {
            assert_eq!(default.allowed(Some(foreign)), None, "{foreign}");
        }
        assert_eq!(default.allowed(None), None);
    }

    #[test]
    fn listed_origins_and_the_wildcard() {
        let list = CorsConfig {
            origins: "https://a.example, localhost".into(),
            ..CorsConfig::default()
        };
        assert_eq!(
            list.allowed(Some("https://a.example")),
            echoed("https://a.example")
        );
        assert_eq!(
            list.allowed(Some("http://localhost:1")),
            echoed("http://localhost:1")
        );
        assert_eq!(list.allowed(Some("https://c.example")), None);
        let one = CorsConfig {
            origins: "https://a.example".into(),
            ..CorsConfig::default()
        };
        assert_eq!(one.allowed(Some("http://localhost")), None);
        let any = CorsConfig {
            origins: "*".into(),
            ..CorsConfig::default()
        };
        assert_eq!(any.allowed(Some("https://c.example")), Some(Allowed::Any));
        assert_eq!(any.allowed(None), Some(Allowed::Any));
    }

    #[test]
    fn a_keyed_server_echoes_any_origin() {
        let keyed = CorsConfig {
            any_origin: true,
            ..CorsConfig::default()
        };
        assert_eq!(
            keyed.allowed(Some("web.mydomain.fr")),
            echoed("web.mydomain.fr")
        );
        assert_eq!(keyed.allowed(None), None);
    }

    #[test]
    fn credentials_never_go_with_a_wildcard_or_a_foreign_origin() {
        let header = |config: &CorsConfig, origin: &str| {
            let mut headers = HeaderMap::new();
            config.decorate(Some(origin), &mut headers);
            (
                headers
                    .get(ACCESS_CONTROL_ALLOW_ORIGIN)
                    .map(|v| v.to_str().unwrap().to_owned()),
                headers.get(ACCESS_CONTROL_ALLOW_CREDENTIALS).is_some(),
            )
        };
        let any = CorsConfig {
            origins: "*".into(),
            ..CorsConfig::default()
        };
        assert_eq!(header(&any, "https://e.example"), (Some("*".into()), false));
        let default = CorsConfig::default();
        assert_eq!(header(&default, "https://e.example"), (None, false));
        assert_eq!(
            header(&default, "http://localhost:3000"),
            (Some("http://localhost:3000".into()), true)
        );
        let off = CorsConfig {
            credentials: false,
            ..CorsConfig::default()
        };
        assert_eq!(
            header(&off, "http://localhost:3000"),
            (Some("http://localhost:3000".into()), false)
        );
    }
}
