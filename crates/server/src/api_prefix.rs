//! `--api-prefix`: every route served under a path prefix (`/api` serves `/api/health`,
//! `/api/v1/chat/completions`, the chat page at `/api/`), as llama-server serves behind a
//! reverse proxy's sub-path. A path outside the prefix is not found.

use hyper::{Request, Uri};

use crate::error::ServerError;

/// Checks `--api-prefix`: `/` then a path, without a trailing `/` (`/api`, `/llm/v1`).
pub fn check(prefix: &str) -> Result<(), ServerError> {
    let well_formed = prefix.starts_with('/')
        && !prefix.ends_with('/')
        && !prefix.contains(['?', '#', ' '])
        && prefix.parse::<Uri>().is_ok();
    if well_formed {
        Ok(())
    } else {
        Err(ServerError::Flag(format!(
            "--api-prefix {prefix}: expected a path starting with / and without a trailing / \
             (such as /api)"
        )))
    }
}

/// `request` with `prefix` taken off its path (`/api/health` → `/health`, `/api/` → `/`: the
/// chat page), or `None` when its path is outside the prefix (`/api` itself is, as on
/// llama-server: the page's relative links need the `/`).
pub fn strip<B>(prefix: &str, request: Request<B>) -> Option<Request<B>> {
    let path = request.uri().path();
    let rest = path.strip_prefix(prefix)?;
    if !rest.starts_with('/') {
        return None;
    }
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{rest}?{query}"),
        None => rest.to_owned(),
    };
    let uri = path_and_query.parse::<Uri>().ok()?;
    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    Some(Request::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(prefix: &str, uri: &str) -> Option<String> {
        let request = Request::builder().uri(uri).body(()).unwrap();
        strip(prefix, request).map(|r| r.uri().to_string())
    }

    #[test]
    fn the_prefix_is_taken_off_and_other_paths_are_outside() {
        assert_eq!(path("/api", "/api/health").as_deref(), Some("/health"));
        assert_eq!(path("/api", "/api/").as_deref(), Some("/"));
        assert_eq!(path("/api", "/api"), None);
        assert_eq!(
            path("/api", "/api/slots/0?action=save").as_deref(),
            Some("/slots/0?action=save")
        );
        assert_eq!(path("/api", "/health"), None);
        assert_eq!(path("/api", "/apis/health"), None);
        assert!(check("/api").is_ok() && check("/llm/v1").is_ok());
        for bad in ["api", "/api/", "", "/a b"] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
