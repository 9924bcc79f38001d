//! What a caller reads of the scheduler after a step: its counters (the one set the engine's
//! metrics report), each static-shape bucket's use, and how far each running prompt has got.

use crate::request::RequestId;

use super::prefix_cache::PrefixCacheStats;

/// Counters a caller can read cheaply after each step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SchedulerStats {
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Steps run so far.
    pub steps: u64,
    /// Prompt tokens prefilled so far.
    pub prompt_tokens: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// Speculative decoding: tokens proposed, and of those accepted, so far.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// Speculative decoding: by draft position (0 the first proposal of a pass), how many
    /// proposals at that position were accepted (a pass that accepted `n` counts one at each of
    /// positions `0..n`, as llama-server counts them). As long as the largest
    /// `draft_max` of the sequences that have verified a draft; empty before any.
    pub accepted_per_position: Vec<u64>,
    /// Sequences the draft model could not serve (no room in its window or memory, or it
    /// failed), which decoded without it.
    pub draft_fallbacks: u64,
    /// Prompt tokens not computed because a cached prefix held them (the prefix cache).
    pub reused_tokens: u64,
    /// The sum over steps of the sequences each step ran.
    pub busy_slot_steps: u64,
    /// Speculative verification passes that carried proposals.
    pub drafts: u64,
    /// Structured output: token masks applied, and the time steps spent on them after the
    /// forward pass, before sampling (waiting for what is left of a mask computed ahead, and
    /// applying it): what constraints add to a step.
    pub constraint_masks: u64,
    pub constraint_mask_time: std::time::Duration,
    /// The prefix cache's counters and contents.
    pub prefix: PrefixCacheStats,
}

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

/// How far a running request's prompt has got, as of the last step (llama-server's `/slots`
/// `n_prompt_tokens_processed` and `n_prompt_tokens_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestProgress {
    /// The request.
    pub id: RequestId,
    /// Prompt tokens computed by this request's own prefill so far.
    pub prompt_processed: usize,
    /// Prompt tokens a cached prefix held (copied, not computed).
    pub prompt_cached: usize,
}
