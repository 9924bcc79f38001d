//! The crate's error type.

/// Errors from mlxcel-core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
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
