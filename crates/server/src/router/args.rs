//! The router's flags (llama-server's spellings and `LLAMA_ARG_*` twins), flattened into
//! `ServerArgs`: where the models come from, how many may be loaded at once, and whether a
//! request may load the model it names.

use std::path::PathBuf;

/// Many models behind one server: set by `--models-dir` or `--models-preset`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RouterArgs {
    /// Serves every checkpoint in DIR (GGUF files, and MLX or Hugging Face checkpoint
    /// directories), each under its name (a GGUF's file name without `.gguf`, a directory's
    /// name); the request's `model` field picks one.
    #[arg(long = "models-dir", env = "LLAMA_ARG_MODELS_DIR", value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// llama-server's preset INI: one `[name]` section per model with its options
    /// (`model = PATH`, `ctx-size = 4096` ...), `[*]` for options every model takes.
    #[arg(
        long = "models-preset",
        env = "LLAMA_ARG_MODELS_PRESET",
        value_name = "FILE"
    )]
    pub models_preset: Option<PathBuf>,
    /// At most N models loaded at once (0: no limit); the least recently used idle one is
    /// unloaded when another must load.
    #[arg(
        long = "models-max",
        env = "LLAMA_ARG_MODELS_MAX",
        value_name = "N",
        default_value_t = 4
    )]
    pub models_max: usize,
    /// A request naming a model that is not loaded loads it (the default).
    #[arg(
        long = "models-autoload",
        env = "LLAMA_ARG_MODELS_AUTOLOAD",
        value_parser = truthy,
        num_args = 0..=1,
        default_value = "true",
        default_missing_value = "true",
        overrides_with = "no_models_autoload"
    )]
    pub models_autoload: bool,
    /// A request naming a model that is not loaded is refused until `POST /models/load`.
    #[arg(long = "no-models-autoload", overrides_with = "models_autoload")]
    pub no_models_autoload: bool,
}

impl RouterArgs {
    /// Whether the server runs as a router (several models) rather than over one `-m` model.
    pub fn enabled(&self) -> bool {
        self.models_dir.is_some() || self.models_preset.is_some()
    }

    /// Whether requests load the models they name.
    pub fn autoload(&self) -> bool {
        self.models_autoload && !self.no_models_autoload
    }
}

/// A boolean as llama-server's environment spells it (`1`/`0`, `true`/`false`, `on`/`off`,
/// `enabled`/`disabled`).
fn truthy(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "enabled" | "yes" => Ok(true),
        "0" | "false" | "off" | "disabled" | "no" => Ok(false),
        other => Err(format!("`{other}`: expected true or false (1/0, on/off)")),
    }
}
