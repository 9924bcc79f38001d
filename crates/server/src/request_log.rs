//! One log line per finished request, at INFO: its id, method, route, status and time, and for a
//! generation its prompt, cached and generated tokens, time to first token, generation rate and
//! finish reason. The router opens a [`RequestLog`] around each request's handler; a generation
//! takes it over when it is submitted ([`RequestLog::take_over`]) and writes the line when it
//! ends (a stream ends long after its response began), so each request has exactly one line.
//!
//! Levels follow who is at fault: a refused request (4xx), a route turned off (501) and a full
//! queue or a loading model (503) are the client's or the moment's, logged at INFO; other server
//! failures (500) at WARN, beside the ERROR line [`crate::error`] writes with their detail. Health
//! probes are DEBUG ([`is_probe`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

tokio::task_local! {
    static CURRENT: RequestLog;
}

/// The request a task is answering.
#[derive(Debug, Clone)]
pub struct RequestLog {
    /// A process-wide counter, from 1.
    pub id: u64,
    method: String,
    route: String,
    started: Instant,
    /// Set once a generation has taken the line over.
    taken: Arc<AtomicBool>,
}

/// What a generation reports on its line.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationSummary {
    /// The engine's request id.
    pub engine_id: u64,
    pub prompt_tokens: usize,
    /// Of the prompt tokens, those the prefix cache held.
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Submission to the first token, in ms (`None`: no token came).
    pub ttft_ms: Option<f64>,
    /// Decode steps per second after the first token (llama-server's `predicted_per_second`).
    pub tok_s: f64,
    /// `stop`, `length`, `cancelled` or `error`.
    pub finish_reason: &'static str,
}

impl RequestLog {
    /// A request that has just arrived.
    pub fn new(method: &str, route: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            method: method.to_owned(),
            route: route.to_owned(),
            started: Instant::now(),
            taken: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Runs `handler` with this request as the task's current one.
    pub async fn scope<F: Future>(self, handler: F) -> F::Output {
        CURRENT.scope(self, handler).await
    }

    /// The current task's request, whose line the caller (a generation) now writes with
    /// [`RequestLog::generation_finished`]; `None` outside a request (an embedded caller).
    pub fn take_over() -> Option<Self> {
        CURRENT
            .try_with(|log| {
                log.taken.store(true, Ordering::Relaxed);
                log.clone()
            })
            .ok()
    }

    /// Writes the line of a request answered with `status`, unless a generation took it over.
    pub fn responded(&self, status: u16) {
        if self.taken.load(Ordering::Relaxed) {
            return;
        }
        let elapsed_ms = self.elapsed_ms();
        let (id, method, route) = (self.id, self.method.as_str(), self.route.as_str());
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    request_id = id,
                    method,
                    route,
                    status,
                    elapsed_ms,
                    "request"
                )
            };
        }
        if is_server_fault(status) {
            line!(warn);
        } else if is_probe(route) {
            line!(debug);
        } else {
            line!(info);
        }
    }

    /// Writes the line of a generation that has ended.
    pub fn generation_finished(&self, summary: &GenerationSummary) {
        let status: u16 = if summary.finish_reason == "error" {
            500
        } else {
            200
        };
        let elapsed_ms = self.elapsed_ms();
        let ttft_ms = summary.ttft_ms.map(round);
        let tok_s = round(summary.tok_s);
        let (id, method, route) = (self.id, self.method.as_str(), self.route.as_str());
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    request_id = id,
                    method,
                    route,
                    status,
                    elapsed_ms,
                    engine_id = summary.engine_id,
                    prompt_tokens = summary.prompt_tokens,
                    cached_tokens = summary.cached_tokens,
                    generated_tokens = summary.generated_tokens,
                    ttft_ms,
                    tok_s,
                    finish_reason = summary.finish_reason,
                    "request"
                )
            };
        }
        if is_server_fault(status) {
            line!(warn);
        } else {
            line!(info);
        }
    }

    fn elapsed_ms(&self) -> f64 {
        round(self.started.elapsed().as_secs_f64() * 1e3)
    }
}

/// A failure of the server itself, not of the request or the moment (a route turned off, a model
/// loading, a full queue).
fn is_server_fault(status: u16) -> bool {
    status >= 500 && status != 501 && status != 503
}

/// A health probe's route (`/health`, `/v1/health`, `/live`): load balancers and supervisors
/// call them every few seconds, so their lines are DEBUG (as llama-server leaves them out of its
/// request log), unless the server failed.
fn is_probe(route: &str) -> bool {
    matches!(route, "/health" | "/v1/health" | "/live")
}

/// Two decimals are enough for a log line.
fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_generation_takes_the_line_over_inside_its_request_only() {
        assert!(RequestLog::take_over().is_none());
        let log = RequestLog::new("POST", "/v1/chat/completions");
        let taken = log
            .clone()
            .scope(async { RequestLog::take_over().map(|l| l.id) })
            .await;
        assert_eq!(taken, Some(log.id));
        assert!(log.taken.load(Ordering::Relaxed));
        assert_ne!(RequestLog::new("GET", "/").id, log.id);
    }

    #[test]
    fn only_server_failures_are_above_info() {
        for status in [200, 400, 401, 404, 413, 501, 503] {
            assert!(!is_server_fault(status), "{status}");
        }
        assert!(is_server_fault(500));
        assert!(is_probe("/health") && is_probe("/live") && !is_probe("/v1/models"));
    }
}
