//! Response bodies (whole, or a channel of chunks for SSE) and bounded request reading.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::error::ApiError;

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
        Err(err) => ApiError::Internal(format!("cannot serialize a response: {err}")).response(),
    }
}

/// The sending half of a streamed response.
#[derive(Debug, Clone)]
pub struct StreamSender(mpsc::Sender<Bytes>);

impl StreamSender {
    /// Sends one server-sent event carrying `data`; `false` when the client has gone.
    pub async fn event(&self, data: &impl Serialize) -> bool {
        match serde_json::to_string(data) {
            Ok(text) => self.raw(format!("data: {text}\n\n")).await,
            Err(_) => false,
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

/// Reads a JSON request body of at most `limit` bytes into `T`; errors name the field.
pub async fn read_json<T: DeserializeOwned>(body: Incoming, limit: usize) -> Result<T, ApiError> {
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        Err(err) => {
            return Err(ApiError::bad_request(format!(
                "cannot read the body: {err}"
            )));
        }
    };
    parse_json(&bytes)
}

/// Parses JSON into `T`, naming the path of a field of the wrong type.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; send a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("malformed JSON: {inner}"))
        } else if path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(path.clone(), format!("invalid field `{path}`: {inner}"))
        }
    })
}
