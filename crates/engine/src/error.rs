//! The engine's one error type.

use mlxcel_capacity::CapacityError;

/// A backend's own error, kept whole at the seam (a message alone converts too).
pub type BackendSource = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    /// The backend failed; `source` is the backend's own error, typed (`mlxcel_core::Error`,
    /// `mlxcel_xla::Error`, ...) for callers that downcast it, and its text is part of this one's.
    #[error("{backend} backend: {source}")]
    Backend {
        backend: &'static str,
        #[source]
        source: BackendSource,
    },
    /// An option the chosen backend cannot honour.
    #[error("{what} not supported by the {backend} backend: {reason}")]
    Unsupported {
        what: String,
        backend: &'static str,
        reason: &'static str,
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
         KV budget of {budget} bytes; lower max tokens or raise the KV budget (--kv-budget MiB)"
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
    /// A token id the model does not have (a prompt given as ids, or ids to detokenize).
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfVocabulary { token: u32, vocab_size: usize },
    /// Reranking asked of a model without a classification head.
    #[error(
        "this model is not a reranker: it has no classification head (a GGUF with \
         `cls.output.weight`, such as a Qwen3-Reranker converted by llama.cpp)"
    )]
    NotAReranker,
    /// Generation asked of an encoder model (a BERT GGUF), which has no next-token logits.
    #[error(
        "the model is an encoder (BERT): it serves embeddings and reranking, not text generation"
    )]
    EncoderCannotGenerate,

    /// An empty prompt: there is no position to predict from.
    #[error("the prompt is empty: give at least one token of input")]
    EmptyPrompt,

    /// A structured-output constraint llguidance refuses (a bad schema, grammar or regex).
    #[error("invalid {kind}: {message}")]
    InvalidConstraint { kind: &'static str, message: String },

    /// An input (to embed) longer than the model's window.
    #[error("the input is {tokens} tokens, more than the model's window of {window}: shorten it")]
    InputTooLong { tokens: usize, window: usize },

    /// Speculative decoding that cannot run as asked: a bad setting, a request for the draft
    /// model when none is loaded, or a draft model whose vocabulary is not the model's.
    #[error("speculative decoding: {0}")]
    InvalidSpeculation(String),

    /// A reasoning budget that cannot work (a tag without tokens, nothing to force).
    #[error("invalid reasoning budget: {0}")]
    InvalidReasoningBudget(String),

    /// The prefix cache cannot take what was asked of it (a restored slot: the cache is off, or
    /// smaller than the entry).
    #[error("prefix cache: {0}")]
    PrefixCache(String),

    /// LoRA scales the engine's adapters cannot take (more scales than adapters, a scale that
    /// is not finite), or adapters the model cannot load.
    #[error("lora: {0}")]
    InvalidLora(String),

    /// A perplexity setting the text or the model cannot satisfy (`mlxcel perplexity`).
    #[error("perplexity: invalid {setting} {value}: {reason}")]
    InvalidPerplexity {
        setting: &'static str,
        value: usize,
        reason: String,
    },
}

impl EngineError {
    /// A failure of the backend named `backend`, keeping its error as the source.
    pub fn backend(backend: &'static str, source: impl Into<BackendSource>) -> Self {
        Self::Backend {
            backend,
            source: source.into(),
        }
    }
}
