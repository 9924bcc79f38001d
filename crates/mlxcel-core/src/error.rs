//! The crate's error type.

/// Errors from mlxcel-core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// LoRA adapters that do not fit the model or the step (`reason` says which and why).
    #[error("LoRA adapters: {reason}")]
    Adapter {
        /// What is wrong, naming the adapter or the step.
        reason: String,
    },
    /// A control vector that does not fit the model (`reason` says how).
    #[error("control vector: {reason}")]
    ControlVector {
        /// What does not fit.
        reason: String,
    },
    /// MLX rejected an operation (shape mismatch, bad axis, unsupported dtype, ...).
    /// `message` is MLX's own exception text.
    #[error("MLX {op} failed: {message}")]
    Mlx {
        /// The mlxcel-core operation that called into MLX, e.g. `matmul`.
        op: &'static str,
        /// The `what()` of the C++ exception MLX threw.
        message: String,
    },
    /// Host data does not match the shape it was given.
    #[error("{op}: {len} elements given for shape {shape:?} ({expected} expected)")]
    DataLength {
        /// The constructor that was called.
        op: &'static str,
        /// The number of elements (or bytes, for byte constructors) given.
        len: usize,
        /// The requested shape.
        shape: Vec<i32>,
        /// The number the shape requires.
        expected: usize,
    },
    /// MLX produced a dtype this crate does not model (e.g. complex64).
    #[error("MLX returned an array of an unsupported dtype (code {code})")]
    UnsupportedDtype {
        /// The raw dtype code from the shim.
        code: u8,
    },
    /// A tensor the forward pass needs is not in the checkpoint.
    #[error("checkpoint has no tensor {name}")]
    MissingTensor {
        /// The tensor's name, e.g. `model.layers.0.self_attn.q_proj.weight`.
        name: String,
    },
    /// A checkpoint tensor has a dtype the forward pass cannot use.
    #[error("tensor {name} has dtype {dtype}; expected f32, f16, bf16 or packed u32")]
    UnsupportedTensor {
        /// The tensor's name.
        name: String,
        /// Its dtype as the file names it.
        dtype: String,
    },
    /// A sequence in a step had no new tokens.
    #[error("a sequence in the step has no new tokens")]
    EmptyStep,
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// A sequence would grow past the positions its cache may hold.
    #[error("KV cache full: {len} positions + {extra} new > {max_positions}")]
    CacheFull {
        /// Positions already held.
        len: usize,
        /// Positions asked for.
        extra: usize,
        /// The cache's limit.
        max_positions: usize,
    },
    /// A prefix copied between caches whose keys or values have different element types.
    #[error(
        "cannot copy a KV prefix from a {from_k}/{from_v} cache into a {to_k}/{to_v} one \
         (keys/values); both must hold the same types"
    )]
    KvTypeMismatch {
        /// The source's key type.
        from_k: &'static str,
        /// The source's value type.
        from_v: &'static str,
        /// The target's key type.
        to_k: &'static str,
        /// The target's value type.
        to_v: &'static str,
    },
    /// A KV cache type this model or path cannot store (q8_0 where the fused decoder layer does
    /// not run, or rows that are not whole q8_0 blocks).
    #[error("KV cache type {kind}: {reason}")]
    KvTypeUnsupported {
        /// The type, as llama.cpp spells it.
        kind: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// A sequence's linear-attention (recurrent) state cannot do what was asked: it holds the
    /// state after exactly the positions it consumed, so it cannot be rewound, cut to a shorter
    /// prefix, or saved and restored as keys and values.
    #[error("the linear-attention state of a hybrid model ({operation}): {reason}")]
    RecurrentState {
        /// What was asked of it.
        operation: &'static str,
        /// Why it cannot, and what to do instead.
        reason: String,
    },
    /// An environment variable (or the option that overrides it) has a value this crate cannot use.
    #[error("{variable}={value:?} is invalid: expected {expected}")]
    InvalidEnv {
        /// The variable, e.g. `MLXCEL_KERNELS`, or the option that set the value (`--activations`).
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it may be.
        expected: &'static str,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn mlx(op: &'static str) -> impl FnOnce(cxx::Exception) -> Error {
        move |e| Error::Mlx {
            op,
            message: e.what().to_string(),
        }
    }
}
