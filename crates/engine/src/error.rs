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
    /// An empty prompt: there is no position to predict from.
    #[error("the prompt is empty: give at least one token of input")]
    EmptyPrompt,
}
