//! The scheduler's limits.

use crate::error::EngineError;

/// Scheduler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most sequences running at once (holding a slot).
    pub max_batch: usize,
    /// Most prompt tokens one sequence prefills in one step.
    pub prefill_chunk: usize,
    /// Most tokens (decode and prefill together) in one step; at least `max_batch`.
    pub token_budget: usize,
    /// Most requests waiting for a slot; more are refused with [`EngineError::QueueFull`].
    pub max_waiting: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batch: 8,
            prefill_chunk: 512,
            token_budget: 512,
            max_waiting: 64,
        }
    }
}

impl SchedulerConfig {
    /// Checks that the limits can make progress.
    pub fn validate(&self) -> Result<(), EngineError> {
        let check = |field, value: usize, ok: bool, expected| {
            if ok {
                Ok(())
            } else {
                Err(EngineError::InvalidConfig {
                    field,
                    value,
                    expected,
                })
            }
        };
        check(
            "max_batch",
            self.max_batch,
            self.max_batch >= 1,
            "at least 1",
        )?;
        check(
            "prefill_chunk",
            self.prefill_chunk,
            self.prefill_chunk >= 1,
            "at least 1",
        )?;
        check(
            "token_budget",
            self.token_budget,
            self.token_budget >= self.max_batch,
            "at least max_batch, so every running sequence decodes each step",
        )?;
        // A request waits for its first step even when a slot is free.
        check(
            "max_waiting",
            self.max_waiting,
            self.max_waiting >= 1,
            "at least 1",
        )
    }
}
