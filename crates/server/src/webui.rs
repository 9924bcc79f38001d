//! The chat page at `GET /`: static files compiled into the binary (no CDN, works offline): the
//! page, its style, and its script as ES modules (`app.js` imports the others), which talk to this
//! server's own `/v1/models` and `/v1/chat/completions`. `--no-webui` turns them off (404). The
//! page is served without an API key, like `/health`; its API calls send the key the user types.

use hyper::header::{CACHE_CONTROL, HeaderValue};
use hyper::{Response, StatusCode};

use crate::body::{Body, full};
use crate::error::ApiError;
use crate::state::AppState;

const INDEX_HTML: &str = include_str!("webui/index.html");
const JS: &str = "text/javascript; charset=utf-8";

/// The files under `/webui/`: name, content type, text.
pub const FILES: &[(&str, &str, &str)] = &[
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("webui/app.css"),
    ),
    ("app.js", JS, include_str!("webui/app.js")),
    ("api.js", JS, include_str!("webui/api.js")),
    ("settings.js", JS, include_str!("webui/settings.js")),
    ("store.js", JS, include_str!("webui/store.js")),
    ("view.js", JS, include_str!("webui/view.js")),
    ("markdown.js", JS, include_str!("webui/markdown.js")),
    ("highlight.js", JS, include_str!("webui/highlight.js")),
    ("math.js", JS, include_str!("webui/math.js")),
];

/// Scripts, styles and requests from this origin only; no inline code, frames or forms elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `GET /` (`file` is `None`) and `GET /webui/{file}`: 404 with `--no-webui` or for a file the
/// page does not have.
pub fn serve(state: &AppState, file: Option<&str>, path: &str) -> Result<Response<Body>, ApiError> {
    let not_found = || ApiError::NotFound {
        method: "GET".into(),
        path: path.to_owned(),
    };
    if !state.config().webui {
        return Err(not_found());
    }
    let (content_type, text) = match file {
        None => ("text/html; charset=utf-8", INDEX_HTML),
        Some(name) => FILES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, content_type, text)| (*content_type, *text))
            .ok_or_else(not_found)?,
    };
    let mut response = full(StatusCode::OK, content_type, text);
    let headers = response.headers_mut();
    headers.insert("content-security-policy", HeaderValue::from_static(CSP));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module a script imports is one the server serves, and every served script is
    /// imported (or is the entry point), so that a new module is never left out of [`FILES`].
    #[test]
    fn every_import_is_served_and_every_module_imported() {
        let mut imported = vec!["app.js".to_owned()];
        for (name, _, text) in FILES.iter().filter(|(n, _, _)| n.ends_with(".js")) {
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .rsplit_once("\"./")
                    .and_then(|(_, rest)| rest.split_once('"'))
                    .map(|(file, _)| file.to_owned())
                    .unwrap_or_else(|| panic!("{name}: an import not from ./: {line}"));
                assert!(
                    FILES.iter().any(|(n, _, _)| *n == target),
                    "{name} imports {target}, which webui.rs does not serve"
                );
                imported.push(target);
            }
        }
        for (name, _, _) in FILES.iter().filter(|(n, _, _)| n.ends_with(".js")) {
            assert!(
                imported.iter().any(|i| i == name),
                "{name} is served but nothing imports it"
            );
        }
    }

    /// The page's own text never becomes HTML: no script assigns markup.
    #[test]
    fn no_script_parses_html() {
        for (name, _, text) in FILES {
            for bad in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
            ] {
                assert!(!text.contains(bad), "{name} uses {bad}");
            }
        }
    }
}
