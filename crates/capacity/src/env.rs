//! The two environment variables that override capacity choices, parsed as pure functions.

use crate::ladder::MAX_CONTEXT_CAPACITY;
use std::fmt;

/// Pins one context capacity for every request (an integer in `1..=2147483647`).
pub const CONTEXT_CAPACITY_ENV: &str = "MLXCEL_XLA_CONTEXT_CAPACITY";

/// The server's bucket list: comma-separated capacities, sorted and de-duplicated on reading.
pub const CONTEXT_BUCKETS_ENV: &str = "MLXCEL_XLA_CONTEXT_BUCKETS";

/// What the environment says about capacities. `Default` is "nothing set".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityOverrides {
    /// From [`CONTEXT_CAPACITY_ENV`].
    pub pinned_capacity: Option<usize>,
    /// From [`CONTEXT_BUCKETS_ENV`]: ascending, no duplicates, never empty.
    pub buckets: Option<Vec<usize>>,
}

impl CapacityOverrides {
    /// Reads both variables from the process environment.
    ///
    /// A value that is not valid Unicode is reported like any other unparsable value.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(|name| {
            std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
        })
    }

    /// Reads both variables through `lookup`, which returns a variable's value if it is set.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        Ok(Self {
            pinned_capacity: lookup(CONTEXT_CAPACITY_ENV)
                .map(|raw| parse_context_capacity(&raw))
                .transpose()?,
            buckets: lookup(CONTEXT_BUCKETS_ENV)
                .map(|raw| parse_context_buckets(&raw))
                .transpose()?,
        })
    }
}

/// Parses a value of [`CONTEXT_CAPACITY_ENV`]. Surrounding whitespace is ignored.
pub fn parse_context_capacity(raw: &str) -> Result<usize, EnvError> {
    parse_capacity(raw.trim()).map_err(|reason| EnvError {
        variable: CONTEXT_CAPACITY_ENV,
        raw: raw.to_owned(),
        reason,
    })
}

/// Parses a value of [`CONTEXT_BUCKETS_ENV`] into an ascending list without duplicates.
pub fn parse_context_buckets(raw: &str) -> Result<Vec<usize>, EnvError> {
    let error = |reason: String| EnvError {
        variable: CONTEXT_BUCKETS_ENV,
        raw: raw.to_owned(),
        reason,
    };
    if raw.trim().is_empty() {
        return Err(error(
            "the bucket list is empty; give comma-separated capacities such as 256,4096, or unset it"
                .to_owned(),
        ));
    }
    let mut buckets = raw
        .split(',')
        .enumerate()
        .map(|(index, item)| {
            parse_capacity(item.trim())
                .map_err(|reason| error(format!("bucket {} ({:?}): {reason}", index + 1, item)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    buckets.sort_unstable();
    buckets.dedup();
    Ok(buckets)
}

fn parse_capacity(value: &str) -> Result<usize, String> {
    let expected = format!("expected an integer in 1..={MAX_CONTEXT_CAPACITY}");
    if value.is_empty() {
        return Err(format!("the value is empty; {expected}"));
    }
    // Parse wide first so that negative and too-large numbers get their own message.
    match value.parse::<i128>() {
        Ok(n) if n < 1 => Err(format!("{n} is not a positive capacity; {expected}")),
        Ok(n) if n > MAX_CONTEXT_CAPACITY as i128 => Err(format!(
            "{n} exceeds the largest capacity IREE can index (i32); {expected}"
        )),
        Ok(n) => Ok(n as usize),
        Err(_) => Err(format!("not an integer; {expected}")),
    }
}

/// An environment variable whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    /// The variable's name, e.g. `MLXCEL_XLA_CONTEXT_CAPACITY`.
    pub variable: &'static str,
    /// The value exactly as it was set.
    pub raw: String,
    /// What is wrong with it, and what would be accepted.
    pub reason: String,
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.variable, self.raw, self.reason)
    }
}

impl std::error::Error for EnvError {}
