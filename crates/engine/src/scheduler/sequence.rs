//! One request's state in the scheduler, from submission to its end.

use crate::backend::{SessionPlan, SlotId};
use crate::constraint::ConstrainedOutput;
use crate::decode::DecodeStream;
use crate::reasoning_budget::BudgetTracker;
use crate::request::{RequestId, RequestStatus, Usage};
use crate::sampling::Sampler;
use crate::speculative::SpeculativeConfig;
use crate::stop::StopMatcher;

use super::indent::IndentStop;

/// One sequence in the scheduler.
pub(super) struct Sequence {
    pub(super) id: RequestId,
    pub(super) status: RequestStatus,
    pub(super) plan: SessionPlan,
    pub(super) slot: Option<SlotId>,
    /// Prompt then generated tokens.
    pub(super) tokens: Vec<u32>,
    pub(super) prompt_len: usize,
    /// Tokens whose keys and values are in the slot.
    pub(super) computed: usize,
    /// Prompt tokens copied rather than computed: what the prefix cache held at admission, or
    /// what a sequence admitted before it computed meanwhile (see `waits_for_sharer`).
    pub(super) cached: usize,
    /// Whether it may start from a cached prefix ([`crate::GenerationRequest::reuse_cached_prefix`]).
    pub(super) reuse_cached_prefix: bool,
    /// Its LoRA scales ([`crate::GenerationRequest::lora`]), trailing zeros dropped: empty when
    /// it runs the model alone. A sequence with some neither reuses nor feeds the prefix cache
    /// (its keys and values are the adapted model's).
    pub(super) lora: Vec<f32>,
    pub(super) sampler: Sampler,
    pub(super) decoder: Box<dyn DecodeStream>,
    pub(super) stops: StopMatcher,
    pub(super) stop_token_ids: Vec<u32>,
    pub(super) logprobs: Option<usize>,
    /// Whether `logprobs` reports the sampler's distribution
    /// ([`crate::GenerationRequest::post_sampling_probs`]).
    pub(super) post_sampling_probs: bool,
    /// The structured-output constraint in progress, if any.
    pub(super) constraint: Option<ConstrainedOutput>,
    /// Prompt-lookup speculation, when the request (or the engine) asks for it.
    pub(super) speculative: Option<SpeculativeConfig>,
    /// The rate at which its proposals have been accepted (per position, an exponential
    /// average): what [`SpeculativeConfig::draft_length`] sizes the next pass by.
    pub(super) acceptance: f32,
    /// Decode steps since it last verified proposals.
    pub(super) quiet_steps: usize,
    /// Proposals verified for this sequence, and of them accepted.
    pub(super) drafted: usize,
    pub(super) accepted: usize,
    /// The draft model's view of this sequence (draft-model speculation only).
    pub(super) draft: DraftState,
    /// Its state in llama.cpp's hashed n-gram proposers (when its types include them).
    pub(super) hashed: crate::hashed_chain::HashedState,
    pub(super) cancel_requested: bool,
    /// `GenerationRequest::predict_time_limit`, and when the first token was generated.
    pub(super) predict_time_limit: Option<std::time::Duration>,
    pub(super) first_token_at: Option<std::time::Instant>,
    /// `GenerationRequest::min_indent`'s rule in progress, and whether it ended the output.
    pub(super) indent: Option<IndentStop>,
    pub(super) indent_stopped: bool,
    /// The reply's reasoning budget in progress ([`crate::GenerationRequest::reasoning_budget`]).
    pub(super) budget: Option<BudgetTracker>,
    /// Whether the last token was forced by `budget` rather than sampled.
    pub(super) forced_last: bool,
}

impl Sequence {
    pub(super) fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub(super) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated(),
            cached_tokens: self.cached,
            drafted_tokens: self.drafted,
            accepted_tokens: self.accepted,
        }
    }
}

/// A sequence's slot in the draft model and what that slot holds: `computed` positions, the
/// sequence's tokens up to `base` and then `fed` (the proposals fed back to the draft, which the
/// sequence may or may not have accepted; reconciled lazily before the next proposal).
#[derive(Debug, Default)]
pub(super) struct DraftState {
    pub(super) slot: Option<SlotId>,
    pub(super) computed: usize,
    pub(super) base: usize,
    pub(super) fed: Vec<u32>,
    /// The draft cannot serve this sequence (no room for it, or it failed): plain decoding.
    pub(super) off: bool,
}
