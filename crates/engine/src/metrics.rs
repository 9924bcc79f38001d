//! Counters and latency histograms the engine keeps, cheap to read from a server.

use std::time::Duration;

use crate::backend::KvBlockUsage;
use crate::request::FinishReason;
use crate::scheduler::{BucketOccupancy, RequestProgress, SchedulerStats};

/// A cumulative histogram with fixed upper bounds (Prometheus' shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds in seconds, ascending; an implicit `+Inf` bucket follows.
    pub bounds: Vec<f64>,
    /// Observations per bucket (`bounds.len() + 1` entries, not cumulative).
    pub counts: Vec<u64>,
    /// Sum of all observations, in seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with the given upper bounds (seconds).
    pub fn new(bounds: &[f64]) -> Self {
        Self {
            bounds: bounds.to_vec(),
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: Duration) {
        let seconds = value.as_secs_f64();
        let index = self
            .bounds
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(self.bounds.len());
        self.counts[index] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// Cumulative counts per upper bound, ending with `+Inf` (what Prometheus exposes).
    pub fn cumulative(&self) -> Vec<(Option<f64>, u64)> {
        let mut total = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &count)| {
                total += count;
                (self.bounds.get(i).copied(), total)
            })
            .collect()
    }
}

/// Time to first token: from submission to the first generated token (queueing and prefill).
pub const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Inter-token latency: between consecutive tokens of one request (one decode step).
pub const ITL_BOUNDS: &[f64] = &[0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5];

/// Whole requests (end-to-end latency, decode time): up to the minutes a long generation takes.
pub const E2E_BOUNDS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0,
];

/// Requests that ended, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinishCounts {
    /// Ended by EOS or a stop string.
    pub stop: u64,
    /// Ended by their budget or shape.
    pub length: u64,
    /// Cancelled by the caller.
    pub cancelled: u64,
    /// Ended by a backend failure.
    pub error: u64,
}

impl FinishCounts {
    /// Counts one request that ended for `reason`.
    pub fn record(&mut self, reason: FinishReason) {
        *match reason {
            FinishReason::Stop => &mut self.stop,
            FinishReason::Length => &mut self.length,
            FinishReason::Cancelled => &mut self.cancelled,
            FinishReason::Error => &mut self.error,
        } += 1;
    }

    /// The requests that ended for `reason`.
    pub fn get(&self, reason: FinishReason) -> u64 {
        match reason {
            FinishReason::Stop => self.stop,
            FinishReason::Length => self.length,
            FinishReason::Cancelled => self.cancelled,
            FinishReason::Error => self.error,
        }
    }

    /// Every reason (its `finish_reason` spelling) with its count, in the status order.
    pub fn by_reason(&self) -> [(&'static str, u64); 4] {
        FinishReason::ALL.map(|reason| (reason.as_str(), self.get(reason)))
    }
}

/// A snapshot of the engine's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
    /// The scheduler's counters as of the last step (requests waiting and running, steps,
    /// tokens, speculation, constraint masks, the prefix cache); read as fields of the snapshot
    /// itself (`metrics.waiting`) through `Deref`.
    pub scheduler: SchedulerStats,
    /// Requests accepted.
    pub requests_submitted: u64,
    /// Requests ended, by reason.
    pub finished: FinishCounts,
    /// Time to first token.
    pub time_to_first_token: Histogram,
    /// Time between consecutive tokens of a request.
    pub inter_token_latency: Histogram,
    /// Time from submission to the end of a request (every finish reason).
    pub e2e_request_latency: Histogram,
    /// Time from a request's first token to its end (its decode phase).
    pub decode_time: Histogram,
    /// Time from submission to the step that admitted the request to a slot.
    pub queue_time: Histogram,
    /// Time from admission to the first token (its prefill).
    pub prefill_time: Histogram,
    /// KV memory reserved and its budget, in bytes (`None`: the backend keeps no budget).
    pub kv_usage: Option<(usize, usize)>,
    /// The KV blocks held, shared and free (`None`: the backend keeps no blocks).
    pub kv_blocks: Option<KvBlockUsage>,
    /// The most positions (prompt and generated tokens) a finished request used.
    pub max_request_tokens: u64,
    /// Static-shape buckets (empty for dynamic backends).
    pub buckets: Vec<BucketOccupancy>,
    /// Executables the backend compiled (0 for backends that do not compile).
    pub compilations: u64,
    /// Each request holding a slot: how far its prompt has got.
    pub running_requests: Vec<RequestProgress>,
    /// Why the backend can no longer run steps, once it cannot (a pipeline that lost a rank:
    /// [`crate::Backend::fault`]); `/health` reports it.
    pub backend_fault: Option<String>,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            scheduler: SchedulerStats::default(),
            requests_submitted: 0,
            finished: FinishCounts::default(),
            time_to_first_token: Histogram::new(TTFT_BOUNDS),
            inter_token_latency: Histogram::new(ITL_BOUNDS),
            e2e_request_latency: Histogram::new(E2E_BOUNDS),
            decode_time: Histogram::new(E2E_BOUNDS),
            queue_time: Histogram::new(TTFT_BOUNDS),
            prefill_time: Histogram::new(TTFT_BOUNDS),
            kv_usage: None,
            kv_blocks: None,
            max_request_tokens: 0,
            buckets: Vec::new(),
            compilations: 0,
            running_requests: Vec::new(),
            backend_fault: None,
        }
    }
}

/// The scheduler's counters read as the snapshot's own fields (`metrics.generated_tokens`), as
/// they were before the snapshot held them as one struct.
impl std::ops::Deref for EngineMetrics {
    type Target = SchedulerStats;

    fn deref(&self) -> &SchedulerStats {
        &self.scheduler
    }
}
