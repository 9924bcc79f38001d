//! Sizing one request: the command-line resolver and the admission check.

use crate::error::CapacityError;
use crate::ladder::{DEFAULT_XLA_GENERATION_BUDGET, LADDER};

/// How many tokens a request may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaxNewTokens {
    /// No limit was given (`-n -1`): generate until the shape is full or the model stops.
    Unlimited,
    /// An explicit budget, honoured exactly or refused, never silently shortened.
    Limited(usize),
}

impl MaxNewTokens {
    /// Reads llama.cpp's signed convention: `-1` is unlimited, `0..` is a limit.
    ///
    /// Returns `None` for values below `-1`, which have no meaning here.
    pub fn from_signed(n: i64) -> Option<Self> {
        match n {
            -1 => Some(Self::Unlimited),
            n if n >= 0 => usize::try_from(n).ok().map(Self::Limited),
            _ => None,
        }
    }

    /// The fewest tokens this budget asks room for: an unlimited budget needs at least one.
    fn least_needed(self) -> usize {
        match self {
            Self::Unlimited => 1,
            Self::Limited(n) => n,
        }
    }
}

/// The shape-relevant facts of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Prompt tokens after templating.
    pub prompt_len: usize,
    /// Worst-case expansion of the request's images into tokens (0 for text).
    pub image_tokens: usize,
    /// The generation budget.
    pub max_new_tokens: MaxNewTokens,
}

impl Request {
    /// A text-only request.
    pub fn text(prompt_len: usize, max_new_tokens: MaxNewTokens) -> Self {
        Self {
            prompt_len,
            image_tokens: 0,
            max_new_tokens,
        }
    }

    /// Prompt plus worst-case image expansion: what the shape must hold before generating.
    pub fn effective_prompt_len(&self) -> usize {
        self.prompt_len.saturating_add(self.image_tokens)
    }
}

/// The shape a request runs in, and how many tokens it may generate there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    /// The static sequence capacity to run at.
    pub context_capacity: usize,
    /// Prompt plus worst-case image expansion.
    pub effective_prompt_len: usize,
    /// The budget the request runs with: an explicit budget unchanged, an unlimited one clamped to
    /// the room the shape leaves.
    pub admitted_max_new_tokens: usize,
    /// Whether the capacity came from `MLXCEL_XLA_CONTEXT_CAPACITY` rather than the ladder.
    pub pinned: bool,
}

impl Resolution {
    /// The line the CLI prints about its choice, e.g.
    /// `context capacity 1024 for 6 prompt + up to 1018`; `None` when the capacity was pinned.
    pub fn sizing_line(&self) -> Option<String> {
        (!self.pinned).then(|| {
            format!(
                "context capacity {} for {} prompt + up to {}",
                self.context_capacity, self.effective_prompt_len, self.admitted_max_new_tokens
            )
        })
    }
}

/// Checks that a request fits a given capacity and returns its admitted budget.
///
/// An explicit budget is honoured or refused; an unlimited one is clamped to
/// `context_capacity - effective_prompt_len` and refused only when not even one token fits.
pub fn admit(
    effective_prompt_len: usize,
    max_new_tokens: MaxNewTokens,
    context_capacity: usize,
) -> Result<usize, CapacityError> {
    let needed = effective_prompt_len.saturating_add(max_new_tokens.least_needed());
    if needed > context_capacity {
        return Err(CapacityError::ExceedsCapacity {
            effective_prompt_len,
            max_new_tokens: max_new_tokens.least_needed(),
            context_capacity,
        });
    }
    Ok(match max_new_tokens {
        MaxNewTokens::Unlimited => context_capacity - effective_prompt_len,
        MaxNewTokens::Limited(n) => n,
    })
}

/// [`admit`] for a dynamic shape bounded only by the checkpoint window: a refusal names the window
/// (`... > checkpoint window=8192; ...`) rather than a capacity the user never chose.
pub fn admit_in_window(
    effective_prompt_len: usize,
    max_new_tokens: MaxNewTokens,
    window: usize,
) -> Result<usize, CapacityError> {
    admit(effective_prompt_len, max_new_tokens, window).map_err(|err| match err {
        CapacityError::ExceedsCapacity {
            effective_prompt_len,
            max_new_tokens,
            ..
        } => CapacityError::ExceedsWindow {
            effective_prompt_len,
            max_new_tokens,
            window,
        },
        other => other,
    })
}

/// Sizes one command-line request.
///
/// A `pinned` capacity (from `MLXCEL_XLA_CONTEXT_CAPACITY`) is used as it is, subject only to the
/// admission check. Otherwise the request gets the smallest [`LADDER`] rung that holds its
/// effective prompt plus its sizing budget (`-n` when given, else
/// `min(DEFAULT_XLA_GENERATION_BUDGET, window - effective_prompt)`), bounded by the window.
pub fn resolve_context_capacity(
    request: &Request,
    window: usize,
    pinned: Option<usize>,
) -> Result<Resolution, CapacityError> {
    let effective_prompt_len = request.effective_prompt_len();
    let (context_capacity, admitted_max_new_tokens) = match pinned {
        Some(capacity) => (
            capacity,
            admit(effective_prompt_len, request.max_new_tokens, capacity)?,
        ),
        None => choose_capacity(
            &LADDER,
            window,
            effective_prompt_len,
            request.max_new_tokens,
        )?,
    };
    Ok(Resolution {
        context_capacity,
        effective_prompt_len,
        admitted_max_new_tokens,
        pinned: pinned.is_some(),
    })
}

/// Picks the smallest of `capacities` (ascending, each bounded by `window`) that holds the request,
/// returning it and the admitted budget. Shared by the ladder and the server's buckets so that the
/// CLI and the server size requests identically.
///
/// An unlimited request whose sizing budget no capacity holds falls back to the largest capacity
/// that still leaves it room for a token: its sizing budget only chooses a shape, it is not a
/// promise.
pub(crate) fn choose_capacity(
    capacities: &[usize],
    window: usize,
    effective_prompt_len: usize,
    max_new_tokens: MaxNewTokens,
) -> Result<(usize, usize), CapacityError> {
    let bounded = capacities.iter().map(|&c| c.min(window)).filter(|&c| c > 0);
    let Some(largest) = bounded.clone().max() else {
        return Err(CapacityError::NoCapacities);
    };
    let least_needed = max_new_tokens.least_needed();
    if effective_prompt_len.saturating_add(least_needed) > window {
        return Err(CapacityError::ExceedsWindow {
            effective_prompt_len,
            max_new_tokens: least_needed,
            window,
        });
    }
    let sizing_budget = match max_new_tokens {
        MaxNewTokens::Limited(n) => n,
        MaxNewTokens::Unlimited => DEFAULT_XLA_GENERATION_BUDGET.min(window - effective_prompt_len),
    };
    let required = effective_prompt_len.saturating_add(sizing_budget);
    let chosen = match bounded.clone().filter(|&c| c >= required).min() {
        Some(capacity) => capacity,
        None if max_new_tokens == MaxNewTokens::Unlimited && largest > effective_prompt_len => {
            largest
        }
        None => {
            return Err(CapacityError::ExceedsLargestCapacity {
                effective_prompt_len,
                max_new_tokens: sizing_budget.max(least_needed),
                largest_capacity: largest,
            });
        }
    };
    let admitted = admit(effective_prompt_len, max_new_tokens, chosen)?;
    Ok((chosen, admitted))
}
