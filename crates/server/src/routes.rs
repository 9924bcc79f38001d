//! The router: authentication, then one table from method and path to a handler.
//!
//! [`ROUTES`] is the only list of routes: dispatch, the fuzz targets' body checks, the `405`
//! answer with its `Allow` header and `OPTIONS` all read it; a route is one entry there (method,
//! path, handler, body check) and its handler. Paths are patterns whose `{name}` segments match any one segment and
//! reach the handler as [`PathParams`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{ALLOW, AUTHORIZATION, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::agent;
use crate::body::{Body, full};
use crate::error::{ApiError, ErrorShape};
use crate::gcp;
use crate::protocols::llama_server::{self, lora_adapters, slot_files};
use crate::protocols::{anthropic, embeddings, openai, rerank, responses, transcriptions};
use crate::read::{RequestBody, read_bytes};
use crate::request_log::RequestLog;
use crate::state::AppState;
use crate::webui;

/// What a handler gets: the shared state, the body, and the request's path, query and `{name}`
/// segments.
struct Call {
    state: Arc<AppState>,
    body: RequestBody,
    path: String,
    query: String,
    params: PathParams,
    /// The request's headers (read by `/tools` and `/cors-proxy`).
    headers: hyper::HeaderMap,
}

/// A handler's answer, boxed so that every route's handler has one type.
type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, ApiError>> + Send>>;

/// What a route runs.
type Handler = fn(Call) -> Answer;

/// The request body through the parse and the checks the handler makes before it needs the
/// model (the fuzz targets' view of a route).
type BodyCheck = fn(&[u8]) -> Result<(), ApiError>;

/// One method on one path pattern.
struct Route {
    method: Method,
    path: &'static str,
    handler: Handler,
    check: BodyCheck,
    /// Answered without an API key (load balancers probe it).
    public: bool,
    /// The shape of its error bodies (its 401, 404 and 405 included).
    errors: ErrorShape,
}

/// Routes without a body accept any.
fn no_body(_: &[u8]) -> Result<(), ApiError> {
    Ok(())
}

const fn route(
    method: Method,
    path: &'static str,
    handler: Handler,
    check: BodyCheck,
    public: bool,
    errors: ErrorShape,
) -> Route {
    Route {
        method,
        path,
        handler,
        check,
        public,
        errors,
    }
}

/// A route that takes a JSON body, checked by `check`.
const fn post(path: &'static str, handler: Handler, check: BodyCheck) -> Route {
    route(
        Method::POST,
        path,
        handler,
        check,
        false,
        ErrorShape::OpenAi,
    )
}

/// A route without a body.
const fn get(path: &'static str, handler: Handler) -> Route {
    route(
        Method::GET,
        path,
        handler,
        no_body,
        false,
        ErrorShape::OpenAi,
    )
}

/// A route without a body, answered without an API key.
const fn public_get(path: &'static str, handler: Handler) -> Route {
    route(
        Method::GET,
        path,
        handler,
        no_body,
        true,
        ErrorShape::OpenAi,
    )
}

/// A status route of llama-server's: its errors have llama-server's shape (a numeric `code`).
const fn status(method: Method, path: &'static str, handler: Handler, public: bool) -> Route {
    route(
        method,
        path,
        handler,
        no_body,
        public,
        ErrorShape::LlamaServer,
    )
}

/// A route of Anthropic's API: its errors have Anthropic's shape.
const fn anthropic(path: &'static str, handler: Handler, check: BodyCheck) -> Route {
    route(
        Method::POST,
        path,
        handler,
        check,
        false,
        ErrorShape::Anthropic,
    )
}

/// Every route the server answers (OpenAI's under `/v1` and without it, Anthropic's, then
/// llama-server's; `/completions` is llama-server's native completion, as in llama-server). A
/// new route is one entry here and its handler.
static ROUTES: &[Route] = &[
    post(
        "/v1/completions",
        |c| Box::pin(async move { openai::completions(&c.state, c.body).await }),
        openai::check_completions_body,
    ),
    post(
        "/v1/chat/completions",
        |c| Box::pin(async move { openai::chat_completions(&c.state, c.body).await }),
        openai::check_chat_body,
    ),
    post(
        "/chat/completions",
        |c| Box::pin(async move { openai::chat_completions(&c.state, c.body).await }),
        openai::check_chat_body,
    ),
    post(
        "/v1/chat/completions/control",
        |c| Box::pin(async move { openai::control(&c.state, c.body).await }),
        no_body,
    ),
    post(
        "/v1/chat/completions/input_tokens",
        |c| Box::pin(async move { openai::chat_input_tokens(&c.state, c.body).await }),
        openai::check_chat_body,
    ),
    post(
        "/chat/completions/input_tokens",
        |c| Box::pin(async move { openai::chat_input_tokens(&c.state, c.body).await }),
        openai::check_chat_body,
    ),
    post(
        "/v1/responses",
        |c| Box::pin(async move { responses::create(&c.state, c.body).await }),
        responses::check_body,
    ),
    post(
        "/responses",
        |c| Box::pin(async move { responses::create(&c.state, c.body).await }),
        responses::check_body,
    ),
    post(
        "/v1/responses/input_tokens",
        |c| Box::pin(async move { responses::input_tokens(&c.state, c.body).await }),
        responses::check_body,
    ),
    post(
        "/responses/input_tokens",
        |c| Box::pin(async move { responses::input_tokens(&c.state, c.body).await }),
        responses::check_body,
    ),
    anthropic(
        "/v1/messages",
        |c| Box::pin(async move { anthropic::messages(&c.state, c.body).await }),
        anthropic::check_body,
    ),
    anthropic(
        "/v1/messages/count_tokens",
        |c| Box::pin(async move { anthropic::count_tokens(&c.state, c.body).await }),
        anthropic::check_count_body,
    ),
    get("/v1/models", |c| {
        Box::pin(async move { openai::models(&c.state) })
    }),
    get("/models", |c| {
        Box::pin(async move { openai::models(&c.state) })
    }),
    // Router mode's own routes (router/http.rs), before `/models/{id}`; without --models-dir or
    // --models-preset they answer 404.
    post(
        "/models/load",
        |c| Box::pin(async move { crate::router::http::load(&c.state, c.body).await }),
        no_body,
    ),
    post(
        "/models/unload",
        |c| Box::pin(async move { crate::router::http::unload(&c.state, c.body).await }),
        no_body,
    ),
    get("/models/sse", |c| {
        Box::pin(async move { crate::router::http::sse(&c.state) })
    }),
    get("/v1/models/{id}", |c| {
        Box::pin(async move { openai::model(&c.state, c.params.get("id").unwrap_or_default()) })
    }),
    get("/models/{id}", |c| {
        Box::pin(async move { openai::model(&c.state, c.params.get("id").unwrap_or_default()) })
    }),
    // llama-server's native completion, under its legacy name and its current one.
    post(
        "/completion",
        |c| Box::pin(async move { llama_server::completion(&c.state, c.body).await }),
        |b| llama_server::check_body("completion", b),
    ),
    post(
        "/completions",
        |c| Box::pin(async move { llama_server::completion(&c.state, c.body).await }),
        |b| llama_server::check_body("completion", b),
    ),
    post(
        "/infill",
        |c| Box::pin(async move { llama_server::infill(&c.state, c.body).await }),
        |b| llama_server::check_body("infill", b),
    ),
    post(
        "/tokenize",
        |c| Box::pin(async move { llama_server::tokenize(&c.state, c.body).await }),
        |b| llama_server::check_body("tokenize", b),
    ),
    post(
        "/v1/embeddings",
        |c| {
            Box::pin(async move {
                embeddings::embeddings(&c.state, c.body, embeddings::Shape::OpenAi).await
            })
        },
        embeddings::check_body,
    ),
    post(
        "/embedding",
        |c| {
            Box::pin(async move {
                embeddings::embeddings(&c.state, c.body, embeddings::Shape::Llama).await
            })
        },
        embeddings::check_body,
    ),
    post(
        "/embeddings",
        |c| {
            Box::pin(async move {
                embeddings::embeddings(&c.state, c.body, embeddings::Shape::Llama).await
            })
        },
        embeddings::check_body,
    ),
    post(
        "/rerank",
        |c| Box::pin(async move { rerank::rerank(&c.state, c.body).await }),
        rerank::check_body,
    ),
    post(
        "/reranking",
        |c| Box::pin(async move { rerank::rerank(&c.state, c.body).await }),
        rerank::check_body,
    ),
    post(
        "/v1/rerank",
        |c| Box::pin(async move { rerank::rerank(&c.state, c.body).await }),
        rerank::check_body,
    ),
    post(
        "/v1/reranking",
        |c| Box::pin(async move { rerank::rerank(&c.state, c.body).await }),
        rerank::check_body,
    ),
    route(
        Method::POST,
        "/v1/audio/transcriptions",
        |_| Box::pin(transcriptions::transcriptions()),
        no_body,
        false,
        ErrorShape::OpenAi,
    ),
    route(
        Method::POST,
        "/audio/transcriptions",
        |_| Box::pin(transcriptions::transcriptions()),
        no_body,
        false,
        ErrorShape::OpenAi,
    ),
    post(
        "/detokenize",
        |c| Box::pin(async move { llama_server::detokenize(&c.state, c.body).await }),
        |b| llama_server::check_body("detokenize", b),
    ),
    post(
        "/apply-template",
        |c| Box::pin(async move { llama_server::apply_template(&c.state, c.body).await }),
        |b| llama_server::check_body("apply-template", b),
    ),
    status(
        Method::GET,
        "/health",
        |c| Box::pin(async move { llama_server::health(&c.state) }),
        true,
    ),
    status(
        Method::GET,
        "/v1/health",
        |c| Box::pin(async move { llama_server::health(&c.state) }),
        true,
    ),
    public_get("/live", |_| {
        Box::pin(async move { Ok(llama_server::live()) })
    }),
    get("/props", |c| {
        Box::pin(async move { llama_server::props(&c.state) })
    }),
    route(
        Method::POST,
        "/props",
        |c| Box::pin(async move { llama_server::set_props(&c.state) }),
        no_body,
        false,
        ErrorShape::OpenAi,
    ),
    status(
        Method::GET,
        "/slots",
        |c| Box::pin(async move { llama_server::slots(&c.state, &c.query) }),
        false,
    ),
    route(
        Method::POST,
        "/slots/{id_slot}",
        |c| {
            Box::pin(async move {
                slot_files::slot_action(&c.state, c.body, c.params.get("id_slot"), &c.query).await
            })
        },
        slot_files::check_body,
        false,
        ErrorShape::LlamaServer,
    ),
    get("/lora-adapters", |c| {
        Box::pin(async move { lora_adapters::get_lora_adapters(&c.state) })
    }),
    post(
        "/lora-adapters",
        |c| Box::pin(async move { lora_adapters::post_lora_adapters(&c.state, c.body).await }),
        lora_adapters::check_body,
    ),
    // Resumable streams (streams.rs): a streamed generation sent with `X-Conversation-Id`.
    status(
        Method::GET,
        "/v1/stream",
        |c| Box::pin(async move { crate::streams::get(c.state.streams(), &c.query) }),
        false,
    ),
    status(
        Method::DELETE,
        "/v1/stream",
        |c| Box::pin(async move { crate::streams::delete(c.state.streams(), &c.query) }),
        false,
    ),
    route(
        Method::POST,
        "/v1/streams/lookup",
        |c| {
            Box::pin(async move {
                let bytes = read_bytes(c.body, c.state.config().body_limit).await?;
                crate::streams::lookup(c.state.streams(), &bytes)
            })
        },
        no_body,
        false,
        ErrorShape::LlamaServer,
    ),
    get("/metrics", |c| {
        Box::pin(async move { llama_server::metrics(&c.state) })
    }),
    // The chat page (webui.rs): public like /health, its API calls carry the key.
    public_get("/", |c| {
        Box::pin(async move { webui::serve(&c.state, None, &c.path) })
    }),
    public_get("/webui/{file}", |c| {
        Box::pin(async move { webui::serve(&c.state, c.params.get("file"), &c.path) })
    }),
    // The agent features (agent/): 403 while off, as llama-server.
    get("/tools", |c| {
        Box::pin(async move { Ok(agent::get_tools(c.state.agent())) })
    }),
    post(
        "/tools",
        |c| {
            Box::pin(async move {
                let body = read_bytes(c.body, c.state.config().body_limit).await?;
                Ok(agent::post_tools(c.state.agent(), &c.headers, &body).await)
            })
        },
        no_body,
    ),
    get("/cors-proxy", |c| {
        Box::pin(async move {
            Ok(agent::cors_proxy(
                c.state.agent(),
                Method::GET,
                &c.query,
                &c.headers,
                Default::default(),
            )
            .await)
        })
    }),
    post(
        "/cors-proxy",
        |c| {
            Box::pin(async move {
                let body = read_bytes(c.body, c.state.config().body_limit).await?;
                Ok(
                    agent::cors_proxy(c.state.agent(), Method::POST, &c.query, &c.headers, body)
                        .await,
                )
            })
        },
        no_body,
    ),
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

/// Whether a route has exactly `path` (a Vertex AI route must not shadow one).
pub fn has_path(path: &str) -> bool {
    ROUTES.iter().any(|r| r.path == path)
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
        Some(route) => (route.check)(bytes),
        None => Ok(()),
    }
}

/// The generating routes whose streamed answers a request can name with `X-Conversation-Id`
/// (llama-server's completion handler's routes).
const STREAMED_PATHS: &[&str] = &[
    "/completion",
    "/completions",
    "/infill",
    "/v1/completions",
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/responses",
    "/responses",
    "/v1/messages",
];

/// A generating route's `response` to a request that named stream `id`: a streamed answer is
/// kept under it (and read back from there); any other answer leaves no stream under it.
fn resumable(state: &AppState, id: &str, response: Response<Body>) -> Response<Body> {
    let streamed = matches!(response.body(), Body::Channel(_))
        && response
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
    if !streamed {
        state.streams().remove(id);
        return response;
    }
    crate::streams::tee(state.streams().create(id), response)
}

/// Answers one request. Every failure becomes a response here, so the connection keeps serving;
/// each request gets one log line ([`RequestLog`]).
pub async fn handle(state: Arc<AppState>, request: Request<Incoming>) -> Response<Body> {
    // `--api-prefix`: the routes are served under it, and nothing outside it.
    let request = match &state.config().api_prefix {
        Some(prefix) => {
            let (method, path) = (
                request.method().to_string(),
                request.uri().path().to_owned(),
            );
            match crate::api_prefix::strip(prefix, request) {
                Some(request) => request,
                None => return ApiError::NotFound { method, path }.response_as(ErrorShape::OpenAi),
            }
        }
        None => request,
    };
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let origin = crate::cors::origin(request.headers());
    let log = RequestLog::new(method.as_str(), &path);
    let mut response = if method == Method::OPTIONS {
        preflight(&state, &path, origin.as_deref())
    } else {
        let answer = log.clone().scope(dispatch(&state, request)).await;
        match answer {
            Ok(response) => response,
            Err(err) => err.response_as(error_shape(&path)),
        }
    };
    state
        .config()
        .cors
        .decorate(origin.as_deref(), response.headers_mut());
    log.responded(response.status().as_u16());
    response
}

/// The error shape of the routes on `path`: where no route has it, Anthropic's under
/// `/v1/messages/` (its clients read only that shape), else OpenAI's.
fn error_shape(path: &str) -> ErrorShape {
    ROUTES
        .iter()
        .find(|r| match_path(r.path, path).is_some())
        .map_or_else(
            || {
                if path.starts_with("/v1/messages/") {
                    ErrorShape::Anthropic
                } else {
                    ErrorShape::OpenAi
                }
            },
            |r| r.errors,
        )
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
/// browser's preflight carries no key), even while the model loads: 200 as llama-server's (its own
/// test suite checks the status), an empty body, the CORS
/// preflight headers, and `Allow` with the methods the path takes when a route has it.
fn preflight(state: &AppState, path: &str, origin: Option<&str>) -> Response<Body> {
    let mut response = full(StatusCode::OK, "text/plain", Vec::new());
    if let Some(value) = allowed_methods(path).and_then(|a| HeaderValue::from_str(&a).ok()) {
        response.headers_mut().insert(ALLOW, value);
    }
    state
        .config()
        .cors
        .preflight(origin, response.headers_mut());
    response
}

/// Runs one instance of a Vertex AI prediction request as a request to the POST route `path`
/// (its errors become the route's error replies).
async fn run_instance(
    state: Arc<AppState>,
    path: &'static str,
    payload: bytes::Bytes,
) -> Response<Body> {
    let Some(route) = ROUTES
        .iter()
        .find(|r| r.method == Method::POST && r.path == path)
    else {
        return ApiError::NotFound {
            method: "POST".into(),
            path: path.into(),
        }
        .response_as(ErrorShape::OpenAi);
    };
    let call = Call {
        state,
        body: RequestBody::Bytes(payload),
        path: path.to_owned(),
        query: String::new(),
        params: PathParams::default(),
        headers: hyper::HeaderMap::new(),
    };
    match (route.handler)(call).await {
        Ok(response) => response,
        Err(err) => err.response_as(route.errors),
    }
}

/// Google Vertex AI's routes (`AIP_MODE=PREDICTION`, [`crate::gcp`]), when the request is for
/// one: `AIP_HEALTH_ROUTE` as `/health`, and `AIP_PREDICT_ROUTE`'s instances run through the
/// POST routes.
async fn dispatch_gcp(
    state: &Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Result<Response<Body>, ApiError>, Request<Incoming>> {
    let Some(config) = &state.config().gcp else {
        return Err(request);
    };
    let path = request.uri().path();
    if request.method() == Method::GET && config.health_route.as_deref() == Some(path) {
        return Ok(llama_server::health(state));
    }
    if request.method() != Method::POST || path != config.predict_route {
        return Err(request);
    }
    if !authorized(state, &request) {
        return Ok(Err(ApiError::Unauthorized));
    }
    let body = match read_bytes(request.into_body().into(), state.config().body_limit).await {
        Ok(body) => body,
        Err(err) => return Ok(Err(err)),
    };
    let paths = post_paths();
    let state = state.clone();
    Ok(gcp::predict(&body, &paths, move |path, payload| {
        run_instance(state.clone(), path, payload)
    })
    .await)
}

async fn dispatch(
    state: &Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let request = match dispatch_gcp(state, request).await {
        Ok(answer) => return answer,
        Err(request) => request,
    };
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let method = request.method().clone();
    let found = ROUTES.iter().find_map(|r| {
        (r.method == method)
            .then(|| match_path(r.path, &path))
            .flatten()
            .map(|params| (r, params))
    });
    // `--path`: the directory's files, public like the chat page; its `index.html` over the
    // chat page at `/`, and no file over a route.
    if let Some(dir) = &state.config().static_path
        && method == Method::GET
        && (path == "/" || found.is_none())
        && let Some(response) = crate::static_files::serve(dir, &path).await
    {
        return Ok(response);
    }
    // A public path is public under every method (a wrong method there is a 405, not a 401).
    let public = ROUTES
        .iter()
        .any(|r| r.public && match_path(r.path, &path).is_some());
    if !public && !authorized(state, &request) {
        return Err(ApiError::Unauthorized);
    }
    if let Some((route, params)) = found {
        let headers = request.headers().clone();
        if let Some(router) = state.router() {
            let (pattern, full_path, full_query) = (route.path, path.clone(), query.clone());
            let body = request.into_body().into();
            let run = move |state, body, query| {
                (route.handler)(Call {
                    state,
                    body,
                    path,
                    query,
                    params,
                    headers,
                })
            };
            return crate::router::http::serve(
                state,
                router,
                &method,
                pattern,
                &full_path,
                &full_query,
                body,
                run,
            )
            .await;
        }
        // `X-Conversation-Id` on a generating route names a resumable stream (streams.rs).
        let conversation = (method == Method::POST && STREAMED_PATHS.contains(&route.path))
            .then(|| request.headers().get(crate::streams::HEADER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        let call = Call {
            state: state.clone(),
            body: request.into_body().into(),
            path,
            query,
            params,
            headers,
        };
        let answer = (route.handler)(call).await;
        return match conversation {
            Some(id) => match answer {
                Ok(response) => Ok(resumable(state, &id, response)),
                Err(err) => {
                    state.streams().remove(&id);
                    Err(err)
                }
            },
            None => answer,
        };
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
#[path = "routes_docs_tests.rs"]
mod docs_tests;

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
