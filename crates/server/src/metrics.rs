//! Prometheus text for `/metrics`: llama-server's `llamacpp:` families where they apply, then
//! `mlxcel_` families. Tokens, times, latency histograms, bucket occupancy and compilations come
//! from the engine (it sees every step and every request); the server counts only what it alone
//! sees: requests refused at its door, and how its own requests ended (a client that went away
//! counts as cancelled here even when the engine had already finished it).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mlxcel_engine::{EngineMetrics, FinishCounts, FinishReason, Histogram};

/// How far back the drain rate of the queue is measured.
const DRAIN_WINDOW: Duration = Duration::from_secs(60);
/// The longest `Retry-After` this server sends.
const MAX_RETRY_AFTER: u64 = 300;

#[derive(Debug, Default)]
struct Counters {
    finished: FinishCounts,
    rejected_queue_full: u64,
    /// When this server's requests ended, within [`DRAIN_WINDOW`] of the latest.
    ends: VecDeque<Instant>,
    /// The engine's token and time totals at the last scrape, for llama-server's throughput
    /// gauges over the window since then.
    last_scrape: Totals,
}

/// Prompt and generated tokens, and the seconds spent on each.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    prompt_tokens: u64,
    prompt_seconds: f64,
    generated_tokens: u64,
    generated_seconds: f64,
}

impl Totals {
    fn of(e: &EngineMetrics) -> Self {
        // llama-server's per-request prompt time (submission to first token) and generation
        // time (first token to last) are the sums of the engine's two latency histograms.
        Self {
            prompt_tokens: e.prompt_tokens,
            prompt_seconds: e.time_to_first_token.sum,
            generated_tokens: e.generated_tokens,
            generated_seconds: e.inter_token_latency.sum,
        }
    }
}

/// Tokens per second, 0 without time.
fn rate(tokens: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// Seconds until `waiting` requests and one more have drained, at the rate `ends` (request ends
/// within [`DRAIN_WINDOW`] before `now`) shows: at least 1, at most [`MAX_RETRY_AFTER`]; 1 when
/// no request has ended in the window (nothing measured yet).
fn retry_after_at(ends: &VecDeque<Instant>, waiting: usize, now: Instant) -> u64 {
    let recent: Vec<&Instant> = ends
        .iter()
        .filter(|&&t| now.saturating_duration_since(t) <= DRAIN_WINDOW)
        .collect();
    let Some(oldest) = recent.first() else {
        return 1;
    };
    // The span the ends fell in, from the oldest to now (at least a second).
    let span = now
        .saturating_duration_since(**oldest)
        .as_secs_f64()
        .max(1.0);
    let per_second = recent.len() as f64 / span;
    let seconds = (waiting as f64 + 1.0) / per_second;
    (seconds.ceil() as u64).clamp(1, MAX_RETRY_AFTER)
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
        let now = Instant::now();
        self.with(|c| {
            c.finished.record(reason);
            c.ends.push_back(now);
            while c
                .ends
                .front()
                .is_some_and(|&t| now.saturating_duration_since(t) > DRAIN_WINDOW)
            {
                c.ends.pop_front();
            }
        });
    }

    /// The `Retry-After` seconds for a request refused while `waiting` requests wait: the time
    /// the queue takes to drain at the rate requests ended over the last minute.
    pub fn retry_after(&self, waiting: usize) -> u64 {
        self.with(|c| retry_after_at(&c.ends, waiting, Instant::now()))
    }

    /// A request refused because the queue was full.
    pub fn observe_queue_full(&self) {
        self.with(|c| c.rejected_queue_full += 1);
    }

    /// How many of this server's requests ended for `reason`.
    pub fn finished(&self, reason: FinishReason) -> u64 {
        self.with(|c| c.finished.get(reason))
    }

    /// The exposition text. `engine` is `None` while the model loads; `model` labels the vLLM
    /// families. A scrape starts the next window of llama-server's throughput gauges.
    pub fn render(&self, engine: Option<&EngineMetrics>, in_flight: usize, model: &str) -> String {
        let default = EngineMetrics::default();
        let e = engine.unwrap_or(&default);
        let now = Totals::of(e);
        let (finished, rejected_queue_full, since) = self.with(|c| {
            let since = c.last_scrape;
            c.last_scrape = now;
            (c.finished, c.rejected_queue_full, since)
        });
        let mut out = String::new();
        // llama-server's throughput gauges cover the window since the previous scrape, as its
        // own do (it resets them when /metrics is read).
        let window_prompt = rate(
            now.prompt_tokens.saturating_sub(since.prompt_tokens),
            now.prompt_seconds - since.prompt_seconds,
        );
        let window_predicted = rate(
            now.generated_tokens.saturating_sub(since.generated_tokens),
            now.generated_seconds - since.generated_seconds,
        );
        let busy_per_decode = if e.steps > 0 {
            e.busy_slot_steps as f64 / e.steps as f64
        } else {
            0.0
        };
        let families: [(&str, &str, &str, String); 29] = [
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
                now.prompt_seconds.to_string(),
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
                now.generated_seconds.to_string(),
            ),
            (
                "llamacpp:prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens served from the prefix cache.",
                e.reused_tokens.to_string(),
            ),
            (
                "llamacpp:n_decode_total",
                "counter",
                "Total number of engine steps.",
                e.steps.to_string(),
            ),
            (
                "llamacpp:n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per engine step.",
                busy_per_decode.to_string(),
            ),
            (
                "llamacpp:n_tokens_max",
                "counter",
                "Largest observed n_tokens (prompt and generated) of a request.",
                e.max_request_tokens.to_string(),
            ),
            (
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s since the last scrape.",
                window_prompt.to_string(),
            ),
            (
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s since the last scrape.",
                window_predicted.to_string(),
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
                "llamacpp:spec_decode_num_drafts_total",
                "counter",
                "Speculative verification passes that carried proposals.",
                e.drafts.to_string(),
            ),
            (
                "llamacpp:spec_decode_num_draft_tokens_total",
                "counter",
                "Tokens proposed by speculative decoding.",
                e.drafted_tokens.to_string(),
            ),
            (
                "llamacpp:spec_decode_num_accepted_tokens_total",
                "counter",
                "Proposed tokens the model accepted.",
                e.accepted_tokens.to_string(),
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
                "Requests refused because the queue was full (503 with Retry-After).",
                rejected_queue_full.to_string(),
            ),
            (
                "mlxcel_compilations_total",
                "counter",
                "Static-shape executables compiled (0 on MLX).",
                e.compilations.to_string(),
            ),
            (
                "mlxcel_constraint_masks_total",
                "counter",
                "Structured-output token masks computed.",
                e.constraint_masks.to_string(),
            ),
            (
                "mlxcel_constraint_mask_seconds_total",
                "counter",
                "Time engine steps spent waiting for and applying structured-output token masks.",
                e.constraint_mask_time.as_secs_f64().to_string(),
            ),
            (
                "mlxcel_prefix_cache_lookups_total",
                "counter",
                "Requests whose prompt was looked up in the prefix cache.",
                e.prefix.lookups.to_string(),
            ),
            (
                "mlxcel_prefix_cache_hits_total",
                "counter",
                "Requests that reused a cached prefix.",
                e.prefix.hits.to_string(),
            ),
            (
                "mlxcel_prefix_cache_takeovers_total",
                "counter",
                "Of the hits, those that took over a kept slot whole instead of copying it.",
                e.prefix.takeovers.to_string(),
            ),
            (
                "mlxcel_prefix_cache_evictions_total",
                "counter",
                "Prefix-cache entries evicted to make room (least recently used first).",
                e.prefix.evictions.to_string(),
            ),
            (
                "mlxcel_prefix_cache_entries",
                "gauge",
                "Entries the prefix cache holds.",
                e.prefix.entries.to_string(),
            ),
            (
                "mlxcel_prefix_cache_bytes",
                "gauge",
                "KV bytes the prefix cache's entries hold (counted at their reservation).",
                e.prefix.bytes.to_string(),
            ),
            (
                "mlxcel_prefix_cache_budget_bytes",
                "gauge",
                "The prefix cache's budget (--cache-ram; 0: off).",
                e.prefix.budget.to_string(),
            ),
        ];
        for (name, kind, help, value) in families {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        if let Some(blocks) = e.kv_blocks {
            for (name, help, value) in [
                (
                    "mlxcel_kv_blocks_held",
                    "Distinct KV blocks the slots hold (a shared block once).",
                    blocks.held,
                ),
                (
                    "mlxcel_kv_blocks_shared",
                    "KV blocks more than one slot holds (a common prefix).",
                    blocks.shared,
                ),
                (
                    "mlxcel_kv_blocks_free",
                    "KV blocks the budget has room for beyond those held and reserved.",
                    blocks.free,
                ),
                (
                    "mlxcel_kv_block_positions",
                    "Positions per KV block.",
                    blocks.block_positions,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
                );
            }
        }
        // llama-server's one labelled counter: a series per draft position, once any sequence
        // has verified a draft.
        if !e.accepted_per_position.is_empty() {
            let name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total";
            let _ = writeln!(
                out,
                "# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter"
            );
            for (position, count) in e.accepted_per_position.iter().enumerate() {
                let _ = writeln!(out, "{name}{{position=\"{position}\"}} {count}");
            }
        }
        let _ = writeln!(
            out,
            "# HELP mlxcel_http_requests_finished_total This server's requests, by finish reason.\n\
             # TYPE mlxcel_http_requests_finished_total counter"
        );
        for (reason, count) in finished.by_reason() {
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
        vllm(&mut out, e, model);
        out
    }
}

fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    labelled_histogram(out, name, help, "", h);
}

/// A histogram whose series carry `labels` (`key="value",...` or empty).
fn labelled_histogram(out: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let sep = if labels.is_empty() { "" } else { "," };
    for (bound, count) in h.cumulative() {
        let le = bound.map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {count}");
    }
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(
        out,
        "{name}_sum{braces} {}\n{name}_count{braces} {}",
        h.sum, h.count
    );
}

/// A label value in the exposition format: backslash, quote and newline escaped.
fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// vLLM's families under their own names (`vllm:`), each series labelled with `model_name`, so
/// that dashboards made for vLLM read this server.
fn vllm(out: &mut String, e: &EngineMetrics, model: &str) {
    let labels = format!("model_name=\"{}\"", label_value(model));
    let gauges: [(&str, &str, &str, String); 7] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            e.running.to_string(),
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            e.waiting.to_string(),
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            e.prompt_tokens.to_string(),
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            e.generated_tokens.to_string(),
        ),
        (
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            e.prefix.queried_tokens.to_string(),
        ),
        (
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            e.reused_tokens.to_string(),
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "counter",
            "Proposed tokens the model accepted.",
            e.accepted_tokens.to_string(),
        ),
    ];
    for (name, kind, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP vllm:request_success_total Requests that ended, by finish reason.\n\
         # TYPE vllm:request_success_total counter"
    );
    for (reason, count) in e.finished.by_reason() {
        let _ = writeln!(
            out,
            "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {count}"
        );
    }
    for (name, help, h) in [
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &e.time_to_first_token,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &e.inter_token_latency,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            &e.e2e_request_latency,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in the decode phase (first token to end) in seconds.",
            &e.decode_time,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent waiting for a slot in seconds.",
            &e.queue_time,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in the prefill phase (admission to first token) in seconds.",
            &e.prefill_time,
        ),
    ] {
        labelled_histogram(out, name, help, &labels, h);
    }
    if let Some((reserved, budget)) = e.kv_usage {
        let fraction = if budget > 0 {
            reserved as f64 / budget as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
             # TYPE vllm:kv_cache_usage_perc gauge\n\
             vllm:kv_cache_usage_perc{{{labels}}} {fraction}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_measured_drain_time() {
        let now = Instant::now();
        let mut ends = VecDeque::new();
        // Nothing measured: retry in a second.
        assert_eq!(retry_after_at(&ends, 10, now), 1);
        // Ten ends over the last 20 s: 0.5 per second, so 9 waiting and one more take 20 s.
        for i in 0..10 {
            ends.push_back(now - Duration::from_secs(20) + Duration::from_secs(2 * i));
        }
        assert_eq!(retry_after_at(&ends, 9, now), 20);
        assert_eq!(retry_after_at(&ends, 0, now), 2);
        // Ends older than the window do not count; a slow drain is capped.
        let old: VecDeque<Instant> = [now - Duration::from_secs(120)].into();
        assert_eq!(retry_after_at(&old, 5, now), 1);
        let slow: VecDeque<Instant> = [now - Duration::from_secs(59)].into();
        assert_eq!(retry_after_at(&slow, 1000, now), MAX_RETRY_AFTER);
    }

    #[test]
    fn accepted_tokens_per_draft_position_are_one_series_each() {
        let metrics = Metrics::default();
        let mut e = EngineMetrics::default();
        let name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total";
        assert!(!metrics.render(Some(&e), 0, "m").contains(name));
        e.scheduler.accepted_per_position = vec![5, 2, 0];
        let text = metrics.render(Some(&e), 0, "m");
        let expected = format!(
            "# HELP {name} Accepted tokens per draft position\n# TYPE {name} counter\n\
             {name}{{position=\"0\"}} 5\n{name}{{position=\"1\"}} 2\n{name}{{position=\"2\"}} 0\n"
        );
        assert!(text.contains(&expected), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label_value("x\ny"), "x\\ny");
    }

    #[test]
    fn throughput_gauges_cover_the_window_since_the_last_scrape() {
        let metrics = Metrics::default();
        let mut e = EngineMetrics::default();
        e.scheduler.prompt_tokens = 100;
        e.time_to_first_token.observe(Duration::from_secs(2));
        let first = metrics.render(Some(&e), 0, "m");
        assert!(
            first.contains("llamacpp:prompt_tokens_seconds 50\n"),
            "{first}"
        );
        // No new tokens since: 0 over this window, the totals unchanged.
        let second = metrics.render(Some(&e), 0, "m");
        assert!(
            second.contains("llamacpp:prompt_tokens_seconds 0\n"),
            "{second}"
        );
        assert!(second.contains("llamacpp:prompt_tokens_total 100\n"));
        assert!(second.contains("vllm:prompt_tokens_total{model_name=\"m\"} 100\n"));
    }
}
