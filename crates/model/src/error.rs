//! The crate's one error type. Every variant that comes from a file names that file, and the field
//! or tensor at fault, so a user can fix the checkpoint without reading our code.

use std::path::PathBuf;

/// `Result` with [`ModelError`].
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading, converting or provisioning a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    // Files.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    // config.json and friends.
    #[error("{path}: missing field `{field}`")]
    MissingField { path: PathBuf, field: String },
    #[error("{path}: field `{field}`: {reason}")]
    InvalidField {
        path: PathBuf,
        field: String,
        reason: String,
    },
    #[error("{path}: unsupported architecture `{architecture}` (supported: {supported})")]
    UnsupportedArchitecture {
        path: PathBuf,
        architecture: String,
        supported: String,
    },

    // Tensors.
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    #[error("{path}: tensor `{tensor}` has unsupported dtype {dtype} (expected {expected})")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
        expected: &'static str,
    },
    #[error("{path}: module `{module}`: inconsistent quantization: {reason}")]
    InconsistentQuantization {
        path: PathBuf,
        module: String,
        reason: String,
    },
    #[error("{path}: not a valid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },

    // GGUF.
    #[error("{path}: invalid GGUF at byte {offset}: {reason}")]
    Gguf {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error(
        "{path}: tensor `{tensor}` has GGML type {ggml_type}, which mlxcel cannot import \
         (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, \
         MXFP4); re-quantize the model to one of those"
    )]
    UnsupportedGgmlType {
        path: PathBuf,
        tensor: String,
        ggml_type: String,
    },
    #[error(
        "{dir} reads its weights from {gguf}, which has changed since ({reason}); run again with \
         `-m` naming the GGUF file to prepare it anew"
    )]
    GgufChanged {
        dir: PathBuf,
        gguf: PathBuf,
        reason: String,
    },
    #[error("{path}: tensor `{tensor}`: {reason}")]
    GgufTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{path}: GGUF metadata `{key}`: {reason}")]
    GgufMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },

    // Tokenizer and chat.
    #[error("{path}: tokenizer: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("tokenizer: {operation}: {reason}")]
    Tokenize {
        operation: &'static str,
        reason: String,
    },
    #[error(
        "{dir}: the checkpoint has no chat template (tokenizer_config.json `chat_template` or \
         chat_template.jinja); pass --no-chat-template to send the prompt as is"
    )]
    NoChatTemplate { dir: PathBuf },
    #[error("chat template: {reason}")]
    ChatTemplate { reason: String },

    // Provisioning.
    #[error("{path}: sha256 {actual}, expected {expected}")]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{what}: {reason}")]
    Provision { what: String, reason: String },
    #[error(
        "{path}: not a model ({found}): expected a checkpoint directory (with config.json) or a \
         GGUF file"
    )]
    NotAModel { path: PathBuf, found: String },

    // Adapters.
    #[error("{path}: LoRA adapter: {reason}")]
    Adapter { path: PathBuf, reason: String },
    #[error("{path}: control vector: {reason}")]
    ControlVector { path: PathBuf, reason: String },
    /// A command-line override of the model (`--rope-freq-base`, `--override-kv` ...) that
    /// cannot apply, naming the flag.
    #[error("{flag}: {reason}")]
    Override { flag: String, reason: String },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn invalid(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::InvalidField {
            path: path.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}
