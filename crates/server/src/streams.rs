//! Resumable streams, as llama-server's (`server-stream.cpp`): a streamed generation whose
//! request carries `X-Conversation-Id: <id>` is written into a buffer kept under that id, and
//! the client reads it from there, so that a client that went away (a page reload) can read it
//! again from any byte offset while it runs and after it ends.
//!
//! - One id holds at most one stream: a new request with the same id replaces (and cancels)
//!   the one before. A request with the id that fails, or answers without streaming, leaves no
//!   stream under it (and, as in llama-server, still ends the one before).
//! - The generation no longer depends on its client: it runs to its end whoever reads it
//!   (llama-server's behaviour with the header); only a replacement stops it.
//! - A stream keeps its last 4 MiB of SSE bytes (older bytes are dropped and their offsets are
//!   lost) and is kept 300 s after it ends (llama-server sweeps every 60 s; here an ended
//!   stream is dropped the first time the sessions are touched past its 300 s).
//! - `GET /v1/stream?conv_id=<id>&from=<offset>` replays the bytes from `offset` (default 0),
//!   then follows the live stream until it ends: 400 without `conv_id`, with an offset that is
//!   not a number, or one already dropped; 404 for an id with no stream.
//! - `POST /v1/streams/lookup` with `{"conversation_ids": [...]}` answers, for each id asked
//!   about, the streams under it or under `<id>::<anything>` (llama-server's per-model variant):
//!   `conversation_id`, `is_done`, `total_bytes`, `started_at` and `completed_at` (Unix seconds,
//!   0 while running). Ids not asked about are never listed.
//! - `DELETE /v1/stream?conv_id=<id>` ends the stream and its generation and forgets it (204,
//!   whether or not there was one).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

use crate::body::{Body, json as json_response};
use crate::error::ApiError;

/// How long an ended stream is kept, in seconds (llama-server's `STREAM_SESSION_TTL_SECONDS`).
pub const KEPT_SECONDS: u64 = 300;
/// The most bytes a stream keeps (llama-server's `STREAM_SESSION_MAX_BYTES`).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;

/// The request header that names a stream.
pub const HEADER: &str = "x-conversation-id";

fn now_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Every stream, by conversation id.
#[derive(Debug, Default)]
pub struct StreamSessions {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

/// One stream: its bytes (the last [`MAX_BYTES`]), whether it ended, whether it was cancelled.
#[derive(Debug)]
pub struct Session {
    conversation_id: String,
    started_at: u64,
    inner: Mutex<Inner>,
    changed: Notify,
    cancelled: AtomicBool,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    buffer: Vec<u8>,
    dropped: usize,
    done: bool,
    completed_at: u64,
}

/// What a read from an offset found.
#[derive(Debug, PartialEq)]
pub enum Read {
    /// Bytes from the offset (possibly none yet).
    Bytes(Bytes),
    /// The stream ended and every byte from the offset was read.
    End,
    /// The offset is below the bytes kept.
    Lost,
}

impl Session {
    fn new(conversation_id: String, max_bytes: usize) -> Self {
        Self {
            conversation_id,
            started_at: now_seconds(),
            inner: Mutex::default(),
            changed: Notify::new(),
            cancelled: AtomicBool::new(false),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `data`, dropping the oldest bytes past the cap; false once the stream ended.
    pub fn append(&self, data: &[u8]) -> bool {
        {
            let mut inner = self.lock();
            if inner.done {
                return false;
            }
            inner.buffer.extend_from_slice(data);
            let over = inner.buffer.len().saturating_sub(self.max_bytes);
            if over > 0 {
                inner.buffer.drain(..over);
                inner.dropped += over;
            }
        }
        self.changed.notify_waiters();
        true
    }

    /// Ends the stream (idempotent).
    pub fn finish(&self) {
        {
            let mut inner = self.lock();
            if inner.done {
                return;
            }
            inner.done = true;
            inner.completed_at = now_seconds();
        }
        self.changed.notify_waiters();
    }

    /// Ends the stream and stops its producer.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.finish();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// What is there from `offset` now.
    pub fn read_from(&self, offset: usize) -> Read {
        let inner = self.lock();
        if offset < inner.dropped {
            return Read::Lost;
        }
        let local = offset - inner.dropped;
        if local < inner.buffer.len() {
            Read::Bytes(Bytes::copy_from_slice(&inner.buffer[local..]))
        } else if inner.done {
            Read::End
        } else {
            Read::Bytes(Bytes::new())
        }
    }

    /// Waits for the next change (bytes, the end), reading from `offset` once it comes.
    pub async fn next_from(&self, offset: usize) -> Read {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.read_from(offset) {
                Read::Bytes(b) if b.is_empty() => changed.await,
                read => return read,
            }
        }
    }

    fn describe(&self) -> Value {
        let inner = self.lock();
        json!({
            "conversation_id": self.conversation_id,
            "is_done": inner.done,
            "total_bytes": inner.dropped + inner.buffer.len(),
            "started_at": self.started_at,
            "completed_at": inner.completed_at,
        })
    }

    fn expired(&self, now: u64) -> bool {
        let inner = self.lock();
        inner.done && inner.completed_at + KEPT_SECONDS <= now
    }
}

impl StreamSessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let now = now_seconds();
        sessions.retain(|_, s| !s.expired(now));
        sessions
    }

    /// A new stream under `id`, replacing (and cancelling) the one before.
    pub fn create(&self, id: &str) -> Arc<Session> {
        let fresh = Arc::new(Session::new(id.to_owned(), MAX_BYTES));
        let previous = self.lock().insert(id.to_owned(), fresh.clone());
        if let Some(previous) = previous {
            previous.cancel();
        }
        fresh
    }

    /// The stream under `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.lock().get(id).cloned()
    }

    /// Removes the stream under `id` and cancels it.
    pub fn remove(&self, id: &str) {
        if let Some(session) = self.lock().remove(id) {
            session.cancel();
        }
    }

    /// `POST /v1/streams/lookup`'s answer for the ids asked about.
    pub fn lookup(&self, ids: &[String]) -> Value {
        let sessions = self.lock();
        let mut out = Vec::new();
        for id in ids.iter().filter(|id| !id.is_empty()) {
            let variant = format!("{id}::");
            let mut found: Vec<&Arc<Session>> = sessions
                .iter()
                .filter(|(key, _)| *key == id || key.starts_with(&variant))
                .map(|(_, s)| s)
                .collect();
            found.sort_by(|a, b| a.conversation_id.cmp(&b.conversation_id));
            out.extend(found.into_iter().map(|s| s.describe()));
        }
        Value::Array(out)
    }
}

/// The response a streamed generation's client gets when its request named a stream: the
/// generation's chunks go into `session` (a task drains `source` to its end, whether or not the
/// client reads), and the client reads them back from the session.
pub fn tee(session: Arc<Session>, mut response: Response<Body>) -> Response<Body> {
    let mut source = match std::mem::replace(response.body_mut(), Body::Full(None)) {
        Body::Channel(source) => source,
        other => {
            *response.body_mut() = other;
            return response;
        }
    };
    let producer = session.clone();
    tokio::spawn(async move {
        loop {
            let cancelled = producer.changed.notified();
            tokio::pin!(cancelled);
            cancelled.as_mut().enable();
            if producer.is_cancelled() {
                break;
            }
            tokio::select! {
                chunk = source.recv() => match chunk {
                    Some(chunk) => {
                        producer.append(&chunk);
                    }
                    None => break,
                },
                () = &mut cancelled => {}
            }
        }
        // Dropping `source` here stops a cancelled generation.
        producer.finish();
    });
    *response.body_mut() = reader(session, 0);
    response
}

/// A body that reads `session` from `offset` to its end.
fn reader(session: Arc<Session>, mut offset: usize) -> Body {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            match session.next_from(offset).await {
                Read::Bytes(bytes) => {
                    offset += bytes.len();
                    if tx.send(bytes).await.is_err() {
                        return; // the client went away; the stream goes on
                    }
                }
                Read::End | Read::Lost => return,
            }
        }
    });
    Body::Channel(rx)
}

/// llama-server's error body on these routes: `{"error": {"code", "message", "type"}}`.
fn not_found(message: &str) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({"error": {"code": 404, "message": message, "type": "not_found_error"}}),
    )
}

/// The value of `name` in `query`.
fn param(query: &str, name: &str) -> Option<String> {
    url_params(query)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// `conv_id` of `query`, required.
fn conversation(query: &str) -> Result<String, ApiError> {
    param(query, "conv_id")
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            ApiError::invalid_param("conv_id", "Missing conversation id: send ?conv_id=<id>")
        })
}

/// `DELETE /v1/stream?conv_id=<id>`: ends the stream and its generation, and forgets it; 204
/// whether or not there was one.
pub fn delete(sessions: &StreamSessions, query: &str) -> Result<Response<Body>, ApiError> {
    sessions.remove(&conversation(query)?);
    let mut response = Response::new(Body::Full(None));
    *response.status_mut() = StatusCode::NO_CONTENT;
    Ok(response)
}

/// `GET /v1/stream?conv_id=<id>&from=<offset>`.
pub fn get(sessions: &StreamSessions, query: &str) -> Result<Response<Body>, ApiError> {
    let id = conversation(query)?;
    let Some(session) = sessions.get(&id) else {
        return Ok(not_found("Stream not found or expired"));
    };
    let from = match param(query, "from").filter(|f| !f.is_empty()) {
        None => 0,
        Some(from) => from.parse::<usize>().map_err(|_| {
            ApiError::invalid_param(
                "from",
                format!("Invalid 'from' offset `{from}`: expected a byte offset"),
            )
        })?,
    };
    if session.read_from(from) == Read::Lost {
        return Err(ApiError::invalid_param(
            "from",
            "Stream offset lost, please restart",
        ));
    }
    let mut response = Response::new(reader(session, from));
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    Ok(response)
}

/// `POST /v1/streams/lookup` with `{"conversation_ids": [...]}`.
pub fn lookup(sessions: &StreamSessions, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?;
    // As llama-server reads it: a missing or malformed list, or entries that are not strings,
    // ask about nothing.
    let ids: Vec<String> = value
        .get("conversation_ids")
        .and_then(Value::as_array)
        .map(|ids| {
            ids.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    Ok(json_response(StatusCode::OK, &sessions.lookup(&ids)))
}

/// `query`'s `name=value` pairs, percent-decoded (`+` as a space).
fn url_params(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (
            bytes[i],
            bytes.get(i + 1).and_then(|&b| hex(b)),
            bytes.get(i + 2).and_then(|&b| hex(b)),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(high * 16 + low);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_keeps_its_last_bytes_and_reads_from_any_kept_offset() {
        let session = Session::new("c".into(), 8);
        assert!(session.append(b"hello"));
        assert_eq!(
            session.read_from(0),
            Read::Bytes(Bytes::from_static(b"hello"))
        );
        assert_eq!(session.read_from(5), Read::Bytes(Bytes::new()));
        assert!(session.append(b" world"));
        // 11 bytes through a cap of 8: the first 3 are dropped.
        assert_eq!(session.read_from(2), Read::Lost);
        assert_eq!(
            session.read_from(3),
            Read::Bytes(Bytes::from_static(b"lo world"))
        );
        session.finish();
        assert!(!session.append(b"!"));
        assert_eq!(session.read_from(11), Read::End);
        assert_eq!(session.describe()["total_bytes"], 11);
        assert_eq!(session.describe()["is_done"], true);
    }

    #[test]
    fn an_id_holds_one_stream_and_lookup_answers_only_ids_asked_about() {
        let sessions = StreamSessions::default();
        let first = sessions.create("conv");
        let second = sessions.create("conv");
        assert!(first.is_cancelled() && !second.is_cancelled());
        sessions.create("conv::model-a");
        sessions.create("other");
        let found = sessions.lookup(&["conv".into(), "missing".into()]);
        let ids: Vec<&str> = found
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["conversation_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["conv", "conv::model-a"]);
        assert_eq!(found[0]["is_done"], false);
        assert_eq!(found[0]["completed_at"], 0);
        assert_eq!(sessions.lookup(&[]), json!([]));
        sessions.remove("conv");
        assert!(second.is_cancelled());
        assert!(sessions.get("conv").is_none());
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            url_params("conv_id=org%2Frepo%3A%3Ax&from=12"),
            vec![
                ("conv_id".to_owned(), "org/repo::x".to_owned()),
                ("from".to_owned(), "12".to_owned())
            ]
        );
        assert_eq!(decode("a+b%zz%4"), "a b%zz%4");
    }
}
