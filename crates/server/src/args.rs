//! The one flag parser shared by `mlxcel serve` and `mlxcel-server`: llama-server's spellings and
//! their `LLAMA_ARG_*` environment twins, plus `--backend`.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use mlxcel_engine::{BackendKind, EngineOptions, MaxNewTokens, ShapeMode};

use crate::config::{ApiKeys, ServerConfig};
use crate::error::ServerError;

/// Server flags, as llama-server spells them.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Model: a checkpoint directory or a .gguf file (default: the default model, see `mlxcel pull`).
    #[arg(short = 'm', long, env = "LLAMA_ARG_MODEL")]
    pub model: Option<String>,

    /// Context size per request (prompt + generation budget); 0 uses the checkpoint window.
    /// Larger values are capped at the window.
    #[arg(
        short = 'c',
        long = "ctx-size",
        env = "LLAMA_ARG_CTX_SIZE",
        default_value_t = 0
    )]
    pub ctx_size: usize,

    /// Most requests decoding at once (the scheduler's batch); `-np` is accepted too.
    #[arg(long = "parallel", env = "LLAMA_ARG_N_PARALLEL", default_value_t = 8)]
    pub parallel: usize,

    /// Address to listen on.
    #[arg(long, env = "LLAMA_ARG_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "LLAMA_ARG_PORT", default_value_t = 8080)]
    pub port: u16,

    /// Default tokens to generate when a request gives no limit; -1 is unlimited.
    #[arg(
        short = 'n',
        long = "n-predict",
        env = "LLAMA_ARG_N_PREDICT",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,

    /// API key(s) clients must send as `Authorization: Bearer <key>` (comma-separated for several).
    #[arg(long = "api-key", env = "LLAMA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// A file of API keys, one per line.
    #[arg(long = "api-key-file", env = "LLAMA_ARG_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// Serve Prometheus metrics at /metrics.
    #[arg(
        long,
        env = "LLAMA_ARG_ENDPOINT_METRICS",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::SetTrue
    )]
    pub metrics: bool,

    /// The model name clients see and may send (default: the checkpoint directory's name).
    #[arg(short = 'a', long, env = "LLAMA_ARG_ALIAS")]
    pub alias: Option<String>,

    /// Default sampling temperature; 0 is greedy.
    #[arg(long = "temp", env = "LLAMA_ARG_TEMP", default_value_t = 0.8)]
    pub temperature: f32,

    /// Default seed; -1 draws a fresh one per request.
    #[arg(
        short = 's',
        long,
        env = "LLAMA_ARG_SEED",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub seed: i64,

    /// Threads of the MLX backend's CPU kernels (`-1`: `MLXCEL_THREADS`, else every core).
    #[arg(
        short = 't',
        long,
        env = "LLAMA_ARG_THREADS",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub threads: i64,

    /// What the MLX backend's quantized matmuls multiply the weights with: `f32` (the
    /// reference numbers) or `int8` (AVX-512 VNNI or AVX2; ~3× faster batched decode, perplexity +3.5%
    /// on the default model). Defaults to `MLXCEL_ACTIVATIONS`, else `f32`.
    #[arg(long)]
    pub activations: Option<String>,

    /// Seconds a client may take to send a request's headers.
    #[arg(long, env = "LLAMA_ARG_TIMEOUT", default_value_t = 600)]
    pub timeout: u64,

    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, env = "MLXCEL_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,

    /// Backend to run the model on.
    #[arg(long, env = "MLXCEL_BACKEND", default_value = "mlx", value_parser = ["mlx", "xla"])]
    pub backend: String,
}

/// Rewrites llama-server's two-letter short flags, which clap cannot declare, to their long
/// forms: `-np 4` → `--parallel 4`. Everything else passes through unchanged.
pub fn normalize_llama_args<I, T>(args: I) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    args.into_iter()
        .map(|arg| {
            let arg: OsString = arg.into();
            match arg.to_str() {
                Some("-np") => OsString::from("--parallel"),
                Some(s) if s.starts_with("-np=") => {
                    OsString::from(format!("--parallel={}", &s[4..]))
                }
                _ => arg,
            }
        })
        .collect()
}

impl ServerArgs {
    /// The backend named by `--backend`; the engine's own error lists what exists.
    pub fn backend_kind(&self) -> Result<BackendKind, ServerError> {
        self.backend
            .parse()
            .map_err(|err| ServerError::Backend(format!("--backend {}: {err}", self.backend)))
    }

    /// How the engine is loaded under these flags.
    pub fn engine_options(&self) -> Result<EngineOptions, ServerError> {
        let mut options = EngineOptions {
            backend: self.backend_kind()?,
            // A server compiles its static shapes once, at load (OpenXLA; no effect on MLX).
            shapes: ShapeMode::ServerBuckets,
            ..EngineOptions::default()
        };
        if self.parallel == 0 {
            return Err(ServerError::Flag("--parallel must be at least 1".into()));
        }
        options.scheduler.max_batch = self.parallel;
        options.threads = (self.threads > 0).then_some(self.threads as usize);
        options.activations = self
            .activations
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|err: String| ServerError::Flag(format!("--activations: {err}")))?;
        options.scheduler.token_budget = options.scheduler.token_budget.max(self.parallel);
        Ok(options)
    }

    /// The server's settings under these flags (reads `--api-key-file`).
    pub fn server_config(&self) -> Result<ServerConfig, ServerError> {
        let default_max_new_tokens =
            MaxNewTokens::from_signed(self.n_predict).ok_or_else(|| {
                ServerError::Flag(format!(
                    "--n-predict {}: expected -1 (unlimited) or a count",
                    self.n_predict
                ))
            })?;
        let mut keys: Vec<String> = self
            .api_key
            .iter()
            .flat_map(|k| k.split(','))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path).map_err(|err| {
                ServerError::Flag(format!("--api-key-file {}: {err}", path.display()))
            })?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned),
            );
        }
        Ok(ServerConfig {
            addr: SocketAddr::new(self.host, self.port),
            model_arg: self.model.clone(),
            alias: self.alias.clone(),
            ctx_size: (self.ctx_size > 0).then_some(self.ctx_size),
            parallel: self.parallel,
            default_max_new_tokens,
            default_temperature: self.temperature,
            default_seed: u64::try_from(self.seed).ok(),
            threads: (self.threads > 0).then_some(self.threads as usize),
            api_keys: ApiKeys::new(keys),
            metrics: self.metrics,
            header_timeout: Duration::from_secs(self.timeout.max(1)),
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout),
            ..ServerConfig::default()
        })
    }
}
