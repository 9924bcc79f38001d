//! The router: authentication, then one table from method and path to a handler.
//!
//! [`ROUTES`] is the only list of routes: dispatch, the `405` answer with its `Allow` header and
//! `OPTIONS` all read it. Paths are patterns whose `{name}` segments match any one segment and
//! reach the handler as [`PathParams`].

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{ALLOW, AUTHORIZATION, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::body::{Body, full};
use crate::error::{ApiError, ErrorShape};
use crate::state::AppState;
use crate::webui::Asset;
use crate::{anthropic, embeddings, llama_server, openai, responses, slot_files, webui};

/// What a route runs. One variant per handler; [`Endpoint::call`] is the one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Completions,
    ChatCompletions,
    Responses,
    ResponsesInputTokens,
    Messages,
    CountTokens,
    Models,
    Completion,
    Infill,
    Tokenize,
    Detokenize,
    ApplyTemplate,
    Health,
    Live,
    Props,
    SetProps,
    Slots,
    SlotAction,
    Metrics,
    EmbeddingsOpenAi,
    EmbeddingsLlama,
    WebUi(Asset),
}

/// One method on one path pattern.
#[derive(Debug)]
struct Route {
    method: Method,
    path: &'static str,
    endpoint: Endpoint,
    /// Answered without an API key (load balancers probe it).
    public: bool,
    /// The shape of its error bodies (its 401, 404 and 405 included).
    errors: ErrorShape,
}

const fn entry(
    method: Method,
    path: &'static str,
    endpoint: Endpoint,
    public: bool,
    errors: ErrorShape,
) -> Route {
    Route {
        method,
        path,
        endpoint,
        public,
        errors,
    }
}

const fn route(method: Method, path: &'static str, endpoint: Endpoint) -> Route {
    entry(method, path, endpoint, false, ErrorShape::OpenAi)
}

const fn public(method: Method, path: &'static str, endpoint: Endpoint) -> Route {
    entry(method, path, endpoint, true, ErrorShape::OpenAi)
}

/// A status route of llama-server's: its errors have llama-server's shape (a numeric `code`).
const fn status(method: Method, path: &'static str, endpoint: Endpoint, public: bool) -> Route {
    entry(method, path, endpoint, public, ErrorShape::LlamaServer)
}

/// A route of Anthropic's API: its errors have Anthropic's shape.
const fn anthropic(method: Method, path: &'static str, endpoint: Endpoint) -> Route {
    entry(method, path, endpoint, false, ErrorShape::Anthropic)
}

/// Every route the server answers (OpenAI's under `/v1` and without it, Anthropic's, then
/// llama-server's; `/completions` is llama-server's native completion, as in llama-server).
static ROUTES: &[Route] = &[
    route(Method::POST, "/v1/completions", Endpoint::Completions),
    route(
        Method::POST,
        "/v1/chat/completions",
        Endpoint::ChatCompletions,
    ),
    route(Method::POST, "/chat/completions", Endpoint::ChatCompletions),
    route(Method::POST, "/v1/responses", Endpoint::Responses),
    route(Method::POST, "/responses", Endpoint::Responses),
    route(
        Method::POST,
        "/v1/responses/input_tokens",
        Endpoint::ResponsesInputTokens,
    ),
    route(
        Method::POST,
        "/responses/input_tokens",
        Endpoint::ResponsesInputTokens,
    ),
    anthropic(Method::POST, "/v1/messages", Endpoint::Messages),
    anthropic(
        Method::POST,
        "/v1/messages/count_tokens",
        Endpoint::CountTokens,
    ),
    route(Method::GET, "/v1/models", Endpoint::Models),
    route(Method::GET, "/models", Endpoint::Models),
    // llama-server's native completion, under its legacy name and its current one.
    route(Method::POST, "/completion", Endpoint::Completion),
    route(Method::POST, "/completions", Endpoint::Completion),
    route(Method::POST, "/infill", Endpoint::Infill),
    route(Method::POST, "/tokenize", Endpoint::Tokenize),
    route(Method::POST, "/v1/embeddings", Endpoint::EmbeddingsOpenAi),
    route(Method::POST, "/embedding", Endpoint::EmbeddingsLlama),
    route(Method::POST, "/embeddings", Endpoint::EmbeddingsLlama),
    route(Method::POST, "/detokenize", Endpoint::Detokenize),
    route(Method::POST, "/apply-template", Endpoint::ApplyTemplate),
    status(Method::GET, "/health", Endpoint::Health, true),
    status(Method::GET, "/v1/health", Endpoint::Health, true),
    public(Method::GET, "/live", Endpoint::Live),
    route(Method::GET, "/props", Endpoint::Props),
    route(Method::POST, "/props", Endpoint::SetProps),
    status(Method::GET, "/slots", Endpoint::Slots, false),
    status(
        Method::POST,
        "/slots/{id_slot}",
        Endpoint::SlotAction,
        false,
    ),
    route(Method::GET, "/metrics", Endpoint::Metrics),
    // The chat page (webui.rs): public like /health, its API calls carry the key.
    public(Method::GET, "/", Endpoint::WebUi(Asset::Index)),
    public(Method::GET, "/webui/app.js", Endpoint::WebUi(Asset::Script)),
    public(Method::GET, "/webui/app.css", Endpoint::WebUi(Asset::Style)),
];

/// The values of a route's `{name}` segments, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PathParams(Vec<(&'static str, String)>);

impl PathParams {
    /// The value of the segment `{name}`, if the route has one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Matches `path` against `pattern`: literal segments equal, `{name}` segments non-empty.
fn match_path(pattern: &'static str, path: &str) -> Option<PathParams> {
    let mut params = Vec::new();
    let mut want = pattern.split('/');
    let mut have = path.split('/');
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Some(PathParams(params)),
            (Some(w), Some(h)) => match w.strip_prefix('{').and_then(|w| w.strip_suffix('}')) {
                Some(name) if !h.is_empty() => params.push((name, h.to_owned())),
                Some(_) => return None,
                None if w == h => {}
                None => return None,
            },
            _ => return None,
        }
    }
}

impl Endpoint {
    async fn call(
        self,
        state: &Arc<AppState>,
        body: Incoming,
        path: &str,
        query: &str,
        params: PathParams,
    ) -> Result<Response<Body>, ApiError> {
        match self {
            Self::Completions => openai::completions(state, body).await,
            Self::ChatCompletions => openai::chat_completions(state, body).await,
            Self::Responses => responses::create(state, body).await,
            Self::ResponsesInputTokens => responses::input_tokens(state, body).await,
            Self::Messages => anthropic::messages(state, body).await,
            Self::CountTokens => anthropic::count_tokens(state, body).await,
            Self::Models => openai::models(state),
            Self::Completion => llama_server::completion(state, body).await,
            Self::Infill => llama_server::infill(state, body).await,
            Self::Tokenize => llama_server::tokenize(state, body).await,
            Self::Detokenize => llama_server::detokenize(state, body).await,
            Self::ApplyTemplate => llama_server::apply_template(state, body).await,
            Self::Health => llama_server::health(state),
            Self::Live => Ok(llama_server::live()),
            Self::Props => llama_server::props(state),
            Self::SetProps => llama_server::set_props(state),
            Self::Slots => llama_server::slots(state, query),
            Self::SlotAction => {
                slot_files::slot_action(state, body, params.get("id_slot"), query).await
            }
            Self::Metrics => llama_server::metrics(state),
            Self::EmbeddingsOpenAi => {
                embeddings::embeddings(state, body, embeddings::Shape::OpenAi).await
            }
            Self::EmbeddingsLlama => {
                embeddings::embeddings(state, body, embeddings::Shape::Llama).await
            }
            Self::WebUi(asset) => webui::serve(state, asset, path),
        }
    }
}

impl Endpoint {
    /// The request body through the parse and the checks the handler makes before it needs the
    /// model (the fuzz targets' view of a route; the match is exhaustive so that a new endpoint
    /// gets one). Routes without a body accept any.
    fn check_body(self, bytes: &[u8]) -> Result<(), ApiError> {
        match self {
            Self::Completions => openai::check_completions_body(bytes),
            Self::ChatCompletions => openai::check_chat_body(bytes),
            Self::Responses | Self::ResponsesInputTokens => responses::check_body(bytes),
            Self::Messages | Self::CountTokens => anthropic::check_body(bytes),
            Self::Completion => llama_server::check_body("completion", bytes),
            Self::Infill => llama_server::check_body("infill", bytes),
            Self::Tokenize => llama_server::check_body("tokenize", bytes),
            Self::Detokenize => llama_server::check_body("detokenize", bytes),
            Self::ApplyTemplate => llama_server::check_body("apply-template", bytes),
            Self::SlotAction => slot_files::check_body(bytes),
            Self::EmbeddingsOpenAi | Self::EmbeddingsLlama => embeddings::check_body(bytes),
            Self::Models
            | Self::Health
            | Self::Live
            | Self::Props
            | Self::SetProps
            | Self::Slots
            | Self::Metrics
            | Self::WebUi(_) => Ok(()),
        }
    }
}

/// The paths of the routes that take a request body (`POST`), in [`ROUTES`]'s order.
pub fn post_paths() -> Vec<&'static str> {
    ROUTES
        .iter()
        .filter(|r| r.method == Method::POST)
        .map(|r| r.path)
        .collect()
}

/// `bytes` as the body of `POST path`, parsed and checked as its handler does before it needs the
/// model; `Ok` for a path without such a route.
pub fn check_request_body(path: &str, bytes: &[u8]) -> Result<(), ApiError> {
    match ROUTES
        .iter()
        .find(|r| r.method == Method::POST && match_path(r.path, path).is_some())
    {
        Some(route) => route.endpoint.check_body(bytes),
        None => Ok(()),
    }
}

/// Answers one request. Every failure becomes a response here, so the connection keeps serving.
pub async fn handle(state: Arc<AppState>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let origin = crate::cors::origin(request.headers());
    let mut response = if method == Method::OPTIONS {
        preflight(&state, &path)
    } else {
        match dispatch(&state, request).await {
            Ok(response) => response,
            Err(err) => err.response_as(error_shape(&path)),
        }
    };
    state
        .config()
        .cors
        .decorate(origin.as_deref(), response.headers_mut());
    tracing::info!(%method, %path, status = response.status().as_u16(), "request");
    response
}

/// The error shape of the routes on `path` (OpenAI's where no route has it).
fn error_shape(path: &str) -> ErrorShape {
    ROUTES
        .iter()
        .find(|r| match_path(r.path, path).is_some())
        .map_or(ErrorShape::OpenAi, |r| r.errors)
}

/// Whether the request carries an accepted key (`Authorization: Bearer`, or `X-Api-Key`).
fn authorized(state: &AppState, request: &Request<Incoming>) -> bool {
    let keys = &state.config().api_keys;
    if !keys.required() {
        return true;
    }
    let headers = request.headers();
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let header = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer
        .or(header)
        .is_some_and(|key| keys.accepts(key.trim()))
}

/// The methods `path` takes, as an `Allow` header value (`OPTIONS` included), or `None` when no
/// route has that path.
fn allowed_methods(path: &str) -> Option<String> {
    let mut methods: Vec<&str> = Vec::new();
    for r in ROUTES.iter().filter(|r| match_path(r.path, path).is_some()) {
        if !methods.contains(&r.method.as_str()) {
            methods.push(r.method.as_str());
        }
    }
    if methods.is_empty() {
        return None;
    }
    methods.push("OPTIONS");
    Some(methods.join(", "))
}

/// `OPTIONS` on any path, as llama-server answers it before routing and authentication (a
/// browser's preflight carries no key), even while the model loads: 204, no body, the CORS
/// preflight headers, and `Allow` with the methods the path takes when a route has it.
fn preflight(state: &AppState, path: &str) -> Response<Body> {
    let mut response = full(StatusCode::NO_CONTENT, "text/plain", Vec::new());
    if let Some(value) = allowed_methods(path).and_then(|a| HeaderValue::from_str(&a).ok()) {
        response.headers_mut().insert(ALLOW, value);
    }
    state.config().cors.preflight(response.headers_mut());
    response
}

async fn dispatch(
    state: &Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let method = request.method().clone();
    let found = ROUTES.iter().find_map(|r| {
        (r.method == method)
            .then(|| match_path(r.path, &path))
            .flatten()
            .map(|params| (r, params))
    });
    // A public path is public under every method (a wrong method there is a 405, not a 401).
    let public = ROUTES
        .iter()
        .any(|r| r.public && match_path(r.path, &path).is_some());
    if !public && !authorized(state, &request) {
        return Err(ApiError::Unauthorized);
    }
    if let Some((route, params)) = found {
        return route
            .endpoint
            .call(state, request.into_body(), &path, &query, params)
            .await;
    }
    match allowed_methods(&path) {
        Some(allow) => Err(ApiError::MethodNotAllowed {
            method: method.to_string(),
            path,
            allow,
        }),
        None => Err(ApiError::NotFound {
            method: method.to_string(),
            path,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_literal_and_named_segments() {
        assert_eq!(
            match_path("/v1/models", "/v1/models"),
            Some(PathParams::default())
        );
        assert_eq!(match_path("/v1/models", "/v1/models/x"), None);
        assert_eq!(match_path("/v1/models", "/v1"), None);
        let params = match_path("/slots/{id}", "/slots/3").unwrap();
        assert_eq!(params.get("id"), Some("3"));
        assert_eq!(params.get("other"), None);
        assert_eq!(match_path("/slots/{id}", "/slots/"), None);
        assert_eq!(match_path("/slots/{id}", "/slots"), None);
    }

    #[test]
    fn every_path_has_an_allow_list_and_no_route_is_listed_twice() {
        for (i, r) in ROUTES.iter().enumerate() {
            let allow = allowed_methods(r.path).unwrap();
            assert!(allow.contains(r.method.as_str()), "{}: {allow}", r.path);
            assert!(
                !ROUTES[..i]
                    .iter()
                    .any(|s| s.path == r.path && s.method == r.method),
                "{} {} is listed twice",
                r.method,
                r.path
            );
        }
        assert_eq!(allowed_methods("/v1/models").unwrap(), "GET, OPTIONS");
        assert_eq!(allowed_methods("/nothing"), None);
    }
}
