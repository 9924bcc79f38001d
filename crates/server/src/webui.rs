//! The chat page at `GET /`: three static files compiled into the binary (no CDN, works offline),
//! which talk to this server's own `/v1/models` and `/v1/chat/completions`. `--no-webui` turns
//! them off (404). The page is served without an API key, like `/health`; its API calls send the
//! key the user types.

use hyper::header::{CACHE_CONTROL, HeaderValue};
use hyper::{Response, StatusCode};

use crate::body::{Body, full};
use crate::error::ApiError;
use crate::state::AppState;

const INDEX_HTML: &str = include_str!("webui/index.html");
const APP_JS: &str = include_str!("webui/app.js");
const APP_CSS: &str = include_str!("webui/app.css");

/// Scripts, styles and requests from this origin only; no inline code, frames or forms elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// One file of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asset {
    Index,
    Script,
    Style,
}

/// `GET /`, `GET /webui/app.js`, `GET /webui/app.css`: 404 with `--no-webui`.
pub fn serve(state: &AppState, asset: Asset, path: &str) -> Result<Response<Body>, ApiError> {
    if !state.config().webui {
        return Err(ApiError::NotFound {
            method: "GET".into(),
            path: path.to_owned(),
        });
    }
    let (content_type, text) = match asset {
        Asset::Index => ("text/html; charset=utf-8", INDEX_HTML),
        Asset::Script => ("text/javascript; charset=utf-8", APP_JS),
        Asset::Style => ("text/css; charset=utf-8", APP_CSS),
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
