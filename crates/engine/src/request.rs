//! What a caller submits, and what comes back.

use crate::constraint::Constraint;
use crate::reasoning_budget::ReasoningBudget;
use crate::sampling::SamplingParams;
use crate::speculative::SpeculativeConfig;
use mlxcel_capacity::MaxNewTokens;

/// Identifies a submitted request for its lifetime in the engine.
pub type RequestId = u64;

/// A tokenized generation request.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// The prompt after templating and tokenization; never empty.
    pub prompt: Vec<u32>,
    /// How many tokens to generate.
    pub max_new_tokens: MaxNewTokens,
    /// How to pick each token.
    pub sampling: SamplingParams,
    /// Strings that end generation; the text reported stops before them.
    pub stop: Vec<String>,
    /// Token ids that end generation (the checkpoint's EOS ids, usually).
    pub stop_token_ids: Vec<u32>,
    /// Report each token's log-probability and this many most likely alternatives; `None` for no
    /// log-probabilities at all.
    pub logprobs: Option<usize>,
    /// Report the probabilities after the sampling chain (the distribution each token was drawn
    /// from, llama-server's `post_sampling_probs`) instead of the model's: `logprobs`' values are
    /// then the logarithms of those probabilities, and only the chain's survivors are listed.
    pub post_sampling_probs: bool,
    /// What the output must match (structured output); `None` for free text.
    pub constraint: Option<Constraint>,
    /// With a constraint: the triggers that start it (llama-server's lazy grammars); empty, it
    /// applies from the start ([`crate::ConstraintTrigger`]).
    pub constraint_triggers: Vec<crate::constraint_trigger::ConstraintTrigger>,
    /// Prompt-lookup speculative decoding for this request; `None` for the engine's default
    /// ([`crate::EngineOptions::speculative`]).
    pub speculative: Option<SpeculativeConfig>,
    /// A time limit on generation, as llama-server's `t_max_predict_ms`: once this long has
    /// passed since the first generated token, the request ends ([`FinishReason::Length`]) at
    /// the next token whose text holds a newline. `None`: no limit.
    pub predict_time_limit: Option<std::time::Duration>,
    /// llama-server's `n_indent`: once the output has a newline, a new line indented by fewer
    /// than this many spaces or tabs ends it ([`FinishReason::Length`]), cut where that line's
    /// indentation ends. `0`: no rule.
    pub min_indent: usize,
    /// Whether the prompt may start from a prefix the prefix cache holds (llama-server's
    /// `cache_prompt`); `false` computes every prompt token. Default `true`.
    pub reuse_cached_prefix: bool,
    /// A limit on the reply's reasoning block: past it the engine writes the block's end
    /// itself ([`ReasoningBudget`]); `None` leaves reasoning to the model.
    pub reasoning_budget: Option<ReasoningBudget>,
    /// The scale of each LoRA adapter the engine loaded ([`crate::EngineOptions::lora_adapters`],
    /// by id) for this request; missing ids are 0, so empty runs the model alone. A request with
    /// an adapter at a non-zero scale neither reuses nor feeds the prefix cache.
    pub lora: Vec<f32>,
}

impl GenerationRequest {
    /// A request with default sampling, no stops, no logprobs.
    pub fn new(prompt: Vec<u32>, max_new_tokens: MaxNewTokens) -> Self {
        Self {
            prompt,
            max_new_tokens,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            logprobs: None,
            post_sampling_probs: false,
            constraint: None,
            constraint_triggers: Vec::new(),
            speculative: None,
            predict_time_limit: None,
            min_indent: 0,
            reuse_cached_prefix: true,
            reasoning_budget: None,
            lora: Vec::new(),
        }
    }
}

/// Where a request is in its life. Ordered: the finished states come last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestStatus {
    /// Queued, no slot yet.
    Waiting,
    /// Holds a slot: prefilling or decoding.
    Running,
    /// Ended by an EOS token or a stop string.
    FinishedStopped,
    /// Ended by its token budget or the end of its shape.
    FinishedLength,
    /// Ended by the caller.
    FinishedCancelled,
    /// Ended by a backend failure.
    FinishedError,
}

impl RequestStatus {
    /// Whether the request has ended.
    pub fn is_finished(self) -> bool {
        self >= Self::FinishedStopped
    }

    /// The one mapping from status to a finish reason; `None` while the request runs.
    pub fn finish_reason(self) -> Option<FinishReason> {
        match self {
            Self::Waiting | Self::Running => None,
            Self::FinishedStopped => Some(FinishReason::Stop),
            Self::FinishedLength => Some(FinishReason::Length),
            Self::FinishedCancelled => Some(FinishReason::Cancelled),
            Self::FinishedError => Some(FinishReason::Error),
        }
    }
}

/// Why a request ended, as wire formats report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// The token budget or the shape ran out.
    Length,
    /// The caller cancelled.
    Cancelled,
    /// The backend failed.
    Error,
}

impl FinishReason {
    /// Every reason, in status order.
    pub const ALL: [FinishReason; 4] = [Self::Stop, Self::Length, Self::Cancelled, Self::Error];

    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (including a final EOS token, which produces no text).
    pub completion_tokens: usize,
    /// Of the prompt tokens, those the prefix cache held (copied, not computed).
    pub cached_tokens: usize,
    /// Tokens speculative decoding proposed for this request (0 without speculation).
    pub drafted_tokens: usize,
    /// Of them, those verification accepted (each one a token decoded without a pass of its own).
    pub accepted_tokens: usize,
}

/// One alternative at a position, with its log-probability under the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Natural log of its probability before any sampling transform.
    pub logprob: f32,
}

/// Something that happened to a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A token was generated.
    Token {
        /// The token id.
        token: u32,
        /// Text released by this token: complete UTF-8, stop strings withheld; may be empty.
        text: String,
        /// The sampled token's log-probability, when logprobs were requested.
        logprob: Option<TokenLogprob>,
        /// The most likely alternatives, when requested.
        top_logprobs: Vec<TokenLogprob>,
    },
    /// The request ended; no event follows.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Text released at the end (held-back text that turned out not to be a stop).
        text: String,
        /// Token counts.
        usage: Usage,
        /// The backend's message when `reason` is `Error`.
        error: Option<String>,
    },
}
