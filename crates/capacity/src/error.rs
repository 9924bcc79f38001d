//! Typed errors whose `Display` is the text a user reads.

use std::fmt;

/// A request that no capacity can hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityError {
    /// The request does not fit the capacity it was given (a pin, or the shape it was routed to).
    ///
    /// Displays as `effective_prompt_len=553 + max_new_tokens=1 > context_capacity=300`. An
    /// unlimited budget is reported as `max_new_tokens=1`, the least it needs.
    ExceedsCapacity {
        effective_prompt_len: usize,
        max_new_tokens: usize,
        context_capacity: usize,
    },
    /// The request is longer than the checkpoint's window.
    ExceedsWindow {
        effective_prompt_len: usize,
        max_new_tokens: usize,
        window: usize,
    },
    /// The request fits the window but no capacity on offer (a ladder rung or a server bucket).
    ExceedsLargestCapacity {
        effective_prompt_len: usize,
        max_new_tokens: usize,
        largest_capacity: usize,
    },
    /// There is no capacity to choose from (an empty bucket set or a zero window).
    NoCapacities,
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExceedsCapacity {
                effective_prompt_len,
                max_new_tokens,
                context_capacity,
            } => write!(
                f,
                "effective_prompt_len={effective_prompt_len} + max_new_tokens={max_new_tokens} \
                 > context_capacity={context_capacity}"
            ),
            Self::ExceedsWindow {
                effective_prompt_len,
                max_new_tokens,
                window,
            } => write!(
                f,
                "effective_prompt_len={effective_prompt_len} + max_new_tokens={max_new_tokens} \
                 > checkpoint window={window}; shorten the prompt or lower the token budget (-n)"
            ),
            Self::ExceedsLargestCapacity {
                effective_prompt_len,
                max_new_tokens,
                largest_capacity,
            } => write!(
                f,
                "effective_prompt_len={effective_prompt_len} + max_new_tokens={max_new_tokens} \
                 > largest context capacity={largest_capacity}; shorten the prompt, lower the \
                 token budget (-n), or offer a larger capacity ({} or {})",
                crate::env::CONTEXT_CAPACITY_ENV,
                crate::env::CONTEXT_BUCKETS_ENV,
            ),
            Self::NoCapacities => f.write_str("no context capacity is available to choose from"),
        }
    }
}

impl std::error::Error for CapacityError {}
