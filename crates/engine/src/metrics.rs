//! Counters and latency histograms the engine keeps, cheap to read from a server.

use std::time::Duration;

use crate::request::FinishReason;

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

/// One static-shape bucket's use right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketOccupancy {
    /// The bucket's context capacity.
    pub context_capacity: usize,
    /// Its batch limit.
    pub max_batch: usize,
    /// Sequences running in it.
    pub running: usize,
    /// Positions those sequences hold (prompt plus generated so far).
    pub positions_used: usize,
}

impl BucketOccupancy {
    /// Fraction of the running sequences' positions that are padding: compiled but unused.
    pub fn padding_waste(&self) -> f64 {
        let reserved = self.running * self.context_capacity;
        if reserved == 0 {
            0.0
        } else {
            1.0 - self.positions_used as f64 / reserved as f64
        }
    }
}

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
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Scheduler steps run.
    pub steps: u64,
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Speculative decoding: tokens proposed, and of those accepted.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// Sequences the draft model could not serve, which decoded without it.
    pub draft_fallbacks: u64,
    /// Prompt tokens a cached prefix held (not computed).
    pub reused_tokens: u64,
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
    pub kv_blocks: Option<crate::KvBlockUsage>,
    /// The sum over steps of the sequences each step ran (divided by `steps`: the mean batch).
    pub busy_slot_steps: u64,
    /// The most positions (prompt and generated tokens) a finished request used.
    pub max_request_tokens: u64,
    /// Speculative decoding: verification passes that carried proposals.
    pub drafts: u64,
    /// Structured output: token masks applied, and the time steps spent on them after the
    /// forward pass (see `SchedulerStats::constraint_mask_time`).
    pub constraint_masks: u64,
    pub constraint_mask_time: std::time::Duration,
    /// Static-shape buckets (empty for dynamic backends).
    pub buckets: Vec<BucketOccupancy>,
    /// Executables the backend compiled (0 for backends that do not compile).
    pub compilations: u64,
    /// Each request holding a slot: how far its prompt has got.
    pub running_requests: Vec<RequestProgress>,
    /// The prefix cache's counters and contents.
    pub prefix: crate::PrefixCacheStats,
}

/// How far a running request's prompt has got, as of the last step (llama-server's `/slots`
/// `n_prompt_tokens_processed` and `n_prompt_tokens_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestProgress {
    /// The request.
    pub id: crate::RequestId,
    /// Prompt tokens computed by this request's own prefill so far.
    pub prompt_processed: usize,
    /// Prompt tokens a cached prefix held (copied, not computed).
    pub prompt_cached: usize,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            waiting: 0,
            running: 0,
            steps: 0,
            prompt_tokens: 0,
            generated_tokens: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
            draft_fallbacks: 0,
            reused_tokens: 0,
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
            busy_slot_steps: 0,
            max_request_tokens: 0,
            drafts: 0,
            constraint_masks: 0,
            constraint_mask_time: std::time::Duration::ZERO,
            buckets: Vec::new(),
            compilations: 0,
            running_requests: Vec::new(),
            prefix: crate::PrefixCacheStats::default(),
        }
    }
}
