//! Response bodies: whole, or a channel of chunks for SSE. A leaf: it knows nothing of errors
//! (`error.rs` builds its responses with it) or of requests (`read.rs`).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use tokio::sync::mpsc;

/// The body of a 500: what `ApiError::Internal` serializes to (a test in `error.rs` keeps them
/// equal), for the one failure this module reports itself, a response that cannot be serialized.
pub const INTERNAL_ERROR_BODY: &str = r#"{"error":{"message":"internal server error","type":"server_error","param":null,"code":"internal_error"}}"#;

/// Chunks buffered between a generation task and a slow client.
const STREAM_BUFFER: usize = 64;

/// A response body: whole bytes, or chunks from a task until it drops its sender.
#[derive(Debug)]
pub enum Body {
    /// The whole body (taken on first poll).
    Full(Option<Bytes>),
    /// Chunks as they are produced. Dropping the body (the client went away) closes the channel,
    /// which the producer watches to cancel its request.
    Channel(mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Channel(rx) => rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Full(Some(bytes)) => hyper::body::SizeHint::with_exact(bytes.len() as u64),
            Body::Full(None) => hyper::body::SizeHint::with_exact(0),
            Body::Channel(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// A response with a whole body.
pub fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Body::Full(Some(body.into())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A JSON response.
pub fn json(status: StatusCode, value: &impl Serialize) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(bytes) => full(status, "application/json", bytes),
        // Only a bug can get here (the response types serialize); the details go to the log and
        // the client gets the same body as any other internal error.
        Err(err) => {
            tracing::error!("cannot serialize a response: {err}");
            full(
                StatusCode::INTERNAL_SERVER_ERROR,
                "application/json",
                INTERNAL_ERROR_BODY,
            )
        }
    }
}

/// The sending half of a streamed response.
#[derive(Debug, Clone)]
pub struct StreamSender(mpsc::Sender<Bytes>);

impl StreamSender {
    /// Sends one server-sent event carrying `data`, after an `event: name` line when `name` is
    /// given (Anthropic's and the Responses API's streams name every event); `false` when the
    /// client has gone.
    pub async fn named_event(&self, name: Option<&str>, data: &impl Serialize) -> bool {
        let Ok(text) = serde_json::to_string(data) else {
            return false;
        };
        match name {
            Some(name) => self.raw(format!("event: {name}\ndata: {text}\n\n")).await,
            None => self.raw(format!("data: {text}\n\n")).await,
        }
    }

    /// Sends bytes as they are; `false` when the client has gone.
    pub async fn raw(&self, text: String) -> bool {
        self.0.send(Bytes::from(text)).await.is_ok()
    }

    /// Resolves when the client has gone (the response body was dropped).
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

/// An SSE response and the sender that feeds it.
pub fn event_stream() -> (Response<Body>, StreamSender) {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let mut response = Response::new(Body::Channel(rx));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (response, StreamSender(tx))
}
