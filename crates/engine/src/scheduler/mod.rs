//! Continuous batching: one step decodes a token for every running sequence and spends the rest
//! of a token budget on chunked prefill, admitting waiting requests first come, first served.
//!
//! One file per concern; each uses only files listed above it:
//!
//! - [`config`]: the limits a scheduler runs under ([`SchedulerConfig`]).
//! - [`indent`]: llama-server's `n_indent`, a line indented too little ending the output.
//! - [`sequence`]: one request's state from submission to its end.
//! - [`prefix_cache`]: finished sequences' slots kept for later requests that start with the
//!   same tokens, and prefixes shared between sequences running together; its own type with
//!   its own counters ([`PrefixCacheStats`]).
//! - [`stats`]: what a caller reads after a step: the counters ([`SchedulerStats`], the one set
//!   the engine's metrics report), bucket occupancy, prompt progress.
//! - [`emission`]: a sampled token recorded for its sequence (stop strings, end conditions) and
//!   the events a step reports.
//! - [`constraints`]: structured output's token masks, applied after the forward pass.
//! - [`speculation`]: speculative decoding's drive: proposals (prompt lookup, the hashed
//!   proposers, the draft model, alone or chained in llama.cpp's order) and their verification.
//! - [`batcher`]: the [`Scheduler`] itself: admission and the step, the one place scheduler and
//!   backend meet.

mod batcher;
mod config;
mod constraints;
mod emission;
mod indent;
mod prefix_cache;
mod sequence;
mod speculation;
mod stats;

pub(crate) use batcher::Carried;
pub use batcher::Scheduler;
pub use config::SchedulerConfig;
pub(crate) use constraints::ConstraintSource;
pub use prefix_cache::{CachedPrefix, PrefixCacheStats};
pub use stats::{BucketOccupancy, RequestProgress, SchedulerStats};
