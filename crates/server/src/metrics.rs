//! Prometheus text for `/metrics`: llama-server's `llamacpp:` families where they apply, then
//! `mlxcel_` families. Tokens, times, latency histograms, bucket occupancy and compilations come
//! from the engine (it sees every step and every request); the server counts only what it alone
//! sees: requests refused at its door, and how its own requests ended (a client that went away
//! counts as cancelled here even when the engine had already finished it).

use std::fmt::Write as _;
use std::sync::Mutex;

use mlxcel_engine::{EngineMetrics, FinishCounts, FinishReason, Histogram};

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    finished: FinishCounts,
    rejected_queue_full: u64,
}

/// Counters shared by every request of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Counters>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// One of this server's requests ended for `reason`.
    pub fn observe_finished(&self, reason: FinishReason) {
        self.with(|c| c.finished.record(reason));
    }

    /// A request refused because the queue was full.
    pub fn observe_queue_full(&self) {
        self.with(|c| c.rejected_queue_full += 1);
    }

    /// How many of this server's requests ended for `reason`.
    pub fn finished(&self, reason: FinishReason) -> u64 {
        self.with(|c| c.finished.get(reason))
    }

    /// The exposition text. `engine` is `None` while the model loads.
    pub fn render(&self, engine: Option<&EngineMetrics>, in_flight: usize) -> String {
        let c = self.with(|c| *c);
        let default = EngineMetrics::default();
        let e = engine.unwrap_or(&default);
        let mut out = String::new();
        // llama-server's per-request prompt time (submission to first token) and generation time
        // (first token to last) are the sums of the engine's two latency histograms.
        let prompt_seconds = e.time_to_first_token.sum;
        let predicted_seconds = e.inter_token_latency.sum;
        let rate = |tokens: u64, seconds: f64| {
            if seconds > 0.0 {
                tokens as f64 / seconds
            } else {
                0.0
            }
        };
        let families: [(&str, &str, &str, String); 14] = [
            (
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                e.prompt_tokens.to_string(),
            ),
            (
                "llamacpp:prompt_seconds_total",
                "counter",
                "Prompt process time.",
                prompt_seconds.to_string(),
            ),
            (
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                e.generated_tokens.to_string(),
            ),
            (
                "llamacpp:tokens_predicted_seconds_total",
                "counter",
                "Predict process time.",
                predicted_seconds.to_string(),
            ),
            (
                "llamacpp:n_decode_total",
                "counter",
                "Total number of engine steps.",
                e.steps.to_string(),
            ),
            (
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                rate(e.prompt_tokens, prompt_seconds).to_string(),
            ),
            (
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                rate(e.generated_tokens, predicted_seconds).to_string(),
            ),
            (
                "llamacpp:requests_processing",
                "gauge",
                "Number of requests processing.",
                e.running.to_string(),
            ),
            (
                "llamacpp:requests_deferred",
                "gauge",
                "Number of requests deferred.",
                e.waiting.to_string(),
            ),
            (
                "mlxcel_queue_depth",
                "gauge",
                "Requests waiting for a slot in the engine.",
                e.waiting.to_string(),
            ),
            (
                "mlxcel_requests_in_flight",
                "gauge",
                "Requests the HTTP server is serving.",
                in_flight.to_string(),
            ),
            (
                "mlxcel_requests_submitted_total",
                "counter",
                "Requests the engine accepted.",
                e.requests_submitted.to_string(),
            ),
            (
                "mlxcel_requests_rejected_queue_full_total",
                "counter",
                "Requests refused because the queue was full.",
                c.rejected_queue_full.to_string(),
            ),
            (
                "mlxcel_compilations_total",
                "counter",
                "Static-shape executables compiled (0 on MLX).",
                e.compilations.to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP mlxcel_http_requests_finished_total This server's requests, by finish reason.\n\
             # TYPE mlxcel_http_requests_finished_total counter"
        );
        for (reason, count) in c.finished.by_reason() {
            let _ = writeln!(
                out,
                "mlxcel_http_requests_finished_total{{reason=\"{reason}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP mlxcel_requests_finished_total Requests the engine ended, by finish reason.\n\
             # TYPE mlxcel_requests_finished_total counter"
        );
        for (reason, count) in e.finished.by_reason() {
            let _ = writeln!(
                out,
                "mlxcel_requests_finished_total{{reason=\"{reason}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP mlxcel_bucket_occupancy Sequences running per context-capacity bucket (\"dynamic\" without static shapes).\n\
             # TYPE mlxcel_bucket_occupancy gauge"
        );
        if e.buckets.is_empty() {
            let _ = writeln!(
                out,
                "mlxcel_bucket_occupancy{{bucket=\"dynamic\"}} {}",
                e.running
            );
        } else {
            for b in &e.buckets {
                let _ = writeln!(
                    out,
                    "mlxcel_bucket_occupancy{{bucket=\"{}\"}} {}",
                    b.context_capacity, b.running
                );
            }
            let _ = writeln!(
                out,
                "# HELP mlxcel_bucket_padding_waste Fraction of running sequences' positions that are padding.\n\
                 # TYPE mlxcel_bucket_padding_waste gauge"
            );
            for b in &e.buckets {
                let _ = writeln!(
                    out,
                    "mlxcel_bucket_padding_waste{{bucket=\"{}\"}} {}",
                    b.context_capacity,
                    b.padding_waste()
                );
            }
        }
        histogram(
            &mut out,
            "mlxcel_time_to_first_token_seconds",
            "Time from submission to the first generated token.",
            &e.time_to_first_token,
        );
        histogram(
            &mut out,
            "mlxcel_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
            &e.inter_token_latency,
        );
        out
    }
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, count) in h.cumulative() {
        match bound {
            Some(bound) => {
                let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
            }
            None => {
                let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
            }
        }
    }
    let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", h.sum, h.count);
}
