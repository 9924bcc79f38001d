//! The engine's one error type.

use mlxcel_capacity::CapacityError;

/// Everything the engine can refuse or fail at.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A sampling parameter outside its range.
    #[error("invalid {field}={value}: expected {expected}")]
    InvalidSampling {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    /// The request does not fit the shape or window it would run in.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// The backend failed (the message is the backend's own).
    #[error("{backend} backend: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },
    /// The waiting queue is full; try again later.
    #[error("the request queue is full ({capacity} waiting); retry shortly")]
    QueueFull { capacity: usize },
    /// The backend has no free slot (KV memory) right now; the request stays queued.
    #[error("no free slot")]
    NoFreeSlot,
    /// A scheduler setting that cannot work.
    #[error("invalid scheduler setting {field}={value}: {expected}")]
    InvalidConfig {
        field: &'static str,
        value: usize,
        expected: &'static str,
    },
    /// An empty prompt: there is no position to predict from.
    #[error("the prompt is empty: give at least one token of input")]
    EmptyPrompt,
}
