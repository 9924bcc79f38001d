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
    /// A request whose worst-case KV memory exceeds the whole budget.
    #[error(
        "the request needs up to {positions} positions ({bytes} bytes of KV memory), more than the \
         KV budget of {budget} bytes; lower max tokens or raise the KV budget"
    )]
    KvBudget {
        positions: usize,
        bytes: usize,
        budget: usize,
    },
    /// A backend this build of the engine does not contain.
    #[error(
        "the {backend} backend is not compiled into this build: rebuild with the cargo feature \
         `{feature}` of mlxcel-engine (on by default)"
    )]
    BackendNotCompiled {
        backend: &'static str,
        feature: &'static str,
    },
    /// A backend name that does not exist.
    #[error("unknown backend {name:?}; choose one of: {choices}")]
    UnknownBackend { name: String, choices: String },
    /// The checkpoint could not be found, read or tokenized.
    #[error(transparent)]
    Model(#[from] mlxcel_model::ModelError),
    /// Chat was asked of a checkpoint without a chat template.
    #[error(
        "the model has no chat template; pass a plain prompt (--no-chat-template) or use a \
         checkpoint whose tokenizer_config.json has one"
    )]
    NoChatTemplate,
    /// The engine thread has stopped.
    #[error("the engine has stopped")]
    Stopped,
    /// An empty prompt: there is no position to predict from.
    #[error("the prompt is empty: give at least one token of input")]
    EmptyPrompt,
}
