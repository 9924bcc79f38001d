//! The crate's errors.

use std::path::PathBuf;

/// An op refused at emission time because its operands' shapes or types do not fit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EmitError {
    #[error("stablehlo.{op}: ill-shaped operands: {detail}")]
    Shape { op: &'static str, detail: String },
}

/// Everything mlxcel-xla can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Emit(#[from] EmitError),

    #[error("checkpoint tensor {name}: {reason}")]
    Tensor { name: String, reason: String },

    #[error("unsupported model: {0}")]
    Unsupported(String),

    #[error(
        "iree-compile is not provisioned at {path}: run scripts/provision-iree (or set MLXCEL_IREE_COMPILE)"
    )]
    CompilerMissing { path: PathBuf },

    #[error("iree-compile failed (exit {status}) on the program saved at {program}:\n{message}")]
    CompileFailed {
        status: String,
        program: PathBuf,
        message: String,
    },

    #[error("{context}: {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("IREE runtime: {0}")]
    Runtime(String),

    #[error(
        "mlxcel-xla was built without the `runtime` feature (the IREE runtime); rebuild with `--features mlxcel-xla/runtime`"
    )]
    RuntimeNotCompiled,

    #[error("{variable}={value:?}: expected {expected}")]
    Config {
        variable: &'static str,
        value: String,
        expected: &'static str,
    },

    #[error("{what} out of range: {value} not in {range}")]
    OutOfRange {
        what: &'static str,
        value: i64,
        range: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
