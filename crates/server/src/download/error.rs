//! Why a download could not be done, saying what to change.

use std::path::{Path, PathBuf};

/// A download that could not be done, saying what to change.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("`{reference}` is not a valid reference: expected {expected}")]
    BadReference {
        reference: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Conflict(String),
    #[error("{flag}: {source}")]
    Flag {
        flag: &'static str,
        source: Box<DownloadError>,
    },
    #[error(
        "no cache directory: set LLAMA_CACHE, HF_HOME, XDG_CACHE_HOME or HOME to say where downloads go"
    )]
    NoCacheDir,
    #[error("{what} is not in the cache ({}); run once without --offline to fetch it", path.display())]
    NotCached { what: String, path: PathBuf },
    #[error("repository {repo}: {detail}")]
    NothingFound { repo: String, detail: String },
    #[error("{url}: HTTP {status} ({detail})")]
    Status {
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{url}: {detail}")]
    Protocol { url: String, detail: String },
    #[error(
        "{url}: the file's SHA-256 is {actual}, not the {expected} its source names; it was removed, try again"
    )]
    Checksum {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{url}: {detail}")]
    Network { url: String, detail: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: a GGUF split in {count} parts; mlxcel loads one-file GGUFs: merge the parts with llama.cpp's `llama-gguf-split --merge {path} merged.gguf` and pass -m merged.gguf"
    )]
    Split { path: String, count: u32 },
}

impl DownloadError {
    /// This error, said of `flag`.
    pub(super) fn of(self, flag: &'static str) -> Self {
        Self::Flag {
            flag,
            source: Box::new(self),
        }
    }

    pub(super) fn bad_reference(reference: &str) -> Self {
        Self::BadReference {
            reference: reference.to_owned(),
            expected: "<user>/<model>[:quant], e.g. ggml-org/gemma-3-1b-it-GGUF:Q4_K_M",
        }
    }

    pub(super) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_owned(),
            source,
        }
    }
}
