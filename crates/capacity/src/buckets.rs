//! Server buckets: which capacities a server compiles, and where each request goes.

use crate::env::CapacityOverrides;
use crate::error::CapacityError;
use crate::ladder::{LARGEST_DERIVED_BUCKET, SMALLEST_BUCKET};
use crate::resolve::{MaxNewTokens, choose_capacity};

/// The bucket set a server derives from its checkpoint: `[256, min(4096, window)]`, plus the image
/// floor when it is larger, each bounded by the window, ascending and without duplicates.
///
/// The small bucket keeps short requests cheap; the large one admits ordinary prompts.
pub fn derive_server_buckets(window: usize, image_floor: Option<usize>) -> Vec<usize> {
    let mut buckets = vec![SMALLEST_BUCKET, LARGEST_DERIVED_BUCKET.min(window)];
    if let Some(floor) = image_floor.filter(|&f| f > LARGEST_DERIVED_BUCKET.min(window)) {
        buckets.push(floor);
    }
    normalise(buckets, window)
}

/// The bucket set a server compiles, after the environment has had its say.
///
/// `MLXCEL_XLA_CONTEXT_BUCKETS` wins over everything; otherwise a pinned
/// `MLXCEL_XLA_CONTEXT_CAPACITY` gives exactly one bucket; otherwise the set is derived from the
/// window. No bucket exceeds the window: positions past it were never trained.
pub fn server_buckets(
    window: usize,
    image_floor: Option<usize>,
    overrides: &CapacityOverrides,
) -> Vec<usize> {
    match (&overrides.buckets, overrides.pinned_capacity) {
        (Some(buckets), _) => normalise(buckets.clone(), window),
        (None, Some(pinned)) => normalise(vec![pinned], window),
        (None, None) => derive_server_buckets(window, image_floor),
    }
}

fn normalise(mut buckets: Vec<usize>, window: usize) -> Vec<usize> {
    for bucket in &mut buckets {
        *bucket = (*bucket).min(window);
    }
    buckets.retain(|&b| b > 0);
    buckets.sort_unstable();
    buckets.dedup();
    buckets
}

/// Where a request runs on a server, and with what budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The bucket's context capacity.
    pub bucket: usize,
    /// The request's budget in that bucket (an unlimited budget clamped to the bucket's room).
    pub admitted_max_new_tokens: usize,
}

/// Routes a request to the smallest bucket that holds its effective prompt plus its whole budget,
/// so that a sequence never outgrows its bucket. Unlimited budgets are sized and clamped as on the
/// command line.
pub fn route(
    buckets: &[usize],
    window: usize,
    effective_prompt_len: usize,
    max_new_tokens: MaxNewTokens,
) -> Result<Route, CapacityError> {
    let (bucket, admitted_max_new_tokens) =
        choose_capacity(buckets, window, effective_prompt_len, max_new_tokens)?;
    Ok(Route {
        bucket,
        admitted_max_new_tokens,
    })
}
