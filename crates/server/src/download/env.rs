//! The environment variables the downloads read, and where files go.

use std::path::PathBuf;

use super::error::DownloadError;

/// The environment variables the downloads read (the process's, or a test's).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pairs: Vec<(String, String)>,
}

impl Env {
    /// The process's environment (empty values count as unset).
    pub fn process() -> Self {
        Self {
            pairs: std::env::vars().filter(|(_, v)| !v.is_empty()).collect(),
        }
    }

    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        Self {
            pairs: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    pub(super) fn get(&self, name: &str) -> Option<String> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Where `-mu` and `-dr` files go: `LLAMA_CACHE`, else `XDG_CACHE_HOME/llama.cpp`, else
/// `HOME/.cache/llama.cpp` (llama.cpp's own cache).
pub(super) fn url_cache_dir(env: &Env) -> Result<PathBuf, DownloadError> {
    if let Some(dir) = env.get("LLAMA_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = env.get("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("llama.cpp"));
    }
    env.get("HOME")
        .map(|home| PathBuf::from(home).join(".cache/llama.cpp"))
        .ok_or(DownloadError::NoCacheDir)
}
