//! The one flag parser shared by `mlxcel serve` and `mlxcel-server`: llama-server's spellings and
//! their `LLAMA_ARG_*` environment twins, plus `--backend`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use mlxcel_engine::{
    BackendKind, EngineOptions, KvType, MaxNewTokens, SamplingOverrides, SamplingParams, ShapeMode,
    SpeculativeConfig,
};

use crate::config::{ApiKeys, ServerConfig};
use crate::error::ServerError;
use crate::llama_flags::{IgnoredOptions, MULTI_LETTER_SHORTS, llama_bool};

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

    /// Most requests decoding at once (the scheduler's batch); `-np` is accepted too; -1 (auto)
    /// is the default, 8.
    #[arg(
        long = "parallel",
        env = "LLAMA_ARG_N_PARALLEL",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub parallel: i64,

    /// Every request may use all of `--ctx-size` (`-kvu`), as llama-server's unified KV buffer
    /// lets a slot. Without it, an explicit `--parallel N` divides `--ctx-size` among the N
    /// slots, as llama-server sizes a slot; with `--parallel` auto it is on, as there.
    #[arg(
        long = "kv-unified",
        env = "LLAMA_ARG_KV_UNIFIED",
        overrides_with = "no_kv_unified"
    )]
    pub kv_unified: bool,

    /// Turns `--kv-unified` off (`-no-kvu`).
    #[arg(long = "no-kv-unified", overrides_with = "kv_unified")]
    pub no_kv_unified: bool,

    /// Address or host name to listen on; a comma-separated list listens on each
    /// (`127.0.0.1,::1`).
    #[arg(long, env = "LLAMA_ARG_HOST", default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "LLAMA_ARG_PORT", default_value_t = 8080)]
    pub port: u16,

    /// Default tokens to generate when a request gives no limit; -1 is unlimited.
    #[arg(
        short = 'n',
        long = "n-predict",
        visible_alias = "predict",
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
        value_parser = llama_bool,
        action = clap::ArgAction::SetTrue
    )]
    pub metrics: bool,

    /// Serve POST /props (llama-server changes no property through it either).
    #[arg(
        long,
        env = "LLAMA_ARG_ENDPOINT_PROPS",
        value_parser = llama_bool,
        action = clap::ArgAction::SetTrue
    )]
    pub props: bool,

    /// Serve /slots (on by default; `--no-slots` turns it off).
    #[arg(
        long,
        env = "LLAMA_ARG_ENDPOINT_SLOTS",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "true",
        default_missing_value = "true",
        overrides_with = "no_slots"
    )]
    pub slots: bool,

    /// Do not serve /slots.
    #[arg(long = "no-slots", overrides_with = "slots")]
    pub no_slots: bool,

    /// Serve the chat page at `GET /` (on by default; `--no-webui` turns it off).
    #[arg(
        long = "webui",
        visible_alias = "ui",
        env = "LLAMA_ARG_UI",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "true",
        default_missing_value = "true",
        overrides_with = "no_webui"
    )]
    pub webui: bool,

    /// Do not serve the chat page (`GET /` answers 404).
    #[arg(long = "no-webui", visible_alias = "no-ui", overrides_with = "webui")]
    pub no_webui: bool,

    /// `/infill` prompts put the suffix first (suffix, prefix, middle), as some models prefer.
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,

    /// Names of the model clients see and may send (default: the checkpoint directory's name):
    /// repeatable or comma-separated, as llama-server; as there (a set), the first in sorted
    /// order is the name replies carry and `/v1/models`' `id`, all are its `aliases`.
    #[arg(short = 'a', long, env = "LLAMA_ARG_ALIAS", value_delimiter = ',')]
    pub alias: Vec<String>,

    /// Tags of the model, repeatable or comma-separated: informational, listed by `/v1/models`
    /// (`tags`), as llama-server lists them.
    #[arg(long, env = "LLAMA_ARG_TAGS", value_delimiter = ',')]
    pub tags: Vec<String>,

    /// Refuse a request whose `model` is not a name of the loaded model (404 `model_not_found`);
    /// by default any name is served by the one model, as llama-server does.
    #[arg(long = "strict-model-names")]
    pub strict_model_names: bool,

    /// Default sampling temperature; 0 is greedy.
    #[arg(
        long = "temp",
        visible_alias = "temperature",
        env = "LLAMA_ARG_TEMPERATURE",
        default_value_t = SamplingParams::default().temperature
    )]
    pub temperature: f32,

    /// Default top-k of requests that give none (0: off).
    #[arg(long = "top-k", env = "LLAMA_ARG_TOP_K")]
    pub top_k: Option<usize>,

    /// Default top-p of requests that give none (1: off).
    #[arg(long = "top-p", env = "LLAMA_ARG_TOP_P")]
    pub top_p: Option<f32>,

    /// Default min-p of requests that give none (0: off).
    #[arg(long = "min-p", env = "LLAMA_ARG_MIN_P")]
    pub min_p: Option<f32>,

    /// Default repetition penalty of requests that give none (1: off).
    #[arg(long = "repeat-penalty", env = "LLAMA_ARG_REPEAT_PENALTY")]
    pub repeat_penalty: Option<f32>,

    /// Default window of the repetition penalties, in tokens.
    #[arg(long = "repeat-last-n")]
    pub repeat_last_n: Option<usize>,

    /// Default presence penalty of requests that give none (0: off).
    #[arg(long = "presence-penalty", env = "LLAMA_ARG_PRESENCE_PENALTY")]
    pub presence_penalty: Option<f32>,

    /// Default locally typical sampling p of requests that give none (1: off).
    #[arg(long = "typical", alias = "typical-p")]
    pub typical_p: Option<f32>,

    /// Default frequency penalty of requests that give none (0: off).
    #[arg(long = "frequency-penalty", env = "LLAMA_ARG_FREQUENCY_PENALTY")]
    pub frequency_penalty: Option<f32>,

    /// Default seed; -1 draws a fresh one per request (llama-server has no variable for it).
    #[arg(
        short = 's',
        long,
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

    /// What the quantized matmuls multiply the weights with: `f32` (the reference numbers, the
    /// exact path), `int8` (~3× faster batched decode, perplexity within 0.3% of f32's on the
    /// default model) or `mixed` (the MLX backend only: int8 for the MLPs' gate and up
    /// projections and the output head, f32 for the rest). On the OpenXLA backend it picks its kernels' arithmetic
    /// unless `MLXCEL_XLA_WEIGHTS` names a format. Defaults to `MLXCEL_ACTIVATIONS`, else int8 on
    /// the MLX backend where the CPU has AVX2 or AVX-512 VNNI (`mixed` for a model under 500 M
    /// parameters where the command runs it: docs/cli.md) and on the OpenXLA backend where it
    /// has AVX-512 VNNI, else `f32`.
    #[arg(long)]
    pub activations: Option<String>,

    /// How the embedding routes pool each input's per-token states: `mean`, `cls`, `last`, or
    /// `none` (one vector per token; `/embedding(s)` only).
    #[arg(long, env = "LLAMA_ARG_POOLING", default_value = "mean")]
    pub pooling: String,

    /// How embeddings are normalized: -1 none, 0 max absolute value, 1 taxicab, 2 euclidean,
    /// p > 2 the p-norm (a request's `embd_normalize` wins).
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,

    /// Serve the embedding routes (llama-server needs it; here they are always served, so the
    /// flag is accepted for its command lines).
    #[arg(long = "embedding", alias = "embeddings", env = "LLAMA_ARG_EMBEDDINGS")]
    pub embedding: bool,

    /// Serve the reranking routes (`/rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`);
    /// the model must be a reranker (a classification head), checked when it loads.
    #[arg(long = "rerank", alias = "reranking", env = "LLAMA_ARG_RERANKING")]
    pub rerank: bool,

    /// Most requests waiting for a slot (beyond the `--parallel` running); past it a request is
    /// answered 503 with `Retry-After` (the measured drain time of the queue), and `/health`
    /// answers 503 until the queue has room.
    #[arg(
        long = "max-queue-depth",
        env = "MLXCEL_MAX_QUEUE_DEPTH",
        default_value_t = 64,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub max_queue_depth: u64,

    /// The prefix cache's memory in MiB (llama-server's `--cache-ram`): finished requests' KV is
    /// kept for prompts that start the same way; `-1` no limit, `0` off (MLX backend only).
    #[arg(
        long = "cache-ram",
        env = "LLAMA_ARG_CACHE_RAM",
        default_value_t = 8192,
        allow_negative_numbers = true
    )]
    pub cache_ram: i64,

    /// When a request takes a slot, the idle slots leave their last request's KV to the prefix
    /// cache (`--cache-ram`), and with `--kv-unified` forget it, so that only running requests
    /// hold KV of their own (on by default; needs `--cache-ram` above 0).
    #[arg(
        long = "cache-idle-slots",
        env = "LLAMA_ARG_CACHE_IDLE_SLOTS",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "true",
        default_missing_value = "true",
        overrides_with = "no_cache_idle_slots"
    )]
    pub cache_idle_slots: bool,

    /// A conversation whose last message is the assistant's is continued from it (on by
    /// default, as llama-server; `--no-prefill-assistant`: it is a finished turn, and the model
    /// answers after it unless the request sends `continue_final_message`).
    #[arg(
        long = "prefill-assistant",
        env = "LLAMA_ARG_PREFILL_ASSISTANT",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "true",
        default_missing_value = "true",
        overrides_with = "no_prefill_assistant"
    )]
    pub prefill_assistant: bool,

    /// Seconds a stream may stay silent (a long prefill) before it sends an SSE comment line,
    /// which keeps proxies and clients with idle timeouts from closing it (-1: never).
    #[arg(
        long = "sse-ping-interval",
        env = "LLAMA_ARG_SSE_PING_INTERVAL",
        default_value_t = 30,
        allow_negative_numbers = true
    )]
    pub sse_ping_interval: i64,

    /// SO_REUSEPORT on the listeners: several processes may listen on the same port, and the
    /// system spreads connections among them.
    #[arg(long = "reuse-port", env = "LLAMA_ARG_REUSE_PORT", value_parser = llama_bool, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub reuse_port: bool,

    /// Serve the files of this directory at the root (its `index.html` at `/`, over the chat
    /// page); a path that is no file of it goes to the routes.
    #[arg(long = "path", env = "LLAMA_ARG_STATIC_PATH")]
    pub static_path: Option<PathBuf>,

    /// Serve every route under this path prefix (`/api`: `/api/health` ...), as behind a
    /// reverse proxy's sub-path.
    #[arg(long = "api-prefix", env = "LLAMA_ARG_API_PREFIX")]
    pub api_prefix: Option<String>,

    /// A final assistant message is a finished turn unless a request asks to continue it.
    #[arg(long = "no-prefill-assistant", overrides_with = "prefill_assistant")]
    pub no_prefill_assistant: bool,

    /// Idle slots keep their last request's KV as their own (`/slots/{id}?action=save` saves it).
    #[arg(long = "no-cache-idle-slots", overrides_with = "cache_idle_slots")]
    pub no_cache_idle_slots: bool,

    /// Unload the model after this many seconds without a request that needs it, and load it
    /// again on the next one (-1: never; 0 is refused, as llama-server refuses it).
    #[arg(
        long = "sleep-idle-seconds",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub sleep_idle_seconds: i64,

    /// The KV memory the running requests may reserve, in MiB (the MLX backend; each request
    /// reserves its prompt plus its token budget up front): a request that needs more than all
    /// of it is refused with the numbers; one without a token limit may generate up to a
    /// `--parallel`-th of its positions, prompt included (no further than the window).
    #[arg(
        long = "kv-budget",
        env = "MLXCEL_KV_BUDGET",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub kv_budget: u64,

    /// The KV cache's key type (`-ctk`): `f32` (the default here), `f16` (llama.cpp's default:
    /// half the KV memory and the bytes attention reads per token, keys rounded to half
    /// precision) or `q8_0` (34 bytes per 32 values). llama.cpp's other quantized cache types
    /// are refused by name. MLX backend only (q8_0: where the fused decoder layer runs).
    #[arg(
        long = "cache-type-k",
        env = "LLAMA_ARG_CACHE_TYPE_K",
        default_value = "f32",
        value_parser = kv_type
    )]
    pub cache_type_k: KvType,

    /// The KV cache's value type (`-ctv`), as `--cache-type-k`.
    #[arg(
        long = "cache-type-v",
        env = "LLAMA_ARG_CACHE_TYPE_V",
        default_value = "f32",
        value_parser = kv_type
    )]
    pub cache_type_v: KvType,

    /// The chat template instead of the checkpoint's: a built-in name (`chatml`, `llama3`,
    /// `command-r` ...; crate::chat_templates) or a Jinja template.
    #[arg(long = "chat-template", env = "LLAMA_ARG_CHAT_TEMPLATE")]
    pub chat_template: Option<String>,

    /// The chat template instead of the checkpoint's, read from a Jinja file.
    #[arg(long = "chat-template-file", env = "LLAMA_ARG_CHAT_TEMPLATE_FILE")]
    pub chat_template_file: Option<std::path::PathBuf>,

    /// The flags that change the model as it loads (`--rope-freq-base`, `--yarn-*` ...).
    #[command(flatten)]
    pub model_overrides: crate::model_args::ModelOverrideArgs,

    /// The reasoning flags (`--reasoning-format`, `--reasoning-budget` ...).
    #[command(flatten)]
    pub reasoning: crate::reasoning_args::ReasoningArgs,

    /// A PEM certificate chain: the server speaks HTTPS (with `--ssl-key-file`).
    #[arg(long = "ssl-cert-file", env = "LLAMA_ARG_SSL_CERT_FILE")]
    pub ssl_cert_file: Option<std::path::PathBuf>,

    /// The certificate's PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[arg(long = "ssl-key-file", env = "LLAMA_ARG_SSL_KEY_FILE")]
    pub ssl_key_file: Option<std::path::PathBuf>,

    /// The directory of slot files: turns on `POST /slots/{id}?action=save|restore|erase`
    /// (created at start if missing).
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<std::path::PathBuf>,

    /// Speculative decoding: a comma-separated list of `ngram-simple` (prompt lookup),
    /// `ngram-map-k`, `ngram-map-k4v`, `ngram-mod` (llama.cpp's hashed n-gram proposers),
    /// `draft-simple` (a draft model; the default with `--spec-draft-model`), tried in that order,
    /// or `none`. Greedy output is unchanged; the MLX backend only (OpenXLA decodes one token a
    /// pass).
    #[arg(long = "spec-type", env = "LLAMA_ARG_SPEC_TYPE")]
    pub spec_type: Option<String>,

    /// The draft model of `--spec-type draft-simple` (`-md`): a checkpoint directory or `.gguf`
    /// file with the model's tokenizer.
    #[arg(
        long = "spec-draft-model",
        alias = "model-draft",
        env = "LLAMA_ARG_SPEC_DRAFT_MODEL"
    )]
    pub spec_draft_model: Option<String>,

    /// Most tokens proposed per verification pass.
    #[arg(
        long = "spec-draft-n-max",
        env = "LLAMA_ARG_SPEC_DRAFT_N_MAX",
        default_value_t = 16
    )]
    pub spec_draft_n_max: usize,

    /// Fewest proposals worth a verification pass.
    #[arg(
        long = "spec-draft-n-min",
        env = "LLAMA_ARG_SPEC_DRAFT_N_MIN",
        default_value_t = 1
    )]
    pub spec_draft_n_min: usize,

    /// The draft model stops proposing at a token it gives less than this probability.
    #[arg(
        long = "spec-draft-p-min",
        alias = "draft-p-min",
        env = "LLAMA_ARG_SPEC_DRAFT_P_MIN",
        default_value_t = 0.0
    )]
    pub spec_draft_p_min: f32,

    /// `--spec-type ngram-simple`: the length of the n-gram looked up in the request's tokens
    /// (1 to 1024; default: the longest of 4 down to 2 that matches).
    #[arg(long = "spec-ngram-simple-size-n")]
    pub spec_ngram_simple_size_n: Option<usize>,

    /// `--spec-type ngram-simple`: the most tokens proposed after a match (1 to 1024; default
    /// `--spec-draft-n-max`).
    #[arg(long = "spec-ngram-simple-size-m")]
    pub spec_ngram_simple_size_m: Option<usize>,

    /// llama.cpp's hashed n-gram proposers' flags (`--spec-default`, `--spec-ngram-mod-*` ...).
    #[command(flatten)]
    pub hashed_spec: crate::spec_args::HashedSpecArgs,

    /// Origins allowed by CORS: `localhost` (only an origin on this machine,
    /// `http(s)://localhost`, `127.0.0.1` or `[::1]` on any port), a comma-separated list of
    /// origins (which may include `localhost`), or `*` (any origin, never with credentials).
    /// Unset: `localhost`, or, when an API key is required (which a page cannot send without
    /// being given it), any origin, as llama-server allows.
    #[arg(long = "cors-origins", env = "LLAMA_ARG_CORS_ORIGINS")]
    pub cors_origins: Option<String>,

    /// Methods a CORS preflight answer allows.
    #[arg(
        long = "cors-methods",
        env = "LLAMA_ARG_CORS_METHODS",
        default_value = "GET, POST, DELETE, OPTIONS"
    )]
    pub cors_methods: String,

    /// Headers a CORS preflight answer allows.
    #[arg(
        long = "cors-headers",
        env = "LLAMA_ARG_CORS_HEADERS",
        default_value = "*"
    )]
    pub cors_headers: String,

    /// Allow credentials for CORS (on by default): only ever for an origin that is local or
    /// listed, never with `*`.
    #[arg(
        long = "cors-credentials",
        env = "LLAMA_ARG_CORS_CREDENTIALS",
        value_parser = llama_bool,
        num_args = 0..=1,
        default_value = "true",
        default_missing_value = "true",
        overrides_with = "no_cors_credentials"
    )]
    pub cors_credentials: bool,

    /// Do not allow credentials for CORS.
    #[arg(long = "no-cors-credentials", overrides_with = "cors_credentials")]
    pub no_cors_credentials: bool,

    /// Seconds a client may take to send a request's headers.
    #[arg(long, env = "LLAMA_ARG_TIMEOUT", default_value_t = 600)]
    pub timeout: u64,

    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, env = "MLXCEL_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,

    /// Backend to run the model on.
    #[arg(long, env = "MLXCEL_BACKEND", default_value = "mlx", value_parser = ["mlx", "xla"])]
    pub backend: String,

    /// Log every request and refusal (debug level).
    #[arg(short = 'v', long, visible_alias = "log-verbose")]
    pub verbose: bool,

    /// Log nothing.
    #[arg(long = "log-disable")]
    pub log_disable: bool,

    /// How log lines are written: `text`, or `json` (one JSON object per line).
    #[arg(long = "log-format", value_enum, default_value = "text")]
    pub log_format: crate::logging::LogFormat,

    /// Log JSON lines (as `--log-format json`) on stdout, as llama-server's `--log-jsonl`.
    #[arg(long = "log-jsonl", env = "LLAMA_ARG_LOG_JSONL", value_parser = llama_bool, num_args = 0..=1, default_value = "false", default_missing_value = "true", overrides_with = "no_log_jsonl")]
    pub log_jsonl: bool,

    /// Log as `--log-format` says, on stderr.
    #[arg(long = "no-log-jsonl", overrides_with = "log_jsonl")]
    pub no_log_jsonl: bool,

    /// Write each generation's prompt (after the chat template) to a file of this directory,
    /// named by the time in ms (created if missing), as llama-server's debugging aid.
    #[arg(long = "log-prompts-dir")]
    pub log_prompts_dir: Option<PathBuf>,

    /// Also write the log to this file (appended; created if missing), as llama-server's
    /// `--log-file`; a file that cannot be opened stops the server, naming it.
    #[arg(long = "log-file", env = "LLAMA_ARG_LOG_FILE")]
    pub log_file: Option<PathBuf>,

    /// The constraint of requests that bring none (`--grammar`, `-j` ...).
    #[command(flatten)]
    pub constraint: crate::constraint_args::ConstraintArgs,

    /// Show special tokens (`<|im_end|>` ...) in generated text (`-sp`).
    #[arg(long = "special")]
    pub special: bool,

    /// llama-server's other sampling flags (DRY, XTC, mirostat, the chain ...).
    #[command(flatten)]
    pub sampling: crate::sampling_args::SamplingArgs,

    /// LoRA adapters (`--lora`, `--lora-scaled`, `--lora-init-without-apply`).
    #[command(flatten)]
    pub lora: crate::lora_args::LoraArgs,

    /// Control vectors (`--control-vector`, `--control-vector-scaled`,
    /// `--control-vector-layer-range`).
    #[command(flatten)]
    pub control_vector: crate::control_vector_args::ControlVectorArgs,

    /// llama-server options without effect here (accepted, one warning line each).
    #[command(flatten)]
    pub ignored: IgnoredOptions,

    /// Router mode: many models behind one server (`--models-dir`, `--models-preset` ...).
    #[command(flatten)]
    pub router: crate::router::args::RouterArgs,

    /// Models fetched at start (`-hf`, `-hff`, `-hft`, `-mu`, `-dr`, `-hfd`, `--offline`).
    #[command(flatten)]
    pub download: crate::download::DownloadArgs,

    /// The agent features (`--tools`, MCP servers, the CORS proxy, `-ag`).
    #[command(flatten)]
    pub agent: crate::agent::args::AgentArgs,
}

/// A KV cache type (`f32`, `f16`, `q8_0`); the error names llama.cpp's types mlxcel does not
/// store.
fn kv_type(value: &str) -> Result<KvType, String> {
    value.parse()
}

/// The scheduler's batch when `--parallel` is -1 (auto).
const AUTO_PARALLEL: usize = 8;

/// Every spelling the server's command line accepts: flags (as typed, multi-letter shorts
/// included), environment twins, and clap's own `--help`/`--version`. The compatibility gate
/// compares this list with `compat/llama-server/accepted-flags.txt`.
pub fn accepted_spellings() -> Vec<String> {
    use clap::Args as _;
    let command = ServerArgs::augment_args(clap::Command::new("mlxcel-server"));
    let mut names: Vec<String> = ["-h", "--help", "--usage", "-V", "--version"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    for arg in command.get_arguments() {
        names.extend(arg.get_short().map(|c| format!("-{c}")));
        names.extend(arg.get_long().map(|l| format!("--{l}")));
        names.extend(
            arg.get_all_aliases()
                .into_iter()
                .flatten()
                .map(|a| format!("--{a}")),
        );
        names.extend(arg.get_env().map(|e| e.to_string_lossy().into_owned()));
    }
    for option in crate::llama_flags::NO_OP_OPTIONS {
        names.extend(option.env.map(str::to_owned));
    }
    let long_accepted: Vec<String> = names.clone();
    names.extend(
        MULTI_LETTER_SHORTS
            .iter()
            .filter(|(_, long)| long_accepted.iter().any(|n| n == long))
            .map(|(short, _)| (*short).to_owned()),
    );
    names.sort();
    names.dedup();
    names
}

impl ServerArgs {
    /// The backend named by `--backend`; the engine's own error lists what exists.
    pub fn backend_kind(&self) -> Result<BackendKind, ServerError> {
        self.backend
            .parse()
            .map_err(|err| ServerError::Backend(format!("--backend {}: {err}", self.backend)))
    }

    /// These flags with the models `-hf`, `-mu`, `-dr` and `-hfd` name fetched (blocking until
    /// they are) and put in place of `-m` and `--spec-draft-model`; unchanged when none does.
    pub fn with_downloads(&self) -> Result<ServerArgs, ServerError> {
        self.with_downloads_in(
            &crate::download::Env::process(),
            &crate::download::DockerHub::default(),
        )
    }

    /// [`ServerArgs::with_downloads`] reading `env` and asking `docker_hub` (tests point both at
    /// a local server).
    pub fn with_downloads_in(
        &self,
        env: &crate::download::Env,
        docker_hub: &crate::download::DockerHub,
    ) -> Result<ServerArgs, ServerError> {
        if !self.download.any() {
            self.download.validate(self.model.as_deref())?;
            return Ok(self.clone());
        }
        if self.router.enabled() {
            return Err(ServerError::Flag(
                "router mode (--models-dir, --models-preset) serves the models it lists: -hf, -mu, -dr and -hfd name one model; give one or the other".into(),
            ));
        }
        let resolved = self.download.resolve_in(
            env,
            docker_hub,
            self.model.as_deref(),
            self.spec_draft_model.as_deref(),
        )?;
        let mut args = self.clone();
        args.model = resolved.model;
        args.spec_draft_model = resolved.draft;
        args.download = crate::download::DownloadArgs::default();
        Ok(args)
    }

    /// How the engine is loaded under these flags.
    pub fn engine_options(&self) -> Result<EngineOptions, ServerError> {
        let mut options = EngineOptions {
            backend: self.backend_kind()?,
            // A server compiles its static shapes once, at load (OpenXLA; no effect on MLX).
            shapes: ShapeMode::ServerBuckets,
            ..EngineOptions::default()
        };
        let parallel = self.parallel()?;
        options.scheduler.max_batch = parallel;
        options.lora_adapters = self.lora.paths();
        options.control_vector = self.control_vector.spec.clone();
        options.threads = (self.threads > 0).then_some(self.threads as usize);
        // `--activations`, else the application default: int8 where the kernels are fast, f32
        // for a model under 500 M parameters (decided at load, once its size is known).
        match self.activations.as_deref() {
            Some(value) => {
                options.activations =
                    Some(value.parse().map_err(|err: String| {
                        ServerError::Flag(format!("--activations: {err}"))
                    })?);
            }
            None => options.use_application_activations(),
        }
        options.scheduler.token_budget = options.scheduler.token_budget.max(parallel);
        options.scheduler.max_waiting = usize::try_from(self.max_queue_depth).unwrap_or(usize::MAX);
        options.speculative = SpeculativeConfig::from_flags(
            self.spec_type.as_deref(),
            self.hashed_spec.spec_default,
            self.spec_draft_model.is_some(),
            self.spec_draft_n_max,
            self.spec_draft_n_min,
            self.spec_draft_p_min,
        )
        .map_err(|err| ServerError::Flag(err.to_string()))?;
        crate::spec_args::ngram_simple_sizes(
            self.spec_ngram_simple_size_n,
            self.spec_ngram_simple_size_m,
            options.speculative.as_mut(),
        )?;
        self.hashed_spec
            .apply(options.speculative.as_mut())
            .map_err(ServerError::Flag)?;
        options.draft_model = self.spec_draft_model.clone();
        options.kv_types = (self.cache_type_k, self.cache_type_v);
        options.special_tokens = self.special;
        options.rope = self.model_overrides.rope()?;
        options.kv_overrides = self.model_overrides.kv_overrides()?;
        options.chat_template = crate::chat_templates::template_override(
            self.chat_template.as_deref(),
            self.chat_template_file.as_deref(),
        )?;
        options.kv_budget_bytes =
            usize::try_from(self.kv_budget.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        options.prefix_cache_bytes = match self.cache_ram {
            -1 => usize::MAX,
            mib if mib >= 0 => (mib as usize).saturating_mul(1 << 20),
            other => {
                return Err(ServerError::Flag(format!(
                    "--cache-ram {other}: expected MiB, -1 (no limit) or 0 (off)"
                )));
            }
        };
        Ok(options)
    }

    /// `--parallel`, with -1 (auto) as [`AUTO_PARALLEL`].
    fn parallel(&self) -> Result<usize, ServerError> {
        match self.parallel {
            -1 => Ok(AUTO_PARALLEL),
            n if n >= 1 => Ok(n as usize),
            n => Err(ServerError::Flag(format!(
                "--parallel {n}: expected -1 (auto) or at least 1"
            ))),
        }
    }

    /// The addresses `--host` and `--port` name: `--host` is one host or a comma-separated list
    /// (`127.0.0.1,::1`, as llama-server takes it), each a literal address (IPv6 with or without
    /// brackets) or a name resolved to its first address.
    fn addrs(&self, port: u16) -> Result<Vec<SocketAddr>, ServerError> {
        let mut addrs = Vec::new();
        for host in self.host.split(',').map(str::trim) {
            let bare = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            if bare.is_empty() {
                return Err(ServerError::Flag(format!(
                    "--host {}: an empty address in the list",
                    self.host
                )));
            }
            let addr = (bare, port)
                .to_socket_addrs()
                .map_err(|err| ServerError::Flag(format!("--host {host}: {err}")))?
                .next()
                .ok_or_else(|| ServerError::Flag(format!("--host {host}: no address")))?;
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        Ok(addrs)
    }

    /// The server's settings under these flags (reads `--api-key-file`).
    /// `--slot-save-path`, created if missing.
    fn slot_save_path(&self) -> Result<Option<std::path::PathBuf>, ServerError> {
        let Some(dir) = &self.slot_save_path else {
            return Ok(None);
        };
        if dir.as_os_str().is_empty() {
            return Ok(None);
        }
        std::fs::create_dir_all(dir).map_err(|e| {
            ServerError::Flag(format!(
                "--slot-save-path {}: cannot create the directory: {e}",
                dir.display()
            ))
        })?;
        if !dir.is_dir() {
            return Err(ServerError::Flag(format!(
                "--slot-save-path {}: not a directory",
                dir.display()
            )));
        }
        Ok(Some(dir.clone()))
    }

    pub fn server_config(&self) -> Result<ServerConfig, ServerError> {
        if let Some(path) = &self.log_file {
            crate::logging::open_log_file(path).map_err(|err| {
                ServerError::Flag(format!(
                    "--log-file {}: cannot open it: {err}",
                    path.display()
                ))
            })?;
        }
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
        let agent = self.agent.config();
        if agent.tools_or_mcp() && self.cors_origins.is_none() {
            tracing::warn!(
                "server tools or MCP servers are enabled, using localhost as default CORS origin (change via --cors-origins)"
            );
        }
        let gcp = crate::gcp::GcpConfig::from_vars(|name| std::env::var(name).ok())
            .map_err(ServerError::Flag)?;
        let port = match &gcp {
            Some(gcp) => {
                if crate::routes::has_path(&gcp.predict_route) {
                    return Err(ServerError::Flag(format!(
                        "AIP_PREDICT_ROUTE={}: that is one of the server's own routes;                          choose another path",
                        gcp.predict_route
                    )));
                }
                if gcp.port != self.port {
                    tracing::warn!(
                        "Vertex AI mode (AIP_MODE=PREDICTION): listening on AIP_HTTP_PORT {} \
                         instead of --port {}",
                        gcp.port,
                        self.port
                    );
                }
                gcp.port
            }
            None => self.port,
        };
        let addrs = self.addrs(port)?;
        let kv_unified = self.kv_unified && !self.no_kv_unified;
        let sleep_idle = match self.sleep_idle_seconds {
            -1 => None,
            seconds if seconds > 0 => Some(Duration::from_secs(seconds as u64)),
            other => {
                return Err(ServerError::Flag(format!(
                    "--sleep-idle-seconds {other}: expected -1 (never) or a count of seconds"
                )));
            }
        };
        let cache_idle_slots = self.cache_idle_slots && !self.no_cache_idle_slots;
        if cache_idle_slots && self.cache_ram == 0 {
            tracing::debug!("--cache-idle-slots needs --cache-ram above 0; off");
        }
        let cache_idle_slots = cache_idle_slots && self.cache_ram != 0;
        if cache_idle_slots {
            tracing::debug!(
                "__TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__ idle slots leave their KV to the prefix \
                 cache when a request takes a slot"
            );
        }
        Ok(ServerConfig {
            lora_scales: self.lora.initial_scales(),
            addr: addrs[0],
            extra_addrs: addrs[1..].to_vec(),
            model_arg: self.model.clone(),
            aliases: name_set(&self.alias),
            tags: name_set(&self.tags),
            strict_model_names: self.strict_model_names,
            ctx_size: (self.ctx_size > 0).then_some(self.ctx_size),
            ctx_per_slot: self.parallel != -1 && !kv_unified,
            parallel: self.parallel()?,
            default_max_new_tokens,
            default_temperature: self.temperature,
            sampling_defaults: self.sampling.overrides(SamplingOverrides {
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_last_n: self.repeat_last_n,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                typical_p: self.typical_p,
                ..SamplingOverrides::default()
            }),
            sampling_chain: self.sampling.defaults()?,
            default_constraint: self.constraint.constraint()?,
            slots: self.slots && !self.no_slots,
            props: self.props,
            default_seed: u64::try_from(self.seed).ok(),
            threads: (self.threads > 0).then_some(self.threads as usize),
            api_keys: ApiKeys::new(keys.clone()),
            metrics: self.metrics,
            header_timeout: Duration::from_secs(self.timeout.max(1)),
            shutdown_timeout: Duration::from_secs(self.shutdown_timeout),
            pooling: self
                .pooling
                .parse()
                .map_err(|err: String| ServerError::Flag(format!("--pooling: {err}")))?,
            embd_normalize: self.embd_normalize,
            reranking: self.rerank,
            spm_infill: self.spm_infill,
            webui: self.webui && !self.no_webui,
            cors: crate::cors::CorsConfig {
                origins: self
                    .cors_origins
                    .clone()
                    .unwrap_or_else(|| crate::cors::CorsConfig::default().origins),
                // With tools or MCP servers on, no `--cors-origins` means local origins only,
                // key or not (llama-server's narrowing).
                any_origin: self.cors_origins.is_none()
                    && !keys.is_empty()
                    && !agent.tools_or_mcp(),
                methods: self.cors_methods.clone(),
                headers: self.cors_headers.clone(),
                credentials: self.cors_credentials && !self.no_cors_credentials,
            },
            slot_save_path: self.slot_save_path()?,
            reasoning: self.reasoning.defaults()?,
            sleep_idle,
            cache_idle_slots,
            prefill_assistant: self.prefill_assistant && !self.no_prefill_assistant,
            reuse_port: self.reuse_port,
            static_path: match &self.static_path {
                Some(dir) if !dir.is_dir() => {
                    return Err(ServerError::Flag(format!(
                        "--path {}: not a directory",
                        dir.display()
                    )));
                }
                other => other.clone(),
            },
            api_prefix: match self.api_prefix.as_deref() {
                // llama-server's default is the empty prefix: the root.
                None | Some("") => None,
                Some(prefix) => {
                    crate::api_prefix::check(prefix)?;
                    Some(prefix.to_owned())
                }
            },
            prompts_log_dir: match &self.log_prompts_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir).map_err(|err| {
                        ServerError::Flag(format!(
                            "--log-prompts-dir {}: cannot create it: {err}",
                            dir.display()
                        ))
                    })?;
                    Some(dir.clone())
                }
                None => None,
            },
            sse_ping_interval: match self.sse_ping_interval {
                seconds if seconds >= -1 => seconds,
                seconds => {
                    return Err(ServerError::Flag(format!(
                        "--sse-ping-interval {seconds}: expected -1 (never) or seconds"
                    )));
                }
            },
            kv_unified: kv_unified || self.parallel == -1,
            gcp,
            tls: crate::tls::TlsFiles::from_flags(
                self.ssl_cert_file.as_deref(),
                self.ssl_key_file.as_deref(),
            )?,
            agent,
            ..ServerConfig::default()
        })
    }
}

/// Comma-separated names as llama-server keeps them: trimmed, empty ones dropped, sorted and
/// without repeats (a set).
fn name_set(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}
