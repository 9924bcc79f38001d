//! What the router knows of one model before it loads: a leaf, so that the registry (which
//! the server state names) does not reach the flag parser through the catalog.

use std::path::PathBuf;

/// Where a model was found (`/models`' `source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    ModelsDir,
    Preset,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ModelsDir => "models_dir",
            Self::Preset => "preset",
        }
    }
}

/// One model the router can load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// Its id (`/models`' `id`, what a request's `model` names).
    pub name: String,
    /// Other names it answers to (the preset's `alias`).
    pub aliases: Vec<String>,
    /// The checkpoint: a GGUF file or a checkpoint directory.
    pub path: PathBuf,
    /// Options over the server's own, as command-line tokens (`--ctx-size=4096`).
    pub args: Vec<String>,
    pub source: Source,
    /// The preset section as INI text (`/models`' `status.preset`), for preset models.
    pub preset: Option<String>,
}
